// The RoCE v2 codec (wire/): each header encodes to IBTA's byte layout and
// decodes back, the opcode table sizes the headers, and the ICRC matches a
// frame checked by tests/wire/icrc_check.py, which shares no code with it.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "wire/headers.h"

namespace w = xsrc::wire;

namespace {

std::vector<uint8_t> from_hex(const std::string &hex)
{
	std::vector<uint8_t> out;
	for (size_t i = 0; i + 1 < hex.size(); i += 2)
		out.push_back(static_cast<uint8_t>(std::stoul(hex.substr(i, 2), nullptr, 16)));
	return out;
}

// IPv4 10.77.0.2 -> 10.77.0.1, DF, ID 0; UDP 49152 -> 4791, checksum 0;
// UD SEND Only to QPN 0x100, PSN 7; DETH Q_Key 0x11111111, source QP
// 0x101; payload "xsrc". Its ICRC, from icrc_check.py --hex: 0xe92ba631.
const std::string kUdFrame =
	"4500003800004000401126190a4d00020a4d0001c00012b7002400006400ffff0000010000000007111111110000010178737263";
constexpr uint32_t kUdFrameIcrc = 0xe92ba631;

}  // namespace

TEST(WireBth, EncodesIbtaLayoutAndDecodesBack)
{
	w::Bth h;
	h.opcode = 0x0A;
	h.solicited = true;
	h.pad = 3;
	h.pkey = 0xFFFF;
	h.becn = true;
	h.dest_qpn = 0x123456;
	h.ack_req = true;
	h.psn = 0xABCDEF;
	std::array<uint8_t, w::kBthBytes> b{};
	w::encode(h, b);
	const std::array<uint8_t, w::kBthBytes> want = {0x0A, 0xB0, 0xFF, 0xFF, 0x40, 0x12,
							0x34, 0x56, 0x80, 0xAB, 0xCD, 0xEF};
	EXPECT_EQ(b, want);
	EXPECT_EQ(w::decode_bth(b), h);
}

TEST(WireBth, QpnAndPsnAre24Bits)
{
	w::Bth h;
	h.dest_qpn = 0xFF000001;
	h.psn = 0xFF000002;
	std::array<uint8_t, w::kBthBytes> b{};
	w::encode(h, b);
	w::Bth back = w::decode_bth(b);
	EXPECT_EQ(back.dest_qpn, 1u);
	EXPECT_EQ(back.psn, 2u);
}

TEST(WireExtensionHeaders, RoundTripInNetworkOrder)
{
	std::array<uint8_t, w::kDethBytes> deth{};
	w::encode(w::Deth{0x80010000, 0x000101}, deth);
	EXPECT_EQ(deth, (std::array<uint8_t, 8>{0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01}));
	EXPECT_EQ(w::decode_deth(deth), (w::Deth{0x80010000, 0x101}));

	std::array<uint8_t, w::kRethBytes> reth{};
	w::Reth r{0x1122334455667788, 0xAABBCCDD, 0x1000};
	w::encode(r, reth);
	EXPECT_EQ(reth[0], 0x11);
	EXPECT_EQ(reth[8], 0xAA);
	EXPECT_EQ(reth[14], 0x10);
	EXPECT_EQ(w::decode_reth(reth), r);

	std::array<uint8_t, w::kAethBytes> aeth{};
	w::encode(w::Aeth{0x1F, 0x000042}, aeth);
	EXPECT_EQ(aeth, (std::array<uint8_t, 4>{0x1F, 0x00, 0x00, 0x42}));
	EXPECT_EQ(w::decode_aeth(aeth), (w::Aeth{0x1F, 0x42}));

	std::array<uint8_t, w::kAtomicEthBytes> ateth{};
	w::AtomicEth a{0x1000, 0x55, 7, 9};
	w::encode(a, ateth);
	EXPECT_EQ(ateth[11], 0x55);
	EXPECT_EQ(ateth[19], 7);
	EXPECT_EQ(ateth[27], 9);
	EXPECT_EQ(w::decode_atomic_eth(ateth), a);

	std::array<uint8_t, w::kAtomicAckEthBytes> aack{};
	w::encode(w::AtomicAckEth{0x0102030405060708}, aack);
	EXPECT_EQ(aack[0], 1);
	EXPECT_EQ(w::decode_atomic_ack_eth(aack).original, 0x0102030405060708u);

	std::array<uint8_t, w::kImmDtBytes> imm{};
	uint32_t raw = htonl(0xDEADBEEF);
	w::encode(w::ImmDt{raw}, imm);
	EXPECT_EQ(imm, (std::array<uint8_t, 4>{0xDE, 0xAD, 0xBE, 0xEF}));
	EXPECT_EQ(w::decode_immdt(imm).raw, raw);

	std::array<uint8_t, w::kIethBytes> ieth{};
	w::encode(w::Ieth{0x01020304}, ieth);
	EXPECT_EQ(w::decode_ieth(ieth).rkey, 0x01020304u);

	std::array<uint8_t, w::kXrcEthBytes> xrc{};
	w::encode(w::XrcEth{0xFF000203}, xrc);
	EXPECT_EQ(xrc, (std::array<uint8_t, 4>{0x00, 0x00, 0x02, 0x03}));
	EXPECT_EQ(w::decode_xrceth(xrc).srqn, 0x203u);
}

