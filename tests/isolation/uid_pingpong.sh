#!/bin/bash
# rdma-core's pingpongs between root and uid 65534, each as the server once:
#   uid_pingpong.sh PORT
set -u
port=$1
nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
rc=0
as() { local who=$1; shift; if [ "$who" = nobody ]; then "${nobody[@]}" "$@"; else "$@"; fi; }
pair() {  # SERVER_AS CLIENT_AS PORT PROGRAM ARGS...
  local s=$1 c=$2 p=$3 prog=$4; shift 4
  as "$s" timeout 60 "$prog" -d xsrc0 -g 1 -p "$p" "$@" >"$dir/server" 2>&1 &
  local sp=$!
  for _ in $(seq 50); do ss -ltn 2>/dev/null | grep -q ":$p " && break; sleep 0.1; done
  as "$c" timeout 60 "$prog" -d xsrc0 -g 1 -p "$p" "$@" 127.0.0.1 >"$dir/client" 2>&1
  local crc=$?
  wait $sp; local src=$?
  echo "== $prog $* : server as $s (exit $src), client as $c (exit $crc)"
  if [ $src -ne 0 ] || [ $crc -ne 0 ]; then
    cat "$dir/server" "$dir/client"; rc=1
  else
    tail -n 1 "$dir/client"
  fi
}
pair root nobody $port ibv_rc_pingpong -s 65536 -n 200
pair nobody root $((port + 1)) ibv_rc_pingpong -s 65536 -n 200
pair root nobody $((port + 2)) ibv_rc_pingpong -s 64 -n 500
pair nobody root $((port + 3)) ibv_ud_pingpong -s 1024 -n 200
pair root nobody $((port + 4)) ibv_ud_pingpong -s 1024 -n 200
pair nobody root $((port + 5)) ibv_srq_pingpong -s 4096 -n 100
# 64 KiB into SRQ receives: device copies checked against the SRQ's record of its receives.
pair root nobody $((port + 6)) ibv_srq_pingpong -s 65536 -n 50
exit $rc
