#!/bin/bash
# rdma-core's own test suite (../shared/conformance), unmodified, against
# xsrc0 through `xsrc run`. Fails on any failure or error, and on a skip
# whose reason is not listed in remaining_skips.txt; prints the counts.
#   conformance.sh SUITE_DIR
set -u
suite=$1
allowed=$(dirname "$0")/remaining_skips.txt
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
if [ $rc -ne 0 ] || [ -z "$ran" ] || ! echo "$summary" | grep -q '^OK'; then
  echo "FAIL: failures or errors (exit $rc)"; status=1
fi
exit $status
