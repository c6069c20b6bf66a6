// traffic_errors: SENDs whose payload travels in the receiver's CQ ring
// (payload slots up to 256 bytes, big slots up to 4 KiB + GRH) or, past
// those, by a copy into the receiver: the receiver polls late, and still
// every byte lands where its receive said, in order, with nothing beyond
// it touched (the fixture: traffic_fixture.h).
#include <xsrc-queues.h>

#include "traffic_fixture.h"

namespace xsrc_traffic {
namespace {

constexpr size_t kStride = 8192;  // receive buffers, one per message
constexpr uint32_t kUdQkey = 0x11111111;

// Each message's bytes: a fill of its own (never the peer's fill).
uint8_t fill_of(size_t i)
{
	uint8_t f = static_cast<uint8_t>(i * 37 + 1);
	return f == kPeerFill ? 0x5A : f;
}

struct Sends {
	ibv_cq *cq;
	Buffer *src;
};

// Our end: a source buffer with message i's fill at i * kStride.
Sends sends(Verbs &me, size_t count)
{
	Sends s{me.cq(512), me.buffer(count * kStride, IBV_ACCESS_LOCAL_WRITE, 0)};
	for (size_t i = 0; i < count; ++i)
		std::memset(s.src->data + i * kStride, fill_of(i), kStride);
	return s;
}

// Posts message i of `len` bytes and waits for its (requester) completion.
void send_one(ibv_qp *qp, const Sends &s, size_t i, uint32_t len)
{
	SendWr w(i, IBV_WR_SEND, s.src->addr() + i * kStride, len, s.src->lkey());
	ASSERT_EQ(w.post(qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(s.cq, &wc));
	EXPECT_EQ(wc.wr_id, i);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
}

class PayloadSlots : public Traffic {
protected:
	// The peer's receive buffer for message i holds its `len` bytes (after
	// `head` bytes of GRH) and nothing past them.
	void expect_landed(const PeerMr &rbuf, size_t i, size_t head, size_t len, size_t slot = SIZE_MAX)
	{
		SCOPED_TRACE("message " + std::to_string(i) + ", " + std::to_string(len) + " bytes");
		size_t at = (slot == SIZE_MAX ? i : slot) * kStride;
		std::string where;
		EXPECT_EQ(peer_bad_bytes(rbuf, fill_of(i), at + head, len, &where), 0u) << where;
		EXPECT_EQ(peer_bad_bytes(rbuf, kPeerFill, at + head + len, kStride - head - len, &where), 0u)
			<< "written past the message: " << where;
	}

	// The peer's completions for the messages of `lens`, in order (receive
	// wr_ids from 1000), each carrying its length.
	void expect_received(uint64_t pcq, const std::vector<uint32_t> &lens)
	{
		auto got = peer_poll(pcq, lens.size(), 10s);
		ASSERT_EQ(got.size(), lens.size()) << describe(got);
		for (size_t i = 0; i < got.size(); ++i) {
			SCOPED_TRACE("receive " + std::to_string(i));
			EXPECT_EQ(got[i].wr_id, 1000 + i) << "out of order";
			EXPECT_EQ(got[i].status, IBV_WC_SUCCESS) << status_str(got[i].status);
			EXPECT_EQ(got[i].opcode, IBV_WC_RECV);
			EXPECT_EQ(got[i].byte_len, lens[i]);
		}
	}
};

// Sizes on both sides of each slot's limit, sent while the receiver does not
// poll: each lands whole when it polls, and nothing past it.
TEST_F(PayloadSlots, SizesAroundSlotLimitsLandWhenPolledLate)
{
	const std::vector<uint32_t> lens = {1, 255, 256, 257, 1024, 4095, 4096, 4097, 8192};
	uint64_t pcq = peer_cq(64);
	PairOpts o;
	o.peer_max_recv_wr = 32;
	Sends s = sends(me(), lens.size());
	Pair p = rc_pair(s.cq, s.cq, pcq, o);
	PeerMr rbuf = peer_mr(lens.size() * kStride, IBV_ACCESS_LOCAL_WRITE);
	peer_post_recv(p.peer.id, rbuf, 0, kStride, 1000, lens.size(), kStride);
	for (size_t i = 0; i < lens.size(); ++i)
		send_one(p.qp, s, i, lens[i]);
	expect_received(pcq, lens);
	for (size_t i = 0; i < lens.size(); ++i)
		expect_landed(rbuf, i, 0, lens[i]);
}

// A SEND gathered from 8 SGEs of different fills (each past a payload
// slot's size together) arrives in their order.
TEST_F(PayloadSlots, MultiSgeGatherLandsInOrder)
{
	uint64_t pcq = peer_cq(64);
	Sends s = sends(me(), 8);
	PairOpts o;
	o.caps.max_send_sge = 8;
	Pair p = rc_pair(s.cq, s.cq, pcq, o);
	PeerMr rbuf = peer_mr(kStride, IBV_ACCESS_LOCAL_WRITE);
	peer_post_recv(p.peer.id, rbuf, 0, kStride, 1000);
	// Pieces of 1..8 * 100 bytes: 3600 in all, from the 8 fill regions.
	ibv_sge sge[8];
	uint32_t total = 0;
	for (uint32_t k = 0; k < 8; ++k) {
		sge[k] = {s.src->addr() + k * kStride, (k + 1) * 100, s.src->lkey()};
		total += sge[k].length;
	}
	ibv_send_wr wr{};
	wr.wr_id = 7;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = sge;
	wr.num_sge = 8;
	ibv_send_wr *bad = nullptr;
	ASSERT_EQ(ibv_post_send(p.qp, &wr, &bad), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(s.cq, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	expect_received(pcq, {total});
	uint32_t at = 0;
	for (uint32_t k = 0; k < 8; ++k) {
		SCOPED_TRACE("piece " + std::to_string(k));
		std::string where;
		EXPECT_EQ(peer_bad_bytes(rbuf, fill_of(k), at, sge[k].length, &where), 0u) << where;
		at += sge[k].length;
	}
	EXPECT_EQ(peer_bad_bytes(rbuf, kPeerFill, total, kStride - total), 0u) << "written past the message";
}

// More medium messages than the ring has big slots (a CQ of 512 has the
// most, XSRC_CQ_BIG_SLOTS), unpolled: the first XSRC_CQ_BIG_SLOTS wait in the ring (their buffers untouched until the
// receiver polls), the rest are copied at once; all arrive, in order.
TEST_F(PayloadSlots, BigSlotExhaustionFallsBackToCopy)
{
	constexpr size_t kCount = XSRC_CQ_BIG_SLOTS + 40;
	constexpr uint32_t kLen = 1000;
	uint64_t pcq = peer_cq(512);
	PairOpts o;
	o.peer_max_recv_wr = 512;
	Sends s = sends(me(), kCount);
	Pair p = rc_pair(s.cq, s.cq, pcq, o);
	PeerMr rbuf = peer_mr(kCount * kStride, IBV_ACCESS_LOCAL_WRITE);
	peer_post_recv(p.peer.id, rbuf, 0, kStride, 1000, kCount, kStride);
	for (size_t i = 0; i < kCount; ++i)
		send_one(p.qp, s, i, kLen);
	// Before the receiver polls: slots first, then the copies.
	EXPECT_EQ(peer_bad_bytes(rbuf, kPeerFill, 0, XSRC_CQ_BIG_SLOTS * kStride), 0u)
		<< "a payload in a big slot was placed before the receiver polled";
	for (size_t i = XSRC_CQ_BIG_SLOTS; i < kCount; ++i)
		EXPECT_EQ(peer_bad_bytes(rbuf, fill_of(i), i * kStride, kLen), 0u) << "message " << i << " not copied";
	expect_received(pcq, std::vector<uint32_t>(kCount, kLen));
	for (size_t i = 0; i < kCount; ++i)
		expect_landed(rbuf, i, 0, kLen);
	// The slots are free again: the next message waits in one.
	PeerMr more = peer_mr(kStride, IBV_ACCESS_LOCAL_WRITE);
	peer_post_recv(p.peer.id, more, 0, kStride, 1000);
	send_one(p.qp, s, 0, kLen);
	EXPECT_EQ(peer_bad_bytes(more, kPeerFill), 0u) << "no big slot was free after the polls";
	expect_received(pcq, {kLen});
	expect_landed(more, 0, 0, kLen);
}

// Small, medium and large messages interleaved on one QP, with the big slots
// running out on the way: completions keep the QP's order, and each buffer
// holds its own message.
TEST_F(PayloadSlots, MixedPathsKeepPerQpOrder)
{
	constexpr size_t kCount = 500;  // 300 for the big slots: more than there are
	const uint32_t sizes[] = {100, 2000, 5000, 3000, 4096};
	uint64_t pcq = peer_cq(512);
	PairOpts o;
	o.peer_max_recv_wr = 512;
	Sends s = sends(me(), kCount);
	Pair p = rc_pair(s.cq, s.cq, pcq, o);
	PeerMr rbuf = peer_mr(kCount * kStride, IBV_ACCESS_LOCAL_WRITE);
	peer_post_recv(p.peer.id, rbuf, 0, kStride, 1000, kCount, kStride);
	std::vector<uint32_t> lens;
	for (size_t i = 0; i < kCount; ++i) {
		lens.push_back(sizes[i % std::size(sizes)]);
		send_one(p.qp, s, i, lens.back());
	}
	expect_received(pcq, lens);
	for (size_t i = 0; i < kCount; ++i)
		expect_landed(rbuf, i, 0, lens[i]);
}

// UD datagrams (GRH in front) below, at and above the small slot's size and
// up to the MTU, unpolled: each lands whole behind its GRH.
TEST_F(PayloadSlots, UdDatagramsWithGrhLandWhenPolledLate)
{
	uint64_t pcq = peer_cq(64);
	Msg q = peer().call(Msg("qp").set("type", "ud").set("cq", pcq).set("max_recv_wr", 16));
	PeerQp pqp{q.u64("id"), static_cast<uint32_t>(q.u64("qpn"))};
	peer().call(Msg("ud_up").set("qp", pqp.id).set("qkey", kUdQkey));
	uint32_t mtu = me().mtu_bytes;
	const std::vector<uint32_t> lens = {1, 215, 216, 217, 255, 256, 257, mtu - 1, mtu};
	PeerMr rbuf = peer_mr(lens.size() * kStride, IBV_ACCESS_LOCAL_WRITE);
	peer_post_recv(pqp.id, rbuf, 0, kStride, 1000, lens.size(), kStride);
	Sends s = sends(me(), lens.size());
	ibv_qp *qp = me().qp(IBV_QPT_UD, s.cq, s.cq);
	ud_connect(qp, 0x22222222);
	ibv_ah *ah = me().ah(peer().gid);
	for (size_t i = 0; i < lens.size(); ++i) {
		SendWr w(i, IBV_WR_SEND, s.src->addr() + i * kStride, lens[i], s.src->lkey());
		ASSERT_EQ(w.ud(ah, pqp.qpn, kUdQkey).post(qp), 0);
		ibv_wc wc{};
		ASSERT_TRUE(one_completion(s.cq, &wc));
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	}
	auto got = peer_poll(pcq, lens.size(), 10s);
	ASSERT_EQ(got.size(), lens.size()) << describe(got);
	for (size_t i = 0; i < lens.size(); ++i) {
		SCOPED_TRACE("datagram " + std::to_string(i));
		EXPECT_EQ(got[i].wr_id, 1000 + i);
		EXPECT_EQ(got[i].status, IBV_WC_SUCCESS) << status_str(got[i].status);
		EXPECT_EQ(got[i].byte_len, lens[i] + 40);
		EXPECT_TRUE(got[i].wc_flags & IBV_WC_GRH);
		EXPECT_EQ(got[i].src_qp, qp->qp_num);
		expect_landed(rbuf, i, 40, lens[i]);
	}
}

}  // namespace
}  // namespace xsrc_traffic
