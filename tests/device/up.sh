#!/bin/sh
# Fixture setup: bring xsrc0 up; a second `xsrc up` must be harmless.
set -eu
"$XSRC" up --name xsrc0
out=$("$XSRC" up --name xsrc0)
echo "$out"
echo "$out" | grep -q "already up"
"$XSRC" status | grep -q "^xsrc0 .*port=ACTIVE"
