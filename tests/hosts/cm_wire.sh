#!/bin/bash
# rdma_cm between two hosts of the harness (hosts.sh): the IB CM's MADs on
# QP1 in RoCE v2 (xsrcd/cm_wire.cpp), unmodified librdmacm programs under
# `xsrc run`, server on host 1, client on host 2.
#   cm_wire.sh PORT connect   rping -V over IPv4 and IPv6, ucmatose, udaddy
#                             (SIDR), perftest ib_send_bw/ib_write_bw -R; a
#                             capture on the bridge decodes in tshark with the
#                             CM MADs seen and none malformed, every ICRC checks
#   cm_wire.sh PORT refused   a port with no listener: REJECTED at once; an
#                             address where no host answers ARP/ND: ADDR_ERROR
#                             after the resolve timeout; a peer host without
#                             xsrcd: the connect fails within the retry
#                             budget, never hangs
#   cm_wire.sh PORT lossy     every other CM MAD a host sends is lost and every
#                             one that goes out arrives twice (nftables):
#                             resends and duplicates, rping and ucmatose still
#                             connect, exchange and disconnect
set -u
port=$1
mode=$2
# Hosts of its own for each mode (xsrccm, xsrccr, xsrccl), so that the
# three CTest cases may run side by side (ctest -j).
case $mode in connect) own=xsrccm ;; refused) own=xsrccr ;; *) own=xsrccl ;; esac
export XSRC_HOSTS_PREFIX=${XSRC_HOSTS_PREFIX:-$own}
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../rdmacm/rping_race.sh"
. "$(dirname "$0")/../rdmacm/listener.sh"

# on HOST CMD...: CMD under `xsrc run` on that host.
on() {
  local h=$1; shift
  "$hosts" run "$h" "$XSRC" run -- "$@"
}
# pair NAME LIMIT SERVER... -- CLIENT...: server on host 1, client on host 2;
# both must exit 0 within LIMIT seconds.
pair() {
  local name=$1 limit=$2; shift 2
  local s=() c=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do s+=("$1"); shift; done
  shift
  c=("$@")
  local before
  before=$(cm_listeners "$hosts" run 1 "$XSRC")
  timeout "$limit" "$hosts" run 1 "$XSRC" run -- "${s[@]}" >"$dir/server" 2>&1 &
  server=$!
  # The client connects once host 1's xsrcd counts the server's listener.
  if ! await_listener "$before" "$hosts" run 1 "$XSRC"; then
    bad "$name: host 1 counted no new listener (cm_listeners ${before:-none} -> ${listeners_now:-none}) within 10 s"
    kill "$server" 2>/dev/null; wait "$server"; server=
    echo "== server: ${s[*]}"; cat "$dir/server"
    return 1
  fi
  local start=$SECONDS
  timeout "$limit" "$hosts" run 2 "$XSRC" run -- "${c[@]}" >"$dir/client" 2>&1
  local rc=$?
  [ "${c[0]}" = rping ] && rc=$(rping_client_rc $rc "$dir/client")
  wait "$server"
  local src=$?
  server=
  if [ $rc -ne 0 ] || [ $src -ne 0 ]; then
    bad "$name: client rc $rc, server rc $src"
    echo "== server: ${s[*]}"; cat "$dir/server"
    echo "== client: ${c[*]}"; cat "$dir/client"
    return 1
  fi
  echo "ok: $name ($((SECONDS - start)) s)"
}

hosts_up

