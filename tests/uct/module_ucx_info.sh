#!/bin/bash
# The shim as a UCX transport, seen by UCX's own ucx_info (issue 6):
#   module_ucx_info.sh LIBXSRC_UCT FAKE_UCP_VERSION_LIB
# - preloaded into ucx_info, libxsrc-uct registers a component and transport "xsrc" that
#   ucx_info -d lists on xsrc0:1, next to UCX's own transports; ucx_info -c still works;
# - without the preload there is no xsrc transport (the listing comes from the library);
# - in a process whose UCX reports another version (a preloaded stand-in for libucp's
#   ucp_get_version saying 1.14.0) or with XSRC_UCT_REGISTER=0, it stays out, says why in one
#   line (XSRC_UCT_DEBUG=1), and ucx_info still lists UCX's transports.
# Every ucx_info must exit 0: also no crash when the library unregisters at exit.
set -u
lib=$1; fake=$2
. "$(dirname "$0")/ucx_info_lib.sh"

# run NAME ARGS -- ENV...: ucx_info_run, with the shim saying why it stays out.
run() { ucx_info_run "$@" XSRC_UCT_DEBUG=1; }
lists_xsrc() { grep -A1 -E '^# +Transport: xsrc$' "$dir/$1.out" | grep -qE '^# +Device: xsrc0:1$'; }
lists_ucx() {  # UCX's built-in transports are listed
  grep -qE '^# +Transport: self$' "$dir/$1.out" && grep -qE '^# +Transport: posix$' "$dir/$1.out"
}

run plain -d --
exited_0 plain
lists_ucx plain || bad plain "UCX's transports are not listed"
lists_xsrc plain && bad plain "xsrc is listed without the library preloaded"

run preloaded -d -- LD_PRELOAD="$lib"
exited_0 preloaded
lists_xsrc preloaded || bad preloaded "no 'Transport: xsrc' on 'Device: xsrc0:1'"
grep -qE '^# +Component: xsrc$' "$dir/preloaded.out" || bad preloaded "no 'Component: xsrc'"
lists_ucx preloaded || bad preloaded "UCX's own transports are no longer listed"
grep -q 'registered component and transport "xsrc" with UCX 1\.13\.' "$dir/preloaded.err" ||
  bad preloaded "the library did not report its registration"

run config -c -- LD_PRELOAD="$lib"
exited_0 config
grep -q '^UCX_' "$dir/config.out" || bad config "ucx_info -c printed no configuration"

run mismatch -d -- LD_PRELOAD="$fake $lib"
exited_0 mismatch
grep -q 'not registering with UCX: UCX 1\.14\.0 is not 1\.13\.x' "$dir/mismatch.err" ||
  bad mismatch "no 'not registering' line for UCX 1.14.0"
lists_xsrc mismatch && bad mismatch "xsrc is listed although UCX says 1.14.0"
grep -qE '^# +Component: xsrc$' "$dir/mismatch.out" && bad mismatch "the xsrc component is listed"
lists_ucx mismatch || bad mismatch "UCX's own transports are no longer listed"

run disabled -d -- LD_PRELOAD="$lib" XSRC_UCT_REGISTER=0
exited_0 disabled
grep -q 'not registering with UCX: XSRC_UCT_REGISTER=0' "$dir/disabled.err" || bad disabled "no 'not registering' line"
lists_xsrc disabled && bad disabled "xsrc is listed although XSRC_UCT_REGISTER=0"
lists_ucx disabled || bad disabled "UCX's own transports are no longer listed"

if [ $fail -ne 0 ]; then
  for f in "$dir"/*.err; do echo "== $(basename "$f")"; cat "$f"; done
  echo "== preloaded.out (Component/Transport/Device lines)"; grep -E 'Component:|Transport:|Device:' "$dir/preloaded.out"
  exit 1
fi
grep -B1 -A2 -E '^# +Transport: xsrc$' "$dir/preloaded.out"
echo "ok: listed when preloaded; out for UCX 1.14.0 and XSRC_UCT_REGISTER=0"
