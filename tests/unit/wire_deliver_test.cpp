// Delivery of RoCE v2 UD packets into a device (xsrcd/wire_deliver.cpp), in
// process: a UD QP of the fixture's context with a receive posted in its
// ring, packets built with wire/, and the completion read back from the CQ
// ring. Each way a datagram is refused is dropped silently, as IBTA has it
// for UD; a receive that cannot take it completes in error. RC: the
// responder's PSN checks, SEND segments into one receive, RDMA WRITE through
// the rkey and its refusals, SEND with Invalidate's check, the responder
// resources of max_dest_rd_atomic, and responses handed to the requester's
// socket. XRC: the SRQ the XRCETH names, of the receive QP's domain.
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "command_fixture.h"
#include "common/ring_ops.h"
#include "wire/headers.h"
#include "wire_deliver.h"

namespace xsrc::test {
namespace {

namespace w = wire;

constexpr uint32_t kQkey = 0x11111111;  // modify_cmd()'s
constexpr uint32_t kSrcQpn = 0x1234;
constexpr size_t kGrh = 40;

struct PacketSpec {
	uint8_t opcode = w::opcode::kUdSendOnly;
	uint32_t qpn = 0;
	uint32_t qkey = kQkey;
	std::optional<uint32_t> imm;
	std::vector<uint8_t> payload = std::vector<uint8_t>(13, 0x5a);
	const char *dst = "127.0.0.1";
	bool ipv6 = false;
};

std::vector<uint8_t> frame(const std::vector<uint8_t> &body, const char *src, const char *dst, bool ipv6);

// IP .. ICRC, as a sender on the wire puts it.
std::vector<uint8_t> packet(const PacketSpec &s)
{
	std::vector<uint8_t> body(w::kBthBytes + w::kDethBytes);
	uint8_t pad = w::pad_of(s.payload.size());
	w::Bth bth;
	bth.opcode = s.opcode;
	bth.dest_qpn = s.qpn;
	bth.pad = pad;
	w::encode(bth, std::span<uint8_t, w::kBthBytes>(body.data(), w::kBthBytes));
	w::encode(w::Deth{s.qkey, kSrcQpn}, std::span<uint8_t, w::kDethBytes>(body.data() + w::kBthBytes, w::kDethBytes));
	if (s.imm) {
		body.resize(body.size() + w::kImmDtBytes);
		w::encode(w::ImmDt{*s.imm}, std::span<uint8_t, w::kImmDtBytes>(body.data() + body.size() - 4, 4));
	}
	body.insert(body.end(), s.payload.begin(), s.payload.end());
	body.insert(body.end(), pad, 0);
	return frame(body, "127.0.0.2", s.dst, s.ipv6);
}

// The IP and UDP headers in front of `body` (BTH .. pad), the ICRC behind.
std::vector<uint8_t> frame(const std::vector<uint8_t> &body, const char *src, const char *dst, bool ipv6)
{
	uint16_t udp_len = static_cast<uint16_t>(w::kUdpBytes + body.size() + w::kIcrcBytes);
	std::vector<uint8_t> p;
	if (ipv6) {
		w::Ipv6 ip;
		ip.payload_length = udp_len;
		inet_pton(AF_INET6, "fd00::2", &ip.src);
		inet_pton(AF_INET6, dst, &ip.dst);
		p.resize(w::kIpv6Bytes);
		w::encode(ip, std::span<uint8_t, w::kIpv6Bytes>(p.data(), w::kIpv6Bytes));
	} else {
		w::Ipv4 ip;
		ip.total_length = static_cast<uint16_t>(w::kIpv4Bytes + udp_len);
		inet_pton(AF_INET, src, &ip.src);
		inet_pton(AF_INET, dst, &ip.dst);
		p.resize(w::kIpv4Bytes);
		w::encode(ip, std::span<uint8_t, w::kIpv4Bytes>(p.data(), w::kIpv4Bytes));
	}
	size_t ip_len = p.size();
	p.resize(ip_len + w::kUdpBytes);
	w::encode(w::Udp{50000, w::kRoceV2Port, udp_len, 0}, std::span<uint8_t, w::kUdpBytes>(p.data() + ip_len, w::kUdpBytes));
	p.insert(p.end(), body.begin(), body.end());
	uint32_t crc = *w::icrc(p);
	p.resize(p.size() + w::kIcrcBytes);
	w::store_icrc(crc, std::span<uint8_t, w::kIcrcBytes>(p.data() + p.size() - 4, 4));
	return p;
}

class WireDeliverTest : public CommandFixture {
protected:
	void SetUp() override
	{
		CommandFixture::SetUp();
		basic_objects();
		ASSERT_EQ(create_qp(qp_spec(IBV_QPT_UD), qp), 0);
		ib_uverbs_reg_mr_resp mr_resp{};
		ASSERT_EQ(reg_mr(pd0, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE, mr_resp), 0);
		lkey = mr_resp.lkey;
	}

	void to_rtr(uint32_t handle = 0)
	{
		handle = handle ? handle : qp.handle;
		ASSERT_EQ(modify_qp(modify_cmd(handle, IBV_QPS_INIT,
					       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)), 0);
		ASSERT_EQ(modify_qp(modify_cmd(handle, IBV_QPS_RTR, IBV_QP_STATE)), 0);
	}

	void post_recv(uint32_t len, uint32_t key = 0)
	{
		xsrc_sge sge{reinterpret_cast<uintptr_t>(buf), len, key ? key : lkey};
		ASSERT_TRUE(recv_push(rq(), 7, &sge, 1));
	}

	xsrc_recv_ring *rq() { return &arena().at<xsrc_recv_ring>(qp.drv.rq_off); }

	std::optional<xsrc_cqe> completion()
	{
		xsrc_cqe c;
		CqConsumer consumer(&arena().at<xsrc_cq_ring>(cq0_ring));
		// A payload that rides in the ring is placed only inside `buf`, as
		// an owner's poll places it only inside its own MRs.
		auto in_buf = [this](uint64_t va, uint32_t len) {
			const auto at = reinterpret_cast<uintptr_t>(buf);
			return va >= at && len <= sizeof(buf) && va - at <= sizeof(buf) - len;
		};
		if (!consumer.take(c, in_buf))
			return std::nullopt;
		consumer.publish();
		return c;
	}

	WireOutcome deliver(PacketSpec s)
	{
		if (!s.qpn)
			s.qpn = qp.qpn;
		std::vector<uint8_t> p = packet(s);
		return wire_deliver(dev, p);
	}

	// Dropped: no completion, the receive still posted.
	void expect_dropped(const PacketSpec &s)
	{
		EXPECT_EQ(deliver(s), WireOutcome::dropped);
		EXPECT_FALSE(completion());
		EXPECT_EQ(recv_count(rq()), 1u);
	}

