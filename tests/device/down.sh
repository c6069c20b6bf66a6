#!/bin/sh
# Fixture cleanup: `xsrc down` must leave no mount, file or process behind.
set -eu
pid=$(cat "$XSRC_RUNDIR/xsrcd.pid" 2>/dev/null || true)
"$XSRC" down
fail=0
if grep -q " $XSRC_RUNDIR/fs " /proc/self/mountinfo; then echo "FUSE mount left at $XSRC_RUNDIR/fs"; fail=1; fi
if [ -e "$XSRC_RUNDIR" ]; then echo "run directory left: $(ls -A "$XSRC_RUNDIR")"; fail=1; fi
if ls /dev/infiniband/uverbs* >/dev/null 2>&1; then echo "device node left: $(ls /dev/infiniband)"; fail=1; fi
# An exited xsrcd may stay a zombie for a while (this machine's init reaps
# lazily): only a live one counts. `xsrc down` already waited for it to exit.
alive=$(ps -eo stat=,comm= | awk '$2 == "xsrcd" && $1 !~ /^Z/' | wc -l)
if [ "$alive" -ne 0 ]; then echo "xsrcd still running: $(ps -eo pid=,stat=,args= | awk '$0 ~ /xsrcd/')"; fail=1; fi
if [ -n "$pid" ] && [ -r "/proc/$pid/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status"; then
  echo "xsrcd (pid $pid) still running"; fail=1
fi
exit $fail
