#!/bin/bash
# The UCT shim (uct/) against UCX's own transports, on this host, in one run.
#
#   bench/uct_bench.sh        (as root; brings xsrc0 up if it is not)
#
# shim:     build/bin/uct_bench — the shim's libxsrc-uct over verbs on xsrc0.
# rc_verbs: ucx_perftest -x rc_verbs -d xsrc0:1 under `xsrc run` (UCX's own IB transport
#           on the same device).
# posix:    ucx_perftest -x posix -d memory (UCX's shared-memory transport).
# Server on SERVER_CPU, client on CLIENT_CPU (default 0 and 1); each measurement REPS
# times (default 3), round-robin, ITERS iterations (default 20000); the best run counts. Latency in µs, median; am/put
# one-way, get the whole operation (ucx_perftest's conventions, which uct_bench follows).
# Bandwidth in MiB/s. Ratios are shim/peer: for latency lower is better, for bandwidth
# higher. A peer that cannot run prints n/a (its error is in the results directory).
#
# Raw outputs and the table: bench/results/uct-<timestamp>/.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${XSRC_BUILD:-$root/build}
xsrc=$build/bin/xsrc
bench=$build/bin/uct_bench
reps=${REPS:-3}
scpu=${SERVER_CPU:-0}
ccpu=${CLIENT_CPU:-1}
port=${BENCH_PORT:-19950}
results=$root/bench/results/uct-$(date +%Y%m%d-%H%M%S)

die() { echo "bench/uct_bench.sh: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "must run as root (xsrc up)"
[ -x "$xsrc" ] && [ -x "$bench" ] || die "build first: cmake --build build --target xsrc xsrcd uct_bench"
command -v ucx_perftest >/dev/null || die "ucx_perftest is not installed (apt-get install ucx-utils)"
[ "$(nproc)" -ge 2 ] || { scpu=0; ccpu=0; }

if ! "$xsrc" status 2>/dev/null | grep -q '^xsrc0 .*port=ACTIVE'; then
  "$xsrc" up --name xsrc0 >/dev/null || die "xsrc up failed"
fi
eval "$("$xsrc" env)"
export SYSFS_PATH RDMAV_DRIVERS
mkdir -p "$results"

# metric -> "size shim-test perftest-test perftest-data-layout"
metrics=(am_lat put_lat get_lat put_bw_8k put_bw_64k put_bw_1m get_bw_8k get_bw_64k get_bw_1m am_bw_4k)
declare -A spec=(
  [am_lat]="8 am_lat am_lat short"
  [put_lat]="8 put_lat put_lat short"
  [get_lat]="8 get_lat get zcopy"
  [put_bw_8k]="8192 put_bw put_bw zcopy"
  [put_bw_64k]="65536 put_bw put_bw zcopy"
  [put_bw_1m]="1048576 put_bw put_bw zcopy"
  [get_bw_8k]="8192 get_bw get zcopy"
  [get_bw_64k]="65536 get_bw get zcopy"
  [get_bw_1m]="1048576 get_bw get zcopy"
  [am_bw_4k]="4096 am_bw am_bw zcopy"
)
# Iterations: ITERS (default 20000), a tenth for 1 MiB.
iters() { local n=${ITERS:-20000}; case $1 in *_1m) echo $((n / 10)) ;; *) echo "$n" ;; esac; }

# One ucx_perftest pair; prints the figure (kind lat: median latency, bw: average MiB/s).
perftest() {
  local out=$1 kind=$2 tl=$3 dev=$4 test=$5 layout=$6 size=$7 n=$8 wrap=()
  port=$((port + 1))
  [ "$tl" = rc_verbs ] && wrap=("$xsrc" run --)
  local args=(-f -t "$test" -x "$tl" -d "$dev" -D "$layout" -s "$size" -n "$n" -p "$port")
  "${wrap[@]}" timeout 60 taskset -c "$scpu" ucx_perftest "${args[@]}" >"$out.server" 2>&1 &
  local s=$!
  for _ in $(seq 50); do ss -ltn 2>/dev/null | grep -q ":$port " && break; sleep 0.1; done
  "${wrap[@]}" timeout 60 taskset -c "$ccpu" ucx_perftest "${args[@]}" localhost >"$out.client" 2>&1
  wait $s 2>/dev/null
  local col=6
  [ "$kind" = lat ] && col=2
  awk -v c=$col '/^ +[0-9]+ +[0-9.]+ /{v=$c} END{if (v != "") print v}' "$out.client"
}

declare -A best
better() {  # better <metric> <value>: keeps the best
  local key=$1 v=$2 lower=0
  [[ $key == *_lat* ]] && lower=1
  [ -n "$v" ] || return
  if [ -z "${best[$key]:-}" ] || awk -v a="$v" -v b="${best[$key]}" -v l=$lower 'BEGIN{exit !(l ? a < b : a > b)}'; then
    best[$key]=$v
  fi
}

for ((rep = 1; rep <= reps; rep++)); do
  echo "run $rep/$reps ..." >&2
  for m in "${metrics[@]}"; do
    read -r size stest ptest layout <<<"${spec[$m]}"
    n=$(iters "$m")
    out=$results/$m.$rep
    v=$(timeout 120 "$bench" -c "$scpu,$ccpu" -n "$n" -s "$size" "$stest" 2>"$out.shim.err" | tee "$out.shim" | awk '{print $3}')
    better "$m/shim" "$v"
    kind=bw; [[ $m == *_lat ]] && kind=lat
    # rc_verbs reads fewer than 65 bytes only by bcopy (its get_zcopy minimum).
    rl=$layout; [ "$ptest" = get ] && [ "$size" -lt 65 ] && rl=bcopy
    better "$m/rc_verbs" "$(perftest "$out.rc_verbs" $kind rc_verbs xsrc0:1 "$ptest" "$rl" "$size" "$n")"
    # posix copies (no zcopy), one segment (8 KiB) at most.
    pl=bcopy; [ "$layout" = short ] && pl=short
    [ "$size" -le 8192 ] && better "$m/posix" "$(perftest "$out.posix" $kind posix memory "$ptest" "$pl" "$size" "$n")"
  done
done

ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a / b}' || echo n/a; }
{
  printf "%-12s %-6s %10s %10s %7s %10s %7s\n" metric unit shim rc_verbs ratio posix ratio
  for m in "${metrics[@]}"; do
    unit=MiB/s; [[ $m == *_lat ]] && unit=us
    s=${best[$m/shim]:-}; r=${best[$m/rc_verbs]:-}; p=${best[$m/posix]:-}
    printf "%-12s %-6s %10s %10s %7s %10s %7s\n" "$m" "$unit" "${s:-n/a}" "${r:-n/a}" "$(ratio "$s" "$r")" \
      "${p:-n/a}" "$(ratio "$s" "$p")"
  done
} | tee "$results/table.txt"
