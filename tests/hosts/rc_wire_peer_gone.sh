#!/bin/bash
# An RC peer on another host that goes away: its QPs must not succeed
# silently nor hang. ib_write_bw runs from host 2 to host 1 of the harness
# (hosts.sh); mid-run host 1's link is cut, or its xsrcd is killed: the
# client's QP retries (perftest's retry_cnt 7, timeout 14 = 67 ms a try) and
# completes with IBV_WC_RETRY_EXC_ERR (status 12). Then a client told the server's QPN at host 1's GID while no
# xsrcd runs there at all: both hosts number QPs alike, yet it must not
# reach its own QP with that number. Over the IPv4-mapped (-g 1) and the
# IPv6 (-g 2) GID. Afterwards no namespace, daemon or holder is left.
#   rc_wire_peer_gone.sh PORT
set -u
port=$1
export XSRC_HOSTS_PREFIX=xsrcfg
. "$(dirname "$0")/lib.sh"

# expect_retry_exceeded WHAT: the client's result in $dir/client, exit $rc.
expect_retry_exceeded() {
  [ "$rc" -ne 0 ] || bad "$1: the client succeeded"
  [ "$rc" -ne 124 ] || bad "$1: the client hung"
  grep -q "transport retry counter exceeded (12)" "$dir/client" || bad "$1: no IBV_WC_RETRY_EXC_ERR"
  if [ $fail -ne 0 ]; then
    echo "== client"; cat "$dir/client"; echo "== server"; cat "$dir/server"
    exit 1
  fi
  echo "ok: $1: $(grep -m1 'Failed status' "$dir/client")"
}
# gone_mid_run GID HOW: ib_write_bw from host 2 to host 1, which goes away
# after a second. The client always has writes in flight, so it is the
# one that must notice (a side that only waits to receive has no timer).
gone_mid_run() {
  local gid=$1 how=$2
  timeout 60 "$hosts" run 1 ib_write_bw -d xsrc0 -x "$gid" -p "$port" -s 4096 -D 30 >"$dir/server" 2>&1 &
  server=$!
  wait_listen
  timeout 60 "$hosts" run 2 ib_write_bw -d xsrc0 -x "$gid" -p "$port" -s 4096 -D 30 10.77.0.1 \
    >"$dir/client" 2>&1 &
  local client=$!
  sleep 2
  case $how in
  link) ip -n "$XSRC_HOSTS_PREFIX-1" link set "$(host_if 1)" down ;;
  daemon) kill -9 "$("$hosts" daemon 1)" ;;
  esac
  local start=$SECONDS
  wait "$client"; rc=$?
  kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; server=
  [ "$rc" -ne 0 ] || bad "-g $gid, $how gone: the client succeeded"
  [ "$rc" -ne 124 ] || bad "-g $gid, $how gone: the client hung"
  grep -q "Failed status 12" "$dir/client" || bad "-g $gid, $how gone: no IBV_WC_RETRY_EXC_ERR"
  if [ $fail -ne 0 ]; then
    echo "== client"; cat "$dir/client"; echo "== server"; cat "$dir/server"
    exit 1
  fi
  echo "ok: -g $gid, $how gone mid-run: $(grep -m1 'Failed status' "$dir/client") after $((SECONDS - start)) s"
}

# Each on fresh hosts: a link that was down has lost its IPv6 address.
for run in 1:link 2:daemon 2:link 1:daemon; do
  hosts_up
  gone_mid_run "${run%:*}" "${run#*:}"
  "$hosts" down
done
hosts_up

# No xsrcd on host 1 at all: a stand-in answers ibv_rc_pingpong's address
# exchange with the client's own QPN at host 1's GID.
"$hosts" run 1 "$XSRC" down >/dev/null 2>&1
for gid in 1 2; do
  case $gid in
  1) wire_gid=00000000000000000000ffff0a4d0001 ;;
  2) wire_gid=fd770000000000000000000000000001 ;;
  esac
  "$hosts" run 1 python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1)
c, _ = s.accept(); theirs = c.recv(64).decode("ascii", "replace")
c.sendall(("0000:" + theirs[5:11] + ":000000:" + sys.argv[2]).encode().ljust(52, b"\0"))
c.recv(64)' "$port" "$wire_gid" >"$dir/server" 2>&1 &
  server=$!
  wait_listen
  timeout 30 "$hosts" run 2 ibv_rc_pingpong -d xsrc0 -g "$gid" -p "$port" 10.77.0.1 >"$dir/client" 2>&1
  rc=$?
  kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; server=
  local_qpn=$(sed -n 's/.*local address: .*QPN \(0x[0-9a-f]*\).*/\1/p' "$dir/client")
  remote_qpn=$(sed -n 's/.*remote address: .*QPN \(0x[0-9a-f]*\).*/\1/p' "$dir/client")
  [ -n "$local_qpn" ] && [ "$local_qpn" = "$remote_qpn" ] ||
    bad "-g $gid: the client's QPN ($local_qpn) is not the one it was told ($remote_qpn)"
  grep -q "bytes in" "$dir/client" && bad "-g $gid: the client reported a transfer"
  expect_retry_exceeded "-g $gid, no xsrcd on the peer's host"
done

finish rc_wire_peer_gone
