// traffic_errors: remote access errors, local protection and length errors (the fixture: traffic_fixture.h).
#include "traffic_fixture.h"

namespace xsrc_traffic {
namespace {

// ===============================================================================
// 1. Remote access errors
// ===============================================================================

class AccessErrors : public Traffic {
protected:
	void SetUp() override
	{
		Traffic::SetUp();
		pcq_ = peer_cq();
		// The MR covers the middle page of three; the pages around it are
		// guards that must not change either.
		target_ = peer_mr(3 * 4096, kAllAccess, kPeerFill, 4096, 4096);
		cq_ = me().cq(64);
		src_ = me().buffer(8192, IBV_ACCESS_LOCAL_WRITE, kSrcFill);  // > the target MR
		dst_ = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kLocalFill);
	}

	// Posts `w` on a fresh pair; expects `status` for it, the QP in ERR,
	// later WRs flushed, and the peer's `mr` untouched.
	void expect_remote_error(SendWr w, const PeerMr &mr, ibv_wc_status status,
				 const PairOpts &o = {})
	{
		Pair p = rc_pair(cq_, cq_, pcq_, o);
		ASSERT_EQ(w.post(p.qp), 0);
		ibv_wc wc{};
		ASSERT_TRUE(one_completion(cq_, &wc));
		EXPECT_EQ(wc.wr_id, w.wr.wr_id);
		EXPECT_EQ(wc.status, status) << "got " << status_str(wc.status) << ", want " << status_str(status);
		EXPECT_EQ(wc.qp_num, p.qp->qp_num);
		expect_error_state_flushes(p.qp, cq_, src_, mr.addr, mr.rkey);
		std::string where;
		EXPECT_EQ(peer_bad_bytes(mr, kPeerFill, 0, 0, &where), 0u) << "target memory changed: " << where;
		EXPECT_EQ(dst_->mismatches(0, dst_->size, kLocalFill), 0u) << "our read/atomic buffer changed";
	}

