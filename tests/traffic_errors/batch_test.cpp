// traffic_errors: unsignaled RDMA WRITEs and atomics of a streaming QP run in
// batches (one process_vm_* call for many; requester.cpp, shm_responder.cpp),
// and nothing about them differs from one at a time: bytes, order, errors,
// and atomicity against other requesters (the fixture: traffic_fixture.h).
#include "traffic_fixture.h"

namespace xsrc_traffic {
namespace {

// ===============================================================================
// Batches
// ===============================================================================

constexpr uint64_t kFill64 = 0x3C3C3C3C3C3C3C3Cull;  // 8 bytes of kSrcFill
constexpr uint64_t kPeer64 = 0xA5A5A5A5A5A5A5A5ull;  // 8 bytes of kPeerFill

class Batch : public Traffic {
protected:
	void SetUp() override
	{
		Traffic::SetUp();
		pcq_ = peer_cq();
		target_ = peer_mr(8192, kAllAccess, kPeerFill);
		cq_ = me().cq(256);
		PairOpts o;
		o.caps.max_send_wr = 128;
		pair_ = rc_pair(cq_, cq_, pcq_, o);
		src_ = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	}

	// An 8-byte RDMA WRITE from src_ + `from` to target_ + `to`.
	int write8(uint64_t wr_id, size_t from, size_t to, bool signaled, uint32_t rkey = 0)
	{
		SendWr w(wr_id, IBV_WR_RDMA_WRITE, src_->addr() + from, 8, src_->lkey(),
			 signaled ? IBV_SEND_SIGNALED : 0);
		return w.rdma(target_.addr + to, rkey ? rkey : target_.rkey).post(pair_.qp);
	}
	uint64_t peer64(size_t off)
	{
		return peer().call(Msg("read64").set("mr", target_.id).set("off", off)).u64("value");
	}
	// How many of the first `words` words at a 64-byte stride of the target
	// still do not hold src_'s bytes when they all do or `wait` is over.
	size_t words_not_written_within(int words, ms wait)
	{
		auto deadline = Clock::now() + wait;
		size_t bad = 1;
		while (bad && Clock::now() < deadline) {
			bad = 0;
			for (int i = 0; i < words; ++i)
				bad += peer64(64 * i) != kFill64;
		}
		return bad;
	}

