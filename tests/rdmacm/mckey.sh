#!/bin/bash
# UD multicast through rdma_cm: RECEIVERS mckey processes join GROUP on
# xsrc0 (each with two joins, -c 2), then a sender (-s) sends COUNT
# datagrams to the group; every receiver must get all of them and exit 0.
#   mckey.sh GROUP RECEIVERS COUNT
set -u
group=$1; receivers=$2; count=$3
netdev=$(cat "$SYSFS_PATH/class/infiniband/xsrc0/ports/1/gid_attrs/ndevs/1")
case $group in
  *:*) bind=$(ip -o -6 addr show dev "$netdev" scope global | awk '{print $4; exit}' | cut -d/ -f1) ;;
  *) bind=$(ip -o -4 addr show dev "$netdev" | awk '{print $4; exit}' | cut -d/ -f1) ;;
esac
dir=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$dir"' EXIT
for i in $(seq "$receivers"); do
  timeout 30 "$XSRC" run -- mckey -m "$group" -b "$bind" -c 2 -C "$count" >"$dir/recv$i" 2>&1 &
  pids+=($!)
done
sleep 1  # the receivers join before anything is sent
timeout 30 "$XSRC" run -- mckey -m "$group" -b "$bind" -c 2 -s -C "$count" >"$dir/send" 2>&1
send_rc=$?
fail=0
for i in $(seq "$receivers"); do
  wait "${pids[$((i - 1))]}"; rc=$?
  if [ $rc -ne 0 ]; then echo "receiver $i: exit $rc"; cat "$dir/recv$i"; fail=1; fi
done
pids=()
if [ $send_rc -ne 0 ]; then echo "sender: exit $send_rc"; cat "$dir/send"; fail=1; fi
[ $fail -eq 0 ] || exit 1
echo "$receivers receivers of $group (bound to $bind) got $count datagrams each"
tail -3 "$dir/recv1"
