#!/bin/bash
# Runs the libFuzzer target over xsrcd's command decoder for SECONDS, over a
# copy of the seed corpus (tests/fuzz/corpus), under ASan/UBSan/LSan.
#   tests/fuzz/run.sh SECONDS
# Builds nothing: the binary is $XSRC_FUZZ_BIN, else build-fuzz/bin/xsrcd_fuzz_commands
# (CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DXSRC_FUZZ=ON -DBUILD_TESTING=OFF
#  && cmake --build build-fuzz --target xsrcd_fuzz_commands).
# Exit 0: no finding. Otherwise non-zero, with the reproducer's path and how
# to replay it; it stays in $XSRC_FUZZ_ARTIFACTS (default: a directory in /tmp).
set -u
if [ $# -ne 1 ] || ! [ "$1" -gt 0 ] 2>/dev/null; then
  echo "usage: $0 SECONDS" >&2
  exit 2
fi
seconds=$1
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
bin=${XSRC_FUZZ_BIN:-$src/build-fuzz/bin/xsrcd_fuzz_commands}
if [ ! -x "$bin" ]; then
  echo "run.sh: no fuzz target at $bin; build it first (see the header of this script)" >&2
  exit 2
fi

work=$(mktemp -d /tmp/xsrc-fuzz.XXXXXX)
shm=$(mktemp -d /dev/shm/xsrc-fuzz.XXXXXX)   # the per-input device arenas
artifacts=${XSRC_FUZZ_ARTIFACTS:-$work/artifacts}
mkdir -p "$work/corpus" "$artifacts"
cp "$here"/corpus/* "$work/corpus/"
trap 'rm -rf "$shm"' EXIT

export XSRC_FUZZ_SHM_DIR=$shm
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1:allocator_may_return_null=0
export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
  -max_len=16384 -detect_leaks=1 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "$work/corpus" >"$work/log" 2>&1
rc=$?
grep -E '^(#[0-9]+ +DONE|stat::|Done )' "$work/log"
found=$(ls "$artifacts" 2>/dev/null)
if [ $rc -ne 0 ] || [ -n "$found" ]; then
  tail -n 60 "$work/log"
  echo "run.sh: FINDING (fuzzer exit $rc); full log: $work/log"
  for f in $found; do
    echo "reproducer: $artifacts/$f"
    echo "  replay: XSRC_FUZZ_TRACE=1 $bin $artifacts/$f"
  done
  exit 1
fi
echo "run.sh: no finding in ${seconds} s"
rm -rf "$work"
