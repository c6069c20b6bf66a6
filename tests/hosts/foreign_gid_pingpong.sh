#!/bin/bash
# Two hosts of the harness (hosts.sh), each with its own xsrc0. A client on
# host 2 told the server's QPN at host 1's GID must not reach its own QP with
# that number (both hosts number their QPs alike): with no wire engine yet nothing carries
# it, so ibv_rc_pingpong's client fails with "transport retry counter
# exceeded" instead of a false success. Over the IPv4-mapped (-g 1) and the
# IPv6 (-g 2) GID. Afterwards no namespace, daemon or holder is left.
#   foreign_gid_pingpong.sh PORT
set -u
port=$1
hosts=$(dirname "$0")/hosts.sh
export XSRC_HOSTS_PREFIX=xsrcfg
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
  timeout 30 "$hosts" run 1 ibv_rc_pingpong -d xsrc0 -g "$gid" -p "$port" >"$dir/server" 2>&1 &
  server=$!
  for _ in $(seq 50); do
    "$hosts" run 1 ss -ltn 2>/dev/null | grep -q ":$port " && break
    sleep 0.1
  done
  timeout 30 "$hosts" run 2 ibv_rc_pingpong -d xsrc0 -g "$gid" -p "$port" 10.77.0.1 >"$dir/client" 2>&1
  rc=$?
  kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; server=
  # Both hosts number QPs alike: the QPN the client names is also its own.
  local_qpn=$(sed -n 's/.*local address: .*QPN \(0x[0-9a-f]*\).*/\1/p' "$dir/client")
  remote_qpn=$(sed -n 's/.*remote address: .*QPN \(0x[0-9a-f]*\).*/\1/p' "$dir/client")
  [ -n "$local_qpn" ] && [ "$local_qpn" = "$remote_qpn" ] ||
    bad "-g $gid: the client's QPN ($local_qpn) is not the server's ($remote_qpn)"
  [ "$rc" -ne 0 ] || bad "-g $gid: the client succeeded (reached its own QP?)"
  [ "$rc" -ne 124 ] || bad "-g $gid: the client hung"
  grep -q "transport retry counter exceeded (12)" "$dir/client" || bad "-g $gid: no IBV_WC_RETRY_EXC_ERR"
  grep -q "bytes in" "$dir/client" && bad "-g $gid: the client reported a transfer"
  if [ $fail -ne 0 ]; then
    echo "== client"; cat "$dir/client"; echo "== server"; cat "$dir/server"
    exit 1
  fi
  echo "ok: -g $gid: $(grep -m1 'Failed status' "$dir/client")"
done

trap - EXIT
cleanup
ip netns list | grep -q "^$XSRC_HOSTS_PREFIX-" && bad "a namespace is left"
[ ! -e "/run/$XSRC_HOSTS_PREFIX" ] || bad "/run/$XSRC_HOSTS_PREFIX is left"
exit $fail
