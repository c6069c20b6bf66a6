#!/bin/bash
# tests/packaging/run.sh: the packages of issue 7, end to end, as root on
# Debian 12. Run by .ci/run after the test suite; not part of CTest (it
# installs and purges system packages).
#
#  1. builds the .debs (dpkg-buildpackage -b -us -uc) from a copy of the
#     checkout, in a temporary directory; runs lintian (errors fail the test);
#     checks each package's file list
#  2. installs them (apt-get install ./*.deb); checks that nothing was enabled
#     or started; systemd-analyze verify on the unit
#  3. only when no other xsrcd runs on this machine (a development daemon owns
#     /dev/infiniband/uverbs0 and /run/xsrc): `xsrc up` with the installed CLI,
#     ibv_devinfo and a two-process ibv_rc_pingpong with no RDMAV_DRIVERS,
#     `xsrc down`; then the unit's own ExecStart/ExecStartPost/ExecStop lines
#     (systemd need not be PID 1); then `xsrc up` again, left running for the
#     purge to stop. Otherwise it only checks that libibverbs lists the running
#     daemon's devices through the installed provider (ibv_devinfo -l: no
#     context is opened) and says that the device part was skipped; or, with
#     --isolated, runs the device part in a private mount namespace.
#  4. purges the packages and checks that nothing remains: the packages' files,
#     /etc/xsrc, /run/xsrc, mounts, xsrcd processes, device nodes, arenas,
#     systemd state; a development daemon must still be running, untouched
#  5. builds the .rpms (rpmbuild -bb --nodeps) and checks `rpm -qlp`
#
# Usage: tests/packaging/run.sh [--keep] [--isolated]
#   --keep      leave the temporary directory (packages, logs)
#   --isolated  when another xsrcd runs, do the device part all the same, in
#               private mount and pid namespaces with their own /run,
#               /dev/infiniband, /dev/shm and /proc (the other daemon is
#               neither seen nor touched)
# Needs: debhelper lintian rpm fakeroot ibverbs-utils (installed when missing).
set -euo pipefail

SRC=$(cd "$(dirname "$0")/../.." && pwd)
KEEP=0
ISOLATED=0
for arg in "$@"; do
	case $arg in
	--keep) KEEP=1 ;;
	--isolated) ISOLATED=1 ;;
	--inner-device) break ;;
	*) echo "usage: $0 [--keep] [--isolated]" >&2; exit 2 ;;
	esac
done

unset RDMAV_DRIVERS IBV_DRIVERS XSRC_RUNDIR  # the installed defaults only
DEBS=(xsrc-provider xsrcd libibverbs-ext1 libibverbs-ext-dev libxsrc-uct0 libxsrc-uct-dev)
RUNDIR=/run/xsrc
XSRCD=/usr/sbin/xsrcd
XSRC=/usr/bin/xsrc
PORT=18733  # ibv_rc_pingpong's TCP port for the exchange: not the default 18515

T0=$(date +%s)
PHASE_START=$T0
TIMES=()
phase_done() {
	local now
	now=$(date +%s)
	TIMES+=("$1: $((now - PHASE_START)) s")
	PHASE_START=$now
}

say() { printf '== %s\n' "$*"; }
fail() {
	printf 'FAIL: %s\n' "$*" >&2
	exit 1
}
check() {  # check DESCRIPTION COMMAND...
	local what=$1
	shift
	if "$@"; then
		printf '  ok  %s\n' "$what"
	else
		fail "$what"
	fi
}

[ "$(id -u)" -eq 0 ] || fail "must run as root (installs and purges packages)"
if [ ! -f "$SRC/debian/control" ] || [ ! -f "$SRC/redhat/xsrc.spec" ]; then
	fail "no debian/ or redhat/ in $SRC"
fi

SERVICE_PID=
SERVER_PID=
INSTALLED=0

# The pids of running xsrcd processes run from the packaged binary.
packaged_xsrcd_pids() {
	local exe p
	for p in $(pgrep -x xsrcd || true); do
		exe=$(readlink "/proc/$p/exe" 2>/dev/null || true)
		case "$exe" in "$XSRCD" | "$XSRCD (deleted)") echo "$p" ;; esac
	done
}

