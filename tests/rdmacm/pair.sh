#!/bin/bash
# Runs an unmodified librdmacm program as two processes on xsrc0, through
# `xsrc run` (the way a user reaches rdma_cm): a server, then a client.
#   pair.sh [--serves-forever] ADDR TIMEOUT SERVER [ARGS...] -- CLIENT [ARGS...]
# ADDR picks the address both use: ipv4 / ipv6 (the first global address of
# xsrc0's netdev, else its link-local one), loopback (127.0.0.1) or
# loopback6 (::1). In the arguments @ADDR@ becomes that address. Both must
# exit 0 within TIMEOUT seconds; on failure both outputs are shown. The
# client's output is printed on success (the benchmark figures). A server
# that --serves-forever (cmtime's) must still be serving when the client is
# done, and is then stopped.
set -u
. "$(dirname "$0")/rping_race.sh"
. "$(dirname "$0")/listener.sh"
forever=0
if [ "$1" = --serves-forever ]; then forever=1; shift; fi
kind=$1; limit=$2; shift 2
server=(); while [ $# -gt 0 ] && [ "$1" != -- ]; do server+=("$1"); shift; done
shift
client=("$@")

netdev=$(cat "$SYSFS_PATH/class/infiniband/xsrc0/ports/1/gid_attrs/ndevs/1" 2>/dev/null ||
         cat "$SYSFS_PATH/class/infiniband/xsrc0/ports/1/gid_attrs/ndevs/0")
case $kind in
  ipv4) addr=$(ip -o -4 addr show dev "$netdev" | awk '{print $4; exit}' | cut -d/ -f1) ;;
  ipv6) addr=$(ip -o -6 addr show dev "$netdev" scope global | awk '{print $4; exit}' | cut -d/ -f1)
        [ -n "$addr" ] || addr=$(ip -o -6 addr show dev "$netdev" | awk '{print $4; exit}' | cut -d/ -f1)%$netdev ;;
  loopback) addr=127.0.0.1 ;;
  loopback6) addr=::1 ;;
  *) echo "pair.sh: unknown address kind $kind"; exit 2 ;;
esac
if [ -z "$addr" ] || [ "$addr" = "%$netdev" ]; then
  echo "pair.sh: $netdev has no $kind address"; exit 1
fi
server=("${server[@]//@ADDR@/$addr}")
client=("${client[@]//@ADDR@/$addr}")

dir=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$dir"' EXIT
# The server listens before the client connects (listener.sh); every
# server here listens, so one that does not fails the test.
before=$(cm_listeners "$XSRC")
timeout "$limit" "$XSRC" run -- "${server[@]}" >"$dir/server" 2>&1 &
pid=$!
listening=0
await_listener "$before" "$XSRC" && listening=1
timeout "$limit" "$XSRC" run -- "${client[@]}" >"$dir/client" 2>&1
client_rc=$?
if [ "$(basename "${client[0]}")" = rping ]; then
  client_rc=$(rping_client_rc $client_rc "$dir/client")
fi
if [ $forever -eq 1 ]; then
  if kill -0 $pid 2>/dev/null; then server_rc=0; kill $pid; else server_rc=dead; fi
  wait $pid 2>/dev/null
else
  wait $pid
  server_rc=$?
fi
pid=
if [ $listening -eq 0 ]; then
  echo "pair.sh: xsrc status counted no new listener (cm_listeners ${before:-none} -> ${listeners_now:-none}) within 10 s"
fi
if [ $client_rc -ne 0 ] || [ "$server_rc" != 0 ] || [ $listening -eq 0 ]; then
  echo "exit status: server $server_rc, client $client_rc (address $addr)"
  echo "== server: ${server[*]}"; cat "$dir/server"
  echo "== client: ${client[*]}"; cat "$dir/client"
  exit 1
fi
echo "address $addr: ${client[*]}"
tail -20 "$dir/client"
