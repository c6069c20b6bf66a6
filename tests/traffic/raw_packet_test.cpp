// Raw packet QPs on xsrc0's netdev, against packet sockets of the test's own
// (which share no code with the provider): a frame a raw QP sends is seen on
// the netdev byte for byte; a frame another process (or socket) sends on it
// reaches a raw QP whose flow matches it, and only such a QP; the specs
// (Ethernet, IPv4, IPv6, TCP, UDP) each decide; and the error paths: too
// long and too short frames, bad keys, small receives, opcodes, flows on
// other QP types or with specs the device lacks, a QP with flows, a caller
// without CAP_NET_RAW. Frames carry the IEEE local experimental EtherType and
// a locally administered multicast destination: nothing else takes them.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <netinet/ip.h>
#include <netinet/ip6.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <gtest/gtest.h>
#include <thread>
#include <vector>

namespace {

constexpr uint16_t kEtherExperimental = 0x88b5;
constexpr uint8_t kDst[6] = {0x03, 0x78, 0x73, 0x72, 0x63, 0x01};  // local, multicast
constexpr uint8_t kOtherDst[6] = {0x03, 0x78, 0x73, 0x72, 0x63, 0x02};
constexpr uint8_t kSrc[6] = {0x02, 0x78, 0x73, 0x72, 0x63, 0x09};
constexpr size_t kBuf = 16384;  // a slot of the test's buffer: a frame of a jumbo MTU fits
constexpr auto kWait = std::chrono::seconds(2);
constexpr auto kQuiet = std::chrono::milliseconds(200);

ibv_context *open_xsrc0()
{
	int n = 0;
	ibv_context *ctx = nullptr;
	ibv_device **list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n && !ctx; ++i)
		if (std::strcmp(ibv_get_device_name(list[i]), "xsrc0") == 0)
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	return ctx;
}

std::vector<uint8_t> eth_frame(const uint8_t *dst, uint16_t ether_type, size_t payload, uint8_t fill)
{
	std::vector<uint8_t> f(14 + payload);
	std::memcpy(f.data(), dst, 6);
	std::memcpy(f.data() + 6, kSrc, 6);
	uint16_t et = htons(ether_type);
	std::memcpy(f.data() + 12, &et, 2);
	for (size_t i = 0; i < payload; ++i)
		f[14 + i] = static_cast<uint8_t>(fill + i);
	return f;
}

// A raw packet QP of `pd` on `cq`, in RTS; null on any failure.
ibv_qp *make_raw_qp(ibv_pd *pd, ibv_cq *cq, ibv_qp_cap cap)
{
	ibv_qp_init_attr attr{};
	attr.qp_type = IBV_QPT_RAW_PACKET;
	attr.send_cq = attr.recv_cq = cq;
	attr.cap = cap;
	ibv_qp *qp = ibv_create_qp(pd, &attr);
	if (!qp)
		return nullptr;
	ibv_qp_attr a{};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	bool ok = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT) == 0;
	a.qp_state = IBV_QPS_RTR;
	ok = ok && ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0;
	a.qp_state = IBV_QPS_RTS;
	ok = ok && ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0;
	if (!ok) {
		ibv_destroy_qp(qp);
		return nullptr;
	}
	return qp;
}

// Ethernet + IPv4 or IPv6 + UDP or TCP header (checksums are not looked at).
std::vector<uint8_t> ip_frame(bool v6, uint8_t proto, uint16_t sport, uint16_t dport,
			      const char *src4 = "192.0.2.1", const char *dst4 = "192.0.2.2")
{
	std::vector<uint8_t> f = eth_frame(kDst, v6 ? ETHERTYPE_IPV6 : ETHERTYPE_IP, 0, 0);
	size_t l4_len = proto == IPPROTO_TCP ? 20 : 8;
	if (v6) {
		ip6_hdr h{};
		h.ip6_vfc = 6 << 4;
		h.ip6_plen = htons(static_cast<uint16_t>(l4_len));
		h.ip6_nxt = proto;
		h.ip6_hlim = 64;
		inet_pton(AF_INET6, "fd00::1", &h.ip6_src);
		inet_pton(AF_INET6, "fd00::2", &h.ip6_dst);
		auto *p = reinterpret_cast<uint8_t *>(&h);
		f.insert(f.end(), p, p + sizeof(h));
	} else {
		iphdr h{};
		h.version = 4;
		h.ihl = 5;
		h.tot_len = htons(static_cast<uint16_t>(20 + l4_len));
		h.ttl = 64;
		h.protocol = proto;
		inet_pton(AF_INET, src4, &h.saddr);
		inet_pton(AF_INET, dst4, &h.daddr);
		auto *p = reinterpret_cast<uint8_t *>(&h);
		f.insert(f.end(), p, p + sizeof(h));
	}
	std::vector<uint8_t> l4(l4_len);
	uint16_t s = htons(sport), d = htons(dport);
	std::memcpy(l4.data(), &s, 2);
	std::memcpy(l4.data() + 2, &d, 2);
	f.insert(f.end(), l4.begin(), l4.end());
	return f;
}

