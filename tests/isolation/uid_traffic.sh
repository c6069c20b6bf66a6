#!/bin/bash
# Traffic between root and uid 65534, with each as the listening side once:
#   uid_traffic.sh UID_TEST PORT
# Both ends must exit 0; their output is shown either way.
set -u
bin=$1; port=$2
nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
rc=0
run_pair() {  # SERVER_AS CLIENT_AS PORT
  local s=$1 c=$2 p=$3
  if [ "$s" = nobody ]; then timeout 60 "${nobody[@]}" "$bin" server "$p" >"$dir/server" 2>&1 &
  else timeout 60 "$bin" server "$p" >"$dir/server" 2>&1 & fi
  local sp=$!
  if [ "$c" = nobody ]; then timeout 60 "${nobody[@]}" "$bin" client 127.0.0.1 "$p" >"$dir/client" 2>&1
  else timeout 60 "$bin" client 127.0.0.1 "$p" >"$dir/client" 2>&1; fi
  local crc=$?
  wait $sp; local src=$?
  echo "== server as $s (exit $src)"; cat "$dir/server"
  echo "== client as $c (exit $crc)"; cat "$dir/client"
  [ $src -eq 0 ] && [ $crc -eq 0 ] || rc=1
}
run_pair root nobody "$port"
run_pair nobody root $((port + 1))
exit $rc
