# Sourced by the scripts that start an rdma_cm server and then its client
# (pair.sh, device_removal.sh, the hosts' cm_wire.sh, the isolation suite's
# uid_run.sh): the client connects only once the server listens. A fixed
# second was not always enough on a loaded machine: the client's request
# found no listener and was REJECTED.
#
# cm_listeners XSRC...: the listener count that `XSRC... status` prints
# (XSRC may be a command prefix, e.g. one that enters a host of the
# harness); empty when it prints none.
cm_listeners() {
  "$@" status | sed -n 's/^rdma_cm .*cm_listeners=\([0-9]*\).*/\1/p'
}

# await_listener BEFORE XSRC...: returns 0 once the count exceeds BEFORE,
# 1 when it has not within 10 s; `listeners_now` holds the last count.
await_listener() {
  local before=$1
  shift
  for _ in $(seq 100); do
    listeners_now=$(cm_listeners "$@")
    [ -n "$listeners_now" ] && [ "$listeners_now" -gt "${before:-0}" ] && return 0
    sleep 0.1
  done
  return 1
}
