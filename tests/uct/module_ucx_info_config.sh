#!/bin/bash
# The transport's configuration table (UCX_XSRC_*, uct/src/rc_iface_config.cpp) as UCX's own
# ucx_info shows it, with libxsrc-uct preloaded under `xsrc run`:
#   module_ucx_info_config.sh LIBXSRC_UCT
# - ucx_info -c -f lists every UCX_XSRC_* field, UCX_XSRC_RX_QUEUE_LEN=64 with its help text
#   right above it; without the preload there is no UCX_XSRC_* at all;
# - with UCX_XSRC_RX_QUEUE_LEN=16, ucx_info -c shows 16;
# - ucx_info -d shows the xsrc transport's put_short <= 256, and <= 128 with UCX_XSRC_MAX_SHORT=128.
# Every ucx_info must exit 0.
set -u
lib=$1
. "$(dirname "$0")/ucx_info_lib.sh"

# run NAME ARGS -- ENV...: ucx_info_run, which must exit 0.
run() { ucx_info_run "$@"; exited_0 "$1"; }
# The comment block right above the line `UCX_$2=...` in $dir/$1.out.
help_of() { awk -v v="UCX_$2=" 'index($0, v) == 1 { printf "%s", block; exit } /^#/ { block = block $0 "\n"; next } { block = "" }' "$dir/$1.out"; }
# The lines of the xsrc transport's section of ucx_info -d, in $dir/$1.out.
xsrc_section() { awk '/^# +Transport: / { on = ($3 == "xsrc") } on' "$dir/$1.out"; }

run full -c -f -- LD_PRELOAD="$lib"
for field in TRANSPORT RX_QUEUE_LEN SQ_LEN TX_OPS TX_BUFS SEG_SIZE MAX_EPS MAX_SHORT MAX_SGE CQ_SLACK XRC_RX_MEM_MAX; do
  grep -q "^UCX_XSRC_$field=" "$dir/full.out" || bad full "UCX_XSRC_$field is not listed"
done
grep -qx 'UCX_XSRC_RX_QUEUE_LEN=64' "$dir/full.out" || bad full "no UCX_XSRC_RX_QUEUE_LEN=64"
help_of full XSRC_RX_QUEUE_LEN | grep -q '^# *Receives posted per endpoint for its peer' ||
  bad full "UCX_XSRC_RX_QUEUE_LEN's help text is not above it"

run plain -c -f --
grep -q '^UCX_XSRC_' "$dir/plain.out" && bad plain "UCX_XSRC_* listed without the library preloaded"

run rxq16 -c -- LD_PRELOAD="$lib" UCX_XSRC_RX_QUEUE_LEN=16
grep -qx 'UCX_XSRC_RX_QUEUE_LEN=16' "$dir/rxq16.out" || bad rxq16 "no UCX_XSRC_RX_QUEUE_LEN=16"

run devices -d -- LD_PRELOAD="$lib"
xsrc_section devices | grep -qE '^# +put_short: <= 256$' || bad devices "the xsrc transport's put_short is not <= 256"

run short128 -d -- LD_PRELOAD="$lib" UCX_XSRC_MAX_SHORT=128
xsrc_section short128 | grep -qE '^# +put_short: <= 128$' ||
  bad short128 "with UCX_XSRC_MAX_SHORT=128 the xsrc transport's put_short is not <= 128"

if [ $fail -ne 0 ]; then
  for f in "$dir"/*.err; do echo "== $(basename "$f")"; cat "$f"; done
  echo "== full.out (UCX_XSRC_*)"; grep -B8 '^UCX_XSRC_RX_QUEUE_LEN=' "$dir/full.out"
  echo "== short128.out (xsrc section)"; xsrc_section short128
  exit 1
fi
help_of full XSRC_RX_QUEUE_LEN
grep -x 'UCX_XSRC_RX_QUEUE_LEN=64' "$dir/full.out"
xsrc_section short128 | grep -E 'put_short'
echo "ok: UCX_XSRC_* listed with help, set from the environment, and put_short follows MAX_SHORT"
