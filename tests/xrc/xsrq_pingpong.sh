#!/bin/bash
# Runs rdma-core's ibv_xsrq_pingpong on xsrc0: one server process with
# CLIENTS XRC receive/send QP pairs and CLIENTS client processes.
#   xsrq_pingpong.sh PORT CLIENTS [ARGS...]
# All processes open the XRC domain of the same file (/tmp/xrc_domain), and
# the server sends round robin over its send QPs: a message for client i's
# SRQ travels over the QP connected to client j's receive QP, so the test
# only passes if the domain is really shared across the client processes.
# Every process must exit 0 within the time limit; output shown on failure.
set -u
port=$1; clients=$2; shift 2
prog=ibv_xsrq_pingpong
dir=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$dir"' EXIT

timeout 120 "$prog" -d xsrc0 -p "$port" -c "$clients" "$@" >"$dir/server" 2>&1 &
server=$!
pids+=($server)
# The server listens before it prints anything; give it a moment to bind.
for _ in $(seq 50); do
  ss -ltn 2>/dev/null | grep -q ":$port " && break
  sleep 0.1
done
client_pids=()
for i in $(seq "$clients"); do
  timeout 120 "$prog" -d xsrc0 -p "$port" "$@" localhost >"$dir/client$i" 2>&1 &
  client_pids+=($!)
  pids+=($!)
done
failed=0
for i in $(seq "$clients"); do
  wait "${client_pids[$((i - 1))]}"
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q '^success$' "$dir/client$i"; then
    echo "== client $i (exit $rc)"; cat "$dir/client$i"
    failed=1
  fi
done
wait $server
rc=$?
if [ $rc -ne 0 ] || ! grep -q '^success$' "$dir/server"; then
  echo "== server (exit $rc)"; cat "$dir/server"
  failed=1
fi
[ $failed -eq 0 ] || exit 1
echo "server and $clients clients: success"
