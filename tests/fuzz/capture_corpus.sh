#!/bin/bash
# Captures the fuzz seed corpus: the real command streams of rdma-core's
# pingpong examples on xsrc0, one file per context (NAME-0, NAME-1, ... in the
# order the contexts were opened) and one of all contexts in arrival order
# (NAME-all), as xsrcd writes them with XSRC_CAPTURE_DIR set (record format:
# xsrcd/command_capture.h).
#   [XSRC_FUZZ_BIN=build-fuzz/bin/xsrcd_fuzz_commands] tests/fuzz/capture_corpus.sh [BUILD_DIR [OUT_DIR]]
# BUILD_DIR: a normal (gcc) build with xsrcd, xsrc and the provider built
# (default: build); with device_command_file_test, xrc_test and verbs_ex_test
# built there, their streams are captured too. OUT_DIR: default
# tests/fuzz/corpus; files of the same name are replaced, others (the
# synthetic-* seeds of xsrcd_fuzz_seeds, the regress-* inputs of past
# findings) are left alone. With XSRC_FUZZ_BIN, only
# the streams that add coverage are kept (libFuzzer's -merge). Needs root.
# The device lives in a private mount namespace (its own /run, /dev/shm and
# /dev/infiniband), so nothing of it is visible outside.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
mkdir -p "${2:-$here/corpus}"
out=$(cd "${2:-$here/corpus}" && pwd)

if [ "${XSRC_CAPTURE_PRIVATE_NS:-}" != 1 ]; then
  [ -d /dev/infiniband ] || mkdir /dev/infiniband
  exec unshare -m --propagation private env XSRC_CAPTURE_PRIVATE_NS=1 bash -c '
    mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /dev/shm &&
    mount -t tmpfs tmpfs /dev/infiniband && exec "$0" "$@"' "$0" "$build" "$out"
fi

capture=$(mktemp -d)
raw=$(mktemp -d)
log=$(mktemp)
cleanup() { "$build/bin/xsrc" down >/dev/null 2>&1 || true; rm -rf "$capture" "$raw" "$log"; }
trap cleanup EXIT
# Each example gets a new device (and daemon), as a replay does: ring offsets
# and object numbers in the streams are then those a replay hands out.
device_up() { XSRC_CAPTURE_DIR=$capture "$build/bin/xsrc" up --name xsrc0 >/dev/null; }
device_up
eval "$("$build/bin/xsrc" env)"

port=18900
keep_all=1
# capture NAME SCRIPT ARGS...: runs one example, keeps its contexts' streams
# as NAME-0, NAME-1, ... in the order the contexts were opened.
capture() {
  local name=$1 script=$2; shift 2
  port=$((port + 1))
  rm -f "$capture"/*
  "$build/bin/xsrc" down >/dev/null
  device_up
  if ! "$script" "$port" "$@" >"$log" 2>&1; then
    echo "capture_corpus: $name failed:"; cat "$log"; exit 1
  fi
  local i=0 f
  for f in $(ls "$capture" | grep '^ctx-' | sort -t- -k3 -n); do
    cp "$capture/$f" "$raw/$name-$i"
    i=$((i + 1))
  done
  # And all of them in arrival order, as one stream: replayed into one
  # context, the events one process raises on another's objects find them.
  if [ "$keep_all" = 1 ]; then cp "$capture"/all-* "$raw/$name-all"; fi
  echo "$name: $i contexts, $(cat "$capture"/ctx-* | wc -c) bytes"
}

pingpong=$src/tests/traffic/pingpong.sh
xsrq=$src/tests/xrc/xsrq_pingpong.sh
capture rc "$pingpong" ibv_rc_pingpong -g 1 -n 20
capture rc-events "$pingpong" ibv_rc_pingpong -g 1 -n 20 -e
capture uc "$pingpong" ibv_uc_pingpong -g 1 -n 20
capture ud "$pingpong" ibv_ud_pingpong -g 1 -s 512 -n 20
capture ud-events "$pingpong" ibv_ud_pingpong -g 1 -s 512 -n 20 -e
capture srq "$pingpong" ibv_srq_pingpong -g 1 -q 4 -n 20
capture srq-events "$pingpong" ibv_srq_pingpong -g 1 -q 4 -n 20 -e
capture xsrq "$xsrq" 2 -g 1 -n 20
capture xsrq-events "$xsrq" 2 -g 1 -n 20 -e
# Single programs: the extended QUERY_DEVICE, which the pingpongs do not send.
one_program() { shift; "$@"; }   # capture passes a port first
keep_all=0   # one process, or many unrelated contexts: nothing to gain
capture devinfo one_program ibv_devinfo -v
# Test programs of this tree, when built: malformed commands on a real
# command file, XRC domains and OPEN_QP, the extended verbs.
export XSRC="$build/bin/xsrc" XSRC_BIN="$build/bin" XSRC_RUNDIR=/run/xsrc
for prog in device_command_file_test xrc_test verbs_ex_test; do
  if [ -x "$build/bin/$prog" ]; then
    capture "${prog%_test}" one_program "$build/bin/$prog"
  fi
done

"$build/bin/xsrc" down >/dev/null
if [ -n "${XSRC_FUZZ_BIN:-}" ]; then
  merged=$raw/.merged
  mkdir "$merged"
  XSRC_FUZZ_SHM_DIR=/dev/shm "$XSRC_FUZZ_BIN" -merge=1 "$merged" "$raw" >"$log" 2>&1 ||
    { cat "$log"; exit 1; }
  for f in "$raw"/*; do
    if [ -e "$merged/$(sha1sum <"$f" | cut -d' ' -f1)" ]; then cp "$f" "$out/"; fi
  done
else
  cp "$raw"/* "$out/"
fi
chmod 644 "$out"/*
echo "$(ls "$out" | wc -l) files in $out"
