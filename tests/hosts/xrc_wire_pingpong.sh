#!/bin/bash
# XRC and SRQ across hosts on the wire (RoCE v2): ibv_xsrq_pingpong (server
# on host 1 with two clients on host 2: its XRC send QPs reach the clients'
# XRC receive QPs and SRQs, each request carrying an XRCETH) and
# ibv_srq_pingpong --chk, over the IPv4-mapped (-g 1) and the IPv6 (-g 2)
# GID, 1 byte to 1 MiB. A capture of the small runs must decode with
# tshark's InfiniBand dissector with nothing malformed, show XRC SEND
# Only/First/Middle/Last, the XRC Acknowledge and an XRCETH naming an SRQ,
# and every ICRC must check with tests/wire/icrc_check.py; UDP source ports
# are the QPs' (0xC000 and up, several).
#   xrc_wire_pingpong.sh PORT
set -u
port=$1
export XSRC_HOSTS_PREFIX=${XSRC_HOSTS_PREFIX:-xsrcxr}
. "$(dirname "$0")/lib.sh"

# xsrq GID SIZE ITERS: ibv_xsrq_pingpong, server on host 1, two clients on host 2.
xsrq() {
  local gid=$1 size=$2 iters=$3 rc i
  timeout 120 "$hosts" run 1 ibv_xsrq_pingpong -d xsrc0 -g "$gid" -p "$port" -c 2 -s "$size" -n "$iters" \
    >"$dir/server" 2>&1 &
  local server=$!
  pids=("$server")
  wait_listen 1
  local clients=()
  for i in 1 2; do
    timeout 120 "$hosts" run 2 ibv_xsrq_pingpong -d xsrc0 -g "$gid" -p "$port" -s "$size" -n "$iters" 10.77.0.1 \
      >"$dir/client$i" 2>&1 &
    clients+=($!)
    pids+=($!)
  done
  local ok=1
  for i in 1 2; do
    wait "${clients[$((i - 1))]}"; rc=$?
    if [ $rc -ne 0 ] || ! grep -q '^success$' "$dir/client$i"; then
      echo "== client $i (exit $rc)"; cat "$dir/client$i"; ok=0
    fi
  done
  wait "$server"; rc=$?
  pids=()
  if [ $rc -ne 0 ] || ! grep -q '^success$' "$dir/server"; then
    echo "== server (exit $rc)"; cat "$dir/server"; ok=0
  fi
  [ $ok -eq 1 ] || { bad "ibv_xsrq_pingpong -g $gid -s $size"; return 1; }
  echo "ok: ibv_xsrq_pingpong -g $gid -s $size -n $iters, 2 clients"
}

# srq GID SIZE ITERS: ibv_srq_pingpong --chk, server on host 1, client on host 2.
srq() {
  local gid=$1 size=$2 iters=$3
  timeout 120 "$hosts" run 1 ibv_srq_pingpong -d xsrc0 -g "$gid" -p "$port" -s "$size" -n "$iters" -c \
    >"$dir/server" 2>&1 &
  local server=$!
  pids=("$server")
  wait_listen 1
  timeout 120 "$hosts" run 2 ibv_srq_pingpong -d xsrc0 -g "$gid" -p "$port" -s "$size" -n "$iters" -c 10.77.0.1 \
    >"$dir/client" 2>&1
  local rc=$?
  wait "$server"; local src=$?
  pids=()
  if [ $rc -ne 0 ] || [ $src -ne 0 ] || ! grep -q "$iters iters" "$dir/client" ||
     ! grep -q "$iters iters" "$dir/server"; then
    bad "ibv_srq_pingpong -g $gid -s $size: client rc $rc, server rc $src"
    echo "== client"; cat "$dir/client"; echo "== server"; cat "$dir/server"
    return 1
  fi
  echo "ok: ibv_srq_pingpong -g $gid -s $size: $(grep -m1 'iters in' "$dir/client")"
}

hosts_up

# 1. Small runs under capture: every packet decodes and its ICRC checks.
start_capture "$dir/wire.pcap"
xsrq 1 1 5
xsrq 2 3000 5
srq 1 3000 20
stop_capture "$dir/wire.pcap"
[ $fail -eq 0 ] || exit 1
check_capture "$dir/wire.pcap"
# XRC SEND First 0xA0, Middle 0xA1, Last 0xA2, Only 0xA4, XRC Acknowledge 0xB1.
for opcode in 160 161 162 164 177; do
  n=$(tshark -r "$dir/wire.pcap" -Y "infiniband.bth.opcode == $opcode" 2>/dev/null | wc -l)
  [ "$n" -gt 0 ] || bad "no packet of opcode $opcode on the wire"
done
# The XRCETH (bytes 12..15 of the UDP payload: 8 reserved bits, the SRQ number).
srqns=$(tshark -r "$dir/wire.pcap" -Y 'infiniband.bth.opcode == 164' -T fields -e udp.payload 2>/dev/null |
  cut -c25-32 | sort -u | grep -c '^00')
[ "$srqns" -ge 2 ] || bad "XRC SEND Only packets name $srqns SRQs in their XRCETH (want the 2 clients')"
# UDP source ports come from the QPs: 0xC000 | a hash of the QP numbers,
# one per QP and direction (several here), never the kernel's ephemeral ones.
ports=$(tshark -r "$dir/wire.pcap" -Y infiniband -T fields -e udp.srcport 2>/dev/null | sort -un)
low=$(echo "$ports" | head -1)
nports=$(echo "$ports" | grep -c .)
echo "UDP source ports: $nports distinct, lowest $low"
[ "$low" -ge 49152 ] || bad "a UDP source port below 0xC000: $low"
[ "$nports" -ge 4 ] || bad "only $nports UDP source ports for the QPs of 3 runs"

# 2. Sizes up to 1 MiB.
for size in 1024 1025 65536 1048576; do
  xsrq 1 "$size" 5 || break
done
xsrq 2 262144 5
for run in 1:1 1:4096 1:65537 1:1048576 2:262144; do
  IFS=: read -r gid size <<<"$run"
  iters=50
  [ "$size" -lt 262144 ] || iters=10
  srq "$gid" "$size" "$iters" || break
done
"$hosts" run 1 "$XSRC" status
"$hosts" run 2 "$XSRC" status

finish xrc_wire_pingpong
