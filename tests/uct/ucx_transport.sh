#!/bin/bash
# UCX 1.13's own verbs transports (rc_verbs, ud_verbs: Debian's libuct_ib), unmodified, on
# xsrc0. They read /sys/class/infiniband directly: `xsrc run` gives them the device there.
#
#   ucx_transport.sh info                    `ucx_info -d` lists xsrc0:1 with rc_verbs and ud_verbs
#   ucx_transport.sh perftest PORT ARGS...   an ucx_perftest server and client pair with
#                                            ARGS -d xsrc0:1 -p PORT; both must exit 0 and the
#                                            client must report every iteration (-n)
set -u
xsrc=${XSRC:?XSRC must name the xsrc program}
fail() { echo "ucx_transport.sh: $*" >&2; exit 1; }
command -v ucx_info >/dev/null && command -v ucx_perftest >/dev/null || fail "ucx-utils is not installed"

case ${1:-} in
info)
  out=$("$xsrc" run -- ucx_info -d 2>&1) || { echo "$out"; fail "ucx_info -d failed"; }
  # "# Transport: rc_verbs" is followed by its "# Device: xsrc0:1" lines.
  tls=$(awk '/# *Transport:/{tl=$NF} /# *Device:/{if ($NF == "xsrc0:1") print tl}' <<<"$out" | sort -u)
  for want in rc_verbs ud_verbs; do
    grep -qx "$want" <<<"$tls" || { echo "$out"; fail "ucx_info -d: no $want on xsrc0:1"; }
  done
  echo "xsrc0:1:" $tls
  ;;
perftest)
  [ $# -ge 3 ] || fail "usage: $0 perftest PORT ARGS..."
  port=$2
  shift 2
  iters=$(awk '{for (i = 1; i < NF; ++i) if ($i == "-n") print $(i + 1)}' <<<"$*")
  [ -n "$iters" ] || fail "give the iteration count (-n)"
  tmp=$(mktemp -d)
  server=
  trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$tmp"' EXIT
  args=("$@" -d xsrc0:1 -p "$port")
  "$xsrc" run -- timeout 60 ucx_perftest "${args[@]}" >"$tmp/server" 2>&1 &
  server=$!
  for _ in $(seq 200); do
    ss -ltn 2>/dev/null | grep -q ":$port " && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.05
  done
  "$xsrc" run -- timeout 60 ucx_perftest "${args[@]}" localhost >"$tmp/client" 2>&1
  client_rc=$?
  wait "$server"
  server_rc=$?
  server=
  done_iters=$(awk '/^Final:/{print $2}' "$tmp/client")
  if [ "$client_rc" -ne 0 ] || [ "$server_rc" -ne 0 ] || [ "$done_iters" != "$iters" ]; then
    echo "--- server (exit $server_rc)"; cat "$tmp/server"
    echo "--- client (exit $client_rc)"; cat "$tmp/client"
    fail "ucx_perftest ${args[*]}: server $server_rc, client $client_rc, iterations '${done_iters}' of $iters"
  fi
  grep '^Final:' "$tmp/client"
  ;;
*)
  fail "usage: $0 info | perftest PORT ARGS..."
  ;;
esac
