#!/bin/bash
# RC across hosts on the wire, beyond the pingpongs (rc_wire_verbs.cpp):
# RDMA WRITE, WRITE with immediate and SEND with immediate from 1 byte to
# 1 MiB with the data checked at the responder; READ, atomics and ATOMIC
# WRITE; XRC SEND into an XRC SRQ, WRITE, READ and atomics; an unknown rkey
# and a write past the MR (IBV_WC_REM_ACCESS_ERR, the next request flushed,
# both QPs in ERR); SEND with Invalidate of a type 2 window (then a WRITE
# through it is refused); RNR NAKs that exhaust rnr_retry and RNR NAKs that
# a late receive ends. Over the IPv4-mapped (-g 1) and the IPv6 (-g 2) GID. The
# -g 1 run is captured: every packet decodes with tshark's InfiniBand
# dissector with nothing malformed, every ICRC checks (tests/wire/
# icrc_check.py), and SEND Only with Invalidate, ATOMIC WRITE and the XRC
# READ and atomic opcodes are there.
#   rc_wire_verbs.sh PORT PROGRAM
set -u
port=$1
prog=$2
export XSRC_HOSTS_PREFIX=xsrcrv
. "$(dirname "$0")/lib.sh"

hosts_up
for gid in 1 2; do
  if [ "$gid" = 1 ]; then
    start_capture "$dir/wire.pcap" 65536
  fi
  verbs_pair 200 "$prog" "$gid"
  echo "== -g $gid client"; cat "$dir/client"
  echo "== -g $gid server"; cat "$dir/server"
  [ $rc -eq 0 ] || bad "-g $gid: client exit $rc"
  [ $src -eq 0 ] || bad "-g $gid: server exit $src"
  if [ "$gid" = 1 ]; then
    stop_capture "$dir/wire.pcap"
    check_capture "$dir/wire.pcap"
    # SEND Only with Invalidate 0x17, ATOMIC WRITE 0x1D; XRC RDMA WRITE First
    # 0xA6, READ Request 0xAC, READ responses First 0xAD and Last 0xAF,
    # ATOMIC Acknowledge 0xB2, CmpSwap 0xB3, FetchAdd 0xB4.
    for opcode in 23 29 166 172 173 175 178 179 180; do
      n=$(tshark -r "$dir/wire.pcap" -Y "infiniband.bth.opcode == $opcode" 2>/dev/null | wc -l)
      [ "$n" -gt 0 ] || bad "no packet of opcode $opcode on the wire"
    done
  fi
done
"$hosts" run 1 "$XSRC" status
finish rc_wire_verbs
