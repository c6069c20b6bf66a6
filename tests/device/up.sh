#!/bin/sh
# Fixture setup: bring xsrc0 up; a second `xsrc up` must be harmless.
# A daemon left running from another build (or from before a rebuild: its
# binary shows as deleted) is stopped first, so the tests run this build's.
set -eu
rundir=${XSRC_RUNDIR:-/run/xsrc}
pid=$(cat "$rundir/xsrcd.pid" 2>/dev/null || true)
want=$(readlink -f "$(dirname "$XSRC")/xsrcd")
if [ -n "$pid" ] && running=$(readlink "/proc/$pid/exe" 2>/dev/null) && [ "$running" != "$want" ]; then
  echo "xsrcd $pid runs $running, not $want: stopping it"
  "$XSRC" down
fi
"$XSRC" up --name xsrc0
out=$("$XSRC" up --name xsrc0)
echo "$out"
echo "$out" | grep -q "already up"
"$XSRC" status | grep -q "^xsrc0 .*port=ACTIVE"