TEST(WireOpcodes, TableSizesTheHeaders)
{
	EXPECT_EQ(w::header_bytes(0x64), w::kBthBytes + w::kDethBytes);                      // UD SEND Only
	EXPECT_EQ(w::header_bytes(0x65), w::kBthBytes + w::kDethBytes + w::kImmDtBytes);     // with Immediate
	EXPECT_EQ(w::header_bytes(0x04), w::kBthBytes);                                      // RC SEND Only
	EXPECT_EQ(w::header_bytes(0x0B), w::kBthBytes + w::kRethBytes + w::kImmDtBytes);     // WRITE Only Imm
	EXPECT_EQ(w::header_bytes(0x0C), w::kBthBytes + w::kRethBytes);                      // READ Request
	EXPECT_EQ(w::header_bytes(0x10), w::kBthBytes + w::kAethBytes);                      // READ resp Only
	EXPECT_EQ(w::header_bytes(0x12), w::kBthBytes + w::kAethBytes + w::kAtomicAckEthBytes);
	EXPECT_EQ(w::header_bytes(0x13), w::kBthBytes + w::kAtomicEthBytes);                 // CmpSwap
	EXPECT_EQ(w::header_bytes(0x17), w::kBthBytes + w::kIethBytes);                      // SEND Only Inv
	EXPECT_EQ(w::header_bytes(0x2A), w::kBthBytes + w::kRethBytes);                      // UC WRITE Only
	EXPECT_EQ(w::header_bytes(0xA4), w::kBthBytes + w::kXrcEthBytes);                    // XRC SEND Only
	EXPECT_EQ(w::header_bytes(0xAA), w::kBthBytes + w::kXrcEthBytes + w::kRethBytes);
	EXPECT_EQ(w::header_bytes(0xB1), w::kBthBytes + w::kAethBytes);                      // XRC ACK: no XRCETH
	EXPECT_EQ(w::header_bytes(0xB7), w::kBthBytes + w::kXrcEthBytes + w::kIethBytes);    // XRC SEND Only Inv
	EXPECT_EQ(w::header_bytes(0x1D), w::kBthBytes + w::kRethBytes);                      // ATOMIC WRITE
	EXPECT_TRUE(w::opcode_info(0x1D)->ext & w::kExtPayload);
	EXPECT_STREQ(w::opcode_info(0x64)->name, "UD SEND Only");
}

TEST(WireOpcodes, ReservedOpcodesHaveNoEntry)
{
	EXPECT_EQ(w::opcode_info(0x15), nullptr);  // RC: reserved
	EXPECT_EQ(w::opcode_info(0x2C), nullptr);  // UC has no READ
	EXPECT_EQ(w::opcode_info(0x60), nullptr);  // UD has SEND Only alone
	EXPECT_EQ(w::opcode_info(0x66), nullptr);
	EXPECT_EQ(w::opcode_info(0x1F), nullptr);
	EXPECT_EQ(w::opcode_info(0x1C), nullptr);  // FLUSH: not carried
	EXPECT_EQ(w::opcode_info(0x3D), nullptr);  // UC has no ATOMIC WRITE
	EXPECT_EQ(w::opcode_info(0xFF), nullptr);
	EXPECT_EQ(w::header_bytes(0x1F), 0u);
}

