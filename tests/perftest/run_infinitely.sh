#!/bin/bash
# A perftest bandwidth run that must not stall: PROGRAM --run_infinitely -D 1
# (a report line every second) as two processes on xsrc0, left running for
# SECONDS and then killed.
#   run_infinitely.sh PORT PROGRAM SECONDS [ARGS...]
# Passes when both processes are still alive at the end, every report so far
# (client and server) has a bandwidth > 0, no 4 s went by without a new client
# report once the first one appeared, and there were at least SECONDS/4
# (what is asserted is progress, not a rate: a loaded machine stretches
# perftest's clock recalibration to ~2 s a report).
# perftest prints a report every 1 s of sleep plus ~0.2-0.5 s of recalibrating
# its clock (longer on a busy machine), after 1-2 s of start-up: 10 s give
# 6-7 reports alone, 5-6 next to other tests.
set -u
port=$1; prog=$2; seconds=$3; shift 3
dir=$(mktemp -d)
server="" client=""
trap 'kill $server $client 2>/dev/null; rm -rf "$dir"' EXIT

common=(-d xsrc0 -x 1 -F -p "$port" --run_infinitely -D 1)
limit=$((seconds + 30))   # a hang past the end still terminates

timeout $limit stdbuf -oL "$prog" "${common[@]}" "$@" >"$dir/server" 2>&1 &
server=$!
for _ in $(seq 50); do
  ss -ltn 2>/dev/null | grep -q ":$port " && break
  sleep 0.1
done
timeout $limit stdbuf -oL "$prog" "${common[@]}" "$@" localhost >"$dir/client" 2>&1 &
client=$!

# Report lines: bytes iterations peak average msgrate.
reports() { grep -E '^ +[0-9]+ +[0-9]+ ' "$1"; }
count=()      # client lines after each second
first=-1      # the second the first line appeared
fail=0
for ((t = 1; t <= seconds; t++)); do
  sleep 1
  count[t]=$(reports "$dir/client" | wc -l)
  if [ $first -lt 0 ] && [ "${count[t]}" -gt 0 ]; then first=$t; fi
  if [ $first -ge 0 ] && [ $t -ge $((first + 4)) ] && [ "${count[t]}" -le "${count[t - 4]}" ]; then
    echo "stalled: no new client report between second $((t - 4)) and $t"; fail=1
  fi
done

alive=1
kill -0 $server 2>/dev/null || { echo "server exited early"; alive=0; }
kill -0 $client 2>/dev/null || { echo "client exited early"; alive=0; }
[ $alive -eq 1 ] || fail=1
# Snapshot before the kill: the server's last line after its peer dies is 0.
cp "$dir/client" "$dir/client.snap"; cp "$dir/server" "$dir/server.snap"
kill $client $server 2>/dev/null
wait $client $server 2>/dev/null
client="" server=""

lines=$(reports "$dir/client.snap" | wc -l)
zero=$( (reports "$dir/client.snap"; reports "$dir/server.snap") | awk '$4 + 0 <= 0' | wc -l)
if [ "$lines" -lt $((seconds / 4)) ]; then
  echo "client printed $lines reports in $seconds s, expected at least $((seconds / 4))"; fail=1
fi
if [ "$zero" -ne 0 ]; then echo "$zero reports with a bandwidth of 0"; fail=1; fi

echo "client reports after each second: ${count[*]}"
if [ $fail -ne 0 ]; then
  echo "== server"; cat "$dir/server"
  echo "== client"; cat "$dir/client"
  exit 1
fi
reports "$dir/client.snap"
srv=$(reports "$dir/server.snap" | wc -l)
[ "$srv" -gt 0 ] && echo "(server: $srv reports)"
exit 0