cleanup() {
	local status=$?
	set +e
	[ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
	if [ -n "$(packaged_xsrcd_pids)" ] && [ -x "$XSRC" ]; then
		"$XSRC" --rundir "$RUNDIR" down >/dev/null 2>&1
	fi
	[ -n "$SERVICE_PID" ] && kill "$SERVICE_PID" 2>/dev/null && wait "$SERVICE_PID" 2>/dev/null
	if [ "$INSTALLED" = 1 ]; then
		echo "cleanup: purging the packages" >&2
		DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${DEBS[@]}" >/dev/null 2>&1
	fi
	if [ "$KEEP" = 1 ] || [ $status -ne 0 ]; then
		echo "logs and packages kept in $WORK" >&2
	else
		rm -rf "$WORK"
	fi
	exit $status
}

# --- the device part ---------------------------------------------------------
VERBS_ENV=(env -u RDMAV_DRIVERS -u IBV_DRIVERS "SYSFS_PATH=$RUNDIR/sysfs")

pingpong() {  # two processes on xsrc0 over RC, with the GID of index 1
	timeout 60 "${VERBS_ENV[@]}" ibv_rc_pingpong -d xsrc0 -g 1 -p $PORT -n 1000 -s 4096 \
		>"$WORK/pp-server.log" 2>&1 &
	SERVER_PID=$!
	sleep 1
	local client=0 server=0
	timeout 60 "${VERBS_ENV[@]}" ibv_rc_pingpong -d xsrc0 -g 1 -p $PORT -n 1000 -s 4096 localhost \
		>"$WORK/pp-client.log" 2>&1 || client=$?
	wait "$SERVER_PID" || server=$?
	SERVER_PID=
	sed 's/^/  | /' "$WORK/pp-client.log"
	[ $client -eq 0 ] && [ $server -eq 0 ]
}

# build_with_pkgconfig PKG SOURCE OUTPUT: compile and link a program with
# nothing but what `pkg-config PKG` says (the installed -dev package).
build_with_pkgconfig() {
	local cc=cc
	case $2 in *.cpp) cc=c++ ;; esac
	# shellcheck disable=SC2046 # pkg-config's output is a list of flags
	$cc -O2 -Wall -Werror -o "$3" "$2" $(pkg-config --cflags --libs "$1") >"$WORK/build-$1.log" 2>&1 ||
		{ cat "$WORK/build-$1.log"; return 1; }
}

devinfo_quiet() { "${VERBS_ENV[@]}" ibv_devinfo -d xsrc0 >/dev/null; }

# The value of KEY= in the installed unit (one line each).
unit_value() { sed -n "s/^$1=//p" /lib/systemd/system/xsrcd.service; }

# Mounts under the run directory that were not there when the device part
# began (in a private namespace, another daemon's hidden mount is listed too).
BASE_MOUNTS=
our_mounts() {
	local m
	m=$(grep " $RUNDIR/" /proc/self/mountinfo || true)
	if [ -n "$BASE_MOUNTS" ] && [ -n "$m" ]; then
		m=$(printf '%s\n' "$m" | grep -vxF -e "$BASE_MOUNTS" || true)
	fi
	printf '%s' "$m"
}

