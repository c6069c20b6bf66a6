#!/bin/bash
# Run by private_host.sh: a daemon that stops without unlinking its arena
# (here: the arena's path is a mount point, so its unlink fails with EBUSY)
# is reported by `xsrc down`, with the end of its log, which goes with the
# run directory. Checks what the report says, then that nothing else is left.
set -u
: "${XSRC:?XSRC must name the xsrc tool}"
arena=/dev/shm/xsrc-xsrc0
[ -f "$arena" ] || { echo "no arena at $arena"; exit 1; }
cover=$(mktemp /dev/shm/cover.XXXXXX)
mount --bind "$cover" "$arena" || { echo "cannot bind-mount over $arena"; exit 1; }
err=$(mktemp)
"$XSRC" down 2>"$err" >/dev/null
rc=$?
umount "$arena"
rm -f "$cover"
fail=0
[ $rc -eq 0 ] || { echo "xsrc down exited with $rc"; fail=1; }
grep -q "xsrcd exited but left its arena $arena behind; cannot remove it" "$err" ||
  { echo "no report of the arena left behind"; fail=1; }
grep -q "^xsrcd: stopped$" "$err" || { echo "no tail of xsrcd's log"; fail=1; }
[ $fail -eq 0 ] || { echo "xsrc down said:"; cat "$err"; }
rm -f "$err"
# The file the daemon could not unlink is still there: the report was true.
[ -f "$arena" ] || { echo "$arena is gone: the daemon did unlink it"; fail=1; }
rm -f "$arena"
[ ! -e "${XSRC_RUNDIR:?}" ] || { echo "run directory left: $(ls -A "$XSRC_RUNDIR")"; fail=1; }
exit $fail
