#!/bin/bash
# The compat_r1_* tests must really run the provider built against the
# revision-1 header: libibverbs must load it (and no other xsrc provider)
# for xsrc0, and the device must open through it.
#   r1_provider_loaded.sh PATH_OF_THE_R1_PROVIDER
set -u
r1=$1
[ -f "$r1" ] || { echo "no r1 provider at $r1 (build the xsrc_provider_r1 target)"; exit 1; }
out=$(LD_DEBUG=files ibv_devinfo -d xsrc0 2>&1)
rc=$?
loaded=$(printf '%s\n' "$out" | grep -o 'file=[^ ]*libxsrc-rdmav34\.so' | sort -u)
fail=0
if [ $rc -ne 0 ]; then echo "ibv_devinfo -d xsrc0 exited $rc"; fail=1; fi
if [ "$loaded" != "file=$r1" ]; then echo "xsrc providers loaded: ${loaded:-none}; expected only $r1"; fail=1; fi
if ! printf '%s\n' "$out" | grep -q 'transport:'; then echo "ibv_devinfo printed no device"; fail=1; fi
if [ $fail -ne 0 ]; then printf '%s\n' "$out" | grep -v '^ *[0-9]*:' | tail -20; exit 1; fi
echo "ibv_devinfo -d xsrc0 through $r1"
