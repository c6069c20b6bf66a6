#!/bin/bash
# private_host.sh CMD...: CMD on a host of its own: new mount, network and PID
# namespaces with their own /run, /dev/shm and /dev/infiniband, its own xsrcd
# and xsrc0 (on lo), with the device environment of `xsrc env` (rdma_cm
# needs its interposer). A fault test may kill that daemon without disturbing
# the rest of the suite, which shares one device. Afterwards the device is
# taken down and nothing may be left: no arena, node or FUSE mount.
# Needs root, util-linux (unshare) and iproute2; $XSRC names the xsrc tool.
set -u
: "${XSRC:?XSRC must name the xsrc tool}"
exec unshare --mount --propagation private --net --pid --fork --mount-proc bash -c '
set -u
mount -t tmpfs -o mode=0755 fault-run /run
mkdir -p /dev/infiniband
mount -t tmpfs -o mode=0755 fault-dev /dev/infiniband
mount -t tmpfs -o mode=1777 fault-shm /dev/shm
ip link set lo up
export XSRC_RUNDIR=/run/xsrc SYSFS_PATH=/run/xsrc/sysfs
"$XSRC" up --name xsrc0 --netdev lo >/dev/null || exit 1
eval "$("$XSRC" env)"  # librdmacm finds the device through the preloaded interposer
"$@"
rc=$?
"$XSRC" down >/dev/null || rc=1
left=$(find /dev/shm /dev/infiniband -mindepth 1; grep " - fuse.xsrc " /proc/self/mountinfo)
if [ -n "$left" ]; then
  echo "private_host.sh: left behind after xsrc down:"; echo "$left"; rc=1
fi
exit $rc' private_host "$@"