# `xsrc up`, ibv_devinfo, pingpong, `xsrc down`; then the unit's commands.
# host: also leaves a daemon running for the purge to stop.
device_part() {
	local where=$1 pid env_line service_status preload
	local -a start_cmd post_cmd stop_cmd
	BASE_MOUNTS=$(grep " $RUNDIR/" /proc/self/mountinfo || true)
	say "xsrc up (installed CLI, installed daemon)"
	"$XSRC" up
	pid=$(packaged_xsrcd_pids)
	check "xsrc up started $XSRCD (pid $pid)" test -n "$pid"
	"${VERBS_ENV[@]}" ibv_devinfo -d xsrc0 >"$WORK/devinfo.txt" 2>&1 ||
		{ cat "$WORK/devinfo.txt"; fail "ibv_devinfo"; }
	sed 's/^/  | /' "$WORK/devinfo.txt" | head -12
	check "ibv_devinfo finds xsrc0 with RDMAV_DRIVERS unset" grep -q 'hca_id:.*xsrc0' "$WORK/devinfo.txt"
	check "two-process ibv_rc_pingpong -g 1 on xsrc0" pingpong
	preload=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/xsrc/libxsrc-preload.so
	check "xsrc run preloads the installed $preload (rdma_cm)" \
		bash -c "'$XSRC' run -- cat /proc/self/maps | grep -q ' $preload\$'"
	say "programs built against the installed -dev packages (pkg-config only)"
	check "cc xrc_legacy_traffic.c \$(pkg-config --cflags --libs libibverbs-ext)" \
		build_with_pkgconfig libibverbs-ext "$SRC/tests/xrc_legacy/xrc_legacy_traffic.c" "$WORK/xrc_legacy_traffic"
	check "it runs legacy XRC traffic between processes on xsrc0" \
		timeout 120 "${VERBS_ENV[@]}" "$WORK/xrc_legacy_traffic" -d xsrc0 -g 1
	check "cc uct_hello.c \$(pkg-config --cflags --libs xsrc-uct)" \
		build_with_pkgconfig xsrc-uct "$SRC/tests/packaging/uct_hello.c" "$WORK/uct_hello"
	check "it moves an active message and a put through the UCT shim on xsrc0" \
		timeout 60 "${VERBS_ENV[@]}" "$WORK/uct_hello" xsrc0
	"$XSRC" down
	check "xsrc down stopped xsrcd" test -z "$(packaged_xsrcd_pids)"
	check "xsrc down removed $RUNDIR" test ! -e "$RUNDIR"
	check "no uverbs node left" bash -c '! compgen -G "/dev/infiniband/uverbs*" >/dev/null'
	check "no arena left" bash -c '! compgen -G "/dev/shm/xsrc-*" >/dev/null'

	# The unit's commands as systemd would run them (it need not be PID 1 here).
	say "xsrcd.service's commands: ExecStart, ExecStartPost, ExecStop"
	env_line=$(unit_value Environment)
	read -r -a start_cmd <<<"$(unit_value ExecStart)"
	read -r -a post_cmd <<<"$(unit_value ExecStartPost)"
	read -r -a stop_cmd <<<"$(unit_value ExecStop)"
	env "$env_line" "${start_cmd[@]}" >"$WORK/service.log" 2>&1 &
	SERVICE_PID=$!
	check "ExecStartPost brings up the devices of devices.conf" \
		env "$env_line" MAINPID=$SERVICE_PID "${post_cmd[@]}"
	"$XSRC" status | sed 's/^/  | /'
	check "xsrc0 is up, served by the service's daemon" \
		bash -c "$XSRC status | grep -q '^xsrc0 ' && [ \"\$(cat $RUNDIR/xsrcd.pid)\" = $SERVICE_PID ]"
	check "ibv_devinfo through the service's device" devinfo_quiet
	check "ExecStop takes the devices down" env "$env_line" MAINPID=$SERVICE_PID "${stop_cmd[@]}"
	service_status=0
	wait "$SERVICE_PID" || service_status=$?
	SERVICE_PID=
	check "the service's xsrcd exited with status 0" test $service_status -eq 0
	check "nothing left in $RUNDIR" test ! -e "$RUNDIR"
	check "no uverbs node left" bash -c '! compgen -G "/dev/infiniband/uverbs*" >/dev/null'
	check "no arena left" bash -c '! compgen -G "/dev/shm/xsrc-*" >/dev/null'

	# Removing the package must stop a daemon that `xsrc up` started...
	say "xsrcd.prerm remove: a running daemon, a crashed one"
	"$XSRC" up --name xsrc0 >/dev/null
	check "a daemon started by xsrc up is running" test -n "$(packaged_xsrcd_pids)"
	check "xsrcd.prerm remove stops it" /var/lib/dpkg/info/xsrcd.prerm remove
	check "no packaged xsrcd left" test -z "$(packaged_xsrcd_pids)"
	check "no $RUNDIR left" test ! -e "$RUNDIR"
	# ...and remove what a crashed one left (mount, run directory, node, arena).
	"$XSRC" up --name xsrc0 >/dev/null
	pid=$(packaged_xsrcd_pids)
	kill -KILL "$pid"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
	check "a killed xsrcd left its node, arena and mount" bash -c \
		"[ -e /dev/infiniband/uverbs0 ] && compgen -G '/dev/shm/xsrc-*' >/dev/null && [ -n '$(our_mounts)' ]"
	if [ "$where" = host ]; then
		return  # the purge below must clean up after it
	fi
	# Here the purge runs outside this namespace: run xsrcd's prerm in it.
	check "xsrcd.prerm remove cleans up after it" /var/lib/dpkg/info/xsrcd.prerm remove
	check "no $RUNDIR left" test ! -e "$RUNDIR"
	check "no mount under $RUNDIR left" test -z "$(our_mounts)"
	check "no uverbs node left" bash -c '! compgen -G "/dev/infiniband/uverbs*" >/dev/null'
	check "no arena left" bash -c '! compgen -G "/dev/shm/xsrc-*" >/dev/null'
}

