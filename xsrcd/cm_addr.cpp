#include "cm_addr.h"

#include <arpa/inet.h>
#include <endian.h>

#include <algorithm>
#include <cstring>

namespace xsrc::cm {
namespace {

const sockaddr_in &v4(const sockaddr_storage &a) { return reinterpret_cast<const sockaddr_in &>(a); }
const sockaddr_in6 &v6(const sockaddr_storage &a) { return reinterpret_cast<const sockaddr_in6 &>(a); }
const SockaddrIb &ib(const sockaddr_storage &a) { return reinterpret_cast<const SockaddrIb &>(a); }

Gid v4_mapped(const in_addr &addr)
{
	Gid g;
	g.raw[10] = 0xff;
	g.raw[11] = 0xff;
	std::memcpy(&g.raw[12], &addr, 4);
	return g;
}

Gid v6_gid(const in6_addr &addr)
{
	Gid g;
	std::memcpy(g.raw.data(), &addr, 16);
	return g;
}

std::optional<unsigned> gid_index(const CmDevice &dev, const Gid &gid)
{
	auto it = std::find(dev.gids.begin(), dev.gids.end(), gid);
	if (it == dev.gids.end())
		return std::nullopt;
	return static_cast<unsigned>(it - dev.gids.begin());
}

// The port's first GID of an address family: IPv4-mapped for AF_INET, the
// first other one (index 0, the link-local GID) for AF_INET6.
std::optional<unsigned> family_gid(const CmDevice &dev, sa_family_t family)
{
	for (unsigned i = 0; i < dev.gids.size(); ++i) {
		const Gid &g = dev.gids[i];
		bool mapped = std::all_of(g.raw.begin(), g.raw.begin() + 10, [](uint8_t b) { return b == 0; }) &&
			      g.raw[10] == 0xff && g.raw[11] == 0xff;
		if (g == Gid{})
			continue;
		if ((family == AF_INET) == mapped)
			return i;
	}
	return std::nullopt;
}

const CmDevice *lowest_index(const std::vector<CmDevice> &devices)
{
	const CmDevice *first = nullptr;
	for (const CmDevice &d : devices)
		if (!first || d.index < first->index)
			first = &d;
	return first;
}

}  // namespace

size_t address_size(sa_family_t family)
{
	switch (family) {
	case AF_INET: return sizeof(sockaddr_in);
	case AF_INET6: return sizeof(sockaddr_in6);
	case kAfIb: return sizeof(SockaddrIb);
	default: return 0;
	}
}

size_t checked_address_size(const sockaddr_storage &addr, size_t size)
{
	size_t want = address_size(addr.ss_family);
	return want && size == want ? want : 0;
}

bool is_any(const sockaddr_storage &a)
{
	switch (a.ss_family) {
	case AF_INET: return v4(a).sin_addr.s_addr == htonl(INADDR_ANY);
	case AF_INET6: return IN6_IS_ADDR_UNSPECIFIED(&v6(a).sin6_addr);
	case kAfIb: return std::all_of(std::begin(ib(a).sib_addr), std::end(ib(a).sib_addr), [](uint8_t b) { return b == 0; });
	default: return false;
	}
}

bool is_loopback(const sockaddr_storage &a)
{
	if (a.ss_family == AF_INET)
		return (ntohl(v4(a).sin_addr.s_addr) >> 24) == IN_LOOPBACKNET;
	if (a.ss_family == AF_INET6)
		return IN6_IS_ADDR_LOOPBACK(&v6(a).sin6_addr);
	return false;
}

uint16_t port_of(const sockaddr_storage &a)
{
	switch (a.ss_family) {
	case AF_INET: return ntohs(v4(a).sin_port);
	case AF_INET6: return ntohs(v6(a).sin6_port);
	case kAfIb: return static_cast<uint16_t>(be64toh(ib(a).sib_sid) & 0xffff);
	default: return 0;
	}
}

void set_port(sockaddr_storage &a, uint16_t port)
{
	switch (a.ss_family) {
	case AF_INET: reinterpret_cast<sockaddr_in &>(a).sin_port = htons(port); break;
	case AF_INET6: reinterpret_cast<sockaddr_in6 &>(a).sin6_port = htons(port); break;
	case kAfIb: {
		auto &s = reinterpret_cast<SockaddrIb &>(a);
		s.sib_sid = htobe64((be64toh(s.sib_sid) & ~0xffffull) | port);
		s.sib_sid_mask = htobe64(~0ull);
		break;
	}
	default: break;
	}
}

bool same_address(const sockaddr_storage &a, const sockaddr_storage &b)
{
	if (a.ss_family != b.ss_family)
		return false;
	switch (a.ss_family) {
	case AF_INET: return v4(a).sin_addr.s_addr == v4(b).sin_addr.s_addr;
	case AF_INET6: return std::memcmp(&v6(a).sin6_addr, &v6(b).sin6_addr, 16) == 0;
	case kAfIb: return std::memcmp(ib(a).sib_addr, ib(b).sib_addr, 16) == 0;
	default: return false;
	}
}

sockaddr_storage any_address(sa_family_t family)
{
	sockaddr_storage a{};
	a.ss_family = family;
	return a;
}

Gid gid_of(const sockaddr_storage &a)
{
	switch (a.ss_family) {
	case AF_INET: return v4_mapped(v4(a).sin_addr);
	case AF_INET6: return v6_gid(v6(a).sin6_addr);
	case kAfIb: {
		Gid g;
		std::memcpy(g.raw.data(), ib(a).sib_addr, 16);
		return g;
	}
	default: return {};
	}
}

std::optional<Local> first_device(const std::vector<CmDevice> &devices, sa_family_t family)
{
	const CmDevice *dev = lowest_index(devices);
	if (!dev || dev->gids.empty())
		return std::nullopt;
	unsigned index = family_gid(*dev, family).value_or(0);
	return Local{*dev, index, dev->gids[index]};
}

std::optional<Local> find_local(const std::vector<CmDevice> &devices, const sockaddr_storage &addr)
{
	if (is_loopback(addr))
		return first_device(devices, addr.ss_family);
	const Gid gid = gid_of(addr);
	for (const CmDevice &dev : devices) {
		bool ours = false;
		if (addr.ss_family == AF_INET)
			ours = std::any_of(dev.netdev.ipv4.begin(), dev.netdev.ipv4.end(), [&](const in_addr &a) {
				return a.s_addr == v4(addr).sin_addr.s_addr;
			});
		else if (addr.ss_family == AF_INET6)
			ours = std::any_of(dev.netdev.ipv6.begin(), dev.netdev.ipv6.end(), [&](const in6_addr &a) {
				return std::memcmp(&a, &v6(addr).sin6_addr, 16) == 0;
			});
		auto index = gid_index(dev, gid);
		if (addr.ss_family == kAfIb)
			ours = index.has_value();
		if (ours && index)
			return Local{dev, *index, gid};
		if (ours)  // an address the GID table has no room for: the port's first GID of its kind
			if (auto i = family_gid(dev, addr.ss_family))
				return Local{dev, *i, dev.gids[*i]};
	}
	return std::nullopt;
}

ib_user_path_rec user_path_record(const Route &r)
{
	ib_user_path_rec p{};
	std::memcpy(p.dgid, r.dgid.raw.data(), 16);
	std::memcpy(p.sgid, r.sgid.raw.data(), 16);
	p.pkey = htons(0xffff);
	p.hop_limit = r.hop_limit;
	p.traffic_class = r.tos;
	p.numb_path = 1;
	p.reversible = 1;
	p.mtu = static_cast<uint32_t>(r.mtu);
	p.mtu_selector = 2;  // exactly
	p.rate_selector = 2;
	p.rate = 7;          // 40 Gb/s, what a 4X port of the device reports at least
	p.packet_life_time_selector = 2;
	p.packet_life_time = r.packet_life_time;
	return p;
}

// The SA PathRecord attribute (IBA 15.2.5.16), big endian, 64 bytes.
ib_path_rec_data wire_path_record(const Route &r, uint64_t service_id)
{
	ib_path_rec_data d{};
	d.flags = IB_PATH_GMP | IB_PATH_PRIMARY | IB_PATH_BIDIRECTIONAL;
	uint8_t *b = reinterpret_cast<uint8_t *>(d.path_rec);
	uint64_t sid = htobe64(service_id);
	std::memcpy(b + 0, &sid, 8);
	std::memcpy(b + 8, r.dgid.raw.data(), 16);
	std::memcpy(b + 24, r.sgid.raw.data(), 16);
	// 40: DLID, 42: SLID (0 on RoCE); 44: RawTraffic(1) Reserved(3) FlowLabel(20) HopLimit(8)
	uint32_t fl_hop = htonl(r.hop_limit);
	std::memcpy(b + 44, &fl_hop, 4);
	b[48] = r.tos;                          // TClass
	b[49] = 0x80 | 1;                       // Reversible, NumbPath 1
	b[50] = 0xff;                           // P_Key 0xffff
	b[51] = 0xff;
	// 52: QoSClass(12) SL(4) = 0
	b[54] = static_cast<uint8_t>((2 << 6) | (r.mtu & 0x3f));  // MtuSelector exactly, MTU
	b[55] = (2 << 6) | 7;                   // RateSelector exactly, Rate 40 Gb/s
	b[56] = static_cast<uint8_t>((2 << 6) | (r.packet_life_time & 0x3f));
	b[57] = 0;                              // Preference
	return d;
}

ib_uverbs_ah_attr ah_attr_of(const Route &r)
{
	ib_uverbs_ah_attr ah{};
	std::memcpy(ah.grh.dgid, r.dgid.raw.data(), 16);
	ah.grh.sgid_index = static_cast<uint8_t>(r.sgid_index);
	ah.grh.hop_limit = r.hop_limit;
	ah.grh.traffic_class = r.tos;
	ah.is_global = 1;
	ah.port_num = 1;
	return ah;
}

}  // namespace xsrc::cm
