#!/bin/bash
# UD across hosts on the wire (RoCE v2): ibv_ud_pingpong --chk between host 1
# and host 2 of the harness (hosts.sh) over the IPv4-mapped (-g 1), the
# IPv6 (-g 2) and the IPv6 link-local (-g 0) GID, 1 to 1024 bytes (the port MTU of a 1500-byte link). A
# capture on the bridge must decode with tshark's InfiniBand dissector with
# nothing malformed, and every ICRC must check with tests/wire/icrc_check.py
# (which shares no code with xsrc). A packet injected with a corrupted ICRC is
# counted and dropped by the receiving xsrcd, one with a good ICRC (computed by
# the checker) passes it. Peers on one host still use shared memory: nothing
# of theirs on the wire. Afterwards no namespace, daemon or holder is left.
#   ud_wire_pingpong.sh PORT
set -u
port=$1
export XSRC_HOSTS_PREFIX=xsrcud
. "$(dirname "$0")/lib.sh"
sender=$here/../wire/roce_send.py
pingpong() {
  local sh=$1 ch=$2 addr=$3 gid=$4 size=$5
  timeout 60 "$hosts" run "$sh" ibv_ud_pingpong -d xsrc0 -g "$gid" -p "$port" -s "$size" -n 200 -c \
    >"$dir/server" 2>&1 &
  server=$!
  wait_listen "$sh"
  timeout 60 "$hosts" run "$ch" ibv_ud_pingpong -d xsrc0 -g "$gid" -p "$port" -s "$size" -n 200 -c "$addr" \
    >"$dir/client" 2>&1
  local rc=$?
  wait "$server"
  local src=$?
  server=
  if [ $rc -ne 0 ] || [ $src -ne 0 ] || ! grep -q "200 iters" "$dir/client"; then
    bad "-g $gid -s $size: client rc $rc, server rc $src"
    echo "== client"; cat "$dir/client"; echo "== server"; cat "$dir/server"
    return 1
  fi
  echo "ok: -g $gid -s $size: $(grep -m1 'bytes in' "$dir/client")"
}

hosts_up

# 1. Same host: shared memory, nothing on the wire.
start_capture "$dir/local.pcap"
pingpong 1 1 127.0.0.1 1 512
stop_capture "$dir/local.pcap"
local_packets=$(/usr/bin/python3 "$checker" "$dir/local.pcap" | cut -d' ' -f1)
[ "$local_packets" = 0 ] || bad "same-host UD put $local_packets packets on the wire"

# 2. Across hosts, both GID kinds, several sizes, data checked (--chk).
start_capture "$dir/wire.pcap"
# GID 0 (IPv6 link-local: the socket is scoped to the netdev) briefly.
runs=0
for run in 1:1 1:3 1:64 1:1000 1:1024 2:1 2:3 2:64 2:1000 2:1024 0:1 0:1024; do
  pingpong 1 2 10.77.0.1 "${run%:*}" "${run#*:}" || break
  runs=$((runs + 1))
done
stop_capture "$dir/wire.pcap"
[ $fail -eq 0 ] || exit 1
# 200 iterations each way per run.
want=$((runs * 2 * 200))
check_capture "$dir/wire.pcap"
# A loaded machine may make tcpdump lose some (it says how many): those are
# not on file to check, but every one must have been sent.
lost=$(sed -n 's/^\([0-9]*\) packets\{0,1\} dropped by kernel.*/\1/p' "$dir/wire.pcap.log")
[ $((${packets:-0} + ${lost:-0})) -ge "$want" ] ||
  bad "captured $packets RoCE packets (tcpdump lost ${lost:-0}), expected at least $want"
ipv6=$(tshark -r "$dir/wire.pcap" -Y 'ipv6 && infiniband.bth.opcode == 100' 2>/dev/null | wc -l)
ipv4=$(tshark -r "$dir/wire.pcap" -Y 'ip && infiniband.bth.opcode == 100' 2>/dev/null | wc -l)
[ "$ipv4" -gt 0 ] && [ "$ipv6" -gt 0 ] || bad "UD SEND Only over IPv4: $ipv4, over IPv6: $ipv6"
[ "$(status_field 1 wire_bad_icrc)" = 0 ] || bad "host 1 counted bad ICRCs from xsrc's own packets"
[ "$(status_field 2 wire_delivered)" -ge $((runs * 200)) ] ||
  bad "host 2 delivered $(status_field 2 wire_delivered) packets"

# 3. Injected packets: a corrupted ICRC is counted and dropped; a good one
# (from the independent checker's CRC) passes the ICRC check.
before_bad=$(status_field 1 wire_bad_icrc)
before_delivered=$(status_field 1 wire_delivered)
before_dropped=$(status_field 1 wire_dropped)
"$hosts" run 2 /usr/bin/python3 "$sender" 10.77.0.2 10.77.0.1 0x100 0x11111111 --bad-icrc
sleep 0.3
[ "$(status_field 1 wire_bad_icrc)" = $((before_bad + 1)) ] || bad "a corrupted ICRC was not counted"
[ "$(status_field 1 wire_delivered)" = "$before_delivered" ] || bad "a corrupted packet was delivered"
[ "$(status_field 1 wire_dropped)" = "$before_dropped" ] || bad "a corrupted packet got past the ICRC check"
"$hosts" run 2 /usr/bin/python3 "$sender" 10.77.0.2 10.77.0.1 0x100 0x11111111
sleep 0.3
[ "$(status_field 1 wire_bad_icrc)" = $((before_bad + 1)) ] || bad "a good ICRC was counted bad"
[ "$(status_field 1 wire_dropped)" = $((before_dropped + 1)) ] ||
  bad "a good packet to no QP was not dropped past the ICRC check"
"$hosts" run 1 "$XSRC" status

finish ud_wire_pingpong