# Inside `unshare --mount --pid`: fresh /run, /dev/infiniband and /dev/shm that
# only this namespace sees, and a /proc without the other xsrcd, so that its
# node, arena, run directory and process are neither seen nor touched.
if [ "${1:-}" = --inner-device ]; then
	WORK=$2
	mount -t tmpfs -o mode=0755 xsrc-test-run /run
	mount -t tmpfs -o mode=0755 xsrc-test-dev /dev/infiniband
	mount -t tmpfs -o mode=1777 xsrc-test-shm /dev/shm
	# A failure must not leave the daemon running in this namespace.
	trap '[ -z "$SERVER_PID" ] || kill "$SERVER_PID" 2>/dev/null
	      [ -z "$SERVICE_PID" ] || kill "$SERVICE_PID" 2>/dev/null
	      [ -z "$(packaged_xsrcd_pids)" ] || "$XSRC" down >/dev/null 2>&1' EXIT
	device_part isolated
	exit 0
fi

WORK=$(mktemp -d /tmp/xsrc-packaging.XXXXXX)
trap cleanup EXIT


# --- 0. tools -----------------------------------------------------------------
need=()
command -v dh >/dev/null || need+=(debhelper)
command -v lintian >/dev/null || need+=(lintian)
command -v rpmbuild >/dev/null || need+=(rpm)
command -v fakeroot >/dev/null || need+=(fakeroot)
command -v ibv_devinfo >/dev/null || need+=(ibverbs-utils)
if [ ${#need[@]} -gt 0 ]; then
	say "installing ${need[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
for p in "${DEBS[@]}"; do
	if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -qv 'not-installed'; then
		fail "$p is installed already; purge it first (apt-get purge ${DEBS[*]})"
	fi
done
# A `cmake --install` copy would be overwritten by the packages and removed by the purge.
for f in /etc/libibverbs.d/xsrc.driver "$XSRCD" "$XSRC"; do
	[ -e "$f" ] && fail "$f exists and belongs to no package (a cmake --install?); remove it first"
done

# --- 1. build the .debs -------------------------------------------------------
VERSION=$(dpkg-parsechangelog -l "$SRC/debian/changelog" -S Version)
UPSTREAM=${VERSION%-*}
TREE=$WORK/deb/xsrc-$UPSTREAM
mkdir -p "$TREE"
# The checkout as git sees it (tracked and new files, not build trees or results).
(cd "$SRC" && git ls-files -z -co --exclude-standard | grep -zv '^bench/results/' |
	tar --null -T - -cf -) | tar -C "$TREE" -xf -
RPMVERSION=$(sed -n 's/^Version:[[:space:]]*//p' "$SRC/redhat/xsrc.spec")
mkdir -p "$WORK/rpm-src"
cp -a "$TREE" "$WORK/rpm-src/xsrc-$RPMVERSION"  # the same sources, before the build touches them
phase_done "copy the checkout"

say "dpkg-buildpackage -b -us -uc (log: $WORK/deb-build.log)"
(cd "$TREE" && DEB_BUILD_OPTIONS="parallel=$(nproc)" nice dpkg-buildpackage -b -us -uc) \
	>"$WORK/deb-build.log" 2>&1 || { tail -40 "$WORK/deb-build.log"; fail "dpkg-buildpackage"; }
ARCH=$(dpkg --print-architecture)
MA=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
DEB_FILES=()
for p in "${DEBS[@]}"; do
	f=$WORK/deb/${p}_${VERSION}_${ARCH}.deb
	check "built $(basename "$f")" test -f "$f"
	DEB_FILES+=("$f")
done
phase_done "dpkg-buildpackage"

say "lintian"
lintian --tag-display-limit 0 "$WORK/deb/xsrc_${VERSION}_${ARCH}.changes" >"$WORK/lintian.txt" 2>&1 || true
grep -v '^running with root privileges' "$WORK/lintian.txt" | sed 's/^/  | /' || true
check "lintian reports no errors" bash -c "! grep -q '^E: ' '$WORK/lintian.txt'"
phase_done "lintian"

# Files (not directories) each package must ship; doc files are not listed.
expected_deb_files() {
	case $1 in
	xsrc-provider)
		echo ./etc/libibverbs.d/xsrc.driver
		echo "./usr/lib/$MA/libibverbs/libxsrc-rdmav34.so"
		echo "./usr/lib/$MA/xsrc/libxsrc-preload.so"
		echo ./usr/share/man/man7/xsrc.7.gz
		;;
	xsrcd)
		echo ./etc/xsrc/devices.conf
		echo ./lib/systemd/system/xsrcd.service
		echo ./usr/bin/xsrc
		echo ./usr/libexec/xsrc/xsrc-service
		echo ./usr/sbin/xsrcd
		echo ./usr/share/man/man8/xsrc.8.gz
		echo ./usr/share/man/man8/xsrcd.8.gz
		;;
	libibverbs-ext1)
		echo "./usr/lib/$MA/libibverbs-ext.so.1"
		echo "./usr/lib/$MA/libibverbs-ext.so.1.0.0"
		;;
	libibverbs-ext-dev)
		echo ./usr/include/infiniband/verbs_ext.h
		echo "./usr/lib/$MA/libibverbs-ext.so"
		echo "./usr/lib/$MA/pkgconfig/libibverbs-ext.pc"
		for f in close_src_domain close_xrc_domain create_src_srq create_xrc_qp create_xrc_rcv_qp \
			create_xrc_srq modify_xrc_rcv_qp open_src_domain open_xrc_domain post_xrc_send \
			query_xrc_rcv_qp reg_xrc_rcv_qp unreg_xrc_rcv_qp xrc_srq_num; do
			echo "./usr/share/man/man3/ibv_$f.3.gz"
		done
		;;
	libxsrc-uct0)
		echo "./usr/lib/$MA/libxsrc-uct.so.0"
		echo "./usr/lib/$MA/libxsrc-uct.so.0.1.0"
		;;
	libxsrc-uct-dev)
		echo ./usr/include/xsrc/uct.h
		echo "./usr/lib/$MA/libxsrc-uct.so"
		echo "./usr/lib/$MA/pkgconfig/xsrc-uct.pc"
		;;
	esac
}
for i in "${!DEBS[@]}"; do
	p=${DEBS[$i]}
	dpkg-deb --fsys-tarfile "${DEB_FILES[$i]}" | tar -t | grep -v '/$' | grep -v "^./usr/share/doc/" | sort \
		>"$WORK/$p.files"
	expected_deb_files "$p" | sort >"$WORK/$p.expected"
	check "$p ships exactly its files" diff -u "$WORK/$p.expected" "$WORK/$p.files"