	CreatedQp qp;
	uint32_t lkey = 0;
	alignas(64) uint8_t buf[256] = {};
};

TEST_F(WireDeliverTest, UdSendLandsAfterTheIpv4HeaderAsGrh)
{
	to_rtr();
	post_recv(sizeof(buf));
	std::vector<uint8_t> p =
		packet({.opcode = w::opcode::kUdSendOnlyImm, .qpn = qp.qpn, .imm = htonl(0xC0FFEE)});
	EXPECT_EQ(wire_deliver(dev, p), WireOutcome::delivered);
	std::optional<xsrc_cqe> c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_SUCCESS);
	EXPECT_EQ(c->opcode, IBV_WC_RECV);
	EXPECT_EQ(c->wr_id, 7u);
	EXPECT_EQ(c->qp_num, qp.qpn);
	EXPECT_EQ(c->src_qp, kSrcQpn);
	EXPECT_EQ(c->byte_len, kGrh + 13);
	EXPECT_EQ(c->wc_flags, unsigned(IBV_WC_GRH | IBV_WC_WITH_IMM));
	EXPECT_EQ(c->imm_data, htonl(0xC0FFEE));
	for (size_t i = 0; i < 20; ++i)
		ASSERT_EQ(buf[i], 0) << i;
	EXPECT_TRUE(std::equal(buf + 20, buf + kGrh, p.begin()));  // the IPv4 header
	for (size_t i = kGrh; i < kGrh + 13; ++i)
		ASSERT_EQ(buf[i], 0x5a) << i;
	EXPECT_EQ(buf[kGrh + 13], 0);  // nothing past the payload (the pad stays out)
}

// A datagram whose GRH and payload fit one receive buffer and the CQ ring's
// payload slot rides in the slot: xsrcd writes nothing into the owner's
// memory, the owner's poll places both.
TEST_F(WireDeliverTest, UdDatagramIntoOneBufferRidesInTheCqSlot)
{
	to_rtr();
	post_recv(sizeof(buf));
	EXPECT_EQ(deliver({.qpn = qp.qpn}), WireOutcome::delivered);
	EXPECT_EQ(buf[kGrh], 0) << "xsrcd wrote the datagram itself";
	std::optional<xsrc_cqe> c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_SUCCESS);
	EXPECT_TRUE(c->flags & XSRC_CQE_DEFERRED);
	EXPECT_EQ(buf[kGrh], 0x5a);
}

TEST_F(WireDeliverTest, Ipv6GrhIsTheIpv6Header)
{
	to_rtr();
	post_recv(sizeof(buf));
	std::vector<uint8_t> p = packet({.qpn = qp.qpn, .dst = "::1", .ipv6 = true});
	EXPECT_EQ(wire_deliver(dev, p), WireOutcome::delivered);
	std::optional<xsrc_cqe> c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_SUCCESS);
	EXPECT_EQ(c->wc_flags, unsigned(IBV_WC_GRH));
	EXPECT_TRUE(std::equal(buf, buf + kGrh, p.begin()));
}

TEST_F(WireDeliverTest, WrongQkeyIsDropped)
{
	to_rtr();
	post_recv(sizeof(buf));
	expect_dropped({.qkey = kQkey + 1});
}

TEST_F(WireDeliverTest, QpNotReadyToReceiveIsDropped)
{
	post_recv(sizeof(buf));  // RESET, then INIT: not yet
	expect_dropped({});
	ASSERT_EQ(modify_qp(modify_cmd(qp.handle, IBV_QPS_INIT,
				       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)), 0);
	expect_dropped({});
}

TEST_F(WireDeliverTest, NoSuchQpIsDropped)
{
	to_rtr();
	post_recv(sizeof(buf));
	expect_dropped({.qpn = qp.qpn + 1});
	expect_dropped({.qpn = 1});  // QP1: no GSI QP on this device yet
}

TEST_F(WireDeliverTest, AnotherHostsAddressIsDropped)
{
	to_rtr();
	post_recv(sizeof(buf));
	expect_dropped({.dst = "127.0.0.9"});
}

// UD multicast from another host: to the group's IP address and QPN
// 0xFFFFFF, into each member QP, never to a group without members here.
class WireMulticastTest : public WireDeliverTest {
protected:
	int mcast(uint32_t command, const char *group_v4)
	{
		ib_uverbs_attach_mcast cmd{};  // DETACH_MCAST's struct has this layout too
		cmd.gid[10] = cmd.gid[11] = 0xFF;
		inet_pton(AF_INET, group_v4, cmd.gid + 12);
		cmd.qp_handle = qp.handle;
		return run(command, cmd);
	}
};

TEST_F(WireMulticastTest, GroupDatagramReachesTheMemberWithItsOwnQpn)
{
	to_rtr();
	post_recv(sizeof(buf));
	ASSERT_EQ(mcast(IB_USER_VERBS_CMD_ATTACH_MCAST, "239.1.2.3"), 0);
	std::vector<uint8_t> p = packet({.qpn = XSRC_MCAST_QPN, .dst = "239.1.2.3"});
	EXPECT_EQ(wire_deliver(dev, p), WireOutcome::delivered);
	std::optional<xsrc_cqe> c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_SUCCESS);
	EXPECT_EQ(c->qp_num, qp.qpn);
	EXPECT_EQ(c->src_qp, kSrcQpn);
	EXPECT_EQ(c->byte_len, kGrh + 13);
	EXPECT_TRUE(std::equal(buf + 20, buf + kGrh, p.begin()));  // the IPv4 header
}

TEST_F(WireMulticastTest, GroupDatagramToAnotherQpnWrongQkeyOrOtherGroupIsDropped)
{
	to_rtr();
	post_recv(sizeof(buf));
	ASSERT_EQ(mcast(IB_USER_VERBS_CMD_ATTACH_MCAST, "239.1.2.3"), 0);
	expect_dropped({.qpn = qp.qpn, .dst = "239.1.2.3"});
	expect_dropped({.qpn = XSRC_MCAST_QPN, .qkey = kQkey + 1, .dst = "239.1.2.3"});
	expect_dropped({.qpn = XSRC_MCAST_QPN, .dst = "239.1.2.4"});
	expect_dropped({.opcode = 0x04, .qpn = XSRC_MCAST_QPN, .dst = "239.1.2.3"});  // RC SEND Only
}

TEST_F(WireMulticastTest, DetachedQpGetsNothingMore)
{
	to_rtr();
	post_recv(sizeof(buf));
	ASSERT_EQ(mcast(IB_USER_VERBS_CMD_ATTACH_MCAST, "239.1.2.3"), 0);
	ASSERT_EQ(mcast(IB_USER_VERBS_CMD_DETACH_MCAST, "239.1.2.3"), 0);
	expect_dropped({.qpn = XSRC_MCAST_QPN, .dst = "239.1.2.3"});
}

TEST_F(WireDeliverTest, NotAUdSendIsDropped)
{
	to_rtr();
	post_recv(sizeof(buf));
	expect_dropped({.opcode = 0x04});  // RC SEND Only
	expect_dropped({.opcode = 0x66});  // reserved
}

TEST_F(WireDeliverTest, TruncatedPacketIsDropped)
{
	to_rtr();
	post_recv(sizeof(buf));
	std::vector<uint8_t> p = packet({.qpn = qp.qpn, .payload = {}});
	// Shorter than its UDP length says.
	EXPECT_EQ(wire_deliver(dev, std::span<const uint8_t>(p).first(p.size() - 1)), WireOutcome::dropped);
	EXPECT_FALSE(completion());
}

TEST_F(WireDeliverTest, NoReceivePostedIsDropped)
{
	to_rtr();
	EXPECT_EQ(deliver({}), WireOutcome::dropped);
	EXPECT_FALSE(completion());
}

TEST_F(WireDeliverTest, ReceiveTooSmallCompletesLocLenErr)
{
	to_rtr();
	post_recv(kGrh + 12);
	EXPECT_EQ(deliver({}), WireOutcome::delivered);
	std::optional<xsrc_cqe> c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_LOC_LEN_ERR);
	EXPECT_EQ(buf[0], 0);  // nothing written
}

TEST_F(WireDeliverTest, BadLkeyCompletesLocProtErr)
{
	to_rtr();
	post_recv(sizeof(buf), lkey + 0x100);  // another index: no MR
	EXPECT_EQ(deliver({}), WireOutcome::delivered);
	std::optional<xsrc_cqe> c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_LOC_PROT_ERR);
}