// A packet socket of the test on the device's netdev.
class PacketSocket {
public:
	explicit PacketSocket(int ifindex) : ifindex_(ifindex)
	{
		fd_ = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
		sockaddr_ll a{};
		a.sll_family = AF_PACKET;
		a.sll_protocol = htons(ETH_P_ALL);
		a.sll_ifindex = ifindex;
		if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr *>(&a), sizeof(a)))
			fd_ = -1;
	}
	~PacketSocket()
	{
		if (fd_ >= 0)
			close(fd_);
	}
	bool ok() const { return fd_ >= 0; }
	bool send(const std::vector<uint8_t> &f)
	{
		sockaddr_ll to{};
		to.sll_family = AF_PACKET;
		to.sll_ifindex = ifindex_;
		return sendto(fd_, f.data(), f.size(), 0, reinterpret_cast<sockaddr *>(&to), sizeof(to)) ==
		       static_cast<ssize_t>(f.size());
	}
	// Waits for a frame equal to `want`.
	bool saw(const std::vector<uint8_t> &want)
	{
		auto until = std::chrono::steady_clock::now() + kWait;
		std::vector<uint8_t> buf(65536);
		while (std::chrono::steady_clock::now() < until) {
			pollfd p{fd_, POLLIN, 0};
			if (poll(&p, 1, 100) <= 0)
				continue;
			ssize_t n = recv(fd_, buf.data(), buf.size(), 0);
			if (n == static_cast<ssize_t>(want.size()) && std::memcmp(buf.data(), want.data(), want.size()) == 0)
				return true;
		}
		return false;
	}

private:
	int fd_ = -1;
	int ifindex_;
};

