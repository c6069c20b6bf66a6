#!/bin/bash
# RC across hosts on a bad link: tc netem drops 3 % of the packets each
# way, duplicates 1 % and delays them 1 ms +- 1 ms (which reorders them);
# where the kernel has no netem, nftables drops, duplicates and marks 3 %
# that an HTB class holds back behind the rest (see make_lossy). The two
# directions lose differently: from host 1 the emulator sits on host 1's
# veth, where a UDP GSO datagram is still one skb (a loss takes a whole run
# of up to 64 packets); from host 2 it sits on the bridge's port to host 1,
# and host 2's veth cuts GSO datagrams first (tx-udp-segmentation off), so
# single packets are lost, doubled and reordered, as on a wire; there the
# requester's window must shrink (see the end). ibv_rc_pingpong --chk at 256 KiB must still complete with correct
# data (PSN sequence NAKs and go-back-N, the local ACK timeout, duplicates
# re-ACKed), and so must rc_wire_verbs' transfers (WRITE, READ, SEND, the
# data checked; FetchAdd/CmpSwap with the counter exact; ATOMIC WRITE; the
# same through an XRC send QP into an XRC SRQ) and ib_write_bw,
# ib_read_bw and ib_send_bw; netem's counters must
# show that the link really lost packets.
#   rc_wire_lossy.sh PORT RC_WIRE_VERBS
set -u
port=$1
verbs=$2
export XSRC_HOSTS_PREFIX=xsrcls
. "$(dirname "$0")/lib.sh"

# run_pair WHAT SERVER_CMD... -- CLIENT_ARGS...: server on host 1, client on host 2.
run_pair() {
  local what=$1; shift
  local args=() cargs=()
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  shift
  cargs=("$@")
  timeout 240 "$hosts" run 1 "${args[@]}" >"$dir/server" 2>&1 &
  server=$!
  wait_listen
  timeout 240 "$hosts" run 2 "${args[@]}" "${cargs[@]}" >"$dir/client" 2>&1
  local rc=$?
  wait "$server"; local src=$?; server=
  if [ $rc -ne 0 ] || [ $src -ne 0 ]; then
    bad "$what: client rc $rc, server rc $src"
    echo "== client"; cat "$dir/client"; echo "== server"; cat "$dir/server"
    return 1
  fi
  return 0
}

hosts_up
# make_lossy NS DEV: DEV (in namespace NS) loses, duplicates, delays and
# reorders what it sends. With netem (the kernel's sch_netem) in one qdisc;
# a kernel without it (some CI VMs, this one) gets nftables' netdev egress
# hook, which drops 3 % and duplicates 1 % of the RoCE packets at random
# and gives another 3 % the priority of a 20 Mbit/s class of an HTB qdisc
# (HTB takes a packet's priority as its class; this kernel has neither the
# fw classifier nor u32's mark match): they wait there (up to 64 packets,
# ~30 ms) while the rest overtake them, so they arrive late and out of order.
emulator=
make_lossy() {
  local ns=$1 dev=$2
  ip -n "$ns" link set "$dev" txqueuelen 10000
  if tc -n "$ns" qdisc add dev "$dev" root netem loss 3% duplicate 1% delay 1ms 1ms limit 100000 2>/dev/null; then
    emulator=netem
    return 0
  fi
  command -v nft >/dev/null || return 1
  ip netns exec "$ns" nft -f - <<NFT || return 1
table netdev lossy {
  chain out {
    type filter hook egress device "$dev" priority 0;
    udp dport 4791 numgen random mod 1000 < 30 counter drop
    udp dport 4791 numgen random mod 1000 < 10 counter dup to "$dev"
    udp dport 4791 numgen random mod 1000 < 30 meta priority set 1:20 counter
  }
}
NFT
  tc -n "$ns" qdisc add dev "$dev" root handle 1: htb default 10 &&
    tc -n "$ns" class add dev "$dev" parent 1: classid 1:10 htb rate 10gbit burst 1mb quantum 60000 &&
    tc -n "$ns" class add dev "$dev" parent 1: classid 1:20 htb rate 20mbit ceil 20mbit quantum 1600 &&
    tc -n "$ns" qdisc add dev "$dev" parent 1:20 handle 20: pfifo limit 64 || return 1
  emulator=nftables+htb
}
# Where the emulator of direction I (from host I) sits: "NS DEV".
link_of() {
  if [ "$1" = 1 ]; then echo "$XSRC_HOSTS_PREFIX-1 $(host_if 1)"; else echo "$XSRC_HOSTS_PREFIX-br port1"; fi
}
# delayed I: packets direction I's emulator held back (netem delays them all).
delayed() {
  local ns dev
  read -r ns dev <<<"$(link_of "$1")"
  if [ "$emulator" = netem ]; then
    tc -n "$ns" -s qdisc show dev "$dev" | sed -n 's/.*Sent [0-9]* bytes \([0-9]*\) pkt.*/\1/p' | head -1
  else
    tc -n "$ns" -s class show dev "$dev" classid 1:20 | sed -n 's/.*Sent [0-9]* bytes \([0-9]*\) pkt.*/\1/p'
  fi
}
# dropped I: packets direction I's emulator dropped.
dropped() {
  local ns dev
  read -r ns dev <<<"$(link_of "$1")"
  if [ "$emulator" = netem ]; then
    tc -n "$ns" -s qdisc show dev "$dev" | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1
  else
    nft_drops "$ns" lossy
  fi
}
segmentation 2 off
for i in 1 2; do
  # shellcheck disable=SC2046
  make_lossy $(link_of "$i") || { echo "FAIL: neither tc netem nor nftables can make the link from host $i lossy"; exit 1; }
