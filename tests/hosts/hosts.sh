#!/bin/bash
# A harness of hosts on one machine: each host is a network namespace with
# its own mount namespace (its own /run, /dev/shm, /dev/infiniband and /sys),
# its own xsrcd and xsrc0 bound to its veth; the hosts share one link
# (10.77.0.0/24, fd77::/64). Traffic stays on that link, inside namespaces
# this script made, and everything is removed by `down`.
#
#   hosts.sh up N        N hosts (2 or more) joined by a bridge
#   hosts.sh run I CMD.. CMD on host I (1-based), with the device's environment
#   hosts.sh daemon I    the pid of host I's xsrcd
#   hosts.sh down        stop every host's daemon, remove namespaces and links
#
# Needs root, iproute2, util-linux (unshare, nsenter); $XSRC names the xsrc
# tool and $RDMAV_DRIVERS the provider (as the CTest environment sets them).
# Host I's interface is $XSRC_HOSTS_PREFIX-I, or $XSRC_HOSTS_IFNAME on every
# host when that is set (programs that want one device name on both ends,
# such as ucx_perftest, whose server takes the client's parameters).
# $XSRC_HOSTS_MTU sets the link's MTU (default: the kernel's, 1500); xsrc0's
# active MTU follows it (9000: 4096). $XSRC_HOSTS_ABI makes every host's
# xsrcd serve that driver ABI revision (`xsrc up --abi`).
set -euo pipefail

prefix=${XSRC_HOSTS_PREFIX:-xsrch}
state=/run/$prefix  # host i's holder pid in $state/i.pid (host side)
ifname() { echo "${XSRC_HOSTS_IFNAME:-$prefix-$1}"; }
xsrc=${XSRC:?XSRC must name the xsrc tool}

holder() { cat "$state/$1.pid"; }
# in_host I CMD...: CMD in host I's network and mount namespaces.
in_host() {
  local i=$1; shift
  nsenter -t "$(holder "$i")" -n -m -- "$@"
}

up() {
  local n=$1 i
  [ "$n" -ge 2 ] || { echo "hosts.sh: need 2 or more hosts" >&2; exit 2; }
  mkdir -p "$state"
  ip netns add "$prefix-br"
  ip -n "$prefix-br" link add br0 type bridge
  ip -n "$prefix-br" link set br0 up
  for i in $(seq "$n"); do
    ip netns add "$prefix-$i"
    ip link add "$(ifname "$i")" netns "$prefix-$i" type veth peer name "port$i" netns "$prefix-br"
    if [ -n "${XSRC_HOSTS_MTU:-}" ]; then
      ip -n "$prefix-br" link set "port$i" mtu "$XSRC_HOSTS_MTU"
      ip -n "$prefix-$i" link set "$(ifname "$i")" mtu "$XSRC_HOSTS_MTU"
    fi
    ip -n "$prefix-br" link set "port$i" master br0 up
    ip -n "$prefix-$i" link set lo up
    ip -n "$prefix-$i" addr add "10.77.0.$i/24" dev "$(ifname "$i")"
    ip -n "$prefix-$i" -6 addr add "fd77::$i/64" dev "$(ifname "$i")" nodad
    # No duplicate address detection for the link-local address either: while
    # it is tentative (a second or two after the link comes up) the kernel
    # sends no neighbour solicitation, so a host's first rdma_resolve_addr
    # over IPv6 timed out (ADDR_ERROR -110) in rping's 2 s.
    ip netns exec "$prefix-$i" sysctl -qw "net/ipv6/conf/$(ifname "$i")/accept_dad=0"
    ip -n "$prefix-$i" link set "$(ifname "$i")" up
    # The holder keeps the host's mount namespace (private /run, /dev/shm,
    # /dev/infiniband and a /sys of its network namespace) alive.
    ip netns exec "$prefix-$i" unshare --mount --propagation private sh -c '
      mount -t tmpfs -o mode=0755 xsrc-host-run /run
      mkdir -p /dev/infiniband
      mount -t tmpfs -o mode=0755 xsrc-host-dev /dev/infiniband
      mount -t tmpfs -o mode=1777 xsrc-host-shm /dev/shm
      exec sleep infinity' </dev/null >/dev/null 2>&1 &
    echo $! >"$state/$i.pid"
  done
  for i in $(seq "$n"); do
    for _ in $(seq 50); do  # until the holder has mounted its /run
      in_host "$i" sh -c 'mountpoint -q /run && [ ! -e /run/'"$prefix"' ]' 2>/dev/null && break
      sleep 0.1
    done
    in_host "$i" "$xsrc" up --name xsrc0 --netdev "$(ifname "$i")" ${XSRC_HOSTS_ABI:+--abi "$XSRC_HOSTS_ABI"} >/dev/null
  done
}

down() {
  local f i
  for f in "$state"/*.pid; do
    [ -e "$f" ] || continue
    i=$(basename "$f" .pid)
    in_host "$i" "$xsrc" down >/dev/null 2>&1 || true
    kill "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$prefix-" || true); do
    ip netns del "$ns"
  done
  rmdir "$state" 2>/dev/null || true
}

case ${1:-} in
up) up "${2:-2}" ;;
run)
  i=$2; shift 2
  in_host "$i" env SYSFS_PATH=/run/xsrc/sysfs XSRC_RUNDIR=/run/xsrc "$@"
  ;;
daemon) in_host "$2" cat /run/xsrc/xsrcd.pid ;;
down) down ;;
*) echo "usage: hosts.sh up N | run I CMD... | daemon I | down" >&2; exit 2 ;;
esac