	uint64_t pcq_ = 0;
	PeerMr target_;
	ibv_cq *cq_ = nullptr;
	Pair pair_;
	Buffer *src_ = nullptr;
};

// 64 unsignaled writes, 8 bytes each at a 64-byte stride (as perftest's
// ib_write_bw -s 8), then 32 adjacent ones, the last signaled: one completion,
// every word written, not a byte between them.
TEST_F(Batch, UnsignaledWritesLandAndGapsStay)
{
	for (int i = 0; i < 64; ++i)
		ASSERT_EQ(write8(i, 0, 64 * i, false), 0);
	for (int i = 0; i < 32; ++i)
		ASSERT_EQ(write8(64 + i, 0, 4096 + 8 * i, i == 31), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq_, &wc));
	EXPECT_EQ(wc.wr_id, 95u);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	auto extra = poll_quiet(cq_, 50ms);
	EXPECT_TRUE(extra.empty()) << "completions of unsignaled writes:" << describe(extra);
	for (int i = 0; i < 64; ++i) {
		EXPECT_EQ(peer64(64 * i), kFill64) << "word at " << 64 * i;
		EXPECT_EQ(peer_bad_bytes(target_, kPeerFill, 64 * i + 8, 56), 0u) << "gap after " << 64 * i;
	}
	EXPECT_EQ(peer_bad_bytes(target_, kSrcFill, 4096, 256), 0u) << "the adjacent writes";
	EXPECT_EQ(peer_bad_bytes(target_, kPeerFill, 4096 + 256), 0u) << "after them";
}

// Round after round of batches on one QP (each reuses what the last one
// worked in): every round completes and lands, with an SGE list of two
// pieces now and then so that a batch item's pieces change in number.
TEST_F(Batch, ManyBatchesOnOneQpEachLand)
{
	constexpr int kRounds = 100, kWrites = 40;
	for (int round = 0; round < kRounds; ++round) {
		for (int i = 0; i < kWrites; ++i) {
			uint64_t wr_id = uint64_t(round) * kWrites + i;
			bool last = i == kWrites - 1;
			if (i % 7 == 3) {  // 4 + 4 bytes from two pieces of src_
				ibv_sge sges[2] = {{src_->addr(), 4, src_->lkey()}, {src_->addr() + 512, 4, src_->lkey()}};
				SendWr w(wr_id, IBV_WR_RDMA_WRITE, 0, 0, 0, last ? IBV_SEND_SIGNALED : 0);
				w.rdma(target_.addr + 64 * i, target_.rkey);
				w.wr.sg_list = sges;
				w.wr.num_sge = 2;
				ibv_send_wr *bad = nullptr;
				ASSERT_EQ(ibv_post_send(pair_.qp, &w.wr, &bad), 0);
			} else {
				ASSERT_EQ(write8(wr_id, 0, 64 * i, last), 0) << "round " << round << " write " << i;
			}
		}
		ibv_wc wc{};
		ASSERT_TRUE(one_completion(cq_, &wc)) << "round " << round;
		ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << "round " << round << ": " << status_str(wc.status);
		ASSERT_EQ(wc.wr_id, uint64_t(round) * kWrites + kWrites - 1);
	}
	for (int i = 0; i < kWrites; ++i) {
		EXPECT_EQ(peer64(64 * i), kFill64) << "word at " << 64 * i;
		EXPECT_EQ(peer_bad_bytes(target_, kPeerFill, 64 * i + 8, 56), 0u) << "gap after " << 64 * i;
	}
}

// Writes to the same bytes in one batch: the later one wins, as posted.
TEST_F(Batch, LaterWriteToTheSameBytesWins)
{
	uint64_t a = 0x1111111111111111ull, b = 0x2222222222222222ull;
	memcpy(src_->mr_start() + 64, &a, 8);
	memcpy(src_->mr_start() + 128, &b, 8);
	for (int round = 0; round < 8; ++round) {
		ASSERT_EQ(write8(3 * round, 64, 8 * round, false), 0);
		ASSERT_EQ(write8(3 * round + 1, 128, 8 * round, false), 0);
		ASSERT_EQ(write8(3 * round + 2, round % 2 ? 64 : 128, 8 * round, round == 7), 0);
	}
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq_, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	for (int round = 0; round < 8; ++round)
		EXPECT_EQ(peer64(8 * round), round % 2 ? a : b) << "round " << round;
}

// A bad rkey in the middle of a batch: the writes before it land, it fails
// with IBV_WC_REM_ACCESS_ERR, every one after it is flushed (signaled or
// not) and moves nothing; the QP is in ERR.
TEST_F(Batch, BadRkeyInTheMiddle)
{
	for (int i = 0; i < 8; ++i)
		ASSERT_EQ(write8(i, 0, 64 * i, false), 0);
	ASSERT_EQ(write8(8, 0, 64 * 8, false, target_.rkey ^ 0x5a5a00), 0);
	for (int i = 9; i < 17; ++i)
		ASSERT_EQ(write8(i, 0, 64 * i, i == 16), 0);
	auto wcs = poll_completions(cq_, 9, 5s);
	ASSERT_EQ(wcs.size(), 9u) << describe(wcs);
	EXPECT_EQ(wcs[0].wr_id, 8u);
	EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR) << status_str(wcs[0].status);
	for (size_t i = 1; i < wcs.size(); ++i) {
		EXPECT_EQ(wcs[i].wr_id, 8 + i);
		EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR) << status_str(wcs[i].status);
	}
	EXPECT_EQ(qp_state(pair_.qp), IBV_QPS_ERR);
	for (int i = 0; i < 8; ++i)
		EXPECT_EQ(peer64(64 * i), kFill64) << "write " << i << " before the bad one";
	EXPECT_EQ(peer_bad_bytes(target_, kPeerFill, 64 * 8), 0u) << "from the bad one on";
}

