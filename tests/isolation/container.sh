#!/bin/bash
# Containers: a program in mount and PID namespaces of its own whose file
# system shows only the bind-mounted device files (as `docker run` with the
# flags in README.md would give it) opens xsrc0 and passes the pingpongs,
# against a peer on the host and against a peer in another such container.
#   container.sh PORT
# Needs root (unshare), SYSFS_PATH pointing at the device's sysfs view, xsrc0 up.
set -u
port=$1
dev=xsrc0
view=${SYSFS_PATH:?}
cmd_dir=$(cat "$view/class/infiniband/$dev/xsrc_cmd_dir")
arena=$(cat "$view/class/infiniband/$dev/xsrc_shm_path")
uverbs=$(grep -lx "$dev" "$view"/class/infiniband_verbs/uverbs*/ibdev | head -n 1 | xargs dirname | xargs basename)
node=/dev/infiniband/$uverbs
for f in "$cmd_dir" "$arena" "$node"; do
  [ -e "$f" ] || { echo "FAIL: $f missing"; exit 1; }
done
echo "device files: view=$view cmd_dir=$cmd_dir arena=$arena node=$node"

# The container's setup, run as its pid 1 in the new namespaces: stage the
# device files, hide /run, /dev/shm, /dev/infiniband and /sys/class behind
# empty tmpfs mounts, bind exactly the device files back, check that nothing
# else shows, then exec the program. No SYSFS_PATH: the view is at /sys/class.
container_setup='
set -eu
stage=$(mktemp -d)
mount -t tmpfs tmpfs "$stage"
mkdir "$stage/view" "$stage/cmd"; touch "$stage/arena" "$stage/node"
mount --bind "$VIEW/class" "$stage/view"
mount --bind "$CMD_DIR" "$stage/cmd"
mount --bind "$ARENA" "$stage/arena"
mount --bind "$NODE" "$stage/node"
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=755 tmpfs /dev/infiniband
mount -t tmpfs -o mode=755 tmpfs /sys/class
for c in infiniband infiniband_verbs; do
  mkdir "/sys/class/$c"; mount --bind "$stage/view/$c" "/sys/class/$c"
done
mkdir -p "$CMD_DIR"; mount --bind "$stage/cmd" "$CMD_DIR"
touch "$ARENA"; mount --bind "$stage/arena" "$ARENA"
touch "$NODE"; mount --bind "$stage/node" "$NODE"
umount -l "$stage"; rmdir "$stage"
# What the container sees: only the device files.
[ "$(ls /dev/shm)" = "$(basename "$ARENA")" ] || { echo "FAIL: /dev/shm shows $(ls /dev/shm)"; exit 1; }
[ "$(ls /dev/infiniband)" = "$(basename "$NODE")" ] || { echo "FAIL: /dev/infiniband shows $(ls /dev/infiniband)"; exit 1; }
[ "$(ls /sys/class | tr "\n" " ")" = "infiniband infiniband_verbs " ] || { echo "FAIL: /sys/class shows $(ls /sys/class)"; exit 1; }
# (mount(8) keeps its own notes in /run/mount.)
[ "$(find /run -mindepth 1 -not -path "/run/mount*" -not -path "$CMD_DIR/*" | sort | tr "\n" " ")" = "$(dirname "$(dirname "$CMD_DIR")") $(dirname "$CMD_DIR") $CMD_DIR " ] || { echo "FAIL: /run shows $(find /run -maxdepth 3)"; exit 1; }
[ "$$" = 1 ] || { echo "FAIL: not pid 1 of a new PID namespace"; exit 1; }
unset SYSFS_PATH
exec "$@"
'
in_container() {
  VIEW=$view CMD_DIR=$cmd_dir ARENA=$arena NODE=$node \
    unshare --mount --propagation private --pid --fork --mount-proc \
    bash -c "$container_setup" container "$@"
}

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
rc=0
# pair SERVER_WHERE CLIENT_WHERE PORT PROGRAM ARGS... (WHERE: host | container)
pair() {
  local s=$1 c=$2 p=$3 prog=$4; shift 4
  if [ "$s" = container ]; then in_container timeout 60 "$prog" -d $dev -g 1 -p "$p" "$@" >"$dir/server" 2>&1 &
  else timeout 60 "$prog" -d $dev -g 1 -p "$p" "$@" >"$dir/server" 2>&1 & fi
  local sp=$!
  for _ in $(seq 50); do ss -ltn 2>/dev/null | grep -q ":$p " && break; sleep 0.1; done
  if [ "$c" = container ]; then in_container timeout 60 "$prog" -d $dev -g 1 -p "$p" "$@" 127.0.0.1 >"$dir/client" 2>&1
  else timeout 60 "$prog" -d $dev -g 1 -p "$p" "$@" 127.0.0.1 >"$dir/client" 2>&1; fi
  local crc=$?
  wait $sp; local src=$?
  echo "== $prog $* : server in $s (exit $src), client in $c (exit $crc)"
  if [ $src -ne 0 ] || [ $crc -ne 0 ]; then
    echo "-- server"; cat "$dir/server"; echo "-- client"; cat "$dir/client"; rc=1
  else
    tail -n 1 "$dir/client"
  fi
}
pair host container $port ibv_rc_pingpong -s 65536 -n 200
pair container host $((port + 1)) ibv_rc_pingpong -s 64 -n 500
pair host container $((port + 2)) ibv_ud_pingpong -s 1024 -n 200
pair container host $((port + 3)) ibv_srq_pingpong -s 4096 -n 100
pair container container $((port + 4)) ibv_rc_pingpong -s 65536 -n 200
pair container container $((port + 5)) ibv_ud_pingpong -s 1024 -n 200

# XRC: a server on the host, two clients each in a container of its own
# (the domain file, /tmp/xrc_domain, is the one thing they share besides
# the device files).
p=$((port + 6))
timeout 60 ibv_xsrq_pingpong -d $dev -g 1 -p $p -c 2 -n 50 -s 8192 >"$dir/server" 2>&1 &
sp=$!
for _ in $(seq 50); do ss -ltn 2>/dev/null | grep -q ":$p " && break; sleep 0.1; done
in_container timeout 60 ibv_xsrq_pingpong -d $dev -g 1 -p $p -n 50 -s 8192 127.0.0.1 >"$dir/client1" 2>&1 &
c1=$!
in_container timeout 60 ibv_xsrq_pingpong -d $dev -g 1 -p $p -n 50 -s 8192 127.0.0.1 >"$dir/client2" 2>&1
c2rc=$?
wait $c1; c1rc=$?
wait $sp; src=$?
echo "== ibv_xsrq_pingpong -c 2 -s 8192 : server on the host (exit $src), clients in containers (exit $c1rc, $c2rc)"
if [ $src -ne 0 ] || [ $c1rc -ne 0 ] || [ $c2rc -ne 0 ]; then
  for f in server client1 client2; do echo "-- $f"; cat "$dir/$f"; done; rc=1
fi
exit $rc
