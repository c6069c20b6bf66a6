// The RoCE v2 invariant CRC (IBTA Annex A17.3.3): the Ethernet CRC-32
// (reflected, as gzip and zlib compute it; ISA-L's crc32_gzip_refl) over a
// pseudo header of 8 bytes of ones, the IP/UDP/BTH headers with the fields
// routers may change set to ones, and the rest of the packet.
#include <isa-l/crc.h>

#include <cstring>

#include "wire/headers.h"

namespace xsrc::wire {
namespace {

// The masked copy of IP + UDP + BTH is at most this long.
constexpr size_t kMaskedMax = kIpv6Bytes + kUdpBytes + kBthBytes;

uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t n)
{
	return crc32_gzip_refl(crc, p, static_cast<uint64_t>(n));
}

// The pseudo header's 8 bytes of ones, whose CRC every packet starts from.
constexpr uint8_t kOnes[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
const uint32_t kOnesCrc = crc_update(0, kOnes, sizeof(kOnes));

}  // namespace

std::optional<uint32_t> icrc(std::span<const uint8_t> packet)
{
	if (packet.empty())
		return std::nullopt;
	bool v6 = packet[0] >> 4 == 6;
	size_t ip_bytes = v6 ? kIpv6Bytes : kIpv4Bytes;
	size_t masked_bytes = ip_bytes + kUdpBytes + kBthBytes;
	if ((!v6 && packet[0] != 0x45) || packet.size() < masked_bytes)
		return std::nullopt;

	uint8_t h[kMaskedMax];
	std::memcpy(h, packet.data(), masked_bytes);
	if (v6) {
		h[0] |= 0x0F;  // traffic class (low nibble of byte 0, high of byte 1)
		h[1] = 0xFF;   // traffic class, flow label
		h[2] = h[3] = 0xFF;
		h[7] = 0xFF;   // hop limit
	} else {
		h[1] = 0xFF;   // TOS
		h[8] = 0xFF;   // TTL
		h[10] = h[11] = 0xFF;  // header checksum
	}
	uint8_t *udp = h + ip_bytes;
	udp[6] = udp[7] = 0xFF;      // UDP checksum
	uint8_t *bth = udp + kUdpBytes;
	bth[4] = 0xFF;               // FECN, BECN, resv6

	uint32_t crc = crc_update(kOnesCrc, h, masked_bytes);
	return crc_update(crc, packet.data() + masked_bytes, packet.size() - masked_bytes);
}

uint32_t icrc_continue(uint32_t crc, std::span<const uint8_t> bytes)
{
	return bytes.empty() ? crc : crc_update(crc, bytes.data(), bytes.size());
}

void store_icrc(uint32_t crc, std::span<uint8_t, kIcrcBytes> out)
{
	for (size_t i = 0; i < kIcrcBytes; ++i)
		out[i] = static_cast<uint8_t>(crc >> (8 * i));
}

uint32_t load_icrc(std::span<const uint8_t, kIcrcBytes> in)
{
	return uint32_t(in[0]) | uint32_t(in[1]) << 8 | uint32_t(in[2]) << 16 | uint32_t(in[3]) << 24;
}

bool icrc_ok(std::span<const uint8_t> packet)
{
	if (packet.size() < kIcrcBytes)
		return false;
	std::optional<uint32_t> crc = icrc(packet.first(packet.size() - kIcrcBytes));
	return crc && *crc == load_icrc(packet.last<kIcrcBytes>());
}

}  // namespace xsrc::wire
