#!/bin/bash
# UD multicast across hosts on the wire (RoCE v2): a member on host 1 and
# three QPs on host 2 (two members, one with another Q_Key); a sender on host
# 1 sends N datagrams to the group (remote QPN 0xFFFFFF), a member on host 2
# detaches, the sender sends N more. Each member gets each datagram exactly
# once with its payload and a GRH naming the group (host 1's by shared
# memory, never again from the wire), the detached one nothing after its
# detach, the wrong Q_Key none. While members are attached, host 2 is in the
# IP group on its netdev, and leaves it after. Over an IPv4-mapped
# (::ffff:239.x) and an IPv6 (ff0e::) group. The capture on the bridge holds
# one packet per datagram, with the AH's hop limit, decodes with tshark's
# InfiniBand dissector with nothing malformed, and every ICRC checks with
# tests/wire/icrc_check.py. Then mckey (rdma_cm) with a receiver on each
# host, over both group kinds.
#   mcast_wire.sh PROGRAM
set -u
prog=$1
: "${XSRC_HOSTS_PREFIX:=xsrcmc}"
export XSRC_HOSTS_PREFIX
. "$(dirname "$0")/lib.sh"
chmod 755 "$dir"  # the members write their files there from the hosts
n=${MCAST_WIRE_N:-100}
qkey=0x11111111
hop=5
wait_file() {
  for _ in $(seq 300); do [ -e "$1" ] && return 0; sleep 0.1; done
  bad "$1 did not appear"; return 1
}
# in_group HOST ADDR: is the host's netdev in the IP multicast group?
in_group() {
  "$hosts" run "$1" ip maddr show dev "$(host_if "$1")" | grep -qw "$2"
}

# one_group GIDX GROUP IPADDR: the whole exchange over one group.
one_group() {
  local gidx=$1 group=$2 ip=$3 tag=g$1
  local stop=$dir/$tag.stop
  pids=()
  # name HOST EXPECT QKEY [DETACH_AFTER]
  member() {
    local name=$1 host=$2 expect=$3 key=$4; shift 4
    local extra=()
    [ $# -eq 0 ] || extra=("$1" "$dir/$tag.$name.detached")
    "$hosts" run "$host" "$prog" recv "$gidx" "$group" "$key" "$expect" "$dir/$tag.$name.ready" "$stop" \
      "${extra[@]}" >"$dir/$tag.$name.out" 2>&1 &
    pids+=($!)
    names+=("$name")
  }
  names=()
  member h1 1 $((2 * n)) $qkey
  member h2a 2 $((2 * n)) $qkey
  member h2detach 2 "$n" $qkey "$n"
  member h2qkey 2 0 0x22222222
  for name in "${names[@]}"; do wait_file "$dir/$tag.$name.ready" || return 1; done
  in_group 2 "$ip" || bad "$tag: host 2's netdev is not in group $ip while members are attached"
  in_group 1 "$ip" || bad "$tag: host 1's netdev is not in group $ip while a member is attached"

  "$hosts" run 1 "$prog" send "$gidx" "$group" $qkey 0 "$n" 256 $hop >"$dir/$tag.send1" 2>&1 ||
    bad "$tag: first sender: $(cat "$dir/$tag.send1")"
  wait_file "$dir/$tag.h2detach.detached"
  "$hosts" run 1 "$prog" send "$gidx" "$group" $qkey "$n" "$n" 1000 $hop >"$dir/$tag.send2" 2>&1 ||
    bad "$tag: second sender: $(cat "$dir/$tag.send2")"
  sleep 1
  touch "$stop"
  local i=0
  for p in "${pids[@]}"; do
    wait "$p" || bad "$tag: member ${names[$i]}: $(cat "$dir/$tag.${names[$i]}.out")"
    echo "$tag ${names[$i]}: $(cat "$dir/$tag.${names[$i]}.out")"
    i=$((i + 1))
  done
  pids=()
  sleep 0.5
  in_group 2 "$ip" && bad "$tag: host 2 is still in group $ip after its members went"
  in_group 1 "$ip" && bad "$tag: host 1 is still in group $ip after its member went"
  return 0
}

hosts_up
start_capture "$dir/wire.pcap"
one_group 1 ::ffff:239.77.1.1 239.77.1.1
one_group 2 ff0e::77:1 ff0e::77:1
stop_capture "$dir/wire.pcap"

# rdma_cm's multicast (unmodified mckey through `xsrc run`): a receiver on
# each host, the sender on host 1; each receiver waits for all the messages.
for g in 239.77.2.2 ff0e::77:2; do
  case $g in *:*) b1=fd77::1 b2=fd77::2 ;; *) b1=10.77.0.1 b2=10.77.0.2 ;; esac
  timeout 40 "$hosts" run 2 "$XSRC" run -- mckey -m $g -b $b2 -c 1 -C 20 >"$dir/mckey2" 2>&1 &
  k2=$!; pids+=($k2)
  timeout 40 "$hosts" run 1 "$XSRC" run -- mckey -m $g -b $b1 -c 1 -C 20 >"$dir/mckey1" 2>&1 &
  k1=$!; pids+=($k1)
  sleep 2  # the receivers join before anything is sent
  timeout 40 "$hosts" run 1 "$XSRC" run -- mckey -m $g -b $b1 -c 1 -s -C 20 >"$dir/mckeys" 2>&1 ||
    bad "mckey $g: sender: $(cat "$dir/mckeys")"
  wait $k2 || bad "mckey $g: receiver on host 2: $(cat "$dir/mckey2")"
  wait $k1 || bad "mckey $g: receiver on host 1: $(cat "$dir/mckey1")"
  pids=()
  echo "mckey $g: 20 messages to a receiver on each host"
done

# One packet per datagram sent: 2 groups x 2N; none to host 1's members.
want=$((2 * 2 * n))
check_capture "$dir/wire.pcap"
lost=$(sed -n 's/^\([0-9]*\) packets\{0,1\} dropped by kernel.*/\1/p' "$dir/wire.pcap.log")
[ "${packets:-0}" -le "$want" ] || bad "captured $packets RoCE packets, more than the $want datagrams sent"
[ $((${packets:-0} + ${lost:-0})) -ge "$want" ] ||
  bad "captured $packets RoCE packets (tcpdump lost ${lost:-0}), expected $want"
v4=$(tshark -r "$dir/wire.pcap" -Y "ip.dst == 239.77.1.1 && ip.ttl == $hop && infiniband.bth.destqp == 0xffffff" 2>/dev/null | wc -l)
v6=$(tshark -r "$dir/wire.pcap" -Y "ipv6.dst == ff0e::77:1 && ipv6.hlim == $hop && infiniband.bth.destqp == 0xffffff" 2>/dev/null | wc -l)
echo "to the IPv4 group with TTL $hop: $v4; to the IPv6 group with hop limit $hop: $v6"
[ "$v4" -gt 0 ] && [ "$v6" -gt 0 ] && [ $((v4 + v6)) -eq "$packets" ] ||
  bad "packets to the groups with the AH's hop limit and QPN 0xFFFFFF: IPv4 $v4, IPv6 $v6, of $packets"

finish mcast_wire
