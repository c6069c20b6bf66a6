#!/bin/bash
# A lost last packet: host 2's link drops the RDMA WRITE LAST packet of
# three of twelve WRITEs of 64 KiB (64 packets each: FIRST, MIDDLE, LAST),
# which the requester sends one at a time with a local ACK timeout of 4.3 s
# (timeout 20) and retry_cnt 0. Nothing follows a lost LAST, so the
# responder sees no gap and sends no NAK; each WRITE must still complete
# with its data in place before that timer could have run out, and without
# a retry to spend: after a few milliseconds without news the requester
# sends its last packet again, asking for an ACK, which is no retry. And a
# lost NAK: host 2's link also drops one MIDDLE packet, and host 1's link
# the sequence NAK that answers it; the responder NAKs a gap once, so the
# packet sent again to ask for an ACK gets no answer either, and the
# requester goes back by itself, uncounted, a few milliseconds later. The
# drops are counted so the test knows the link really lost them.
#   rc_wire_tail_loss.sh PORT RC_WIRE_VERBS
set -u
port=$1
verbs=$2
export XSRC_HOSTS_PREFIX=xsrctl
. "$(dirname "$0")/lib.sh"

hosts_up
need_nft
# Host 2's veth cuts its GSO datagrams into packets first, so the hook sees
# each packet, and the bridge's port to host 1 drops only what is asked.
segmentation 2 off
ns=$XSRC_HOSTS_PREFIX-br
# The BTH's opcode is the first byte after the UDP header (bit 64 of @th):
# 0x08 is RC RDMA WRITE LAST, 0x07 MIDDLE, 0x11 Acknowledge, whose AETH
# (bit 160) starts with the syndrome, 0x60 for a PSN sequence NAK. Each
# numgen counts the packets of its rule's kind.
ip netns exec "$ns" nft -f - <<NFT || { echo "FAIL: nft"; exit 1; }
table netdev tailloss {
  chain out {
    type filter hook egress device port1 priority 0;
    udp dport 4791 @th,64,8 0x08 numgen inc mod 1000000 { 1, 5, 9 } counter drop
    udp dport 4791 @th,64,8 0x07 numgen inc mod 1000000 300 counter drop
  }
}
NFT
ns1=$XSRC_HOSTS_PREFIX-1
ip netns exec "$ns1" nft -f - <<NFT || { echo "FAIL: nft"; exit 1; }
table netdev naks {
  chain out {
    type filter hook egress device "$(host_if 1)" priority 0;
    udp dport 4791 @th,64,8 0x11 @th,160,8 0x60 numgen inc mod 1000000 0 counter drop
  }
}
NFT
verbs_pair 200 "$verbs" 1 tailloss
pair_passed
lasts=$(nft_drops "$ns" tailloss 1)
middles=$(nft_drops "$ns" tailloss 2)
naks=$(nft_drops "$ns1" naks)
echo "the links dropped $lasts RDMA WRITE LAST packets, $middles MIDDLE and $naks sequence NAK"
[ "${lasts:-0}" -eq 3 ] || bad "the link dropped ${lasts:-0} LAST packets, not the 3 planned"
[ "${middles:-0}" -eq 1 ] || bad "the link dropped ${middles:-0} MIDDLE packets, not the 1 planned"
[ "${naks:-0}" -eq 1 ] || bad "the link dropped ${naks:-0} sequence NAKs, not the 1 planned"
finish rc_wire_tail_loss