case $mode in
connect)
  start_capture "$dir/cm.pcap"
  pair "rping -V -C 10 over IPv4" 60 rping -s -a 10.77.0.1 -p "$port" -V -C 10 -- \
    rping -c -a 10.77.0.1 -p "$port" -V -C 10
  pair "rping -V -C 10 over IPv6" 60 rping -s -a fd77::1 -p "$port" -V -C 10 -- \
    rping -c -a fd77::1 -p "$port" -V -C 10
  stop_capture "$dir/cm.pcap"
  check_capture "$dir/cm.pcap"
  # Each connection: REQ, REP, RTU, DREQ, DREP, seen by tshark's CM dissector, over IPv4 and IPv6.
  for attr in 0x0010:REQ 0x0013:REP 0x0014:RTU 0x0015:DREQ 0x0016:DREP; do
    for ip in ip ipv6; do
      n=$(tshark -r "$dir/cm.pcap" -Y "$ip && infiniband.mad.attributeid == ${attr%:*}" 2>/dev/null | wc -l)
      [ "$n" -ge 1 ] || bad "no CM ${attr#*:} over $ip in the capture"
    done
  done
  tshark -r "$dir/cm.pcap" -Y 'infiniband.mad.mgmtclass == 0x07' -T fields -e ip.src -e ipv6.src \
    -e infiniband.mad.attributeid -e infiniband.cm.req.serviceid 2>/dev/null | head -12
  sid=$(tshark -r "$dir/cm.pcap" -Y 'ip && infiniband.mad.attributeid == 0x0010' -T fields \
    -e infiniband.cm.req.serviceid 2>/dev/null | head -1)
  want=$(printf '0x%016x' $((0x01060000 + port)))
  [ "$sid" = "$want" ] || bad "REQ service id $sid, expected $want (RDMA_PS_TCP, port $port)"

  # The IP CM header of the kernel's rdma_cm in the REQ's private data.
  n=$(tshark -r "$dir/cm.pcap" -Y 'infiniband.cm.req.ip_cm.dip4 == 10.77.0.1 && infiniband.cm.req.ip_cm.sip4 == 10.77.0.2' 2>/dev/null | wc -l)
  [ "$n" -ge 1 ] || bad "no REQ with the IPv4 IP CM header (10.77.0.2 to 10.77.0.1)"
  n=$(tshark -r "$dir/cm.pcap" -Y 'infiniband.cm.req.ip_cm.dip6 == fd77::1 && infiniband.cm.req.ip_cm.sip6 == fd77::2' 2>/dev/null | wc -l)
  [ "$n" -ge 1 ] || bad "no REQ with the IPv6 IP CM header (fd77::2 to fd77::1)"

  pair "ucmatose" 60 ucmatose -b 10.77.0.1 -p "$port" -C 20 -- ucmatose -s 10.77.0.1 -p "$port" -C 20
  pair "udaddy (SIDR)" 60 udaddy -b 10.77.0.1 -- udaddy -s 10.77.0.1
  pair "ib_send_bw -R" 90 ib_send_bw -R -d xsrc0 -p "$port" -n 200 -- \
    ib_send_bw -R -d xsrc0 -p "$port" -n 200 10.77.0.1
  pair "ib_write_bw -R" 90 ib_write_bw -R -d xsrc0 -p "$port" -n 200 -- \
    ib_write_bw -R -d xsrc0 -p "$port" -n 200 10.77.0.1
  ;;
refused)
  # No listener on the port: the peer's CM answers REJ (invalid service id).
  start=$SECONDS
  timeout 30 "$hosts" run 2 "$XSRC" run -- rping -c -a 10.77.0.1 -p "$port" -C 1 >"$dir/client" 2>&1
  rc=$?
  took=$((SECONDS - start))
  cat "$dir/client"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || bad "rping to a port with no listener: rc $rc"
  grep -q "REJECTED" "$dir/client" || bad "rping to a port with no listener was not rejected"
  [ $took -le 5 ] || bad "rejected after $took s"
  echo "ok: no listener: rejected in $took s"
  # An address on the link that no host answers (ARP and neighbour
  # solicitation go unanswered): resolve_addr ends in ADDR_ERROR with
  # -ETIMEDOUT once rping's 2 s resolve timeout runs out, as the kernel's
  # CM ends it; no REQ is sent. Then a host that does answer still resolves.
  for addr in 10.77.0.99 fd77::99; do
    start=$SECONDS
    timeout 30 "$hosts" run 2 "$XSRC" run -- rping -c -a "$addr" -p "$port" -C 1 >"$dir/client" 2>&1
    rc=$?
    took=$((SECONDS - start))
    cat "$dir/client"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || bad "rping to $addr, where no host answers: rc $rc"
    grep -q "RDMA_CM_EVENT_ADDR_ERROR, error -110" "$dir/client" ||
      bad "rping to $addr, where no host answers, did not end in ADDR_ERROR -ETIMEDOUT"
    [ $took -ge 2 ] && [ $took -le 8 ] || bad "rping to $addr: ADDR_ERROR after $took s, not after its 2 s timeout"
    echo "ok: $addr, no host there: ADDR_ERROR in $took s"
  done
  "$hosts" run 2 ip neigh show | grep -E "10.77.0.99|fd77::99" || bad "no neighbour entry was made for the addresses"
  # A host without xsrcd: nobody answers the REQ; it is resent, then UNREACHABLE.
  "$hosts" run 1 "$XSRC" down >/dev/null 2>&1
  start=$SECONDS
  timeout 60 "$hosts" run 2 "$XSRC" run -- rping -c -a 10.77.0.1 -p "$port" -C 1 >"$dir/client" 2>&1
  rc=$?
  took=$((SECONDS - start))
  cat "$dir/client"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || bad "rping to a host without xsrcd: rc $rc"
  grep -q "UNREACHABLE" "$dir/client" || bad "rping to a host without xsrcd did not end UNREACHABLE"
  # xsrcd sends a REQ 10 times, 1 to 1.25 s apart (xsrcd/cm_wire.cpp).
  [ $took -ge 10 ] && [ $took -le 20 ] || bad "a host without xsrcd: the connect took $took s, not 10 to 20"
  echo "ok: no daemon: failed in $took s"
  "$hosts" run 2 "$XSRC" status | grep -o "cm_mads[a-z_]*=[0-9]*" | tr '\n' ' '; echo
  ;;
