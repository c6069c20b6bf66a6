#!/bin/bash
# UCX's own ucx_perftest on the shim's transport: two processes on xsrc0, each with
# libxsrc-uct.so.0 preloaded (issue 6), a server in the background and a client against it.
#   module_perftest.sh LIBXSRC_UCT PORT TEST ITERATIONS [ARGS...]
# Both must exit 0, and the client must report a "Final:" line for ITERATIONS iterations
# with a latency and a message rate above 0 (the bandwidth of an 8-byte latency test on a
# loaded machine may print as 0.00). Both outputs are shown on failure.
set -u
lib=$1; port=$2; test=$3; iters=$4; shift 4
xsrc=${XSRC:?XSRC must name the xsrc tool}
dir=$(mktemp -d)
server=
trap '[ -n "$server" ] && kill $server 2>/dev/null; rm -rf "$dir"' EXIT

timeout 90 "$xsrc" run -- env LD_PRELOAD="$lib" ucx_perftest -p "$port" >"$dir/server" 2>&1 &
server=$!
for _ in $(seq 50); do
  ss -ltn 2>/dev/null | grep -q ":$port " && break
  sleep 0.1
done
timeout 60 "$xsrc" run -- env LD_PRELOAD="$lib" \
  ucx_perftest localhost -p "$port" -x xsrc -d xsrc0:1 -t "$test" -n "$iters" "$@" >"$dir/client" 2>&1
client_rc=$?
wait $server
server_rc=$?
server=

# Final: iterations, latency 50%ile/average/overall (us), bandwidth average/overall (MB/s), rates.
final=$(grep -E '^Final:' "$dir/client")
fail=0
if [ $client_rc -ne 0 ] || [ $server_rc -ne 0 ]; then echo "exit status: server $server_rc, client $client_rc"; fail=1; fi
if [ -z "$final" ]; then
  echo "the client reported no Final: line"; fail=1
elif ! awk -v n="$iters" '{ exit !($2 == n && $3 > 0 && $4 > 0 && $NF > 0) }' <<<"$final"; then
  echo "unexpected Final: line (want $iters iterations, latency and message rate > 0): $final"; fail=1
fi
if [ $fail -ne 0 ]; then
  echo "== server (exit $server_rc)"; cat "$dir/server"
  echo "== client (exit $client_rc)"; cat "$dir/client"
  exit 1
fi
echo "ucx_perftest -x xsrc -d xsrc0:1 -t $test -n $iters $*"
echo "$final"