TEST_F(WireDeliverTest, QpOnAnSrqTakesTheSrqsReceiveAndRaisesItsLimit)
{
	uint32_t srq = 0;
	xsrc_create_srq_resp srq_drv{};
	ASSERT_EQ(create_srq(pd0, 8, 1, srq, nullptr, &srq_drv), 0);
	QpSpec spec = qp_spec(IBV_QPT_UD);
	spec.srq = srq;
	CreatedQp on_srq;
	ASSERT_EQ(create_qp(spec, on_srq), 0);
	to_rtr(on_srq.handle);
	auto *ring = &arena().at<xsrc_recv_ring>(srq_drv.ring_off);
	xsrc_sge sge{reinterpret_cast<uintptr_t>(buf), sizeof(buf), lkey};
	ASSERT_TRUE(recv_push(ring, 9, &sge, 1));
	ASSERT_TRUE(recv_push(ring, 10, &sge, 1));
	ring->srq_limit = 2;  // armed: fires when fewer than 2 are left
	EXPECT_TRUE(async.drain().empty());
	EXPECT_EQ(deliver({.qpn = on_srq.qpn}), WireOutcome::delivered);
	std::optional<xsrc_cqe> c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_SUCCESS);
	EXPECT_EQ(c->wr_id, 9u);
	EXPECT_EQ(c->qp_num, on_srq.qpn);
	EXPECT_EQ(recv_count(ring), 1u);
	EXPECT_EQ(ring->srq_limit, 0u);  // disarmed as it fired
	EXPECT_FALSE(async.drain().empty());
	ASSERT_EQ(destroy_qp(on_srq.handle), 0);
}

// The rings are in the arena, which every process of the device may write:
// the daemon indexes them by the shape it made them with, never by what
// their headers say (forged here far past the ring's allocation, and past
// the arena's end), so it reaches nothing outside them.
TEST_F(WireDeliverTest, ForgedReceiveRingGeometryIsNotUsed)
{
	to_rtr();
	post_recv(sizeof(buf));
	const xsrc_recv_ring made = *rq();
	rq()->num_entries = 1u << 30;
	rq()->stride = 1u << 30;
	EXPECT_EQ(deliver({}), WireOutcome::delivered);
	rq()->num_entries = made.num_entries;
	rq()->stride = made.stride;
	std::optional<xsrc_cqe> c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_SUCCESS);
	EXPECT_EQ(c->wr_id, 7u);
	EXPECT_EQ(buf[kGrh], 0x5a);
}

TEST_F(WireDeliverTest, ForgedCqRingGeometryIsNotUsed)
{
	to_rtr();
	post_recv(sizeof(buf));
	auto &ring = arena().at<xsrc_cq_ring>(cq0_ring);
	const xsrc_cq_ring made = ring;
	ring.num_entries = 1u << 30;
	ring.payload_stride = 1u << 30;
	ring.cqe = ~0u;
	EXPECT_EQ(deliver({}), WireOutcome::delivered);
	ring.num_entries = made.num_entries;
	ring.payload_stride = made.payload_stride;
	ring.cqe = made.cqe;
	std::optional<xsrc_cqe> c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_SUCCESS);
	EXPECT_TRUE(c->flags & XSRC_CQE_DEFERRED);
	EXPECT_EQ(buf[kGrh], 0x5a) << "the payload is where the ring we made keeps it";
}

// r9: the wire takes each receive the owner recorded once. A ring slot
// rewound in the arena to a position taken before names a receive that
// completed (its buffer may hold the application's data by now): it is
// passed over, and the datagram finds no receive.
TEST_F(WireDeliverTest, AReceiveRewoundInTheArenaIsNotTakenTwice)
{
	struct Entry {
		xsrc_recv_shadow_entry head;
		xsrc_sge sge[1];
	} shadow[4]{};
	xsrc_recv_shadow cmd{};
	cmd.kind = XSRC_RECV_SHADOW_QP;
	cmd.handle = qp.handle;
	cmd.num_entries = 4;
	cmd.stride = sizeof(Entry);
	cmd.addr = reinterpret_cast<uintptr_t>(shadow);
	ASSERT_EQ(run(XSRC_CMD_RECV_SHADOW, cmd), 0);
	to_rtr();
	post_recv(sizeof(buf));
	shadow[0].head = {1, 7, 1, 0};  // posted at ring position 0
	shadow[0].sge[0] = {reinterpret_cast<uintptr_t>(buf), sizeof(buf), lkey};
	EXPECT_EQ(deliver({}), WireOutcome::delivered);
	std::optional<xsrc_cqe> c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_SUCCESS);
	EXPECT_EQ(buf[kGrh], 0x5a);
	std::memset(buf, 0, sizeof(buf));  // the application's again
	// Rewound: the head back at 0, slot 0 posted again, the record unchanged.
	store_release<__u64>(rq()->head, 0);
	store_release<__u64>(recv_slot(rq(), 0)->seq, 1);
	EXPECT_EQ(deliver({}), WireOutcome::dropped);
	EXPECT_FALSE(completion());
	EXPECT_EQ(buf[kGrh], 0) << "a completed receive's buffer was written again";
	// Posted there again a lap on (ring and record): taken.
	const uint64_t lap = rq()->num_entries;
	store_release<__u64>(rq()->tail, lap);
	store_release<__u64>(rq()->head, lap);
	store_release<__u64>(recv_slot(rq(), lap)->seq, lap);
	post_recv(sizeof(buf));
	shadow[lap % 4].head = {lap + 1, 8, 1, 0};
	shadow[lap % 4].sge[0] = {reinterpret_cast<uintptr_t>(buf), sizeof(buf), lkey};
	EXPECT_EQ(deliver({}), WireOutcome::delivered);
	c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->wr_id, 8u);
}

// A QP going to RESET empties its receive ring by the shape the daemon made
// it with: the forged one would have it write far outside the ring.
TEST_F(WireDeliverTest, ResetEmptiesTheReceiveRingItMadeWhateverItsHeaderSays)
{
	to_rtr();
	post_recv(sizeof(buf));
	const xsrc_recv_ring made = *rq();
	rq()->num_entries = 1u << 30;
	rq()->stride = 1u << 30;
	ASSERT_EQ(modify_qp(modify_cmd(qp.handle, IBV_QPS_RESET, IBV_QP_STATE)), 0);
	rq()->num_entries = made.num_entries;
	rq()->stride = made.stride;
	EXPECT_EQ(recv_count(rq()), 0u);
	to_rtr();
	post_recv(sizeof(buf));  // every slot is free for its first lap again
	EXPECT_EQ(deliver({}), WireOutcome::delivered);
	EXPECT_TRUE(completion());
}

// --- RC and UC: the responder, and responses for the requester ------------