done
check "xsrcd Depends on fuse3" bash -c "dpkg-deb -f '${DEB_FILES[1]}' Depends | grep -qw fuse3"
check "xsrc-provider Depends on libibverbs1" bash -c "dpkg-deb -f '${DEB_FILES[0]}' Depends | grep -qw libibverbs1"

# --- 2. install ----------------------------------------------------------------
# A daemon of the development tree (or anyone's) that must survive this test.
DEV_PIDS=$(pgrep -x xsrcd || true)
DEV_RUNNING=0
if [ -n "$DEV_PIDS" ] || [ -S "$RUNDIR/xsrcd.sock" ] || compgen -G '/dev/infiniband/uverbs*' >/dev/null; then
	DEV_RUNNING=1
fi
say "other xsrcd: ${DEV_PIDS:-none}; $RUNDIR: $(find $RUNDIR -maxdepth 1 -mindepth 1 -printf '%f ' 2>/dev/null || echo absent)"

say "apt-get install ./*.deb"
INSTALLED=1
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${DEB_FILES[@]}" >"$WORK/install.log" 2>&1 ||
	{ cat "$WORK/install.log"; fail "apt-get install"; }
for p in "${DEBS[@]}"; do
	dpkg -L "$p" >"$WORK/$p.installed"
done
check "installing started no xsrcd" test -z "$(packaged_xsrcd_pids)"
check "installing left the run directory as it was" \
	bash -c "[ $DEV_RUNNING = 1 ] || [ ! -e $RUNDIR ]"