class RawPacket : public ::testing::Test {
protected:
	void SetUp() override
	{
		ctx = open_xsrc0();
		ASSERT_NE(ctx, nullptr) << "no xsrc0";
		ibv_gid_entry gid{};
		ASSERT_EQ(ibv_query_gid_ex(ctx, 1, 0, &gid, 0), 0);
		ifindex = static_cast<int>(gid.ndev_ifindex);
		ASSERT_GT(ifindex, 0);
		ifreq ifr{};
		int s = socket(AF_INET, SOCK_DGRAM, 0);
		ASSERT_TRUE(if_indextoname(static_cast<unsigned>(ifindex), ifr.ifr_name));
		ASSERT_EQ(ioctl(s, SIOCGIFMTU, &ifr), 0);
		close(s);
		mtu = static_cast<size_t>(ifr.ifr_mtu);
		pd = ibv_alloc_pd(ctx);
		cq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0);
		ASSERT_TRUE(pd && cq);
		buf.assign(kBuf * 16, 0);
		mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
		ASSERT_NE(mr, nullptr);
	}
	void TearDown() override
	{
		for (ibv_flow *f : flows)
			EXPECT_EQ(ibv_destroy_flow(f), 0);
		for (ibv_qp *q : qps)
			EXPECT_EQ(ibv_destroy_qp(q), 0);
		if (mr)
			ibv_dereg_mr(mr);
		if (cq)
			ibv_destroy_cq(cq);
		if (pd)
			ibv_dealloc_pd(pd);
		if (ctx)
			ibv_close_device(ctx);
	}

	ibv_qp *raw_qp()
	{
		ibv_qp *qp = make_raw_qp(pd, cq, {64, 64, 2, 2, 64});
		if (qp)
			qps.push_back(qp);
		return qp;
	}

	// A flow of `qp` on Ethernet destination `dst` and the experimental type.
	ibv_flow *eth_flow(ibv_qp *qp, const uint8_t *dst)
	{
		struct {
			ibv_flow_attr attr;
			ibv_flow_spec_eth eth;
		} f{};
		f.attr.type = IBV_FLOW_ATTR_NORMAL;
		f.attr.size = sizeof(f);
		f.attr.num_of_specs = 1;
		f.attr.port = 1;
		f.eth.type = IBV_FLOW_SPEC_ETH;
		f.eth.size = sizeof(f.eth);
		std::memcpy(f.eth.val.dst_mac, dst, 6);
		std::memset(f.eth.mask.dst_mac, 0xff, 6);
		f.eth.val.ether_type = htons(kEtherExperimental);
		f.eth.mask.ether_type = 0xffff;
		return keep(ibv_create_flow(qp, &f.attr));
	}
	ibv_flow *keep(ibv_flow *f)
	{
		if (f)
			flows.push_back(f);
		return f;
	}
	void drop_flow(ibv_flow *f)
	{
		std::erase(flows, f);
		EXPECT_EQ(ibv_destroy_flow(f), 0);
	}

	int post_recv(ibv_qp *qp, size_t slot, uint32_t len = kBuf)
	{
		ibv_sge sge{reinterpret_cast<uintptr_t>(&buf[slot * kBuf]), len, mr->lkey};
		ibv_recv_wr wr{}, *bad;
		wr.wr_id = 1000 + slot;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		return ibv_post_recv(qp, &wr, &bad);
	}
	int post_send(ibv_qp *qp, const std::vector<uint8_t> &frame, size_t slot, uint32_t lkey = 0)
	{
		std::memcpy(&buf[slot * kBuf], frame.data(), std::min(frame.size(), kBuf));
		ibv_sge sge{reinterpret_cast<uintptr_t>(&buf[slot * kBuf]), static_cast<uint32_t>(frame.size()),
			    lkey ? lkey : mr->lkey};
		ibv_send_wr wr{}, *bad;
		wr.wr_id = 2000 + slot;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		return ibv_post_send(qp, &wr, &bad);
	}
	// The next completion within `wait`; false when none came.
	bool poll(ibv_wc &wc, std::chrono::milliseconds wait = std::chrono::duration_cast<std::chrono::milliseconds>(kWait))
	{
		auto until = std::chrono::steady_clock::now() + wait;
		do {
			int n = ibv_poll_cq(cq, 1, &wc);
			if (n == 1)
				return true;
			if (n < 0)
				return false;
			std::this_thread::sleep_for(std::chrono::milliseconds(1));
		} while (std::chrono::steady_clock::now() < until);
		return false;
	}
	// A frame injected by a packet socket: received by `qp` in `slot`?
	void expect_received(const std::vector<uint8_t> &frame, size_t slot)
	{
		ibv_wc wc{};
		ASSERT_TRUE(poll(wc)) << "no receive completion";
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
		EXPECT_EQ(wc.opcode, IBV_WC_RECV);
		EXPECT_EQ(wc.wr_id, 1000 + slot);
		EXPECT_EQ(wc.byte_len, frame.size());
		EXPECT_EQ(std::memcmp(&buf[slot * kBuf], frame.data(), frame.size()), 0);
	}
	void expect_nothing()
	{
		ibv_wc wc{};
		EXPECT_FALSE(poll(wc, std::chrono::duration_cast<std::chrono::milliseconds>(kQuiet)))
			<< "unexpected completion wr_id " << wc.wr_id << " status " << wc.status;
	}

	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	ibv_cq *cq = nullptr;
	ibv_mr *mr = nullptr;
	int ifindex = 0;
	size_t mtu = 0;  // the netdev's
	std::vector<uint8_t> buf;
	std::vector<ibv_qp *> qps;
	std::vector<ibv_flow *> flows;
};

TEST_F(RawPacket, SentFrameIsOnTheNetdev)
{
	PacketSocket tap(ifindex);
	ASSERT_TRUE(tap.ok());
	ibv_qp *qp = raw_qp();
	ASSERT_NE(qp, nullptr);
	// Up to the MTU (as far as a slot holds); a frame with a VLAN tag may
	// carry the tag on top.
	size_t top = std::min(mtu, kBuf - 18);
	std::vector<std::vector<uint8_t>> frames;
	for (size_t size : {size_t(0), size_t(46), std::min(size_t(1000), top), top})
		frames.push_back(eth_frame(kDst, kEtherExperimental, size, static_cast<uint8_t>(size)));
	std::vector<uint8_t> tagged = eth_frame(kDst, 0x8100, top + 4, 3);
	tagged[14] = 0;  // VLAN 5, then the experimental EtherType
	tagged[15] = 5;
	tagged[16] = 0x88;
	tagged[17] = 0xb5;
	frames.push_back(tagged);
	for (const std::vector<uint8_t> &f : frames) {
		size_t size = f.size();
		ASSERT_EQ(post_send(qp, f, 1), 0);
		ibv_wc wc{};
		ASSERT_TRUE(poll(wc));
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << size;
		EXPECT_EQ(wc.opcode, IBV_WC_SEND);
		EXPECT_TRUE(tap.saw(f)) << "a frame of " << f.size() << " bytes not seen on the netdev";
	}
	ibv_qp_attr attr{};
	ibv_qp_init_attr init{};
	ASSERT_EQ(ibv_query_qp(qp, &attr, IBV_QP_STATE, &init), 0);
	EXPECT_EQ(attr.qp_state, IBV_QPS_RTS);
	EXPECT_EQ(init.qp_type, IBV_QPT_RAW_PACKET);
}