// An RC QP connected (RTR) to kModifyDestQpn at kPeerGid (::ffff:10.0.0.7),
// expecting kModifyRqPsn; its MR takes remote writes.
class WireRcTest : public WireDeliverTest {
protected:
	void SetUp() override
	{
		WireDeliverTest::SetUp();
		ASSERT_EQ(create_qp(qp_spec(IBV_QPT_RC), rc), 0);
		ib_uverbs_reg_mr_resp mr_resp{};
		ASSERT_EQ(reg_mr(pd0, target, sizeof(target),
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
					 IBV_ACCESS_REMOTE_ATOMIC,
				 mr_resp), 0);
		rkey = mr_resp.rkey;
		ib_uverbs_modify_qp init = modify_cmd(rc.handle, IBV_QPS_INIT,
						      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
		init.qp_access_flags |= IBV_ACCESS_REMOTE_ATOMIC;
		ASSERT_EQ(modify_qp(init), 0);
		ASSERT_EQ(modify_qp(modify_cmd(rc.handle, IBV_QPS_RTR,
					       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
						       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)), 0);
	}

	// An RC packet: BTH, `headers` after it, `payload`, from `src`.
	WireOutcome send_rc(uint8_t opcode, uint32_t psn, std::vector<uint8_t> headers, std::vector<uint8_t> payload,
			    const char *src = "10.0.0.7", bool ack_req = true)
	{
		std::vector<uint8_t> body(w::kBthBytes);
		w::Bth bth;
		bth.opcode = opcode;
		bth.dest_qpn = rc.qpn;
		bth.psn = psn;
		bth.ack_req = ack_req;
		bth.pad = w::pad_of(payload.size());
		w::encode(bth, std::span<uint8_t, w::kBthBytes>(body.data(), w::kBthBytes));
		body.insert(body.end(), headers.begin(), headers.end());
		body.insert(body.end(), payload.begin(), payload.end());
		body.insert(body.end(), bth.pad, 0);
		std::vector<uint8_t> p = frame(body, src, "127.0.0.1", false);
		return wire_deliver(dev, p);
	}

	std::vector<uint8_t> reth(uint64_t va, uint32_t key, uint32_t len)
	{
		std::vector<uint8_t> h(w::kRethBytes);
		w::encode(w::Reth{va, key, len}, std::span<uint8_t, w::kRethBytes>(h.data(), w::kRethBytes));
		return h;
	}

	xsrc_recv_ring *rc_rq() { return &arena().at<xsrc_recv_ring>(rc.drv.rq_off); }

	void post_rc_recv()
	{
		xsrc_sge sge{reinterpret_cast<uintptr_t>(buf), sizeof(buf), lkey};
		ASSERT_TRUE(recv_push(rc_rq(), 9, &sge, 1));
	}

	ibv_qp_state rc_state() { return xsrc_qp_state_decode(arena().qp_entry(rc.qpn - XSRC_QPN_BASE).state); }

	// The QP as a requester: RTS, so that responses to it are taken.
	void to_rts()
	{
		ASSERT_EQ(modify_qp(modify_cmd(rc.handle, IBV_QPS_RTS,
					       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
						       IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)),
			  0);
	}

	// An AETH that acknowledges (MSN 1).
	static std::vector<uint8_t> ack_aeth()
	{
		std::vector<uint8_t> aeth(w::kAethBytes);
		w::encode(w::Aeth{w::aeth::kAck, 1}, std::span<uint8_t, w::kAethBytes>(aeth.data(), w::kAethBytes));
		return aeth;
	}

	CreatedQp rc;
	uint32_t rkey = 0;
	alignas(64) uint8_t target[4096] = {};
};

TEST_F(WireRcTest, SendFirstMiddleLastFillsOneReceive)
{
	post_rc_recv();
	EXPECT_EQ(send_rc(0x00, kModifyRqPsn, {}, std::vector<uint8_t>(8, 1), "10.0.0.7", false), WireOutcome::delivered);
	EXPECT_EQ(send_rc(0x01, kModifyRqPsn + 1, {}, std::vector<uint8_t>(8, 2), "10.0.0.7", false),
		  WireOutcome::delivered);
	EXPECT_FALSE(completion());
	EXPECT_EQ(send_rc(0x02, kModifyRqPsn + 2, {}, std::vector<uint8_t>(5, 3)), WireOutcome::delivered);
	auto c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_SUCCESS);
	EXPECT_EQ(c->opcode, IBV_WC_RECV);
	EXPECT_EQ(c->byte_len, 21u);
	EXPECT_EQ(buf[0], 1);
	EXPECT_EQ(buf[8], 2);
	EXPECT_EQ(buf[20], 3);
}

// A SEND Only that fits one receive buffer and the CQ ring's payload slot
// rides in the slot with its completion: xsrcd writes nothing into the
// owner's memory, the owner's poll places it.
TEST_F(WireRcTest, SendOnlyIntoOneBufferRidesInTheCqSlot)
{
	post_rc_recv();
	EXPECT_EQ(send_rc(w::op::kSendOnly, kModifyRqPsn, {}, std::vector<uint8_t>(8, 7)), WireOutcome::delivered);
	EXPECT_EQ(buf[0], 0) << "xsrcd wrote the payload itself";
	auto c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_SUCCESS);
	EXPECT_EQ(c->byte_len, 8u);
	EXPECT_TRUE(c->flags & XSRC_CQE_DEFERRED);
	EXPECT_EQ(buf[0], 7);
	EXPECT_EQ(buf[7], 7);
	EXPECT_EQ(buf[8], 0);
}

// Spread over two receive buffers, a SEND Only is written by xsrcd, before
// its completion is taken.
TEST_F(WireRcTest, SendOnlyOverTwoBuffersIsWrittenByTheDaemon)
{
	xsrc_sge sge[2] = {{reinterpret_cast<uintptr_t>(buf), 4, lkey}, {reinterpret_cast<uintptr_t>(buf + 64), 8, lkey}};
	ASSERT_TRUE(recv_push(rc_rq(), 9, sge, 2));
	EXPECT_EQ(send_rc(w::op::kSendOnly, kModifyRqPsn, {}, std::vector<uint8_t>(8, 5)), WireOutcome::delivered);
	EXPECT_EQ(buf[3], 5);
	EXPECT_EQ(buf[4], 0);
	EXPECT_EQ(buf[67], 5);
	auto c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_SUCCESS);
	EXPECT_EQ(c->byte_len, 8u);
	EXPECT_FALSE(c->flags & XSRC_CQE_DEFERRED);
}

TEST_F(WireRcTest, PacketFromAnotherGidThanThePeersIsDropped)
{
	post_rc_recv();
	EXPECT_EQ(send_rc(0x04, kModifyRqPsn, {}, {1, 2, 3}, "10.0.0.8"), WireOutcome::dropped);
	EXPECT_FALSE(completion());
	EXPECT_EQ(recv_count(rc_rq()), 1u);
}

TEST_F(WireRcTest, PsnGapIsNotExecuted)
{
	post_rc_recv();
	EXPECT_EQ(send_rc(0x04, kModifyRqPsn + 1, {}, {1, 2, 3}), WireOutcome::dropped);
	EXPECT_FALSE(completion());
	EXPECT_EQ(recv_count(rc_rq()), 1u);
	// The expected PSN is still taken.
	EXPECT_EQ(send_rc(0x04, kModifyRqPsn, {}, {1, 2, 3}), WireOutcome::delivered);
	EXPECT_TRUE(completion());
}

TEST_F(WireRcTest, DuplicateIsNotExecutedTwice)
{
	post_rc_recv();
	post_rc_recv();
	EXPECT_EQ(send_rc(0x04, kModifyRqPsn, {}, {1, 2, 3}), WireOutcome::delivered);
	EXPECT_TRUE(completion());
	EXPECT_EQ(send_rc(0x04, kModifyRqPsn, {}, {1, 2, 3}), WireOutcome::delivered);  // re-ACKed only
	EXPECT_FALSE(completion());
	EXPECT_EQ(recv_count(rc_rq()), 1u);
}

TEST_F(WireRcTest, NoReceiveLeavesThePacketForItsRetry)
{
	EXPECT_EQ(send_rc(0x04, kModifyRqPsn, {}, {1, 2, 3}), WireOutcome::dropped);  // RNR NAK
	post_rc_recv();
	EXPECT_EQ(send_rc(0x04, kModifyRqPsn, {}, {1, 2, 3}), WireOutcome::delivered);
	EXPECT_TRUE(completion());
	EXPECT_EQ(rc_state(), IBV_QPS_RTR);
}

TEST_F(WireRcTest, RdmaWriteLandsThroughTheRkey)
{
	auto va = reinterpret_cast<uintptr_t>(target);
	EXPECT_EQ(send_rc(0x06, kModifyRqPsn, reth(va + 10, rkey, 6), {1, 2, 3, 4}, "10.0.0.7", false),
		  WireOutcome::delivered);
	EXPECT_EQ(send_rc(0x08, kModifyRqPsn + 1, {}, {5, 6}), WireOutcome::delivered);
	EXPECT_EQ(target[10], 1);
	EXPECT_EQ(target[15], 6);
	EXPECT_FALSE(completion());  // no immediate: nothing for the responder's CQ
}

TEST_F(WireRcTest, RdmaWriteWithABadRkeyOrRangeMovesTheQpToError)
{
	auto va = reinterpret_cast<uintptr_t>(target);
	EXPECT_EQ(send_rc(0x0A, kModifyRqPsn, reth(va, rkey + 1, 4), {1, 2, 3, 4}), WireOutcome::dropped);
	EXPECT_EQ(target[0], 0);
	EXPECT_EQ(rc_state(), IBV_QPS_ERR);
}

