#!/bin/bash
# `xsrc run` for a user who is not root (uid 65534): the command sees the
# device under /sys/class next to the real classes, keeps its own uid and no
# capability, and verbs, UCX and rdma_cm programs work; `xsrc up` stays root's.
#   uid_run.sh PORT
set -u
. "$(dirname "$0")/../rdmacm/rping_race.sh"
. "$(dirname "$0")/../rdmacm/listener.sh"
port=$1
nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
rc=0
fail() { echo "FAIL: $*"; rc=1; }
run_as_nobody() { "${nobody[@]}" env -u SYSFS_PATH timeout 60 "$XSRC" run -- "$@"; }

# The view, the ids and the capabilities the command gets.
out=$(run_as_nobody sh -c 'id -u; id -g; grep ^CapEff /proc/self/status; ls /sys/class/infiniband; ls -d /sys/class/net') ||
  fail "xsrc run as uid 65534: $out"
echo "$out"
[ "$(echo "$out" | sed -n 1p)" = 65534 ] || fail "uid is not 65534"
[ "$(echo "$out" | sed -n 2p)" = 65534 ] || fail "gid is not 65534"
echo "$out" | grep -q "^CapEff:[[:space:]]*0\+$" || fail "the command holds capabilities"
echo "$out" | grep -qx xsrc0 || fail "xsrc0 is not under /sys/class/infiniband"
echo "$out" | grep -qx /sys/class/net || fail "the real classes are gone"

# UCX reads /sys/class/infiniband itself (no SYSFS_PATH).
ucx=$(run_as_nobody ucx_info -d 2>&1)
echo "$ucx" | grep -q "Device: xsrc0:1" || { echo "$ucx" | tail -20; fail "ucx_info -d does not list xsrc0:1"; }

# Verbs pingpongs, both sides uid 65534 under xsrc run.
pair() {  # PORT PROGRAM ARGS...
  local p=$1 prog=$2; shift 2
  run_as_nobody "$prog" -d xsrc0 -g 1 -p "$p" "$@" >"$dir/server" 2>&1 &
  local sp=$!
  for _ in $(seq 50); do ss -ltn 2>/dev/null | grep -q ":$p " && break; sleep 0.1; done
  run_as_nobody "$prog" -d xsrc0 -g 1 -p "$p" "$@" 127.0.0.1 >"$dir/client" 2>&1
  local crc=$?
  wait $sp; local src=$?
  echo "== $prog $*: server exit $src, client exit $crc"
  if [ $src -ne 0 ] || [ $crc -ne 0 ]; then cat "$dir/server" "$dir/client"; rc=1; fi
}
pair "$port" ibv_rc_pingpong -s 4096 -n 200
pair $((port + 1)) ibv_ud_pingpong -s 1024 -n 200

# rdma_cm (the interposer xsrc run preloads), both sides uid 65534.
netdev=$(cat "$SYSFS_PATH/class/infiniband/xsrc0/ports/1/gid_attrs/ndevs/1")
addr=$(ip -o -4 addr show dev "$netdev" | awk '{print $4; exit}' | cut -d/ -f1)
before=$(cm_listeners "$XSRC")
run_as_nobody rping -s -a "$addr" -p $((port + 2)) -C 20 -V -S 4096 >"$dir/server" 2>&1 &
sp=$!
await_listener "$before" "$XSRC" || { echo "rping server as uid 65534: no listener within 10 s"; rc=1; }
run_as_nobody rping -c -a "$addr" -p $((port + 2)) -C 20 -V -S 4096 >"$dir/client" 2>&1
crc=$(rping_client_rc $? "$dir/client")
wait $sp; src=$?
echo "== rping -V over $addr: server exit $src, client exit $crc"
if [ $src -ne 0 ] || [ $crc -ne 0 ]; then cat "$dir/server" "$dir/client"; rc=1; fi

# Bringing devices up and down stays root's.
"${nobody[@]}" "$XSRC" up >"$dir/up" 2>&1 && fail "xsrc up succeeded as uid 65534"
grep -q "must be run as root" "$dir/up" || { cat "$dir/up"; fail "xsrc up as uid 65534 did not say why"; }
exit $rc