TEST_F(RawPacket, FlowSteersFramesFromTheNetdev)
{
	PacketSocket wire(ifindex);
	ASSERT_TRUE(wire.ok());
	ibv_qp *qp = raw_qp(), *other = raw_qp();
	ASSERT_TRUE(qp && other);
	// Without a flow a raw QP receives nothing.
	ASSERT_EQ(post_recv(qp, 0), 0);
	ASSERT_EQ(post_recv(other, 1), 0);
	std::vector<uint8_t> f = eth_frame(kDst, kEtherExperimental, 100, 7);
	ASSERT_TRUE(wire.send(f));
	expect_nothing();
	ASSERT_NE(eth_flow(qp, kDst), nullptr);
	ASSERT_NE(eth_flow(other, kOtherDst), nullptr);
	ASSERT_TRUE(wire.send(eth_frame(kDst, 0x88b6, 100, 1)));  // another EtherType
	expect_nothing();
	ASSERT_TRUE(wire.send(f));
	expect_received(f, 0);
	std::vector<uint8_t> g = eth_frame(kOtherDst, kEtherExperimental, 60, 9);
	ASSERT_TRUE(wire.send(g));
	expect_received(g, 1);
	// No receive posted: the frame is dropped, the next one is received.
	ASSERT_TRUE(wire.send(f));
	expect_nothing();
	ASSERT_EQ(post_recv(qp, 2), 0);
	ASSERT_TRUE(wire.send(f));
	expect_received(f, 2);
	// A destroyed flow steers nothing more.
	drop_flow(flows.front());
	ASSERT_EQ(post_recv(qp, 3), 0);
	ASSERT_TRUE(wire.send(f));
	expect_nothing();
}

TEST_F(RawPacket, SpecsDecide)
{
	PacketSocket wire(ifindex);
	ASSERT_TRUE(wire.ok());
	ibv_qp *qp = raw_qp();
	ASSERT_NE(qp, nullptr);
	struct {
		ibv_flow_attr attr;
		ibv_flow_spec_ipv4_ext ip;
		ibv_flow_spec_tcp_udp udp;
	} v4{};
	v4.attr = {0, IBV_FLOW_ATTR_NORMAL, sizeof(v4), 0, 2, 1, 0};
	v4.ip.type = IBV_FLOW_SPEC_IPV4_EXT;
	v4.ip.size = sizeof(v4.ip);
	inet_pton(AF_INET, "192.0.2.2", &v4.ip.val.dst_ip);
	v4.ip.mask.dst_ip = 0xffffffff;
	v4.udp.type = IBV_FLOW_SPEC_UDP;
	v4.udp.size = sizeof(v4.udp);
	v4.udp.val.dst_port = htons(4242);
	v4.udp.mask.dst_port = 0xffff;
	ASSERT_NE(keep(ibv_create_flow(qp, &v4.attr)), nullptr);
	struct {
		ibv_flow_attr attr;
		ibv_flow_spec_ipv6 ip;
		ibv_flow_spec_tcp_udp tcp;
	} v6{};
	v6.attr = {0, IBV_FLOW_ATTR_NORMAL, sizeof(v6), 0, 2, 1, 0};
	v6.ip.type = IBV_FLOW_SPEC_IPV6;
	v6.ip.size = sizeof(v6.ip);
	inet_pton(AF_INET6, "fd00::1", v6.ip.val.src_ip);
	std::memset(v6.ip.mask.src_ip, 0xff, 16);
	v6.tcp.type = IBV_FLOW_SPEC_TCP;
	v6.tcp.size = sizeof(v6.tcp);
	v6.tcp.val.src_port = htons(4343);
	v6.tcp.mask.src_port = 0xffff;
	ASSERT_NE(keep(ibv_create_flow(qp, &v6.attr)), nullptr);

	size_t slot = 0;
	for (auto [frame, wanted] : {std::pair{ip_frame(false, IPPROTO_UDP, 1, 4242), true},
				     std::pair{ip_frame(false, IPPROTO_UDP, 1, 4243), false},  // port
				     std::pair{ip_frame(false, IPPROTO_TCP, 1, 4242), false},  // protocol
				     std::pair{ip_frame(true, IPPROTO_TCP, 4343, 9), true},
				     std::pair{ip_frame(true, IPPROTO_UDP, 4343, 9), false},
				     std::pair{ip_frame(true, IPPROTO_TCP, 4344, 9), false}}) {
		ASSERT_EQ(post_recv(qp, slot), 0);
		ASSERT_TRUE(wire.send(frame));
		if (wanted) {
			expect_received(frame, slot);
			++slot;
		} else {
			expect_nothing();
		}
	}
}