// A deregistered MR is unreachable at once, also in the middle of a batch:
// the writes before it land, the first through the dead rkey fails.
TEST_F(Batch, DeregisteredMrInTheBatch)
{
	PeerMr gone = peer_mr(4096, kAllAccess, kPeerFill);
	peer().call(Msg("dereg").set("mr", gone.id));
	for (int i = 0; i < 4; ++i)
		ASSERT_EQ(write8(i, 0, 64 * i, false), 0);
	for (int i = 4; i < 8; ++i) {
		SendWr w(i, IBV_WR_RDMA_WRITE, src_->addr(), 8, src_->lkey(), i == 7 ? IBV_SEND_SIGNALED : 0);
		ASSERT_EQ(w.rdma(gone.addr + 64 * i, gone.rkey).post(pair_.qp), 0);
	}
	auto wcs = poll_completions(cq_, 4, 5s);
	ASSERT_EQ(wcs.size(), 4u) << describe(wcs);
	EXPECT_EQ(wcs[0].wr_id, 4u);
	EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR) << status_str(wcs[0].status);
	for (size_t i = 1; i < wcs.size(); ++i)
		EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR) << status_str(wcs[i].status);
	for (int i = 0; i < 4; ++i)
		EXPECT_EQ(peer64(64 * i), kFill64) << "write " << i << " before the dead rkey";
	EXPECT_EQ(peer_bad_bytes(gone, kPeerFill), 0u) << "the deregistered MR's memory";
}

// Deferred writes move without another verbs call of ours: the device's
// progress runs them by a deadline, as an HCA would move them unprompted.
TEST_F(Batch, DeferredWritesMoveWithoutAnotherCall)
{
	for (int i = 0; i < 4; ++i)
		ASSERT_EQ(write8(i, 0, 64 * i, false), 0);
	EXPECT_EQ(words_not_written_within(4, 2s), 0u) << "deferred writes did not land within 2 s";
	ASSERT_EQ(write8(4, 0, 64 * 4, true), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq_, &wc));
	EXPECT_EQ(wc.wr_id, 4u);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
}

// The same after the QP streamed (posts ended its runs, so the progress
// thread gives its next run the longer deadline): the run still moves.
TEST_F(Batch, DeferredWritesMoveWithoutAnotherCallAfterStreaming)
{
	for (int round = 0; round < 20; ++round) {
		for (int i = 0; i < 30; ++i)
			ASSERT_EQ(write8(100 + i, 0, 2048 + 64 * (i % 8), i == 29), 0);
		ibv_wc wc{};
		ASSERT_TRUE(one_completion(cq_, &wc)) << "round " << round;
		ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	}
	for (int i = 0; i < 4; ++i)
		ASSERT_EQ(write8(i, 0, 64 * i, false), 0);
	EXPECT_EQ(words_not_written_within(4, 2s), 0u) << "deferred writes did not land within 2 s";
}

// Destroying a QP with deferred writes: they move first.
TEST_F(Batch, DeferredWritesMoveBeforeDestroy)
{
	ibv_cq *cq = me().cq(64);
	ibv_qp_init_attr attr{};
	attr.send_cq = attr.recv_cq = cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = 128;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	ibv_qp *qp = ibv_create_qp(me().pd, &attr);  // ours to destroy, not the fixture's
	ASSERT_NE(qp, nullptr);
	Msg r = peer().call(Msg("qp").set("type", "rc").set("cq", pcq_));
	rc_connect(qp, static_cast<uint32_t>(r.u64("qpn")), peer().gid, {});
	peer().call(Msg("connect").set("qp", r.u64("id")).set("remote_qpn", qp->qp_num).set("gid", gid_hex(me().gid)));
	for (int i = 0; i < 4; ++i) {
		SendWr w(i, IBV_WR_RDMA_WRITE, src_->addr(), 8, src_->lkey(), 0);
		ASSERT_EQ(w.rdma(target_.addr + 4096 + 64 * i, target_.rkey).post(qp), 0);
	}
	ASSERT_EQ(ibv_destroy_qp(qp), 0);
	for (int i = 0; i < 4; ++i)
		EXPECT_EQ(peer64(4096 + 64 * i), kFill64) << "write " << i;
}