// A QP's UDP source port: 0xC000 and up, the same for the same QPs, and
// spread over the range by different ones.
TEST(WireUdp, SourcePortIsAStableHashOfTheQps)
{
	EXPECT_EQ(w::udp_source_port(0x100, 0x200), w::udp_source_port(0x100, 0x200));
	std::set<uint16_t> ports;
	for (uint32_t qpn = 0x100; qpn < 0x100 + 256; ++qpn) {
		uint16_t p = w::udp_source_port(qpn, 0x345);
		EXPECT_GE(p, 0xC000);
		ports.insert(p);
	}
	EXPECT_GT(ports.size(), 200u);  // few collisions among 256 QPs in 16384 ports
	EXPECT_NE(w::udp_source_port(0x100, 0x200), w::udp_source_port(0x200, 0x100));
}

TEST(WireIp, Ipv4EncodesWithChecksumAndDecodes)
{
	std::vector<uint8_t> frame = from_hex(kUdFrame);
	w::Ipv4 h;
	h.total_length = 0x38;
	inet_pton(AF_INET, "10.77.0.2", &h.src);
	inet_pton(AF_INET, "10.77.0.1", &h.dst);
	std::array<uint8_t, w::kIpv4Bytes> b{};
	w::encode(h, b);
	EXPECT_TRUE(std::equal(b.begin(), b.end(), frame.begin()));
	EXPECT_EQ(w::internet_checksum(b), 0);  // a header with its checksum sums to zero
	auto back = w::decode_ipv4(b);
	ASSERT_TRUE(back);
	EXPECT_EQ(back->total_length, 0x38);
	EXPECT_EQ(back->flags_fragment, 0x4000);
	EXPECT_EQ(back->protocol, w::kIpProtoUdp);
	b[0] = 0x46;  // options: not ours
	EXPECT_FALSE(w::decode_ipv4(b));
}

TEST(WireIp, Ipv6AndUdpRoundTrip)
{
	w::Ipv6 h;
	h.traffic_class = 0xA5;
	h.flow_label = 0x12345;
	h.payload_length = 100;
	inet_pton(AF_INET6, "fd77::2", &h.src);
	inet_pton(AF_INET6, "fd77::1", &h.dst);
	std::array<uint8_t, w::kIpv6Bytes> b{};
	w::encode(h, b);
	EXPECT_EQ(b[0], 0x6A);
	EXPECT_EQ(b[1], 0x51);
	auto back = w::decode_ipv6(b);
	ASSERT_TRUE(back);
	EXPECT_EQ(back->traffic_class, 0xA5);
	EXPECT_EQ(back->flow_label, 0x12345u);
	EXPECT_EQ(back->payload_length, 100);
	EXPECT_EQ(std::memcmp(&back->dst, &h.dst, 16), 0);

	std::array<uint8_t, w::kUdpBytes> u{};
	w::encode(w::Udp{49152, w::kRoceV2Port, 36, 0}, u);
	EXPECT_EQ(u, (std::array<uint8_t, 8>{0xC0, 0x00, 0x12, 0xB7, 0x00, 0x24, 0x00, 0x00}));
	EXPECT_EQ(w::decode_udp(u).dst_port, 4791);
}

TEST(WireGrh, FromIpv4HoldsTheHeaderInItsLast20Bytes)
{
	std::vector<uint8_t> frame = from_hex(kUdFrame);
	auto grh = w::grh_from_ip(std::span<const uint8_t>(frame).first(w::kIpv4Bytes));
	EXPECT_TRUE(std::all_of(grh.begin(), grh.begin() + 20, [](uint8_t b) { return b == 0; }));
	EXPECT_TRUE(std::equal(grh.begin() + 20, grh.end(), frame.begin()));
}

TEST(WireGrh, FromIpv6IsTheIpv6Header)
{
	w::Ipv6 h;
	inet_pton(AF_INET6, "fd77::2", &h.src);
	std::array<uint8_t, w::kIpv6Bytes> b{};
	w::encode(h, b);
	EXPECT_EQ(w::grh_from_ip(b), b);
}