TEST_F(WireRcTest, RdmaWritePastTheMrIsRefused)
{
	auto va = reinterpret_cast<uintptr_t>(target);
	EXPECT_EQ(send_rc(0x0A, kModifyRqPsn, reth(va + sizeof(target) - 2, rkey, 4), {1, 2, 3, 4}),
		  WireOutcome::dropped);
	EXPECT_EQ(rc_state(), IBV_QPS_ERR);
}

TEST_F(WireRcTest, MiddleWithoutFirstIsAnInvalidRequest)
{
	post_rc_recv();
	EXPECT_EQ(send_rc(0x01, kModifyRqPsn, {}, {1, 2, 3, 4}), WireOutcome::dropped);
	EXPECT_EQ(rc_state(), IBV_QPS_ERR);
}

std::vector<uint8_t> fetch_add(uint64_t va, uint32_t key, uint64_t add)
{
	std::vector<uint8_t> h(w::kAtomicEthBytes);
	w::encode(w::AtomicEth{va, key, add, 0}, std::span<uint8_t, w::kAtomicEthBytes>(h.data(), w::kAtomicEthBytes));
	return h;
}

TEST_F(WireRcTest, DuplicateAtomicIsAnsweredNotExecutedAgain)
{
	auto va = reinterpret_cast<uintptr_t>(target);
	uint64_t counter = 5;
	std::memcpy(target, &counter, 8);
	EXPECT_EQ(send_rc(0x14, kModifyRqPsn, fetch_add(va, rkey, 3), {}), WireOutcome::delivered);
	std::memcpy(&counter, target, 8);
	EXPECT_EQ(counter, 8u);
	// The ATOMIC ACK was lost; the requester sends the same request again.
	EXPECT_EQ(send_rc(0x14, kModifyRqPsn, fetch_add(va, rkey, 3), {}), WireOutcome::delivered);
	std::memcpy(&counter, target, 8);
	EXPECT_EQ(counter, 8u) << "a duplicate atomic was executed again";
	EXPECT_EQ(send_rc(0x14, kModifyRqPsn + 1, fetch_add(va, rkey, 3), {}), WireOutcome::delivered);
	std::memcpy(&counter, target, 8);
	EXPECT_EQ(counter, 11u);
}

TEST_F(WireRcTest, UnalignedAtomicIsAnInvalidRequest)
{
	auto va = reinterpret_cast<uintptr_t>(target);
	EXPECT_EQ(send_rc(0x14, kModifyRqPsn, fetch_add(va + 4, rkey, 3), {}), WireOutcome::dropped);
	EXPECT_EQ(rc_state(), IBV_QPS_ERR);
}

TEST_F(WireRcTest, ReadConsumesAPsnPerResponse)
{
	auto va = reinterpret_cast<uintptr_t>(target);
	// 3000 bytes at a path MTU of 1024: three responses, PSNs P .. P+2.
	EXPECT_EQ(send_rc(0x0C, kModifyRqPsn, reth(va, rkey, 3000), {}), WireOutcome::delivered);
	post_rc_recv();
	// A PSN inside the READ's is a duplicate: answered, not executed.
	send_rc(0x04, kModifyRqPsn + 1, {}, {1});
	EXPECT_FALSE(completion());
	EXPECT_EQ(recv_count(rc_rq()), 1u);
	EXPECT_EQ(send_rc(0x04, kModifyRqPsn + 3, {}, {1}), WireOutcome::delivered);
	EXPECT_TRUE(completion());
}

TEST_F(WireRcTest, ReadBeyondTheMrIsARemoteAccessError)
{
	auto va = reinterpret_cast<uintptr_t>(target);
	EXPECT_EQ(send_rc(0x0C, kModifyRqPsn, reth(va, rkey, sizeof(target) + 1), {}), WireOutcome::dropped);
	EXPECT_EQ(rc_state(), IBV_QPS_ERR);
}

// An ACK for our QP: dropped until the context registered a response
// socket (XSRC_CMD_WIRE_RESPONSES), then handed to it, BTH .. pad.
TEST_F(WireRcTest, ResponsesGoToTheRegisteredSocket)
{
	std::vector<uint8_t> aeth = ack_aeth();
	ASSERT_NO_FATAL_FAILURE(to_rts());
	EXPECT_EQ(send_rc(0x11, 5, aeth, {}), WireOutcome::dropped);
	int sv[2];
	ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	unique_fd ours(sv[0]), theirs(sv[1]);
	xsrc_wire_responses cmd{0, static_cast<uint32_t>(theirs.get())};
	ASSERT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), 0);
	EXPECT_EQ(send_rc(0x11, 5, aeth, {}), WireOutcome::delivered);
	uint8_t got[64];
	ASSERT_EQ(recv(ours.get(), got, sizeof(got), MSG_DONTWAIT), ssize_t(w::kBthBytes + w::kAethBytes));
	w::Bth bth = w::decode_bth(std::span<const uint8_t, w::kBthBytes>(got, w::kBthBytes));
	EXPECT_EQ(bth.opcode, 0x11);
	EXPECT_EQ(bth.psn, 5u);
	// From another GID: not the peer's response.
	EXPECT_EQ(send_rc(0x11, 6, aeth, {}, "10.0.0.8"), WireOutcome::dropped);
}

// A context that reads batches (XSRC_WIRE_RESPONSES_BATCHED) gets the
// responses of one receive batch in one message, each behind its __u16
// length, when the batch ends (wire_flush_responses); none before.
TEST_F(WireRcTest, ResponsesOfABatchGoTogetherToABatchReader)
{
	std::vector<uint8_t> aeth = ack_aeth();
	ASSERT_NO_FATAL_FAILURE(to_rts());
	int sv[2];
	ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	unique_fd ours(sv[0]), theirs(sv[1]);
	xsrc_wire_responses cmd{XSRC_WIRE_RESPONSES_BATCHED, static_cast<uint32_t>(theirs.get())};
	ASSERT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), 0);
	EXPECT_EQ(send_rc(0x11, 5, aeth, {}), WireOutcome::delivered);
	EXPECT_EQ(send_rc(0x11, 6, aeth, {}), WireOutcome::delivered);
	uint8_t got[256];
	EXPECT_EQ(recv(ours.get(), got, sizeof(got), MSG_DONTWAIT), -1) << "sent before the batch ended";
	wire_flush_responses(dev);
	constexpr size_t one = w::kBthBytes + w::kAethBytes;
	ASSERT_EQ(recv(ours.get(), got, sizeof(got), MSG_DONTWAIT), ssize_t(2 * (2 + one)));
	for (uint32_t k = 0; k < 2; ++k) {
		const uint8_t *at = got + k * (2 + one);
		EXPECT_EQ(size_t(at[0] | at[1] << 8), one);
		w::Bth bth = w::decode_bth(std::span<const uint8_t, w::kBthBytes>(at + 2, w::kBthBytes));
		EXPECT_EQ(bth.opcode, 0x11);
		EXPECT_EQ(bth.psn, 5 + k);
	}
	wire_flush_responses(dev);
	EXPECT_EQ(recv(ours.get(), got, sizeof(got), MSG_DONTWAIT), -1) << "a batch sent twice";
	// An unknown comp_mask bit is refused, as a daemon without batches
	// refuses this one (the provider then asks for single responses).
	cmd.comp_mask = XSRC_WIRE_RESPONSES_ACK_BOARD << 1;
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), EOPNOTSUPP);
	// So does a daemon serving revision 9 (--abi 9): batches came with 10.
	dev.abi_revision = 9;
	cmd.comp_mask = XSRC_WIRE_RESPONSES_BATCHED;
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), EOPNOTSUPP);
	cmd.comp_mask = 0;
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), 0);
	dev.abi_revision = XSRC_DRIVER_ABI_REVISION;
}

// The ACK board (XSRC_WIRE_RESPONSES_ACK_BOARD): a context that registers
// one with its response socket.
class AckBoardTest : public WireRcTest {
protected:
	static constexpr uint32_t kEntries = 64;