// A frame a raw QP of another process sends reaches this one's flow.
TEST_F(RawPacket, BetweenProcesses)
{
	ibv_qp *qp = raw_qp();
	ASSERT_NE(qp, nullptr);
	ASSERT_NE(eth_flow(qp, kDst), nullptr);
	constexpr int kFrames = 20;
	for (int i = 0; i < kFrames; ++i)
		ASSERT_EQ(post_recv(qp, static_cast<size_t>(i % 16)), 0);
	pid_t child = fork();
	ASSERT_GE(child, 0);
	if (child == 0) {
		// A context of its own, as another process has.
		ibv_context *c = open_xsrc0();
		ibv_pd *p = c ? ibv_alloc_pd(c) : nullptr;
		ibv_cq *q = c ? ibv_create_cq(c, 64, nullptr, nullptr, 0) : nullptr;
		if (!p || !q)
			_exit(2);
		ibv_qp *s = make_raw_qp(p, q, {64, 1, 1, 1, 256});
		if (!s)
			_exit(3);
		for (int i = 0; i < kFrames; ++i) {
			std::vector<uint8_t> f = eth_frame(kDst, kEtherExperimental, 200, static_cast<uint8_t>(i));
			ibv_sge sge{reinterpret_cast<uintptr_t>(f.data()), static_cast<uint32_t>(f.size()), 0};
			ibv_send_wr wr{}, *bad;
			wr.opcode = IBV_WR_SEND;
			wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
			wr.sg_list = &sge;
			wr.num_sge = 1;
			ibv_wc wc{};
			if (ibv_post_send(s, &wr, &bad))
				_exit(5);
			while (ibv_poll_cq(q, 1, &wc) == 0) {
			}
			if (wc.status != IBV_WC_SUCCESS)
				_exit(6);
			usleep(2000);  // the receiver reposts as it goes
		}
		_exit(0);
	}
	for (int i = 0; i < kFrames; ++i) {
		ibv_wc wc{};
		ASSERT_TRUE(poll(wc)) << "frame " << i;
		ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
		size_t slot = wc.wr_id - 1000;
		std::vector<uint8_t> f = eth_frame(kDst, kEtherExperimental, 200, static_cast<uint8_t>(i));
		EXPECT_EQ(wc.byte_len, f.size());
		EXPECT_EQ(std::memcmp(&buf[slot * kBuf], f.data(), f.size()), 0) << "frame " << i;
	}
	int status = 0;
	ASSERT_EQ(waitpid(child, &status, 0), child);
	EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

TEST_F(RawPacket, SendErrors)
{
	ibv_qp *qp = raw_qp();
	ASSERT_NE(qp, nullptr);
	ibv_wc wc{};
	// One byte longer than the netdev's MTU allows (an untagged frame may
	// not use a VLAN tag's 4 bytes); shorter than an Ethernet header.
	std::vector<uint8_t> bigbuf = eth_frame(kDst, kEtherExperimental, mtu + 1, 0);
	ibv_mr *bmr = ibv_reg_mr(pd, bigbuf.data(), bigbuf.size(), 0);
	ASSERT_NE(bmr, nullptr);
	ibv_sge sge{reinterpret_cast<uintptr_t>(bigbuf.data()), static_cast<uint32_t>(bigbuf.size()), bmr->lkey};
	ibv_send_wr wr{}, *bad;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0);
	ASSERT_TRUE(poll(wc));
	EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR);
	ibv_dereg_mr(bmr);
	qps.pop_back();
	ASSERT_EQ(ibv_destroy_qp(qp), 0);  // in error now; a fresh one

	qp = raw_qp();
	ASSERT_NE(qp, nullptr);
	ASSERT_EQ(post_send(qp, std::vector<uint8_t>(10, 0), 0), 0);
	ASSERT_TRUE(poll(wc));
	EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR);
	qps.pop_back();
	ASSERT_EQ(ibv_destroy_qp(qp), 0);

	qp = raw_qp();
	ASSERT_NE(qp, nullptr);
	ASSERT_EQ(post_send(qp, eth_frame(kDst, kEtherExperimental, 10, 0), 0, mr->lkey + 0x100), 0);
	ASSERT_TRUE(poll(wc));
	EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR);

	// A frame is all a raw packet QP sends.
	qp = raw_qp();
	ASSERT_NE(qp, nullptr);
	wr.opcode = IBV_WR_RDMA_WRITE;
	EXPECT_EQ(ibv_post_send(qp, &wr, &bad), EINVAL);
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	EXPECT_EQ(ibv_post_send(qp, &wr, &bad), EINVAL);
	expect_nothing();
}