check "xsrcd.service is not enabled" \
	bash -c '! compgen -G "/etc/systemd/system/*.wants/xsrcd.service" >/dev/null'
check "/etc/xsrc/devices.conf is a conffile" grep -qx /etc/xsrc/devices.conf /var/lib/dpkg/info/xsrcd.conffiles
if command -v systemd-analyze >/dev/null; then
	check "systemd-analyze verify xsrcd.service" \
		systemd-analyze verify /lib/systemd/system/xsrcd.service
fi
phase_done "install"

# --- 3. a device through the installed packages ------------------------------
if [ $DEV_RUNNING = 0 ]; then
	DEVICE_PART="run"
	device_part host
elif [ $ISOLATED = 1 ]; then
	DEVICE_PART="run in private mount and pid namespaces"
	say "another xsrcd is running (pids: ${DEV_PIDS:-?}): the device part runs in private mount and pid namespaces"
	made_dev_dir=0
	[ -d /dev/infiniband ] || { mkdir /dev/infiniband && made_dev_dir=1; }
	inner=0
	unshare --mount --propagation private --pid --fork --mount-proc -- "$BASH" "$0" --inner-device "$WORK" || inner=$?
	[ $made_dev_dir = 1 ] && rmdir /dev/infiniband 2>/dev/null
	[ $inner -eq 0 ] || fail "the device part (in private namespaces)"
	check "no packaged xsrcd outlived the namespace" test -z "$(packaged_xsrcd_pids)"
else
	DEVICE_PART="skipped (another xsrcd is running)"
	say "SKIPPED the device part: another xsrcd is running (pids: ${DEV_PIDS:-?}; $RUNDIR in use); --isolated runs it in private mount and pid namespaces"
	if [ -d "$RUNDIR/sysfs/class/infiniband" ]; then
		# Enumeration only (no context is opened on someone else's device).
		"${VERBS_ENV[@]}" ibv_devinfo -l >"$WORK/devinfo-l.txt" 2>&1 || true
		sed 's/^/  | /' "$WORK/devinfo-l.txt"
		check "libibverbs binds the running daemon's devices to the installed provider (ibv_devinfo -l)" \
			grep -q xsrc "$WORK/devinfo-l.txt"
	fi
fi
phase_done "device (${DEVICE_PART})"

# --- 4. purge -----------------------------------------------------------------
say "apt-get purge ${DEBS[*]}"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${DEBS[@]}" >"$WORK/purge.log" 2>&1 ||
	{ cat "$WORK/purge.log"; fail "apt-get purge"; }
INSTALLED=0
leftovers=()
for p in "${DEBS[@]}"; do
	while read -r f; do
		[ -e "$f" ] || [ -L "$f" ] || continue
		[ -d "$f" ] && continue  # shared directories (/usr/lib/<triplet>, /lib -> usr/lib, ...)
		leftovers+=("$f")
	done <"$WORK/$p.installed"
	[ -e "/usr/share/doc/$p" ] && leftovers+=("/usr/share/doc/$p")
	if dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -qv 'not-installed'; then
		leftovers+=("dpkg state of $p: $(dpkg-query -W -f='${Status}' "$p")")
	fi
done
for d in /etc/xsrc /usr/libexec/xsrc /var/lib/systemd/deb-systemd-helper-enabled/xsrcd.service.dsh-also \
	/var/lib/systemd/deb-systemd-helper-masked/xsrcd.service; do
	[ -e "$d" ] && leftovers+=("$d")