	void SetUp() override
	{
		WireRcTest::SetUp();
		int sv[2];
		ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
		ours.reset(sv[0]);
		theirs.reset(sv[1]);
		board_fd = sealed_memfd(kEntries * sizeof(uint64_t));
		ASSERT_TRUE(board_fd);
		void *p = mmap(nullptr, kEntries * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, board_fd.get(), 0);
		ASSERT_NE(p, MAP_FAILED);
		words = static_cast<uint64_t *>(p);
		ASSERT_EQ(run(XSRC_CMD_WIRE_RESPONSES, board_cmd()), 0);
		ASSERT_TRUE(ctx.ack_board);
	}
	void TearDown() override
	{
		if (words)
			munmap(words, kEntries * sizeof(uint64_t));
		WireRcTest::TearDown();
	}

	static unique_fd sealed_memfd(size_t bytes, unsigned seals = F_SEAL_SHRINK)
	{
		unique_fd fd(memfd_create("ack-board-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
		if (!fd || ftruncate(fd.get(), static_cast<off_t>(bytes)) || (seals && fcntl(fd.get(), F_ADD_SEALS, seals)))
			return unique_fd();
		return fd;
	}
	xsrc_wire_responses board_cmd(uint32_t entries = kEntries) const
	{
		return {XSRC_WIRE_RESPONSES_BATCHED | XSRC_WIRE_RESPONSES_ACK_BOARD, static_cast<uint32_t>(theirs.get()),
			static_cast<uint32_t>(board_fd.get()), entries};
	}
	std::atomic_ref<uint64_t> word() { return std::atomic_ref<uint64_t>(words[rc.qpn % kEntries]); }
	static uint64_t owed(uint32_t qpn, uint32_t msn, uint32_t psn)
	{
		return XSRC_ACK_OWED | XSRC_ACK_TAG(qpn) | uint64_t(msn) << 24 | psn;
	}
	// A SEND ONLY asking for an ACK, into a receive posted for it.
	void send_one(uint32_t psn)
	{
		post_rc_recv();
		ASSERT_EQ(send_rc(0x04, psn, {}, {1, 2, 3}), WireOutcome::delivered);
		ASSERT_TRUE(completion());
	}

	unique_fd ours, theirs, board_fd;
	uint64_t *words = nullptr;
};

// The ACK a SEND asked for waits on the board, as a word of the QP (its tag,
// MSN and PSN) for the owner to send; once the owner took it, the daemon
// forgets it and sends nothing.
TEST_F(AckBoardTest, AnAckWaitsOnTheBoardForTheOwner)
{
	ASSERT_NO_FATAL_FAILURE(send_one(kModifyRqPsn));
	EXPECT_EQ(word().load(), owed(rc.qpn, 1, kModifyRqPsn));
	ASSERT_EQ(dev.owed_acks.size(), 1u);
	EXPECT_GT(wire_acks_due(dev), 0u) << "due later";
	uint64_t w = owed(rc.qpn, 1, kModifyRqPsn);
	ASSERT_TRUE(word().compare_exchange_strong(w, 0)) << "the owner takes it";
	EXPECT_EQ(wire_acks_due(dev), 0u);
	EXPECT_TRUE(dev.owed_acks.empty());
	EXPECT_EQ(word().load(), 0u);
	EXPECT_EQ(dev.acks_late, 0u);

	// A later ACK of the same QP covers an earlier one still waiting.
	ASSERT_NO_FATAL_FAILURE(send_one(kModifyRqPsn + 1));
	ASSERT_NO_FATAL_FAILURE(send_one(kModifyRqPsn + 2));
	EXPECT_EQ(word().load(), owed(rc.qpn, 3, kModifyRqPsn + 2));
	wire_acks_due(dev);
	EXPECT_EQ(dev.owed_acks.size(), 1u) << "the covered one is forgotten";
}

// An ACK the owner does not take is the daemon's once its delay passed: it
// takes the word back (and sends the ACK), and the QP's next ACKs go out at
// once for a while (a peer that sends nothing back).
TEST_F(AckBoardTest, AnAckNotTakenIsSentAfterItsDelay)
{
	dev.ack_delay_ns = 1'000'000;
	ASSERT_NO_FATAL_FAILURE(send_one(kModifyRqPsn));
	uint64_t due = wire_acks_due(dev);
	ASSERT_GT(due, 0u);
	EXPECT_EQ(word().load(), owed(rc.qpn, 1, kModifyRqPsn)) << "not before its time";
	std::this_thread::sleep_for(std::chrono::milliseconds(2));
	EXPECT_EQ(wire_acks_due(dev), 0u);
	EXPECT_EQ(word().load(), 0u) << "taken back by the daemon";
	EXPECT_TRUE(dev.owed_acks.empty());
	EXPECT_EQ(dev.acks_left, 1u);
	EXPECT_EQ(dev.acks_late, 1u);
	ASSERT_NO_FATAL_FAILURE(send_one(kModifyRqPsn + 1));
	EXPECT_EQ(word().load(), 0u) << "sent at once, not left on the board";
	EXPECT_TRUE(dev.owed_acks.empty());
}

// A duplicate request (a requester whose ACK timeout is shorter than the
// delay resends) is acknowledged at once, and so are the QP's next ACKs.
TEST_F(AckBoardTest, ADuplicateSendsTheNextAcksAtOnce)
{
	ASSERT_NO_FATAL_FAILURE(send_one(kModifyRqPsn));
	ASSERT_EQ(word().load(), owed(rc.qpn, 1, kModifyRqPsn));
	EXPECT_EQ(send_rc(0x04, kModifyRqPsn, {}, {1, 2, 3}), WireOutcome::delivered);
	EXPECT_FALSE(completion()) << "a duplicate completes nothing";
	word().store(0);  // the owner took the first
	ASSERT_NO_FATAL_FAILURE(send_one(kModifyRqPsn + 1));
	EXPECT_EQ(word().load(), 0u) << "sent at once";
}

// The word of another QP in the entry (QPNs equal modulo the board's size)
// is left alone: the ACK goes out at once. So does every ACK of a daemon
// whose delay is 0.
TEST_F(AckBoardTest, AnotherQpsWordOrNoDelaySendsAtOnce)
{
	const uint64_t other = owed(rc.qpn + kEntries, 5, 77);
	word().store(other);
	ASSERT_NO_FATAL_FAILURE(send_one(kModifyRqPsn));
	EXPECT_EQ(word().load(), other);
	EXPECT_TRUE(dev.owed_acks.empty());
	word().store(0);
	dev.ack_delay_ns = 0;
	ASSERT_NO_FATAL_FAILURE(send_one(kModifyRqPsn + 1));
	EXPECT_EQ(word().load(), 0u);
	EXPECT_TRUE(dev.owed_acks.empty());
}

// A board the daemon could fault on, or a malformed one, is refused; a
// caller from before the board sends the 8-byte command, still taken.
TEST_F(AckBoardTest, OnlyASealedBoardOfItsSizeIsTaken)
{
	xsrc_wire_responses cmd = board_cmd();
	unique_fd unsealed = sealed_memfd(kEntries * sizeof(uint64_t), 0);
	ASSERT_TRUE(unsealed);
	cmd.board_fd = static_cast<uint32_t>(unsealed.get());
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), EINVAL) << "not sealed against shrinking";
	unique_fd small = sealed_memfd(8);
	ASSERT_TRUE(small);
	cmd.board_fd = static_cast<uint32_t>(small.get());
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), EINVAL) << "shorter than its entries";
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, board_cmd(48)), EINVAL) << "not a power of two";
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, board_cmd(2 * XSRC_ACK_BOARD_MAX)), EINVAL);
	cmd = board_cmd();
	cmd.comp_mask = XSRC_WIRE_RESPONSES_BATCHED;
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), EINVAL) << "board fields without the bit";
	cmd.board_fd = 1000000;
	cmd.comp_mask |= XSRC_WIRE_RESPONSES_ACK_BOARD;
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), EBADF);

	struct {
		uint32_t comp_mask, fd;
	} before_the_board{XSRC_WIRE_RESPONSES_BATCHED, static_cast<uint32_t>(theirs.get())};
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, before_the_board), 0);
	EXPECT_FALSE(ctx.ack_board) << "registered again, without a board";
	ASSERT_NO_FATAL_FAILURE(send_one(kModifyRqPsn));
	EXPECT_EQ(word().load(), 0u);
}

