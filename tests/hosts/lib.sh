# What the tests of tests/hosts share; sourced (`. "$here/lib.sh"`) after
# the test has set `port` and exported XSRC_HOSTS_PREFIX (its own hosts).
#
#   hosts, checker   hosts.sh and the independent ICRC checker
#   hosts_up         two hosts, or the test fails at once
#   dir              a scratch directory, removed at exit
#   server, pids     a background server / other processes, killed at exit
#   fail, bad MSG    "FAIL: MSG", and the test fails
#   wait_listen [H]  until host H (1) listens on TCP $port
#   start_capture F [KIB] / stop_capture F
#                    tcpdump of UDP 4791 on the bridge into F (a KIB
#                    buffer, 16384 by default); meanwhile each host's
#                    kernel cuts GSO datagrams into packets before its veth
#                    (segmentation H on|off), as before a NIC
#   segmentation H on|off
#                    whether host H's veth takes a GSO datagram whole
#                    (ethtool tx-udp-segmentation; on by default)
#   status_field H NAME
#                    a counter of host H's `xsrc status` (wire_gso, ...)
#   check_capture F  every packet of F decodes as InfiniBand in tshark with
#                    none malformed and its ICRC checks; sets `packets`
#   verbs_pair SECS PROGRAM GID [MODE]
#                    rc_wire_verbs-style PROGRAM: its server on host 1, its
#                    client on host 2; output in $dir/server and
#                    $dir/client, exit statuses in src and rc
#   pair_passed      after verbs_pair: shows both outputs; the test fails
#                    unless both sides exited 0
#   need_nft         the test fails at once without nftables' nft
#   nft_drops NS TABLE [N]
#                    packets the N-th (1st) counted drop rule of chain
#                    netdev TABLE out in namespace NS dropped
#   finish NAME      stops everything, checks nothing is left, exits
# shellcheck shell=bash

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
hosts=$here/hosts.sh
checker=$here/../wire/icrc_check.py
dir=$(mktemp -d)
server=
pids=()
capture=
fail=0
packets=0

cleanup() {
  [ -z "$server" ] || kill "$server" 2>/dev/null
  [ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null
  [ -z "$capture" ] || { kill -INT "$capture" 2>/dev/null; wait "$capture" 2>/dev/null; }
  "$hosts" down
  rm -rf "$dir"
}
trap cleanup EXIT

bad() { echo "FAIL: $*"; fail=1; }

hosts_up() { "$hosts" up 2 || { echo "FAIL: hosts.sh up"; exit 1; }; }

wait_listen() {
  for _ in $(seq 100); do
    "$hosts" run "${1:-1}" ss -ltn 2>/dev/null | grep -q ":$port " && return 0
    sleep 0.1
  done
}

verbs_pair() {
  local secs=$1 prog=$2 gid=$3 mode=${4:-}
  timeout "$secs" "$hosts" run 1 "$prog" server "$port" "$gid" ${mode:+"$mode"} >"$dir/server" 2>&1 &
  server=$!
  timeout "$secs" "$hosts" run 2 "$prog" client 10.77.0.1 "$port" "$gid" ${mode:+"$mode"} >"$dir/client" 2>&1
  rc=$?
  wait "$server"; src=$?; server=
}

pair_passed() {
  echo "== client"; cat "$dir/client"
  echo "== server"; cat "$dir/server"
  [ "$rc" -eq 0 ] || bad "client exit $rc"
  [ "$src" -eq 0 ] || bad "server exit $src"
}

need_nft() { command -v nft >/dev/null || { echo "FAIL: no nft"; exit 1; }; }

nft_drops() {
  ip netns exec "$1" nft list chain netdev "$2" out | sed -n 's/.*packets \([0-9]*\).*drop$/\1/p' | sed -n "${3:-1}p"
}

# host_if H: host H's interface (hosts.sh names it so).
host_if() { echo "${XSRC_HOSTS_IFNAME:-$XSRC_HOSTS_PREFIX-$1}"; }

segmentation() {
  "$hosts" run "$1" ethtool -K "$(host_if "$1")" tx-udp-segmentation "$2" ||
    bad "ethtool could not turn host $1's tx-udp-segmentation $2"
}

status_field() {
  "$hosts" run "$1" "$XSRC" status | sed -n "s/.*\b$2=\([0-9]*\).*/\1/p" | head -1
}

# A GSO datagram crosses a veth and the bridge whole (xsrcd splits it), so
# a capture on the bridge would show it as one: for the capture, each host's
# kernel cuts it into the packets a NIC would put on a wire.
start_capture() {
  segmentation 1 off
  segmentation 2 off
  ip netns exec "$XSRC_HOSTS_PREFIX-br" tcpdump -i br0 -B "${2:-16384}" -U -n -w "$1" udp port 4791 2>"$1.log" &
  capture=$!
  for _ in $(seq 100); do grep -q "listening on" "$1.log" 2>/dev/null && return 0; sleep 0.1; done
  bad "tcpdump did not start: $(cat "$1.log")"
}

# tcpdump may lag behind on a loaded machine, and what it has not read when
# interrupted is lost: wait until the file stops growing.
stop_capture() {
  local size=-1 now
  for _ in $(seq 50); do
    sleep 0.5
    now=$(stat -c %s "$1")
    [ "$now" = "$size" ] && break
    size=$now
  done
  kill -INT "$capture"; wait "$capture" 2>/dev/null; capture=
  grep -E "captured|dropped" "$1.log"
  segmentation 1 on
  segmentation 2 on
}

check_capture() {
  local result decoded malformed
  result=$(/usr/bin/python3 "$checker" "$1") || bad "ICRC: $result"
  echo "icrc_check: $result"
  packets=${result%% *}
  decoded=$(tshark -r "$1" -Y infiniband 2>/dev/null | wc -l)
  # A payload that happens to look like RPC-over-RDMA makes tshark's
  # heuristic dissector of it (not InfiniBand's) fail: judge the InfiniBand
  # layer alone.
  malformed=$(tshark --disable-protocol rpcordma -r "$1" \
    -Y '_ws.malformed || _ws.expert.severity >= error' 2>/dev/null | wc -l)
  echo "tshark: $decoded of $packets packets decoded as InfiniBand, $malformed malformed"
  [ "$decoded" -eq "$packets" ] || bad "tshark decoded $decoded of $packets packets as InfiniBand"
  [ "$malformed" -eq 0 ] || bad "tshark: $malformed malformed packets"
}

finish() {
  trap - EXIT
  cleanup
  ! ip netns list | grep -q "^$XSRC_HOSTS_PREFIX-" || bad "a namespace is left"
  [ ! -e "/run/$XSRC_HOSTS_PREFIX" ] || bad "/run/$XSRC_HOSTS_PREFIX is left"
  [ $fail -eq 0 ] && echo "$1: all checks passed"
  exit $fail
}