// Deferred WQEs hold send queue slots only until they run: a work request
// list (ibv_wr_*) that fits max_send_wr with nothing outstanding is taken
// whole, deferred writes or not.
TEST_F(Batch, WorkRequestListFitsBesideDeferredWrites)
{
	ibv_qp_init_attr_ex attr{};
	attr.send_cq = attr.recv_cq = cq_;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = 64;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.pd = me().pd;
	attr.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
	ibv_qp *qp = ibv_create_qp_ex(me().ctx, &attr);  // ours to destroy, not the fixture's
	ASSERT_NE(qp, nullptr);
	Msg r = peer().call(Msg("qp").set("type", "rc").set("cq", pcq_));
	rc_connect(qp, static_cast<uint32_t>(r.u64("qpn")), peer().gid, {});
	peer().call(Msg("connect").set("qp", r.u64("id")).set("remote_qpn", qp->qp_num).set("gid", gid_hex(me().gid)));
	for (int i = 0; i < 40; ++i) {
		SendWr w(i, IBV_WR_RDMA_WRITE, src_->addr(), 8, src_->lkey(), 0);
		ASSERT_EQ(w.rdma(target_.addr + 64 * i, target_.rkey).post(qp), 0);
	}
	ibv_qp_ex *qpx = ibv_qp_to_qp_ex(qp);
	ibv_wr_start(qpx);
	for (int i = 0; i < 60; ++i) {
		qpx->wr_id = 100 + i;
		qpx->wr_flags = i == 59 ? IBV_SEND_SIGNALED : 0;
		ibv_wr_rdma_write(qpx, target_.rkey, target_.addr + 4096 + 64 * i);
		ibv_wr_set_sge(qpx, src_->lkey(), src_->addr(), 8);
	}
	EXPECT_EQ(ibv_wr_complete(qpx), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq_, &wc));
	EXPECT_EQ(wc.wr_id, 159u);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	for (int i = 0; i < 40; ++i)
		EXPECT_EQ(peer64(64 * i), kFill64) << "posted write " << i;
	for (int i = 0; i < 60; ++i)
		EXPECT_EQ(peer64(4096 + 64 * i), kFill64) << "listed write " << i;
	EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

// Unsignaled atomics batch too: on words 64 bytes apart, with a
// compare-and-swap among them that must see the adds before it.
TEST_F(Batch, AtomicsInOrderAcrossWords)
{
	Buffer *res = me().buffer(64 * 8, IBV_ACCESS_LOCAL_WRITE, 0xFF);
	PeerMr counters = peer_mr(4096, kAllAccess, 0);
	constexpr int kOps = 40;
	for (int i = 0; i < kOps; ++i) {
		SendWr w(i, i == 20 ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD,
			 res->addr() + 8 * i, 8, res->lkey(), i == kOps - 1 ? IBV_SEND_SIGNALED : 0);
		// Op 20 finds word 0 at 5 (ops 0, 4, .., 16 added 1 each): 5 -> 100.
		if (i == 20)
			w.atomic(counters.addr, counters.rkey, 5, 100);
		else
			w.atomic(counters.addr + 64 * (i % 4), counters.rkey, 1);
		ASSERT_EQ(w.post(pair_.qp), 0);
	}
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq_, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	uint64_t seen[4] = {0, 0, 0, 0};
	for (int i = 0; i < kOps; ++i) {
		uint64_t orig;
		memcpy(&orig, res->mr_start() + 8 * i, 8);
		if (i == 20) {
			EXPECT_EQ(orig, 5u) << "the compare-and-swap's original";
			seen[0] = 100;
			continue;
		}
		EXPECT_EQ(orig, seen[i % 4]) << "op " << i;
		seen[i % 4]++;
	}
	EXPECT_EQ(peer().call(Msg("read64").set("mr", counters.id).set("off", 0)).u64("value"), seen[0]);
	for (int w = 1; w < 4; ++w)
		EXPECT_EQ(peer().call(Msg("read64").set("mr", counters.id).set("off", 64 * w)).u64("value"), seen[w]);
	EXPECT_EQ(peer_bad_bytes(counters, 0, 8, 56), 0u) << "bytes between the words";
}

}  // namespace
}  // namespace xsrc_traffic