TEST(WireIcrc, MatchesTheIndependentChecker)
{
	std::vector<uint8_t> frame = from_hex(kUdFrame);
	auto crc = w::icrc(frame);
	ASSERT_TRUE(crc);
	EXPECT_EQ(*crc, kUdFrameIcrc);
	std::array<uint8_t, 4> stored{};
	w::store_icrc(*crc, stored);
	EXPECT_EQ(stored, (std::array<uint8_t, 4>{0x31, 0xA6, 0x2B, 0xE9}));  // little-endian
	frame.insert(frame.end(), stored.begin(), stored.end());
	EXPECT_TRUE(w::icrc_ok(frame));
}

TEST(WireIcrc, IgnoresTheFieldsRoutersChange)
{
	std::vector<uint8_t> frame = from_hex(kUdFrame);
	frame[1] = 0xB8;   // TOS
	frame[8] = 3;      // TTL
	frame[10] = 0x12;  // header checksum
	frame[26] = 0x77;  // UDP checksum
	frame[28 + 4] = 0xC0;  // BTH FECN, BECN
	EXPECT_EQ(*w::icrc(frame), kUdFrameIcrc);
}

TEST(WireIcrc, CoversEverythingElse)
{
	const std::vector<uint8_t> good = from_hex(kUdFrame);
	for (size_t i : {size_t(4), size_t(6), size_t(15), size_t(21), size_t(24), size_t(29), size_t(35),
			 size_t(40), good.size() - 1}) {
		std::vector<uint8_t> bad = good;
		bad[i] ^= 0x01;
		EXPECT_NE(*w::icrc(bad), kUdFrameIcrc) << "byte " << i;
	}
	std::vector<uint8_t> with = good;
	with.resize(with.size() + 4);
	w::store_icrc(kUdFrameIcrc ^ 1, std::span<uint8_t, 4>(with.data() + good.size(), 4));
	EXPECT_FALSE(w::icrc_ok(with));
}

TEST(WireIcrc, Ipv6MasksClassFlowAndHopLimit)
{
	w::Ipv6 ip;
	ip.payload_length = w::kUdpBytes + w::kBthBytes;
	inet_pton(AF_INET6, "fd77::2", &ip.src);
	inet_pton(AF_INET6, "fd77::1", &ip.dst);
	std::vector<uint8_t> pkt(w::kIpv6Bytes + w::kUdpBytes + w::kBthBytes);
	w::encode(ip, std::span<uint8_t, w::kIpv6Bytes>(pkt.data(), w::kIpv6Bytes));
	w::encode(w::Udp{1234, w::kRoceV2Port, ip.payload_length, 0},
		  std::span<uint8_t, w::kUdpBytes>(pkt.data() + w::kIpv6Bytes, w::kUdpBytes));
	uint32_t base = *w::icrc(pkt);
	ip.traffic_class = 0xFF;
	ip.flow_label = 0xABCDE;
	ip.hop_limit = 1;
	w::encode(ip, std::span<uint8_t, w::kIpv6Bytes>(pkt.data(), w::kIpv6Bytes));
	EXPECT_EQ(*w::icrc(pkt), base);
	pkt[8] ^= 1;  // the source address is covered
	EXPECT_NE(*w::icrc(pkt), base);
}

TEST(WireIcrc, TooShortHasNone)
{
	std::vector<uint8_t> frame = from_hex(kUdFrame);
	EXPECT_FALSE(w::icrc(std::span<const uint8_t>(frame).first(30)));
	EXPECT_FALSE(w::icrc({}));
	EXPECT_FALSE(w::icrc_ok(std::span<const uint8_t>(frame).first(3)));
}

TEST(WireGid, Ipv4Mapped)
{
	std::array<uint8_t, 16> gid{};
	gid[10] = gid[11] = 0xFF;
	gid[12] = 10;
	gid[15] = 1;
	EXPECT_TRUE(w::gid_is_ipv4_mapped(gid));
	EXPECT_EQ(ntohl(w::gid_ipv4(gid).s_addr), 0x0A000001u);
	gid[10] = 0;
	EXPECT_FALSE(w::gid_is_ipv4_mapped(gid));
}

