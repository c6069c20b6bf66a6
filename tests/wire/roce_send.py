#!/usr/bin/python3
"""Sends one RoCE v2 UD SEND Only packet from a plain UDP socket, its ICRC
computed by icrc_check.py (not by xsrc), or deliberately wrong.

  roce_send.py SRC_IPV4 DST_IPV4 QPN QKEY [--bad-icrc]

The socket is unconnected with path-MTU discovery on, so the kernel sends
IPv4 ID 0 with DF set and the IP header is predictable, as RoCE v2 needs.
"""
import os
import socket
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from icrc_check import icrc  # noqa: E402

IP_MTU_DISCOVER = 10
IP_PMTUDISC_DO = 2


def main():
    src, dst, qpn, qkey = sys.argv[1], sys.argv[2], int(sys.argv[3], 0), int(sys.argv[4], 0)
    bad = '--bad-icrc' in sys.argv[5:]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    s.bind((src, 0))
    sport = s.getsockname()[1]
    payload = b'injected'
    bth = struct.pack('>BBHII', 0x64, 0, 0xFFFF, qpn & 0xFFFFFF, 0)
    deth = struct.pack('>II', qkey, 0x000101)
    body = bth + deth + payload
    udp_len = 8 + len(body) + 4
    ip = struct.pack('>BBHHHBBH4s4s', 0x45, 0, 20 + udp_len, 0, 0x4000, 64, 17, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    udp = struct.pack('>HHHH', sport, 4791, udp_len, 0)
    crc = icrc(ip + udp + body)
    if bad:
        crc ^= 0x00010000
    s.sendto(body + struct.pack('<I', crc), (dst, 4791))
    return 0


if __name__ == '__main__':
    sys.exit(main())
