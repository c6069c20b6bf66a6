#!/bin/bash
# A responder that answers every request with a PSN sequence NAK for that
# same PSN (tests/wire/nak_responder.py on host 1, playing ibv_rc_pingpong's
# server): the requester must go back once per try, count those tries
# against retry_cnt as rxe does, and end in IBV_WC_RETRY_EXC_ERR after
# retry_cnt + 1 transmissions of the message; it must not resend at every
# NAK for ever. ibv_rc_pingpong's retry_cnt is 7 and its timeout 14
# (67 ms): 8 transmissions, alternately sent again by a NAK and by the
# timer (a NAK for a try the NAK itself caused starts no second one).
#   rc_wire_nak_loop.sh PORT
set -u
port=$1
export XSRC_HOSTS_PREFIX=xsrcnk
. "$(dirname "$0")/lib.sh"
responder=$here/../wire/nak_responder.py

hosts_up
"$hosts" run 1 timeout 60 python3 "$responder" "$(host_if 1)" 10.77.0.1 "$port" 0xabcde \
  >"$dir/server" 2>&1 &
server=$!
wait_listen
start=$SECONDS
timeout 60 "$hosts" run 2 ibv_rc_pingpong -d xsrc0 -g 1 -p "$port" -s 1024 -n 1 10.77.0.1 >"$dir/client" 2>&1
rc=$?
wait "$server"; src=$?; server=
echo "== client ($((SECONDS - start)) s)"; cat "$dir/client"
echo "== responder"; cat "$dir/server"
[ $src -eq 0 ] || bad "the responder failed (exit $src)"
[ $rc -ne 0 ] || bad "the client succeeded against a responder that takes nothing"
[ $rc -ne 124 ] || bad "the client hung"
grep -q "transport retry counter exceeded (12)" "$dir/client" || bad "no IBV_WC_RETRY_EXC_ERR"
tries=$(sed -n 's/^requests PSN [0-9]* \([0-9]*\)$/\1/p' "$dir/server" | head -1)
[ "$tries" = 8 ] || bad "the message went out ${tries:-0} times, not retry_cnt + 1 = 8"
finish rc_wire_nak_loop
