#!/bin/bash
# RC and UC across hosts on the wire (RoCE v2): ibv_rc_pingpong and
# ibv_uc_pingpong --chk between host 1 and host 2 of the harness (hosts.sh)
# over the IPv4-mapped (-g 1), the IPv6 (-g 2) and the IPv6 link-local
# (-g 0) GID, 1 byte to 1 MiB: SEND segmented FIRST/MIDDLE/LAST at the path
# MTU (1024 on a 1500-byte link), PSNs, RC ACKs. A capture of the small runs
# must decode with tshark's InfiniBand dissector with nothing malformed,
# show RC and UC SEND First/Middle/Last/Only and ACKs, and every ICRC must
# check with tests/wire/icrc_check.py (which shares no code with xsrc).
# Peers on one host still use shared memory: nothing of theirs on the wire.
# Afterwards no namespace, daemon or holder is left. With LINK_MTU 9000 (jumbo
# frames, as RoCE fabrics run) the port's active MTU is 4096, and so is the
# path MTU the pingpongs ask for (-m) and the segments on the wire. With
# XSRC_HOSTS_ABI set, the daemons serve that driver ABI revision.
#   rc_wire_pingpong.sh PORT [LINK_MTU]
set -u
port=$1
link_mtu=${2:-1500}
mtu=1024
[ "$link_mtu" -lt 9000 ] || mtu=4096
export XSRC_HOSTS_PREFIX=xsrcrc$link_mtu${XSRC_HOSTS_ABI:+a$XSRC_HOSTS_ABI} XSRC_HOSTS_MTU=$link_mtu
. "$(dirname "$0")/lib.sh"

# pingpong PROGRAM SERVER_HOST CLIENT_HOST GID SIZE ITERS [OPTION...]: one
# --chk run.
pingpong() {
  local prog=$1 sh=$2 ch=$3 gid=$4 size=$5 iters=$6
  shift 6
  timeout 120 "$hosts" run "$sh" "$prog" -d xsrc0 -g "$gid" -m "$mtu" -p "$port" -s "$size" -n "$iters" -c "$@" \
    >"$dir/server" 2>&1 &
  server=$!
  wait_listen "$sh"
  timeout 120 "$hosts" run "$ch" "$prog" -d xsrc0 -g "$gid" -m "$mtu" -p "$port" -s "$size" -n "$iters" -c "$@" \
    10.77.0.$sh >"$dir/client" 2>&1
  local rc=$?
  wait "$server"
  local src=$?
  server=
  if [ $rc -ne 0 ] || [ $src -ne 0 ] || ! grep -q "$iters iters" "$dir/client" ||
     ! grep -q "$iters iters" "$dir/server"; then
    bad "$prog -g $gid -s $size $*: client rc $rc, server rc $src"
    echo "== client"; cat "$dir/client"; echo "== server"; cat "$dir/server"
    return 1
  fi
  echo "ok: $prog -g $gid -s $size $*: $(grep -m1 'iters in' "$dir/client")"
}

hosts_up
# The largest IB MTU that fits the link with the RoCE v2 headers.
for h in 1 2; do
  active=$("$hosts" run $h ibv_devinfo -d xsrc0 | awk '/active_mtu/ {print $2; exit}')
  [ "$active" = "$mtu" ] || bad "host $h on a $link_mtu-byte link: active_mtu $active, want $mtu"
done

# 1. Same host: shared memory, nothing on the wire.
start_capture "$dir/local.pcap"
pingpong ibv_rc_pingpong 1 1 1 4096 100
stop_capture "$dir/local.pcap"
local_packets=$(/usr/bin/python3 "$checker" "$dir/local.pcap" | cut -d' ' -f1)
[ "$local_packets" = 0 ] || bad "same-host RC put $local_packets packets on the wire"

