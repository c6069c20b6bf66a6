#!/usr/bin/python3
"""A responder that never accepts anything: it plays ibv_rc_pingpong's
server in the TCP exchange (announcing QP number QPN at SRC_IPV4's
IPv4-mapped GID), then answers every RoCE v2 request to that QP with a PSN
sequence NAK for the request's own PSN, as a peer that keeps expecting the
same PSN would. Its ICRCs come from icrc_check.py, not from xsrc.

  nak_responder.py IFNAME SRC_IPV4 TCP_PORT QPN

It stops once no request came for 2 s after the first one, and prints
"requests PSN N" for each PSN it was asked, in the order first seen.
"""
import os
import select
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from icrc_check import icrc  # noqa: E402

ETH_P_IP = 0x0800
IP_MTU_DISCOVER = 10
IP_PMTUDISC_DO = 2
ROCE_PORT = 4791
RC_ACKNOWLEDGE = 0x11
NAK_PSN_SEQUENCE = 0x60  # AETH syndrome: NAK (011b), code 0
# The exchange ibv_rc_pingpong does: "LID:QPN:PSN:GID" and a NUL.
MSG_BYTES = len('0000:000000:000000:00000000000000000000000000000000') + 1


def exchange(port, qpn, src):
    """ibv_rc_pingpong's server side: returns the client's QP number."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(('0.0.0.0', port))
        ls.listen(1)
        conn, _ = ls.accept()
        with conn:
            got = b''
            while len(got) < MSG_BYTES:
                chunk = conn.recv(MSG_BYTES - len(got))
                if not chunk:
                    raise SystemExit('nak_responder: the client hung up')
                got += chunk
            client_qpn = int(got.split(b':')[1], 16)
            gid = (b'\0' * 10 + b'\xff\xff' + socket.inet_aton(src)).hex()
            mine = '%04x:%06x:%06x:%s' % (0, qpn, 0, gid)
            conn.sendall(mine.encode() + b'\0')
            conn.recv(16)  # "done"
    return client_qpn


def nak(out, src, dst, client_qpn, psn):
    bth = struct.pack('>BBHII', RC_ACKNOWLEDGE, 0, 0xFFFF, client_qpn & 0xFFFFFF, psn & 0xFFFFFF)
    aeth = struct.pack('>I', NAK_PSN_SEQUENCE << 24)
    body = bth + aeth
    udp_len = 8 + len(body) + 4
    sport = out.getsockname()[1]
    # What the kernel puts in front of it: an unconnected socket with DF
    # set sends IPv4 ID 0 (TOS, TTL and the checksums are masked).
    ip = struct.pack('>BBHHHBBH4s4s', 0x45, 0, 20 + udp_len, 0, 0x4000, 64, 17, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    udp = struct.pack('>HHHH', sport, ROCE_PORT, udp_len, 0)
    out.sendto(body + struct.pack('<I', icrc(ip + udp + body)), (dst, ROCE_PORT))


def main():
    ifname, src, tcp_port, qpn = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4], 0)
    sniff = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IP))
    sniff.bind((ifname, ETH_P_IP))
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    out.bind((src, 0))
    client_qpn = exchange(tcp_port, qpn, src)
    print('client QP 0x%06x' % client_qpn, flush=True)

    counts = {}
    last = None
    while True:
        wait = 30.0 if last is None else 2.0 - (time.monotonic() - last)
        if wait <= 0 or not select.select([sniff], [], [], wait)[0]:
            break
        frame, (_, _, pkttype, _, _) = sniff.recvfrom(65536)
        if pkttype == socket.PACKET_OUTGOING or len(frame) < 20 or frame[0] >> 4 != 4:
            continue
        ihl = (frame[0] & 0x0F) * 4
        if frame[9] != socket.IPPROTO_UDP or len(frame) < ihl + 8 + 12:
            continue
        dport = struct.unpack_from('>H', frame, ihl + 2)[0]
        if dport != ROCE_PORT:
            continue
        opcode, _, _, dest, psn = struct.unpack_from('>BBHII', frame, ihl + 8)
        if dest & 0xFFFFFF != qpn or opcode >> 5 != 0:  # RC requests only
            continue
        psn &= 0xFFFFFF
        counts[psn] = counts.get(psn, 0) + 1
        last = time.monotonic()
        nak(out, src, socket.inet_ntoa(frame[12:16]), client_qpn, psn)
    for psn, n in counts.items():
        print('requests PSN %d %d' % (psn, n), flush=True)


if __name__ == '__main__':
    main()
