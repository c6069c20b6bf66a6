#!/bin/bash
# rdma-core's own rdma_cm tests (pyverbs, tests/test_rdmacm.py of the
# conformance suite beside the checkout, ../shared/conformance), unmodified,
# through `xsrc run`: every test must pass, none may be skipped.
#   pyverbs_rdmacm.sh SUITE_DIR
set -u
suite=$1
if [ ! -f "$suite/tests/test_rdmacm.py" ]; then
  echo "no conformance suite at $suite"; exit 1
fi
out=$(cd "$suite" && timeout 300 "$XSRC" run -- /usr/bin/python3 tests/run_tests.py --dev xsrc0 --gid 1 -v test_rdmacm 2>&1)
rc=$?
echo "$out" | tail -25
ran=$(echo "$out" | sed -n 's/^Ran \([0-9]*\) tests.*/\1/p')
if [ $rc -ne 0 ] || [ -z "$ran" ] || [ "$ran" -eq 0 ]; then echo "FAIL: exit $rc, ran ${ran:-0} tests"; exit 1; fi
if echo "$out" | grep -q "skipped"; then echo "FAIL: tests were skipped"; exit 1; fi
echo "all $ran rdmacm tests of the conformance suite passed"
