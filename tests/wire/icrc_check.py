#!/usr/bin/python3
"""An ICRC checker for RoCE v2 written from IBTA Annex A17.3.3, sharing no
code with xsrc: reads a pcap file (Ethernet or Linux cooked captures) and
checks every UDP/4791 packet's ICRC.

  icrc_check.py FILE.pcap     prints "N packets, M bad ICRC"; exit 1 if M > 0
                              or N is 0
  icrc_check.py --hex HEX     the ICRC (as a hex number) of an IP packet
                              given without its ICRC
"""
import struct
import sys
import zlib


def icrc(ip_packet):
    """CRC-32 over 8 bytes of 0xFF and the packet with the variant fields
    (IPv4 TOS/TTL/checksum, IPv6 class/flow/hop limit, UDP checksum, BTH
    FECN/BECN/resv6) replaced by ones."""
    b = bytearray(ip_packet)
    if b[0] >> 4 == 4:
        ihl = (b[0] & 0x0F) * 4
        b[1] = 0xFF
        b[8] = 0xFF
        b[10:12] = b'\xff\xff'
    else:
        ihl = 40
        b[0] |= 0x0F
        b[1:4] = b'\xff\xff\xff'
        b[7] = 0xFF
    b[ihl + 6:ihl + 8] = b'\xff\xff'
    b[ihl + 8 + 4] = 0xFF
    return zlib.crc32(b'\xff' * 8 + bytes(b)) & 0xFFFFFFFF


def packets(path):
    with open(path, 'rb') as f:
        data = f.read()
    magic = struct.unpack('<I', data[:4])[0]
    endian = '<' if magic in (0xA1B2C3D4, 0xA1B23C4D) else '>'
    linktype = struct.unpack(endian + 'I', data[20:24])[0]
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(endian + 'IIII', data[off:off + 16])
        frame = data[off + 16:off + 16 + incl]
        off += 16 + incl
        if linktype == 1:  # Ethernet
            ethertype, start = struct.unpack('>H', frame[12:14])[0], 14
        elif linktype == 113:  # Linux cooked
            ethertype, start = struct.unpack('>H', frame[14:16])[0], 16
        else:
            raise SystemExit('unsupported link type %d' % linktype)
        if ethertype not in (0x0800, 0x86DD):
            continue
        ip = frame[start:]
        if ethertype == 0x0800:
            if ip[9] != 17:
                continue
            ihl = (ip[0] & 0x0F) * 4
            ip = ip[:struct.unpack('>H', ip[2:4])[0]]
        else:
            if ip[6] != 17:
                continue
            ihl = 40
            ip = ip[:40 + struct.unpack('>H', ip[4:6])[0]]
        if struct.unpack('>H', ip[ihl + 2:ihl + 4])[0] != 4791:
            continue
        yield ip


def main():
    if len(sys.argv) == 3 and sys.argv[1] == '--hex':
        print('0x%08x' % icrc(bytes.fromhex(sys.argv[2])))
        return 0
    total = bad = 0
    for ip in packets(sys.argv[1]):
        total += 1
        want = struct.unpack('<I', ip[-4:])[0]
        if icrc(ip[:-4]) != want:
            bad += 1
    print('%d packets, %d bad ICRC' % (total, bad))
    return 1 if bad or not total else 0


if __name__ == '__main__':
    sys.exit(main())