	uint64_t pcq_ = 0;
	PeerMr target_;
	ibv_cq *cq_ = nullptr;
	Buffer *src_ = nullptr;
	Buffer *dst_ = nullptr;
};

// The set-up is sound: with the right keys WRITE, READ and atomics work.
TEST_F(AccessErrors, GoodAccessWorks)
{
	Pair p = rc_pair(cq_, cq_, pcq_);
	SendWr w(1, IBV_WR_RDMA_WRITE, src_->addr(), 64, src_->lkey());
	ASSERT_EQ(w.rdma(target_.addr + 128, target_.rkey).post(p.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq_, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	EXPECT_EQ(peer_bad_bytes(target_, kSrcFill, 4096 + 128, 64), 0u) << "written bytes";
	EXPECT_EQ(peer_bad_bytes(target_, kPeerFill, 0, 4096 + 128), 0u) << "bytes before";
	EXPECT_EQ(peer_bad_bytes(target_, kPeerFill, 4096 + 192), 0u) << "bytes after";

	SendWr r(2, IBV_WR_RDMA_READ, dst_->addr(), 32, dst_->lkey());
	ASSERT_EQ(r.rdma(target_.addr, target_.rkey).post(p.qp), 0);
	ASSERT_TRUE(one_completion(cq_, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	EXPECT_EQ(dst_->mismatches(0, 32, kPeerFill), 0u);

	SendWr a(3, IBV_WR_ATOMIC_FETCH_AND_ADD, dst_->addr() + 64, 8, dst_->lkey());
	ASSERT_EQ(a.atomic(target_.addr + 256, target_.rkey, 1).post(p.qp), 0);
	ASSERT_TRUE(one_completion(cq_, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	uint64_t orig;
	memcpy(&orig, dst_->data + 64, 8);
	EXPECT_EQ(orig, 0xA5A5A5A5A5A5A5A5ull);
	Msg v = peer().call(Msg("read64").set("mr", target_.id).set("off", 4096 + 256));
	EXPECT_EQ(v.u64("value"), 0xA5A5A5A5A5A5A5A6ull);
	EXPECT_EQ(qp_state(p.qp), IBV_QPS_RTS);
}

TEST_F(AccessErrors, WriteBadRkey)
{
	for (uint32_t flip : {0x01u, 0x80u, 0x100u}) {  // other salt, other salt, other MR index
		SCOPED_TRACE("rkey ^ " + std::to_string(flip));
		SendWr w(flip, IBV_WR_RDMA_WRITE, src_->addr(), 64, src_->lkey());
		w.rdma(target_.addr, target_.rkey ^ flip);
		expect_remote_error(w, target_, IBV_WC_REM_ACCESS_ERR);
	}
}

// A zero-length RDMA WRITE or READ touches no memory, so no R_Key or address
// is checked (IBTA C9-88); UCX's rc_verbs flushes with such a write, rkey 0.
TEST_F(AccessErrors, ZeroLengthRdmaChecksNoKey)
{
	Pair p = rc_pair(cq_, cq_, pcq_);
	for (ibv_wr_opcode op : {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ}) {
		SCOPED_TRACE(op == IBV_WR_RDMA_WRITE ? "write" : "read");
		SendWr w(7, op, dst_->addr(), 0, dst_->lkey());
		ASSERT_EQ(w.rdma(0, 0).post(p.qp), 0);
		ibv_wc wc{};
		ASSERT_TRUE(one_completion(cq_, &wc));
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
		EXPECT_EQ(qp_state(p.qp), IBV_QPS_RTS);
	}
	EXPECT_EQ(peer_bad_bytes(target_, kPeerFill, 0), 0u) << "the target is untouched";
	// A non-zero length with the same key is still refused.
	SendWr w(8, IBV_WR_RDMA_WRITE, src_->addr(), 1, src_->lkey());
	w.rdma(0, 0);
	expect_remote_error(w, target_, IBV_WC_REM_ACCESS_ERR);
}

// An rkey that is valid on the device but names an MR of another process
// (the requester's own) or of another PD of the responder.
TEST_F(AccessErrors, WriteRkeyOfAnotherOwnerOrPd)
{
	Buffer *mine = me().buffer(4096, kAllAccess, kLocalFill);
	{
		SCOPED_TRACE("rkey of the requester's own MR");
		SendWr w(1, IBV_WR_RDMA_WRITE, src_->addr(), 64, src_->lkey());
		w.rdma(mine->addr(), mine->rkey());
		expect_remote_error(w, target_, IBV_WC_REM_ACCESS_ERR);
		EXPECT_EQ(mine->mismatches(0, mine->size, kLocalFill), 0u) << "the requester's own MR was written";
	}
	{
		SCOPED_TRACE("rkey of an MR in another PD of the responder");
		uint64_t pd2 = peer().call(Msg("pd")).u64("id");
		PeerMr other = peer_mr(4096, kAllAccess, kPeerFill, 0, 0, pd2);
		SendWr w(2, IBV_WR_RDMA_WRITE, src_->addr(), 64, src_->lkey());
		w.rdma(other.addr, other.rkey);
		expect_remote_error(w, other, IBV_WC_REM_ACCESS_ERR);
	}
}

TEST_F(AccessErrors, WriteOutOfRange)
{
	struct Case {
		const char *what;
		int64_t offset;  // from the MR's start
		uint32_t len;
	};
	const Case cases[] = {
		{"one byte past the end", 4096, 1},
		{"last 16 bytes shifted by one", 4096 - 15, 16},
		{"one byte before the start", -1, 16},
		{"longer than the MR", 0, 4097},
	};
	for (const Case &c : cases) {
		SCOPED_TRACE(c.what);
		SendWr w(7, IBV_WR_RDMA_WRITE, src_->addr(), c.len, src_->lkey());
		w.rdma(target_.addr + static_cast<uint64_t>(c.offset), target_.rkey);
		expect_remote_error(w, target_, IBV_WC_REM_ACCESS_ERR);
	}
}

TEST_F(AccessErrors, WriteWithoutRemoteWrite)
{
	PeerMr ro = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	SendWr w(1, IBV_WR_RDMA_WRITE, src_->addr(), 64, src_->lkey());
	w.rdma(ro.addr, ro.rkey);
	expect_remote_error(w, ro, IBV_WC_REM_ACCESS_ERR);
	// WRITE WITH IMM too: the rkey is checked before a receive is needed.
	SendWr wi(2, IBV_WR_RDMA_WRITE_WITH_IMM, src_->addr(), 64, src_->lkey());
	wi.wr.imm_data = htobe32(0x1234);
	wi.rdma(ro.addr, ro.rkey);
	expect_remote_error(wi, ro, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(AccessErrors, ReadWithoutRemoteRead)
{
	PeerMr wo = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	SendWr r(1, IBV_WR_RDMA_READ, dst_->addr(), 64, dst_->lkey());
	r.rdma(wo.addr, wo.rkey);
	expect_remote_error(r, wo, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(AccessErrors, AtomicWithoutRemoteAtomic)
{
	PeerMr na = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	{
		SCOPED_TRACE("FETCH_AND_ADD");
		SendWr a(1, IBV_WR_ATOMIC_FETCH_AND_ADD, dst_->addr(), 8, dst_->lkey());
		a.atomic(na.addr + 64, na.rkey, 1);
		expect_remote_error(a, na, IBV_WC_REM_ACCESS_ERR);
	}
	{
		SCOPED_TRACE("CMP_AND_SWP (compare matches)");
		SendWr a(2, IBV_WR_ATOMIC_CMP_AND_SWP, dst_->addr(), 8, dst_->lkey());
		a.atomic(na.addr + 64, na.rkey, 0xA5A5A5A5A5A5A5A5ull, 42);
		expect_remote_error(a, na, IBV_WC_REM_ACCESS_ERR);
	}
}

// The responder's QP access flags are checked as well as the MR's.
TEST_F(AccessErrors, QpAccessFlagsAreChecked)
{
	PairOpts o;
	{
		SCOPED_TRACE("QP without REMOTE_WRITE: RDMA WRITE");
		o.theirs.access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
		SendWr w(1, IBV_WR_RDMA_WRITE, src_->addr(), 64, src_->lkey());
		w.rdma(target_.addr, target_.rkey);
		expect_remote_error(w, target_, IBV_WC_REM_ACCESS_ERR, o);
	}
	{
		SCOPED_TRACE("QP without REMOTE_READ: RDMA READ");
		o.theirs.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
		SendWr r(2, IBV_WR_RDMA_READ, dst_->addr(), 64, dst_->lkey());
		r.rdma(target_.addr, target_.rkey);
		expect_remote_error(r, target_, IBV_WC_REM_ACCESS_ERR, o);
	}
	{
		SCOPED_TRACE("QP without REMOTE_ATOMIC: FETCH_AND_ADD");
		o.theirs.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
		SendWr a(3, IBV_WR_ATOMIC_FETCH_AND_ADD, dst_->addr(), 8, dst_->lkey());
		a.atomic(target_.addr, target_.rkey, 1);
		expect_remote_error(a, target_, IBV_WC_REM_ACCESS_ERR, o);
	}
}

// The responder of an RC remote access violation (an IBTA class C error)
// moves its QP to ERR as well, and its posted receives are flushed; that is
// what kernel rxe does (rxe_resp.c: RESPST_ERR_RKEY_VIOLATION ->
// do_class_ac_error -> goto_error -> rxe_qp_error) and what HCAs do.
TEST_F(AccessErrors, ResponderQpGoesToError)
{
	PeerMr rbuf = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	Pair p = rc_pair(cq_, cq_, pcq_);
	peer_post_recv(p.peer.id, rbuf, 0, 64, 40);
	SendWr w(1, IBV_WR_RDMA_WRITE, src_->addr(), 64, src_->lkey());
	ASSERT_EQ(w.rdma(target_.addr, target_.rkey ^ 0x01).post(p.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq_, &wc));
	EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << status_str(wc.status);
	EXPECT_EQ(peer_qp_state(p.peer), IBV_QPS_ERR) << "responder QP after an R_Key violation";
	auto flushed = peer_poll(pcq_, 1, 1s);
	ASSERT_EQ(flushed.size(), 1u) << "the responder's receive was not flushed";
	EXPECT_EQ(flushed[0].wr_id, 40u);
	EXPECT_EQ(flushed[0].status, IBV_WC_WR_FLUSH_ERR) << status_str(flushed[0].status);
}

// ===============================================================================
// 2./3. Local protection and length errors
// ===============================================================================

using LocalErrors = Traffic;

// A SEND whose lkey is bad completes LOC_PROT_ERR and delivers nothing: the
// receive (on an SRQ) stays posted and a later good SEND on a fresh pair
// consumes it.
TEST_F(LocalErrors, SendBadLkeyDeliversNothing)
{
	uint64_t pcq = peer_cq();
	uint64_t srq = peer().call(Msg("srq").set("max_wr", 16)).u64("id");
	PeerMr rbuf = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	peer_post_srq_recv(srq, rbuf, 0, 256, 500);
	PeerMr theirs = peer_mr(4096, kAllAccess, 0x55);

	ibv_cq *cq = me().cq(64);
	Buffer *src = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	ibv_pd *pd2 = me().new_pd();
	Buffer *other_pd = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill, pd2);
	PairOpts o;
	o.peer_srq = static_cast<int64_t>(srq);

	struct Case {
		const char *what;
		uint64_t addr;
		uint32_t lkey;
	};
	const Case cases[] = {
		{"lkey with another salt", src->addr(), src->lkey() ^ 0x01},
		{"lkey of another MR index", src->addr(), src->lkey() ^ 0x100},
		{"lkey of the peer's MR (another process)", theirs.addr, theirs.lkey},
		{"lkey of an MR in another PD", other_pd->addr(), other_pd->lkey()},
		{"address past the MR", src->addr() + 4096 - 32, src->lkey()},
	};
	for (const Case &c : cases) {
		SCOPED_TRACE(c.what);
		Pair p = rc_pair(cq, cq, pcq, o);
		SendWr s(11, IBV_WR_SEND, c.addr, 64, c.lkey);
		ASSERT_EQ(s.post(p.qp), 0);
		ibv_wc wc{};
		ASSERT_TRUE(one_completion(cq, &wc));
		EXPECT_EQ(wc.wr_id, 11u);
		EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << status_str(wc.status);
		expect_error_state_flushes(p.qp, cq, src, theirs.addr, theirs.rkey);
	}
	auto delivered = peer_poll(pcq, 8, 200ms);
	EXPECT_TRUE(delivered.empty()) << "receiver completions:" << describe(delivered);
	std::string where;
	EXPECT_EQ(peer_bad_bytes(rbuf, 0x77, 0, 0, &where), 0u) << "receive buffer changed: " << where;
	EXPECT_EQ(peer_bad_bytes(theirs, 0x55), 0u);

	// The receive is still there for a good SEND.
	Pair p = rc_pair(cq, cq, pcq, o);
	SendWr s(12, IBV_WR_SEND, src->addr(), 64, src->lkey());
	ASSERT_EQ(s.post(p.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	auto got = peer_poll(pcq, 1, 5s);
	ASSERT_EQ(got.size(), 1u) << "the good SEND found no receive";
	EXPECT_EQ(got[0].wr_id, 500u);
	EXPECT_EQ(got[0].status, IBV_WC_SUCCESS) << status_str(got[0].status);
	EXPECT_EQ(got[0].byte_len, 64u);
	EXPECT_EQ(peer_bad_bytes(rbuf, kSrcFill, 0, 64), 0u);
	EXPECT_EQ(peer_bad_bytes(rbuf, 0x77, 64), 0u);
}

// RDMA READ into a local MR without LOCAL_WRITE: LOC_PROT_ERR, and our
// buffer is untouched.
TEST_F(LocalErrors, ReadIntoMrWithoutLocalWrite)
{
	uint64_t pcq = peer_cq();
	PeerMr theirs = peer_mr(4096, kAllAccess);
	ibv_cq *cq = me().cq(64);
	Buffer *ro = me().buffer(4096, 0, kLocalFill);
	Buffer *src = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	Pair p = rc_pair(cq, cq, pcq);
	SendWr r(1, IBV_WR_RDMA_READ, ro->addr(), 64, ro->lkey());
	ASSERT_EQ(r.rdma(theirs.addr, theirs.rkey).post(p.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc));
	EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << status_str(wc.status);
	EXPECT_EQ(ro->mismatches(0, ro->size, kLocalFill), 0u) << "read landed in a read-only MR";
	expect_error_state_flushes(p.qp, cq, src, theirs.addr, theirs.rkey);
}

// An atomic (and a READ) whose local buffer is not ours to write fails
// LOC_PROT_ERR before it reaches the responder: the remote value is unchanged.
TEST_F(LocalErrors, AtomicWithBadLocalKeyLeavesRemoteUnchanged)
{
	uint64_t pcq = peer_cq();
	PeerMr theirs = peer_mr(4096, kAllAccess);
	ibv_cq *cq = me().cq(64);
	Buffer *dst = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kLocalFill);
	Buffer *src = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	struct Case {
		const char *what;
		ibv_wr_opcode op;
		uint32_t lkey;
	};
	const Case cases[] = {
		{"FETCH_AND_ADD, bad lkey", IBV_WR_ATOMIC_FETCH_AND_ADD, dst->lkey() ^ 0x01},
		{"CMP_AND_SWP, bad lkey", IBV_WR_ATOMIC_CMP_AND_SWP, dst->lkey() ^ 0x01},
		{"FETCH_AND_ADD, the peer's lkey", IBV_WR_ATOMIC_FETCH_AND_ADD, theirs.lkey},
		{"RDMA READ, bad lkey", IBV_WR_RDMA_READ, dst->lkey() ^ 0x01},
	};
	for (const Case &c : cases) {
		SCOPED_TRACE(c.what);
		Pair p = rc_pair(cq, cq, pcq);
		SendWr w(1, c.op, dst->addr(), 8, c.lkey);
		if (c.op == IBV_WR_RDMA_READ)
			w.rdma(theirs.addr + 64, theirs.rkey);
		else
			w.atomic(theirs.addr + 64, theirs.rkey, 0xA5A5A5A5A5A5A5A5ull, 7);
		ASSERT_EQ(w.post(p.qp), 0);
		ibv_wc wc{};
		ASSERT_TRUE(one_completion(cq, &wc));
		EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << status_str(wc.status);
		EXPECT_EQ(peer_bad_bytes(theirs), 0u) << "the remote value changed";
		EXPECT_EQ(dst->mismatches(0, dst->size, kLocalFill), 0u);
		expect_error_state_flushes(p.qp, cq, src, theirs.addr, theirs.rkey);
	}
}

// A SEND longer than the receive: receiver LOC_LEN_ERR, sender
// REM_INV_REQ_ERR, nothing written past the receive buffer; the responder QP
// goes to ERR and its other receive is flushed.
TEST_F(LocalErrors, SendLongerThanReceive)
{
	uint64_t pcq = peer_cq();
	PeerMr rbuf = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	ibv_cq *cq = me().cq(64);
	Buffer *src = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	Pair p = rc_pair(cq, cq, pcq);
	peer_post_recv(p.peer.id, rbuf, 0, 64, 600);
	peer_post_recv(p.peer.id, rbuf, 1024, 64, 601);

	SendWr s(21, IBV_WR_SEND, src->addr(), 128, src->lkey());
	ASSERT_EQ(s.post(p.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc));
	EXPECT_EQ(wc.wr_id, 21u);
	EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << status_str(wc.status);

	auto got = peer_poll(pcq, 2, 5s);
	ASSERT_GE(got.size(), 1u) << "no receive completion";
	EXPECT_EQ(got[0].wr_id, 600u);
	EXPECT_EQ(got[0].status, IBV_WC_LOC_LEN_ERR) << status_str(got[0].status);
	ASSERT_EQ(got.size(), 2u) << "the responder's second receive was not flushed:" << describe(got);
	EXPECT_EQ(got[1].wr_id, 601u);
	EXPECT_EQ(got[1].status, IBV_WC_WR_FLUSH_ERR) << status_str(got[1].status);

	std::string where;
	EXPECT_EQ(peer_bad_bytes(rbuf, 0x77, 64, 0, &where), 0u) << "written past the receive buffer: " << where;
	EXPECT_EQ(peer_qp_state(p.peer), IBV_QPS_ERR) << "responder QP after a local length error";
	expect_error_state_flushes(p.qp, cq, src, rbuf.addr, rbuf.rkey);
}

}  // namespace
}  // namespace xsrc_traffic
