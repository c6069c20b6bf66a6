#!/bin/bash
# A device of a driver ABI generation the provider does not support must be
# refused by libibverbs itself ("does not support the kernel ABI"), cleanly:
# a copy of xsrc0's sysfs view whose uverbs abi_version is one generation
# past the device's, read through SYSFS_PATH.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp -rL "$SYSFS_PATH" "$dir/sysfs" || exit 1
uverbs=$(grep -lx xsrc0 "$dir"/sysfs/class/infiniband_verbs/uverbs*/ibdev | head -1)
[ -n "$uverbs" ] || { echo "xsrc0 has no uverbs entry in $SYSFS_PATH"; exit 1; }
abi_file=$(dirname "$uverbs")/abi_version
generation=$(cat "$abi_file")
next=$((generation + 1))

# The unmodified copy still works: the test changes only the generation.
SYSFS_PATH=$dir/sysfs ibv_devinfo -d xsrc0 >"$dir/before" 2>&1 || {
  echo "ibv_devinfo failed on the unmodified copy:"; cat "$dir/before"; exit 1; }

echo "$next" >"$abi_file"
SYSFS_PATH=$dir/sysfs ibv_devinfo -d xsrc0 >"$dir/out" 2>&1
rc=$?
fail=0
if [ $rc -eq 0 ]; then echo "ibv_devinfo accepted generation $next"; fail=1; fi
if [ $rc -gt 128 ] && [ $rc -le 192 ]; then echo "ibv_devinfo was killed by signal $((rc - 128))"; fail=1; fi
if ! grep -q "Driver xsrc does not support the kernel ABI of $next " "$dir/out"; then
  echo "no 'does not support the kernel ABI of $next' warning"; fail=1
fi
cat "$dir/out"
exit $fail
