#!/bin/bash
# Runs one of rdma-core's ibv_*_pingpong examples as two processes on xsrc0:
# a server in the background and a client against it on loopback.
#   pingpong.sh PORT PROGRAM [ARGS...]
# Both must exit 0 within the time limit; their output is shown on failure.
set -u
port=$1; prog=$2; shift 2
dir=$(mktemp -d)
trap 'kill $server 2>/dev/null; rm -rf "$dir"' EXIT

timeout 120 "$prog" -d xsrc0 -p "$port" "$@" >"$dir/server" 2>&1 &
server=$!
# The server listens before it prints anything; give it a moment to bind.
for _ in $(seq 50); do
  ss -ltn 2>/dev/null | grep -q ":$port " && break
  sleep 0.1
done
timeout 120 "$prog" -d xsrc0 -p "$port" "$@" localhost >"$dir/client" 2>&1
client_rc=$?
wait $server
server_rc=$?
if [ $client_rc -ne 0 ] || [ $server_rc -ne 0 ]; then
  echo "== server (exit $server_rc)"; cat "$dir/server"
  echo "== client (exit $client_rc)"; cat "$dir/client"
  exit 1
fi
tail -n 2 "$dir/client"
