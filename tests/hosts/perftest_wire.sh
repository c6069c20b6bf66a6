#!/bin/bash
# perftest across hosts on the wire (RoCE v2): ib_send_lat, ib_write_lat,
# ib_read_lat, ib_atomic_lat (FetchAdd and CmpSwap) and ib_atomic_bw between
# host 1 and host 2 of the harness, over the IPv4-mapped (-x 1) and the IPv6
# (-x 2) GID; every run must complete and report. Then max_rd_atomic on the
# wire: under capture, with host 1's responses slowed, ib_read_bw -o 2 must
# never have more than 2 READs of a QP unanswered, while -o 16 has
# more than 2 and at most 16 in flight.
#   perftest_wire.sh PORT
set -u
port=$1
export XSRC_HOSTS_PREFIX=${XSRC_HOSTS_PREFIX:-xsrcpt}
. "$(dirname "$0")/lib.sh"

# run_pair PROGRAM ARGS...: the server on host 1, the client on host 2.
run_pair() {
  timeout 120 "$hosts" run 1 "$@" -d xsrc0 -p "$port" -F >"$dir/server" 2>&1 &
  server=$!
  wait_listen
  timeout 120 "$hosts" run 2 "$@" -d xsrc0 -p "$port" -F 10.77.0.1 >"$dir/client" 2>&1
  local rc=$?
  wait "$server"; local src=$?; server=
  if [ $rc -ne 0 ] || [ $src -ne 0 ]; then
    bad "$*: client rc $rc, server rc $src"
    echo "== client"; cat "$dir/client"; echo "== server"; cat "$dir/server"
    return 1
  fi
  return 0
}
# result SIZE ITERS: the client's result line for that size and count.
result() { awk -v s="$1" -v n="$2" '$1 == s && $2 == n' "$dir/client"; }

# most_outstanding PCAP: the largest number of READs requested and not yet
# answered in full (their READ response Last or Only) over the capture, one
# QP pair per run. A READ is known by the PSN of its last response (request
# PSN + packets - 1, 1024-byte packets on this link): a request sent again
# after a go-back, whole or from a missing response on, names a READ
# already counted, and a response seen twice closes nothing twice.
most_outstanding() {
  tshark -r "$1" -Y 'infiniband.bth.opcode >= 12 && infiniband.bth.opcode <= 16' \
    -T fields -e infiniband.bth.opcode -e infiniband.bth.psn -e infiniband.reth.dmalen 2>/dev/null |
    awk -v mtu=1024 '
      $1 == 12 { last = ($2 + int(($3 + mtu - 1) / mtu) - 1) % 16777216
                 if (!(last in seen)) { seen[last] = 1; open[last] = 1; n++; if (n > most) most = n } }
      ($1 == 15 || $1 == 16) && ($2 in open) { delete open[$2]; n-- }
      END { print most + 0 }'
}

# slow_responses on|off: host 1 (the READ responder) sends at 20 Mbit/s
# (an HTB class: this kernel has no netem), so that a READ's responses take
# about 2 ms to leave. Without it, whether requests overlap on the wire
# depends on the scheduler: a post whose datagram wakes host 1's xsrcd on
# the poster's CPU can yield that CPU until the READ is answered, and then
# every READ is answered before the next one goes out (about 1 run in 15,
# whatever max_rd_atomic allows).
slow_responses() {
  local ns=$XSRC_HOSTS_PREFIX-1 dev
  dev=$(host_if 1)
  if [ "$1" = on ]; then
    tc -n "$ns" qdisc add dev "$dev" root handle 1: htb default 10 &&
      tc -n "$ns" class add dev "$dev" parent 1: classid 1:10 htb rate 20mbit burst 1600b cburst 1600b ||
      bad "tc: no HTB qdisc on host 1"
  else
    tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null
  fi
}

hosts_up

for gid in 1 2; do
  for prog in ib_send_lat ib_write_lat; do
    run_pair "$prog" -x "$gid" -s 8 -n 1000 &&
      { r=$(result 8 1000); [ -n "$r" ] || bad "$prog -x $gid: no result line"; echo "ok: $prog -x $gid 8 B: $r"; }
  done
  run_pair ib_read_lat -x "$gid" -s 4096 -n 500 &&
    { r=$(result 4096 500); [ -n "$r" ] || bad "ib_read_lat -x $gid: no result line"; echo "ok: ib_read_lat -x $gid 4 KiB: $r"; }
  for type in FETCH_AND_ADD CMP_AND_SWAP; do
    run_pair ib_atomic_lat -x "$gid" -A "$type" -n 1000 &&
      { r=$(result 8 1000); [ -n "$r" ] || bad "ib_atomic_lat -x $gid -A $type: no result line"; echo "ok: ib_atomic_lat -x $gid $type: $r"; }
  done
  run_pair ib_atomic_bw -x "$gid" -n 2000 &&
    { r=$(result 8 2000); [ -n "$r" ] || bad "ib_atomic_bw -x $gid: no result line"; echo "ok: ib_atomic_bw -x $gid: $r"; }
done

# max_rd_atomic: 2 outstanding READs at most with -o 2; with -o 16 (the
# device's max_qp_rd_atom) more than 2, and no more than 16.
slow_responses on
for outs in 2 16; do
  start_capture "$dir/read$outs.pcap"
  run_pair ib_read_bw -x 1 -s 4096 -n 300 -o "$outs" &&
    echo "ok: ib_read_bw -o $outs 4 KiB x 300: $(result 4096 300)"
  stop_capture "$dir/read$outs.pcap"
  most=$(most_outstanding "$dir/read$outs.pcap")
  echo "ib_read_bw -o $outs: at most $most READ requests outstanding on the wire"
  if [ "$outs" = 2 ]; then
    [ "$most" -ge 1 ] && [ "$most" -le 2 ] || bad "ib_read_bw -o 2 had $most READs outstanding"
  else
    [ "$most" -gt 2 ] && [ "$most" -le 16 ] || bad "ib_read_bw -o 16 had $most READs outstanding (3 to 16 expected)"
  fi
done
slow_responses off
"$hosts" run 1 "$XSRC" status
"$hosts" run 2 "$XSRC" status

finish perftest_wire