namespace {

// The packets a kernel cuts a GSO datagram of `sizes` UDP payloads into
// (RC WRITE MIDDLE packets: BTH, payload, ICRC), over IPv4 or IPv6; an
// IPv4 packet's ID is `id(k)`. Each is a whole IP packet with its ICRC.
std::vector<std::vector<uint8_t>> kernel_segments(bool v6, const std::vector<size_t> &sizes,
						  uint16_t (*id)(size_t))
{
	std::vector<std::vector<uint8_t>> out;
	for (size_t k = 0; k < sizes.size(); ++k) {
		size_t ip_len = v6 ? w::kIpv6Bytes : w::kIpv4Bytes;
		uint16_t udp_len = static_cast<uint16_t>(w::kUdpBytes + sizes[k]);
		std::vector<uint8_t> p(ip_len + udp_len);
		if (v6) {
			w::Ipv6 ip;
			ip.payload_length = udp_len;
			inet_pton(AF_INET6, "fd77::2", &ip.src);
			inet_pton(AF_INET6, "fd77::1", &ip.dst);
			w::encode(ip, std::span<uint8_t, w::kIpv6Bytes>(p.data(), w::kIpv6Bytes));
		} else {
			w::Ipv4 ip;
			ip.total_length = static_cast<uint16_t>(ip_len + udp_len);
			ip.id = id(k);
			inet_pton(AF_INET, "10.77.0.2", &ip.src);
			inet_pton(AF_INET, "10.77.0.1", &ip.dst);
			w::encode(ip, std::span<uint8_t, w::kIpv4Bytes>(p.data(), w::kIpv4Bytes));
		}
		w::encode(w::Udp{49152, w::kRoceV2Port, udp_len, 0},
			  std::span<uint8_t, w::kUdpBytes>(p.data() + ip_len, w::kUdpBytes));
		w::Bth bth;
		bth.opcode = w::op::kWriteMiddle;
		bth.dest_qpn = 0x100;
		bth.psn = static_cast<uint32_t>(k);
		w::encode(bth, std::span<uint8_t, w::kBthBytes>(p.data() + ip_len + w::kUdpBytes, w::kBthBytes));
		size_t payload_at = ip_len + w::kUdpBytes + w::kBthBytes;
		for (size_t i = payload_at; i + w::kIcrcBytes < p.size(); ++i)
			p[i] = static_cast<uint8_t>(i * 7 + k);
		uint32_t crc = *w::icrc(std::span<const uint8_t>(p).first(p.size() - w::kIcrcBytes));
		w::store_icrc(crc, std::span<uint8_t, w::kIcrcBytes>(p.data() + p.size() - w::kIcrcBytes, w::kIcrcBytes));
		out.push_back(std::move(p));
	}
	return out;
}

// The datagram before the cut: the first packet's IP and UDP headers with
// the whole length, then every packet's UDP payload.
std::vector<uint8_t> gso_datagram(bool v6, const std::vector<std::vector<uint8_t>> &packets)
{
	size_t headers = (v6 ? w::kIpv6Bytes : w::kIpv4Bytes) + w::kUdpBytes;
	std::vector<uint8_t> d(packets[0].begin(), packets[0].begin() + static_cast<long>(headers));
	for (const auto &p : packets)
		d.insert(d.end(), p.begin() + static_cast<long>(headers), p.end());
	uint16_t udp_len = static_cast<uint16_t>(d.size() - headers + w::kUdpBytes);
	size_t ip_len = headers - w::kUdpBytes;
	d[ip_len + 4] = static_cast<uint8_t>(udp_len >> 8);
	d[ip_len + 5] = static_cast<uint8_t>(udp_len);
	uint16_t len = static_cast<uint16_t>(v6 ? udp_len : d.size());
	d[v6 ? 4 : 2] = static_cast<uint8_t>(len >> 8);
	d[v6 ? 5 : 3] = static_cast<uint8_t>(len);
	return d;
}

std::vector<std::vector<uint8_t>> split(const std::vector<uint8_t> &datagram, size_t segment, size_t max,
					size_t &count, size_t &checked)
{
	std::vector<uint8_t> room(datagram.size() + 64 * (w::kIpv6Bytes + w::kUdpBytes));
	std::vector<std::vector<uint8_t>> got;
	checked = 0;
	count = w::split_gso(datagram, segment, max, room.data(), [&](std::span<const uint8_t> p, bool ok) {
		got.emplace_back(p.begin(), p.end());
		checked += ok;
	});
	return got;
}

uint16_t id_by_index(size_t k) { return static_cast<uint16_t>(k); }
uint16_t id_fixed(size_t) { return 0; }

}  // namespace