TEST_F(RawPacket, ReceiveTooSmall)
{
	PacketSocket wire(ifindex);
	ASSERT_TRUE(wire.ok());
	ibv_qp *qp = raw_qp();
	ASSERT_NE(qp, nullptr);
	ASSERT_NE(eth_flow(qp, kDst), nullptr);
	ASSERT_EQ(post_recv(qp, 0, 64), 0);
	ASSERT_TRUE(wire.send(eth_frame(kDst, kEtherExperimental, 100, 0)));
	ibv_wc wc{};
	ASSERT_TRUE(poll(wc));
	EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR);
	EXPECT_EQ(wc.wr_id, 1000u);
	// A receive with a bad key.
	ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), kBuf, mr->lkey + 0x100};
	ibv_recv_wr rwr{}, *rbad;
	rwr.wr_id = 77;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	ASSERT_EQ(ibv_post_recv(qp, &rwr, &rbad), 0);
	ASSERT_TRUE(wire.send(eth_frame(kDst, kEtherExperimental, 100, 0)));
	ASSERT_TRUE(poll(wc));
	EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR);
	EXPECT_EQ(wc.wr_id, 77u);
}

TEST_F(RawPacket, FlowRefusals)
{
	ibv_qp *qp = raw_qp();
	ASSERT_NE(qp, nullptr);
	// Steering to an RC QP is for IB link layers.
	ibv_qp_init_attr rc{};
	rc.qp_type = IBV_QPT_RC;
	rc.send_cq = rc.recv_cq = cq;
	rc.cap = {1, 1, 1, 1, 0};
	ibv_qp *rcqp = ibv_create_qp(pd, &rc);
	ASSERT_NE(rcqp, nullptr);
	qps.push_back(rcqp);
	ibv_flow_attr plain{0, IBV_FLOW_ATTR_NORMAL, sizeof(ibv_flow_attr), 0, 0, 1, 0};
	errno = 0;
	EXPECT_EQ(ibv_create_flow(rcqp, &plain), nullptr);
	EXPECT_EQ(errno, EOPNOTSUPP);
	// A tunnel spec the device does not have.
	struct {
		ibv_flow_attr attr;
		ibv_flow_spec_tunnel vxlan;
	} t{};
	t.attr = {0, IBV_FLOW_ATTR_NORMAL, sizeof(t), 0, 1, 1, 0};
	t.vxlan.type = IBV_FLOW_SPEC_VXLAN_TUNNEL;
	t.vxlan.size = sizeof(t.vxlan);
	errno = 0;
	EXPECT_EQ(ibv_create_flow(qp, &t.attr), nullptr);
	EXPECT_EQ(errno, EOPNOTSUPP);
	// A spec smaller than its type's; a port the device does not have.
	struct {
		ibv_flow_attr attr;
		ibv_flow_spec_eth eth;
	} e{};
	e.attr = {0, IBV_FLOW_ATTR_NORMAL, sizeof(e), 0, 1, 1, 0};
	e.eth.type = IBV_FLOW_SPEC_ETH;
	e.eth.size = sizeof(e.eth) - 4;
	errno = 0;
	EXPECT_EQ(ibv_create_flow(qp, &e.attr), nullptr);
	EXPECT_EQ(errno, EINVAL);
	e.eth.size = sizeof(e.eth);
	e.attr.port = 2;
	errno = 0;
	EXPECT_EQ(ibv_create_flow(qp, &e.attr), nullptr);
	EXPECT_EQ(errno, EINVAL);
	// Flows hold their QP.
	ibv_flow *f = eth_flow(qp, kDst);
	ASSERT_NE(f, nullptr);
	EXPECT_EQ(ibv_destroy_qp(qp), EBUSY);
	drop_flow(f);
}