done
[ ${#leftovers[@]} -eq 0 ] || printf '    left: %s\n' "${leftovers[@]}"
check "the purge leaves none of the packages' files, /etc/xsrc or state" test ${#leftovers[@]} -eq 0
check "no packaged xsrcd process is left" test -z "$(packaged_xsrcd_pids)"
if [ $DEV_RUNNING = 1 ]; then
	still=1
	for p in $DEV_PIDS; do kill -0 "$p" 2>/dev/null || still=0; done
	check "the other xsrcd (${DEV_PIDS:-none}) still runs, untouched" test $still -eq 1
	check "its control socket is still there" bash -c "[ -z '$DEV_PIDS' ] || [ -S $RUNDIR/xsrcd.sock ]"
else
	check "no $RUNDIR" test ! -e "$RUNDIR"
	check "no mount under $RUNDIR" bash -c "! grep -q ' $RUNDIR/' /proc/self/mountinfo"
	check "no uverbs node" bash -c '! compgen -G "/dev/infiniband/uverbs*" >/dev/null'
	check "no arena in /dev/shm" bash -c '! compgen -G "/dev/shm/xsrc-*" >/dev/null'
	check "no xsrcd process at all" bash -c '! pgrep -x xsrcd >/dev/null'
fi
phase_done "purge"

# --- 5. the .rpms -------------------------------------------------------------
say "rpmbuild -bb --nodeps (log: $WORK/rpm-build.log)"
RPMTOP=$WORK/rpm
mkdir -p "$RPMTOP/SOURCES"
tar -C "$WORK/rpm-src" -czf "$RPMTOP/SOURCES/xsrc-$RPMVERSION.tar.gz" "xsrc-$RPMVERSION"
nice rpmbuild -bb --nodeps --define "_topdir $RPMTOP" "$SRC/redhat/xsrc.spec" >"$WORK/rpm-build.log" 2>&1 ||
	{ tail -40 "$WORK/rpm-build.log"; fail "rpmbuild"; }
phase_done "rpmbuild"

LIBDIR=$(rpm --eval '%{_libdir}')
expected_rpm_files() {
	case $1 in
	xsrc-provider)
		echo /etc/libibverbs.d/xsrc.driver
		echo "$LIBDIR/libibverbs/libxsrc-rdmav34.so"
		echo "$LIBDIR/xsrc"
		echo "$LIBDIR/xsrc/libxsrc-preload.so"
		echo /usr/share/man/man7/xsrc.7
		;;
	xsrcd)
		printf '%s\n' /etc/xsrc /etc/xsrc/devices.conf /usr/lib/systemd/system/xsrcd.service \
			/usr/bin/xsrc /usr/libexec/xsrc /usr/libexec/xsrc/xsrc-service /usr/sbin/xsrcd \
			/usr/share/man/man8/xsrc.8 /usr/share/man/man8/xsrcd.8
		;;
	libibverbs-ext)
		echo "$LIBDIR/libibverbs-ext.so.1"
		echo "$LIBDIR/libibverbs-ext.so.1.0.0"
		;;
	libibverbs-ext-devel)
		echo /usr/include/infiniband/verbs_ext.h
		echo "$LIBDIR/libibverbs-ext.so"
		echo "$LIBDIR/pkgconfig/libibverbs-ext.pc"
		for f in close_src_domain close_xrc_domain create_src_srq create_xrc_qp create_xrc_rcv_qp \
			create_xrc_srq modify_xrc_rcv_qp open_src_domain open_xrc_domain post_xrc_send \
			query_xrc_rcv_qp reg_xrc_rcv_qp unreg_xrc_rcv_qp xrc_srq_num; do
			echo "/usr/share/man/man3/ibv_$f.3"
		done
		;;
	xsrc-uct)
		echo "$LIBDIR/libxsrc-uct.so.0"
		echo "$LIBDIR/libxsrc-uct.so.0.1.0"
		;;
	xsrc-uct-devel)
		printf '%s\n' /usr/include/xsrc /usr/include/xsrc/uct.h "$LIBDIR/libxsrc-uct.so" "$LIBDIR/pkgconfig/xsrc-uct.pc"
		;;
	esac
}
for p in xsrc-provider xsrcd libibverbs-ext libibverbs-ext-devel xsrc-uct xsrc-uct-devel; do
	rpmfile=$(find "$RPMTOP/RPMS" -name "$p-$RPMVERSION-*.rpm" | head -1)
	check "built $p rpm" test -n "$rpmfile"
	# Man pages are compressed or not depending on the host's brp scripts;
	# /usr/lib/.build-id links depend on the host's rpm configuration.
	rpm -qlp "$rpmfile" | grep -v '^/usr/lib/\.build-id' | sed 's/\.gz$//' | sort >"$WORK/$p.rpmfiles"
	expected_rpm_files "$p" | sort >"$WORK/$p.rpmexpected"
	check "rpm -qlp $(basename "$rpmfile") lists exactly its files" \
		diff -u "$WORK/$p.rpmexpected" "$WORK/$p.rpmfiles"
done
phase_done "rpm checks"

echo
say "PASS (device part: $DEVICE_PART) in $(($(date +%s) - T0)) s"
printf '   %s\n' "${TIMES[@]}"