TEST_F(WireRcTest, ResponseSocketMustBeTheCallersSeqpacketSocket)
{
	xsrc_wire_responses cmd{XSRC_WIRE_RESPONSES_ACK_BOARD << 1, 0};
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), EOPNOTSUPP);  // an unknown comp_mask bit
	cmd = {0, 0x80000000u};
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), EINVAL);
	cmd = {0, 1000000};
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), EBADF);
	int dg[2];
	ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM, 0, dg), 0);
	unique_fd a(dg[0]), b(dg[1]);
	cmd = {0, static_cast<uint32_t>(a.get())};
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), EINVAL);
	int sv[2];
	ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	unique_fd c(sv[0]), d(sv[1]);
	cmd = {0, static_cast<uint32_t>(d.get())};
	dev.abi_revision = 7;  // before revision 8
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), EOPNOTSUPP);
	dev.abi_revision = XSRC_DRIVER_ABI_REVISION;
	EXPECT_EQ(run(XSRC_CMD_WIRE_RESPONSES, cmd), 0);
	EXPECT_TRUE(ctx.wire_responses);
}

// SEND with Invalidate naming an rkey that is no type 2 window bound to
// the QP: an invalid request; its receive completes in error, the QP goes
// to ERR, and the MR's key still works for nobody but stays an MR.
TEST_F(WireRcTest, SendWithInvalidateOfAnMrKeyIsAnInvalidRequest)
{
	post_rc_recv();
	std::vector<uint8_t> ieth(w::kIethBytes);
	w::encode(w::Ieth{rkey}, std::span<uint8_t, w::kIethBytes>(ieth.data(), w::kIethBytes));
	EXPECT_EQ(send_rc(w::op::kSendOnlyInv, kModifyRqPsn, ieth, {1, 2, 3}), WireOutcome::dropped);
	auto c = completion();
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_REM_INV_REQ_ERR);
	EXPECT_EQ(buf[0], 0) << "bytes of a refused SEND with Invalidate landed";
	EXPECT_EQ(rc_state(), IBV_QPS_ERR);
}

// max_dest_rd_atomic 0: the responder keeps no READ or atomic, so one is an
// invalid request; nothing is read or changed.
TEST_F(WireRcTest, ReadOrAtomicWithoutResponderResourcesIsAnInvalidRequest)
{
	std::get<Qp>(ctx.objects.at(rc.handle)).attributes().max_dest_rd_atomic = 0;
	auto va = reinterpret_cast<uintptr_t>(target);
	uint64_t counter = 5;
	std::memcpy(target, &counter, 8);
	EXPECT_EQ(send_rc(0x14, kModifyRqPsn, fetch_add(va, rkey, 3), {}), WireOutcome::dropped);
	std::memcpy(&counter, target, 8);
	EXPECT_EQ(counter, 5u);
	EXPECT_EQ(rc_state(), IBV_QPS_ERR);
}

// The replay table holds max_dest_rd_atomic requests: a duplicate of one
// that fell out is neither answered from stale state nor executed again.
TEST_F(WireRcTest, ReplayTableIsSizedByMaxDestRdAtomic)
{
	std::get<Qp>(ctx.objects.at(rc.handle)).attributes().max_dest_rd_atomic = 2;
	auto va = reinterpret_cast<uintptr_t>(target);
	uint64_t counter = 0;
	std::memcpy(target, &counter, 8);
	for (uint32_t i = 0; i < 3; ++i)
		EXPECT_EQ(send_rc(0x14, kModifyRqPsn + i, fetch_add(va, rkey, 1), {}), WireOutcome::delivered);
	const WireResponderState &st = *std::get<Qp>(ctx.objects.at(rc.handle)).wire_responder;
	size_t used = 0;
	for (const auto &r : st.replay)
		used += r.used;
	EXPECT_EQ(used, 2u);
	EXPECT_EQ(send_rc(0x14, kModifyRqPsn, fetch_add(va, rkey, 1), {}), WireOutcome::delivered);
	std::memcpy(&counter, target, 8);
	EXPECT_EQ(counter, 3u) << "a duplicate atomic was executed again";
	EXPECT_EQ(rc_state(), IBV_QPS_RTR);
}

// ATOMIC WRITE: its 8 bytes land through the rkey; a duplicate (its ACK
// was lost) is acknowledged again, not written over a newer value.
TEST_F(WireRcTest, AtomicWriteLandsOnceAndItsDuplicateIsOnlyAcknowledged)
{
	auto va = reinterpret_cast<uintptr_t>(target);
	std::vector<uint8_t> value = {1, 2, 3, 4, 5, 6, 7, 8};
	EXPECT_EQ(send_rc(w::op::kAtomicWrite, kModifyRqPsn, reth(va + 8, rkey, 8), value), WireOutcome::delivered);
	EXPECT_EQ(std::memcmp(target + 8, value.data(), 8), 0);
	target[8] = 99;  // written again since
	EXPECT_EQ(send_rc(w::op::kAtomicWrite, kModifyRqPsn, reth(va + 8, rkey, 8), value), WireOutcome::delivered);
	EXPECT_EQ(target[8], 99) << "a duplicate ATOMIC WRITE was executed again";
	EXPECT_EQ(rc_state(), IBV_QPS_RTR);
}

TEST_F(WireRcTest, UnalignedAtomicWriteIsAnInvalidRequest)
{
	auto va = reinterpret_cast<uintptr_t>(target);
	EXPECT_EQ(send_rc(w::op::kAtomicWrite, kModifyRqPsn, reth(va + 4, rkey, 8), std::vector<uint8_t>(8, 1)),
		  WireOutcome::dropped);
	EXPECT_EQ(target[4], 0);
	EXPECT_EQ(rc_state(), IBV_QPS_ERR);
}

TEST_F(WireRcTest, AtomicWriteOfAnotherLengthIsAnInvalidRequest)
{
	auto va = reinterpret_cast<uintptr_t>(target);
	EXPECT_EQ(send_rc(w::op::kAtomicWrite, kModifyRqPsn, reth(va, rkey, 4), std::vector<uint8_t>(4, 1)),
		  WireOutcome::dropped);
	EXPECT_EQ(target[0], 0);
	EXPECT_EQ(rc_state(), IBV_QPS_ERR);
}

// --- XRC: the receive QP and the SRQ the XRCETH names ---------------------