// What the kernel makes of a GSO datagram that it cuts itself (before a NIC,
// or at a UDP socket): packets numbered from the datagram's ID, each with
// its own lengths and the ICRC its sender computed for them.
TEST(WireGso, SplitsAsTheKernelCutsIpv4)
{
	const std::vector<size_t> sizes{1040, 1040, 1040, 1040, 300};
	auto want = kernel_segments(false, sizes, id_by_index);
	size_t count = 0, checked = 0;
	auto got = split(gso_datagram(false, want), 1040, 64, count, checked);
	EXPECT_EQ(count, sizes.size());
	EXPECT_EQ(got, want);
	EXPECT_EQ(checked, sizes.size() - 1);  // all but the first had their ICRC checked on the way
	for (const auto &p : got)
		EXPECT_TRUE(w::icrc_ok(p));
}

TEST(WireGso, SplitsIpv6)
{
	const std::vector<size_t> sizes{1040, 1040, 1040};
	auto want = kernel_segments(true, sizes, id_fixed);
	size_t count = 0, checked = 0;
	auto got = split(gso_datagram(true, want), 1040, 64, count, checked);
	EXPECT_EQ(count, 3u);
	EXPECT_EQ(got, want);
	EXPECT_EQ(checked, 0u);  // handle() checks them
}

// Packets sent with one fixed ID (ID 0 from an unconnected socket with DF,
// as rxe's and ours without GSO) that a netdev's GRO merged.
TEST(WireGso, PacketsGroMergedKeepTheirFixedId)
{
	const std::vector<size_t> sizes{1040, 1040, 1040, 1040};
	auto want = kernel_segments(false, sizes, id_fixed);
	size_t count = 0, checked = 0;
	auto got = split(gso_datagram(false, want), 1040, 64, count, checked);
	EXPECT_EQ(got, want);
	for (const auto &p : got)
		EXPECT_TRUE(w::icrc_ok(p));
}

TEST(WireGso, RefusesWhatIsNoUdpDatagramOrTooManyPackets)
{
	auto packets = kernel_segments(false, {1040, 1040, 1040}, id_by_index);
	auto datagram = gso_datagram(false, packets);
	size_t count = 0, checked = 0;
	EXPECT_TRUE(split(datagram, 1040, 2, count, checked).empty());  // more packets than allowed
	EXPECT_EQ(count, 0u);
	EXPECT_TRUE(split(datagram, 0, 64, count, checked).empty());
	EXPECT_EQ(count, 0u);
	auto tcp = datagram;
	tcp[9] = 6;  // protocol TCP
	EXPECT_TRUE(split(tcp, 1040, 64, count, checked).empty());
	auto options = datagram;
	options[0] = 0x46;  // IHL 6
	EXPECT_TRUE(split(options, 1040, 64, count, checked).empty());
	std::vector<uint8_t> headers_only(datagram.begin(), datagram.begin() + 28);
	EXPECT_TRUE(split(headers_only, 1040, 64, count, checked).empty());
	EXPECT_EQ(count, 0u);
}

// A segment size that does not match the packets inside cuts them wrong:
// every ICRC then fails (counted bad by the receiver), nothing is made up.
TEST(WireGso, AWrongSegmentSizeFailsTheIcrcs)
{
	auto packets = kernel_segments(false, {1040, 1040, 1040}, id_by_index);
	size_t count = 0, checked = 0;
	auto got = split(gso_datagram(false, packets), 1000, 64, count, checked);
	EXPECT_EQ(count, 4u);
	EXPECT_EQ(checked, 0u);
	for (const auto &p : got)
		EXPECT_FALSE(w::icrc_ok(p));
}