done
echo "lossy link: $emulator"

# ibv_rc_pingpong does not wait for its peer at the end: when the ACK of one
# side's last message is lost, the other side, which has that message and
# has its own last send acknowledged, may be gone before the retry, and the
# last send then ends in IBV_WC_RETRY_EXC_ERR, as on any lossy RoCE link
# (a packet for a destroyed QP is dropped). That one outcome is accepted for
# either side when the other finished all 20 iterations with the data
# checked; the failing side must have no other error.
# lost_last_ack SIDE OTHER: SIDE's only failure is its last send's retries.
lost_last_ack() {
  grep -q "20 iters" "$dir/$2" &&
    [ "$(grep -c 'Failed status' "$dir/$1")" = 1 ] &&
    grep -q "transport retry counter exceeded (12) for wr_id 2" "$dir/$1"
}
for gid in 1 2; do
  timeout 240 "$hosts" run 1 ibv_rc_pingpong -d xsrc0 -g "$gid" -p "$port" -s 262144 -n 20 -c >"$dir/server" 2>&1 &
  server=$!
  wait_listen
  timeout 240 "$hosts" run 2 ibv_rc_pingpong -d xsrc0 -g "$gid" -p "$port" -s 262144 -n 20 -c 10.77.0.1 \
    >"$dir/client" 2>&1
  rc=$?
  wait "$server"; src=$?; server=
  done_by=client
  if [ $src -ne 0 ] && [ $rc -eq 0 ] && lost_last_ack server client; then
    echo "note: -g $gid: the server's last send outlived the client (its ACK was lost)"
    src=0
  elif [ $rc -ne 0 ] && [ $src -eq 0 ] && lost_last_ack client server; then
    echo "note: -g $gid: the client's last send outlived the server (its ACK was lost)"
    rc=0 done_by=server
  fi
  if [ $rc -ne 0 ] || [ $src -ne 0 ] || ! grep -q "20 iters" "$dir/$done_by"; then
    bad "ibv_rc_pingpong -g $gid: client rc $rc, server rc $src"
    echo "== client"; cat "$dir/client"; echo "== server"; cat "$dir/server"
  else
    echo "ok: ibv_rc_pingpong -g $gid --chk 256 KiB: $(grep -m1 'iters in' "$dir/$done_by")"
  fi
done
# WRITE, READ, SEND with data checked, and atomics whose duplicates must be
# answered from the responder's memory of them, never executed twice: the
# counter comes out exact.
verbs_pair 400 "$verbs" 1 data
if [ $rc -ne 0 ] || [ $src -ne 0 ]; then
  bad "rc_wire_verbs: client rc $rc, server rc $src"
  echo "== client"; cat "$dir/client"; echo "== server"; cat "$dir/server"
else
  echo "ok: rc_wire_verbs (WRITE, READ, SEND 1 B .. 1 MiB checked; atomics exact; XRC) on the lossy link"
fi
for prog in ib_write_bw ib_read_bw ib_send_bw; do
  if run_pair "$prog" "$prog" -d xsrc0 -x 1 -p "$port" -s 65536 -n 300 -- 10.77.0.1; then
    result=$(awk '$1 == 65536 && $2 == 300' "$dir/client")
    [ -n "$result" ] || bad "$prog: no result line"
    echo "ok: $prog 64 KiB x 300: $result"
  fi
done
for i in 1 2; do
  what=$([ "$i" = 1 ] && echo "datagrams" || echo "packets")
  echo "from host $i: $emulator dropped $(dropped "$i") $what, delayed $(delayed "$i")"
  "$hosts" run "$i" "$XSRC" status
  [ "$(dropped "$i")" -gt 0 ] || bad "the link from host $i dropped nothing: it was not lossy"
  [ "$(delayed "$i")" -gt 0 ] || bad "the link from host $i delayed nothing"
done
# What go-back-N throws away: every packet after a lost one. The window
# halves at each go-back and regrows with the ACKs, so that host 1 (which
# gets single packets lost) drops fewer packets as out of sequence than
# three times those it takes (nearly all of its drops are those) (about 1.4 times; with a fixed window of 256
# packets it was 7 times, with one of 4 MiB more).
delivered=$(status_field 1 wire_delivered)
thrown=$(status_field 1 wire_dropped)
echo "host 1: $delivered packets delivered, $thrown dropped out of sequence"
[ "$thrown" -lt $((3 * delivered)) ] || bad "host 1 dropped $thrown packets for $delivered delivered: the window does not shrink on loss"

finish rc_wire_lossy