# 2. Small runs under capture: every packet decodes and its ICRC checks.
start_capture "$dir/wire.pcap"
for run in rc:1:1 rc:1:9000 rc:2:2049 rc:0:4097 uc:1:9000 uc:2:1; do
  IFS=: read -r kind gid size <<<"$run"
  pingpong "ibv_${kind}_pingpong" 1 2 "$gid" "$size" 20 || break
done
stop_capture "$dir/wire.pcap"
[ $fail -eq 0 ] || exit 1
check_capture "$dir/wire.pcap"
# RC SEND First 0, Middle 1, Last 2, Only 4, ACK 17; UC SEND First 32, Last 34, Only 36.
for opcode in 0 1 2 4 17 32 34 36; do
  n=$(tshark -r "$dir/wire.pcap" -Y "infiniband.bth.opcode == $opcode" 2>/dev/null | wc -l)
  [ "$n" -gt 0 ] || bad "no packet of opcode $opcode on the wire"
done
ipv6=$(tshark -r "$dir/wire.pcap" -Y 'ipv6 && infiniband.bth.opcode == 17' 2>/dev/null | wc -l)
[ "$ipv6" -gt 0 ] || bad "no RC ACK over IPv6"
# Packets of a message are the path MTU long, the last one the rest.
big=$(tshark -r "$dir/wire.pcap" -Y 'infiniband.bth.opcode == 0 && ip' -T fields -e udp.length 2>/dev/null | sort -u)
[ "$big" = $((8 + 12 + mtu + 4)) ] || bad "RC SEND First UDP lengths: $big (want one MTU of payload)"

# 3. Sizes up to 1 MiB, data checked (--chk). A message's run of packets
# leaves its sender as GSO datagrams, which cross the veths whole: the
# receiving xsrcd cuts them into their packets (wire_gso counts them).
gso_before=$(status_field 1 wire_gso)
for run in rc:1:1 rc:1:$((mtu - 1)) rc:1:$mtu rc:1:$((mtu + 1)) rc:1:65536 rc:1:262144 rc:1:1048576 rc:2:1048576 \
           uc:1:$mtu uc:1:65537 uc:1:1048576 uc:2:262144; do
  IFS=: read -r kind gid size <<<"$run"
  iters=100
  [ "$size" -lt 262144 ] || iters=10
  pingpong "ibv_${kind}_pingpong" 1 2 "$gid" "$size" "$iters" || break
done
[ "$(status_field 1 wire_gso)" -gt "$gso_before" ] || bad "host 1 took no GSO datagram"

# 3b. The ACK a request asks for waits a moment on the owner's ACK board
# and leaves with the owner's reply, in one datagram: in a ping-pong most
# ACKs are left there (wire_acks_left) and taken, few sent late by xsrcd
# (wire_acks_late). A daemon serving revision 9 takes no board.
left_before=$(status_field 1 wire_acks_left)
late_before=$(status_field 1 wire_acks_late)
pingpong ibv_rc_pingpong 1 2 1 64 1000
left=$(( $(status_field 1 wire_acks_left) - left_before ))
late=$(( $(status_field 1 wire_acks_late) - late_before ))
echo "host 1: $left ACKs left on the board in 1000 round trips, $late of them sent late"
if [ "${XSRC_HOSTS_ABI:-}" = 9 ]; then
  [ "$left" -eq 0 ] || bad "a daemon at --abi 9 left $left ACKs on a board"
else
  [ "$left" -ge 500 ] || bad "only $left of 1000 ACKs left on the board"
  [ "$late" -le $((left / 4)) ] || bad "$late of $left ACKs left on the board were sent late"
fi

# 4. Completion events (-e): both sides sleep in ibv_get_cq_event, so the
# ACKs that complete their SENDs are read by the response thread alone,
# which waits on the socket while a CQ is armed.
pingpong ibv_rc_pingpong 1 2 1 4096 1000 -e
pingpong ibv_rc_pingpong 1 2 2 262144 20 -e

"$hosts" run 1 "$XSRC" status
"$hosts" run 2 "$XSRC" status

finish "rc_wire_pingpong (link MTU $link_mtu)"
