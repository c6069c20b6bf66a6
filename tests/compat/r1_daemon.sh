#!/bin/bash
# Today's provider against a daemon that serves driver ABI revision 1
# (`xsrc up --abi 1` -> `xsrcd --abi 1`): the device opens, GET_CONTEXT
# reports revision 1 with nothing past the r1 fields, XSRC_CMD_COPY does not
# exist, neither does multicast (nor at --abi 2), nor memory windows (nor at
# --abi 2 and 3), nor tag matching (up to --abi 6), and real traffic works.
# The daemon runs in a mount namespace of its own (fresh /run, /dev/shm,
# /dev/infiniband), beside the xsrc0 of the other tests.
# Environment: XSRC, XSRC_BIN, XSRC_RUNDIR, SYSFS_PATH, RDMAV_DRIVERS,
# COMMAND_FILE_ABI_TEST, MCAST_TEST, TRAFFIC_ERRORS_TEST, XSRC_TESTS_DIR.
set -u
if [ "${1:-}" != --inside ]; then
  exec unshare -m --propagation private "$0" --inside
fi
mkdir -p /dev/infiniband
for m in /run /dev/shm /dev/infiniband; do
  mount -t tmpfs tmpfs "$m" || { echo "cannot mount a tmpfs on $m"; exit 1; }
done

fail=0
step() {  # step NAME COMMAND...: runs it, reports, remembers a failure
  local name=$1; shift
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq 0 ]; then echo "ok   $name"; else echo "FAIL $name (exit $rc)"; printf '%s\n' "$out" | tail -30; fail=1; fi
}
expect_fail() {  # expect_fail NAME STATUS TEXT COMMAND...: must exit STATUS saying TEXT
  local name=$1 status=$2 text=$3; shift 3
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq "$status" ] && printf '%s\n' "$out" | grep -qF -- "$text"; then echo "ok   $name"
  else echo "FAIL $name (exit $rc, expected $status and '$text')"; printf '%s\n' "$out"; fail=1; fi
}

expect_fail "xsrcd --abi 0 is a usage error" 2 "serves driver ABI revisions" "$XSRC_BIN/xsrcd" --abi 0
expect_fail "xsrcd --abi 99 is a usage error" 2 "serves driver ABI revisions" "$XSRC_BIN/xsrcd" --abi 99
expect_fail "xsrc up --abi x is a usage error" 2 "invalid driver ABI revision" "$XSRC" up --abi x

"$XSRC" up --name xsrc0 --abi 1 || exit 1
trap '"$XSRC" down >/dev/null' EXIT
expect_fail "xsrc up --abi 2 against it is refused" 1 "serves driver ABI revision 1, not 2" \
  "$XSRC" up --name xsrc0 --abi 2
step "xsrc up without --abi reuses it" "$XSRC" up --name xsrc0
step "ibv_devinfo opens the device" ibv_devinfo -d xsrc0
step "GET_CONTEXT answers as revision 1" env XSRC_EXPECT_ABI_REVISION=1 "$COMMAND_FILE_ABI_TEST"
step "no multicast at revision 1" env XSRC_EXPECT_NO_MCAST=1 XSRC_EXPECT_ABI_REVISION=1 \
  "$MCAST_TEST" --gtest_filter=Mcast.AbsentBeforeRevision3
step "no memory windows at revision 1" env XSRC_EXPECT_NO_MW=1 XSRC_EXPECT_ABI_REVISION=1 \
  "$TRAFFIC_ERRORS_TEST" --gtest_filter=MwAbsent.*

pp=$XSRC_TESTS_DIR/traffic/pingpong.sh
step "rc_pingpong" "$pp" 18851 ibv_rc_pingpong -g 1 -s 4096 -n 200
step "rc_pingpong -e" "$pp" 18852 ibv_rc_pingpong -g 1 -e -s 65536 -n 100
step "ud_pingpong" "$pp" 18853 ibv_ud_pingpong -g 1 -s 1024 -n 200
step "srq_pingpong" "$pp" 18854 ibv_srq_pingpong -g 1 -s 4096 -n 200
step "xsrq_pingpong, 2 clients" "$XSRC_TESTS_DIR/xrc/xsrq_pingpong.sh" 18855 2 -g 1 -s 4096 -n 100
step "ib_write_bw" "$XSRC_TESTS_DIR/perftest/perftest.sh" 18856 ib_write_bw -s 65536 -n 200

"$XSRC" down >/dev/null || { echo "FAIL xsrc down"; fail=1; }

# Revision 2: no multicast either (it came with revision 3).
step "xsrc up --abi 2" "$XSRC" up --name xsrc0 --abi 2
step "GET_CONTEXT answers as revision 2" env XSRC_EXPECT_ABI_REVISION=2 "$COMMAND_FILE_ABI_TEST"
step "no multicast at revision 2" env XSRC_EXPECT_NO_MCAST=1 XSRC_EXPECT_ABI_REVISION=2 \
  "$MCAST_TEST" --gtest_filter=Mcast.AbsentBeforeRevision3
"$XSRC" down >/dev/null || { echo "FAIL xsrc down"; fail=1; }

# Revision 3: no memory windows (they came with revision 4).
step "xsrc up --abi 3" "$XSRC" up --name xsrc0 --abi 3
step "GET_CONTEXT answers as revision 3" env XSRC_EXPECT_ABI_REVISION=3 "$COMMAND_FILE_ABI_TEST"
step "no memory windows at revision 3" env XSRC_EXPECT_NO_MW=1 XSRC_EXPECT_ABI_REVISION=3 \
  "$TRAFFIC_ERRORS_TEST" --gtest_filter=MwAbsent.*
step "rc_pingpong at revision 3" "$XSRC_TESTS_DIR/traffic/pingpong.sh" 18857 ibv_rc_pingpong -g 1 -s 4096 -n 100
"$XSRC" down >/dev/null || { echo "FAIL xsrc down"; fail=1; }

# Revision 6: no tag matching (it came with revision 7).
step "xsrc up --abi 6" "$XSRC" up --name xsrc0 --abi 6
step "no tag matching at revision 6" env XSRC_EXPECT_NO_TM=1 "$TM_TEST" --gtest_filter=TmAbsent.*
"$XSRC" down >/dev/null || { echo "FAIL xsrc down"; fail=1; }

# The other way round: a daemon at the default revision refuses --abi 1.
step "xsrc up (default revision)" "$XSRC" up --name xsrc0
expect_fail "xsrc up --abi 1 against it is refused" 1 ", not 1;" "$XSRC" up --name xsrc0 --abi 1
step "GET_CONTEXT answers as the default revision" "$COMMAND_FILE_ABI_TEST"
"$XSRC" down >/dev/null || { echo "FAIL xsrc down"; fail=1; }
trap - EXIT
exit $fail
