#!/bin/bash
# RDMA READ past lost responses: host 1's link drops four datagrams of READ
# Response MIDDLE packets (opcode 0x0E; with UDP GSO one datagram holds a
# run of up to 64 of them, cut into packets after the hook) over four
# READs of 1 MiB; the requester's
# local ACK timeout is 4.3 s (timeout 20). Each READ must complete with its
# data intact before that timer could have run out: the requester asks again
# from the first missing response as soon as a later response shows the gap
# (as rxe does), not when the timer runs out. The drops are counted so the
# test knows the link really lost them.
#   rc_wire_read_gap.sh PORT RC_WIRE_VERBS
set -u
port=$1
verbs=$2
export XSRC_HOSTS_PREFIX=xsrcrg
. "$(dirname "$0")/lib.sh"

hosts_up
need_nft
ns=$XSRC_HOSTS_PREFIX-1
# The BTH's opcode is the first byte after the UDP header (bit 64 of @th).
# numgen counts the MIDDLE datagrams host 1 sends; four of them, apart so
# that a response asked for again is never the one dropped again (with GSO
# a READ of 1 MiB is about 17 datagrams: one drop in each of the READs;
# without, all four fall in the first READ's 1022).
ip netns exec "$ns" nft -f - <<NFT || { echo "FAIL: nft"; exit 1; }
table netdev readgap {
  chain out {
    type filter hook egress device "$(host_if 1)" priority 0;
    udp dport 4791 @th,64,8 0x0e numgen inc mod 1000000 { 5, 25, 45, 65 } counter drop
  }
}
NFT
verbs_pair 200 "$verbs" 1 readgap
pair_passed
dropped=$(nft_drops "$ns" readgap)
echo "host 1 dropped $dropped datagrams of READ responses"
[ "${dropped:-0}" -ge 3 ] || bad "the link dropped ${dropped:-0} READ responses, not the 3 or 4 planned"
"$hosts" run 2 "$XSRC" status
finish rc_wire_read_gap
