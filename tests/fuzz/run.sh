#!/bin/bash
# Runs the libFuzzer targets for SECONDS in all, under ASan/UBSan/LSan, each
# over a copy of its seed corpus: xsrcd's uverbs command decoder
# (xsrcd_fuzz_commands, tests/fuzz/corpus) for two thirds of the time, then
# the connection manager's commands (xsrcd_fuzz_cm, tests/fuzz/corpus-cm).
#   tests/fuzz/run.sh SECONDS
# Builds nothing: the binaries are $XSRC_FUZZ_BIN and $XSRC_FUZZ_CM_BIN, else
# build-fuzz/bin/xsrcd_fuzz_commands and build-fuzz/bin/xsrcd_fuzz_cm
# (CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DXSRC_FUZZ=ON -DBUILD_TESTING=OFF
#  && cmake --build build-fuzz --target xsrcd_fuzz_commands xsrcd_fuzz_cm).
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
cm_bin=${XSRC_FUZZ_CM_BIN:-$src/build-fuzz/bin/xsrcd_fuzz_cm}
for b in "$bin" "$cm_bin"; do
  if [ ! -x "$b" ]; then
    echo "run.sh: no fuzz target at $b; build it first (see the header of this script)" >&2
    exit 2
  fi
done

work=$(mktemp -d /tmp/xsrc-fuzz.XXXXXX)
shm=$(mktemp -d /dev/shm/xsrc-fuzz.XXXXXX)   # the per-input device arenas
artifacts=${XSRC_FUZZ_ARTIFACTS:-$work/artifacts}
mkdir -p "$artifacts"
trap 'rm -rf "$shm"' EXIT

export XSRC_FUZZ_SHM_DIR=$shm
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1:allocator_may_return_null=0
export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1

# fuzz NAME BIN CORPUS SECONDS: 0 when it found nothing.
fuzz() {
  local name=$1 target=$2 corpus=$3 secs=$4
  mkdir -p "$work/$name"
  cp "$corpus"/* "$work/$name/"
  "$target" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -max_len=16384 -detect_leaks=1 -print_final_stats=1 \
    -artifact_prefix="$artifacts/$name-" "$work/$name" >"$work/$name.log" 2>&1
  local rc=$?
  echo "== $name ($secs s)"
  grep -E '^(#[0-9]+ +DONE|stat::|Done )' "$work/$name.log"
  if [ $rc -ne 0 ] || ls "$artifacts/$name-"* >/dev/null 2>&1; then
    tail -n 60 "$work/$name.log"
    echo "run.sh: FINDING in $name (fuzzer exit $rc); full log: $work/$name.log"
    for f in "$artifacts/$name-"*; do
      [ -e "$f" ] || continue
      echo "reproducer: $f"
      echo "  replay: XSRC_FUZZ_TRACE=1 $target $f"
    done
    return 1
  fi
}

cm_seconds=$((seconds / 3)); [ $cm_seconds -gt 0 ] || cm_seconds=1
uverbs_seconds=$((seconds - cm_seconds)); [ $uverbs_seconds -gt 0 ] || uverbs_seconds=1
status=0
fuzz commands "$bin" "$here/corpus" $uverbs_seconds || status=1
fuzz cm "$cm_bin" "$here/corpus-cm" $cm_seconds || status=1
if [ $status -ne 0 ]; then
  exit 1
fi
echo "run.sh: no finding in ${seconds} s"
rm -rf "$work"
