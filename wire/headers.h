// RoCE v2 on the wire (IBTA Annex A17, as Linux rxe puts it): the IB
// transport headers (BTH and its extension headers), the opcode table, the
// IPv4/IPv6/UDP headers that carry them, the GRH a UD receive gets from the
// IP header, and the ICRC. Encode writes network byte order into a buffer
// the caller sized; decode reads it back. No allocation, no exceptions: the
// provider's data path and the daemon's receive loop both use it.
#pragma once

#include <netinet/in.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>

namespace xsrc::wire {

inline constexpr uint16_t kRoceV2Port = 4791;
inline constexpr uint16_t kDefaultPkey = 0xFFFF;
inline constexpr uint8_t kIpProtoUdp = 17;
inline constexpr size_t kBthBytes = 12;
inline constexpr size_t kDethBytes = 8;
inline constexpr size_t kRethBytes = 16;
inline constexpr size_t kAethBytes = 4;
inline constexpr size_t kAtomicEthBytes = 28;
inline constexpr size_t kAtomicAckEthBytes = 8;
inline constexpr size_t kImmDtBytes = 4;
inline constexpr size_t kIethBytes = 4;
inline constexpr size_t kXrcEthBytes = 4;
inline constexpr size_t kIcrcBytes = 4;
inline constexpr size_t kIpv4Bytes = 20;  // no options: what we send, what we accept
inline constexpr size_t kIpv6Bytes = 40;
inline constexpr size_t kUdpBytes = 8;
inline constexpr size_t kGrhBytes = 40;
inline constexpr uint32_t kQpnMask = 0xFFFFFF;
inline constexpr uint32_t kPsnMask = 0xFFFFFF;

// --- the opcode table -------------------------------------------------------

// Opcode = transport (top 3 bits) | operation (low 5 bits).
enum class Transport : uint8_t { rc = 0x00, uc = 0x20, rd = 0x40, ud = 0x60, cnp = 0x80, xrc = 0xA0 };

// Extension headers an opcode carries after the BTH (XRCETH/RDETH/DETH
// first, then RETH/AtomicETH/ImmDt/IETH, AETH/AtomicAckETH), as bits.
enum Ext : uint16_t {
	kExtRdeth = 1u << 0,
	kExtDeth = 1u << 1,
	kExtXrceth = 1u << 2,
	kExtReth = 1u << 3,
	kExtAtomicEth = 1u << 4,
	kExtAeth = 1u << 5,
	kExtAtomicAckEth = 1u << 6,
	kExtImmDt = 1u << 7,
	kExtIeth = 1u << 8,
	kExtPayload = 1u << 9,  // the opcode may carry payload
};

struct OpcodeInfo {
	const char *name;  // as IBTA spells it, e.g. "UD SEND Only"
	uint16_t ext;      // Ext bits
};

// The table entry of a defined opcode, nullptr for a reserved one.
const OpcodeInfo *opcode_info(uint8_t opcode);
// Bytes of BTH plus the extension headers `opcode` carries (0 if reserved).
size_t header_bytes(uint8_t opcode);

namespace opcode {
inline constexpr uint8_t kUdSendOnly = 0x64;
inline constexpr uint8_t kUdSendOnlyImm = 0x65;
}  // namespace opcode

// The operation of an RC, UC or XRC opcode (its low 5 bits).
namespace op {
inline constexpr uint8_t kSendFirst = 0x00;
inline constexpr uint8_t kSendMiddle = 0x01;
inline constexpr uint8_t kSendLast = 0x02;
inline constexpr uint8_t kSendLastImm = 0x03;
inline constexpr uint8_t kSendOnly = 0x04;
inline constexpr uint8_t kSendOnlyImm = 0x05;
inline constexpr uint8_t kWriteFirst = 0x06;
inline constexpr uint8_t kWriteMiddle = 0x07;
inline constexpr uint8_t kWriteLast = 0x08;
inline constexpr uint8_t kWriteLastImm = 0x09;
inline constexpr uint8_t kWriteOnly = 0x0A;
inline constexpr uint8_t kWriteOnlyImm = 0x0B;
inline constexpr uint8_t kReadRequest = 0x0C;
inline constexpr uint8_t kReadResponseFirst = 0x0D;
inline constexpr uint8_t kReadResponseMiddle = 0x0E;
inline constexpr uint8_t kReadResponseLast = 0x0F;
inline constexpr uint8_t kReadResponseOnly = 0x10;
inline constexpr uint8_t kAcknowledge = 0x11;
inline constexpr uint8_t kAtomicAcknowledge = 0x12;
inline constexpr uint8_t kCmpSwap = 0x13;
inline constexpr uint8_t kFetchAdd = 0x14;
inline constexpr uint8_t kSendLastInv = 0x16;  // with an IETH
inline constexpr uint8_t kSendOnlyInv = 0x17;
inline constexpr uint8_t kAtomicWrite = 0x1D;  // RETH and 8 bytes, answered by an ACK
}  // namespace op

// AETH syndromes (IBTA 9.7.5.2): the top 3 bits say ACK (0), RNR NAK (1)
// or NAK (3); the low 5 bits are credits, the RNR timer or the NAK code.
namespace aeth {
inline constexpr uint8_t kAck = 0x1F;  // ACK, no credit count
inline constexpr uint8_t kRnrNak = 0x20;
inline constexpr uint8_t kNakPsnSequence = 0x60;
inline constexpr uint8_t kNakInvalidRequest = 0x61;
inline constexpr uint8_t kNakRemoteAccess = 0x62;
inline constexpr uint8_t kNakRemoteOperation = 0x63;
}  // namespace aeth

// --- IB transport headers ----------------------------------------------------

// A packet's pad (BTH PadCnt): its payload rounded up to whole 32-bit words.
constexpr uint8_t pad_of(uint64_t payload_len) noexcept { return static_cast<uint8_t>((4 - payload_len % 4) % 4); }

struct Bth {
	uint8_t opcode = 0;
	bool solicited = false;
	bool migreq = false;
	uint8_t pad = 0;   // 0..3 bytes of pad before the ICRC
	uint8_t tver = 0;
	uint16_t pkey = kDefaultPkey;
	bool fecn = false;
	bool becn = false;
	uint32_t dest_qpn = 0;  // 24 bits
	bool ack_req = false;
	uint32_t psn = 0;       // 24 bits
	bool operator==(const Bth &) const = default;
};
void encode(const Bth &h, std::span<uint8_t, kBthBytes> out);
Bth decode_bth(std::span<const uint8_t, kBthBytes> in);

struct Deth {
	uint32_t qkey = 0;
	uint32_t src_qpn = 0;  // 24 bits
	bool operator==(const Deth &) const = default;
};
void encode(const Deth &h, std::span<uint8_t, kDethBytes> out);
Deth decode_deth(std::span<const uint8_t, kDethBytes> in);

struct Reth {
	uint64_t va = 0;
	uint32_t rkey = 0;
	uint32_t dma_length = 0;
	bool operator==(const Reth &) const = default;
};
void encode(const Reth &h, std::span<uint8_t, kRethBytes> out);
Reth decode_reth(std::span<const uint8_t, kRethBytes> in);

struct Aeth {
	uint8_t syndrome = 0;
	uint32_t msn = 0;  // 24 bits
	bool operator==(const Aeth &) const = default;
};
void encode(const Aeth &h, std::span<uint8_t, kAethBytes> out);
Aeth decode_aeth(std::span<const uint8_t, kAethBytes> in);

struct AtomicEth {
	uint64_t va = 0;
	uint32_t rkey = 0;
	uint64_t swap_add = 0;
	uint64_t compare = 0;
	bool operator==(const AtomicEth &) const = default;
};
void encode(const AtomicEth &h, std::span<uint8_t, kAtomicEthBytes> out);
AtomicEth decode_atomic_eth(std::span<const uint8_t, kAtomicEthBytes> in);

struct AtomicAckEth {
	uint64_t original = 0;
	bool operator==(const AtomicAckEth &) const = default;
};
void encode(const AtomicAckEth &h, std::span<uint8_t, kAtomicAckEthBytes> out);
AtomicAckEth decode_atomic_ack_eth(std::span<const uint8_t, kAtomicAckEthBytes> in);

// ImmDt, IETH and XRCETH are one 32-bit field each. Immediate data is
// opaque: it travels as the application's bytes (ibv_send_wr::imm_data is
// already in network order), so it is kept raw here.
struct ImmDt {
	uint32_t raw = 0;  // as on the wire (network order)
	bool operator==(const ImmDt &) const = default;
};
void encode(const ImmDt &h, std::span<uint8_t, kImmDtBytes> out);
ImmDt decode_immdt(std::span<const uint8_t, kImmDtBytes> in);

struct Ieth {
	uint32_t rkey = 0;
	bool operator==(const Ieth &) const = default;
};
void encode(const Ieth &h, std::span<uint8_t, kIethBytes> out);
Ieth decode_ieth(std::span<const uint8_t, kIethBytes> in);

struct XrcEth {
	uint32_t srqn = 0;  // 24 bits
	bool operator==(const XrcEth &) const = default;
};
void encode(const XrcEth &h, std::span<uint8_t, kXrcEthBytes> out);
XrcEth decode_xrceth(std::span<const uint8_t, kXrcEthBytes> in);

// --- IP and UDP ---------------------------------------------------------------

struct Ipv4 {
	uint8_t tos = 0;
	uint16_t total_length = 0;
	uint16_t id = 0;
	uint16_t flags_fragment = 0x4000;  // DF
	uint8_t ttl = 64;
	uint8_t protocol = kIpProtoUdp;
	uint16_t checksum = 0;  // encode() computes it
	in_addr src{};
	in_addr dst{};
};
// Writes the header with its checksum computed.
void encode(const Ipv4 &h, std::span<uint8_t, kIpv4Bytes> out);
// Decodes a 20-byte header (no options); nothing for another version or IHL.
std::optional<Ipv4> decode_ipv4(std::span<const uint8_t, kIpv4Bytes> in);
// The Internet checksum over `bytes` (RFC 1071), as stored.
uint16_t internet_checksum(std::span<const uint8_t> bytes);

struct Ipv6 {
	uint8_t traffic_class = 0;
	uint32_t flow_label = 0;  // 20 bits
	uint16_t payload_length = 0;
	uint8_t next_header = kIpProtoUdp;
	uint8_t hop_limit = 64;
	in6_addr src{};
	in6_addr dst{};
};
void encode(const Ipv6 &h, std::span<uint8_t, kIpv6Bytes> out);
std::optional<Ipv6> decode_ipv6(std::span<const uint8_t, kIpv6Bytes> in);

struct Udp {
	uint16_t src_port = 0;
	uint16_t dst_port = kRoceV2Port;
	uint16_t length = 0;
	uint16_t checksum = 0;
};
void encode(const Udp &h, std::span<uint8_t, kUdpBytes> out);
Udp decode_udp(std::span<const uint8_t, kUdpBytes> in);

// --- GRH from IP (what a UD receive finds in its first 40 bytes) --------------

// IPv6: the IPv6 header itself (the GRH's layout). IPv4, as rxe: 20 zero
// bytes, then the IPv4 header in the last 20.
std::array<uint8_t, kGrhBytes> grh_from_ip(std::span<const uint8_t> ip_header);

// --- GSO datagrams ------------------------------------------------------------

// A GSO datagram (one IPv4 or IPv6 header and one UDP header, then UDP
// payload that stands for `segment`-byte datagrams, the last maybe shorter),
// as a packet socket shows one that crossed a veth whole or that GRO
// merged, cut into the packets the kernel would cut it into: each written
// to `out` (room: the datagram plus an IP and UDP header per packet) with
// its own lengths and, on IPv4, the ID the kernel gives it (the datagram's
// plus the packet's index; the datagram's own when that fails the ICRC, as
// GRO leaves packets sent with one fixed ID), and passed to
// `each(packet, icrc_checked)` in order; icrc_checked: its ICRC was found
// good on the way. Returns how many packets; 0 for a datagram that is not
// UDP over IPv4 without options or IPv6, or would make more than
// `max_packets`.
size_t split_gso(std::span<const uint8_t> ip_packet, size_t segment, size_t max_packets, uint8_t *out,
		 const std::function<void(std::span<const uint8_t>, bool)> &each);

// --- ICRC ---------------------------------------------------------------------

// The ICRC of a RoCE v2 packet: `packet` is the IP packet from the first
// byte of the IPv4 or IPv6 header to the end of the pad, without the ICRC.
// CRC-32 over 8 bytes of 0xFF, then the headers with the variant fields
// (IPv4 TOS, TTL, checksum; IPv6 traffic class, flow label, hop limit; UDP
// checksum; BTH FECN/BECN/resv6) set to ones, then the rest. Nothing for a
// packet too short to hold IP + UDP + BTH.
std::optional<uint32_t> icrc(std::span<const uint8_t> packet);
// Continues an ICRC (from icrc()) over more of the packet.
uint32_t icrc_continue(uint32_t crc, std::span<const uint8_t> bytes);
// Stores / loads the ICRC as it travels (little-endian).
void store_icrc(uint32_t crc, std::span<uint8_t, kIcrcBytes> out);
uint32_t load_icrc(std::span<const uint8_t, kIcrcBytes> in);
// Does the last 4 bytes of `packet` (IP header .. ICRC) match the rest?
bool icrc_ok(std::span<const uint8_t> packet);

// --- UDP source port -----------------------------------------------------------

// The UDP source port of a QP's packets (entropy for ECMP and RSS; nobody
// may rely on it): 0xC000 | 14 bits of a hash of the QP's number and its
// peer's (0 when it has none, as UD). Stable for the QP's life.
uint16_t udp_source_port(uint32_t qpn, uint32_t dest_qpn);

// The BTH and AETH of an Acknowledge (`transport` rc or xrc) for `psn` to
// QP `dest_qpn`: an ACK (aeth::kAck) or a NAK.
std::array<uint8_t, kBthBytes + kAethBytes> acknowledge_headers(uint8_t transport, uint32_t dest_qpn, uint32_t psn,
								 uint8_t syndrome, uint32_t msn);

// --- GIDs ---------------------------------------------------------------------

// An IPv4-mapped GID (::ffff:a.b.c.d) and its address.
bool gid_is_ipv4_mapped(const std::array<uint8_t, 16> &gid);
in_addr gid_ipv4(const std::array<uint8_t, 16> &gid);
// A multicast group's GID: ff00::/8, or IPv4-mapped 224.0.0.0/4.
bool gid_is_multicast(const std::array<uint8_t, 16> &gid);

}  // namespace xsrc::wire
