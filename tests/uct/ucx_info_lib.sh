# Sourced by the ucx_info tests: runs UCX's ucx_info under `xsrc run` and
# keeps its outputs. Needs $XSRC; sets $dir (removed at exit) and $fail.
xsrc=${XSRC:?XSRC must name the xsrc tool}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0

# ucx_info_run NAME ARGS -- ENV...: ucx_info ARGS under `xsrc run` with ENV;
# stdout, stderr and the exit code in $dir/NAME.out, .err and .rc.
ucx_info_run() {
  local name=$1 args=() ; shift
  while [ "$1" != -- ]; do args+=("$1"); shift; done; shift
  timeout 60 "$xsrc" run -- env "$@" ucx_info "${args[@]}" >"$dir/$name.out" 2>"$dir/$name.err"
  echo $? >"$dir/$name.rc"
}
bad() { echo "FAIL ($1): $2"; fail=1; }
exited_0() { [ "$(cat "$dir/$1.rc")" = 0 ] || bad "$1" "ucx_info exited $(cat "$dir/$1.rc")"; }
