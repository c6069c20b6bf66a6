#!/bin/bash
# Runs one perftest program (ib_{send,write,read,atomic}_{lat,bw}) as two
# processes on xsrc0: a server in the background and a client against it on
# loopback, GID index 1 (the IPv4-mapped RoCE v2 GID).
#   perftest.sh PORT PROGRAM [ARGS...]
# Both must exit 0 within the time limit, and the client must report results:
# one line (23 with -a) whose bandwidth (_bw) or typical latency (_lat) is > 0.
# Both outputs are shown on failure.
set -u
port=$1; prog=$2; shift 2
dir=$(mktemp -d)
server=
trap '[ -n "$server" ] && kill $server 2>/dev/null; rm -rf "$dir"' EXIT

# -F: no failure on CPU frequency scaling warnings.
common=(-d xsrc0 -x 1 -F -p "$port")

timeout 90 "$prog" "${common[@]}" "$@" >"$dir/server" 2>&1 &
server=$!
# The server listens before it prints anything; give it a moment to bind.
for _ in $(seq 50); do
  ss -ltn 2>/dev/null | grep -q ":$port " && break
  sleep 0.1
done
timeout 90 "$prog" "${common[@]}" "$@" localhost >"$dir/client" 2>&1
client_rc=$?
wait $server
server_rc=$?
server=

# Result lines start with the message size. BW lines: bytes iters peak avg
# msgrate; latency lines: bytes iters t_min t_max t_typical ...
case $prog in
  *_bw) column=4 ;;
  *) column=5 ;;
esac
expected=1
for arg in "$@"; do
  if [ "$arg" = -a ] || [ "$arg" = --all ]; then expected=23; fi  # 2 B .. 8 MiB
done
results=$(grep -E '^ +[0-9]+ +[0-9]+ ' "$dir/client")
lines=$(printf '%s\n' "$results" | grep -c .)
zero=$(printf '%s\n' "$results" | awk -v c=$column 'NF >= c && $c + 0 <= 0' | wc -l)

fail=0
if [ $client_rc -ne 0 ] || [ $server_rc -ne 0 ]; then
  echo "exit status: server $server_rc, client $client_rc"; fail=1
fi
if [ "$lines" -ne "$expected" ]; then echo "client reported $lines result lines, expected $expected"; fail=1; fi
if [ "$zero" -ne 0 ]; then echo "client reported $zero results of 0"; fail=1; fi
if [ $fail -ne 0 ]; then
  echo "== server (exit $server_rc)"; cat "$dir/server"
  echo "== client (exit $client_rc)"; cat "$dir/client"
  exit 1
fi
grep -B1 -E '^ +[0-9]+ +[0-9]+ ' "$dir/client" | head -1
printf '%s\n' "$results"