lossy)
  # On each host's veth: of the CM MADs (UD SEND Only to QP1) it sends, drop
  # every other one, and send each one that survives twice (the copy, marked,
  # passes the hook again untouched).
  for i in 1 2; do
    ns=$XSRC_HOSTS_PREFIX-$i
    ip netns exec "$ns" nft -f - <<NFT || { echo "FAIL: nftables cannot make host $i's link lose MADs"; exit 1; }
table netdev cmloss {
  chain out {
    type filter hook egress device "$(host_if $i)" priority 0;
    meta mark 0x4d4144 accept
    udp dport 4791 @th,64,8 0x64 @th,104,24 1 numgen inc mod 2 == 0 counter drop
    udp dport 4791 @th,64,8 0x64 @th,104,24 1 meta mark set 0x4d4144 counter dup to "$(host_if $i)"
  }
}
NFT
  done
  pair "rping -V -C 10, MADs lost and duplicated" 60 rping -s -a 10.77.0.1 -p "$port" -V -C 10 -- \
    rping -c -a 10.77.0.1 -p "$port" -V -C 10
  pair "rping -V -C 10 over IPv6, MADs lost and duplicated" 60 rping -s -a fd77::1 -p "$port" -V -C 10 -- \
    rping -c -a fd77::1 -p "$port" -V -C 10
  pair "ucmatose -c 3, MADs lost and duplicated" 90 ucmatose -b 10.77.0.1 -p "$port" -c 3 -C 10 -- \
    ucmatose -s 10.77.0.1 -p "$port" -c 3 -C 10
  pair "udaddy, MADs lost and duplicated" 60 udaddy -b 10.77.0.1 -- udaddy -s 10.77.0.1
  for i in 1 2; do
    ip netns exec "$XSRC_HOSTS_PREFIX-$i" nft list chain netdev cmloss out | grep -o "packets [0-9]* .*" | sed "s/^/host $i: /"
    status=$("$hosts" run "$i" "$XSRC" status | grep -o "cm_mads[a-z_]*=[0-9]*" | tr '\n' ' ')
    echo "host $i: $status"
    resent=$(echo "$status" | sed -n 's/.*cm_mads_resent=\([0-9]*\).*/\1/p')
    dups=$(echo "$status" | sed -n 's/.*cm_mads_duplicate=\([0-9]*\).*/\1/p')
    [ "${resent:-0}" -gt 0 ] || bad "host $i resent no MAD"
    [ "${dups:-0}" -gt 0 ] || bad "host $i saw no duplicate MAD"
  done
  ;;
*)
  echo "usage: cm_wire.sh PORT connect|refused|lossy"; exit 2 ;;
esac

finish "cm_wire $mode"
