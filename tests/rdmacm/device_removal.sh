#!/bin/bash
# A device that goes away tells its rdma_cm ids: on a host of its own
# (tests/hosts/hosts.sh), an rping server listens on xsrc0; `xsrc down`
# removes the device, and the server must report RDMA_CM_EVENT_DEVICE_REMOVAL
# ("cma detected device removal") and exit at once instead of waiting forever.
set -u
hosts=$(dirname "$0")/../hosts/hosts.sh
. "$(dirname "$0")/listener.sh"
export XSRC_HOSTS_PREFIX=xsrcdr
trap '"$hosts" down >/dev/null 2>&1' EXIT
"$hosts" up 2 >/dev/null || { echo "cannot bring the hosts up"; exit 1; }
out=$(mktemp)
before=$(cm_listeners "$hosts" run 1 "$XSRC")
"$hosts" run 1 timeout 20 "$XSRC" run -- rping -s -a 10.77.0.1 -p 18999 -v >"$out" 2>&1 &
server=$!
await_listener "$before" "$hosts" run 1 "$XSRC" || { echo "the rping server did not listen within 10 s"; exit 1; }
"$hosts" run 1 "$XSRC" down >/dev/null
start=$(date +%s)
wait $server
elapsed=$(( $(date +%s) - start ))
cat "$out"
[ $elapsed -lt 5 ] || { echo "the server took ${elapsed}s to notice"; exit 1; }
grep -q "cma detected device removal" "$out" || { echo "no DEVICE_REMOVAL event"; exit 1; }
rm -f "$out"
