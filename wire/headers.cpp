// RoCE v2 headers: encode, decode, the opcode table (IBTA 9.2, Annex A17).
#include "wire/headers.h"

#include <algorithm>
#include <cstring>

namespace xsrc::wire {
namespace {

void put16(uint8_t *p, uint16_t v)
{
	p[0] = static_cast<uint8_t>(v >> 8);
	p[1] = static_cast<uint8_t>(v);
}

void put24(uint8_t *p, uint32_t v)
{
	p[0] = static_cast<uint8_t>(v >> 16);
	p[1] = static_cast<uint8_t>(v >> 8);
	p[2] = static_cast<uint8_t>(v);
}

void put32(uint8_t *p, uint32_t v)
{
	put16(p, static_cast<uint16_t>(v >> 16));
	put16(p + 2, static_cast<uint16_t>(v));
}

void put64(uint8_t *p, uint64_t v)
{
	put32(p, static_cast<uint32_t>(v >> 32));
	put32(p + 4, static_cast<uint32_t>(v));
}

uint16_t get16(const uint8_t *p)
{
	return static_cast<uint16_t>(p[0] << 8 | p[1]);
}

uint32_t get24(const uint8_t *p)
{
	return uint32_t(p[0]) << 16 | uint32_t(p[1]) << 8 | p[2];
}

uint32_t get32(const uint8_t *p)
{
	return uint32_t(get16(p)) << 16 | get16(p + 2);
}

uint64_t get64(const uint8_t *p)
{
	return uint64_t(get32(p)) << 32 | get32(p + 4);
}

// The operations of RC and XRC (low 5 bits of the opcode); UC has the
// SEND and RDMA WRITE ones, UD only SEND Only (with Immediate).
constexpr OpcodeInfo kOps[0x20] = {
	{"SEND First", kExtPayload},
	{"SEND Middle", kExtPayload},
	{"SEND Last", kExtPayload},
	{"SEND Last with Immediate", kExtImmDt | kExtPayload},
	{"SEND Only", kExtPayload},
	{"SEND Only with Immediate", kExtImmDt | kExtPayload},
	{"RDMA WRITE First", kExtReth | kExtPayload},
	{"RDMA WRITE Middle", kExtPayload},
	{"RDMA WRITE Last", kExtPayload},
	{"RDMA WRITE Last with Immediate", kExtImmDt | kExtPayload},
	{"RDMA WRITE Only", kExtReth | kExtPayload},
	{"RDMA WRITE Only with Immediate", kExtReth | kExtImmDt | kExtPayload},
	{"RDMA READ Request", kExtReth},
	{"RDMA READ response First", kExtAeth | kExtPayload},
	{"RDMA READ response Middle", kExtPayload},
	{"RDMA READ response Last", kExtAeth | kExtPayload},
	{"RDMA READ response Only", kExtAeth | kExtPayload},
	{"Acknowledge", kExtAeth},
	{"ATOMIC Acknowledge", kExtAeth | kExtAtomicAckEth},
	{"CmpSwap", kExtAtomicEth},
	{"FetchAdd", kExtAtomicEth},
	{nullptr, 0},
	{"SEND Last with Invalidate", kExtIeth | kExtPayload},
	{"SEND Only with Invalidate", kExtIeth | kExtPayload},
	{nullptr, 0},
	{nullptr, 0},
	{nullptr, 0},
	{nullptr, 0},
	{nullptr, 0},  // 0x1C FLUSH: not carried
	{"ATOMIC WRITE", kExtReth | kExtPayload},  // 0x1D, IBTA 1.5: 8 bytes of payload
};

constexpr OpcodeInfo kUdOps[] = {
	{"UD SEND Only", kExtDeth | kExtPayload},
	{"UD SEND Only with Immediate", kExtDeth | kExtImmDt | kExtPayload},
};

// UC carries the SEND and RDMA WRITE operations only.
bool uc_has(uint8_t op)
{
	return op <= 0x0B;
}

}  // namespace

const OpcodeInfo *opcode_info(uint8_t opcode)
{
	uint8_t op = opcode & 0x1F;
	switch (static_cast<Transport>(opcode & 0xE0)) {
	case Transport::rc:
		return kOps[op].name ? &kOps[op] : nullptr;
	case Transport::uc:
		return uc_has(op) ? &kOps[op] : nullptr;
	case Transport::ud:
		return op == 0x04 || op == 0x05 ? &kUdOps[op - 0x04] : nullptr;
	case Transport::xrc: {
		// The XRC table is RC's with XRCETH after the BTH.
		static constexpr auto kXrcOps = [] {
			std::array<OpcodeInfo, 0x20> t{};
			for (size_t i = 0; i < t.size(); ++i)
				t[i] = {kOps[i].name, static_cast<uint16_t>(kOps[i].name ? kOps[i].ext | kExtXrceth : 0)};
			return t;
		}();
		// Responses (READ response, ACK) carry no XRCETH.
		static constexpr auto kXrcResponses = [] {
			std::array<OpcodeInfo, 0x20> t{};
			for (size_t i = 0x0D; i <= 0x12; ++i)
				t[i] = kOps[i];
			return t;
		}();
		if (op >= 0x0D && op <= 0x12)
			return &kXrcResponses[op];
		return kXrcOps[op].name ? &kXrcOps[op] : nullptr;
	}
	default:  // RD and CNP: not carried by this device
		return nullptr;
	}
}

size_t header_bytes(uint8_t opcode)
{
	const OpcodeInfo *info = opcode_info(opcode);
	if (!info)
		return 0;
	size_t n = kBthBytes;
	if (info->ext & kExtDeth)
		n += kDethBytes;
	if (info->ext & kExtXrceth)
		n += kXrcEthBytes;
	if (info->ext & kExtReth)
		n += kRethBytes;
	if (info->ext & kExtAtomicEth)
		n += kAtomicEthBytes;
	if (info->ext & kExtImmDt)
		n += kImmDtBytes;
	if (info->ext & kExtIeth)
		n += kIethBytes;
	if (info->ext & kExtAeth)
		n += kAethBytes;
	if (info->ext & kExtAtomicAckEth)
		n += kAtomicAckEthBytes;
	return n;
}

void encode(const Bth &h, std::span<uint8_t, kBthBytes> out)
{
	uint8_t *p = out.data();
	p[0] = h.opcode;
	p[1] = static_cast<uint8_t>((h.solicited ? 0x80 : 0) | (h.migreq ? 0x40 : 0) | (h.pad & 3) << 4 | (h.tver & 0xF));
	put16(p + 2, h.pkey);
	p[4] = static_cast<uint8_t>((h.fecn ? 0x80 : 0) | (h.becn ? 0x40 : 0));
	put24(p + 5, h.dest_qpn & kQpnMask);
	p[8] = h.ack_req ? 0x80 : 0;
	put24(p + 9, h.psn & kPsnMask);
}

Bth decode_bth(std::span<const uint8_t, kBthBytes> in)
{
	const uint8_t *p = in.data();
	Bth h;
	h.opcode = p[0];
	h.solicited = p[1] & 0x80;
	h.migreq = p[1] & 0x40;
	h.pad = (p[1] >> 4) & 3;
	h.tver = p[1] & 0xF;
	h.pkey = get16(p + 2);
	h.fecn = p[4] & 0x80;
	h.becn = p[4] & 0x40;
	h.dest_qpn = get24(p + 5);
	h.ack_req = p[8] & 0x80;
	h.psn = get24(p + 9);
	return h;
}

void encode(const Deth &h, std::span<uint8_t, kDethBytes> out)
{
	put32(out.data(), h.qkey);
	out[4] = 0;
	put24(out.data() + 5, h.src_qpn & kQpnMask);
}

Deth decode_deth(std::span<const uint8_t, kDethBytes> in)
{
	return {get32(in.data()), get24(in.data() + 5)};
}

void encode(const Reth &h, std::span<uint8_t, kRethBytes> out)
{
	put64(out.data(), h.va);
	put32(out.data() + 8, h.rkey);
	put32(out.data() + 12, h.dma_length);
}

Reth decode_reth(std::span<const uint8_t, kRethBytes> in)
{
	return {get64(in.data()), get32(in.data() + 8), get32(in.data() + 12)};
}

void encode(const Aeth &h, std::span<uint8_t, kAethBytes> out)
{
	out[0] = h.syndrome;
	put24(out.data() + 1, h.msn & 0xFFFFFF);
}

Aeth decode_aeth(std::span<const uint8_t, kAethBytes> in)
{
	return {in[0], get24(in.data() + 1)};
}

void encode(const AtomicEth &h, std::span<uint8_t, kAtomicEthBytes> out)
{
	put64(out.data(), h.va);
	put32(out.data() + 8, h.rkey);
	put64(out.data() + 12, h.swap_add);
	put64(out.data() + 20, h.compare);
}

AtomicEth decode_atomic_eth(std::span<const uint8_t, kAtomicEthBytes> in)
{
	return {get64(in.data()), get32(in.data() + 8), get64(in.data() + 12), get64(in.data() + 20)};
}

void encode(const AtomicAckEth &h, std::span<uint8_t, kAtomicAckEthBytes> out)
{
	put64(out.data(), h.original);
}

AtomicAckEth decode_atomic_ack_eth(std::span<const uint8_t, kAtomicAckEthBytes> in)
{
	return {get64(in.data())};
}

void encode(const ImmDt &h, std::span<uint8_t, kImmDtBytes> out)
{
	std::memcpy(out.data(), &h.raw, kImmDtBytes);
}

ImmDt decode_immdt(std::span<const uint8_t, kImmDtBytes> in)
{
	ImmDt h;
	std::memcpy(&h.raw, in.data(), kImmDtBytes);
	return h;
}

void encode(const Ieth &h, std::span<uint8_t, kIethBytes> out)
{
	put32(out.data(), h.rkey);
}

Ieth decode_ieth(std::span<const uint8_t, kIethBytes> in)
{
	return {get32(in.data())};
}

void encode(const XrcEth &h, std::span<uint8_t, kXrcEthBytes> out)
{
	out[0] = 0;
	put24(out.data() + 1, h.srqn & 0xFFFFFF);
}

XrcEth decode_xrceth(std::span<const uint8_t, kXrcEthBytes> in)
{
	return {get24(in.data() + 1)};
}

uint16_t internet_checksum(std::span<const uint8_t> bytes)
{
	uint32_t sum = 0;
	size_t i = 0;
	for (; i + 1 < bytes.size(); i += 2)
		sum += get16(bytes.data() + i);
	if (i < bytes.size())
		sum += uint32_t(bytes[i]) << 8;
	while (sum >> 16)
		sum = (sum & 0xFFFF) + (sum >> 16);
	return static_cast<uint16_t>(~sum);
}

void encode(const Ipv4 &h, std::span<uint8_t, kIpv4Bytes> out)
{
	uint8_t *p = out.data();
	p[0] = 0x45;
	p[1] = h.tos;
	put16(p + 2, h.total_length);
	put16(p + 4, h.id);
	put16(p + 6, h.flags_fragment);
	p[8] = h.ttl;
	p[9] = h.protocol;
	put16(p + 10, 0);
	std::memcpy(p + 12, &h.src, 4);
	std::memcpy(p + 16, &h.dst, 4);
	put16(p + 10, internet_checksum(out));
}

std::optional<Ipv4> decode_ipv4(std::span<const uint8_t, kIpv4Bytes> in)
{
	const uint8_t *p = in.data();
	if (p[0] != 0x45)
		return std::nullopt;
	Ipv4 h;
	h.tos = p[1];
	h.total_length = get16(p + 2);
	h.id = get16(p + 4);
	h.flags_fragment = get16(p + 6);
	h.ttl = p[8];
	h.protocol = p[9];
	h.checksum = get16(p + 10);
	std::memcpy(&h.src, p + 12, 4);
	std::memcpy(&h.dst, p + 16, 4);
	return h;
}

void encode(const Ipv6 &h, std::span<uint8_t, kIpv6Bytes> out)
{
	uint8_t *p = out.data();
	put32(p, 6u << 28 | uint32_t(h.traffic_class) << 20 | (h.flow_label & 0xFFFFF));
	put16(p + 4, h.payload_length);
	p[6] = h.next_header;
	p[7] = h.hop_limit;
	std::memcpy(p + 8, &h.src, 16);
	std::memcpy(p + 24, &h.dst, 16);
}

std::optional<Ipv6> decode_ipv6(std::span<const uint8_t, kIpv6Bytes> in)
{
	const uint8_t *p = in.data();
	uint32_t first = get32(p);
	if (first >> 28 != 6)
		return std::nullopt;
	Ipv6 h;
	h.traffic_class = static_cast<uint8_t>(first >> 20);
	h.flow_label = first & 0xFFFFF;
	h.payload_length = get16(p + 4);
	h.next_header = p[6];
	h.hop_limit = p[7];
	std::memcpy(&h.src, p + 8, 16);
	std::memcpy(&h.dst, p + 24, 16);
	return h;
}

void encode(const Udp &h, std::span<uint8_t, kUdpBytes> out)
{
	put16(out.data(), h.src_port);
	put16(out.data() + 2, h.dst_port);
	put16(out.data() + 4, h.length);
	put16(out.data() + 6, h.checksum);
}

Udp decode_udp(std::span<const uint8_t, kUdpBytes> in)
{
	return {get16(in.data()), get16(in.data() + 2), get16(in.data() + 4), get16(in.data() + 6)};
}

std::array<uint8_t, kGrhBytes> grh_from_ip(std::span<const uint8_t> ip_header)
{
	std::array<uint8_t, kGrhBytes> grh{};
	if (ip_header.size() >= kIpv6Bytes && ip_header[0] >> 4 == 6)
		std::memcpy(grh.data(), ip_header.data(), kIpv6Bytes);
	else if (ip_header.size() >= kIpv4Bytes)
		std::memcpy(grh.data() + kGrhBytes - kIpv4Bytes, ip_header.data(), kIpv4Bytes);
	return grh;
}

bool gid_is_ipv4_mapped(const std::array<uint8_t, 16> &gid)
{
	static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
	return std::memcmp(gid.data(), kPrefix, sizeof(kPrefix)) == 0;
}

bool gid_is_multicast(const std::array<uint8_t, 16> &gid)
{
	return gid[0] == 0xFF || (gid_is_ipv4_mapped(gid) && (gid[12] & 0xF0) == 0xE0);
}

in_addr gid_ipv4(const std::array<uint8_t, 16> &gid)
{
	in_addr a;
	std::memcpy(&a, gid.data() + 12, 4);
	return a;
}

uint16_t udp_source_port(uint32_t qpn, uint32_t dest_qpn)
{
	// A multiplicative hash of both numbers, folded; its top 14 bits.
	uint64_t x = (uint64_t(qpn & kQpnMask) << 24 | (dest_qpn & kQpnMask)) * 0x9E3779B97F4A7C15ull;
	x ^= x >> 29;
	return static_cast<uint16_t>(0xC000u | ((x >> 50) & 0x3FFFu));
}

std::array<uint8_t, kBthBytes + kAethBytes> acknowledge_headers(uint8_t transport, uint32_t dest_qpn, uint32_t psn,
								 uint8_t syndrome, uint32_t msn)
{
	std::array<uint8_t, kBthBytes + kAethBytes> hdr{};
	Bth bth;
	bth.opcode = transport | op::kAcknowledge;
	bth.dest_qpn = dest_qpn & kQpnMask;
	bth.psn = psn & kPsnMask;
	encode(bth, std::span<uint8_t, kBthBytes>(hdr.data(), kBthBytes));
	encode(Aeth{syndrome, msn & kPsnMask}, std::span<uint8_t, kAethBytes>(hdr.data() + kBthBytes, kAethBytes));
	return hdr;
}

size_t split_gso(std::span<const uint8_t> ip_packet, size_t segment, size_t max_packets, uint8_t *out,
		 const std::function<void(std::span<const uint8_t>, bool)> &each)
{
	size_t ip_len;
	if (ip_packet.size() >= kIpv4Bytes && ip_packet[0] == 0x45 && ip_packet[9] == kIpProtoUdp)
		ip_len = kIpv4Bytes;
	else if (ip_packet.size() >= kIpv6Bytes && ip_packet[0] >> 4 == 6 && ip_packet[6] == kIpProtoUdp)
		ip_len = kIpv6Bytes;
	else
		return 0;
	size_t headers = ip_len + kUdpBytes;
	if (ip_packet.size() <= headers || segment == 0)
		return 0;
	size_t payload = ip_packet.size() - headers;
	size_t packets = (payload + segment - 1) / segment;
	if (packets > max_packets)
		return 0;
	bool v4 = ip_len == kIpv4Bytes;
	uint16_t first_id = static_cast<uint16_t>(ip_packet[4] << 8 | ip_packet[5]);
	for (size_t k = 0; k < packets; ++k) {
		size_t n = std::min(segment, payload - k * segment);
		uint8_t *p = out;
		out += headers + n;
		std::memcpy(p, ip_packet.data(), headers);
		std::memcpy(p + headers, ip_packet.data() + headers + k * segment, n);
		put16(p + ip_len + 4, static_cast<uint16_t>(kUdpBytes + n));  // UDP length
		std::span<const uint8_t> packet(p, headers + n);
		if (!v4) {
			put16(p + 4, static_cast<uint16_t>(kUdpBytes + n));  // payload length
			each(packet, false);
			continue;
		}
		put16(p + 2, static_cast<uint16_t>(headers + n));  // total length
		auto set_id = [p](uint16_t id) {
			put16(p + 4, id);
			put16(p + 10, 0);
			put16(p + 10, internet_checksum({p, kIpv4Bytes}));
		};
		set_id(static_cast<uint16_t>(first_id + k));
		if (k == 0 || icrc_ok(packet)) {
			each(packet, k != 0);
			continue;
		}
		set_id(first_id);
		each(packet, false);
	}
	return packets;
}

}  // namespace xsrc::wire
