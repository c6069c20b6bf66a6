#!/bin/bash
# rdma-core's pingpongs between root and uid 65534, each as the server once,
# over the IPv4-mapped GID and the IPv6 one: every pair between the two users
# must go through the device's loopback path (RoCE v2 to this host's own
# address, delivered by xsrcd: `wire_lo_delivered` in `xsrc status` grows),
# never through the other user's rings; pairs of one user must not (the
# counter stays put).
#   uid_pingpong.sh PORT
set -u
port=$1
nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
rc=0
as() { local who=$1; shift; if [ "$who" = nobody ]; then "${nobody[@]}" "$@"; else "$@"; fi; }
lo_delivered() { "$XSRC" status | sed -n 's/.*wire_lo_delivered=\([0-9]*\).*/\1/p' | head -n 1; }
gid=(-g 1)
pair() {  # SERVER_AS CLIENT_AS PORT PROGRAM ARGS...
  local s=$1 c=$2 p=$3 prog=$4; shift 4
  local before after
  before=$(lo_delivered)
  as "$s" timeout 60 "$prog" -d xsrc0 "${gid[@]}" -p "$p" "$@" >"$dir/server" 2>&1 &
  local sp=$!
  for _ in $(seq 50); do ss -ltn 2>/dev/null | grep -q ":$p " && break; sleep 0.1; done
  as "$c" timeout 60 "$prog" -d xsrc0 "${gid[@]}" -p "$p" "$@" 127.0.0.1 >"$dir/client" 2>&1
  local crc=$?
  wait $sp; local src=$?
  after=$(lo_delivered)
  echo "== $prog ${gid[*]} $* : server as $s (exit $src), client as $c (exit $crc), loopback packets $before -> $after"
  if [ $src -ne 0 ] || [ $crc -ne 0 ]; then
    cat "$dir/server" "$dir/client"; rc=1
  else
    tail -n 1 "$dir/client"
  fi
  if [ -z "$before" ] || [ -z "$after" ]; then
    echo "FAIL: xsrc status shows no wire_lo_delivered"; rc=1
  elif [ "$s" != "$c" ] && [ "$after" -le "$before" ]; then
    echo "FAIL: traffic between two users did not take the device's loopback path"; rc=1
  elif [ "$s" = "$c" ] && [ "$after" -ne "$before" ]; then
    echo "FAIL: traffic of one user took the device's loopback path"; rc=1
  fi
}
pair root nobody $port ibv_rc_pingpong -s 65536 -n 200
pair nobody root $((port + 1)) ibv_rc_pingpong -s 65536 -n 200
pair root nobody $((port + 2)) ibv_rc_pingpong -s 64 -n 500
pair nobody root $((port + 3)) ibv_ud_pingpong -s 1024 -n 200
pair root nobody $((port + 4)) ibv_ud_pingpong -s 1024 -n 200
pair nobody root $((port + 5)) ibv_srq_pingpong -s 4096 -n 100
# 64 KiB into SRQ receives: the device takes the SRQ's receives as its
# owner's record of them says.
pair root nobody $((port + 6)) ibv_srq_pingpong -s 65536 -n 50
pair root root $((port + 7)) ibv_rc_pingpong -s 4096 -n 200
pair nobody nobody $((port + 8)) ibv_ud_pingpong -s 1024 -n 200
pair nobody root $((port + 9)) ibv_rc_pingpong -s 4096 -n 200 --chk
pair root nobody $((port + 10)) ibv_ud_pingpong -s 1024 -n 200 --chk
pair root nobody $((port + 11)) ibv_uc_pingpong -s 4096 -n 200 --chk
# Over the IPv6 GID (index 2) too.
gid=(-g 2)
pair nobody root $((port + 12)) ibv_rc_pingpong -s 4096 -n 200 --chk
exit $rc
