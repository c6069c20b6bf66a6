#!/bin/bash
# rdma-core's own test suite (../shared/conformance), unmodified, against
# xsrc0 through `xsrc run`. Fails on any failure, on an error of a test
# not listed in remaining_errors.txt, and on a skip whose reason is not
# listed in remaining_skips.txt; prints the counts.
#   conformance.sh SUITE_DIR
set -u
suite=$1
allowed=$(dirname "$0")/remaining_skips.txt
allowed_errors=$(dirname "$0")/remaining_errors.txt
if [ ! -f "$suite/tests/run_tests.py" ]; then
  echo "no conformance suite at $suite"; exit 1
fi
# Several tests register MRs over 2 MiB huge pages.
if [ "$(sed -n 's/^HugePages_Free: *//p' /proc/meminfo)" = 0 ]; then
  echo "FAIL: no free 2 MiB huge pages (echo 64 > /proc/sys/vm/nr_hugepages)"; exit 1
fi
out=$(cd "$suite" && timeout 900 "$XSRC" run -- /usr/bin/python3 tests/run_tests.py --dev xsrc0 --gid 1 -v 2>&1)
rc=$?
ran=$(echo "$out" | sed -n 's/^Ran \([0-9]*\) tests.*/\1/p')
passed=$(echo "$out" | grep -c '\.\.\. ok$')
echo "$out" | grep -E '^(ERROR|FAIL):' || true
echo "ran ${ran:-0}, passed $passed, exit $rc; skipped by reason:"
reasons=$(echo "$out" | grep -o "skipped '[^']*'" | sed "s/^skipped '//; s/'\$//")
echo "$reasons" | grep -v '^$' | sort | uniq -c | sort -rn
status=0
while IFS= read -r reason; do
  [ -z "$reason" ] && continue
  if ! grep -vx '#.*' "$allowed" | grep -qxF -- "$reason"; then
    echo "FAIL: a skip not in remaining_skips.txt: '$reason'"; status=1
  fi
done < <(echo "$reasons" | sort -u)
summary=$(echo "$out" | tail -n 3 | grep -E '^(OK|FAILED)')
echo "$summary"
failures=$(echo "$out" | sed -n 's/^FAIL: \([^ ]*\) .*/\1/p')
errors=$(echo "$out" | sed -n 's/^ERROR: \([^ ]*\) .*/\1/p' | sort -u)
if [ -n "$failures" ]; then echo "FAIL: failed tests:" $failures; status=1; fi
for test in $errors; do
  if ! grep -v '^#' "$allowed_errors" | awk '{print $1}' | grep -qxF -- "$test"; then
    echo "FAIL: an error not in remaining_errors.txt: $test"; status=1
  fi
done
# Anything else that makes the run fail (a crash, a module that does not load).
if [ -z "$ran" ] || { [ $rc -ne 0 ] && [ -z "$failures" ] && [ -z "$errors" ]; }; then
  echo "FAIL: the suite did not run to the end (exit $rc)"; status=1
fi
exit $status
