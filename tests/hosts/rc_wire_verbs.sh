#!/bin/bash
# RC across hosts on the wire, beyond the pingpongs (rc_wire_verbs.cpp):
# RDMA WRITE, WRITE with immediate and SEND with immediate from 1 byte to
# 1 MiB with the data checked at the responder; an unknown rkey and a write
# past the MR (IBV_WC_REM_ACCESS_ERR, the next request flushed, both QPs in
# ERR); RNR NAKs that exhaust rnr_retry and RNR NAKs that a late receive
# ends. Over the IPv4-mapped (-g 1) and the IPv6 (-g 2) GID.
#   rc_wire_verbs.sh PORT PROGRAM
set -u
port=$1
prog=$2
hosts=$(cd "$(dirname "$0")" && pwd)/hosts.sh
export XSRC_HOSTS_PREFIX=xsrcrv
dir=$(mktemp -d)
server=
cleanup() {
  [ -z "$server" ] || kill "$server" 2>/dev/null
  "$hosts" down
  rm -rf "$dir"
}
trap cleanup EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

"$hosts" up 2 || { echo "FAIL: hosts.sh up"; exit 1; }
for gid in 1 2; do
  timeout 200 "$hosts" run 1 "$prog" server "$port" "$gid" >"$dir/server" 2>&1 &
  server=$!
  timeout 200 "$hosts" run 2 "$prog" client 10.77.0.1 "$port" "$gid" >"$dir/client" 2>&1
  rc=$?
  wait "$server"; src=$?; server=
  echo "== -g $gid client"; cat "$dir/client"
  echo "== -g $gid server"; cat "$dir/server"
  [ $rc -eq 0 ] || bad "-g $gid: client exit $rc"
  [ $src -eq 0 ] || bad "-g $gid: server exit $src"
done
"$hosts" run 1 "$XSRC" status
trap - EXIT
cleanup
ip netns list | grep -q "^$XSRC_HOSTS_PREFIX-" && bad "a namespace is left"
[ $fail -eq 0 ] && echo "rc_wire_verbs: all checks passed"
exit $fail
