#!/bin/bash
# The wire receiver's scheduling. Under `xsrc up`, the one thread of xsrcd
# that takes RoCE v2 off the netdev runs SCHED_FIFO at priority 1, as a
# NIC's interrupt goes before processes, and `xsrc status` says
# wire_priority=1; xsrcd's other threads keep the normal policy. With
# XSRC_WIRE_PRIORITY=0 every thread keeps the normal policy and status says
# wire_priority=0; with XSRC_WIRE_PRIORITY=3, priority 3. A priority past the
# policy's maximum, or not a number, is refused before the daemon starts.
# Traffic on the wire works under each (an 8 B ib_send_lat).
#   wire_priority.sh PORT
set -u
port=$1
export XSRC_HOSTS_PREFIX=xsrcwp
. "$(dirname "$0")/lib.sh"
xsrcd=$(dirname "$XSRC")/xsrcd

# fifo_threads H: "tid:priority" of each SCHED_FIFO thread of host H's
# xsrcd (/proc/TID/stat: field 40 the real-time priority, 41 the policy).
fifo_threads() {
  local pid t
  pid=$("$hosts" daemon "$1")
  [ -n "$pid" ] || { bad "host $1 has no xsrcd.pid"; return; }
  for t in /proc/"$pid"/task/*; do
    awk -v tid="${t##*/}" '$41 == 1 { print tid ":" $40 }' "$t/stat"
  done
}

# expect PRIORITY: both hosts' daemons as that priority asks.
expect() {
  local h fifo
  for h in 1 2; do
    [ "$(status_field "$h" wire_priority)" = "$1" ] ||
      bad "host $h: wire_priority=$(status_field "$h" wire_priority), not $1"
    fifo=$(fifo_threads "$h")
    echo "host $h: SCHED_FIFO threads: ${fifo:-none}"
    if [ "$1" -eq 0 ]; then
      [ -z "$fifo" ] || bad "host $h: a SCHED_FIFO thread at wire priority 0: $fifo"
    else
      [ "$(echo "$fifo" | wc -l)" -eq 1 ] && [ "${fifo#*:}" = "$1" ] ||
        bad "host $h: not one SCHED_FIFO thread at priority $1: $fifo"
    fi
  done
  timeout 60 "$hosts" run 1 ib_send_lat -d xsrc0 -x 1 -F -s 8 -n 200 -p "$port" >"$dir/server" 2>&1 &
  server=$!
  wait_listen
  timeout 60 "$hosts" run 2 ib_send_lat -d xsrc0 -x 1 -F -s 8 -n 200 -p "$port" 10.77.0.1 >"$dir/client" 2>&1
  rc=$?
  wait "$server"; src=$?; server=
  if [ $rc -ne 0 ] || [ $src -ne 0 ] || ! grep -q '^ *8 *200 ' "$dir/client"; then
    bad "ib_send_lat at wire priority $1: client rc $rc, server rc $src"
    cat "$dir/client" "$dir/server"
  else
    echo "ok: ib_send_lat at wire priority $1: $(grep '^ *8 *200 ' "$dir/client")"
  fi
}

hosts_up
expect 1
"$hosts" down
XSRC_WIRE_PRIORITY=0 hosts_up
expect 0
"$hosts" down
XSRC_WIRE_PRIORITY=3 hosts_up
expect 3

for wrong in 100 -1 fifo ""; do
  out=$("$xsrcd" --wire-priority "$wrong" 2>&1)
  st=$?
  [ $st -eq 2 ] && echo "$out" | grep -q "not 0 or a SCHED_FIFO priority" ||
    bad "xsrcd --wire-priority '$wrong': exit $st: $out"
done
out=$(XSRC_WIRE_PRIORITY=x "$xsrcd" --help 2>&1)
st=$?
[ $st -eq 2 ] || bad "XSRC_WIRE_PRIORITY=x: exit $st: $out"

finish hosts_wire_priority