// An XRC receive QP of domain A connected (RTR) to kModifyDestQpn at
// ::ffff:10.0.0.7; an XRC SRQ of domain A and one of domain B.
class WireXrcTest : public WireRcTest {
protected:
	void SetUp() override
	{
		WireRcTest::SetUp();
		ASSERT_EQ(open_xrcd(xrcd_a), 0);
		ASSERT_EQ(open_xrcd(xrcd_b), 0);
		ASSERT_EQ(create_xsrq(xrcd_a, srq_a), 0);
		ASSERT_EQ(create_xsrq(xrcd_b, srq_b), 0);
		QpSpec s;
		s.qp_type = IBV_QPT_XRC_RECV;
		s.pd = xrcd_a;
		s.send_cq = s.recv_cq = 0;
		ASSERT_EQ(create_qp(s, tgt), 0);
		ib_uverbs_modify_qp init = modify_cmd(tgt.handle, IBV_QPS_INIT,
						      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
		init.qp_access_flags |= IBV_ACCESS_REMOTE_ATOMIC;
		ASSERT_EQ(modify_qp(init), 0);
		ASSERT_EQ(modify_qp(modify_cmd(tgt.handle, IBV_QPS_RTR,
					       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
						       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)), 0);
	}

	struct XSrq {
		uint32_t handle = 0;
		uint32_t srqn = 0;
		uint64_t ring_off = 0;
	};

	int open_xrcd(uint32_t &handle)
	{
		ib_uverbs_open_xrcd_resp resp{~0u};
		ib_uverbs_open_xrcd cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.fd = 0xffffffffu;  // a private domain
		int err = run(IB_USER_VERBS_CMD_OPEN_XRCD, cmd, {}, sizeof(resp));
		handle = resp.xrcd_handle;
		return err;
	}

	int create_xsrq(uint32_t xrcd, XSrq &out)
	{
		Resp<ib_uverbs_create_srq_resp, xsrc_create_srq_resp> resp;
		ib_uverbs_create_xsrq cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.srq_type = IBV_SRQT_XRC;
		cmd.pd_handle = pd0;
		cmd.max_wr = 8;
		cmd.max_sge = 1;
		cmd.xrcd_handle = xrcd;
		cmd.cq_handle = cq0;
		int err = run(IB_USER_VERBS_CMD_CREATE_XSRQ, cmd, {}, sizeof(resp));
		out = {resp.core().srq_handle, resp.core().srqn, resp.drv().ring_off};
		return err;
	}

	void post(const XSrq &srq, uint64_t wr_id)
	{
		xsrc_sge sge{reinterpret_cast<uintptr_t>(buf), sizeof(buf), lkey};
		ASSERT_TRUE(recv_push(&arena().at<xsrc_recv_ring>(srq.ring_off), wr_id, &sge, 1));
	}

	// An XRC request: BTH, XRCETH naming `srqn`, `headers`, `payload`.
	WireOutcome send_xrc(uint8_t op, uint32_t psn, uint32_t srqn, std::vector<uint8_t> headers,
			     std::vector<uint8_t> payload)
	{
		std::vector<uint8_t> x(w::kXrcEthBytes);
		w::encode(w::XrcEth{srqn}, std::span<uint8_t, w::kXrcEthBytes>(x.data(), w::kXrcEthBytes));
		std::vector<uint8_t> body(w::kBthBytes);
		w::Bth bth;
		bth.opcode = static_cast<uint8_t>(w::Transport::xrc) | op;
		bth.dest_qpn = tgt.qpn;
		bth.psn = psn;
		bth.ack_req = true;
		bth.pad = w::pad_of(payload.size());
		w::encode(bth, std::span<uint8_t, w::kBthBytes>(body.data(), w::kBthBytes));
		body.insert(body.end(), x.begin(), x.end());
		body.insert(body.end(), headers.begin(), headers.end());
		body.insert(body.end(), payload.begin(), payload.end());
		body.insert(body.end(), bth.pad, 0);
		std::vector<uint8_t> p = frame(body, "10.0.0.7", "127.0.0.1", false);
		return wire_deliver(dev, p);
	}

	ibv_qp_state tgt_state() { return xsrc_qp_state_decode(arena().qp_entry(tgt.qpn - XSRC_QPN_BASE).state); }

	uint32_t xrcd_a = 0, xrcd_b = 0;
	XSrq srq_a, srq_b;
	CreatedQp tgt;
};

TEST_F(WireXrcTest, SendLandsInTheSrqTheXrcethNames)
{
	post(srq_a, 21);
	EXPECT_EQ(send_xrc(w::op::kSendFirst, kModifyRqPsn, srq_a.srqn, {}, std::vector<uint8_t>(8, 1)),
		  WireOutcome::delivered);
	EXPECT_EQ(send_xrc(w::op::kSendLast, kModifyRqPsn + 1, srq_a.srqn, {}, {2, 2, 2}), WireOutcome::delivered);
	auto c = completion();  // on the SRQ's CQ
	ASSERT_TRUE(c);
	EXPECT_EQ(c->status, IBV_WC_SUCCESS);
	EXPECT_EQ(c->wr_id, 21u);
	EXPECT_EQ(c->byte_len, 11u);
	EXPECT_EQ(c->qp_num, tgt.qpn);
	EXPECT_EQ(buf[0], 1);
	EXPECT_EQ(buf[10], 2);
	EXPECT_EQ(tgt_state(), IBV_QPS_RTR);
}

TEST_F(WireXrcTest, SrqOfAnotherDomainIsAnInvalidRequest)
{
	post(srq_b, 22);
	EXPECT_EQ(send_xrc(w::op::kSendOnly, kModifyRqPsn, srq_b.srqn, {}, {1, 2, 3}), WireOutcome::dropped);
	EXPECT_FALSE(completion());
	EXPECT_EQ(buf[0], 0);
	EXPECT_EQ(recv_count(&arena().at<xsrc_recv_ring>(srq_b.ring_off)), 1u);
	EXPECT_EQ(tgt_state(), IBV_QPS_ERR);
}

// A SEND under way into SRQ A whose next packet names SRQ B (of the same
// domain): the receive taken from A cannot take it; invalid request.
TEST_F(WireXrcTest, MessageSwitchingSrqsMidwayIsAnInvalidRequest)
{
	XSrq other;
	ASSERT_EQ(create_xsrq(xrcd_a, other), 0);
	post(srq_a, 24);
	post(other, 25);
	EXPECT_EQ(send_xrc(w::op::kSendFirst, kModifyRqPsn, srq_a.srqn, {}, std::vector<uint8_t>(8, 1)),
		  WireOutcome::delivered);
	EXPECT_EQ(send_xrc(w::op::kSendLast, kModifyRqPsn + 1, other.srqn, {}, {2}), WireOutcome::dropped);
	EXPECT_EQ(recv_count(&arena().at<xsrc_recv_ring>(other.ring_off)), 1u);
	EXPECT_EQ(tgt_state(), IBV_QPS_ERR);
}

TEST_F(WireXrcTest, NoSuchSrqIsAnInvalidRequest)
{
	EXPECT_EQ(send_xrc(w::op::kSendOnly, kModifyRqPsn, srq_a.srqn + 100, {}, {1}), WireOutcome::dropped);
	EXPECT_EQ(tgt_state(), IBV_QPS_ERR);
}

TEST_F(WireXrcTest, AnRcOpcodeDoesNotReachAnXrcReceiveQp)
{
	post(srq_a, 23);
	std::vector<uint8_t> body(w::kBthBytes);
	w::Bth bth;
	bth.opcode = w::op::kSendOnly;  // RC
	bth.dest_qpn = tgt.qpn;
	bth.psn = kModifyRqPsn;
	w::encode(bth, std::span<uint8_t, w::kBthBytes>(body.data(), w::kBthBytes));
	std::vector<uint8_t> p = frame(body, "10.0.0.7", "127.0.0.1", false);
	EXPECT_EQ(wire_deliver(dev, p), WireOutcome::dropped);
	EXPECT_FALSE(completion());
	EXPECT_EQ(tgt_state(), IBV_QPS_RTR);
}

// RDMA WRITE and atomics through an XRC receive QP: keys of the PD of the
// SRQ named (the receive QP has none).
TEST_F(WireXrcTest, WriteAndAtomicUseTheSrqsPd)
{
	auto va = reinterpret_cast<uintptr_t>(target);
	EXPECT_EQ(send_xrc(w::op::kWriteOnly, kModifyRqPsn, srq_a.srqn, reth(va + 16, rkey, 4), {7, 7, 7, 7}),
		  WireOutcome::delivered);
	EXPECT_EQ(target[16], 7);
	uint64_t counter = 40;
	std::memcpy(target, &counter, 8);
	EXPECT_EQ(send_xrc(w::op::kFetchAdd, kModifyRqPsn + 1, srq_a.srqn, fetch_add(va, rkey, 2), {}),
		  WireOutcome::delivered);
	std::memcpy(&counter, target, 8);
	EXPECT_EQ(counter, 42u);
	EXPECT_EQ(tgt_state(), IBV_QPS_RTR);
}

}  // namespace
}  // namespace xsrc::test