// RSS: a hash QP's flow spreads frames over the WQs of its indirection
// table by the Toeplitz hash, checked against Microsoft's published RSS
// verification vectors (their key; source and destination address, then
// ports): the frame lands in the WQ its hash's low bits name.
TEST_F(RawPacket, RssSpreadsByToeplitzHash)
{
	static const uint8_t kKey[40] = {0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67,
					 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb,
					 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
					 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa};
	struct Vector {
		const char *src, *dst;
		uint16_t sport, dport;
		uint32_t ip_hash, ip_tcp_hash;
	};
	static const Vector kVectors[] = {
		{"66.9.149.187", "161.142.100.80", 2794, 1766, 0x323e8fc2, 0x51ccc178},
		{"24.19.198.95", "12.22.207.184", 12898, 38024, 0xd2d0a5de, 0x5c2b394a},
	};
	PacketSocket wire(ifindex);
	ASSERT_TRUE(wire.ok());
	constexpr uint32_t kLog = 3, kWqs = 1u << kLog;
	std::vector<ibv_wq *> wqs;
	for (uint32_t i = 0; i < kWqs; ++i) {
		ibv_wq_init_attr wa{};
		wa.wq_type = IBV_WQT_RQ;
		wa.max_wr = 8;
		wa.max_sge = 1;
		wa.pd = pd;
		wa.cq = cq;
		ibv_wq *wq = ibv_create_wq(ctx, &wa);
		ASSERT_NE(wq, nullptr);
		wqs.push_back(wq);
		ibv_wq_attr mod{};
		mod.attr_mask = IBV_WQ_ATTR_STATE;
		mod.wq_state = IBV_WQS_RDY;
		ASSERT_EQ(ibv_modify_wq(wq, &mod), 0);
	}
	ibv_rwq_ind_table_init_attr ta{kLog, wqs.data(), 0};
	ibv_rwq_ind_table *table = ibv_create_rwq_ind_table(ctx, &ta);
	ASSERT_NE(table, nullptr);
	EXPECT_EQ(ibv_destroy_wq(wqs[0]), EBUSY);  // the table names it

	for (bool ports : {false, true}) {
		ibv_qp_init_attr_ex qa{};
		qa.qp_type = IBV_QPT_RAW_PACKET;
		qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_IND_TABLE;
		qa.pd = pd;
		qa.rwq_ind_tbl = table;
		qa.rx_hash_conf.rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ;
		qa.rx_hash_conf.rx_hash_key_len = sizeof(kKey);
		qa.rx_hash_conf.rx_hash_key = const_cast<uint8_t *>(kKey);
		qa.rx_hash_conf.rx_hash_fields_mask =
			IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 |
			(ports ? IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP : 0);
		ibv_qp *hqp = ibv_create_qp_ex(ctx, &qa);
		ASSERT_NE(hqp, nullptr) << strerror(errno);
		EXPECT_EQ(ibv_destroy_rwq_ind_table(table), EBUSY);  // the QP uses it
		struct {
			ibv_flow_attr attr;
			ibv_flow_spec_eth eth;
		} f{};
		f.attr = {0, IBV_FLOW_ATTR_NORMAL, sizeof(f), 0, 1, 1, 0};
		f.eth.type = IBV_FLOW_SPEC_ETH;
		f.eth.size = sizeof(f.eth);
		std::memcpy(f.eth.val.dst_mac, kDst, 6);
		std::memset(f.eth.mask.dst_mac, 0xff, 6);
		ibv_flow *flow = ibv_create_flow(hqp, &f.attr);
		ASSERT_NE(flow, nullptr);
		for (const Vector &v : kVectors) {
			uint32_t want = (ports ? v.ip_tcp_hash : v.ip_hash) & (kWqs - 1);
			for (uint32_t i = 0; i < kWqs; ++i) {
				ibv_sge sge{reinterpret_cast<uintptr_t>(&buf[i * kBuf]), kBuf, mr->lkey};
				ibv_recv_wr wr{}, *bad;
				wr.wr_id = 5000 + i;
				wr.sg_list = &sge;
				wr.num_sge = 1;
				ASSERT_EQ(ibv_post_wq_recv(wqs[i], &wr, &bad), 0);
			}
			std::vector<uint8_t> frame = ip_frame(false, IPPROTO_TCP, v.sport, v.dport, v.src, v.dst);
			ASSERT_TRUE(wire.send(frame));
			ibv_wc wc{};
			ASSERT_TRUE(poll(wc));
			EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
			EXPECT_EQ(wc.wr_id, 5000 + want) << v.src << (ports ? " with ports" : "");
			EXPECT_EQ(wc.byte_len, frame.size());
			EXPECT_EQ(std::memcmp(&buf[want * kBuf], frame.data(), frame.size()), 0);
			// The other WQs' receives stay posted: flushed by ERR.
			for (uint32_t i = 0; i < kWqs; ++i) {
				if (i == want)
					continue;
				ibv_wq_attr mod{};
				mod.attr_mask = IBV_WQ_ATTR_STATE;
				mod.wq_state = IBV_WQS_ERR;
				ASSERT_EQ(ibv_modify_wq(wqs[i], &mod), 0);
				ASSERT_TRUE(poll(wc));
				EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
				EXPECT_EQ(wc.wr_id, 5000 + i);
				mod.wq_state = IBV_WQS_RESET;
				ASSERT_EQ(ibv_modify_wq(wqs[i], &mod), 0);
				mod.wq_state = IBV_WQS_RDY;
				ASSERT_EQ(ibv_modify_wq(wqs[i], &mod), 0);
			}
		}
		// A WQ not ready takes nothing: the frame is dropped.
		const Vector &v = kVectors[0];
		uint32_t want = (ports ? v.ip_tcp_hash : v.ip_hash) & (kWqs - 1);
		ibv_wq_attr mod{};
		mod.attr_mask = IBV_WQ_ATTR_STATE;
		mod.wq_state = IBV_WQS_RESET;
		ASSERT_EQ(ibv_modify_wq(wqs[want], &mod), 0);
		ibv_sge sge{reinterpret_cast<uintptr_t>(&buf[0]), kBuf, mr->lkey};
		ibv_recv_wr wr{}, *bad;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		ASSERT_EQ(ibv_post_wq_recv(wqs[want], &wr, &bad), 0);
		ASSERT_TRUE(wire.send(ip_frame(false, IPPROTO_TCP, v.sport, v.dport, v.src, v.dst)));
		expect_nothing();
		ASSERT_EQ(ibv_modify_wq(wqs[want], &mod), 0);  // drops the receive
		mod.wq_state = IBV_WQS_RDY;
		ASSERT_EQ(ibv_modify_wq(wqs[want], &mod), 0);
		ASSERT_EQ(ibv_destroy_flow(flow), 0);
		ASSERT_EQ(ibv_destroy_qp(hqp), 0);
	}
	// What the device does not hash on, and an unknown function.
	ibv_qp_init_attr_ex qa{};
	qa.qp_type = IBV_QPT_RAW_PACKET;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_IND_TABLE;
	qa.pd = pd;
	qa.rwq_ind_tbl = table;
	qa.rx_hash_conf = {IBV_RX_HASH_FUNC_TOEPLITZ, sizeof(kKey), const_cast<uint8_t *>(kKey), IBV_RX_HASH_IPSEC_SPI};
	errno = 0;
	EXPECT_EQ(ibv_create_qp_ex(ctx, &qa), nullptr);
	EXPECT_EQ(errno, EOPNOTSUPP);
	qa.rx_hash_conf.rx_hash_fields_mask = IBV_RX_HASH_SRC_IPV4;
	qa.rx_hash_conf.rx_hash_key_len = 0;
	errno = 0;
	EXPECT_EQ(ibv_create_qp_ex(ctx, &qa), nullptr);
	EXPECT_EQ(errno, EINVAL);
	EXPECT_EQ(ibv_destroy_rwq_ind_table(table), 0);
	for (ibv_wq *wq : wqs)
		EXPECT_EQ(ibv_destroy_wq(wq), 0);
}

// The kernel's rule: CAP_NET_RAW, which uid 65534 does not have.
TEST_F(RawPacket, NeedsNetRaw)
{
	pid_t child = fork();
	ASSERT_GE(child, 0);
	if (child == 0) {
		if (setgid(65534) || setuid(65534))
			_exit(2);
		ibv_context *c = open_xsrc0();
		ibv_pd *p = c ? ibv_alloc_pd(c) : nullptr;
		ibv_cq *q = c ? ibv_create_cq(c, 4, nullptr, nullptr, 0) : nullptr;
		if (!p || !q)
			_exit(3);
		ibv_qp_init_attr attr{};
		attr.qp_type = IBV_QPT_RAW_PACKET;
		attr.send_cq = attr.recv_cq = q;
		attr.cap = {1, 1, 1, 1, 0};
		errno = 0;
		ibv_qp *s = ibv_create_qp(p, &attr);
		_exit(!s && errno == EPERM ? 0 : 4);
	}
	int status = 0;
	ASSERT_EQ(waitpid(child, &status, 0), child);
	EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

}  // namespace
