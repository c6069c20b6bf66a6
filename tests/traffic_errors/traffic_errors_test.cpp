// traffic_errors: the error paths of the data path, between two processes.
//
// The test process is the requester (mostly); a peer process (this binary
// re-exec'd with --peer, see peer.h) owns the responder's QPs, CQs, SRQs and
// MRs and does what the test asks over a socketpair. Each test starts its
// peer before it opens a context of its own. RC QPs are connected like
// `ibv_rc_pingpong -g 1`: GRH, sgid index 1, the peer's GID from
// ibv_query_gid, path MTU 1024, timeout 14, retry_cnt 7.
//
// Every case asserts the completion status and, where the spec says nothing
// may move, that the target memory still holds its fill pattern. Every wait
// is bounded; a per-test alarm ends a hung test with a message instead of
// hanging CI.
#include <gtest/gtest.h>
#include <endian.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "peer.h"
#include "traffic_util.h"

using namespace xsrc_traffic;

namespace {

constexpr uint8_t kPeerFill = 0xA5;   // the responder's memory
constexpr uint8_t kSrcFill = 0x3C;    // what the requester writes
constexpr uint8_t kLocalFill = 0x11;  // the requester's read/atomic targets
constexpr unsigned kTestTimeoutSec = 90;

// --- fixture -------------------------------------------------------------------

struct PeerMr {
	uint64_t id = 0;
	uint64_t addr = 0;  // where the MR starts
	uint32_t rkey = 0;
	uint32_t lkey = 0;
	uint64_t len = 0;
};

struct PeerQp {
	uint64_t id = 0;
	uint32_t qpn = 0;
};

struct Pair {
	ibv_qp *qp = nullptr;  // ours
	PeerQp peer;
};

struct PairOpts {
	RcParams mine;                       // our rnr_retry, retry_cnt, timeout
	RcParams theirs;                     // their qp_access_flags, min_rnr_timer
	int64_t peer_srq = -1;
	uint32_t peer_max_recv_wr = 16;
	QpCaps caps;                         // ours
};

class Traffic : public ::testing::Test {
protected:
	void SetUp() override
	{
		peer_ = std::make_unique<Peer>();  // before anything verbs-related of ours
		me_ = std::make_unique<Verbs>();
	}

	void TearDown() override
	{
		if (peer_ && peer_->alive()) {
			bool ok = false;
			EXPECT_EQ(peer_->finish(&ok), "") << "peer cleanup";
			EXPECT_TRUE(ok) << "peer did not exit cleanly";
		}
		if (me_) {
			EXPECT_EQ(me_->close(), "") << "our cleanup";
		}
	}

	Peer &peer() { return *peer_; }
	Verbs &me() { return *me_; }

	// -- the peer's objects --
	uint64_t peer_cq(int cqe = 64, bool channel = false, int *actual = nullptr)
	{
		Msg r = peer().call(Msg("cq").set("cqe", cqe).set("channel", channel));
		if (actual)
			*actual = static_cast<int>(r.i64("cqe"));
		return r.u64("id");
	}
	PeerMr peer_mr(size_t size, uint32_t access, uint8_t fill = kPeerFill, size_t off = 0, size_t len = 0,
		       uint64_t pd = 0)
	{
		Msg r = peer().call(Msg("mr").set("size", size).set("access", access).set("fill", fill)
					    .set("off", off).set("len", len).set("pd", pd));
		return {r.u64("id"), r.u64("addr"), static_cast<uint32_t>(r.u64("rkey")),
			static_cast<uint32_t>(r.u64("lkey")), r.u64("len")};
	}
	// Bytes of the peer buffer (the whole mapping, MR or not) that lost `fill`.
	size_t peer_bad_bytes(const PeerMr &mr, uint8_t fill = kPeerFill, size_t off = 0, size_t len = 0,
			      std::string *where = nullptr)
	{
		Msg m("check");
		m.set("mr", mr.id).set("fill", fill).set("off", off);
		if (len)
			m.set("len", len);
		Msg r = peer().call(m);
		if (where && r.u64("bad"))
			*where = "first at +" + r.str("first") + " = " + r.str("value");
		return r.u64("bad");
	}
	std::vector<ibv_wc> peer_poll(uint64_t cq, size_t n, ms timeout)
	{
		Msg r = peer().call(Msg("poll").set("cq", cq).set("n", n).set("timeout_ms", timeout.count()),
				    timeout + 10s);
		std::vector<ibv_wc> out(r.u64("n"));
		for (size_t i = 0; i < out.size(); ++i) {
			std::string s = std::to_string(i);
			out[i].wr_id = r.u64("wr_id" + s);
			out[i].status = static_cast<ibv_wc_status>(r.u64("status" + s));
			out[i].opcode = static_cast<ibv_wc_opcode>(r.u64("opcode" + s));
			out[i].byte_len = static_cast<uint32_t>(r.u64("len" + s));
			out[i].wc_flags = static_cast<unsigned>(r.u64("flags" + s));
			out[i].qp_num = static_cast<uint32_t>(r.u64("qp_num" + s));
			out[i].src_qp = static_cast<uint32_t>(r.u64("src_qp" + s));
		}
		return out;
	}
	void peer_post_recv(uint64_t qp, const PeerMr &mr, size_t off, size_t len, uint64_t wr_id,
			    size_t count = 1, size_t stride = 0)
	{
		peer().call(Msg("post_recv").set("qp", qp).set("mr", mr.id).set("off", off).set("len", len)
				    .set("wr_id", wr_id).set("count", count).set("stride", stride ? stride : len));
	}
	void peer_post_srq_recv(uint64_t srq, const PeerMr &mr, size_t off, size_t len, uint64_t wr_id,
				size_t count = 1, size_t stride = 0)
	{
		peer().call(Msg("post_recv").set("srq", srq).set("mr", mr.id).set("off", off).set("len", len)
				    .set("wr_id", wr_id).set("count", count).set("stride", stride ? stride : len));
	}
	ibv_qp_state peer_qp_state(const PeerQp &qp)
	{
		return static_cast<ibv_qp_state>(peer().call(Msg("qp_state").set("qp", qp.id)).u64("state"));
	}

	// An RC QP pair: ours (on scq/rcq) and the peer's (on peer_cq), connected.
	Pair rc_pair(ibv_cq *scq, ibv_cq *rcq, uint64_t pcq, const PairOpts &o = {})
	{
		Pair p;
		p.qp = me().qp(IBV_QPT_RC, scq, rcq, o.caps);
		Msg req("qp");
		req.set("type", "rc").set("cq", pcq).set("max_recv_wr", o.peer_max_recv_wr);
		if (o.peer_srq >= 0)
			req.set("srq", o.peer_srq);
		Msg r = peer().call(req);
		p.peer = {r.u64("id"), static_cast<uint32_t>(r.u64("qpn"))};
		rc_connect(p.qp, p.peer.qpn, peer().gid, o.mine);
		peer().call(Msg("connect").set("qp", p.peer.id).set("remote_qpn", p.qp->qp_num)
				    .set("gid", gid_hex(me().gid)).set("access", o.theirs.access)
				    .set("min_rnr_timer", o.theirs.min_rnr_timer)
				    .set("rnr_retry", o.theirs.rnr_retry));
		return p;
	}

	// Our end of a SEND case: a CQ of 64 and a 4 KiB source buffer; with a completion
	// channel of its own for the cases that sleep in ibv_get_cq_event.
	struct Sender {
		ibv_cq *cq;
		Buffer *buf;
	};
	Sender sender() { return {me().cq(64), me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill)}; }
	struct EventSender {
		ibv_comp_channel *ch;
		ibv_cq *cq;
		Buffer *buf;
	};
	EventSender event_sender()
	{
		ibv_comp_channel *ch = me().channel();
		ibv_cq *cq = me().cq(64, ch);
		return {ch, cq, me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill)};
	}
	// The pair options of the RNR cases: our rnr_retry, the responder's min_rnr_timer.
	static PairOpts rnr_opts(uint8_t rnr_retry, uint8_t min_rnr_timer)
	{
		PairOpts o;
		o.mine.rnr_retry = rnr_retry;
		o.theirs.min_rnr_timer = min_rnr_timer;
		return o;
	}

	std::unique_ptr<Peer> peer_;
	std::unique_ptr<Verbs> me_;
};

// One completion within `timeout` (a failure if none).
::testing::AssertionResult one_completion(ibv_cq *cq, ibv_wc *out, ms timeout = 5s)
{
	auto wcs = poll_n(cq, 1, timeout);
	if (wcs.empty())
		return ::testing::AssertionFailure() << "no completion within " << timeout.count() << " ms";
	*out = wcs[0];
	return ::testing::AssertionSuccess();
}

// After a requester error: the QP is in ERR and what is posted next is
// flushed (a WRITE and a SEND, in order), and nothing else completes.
void expect_error_state_flushes(ibv_qp *qp, ibv_cq *cq, Buffer *src, uint64_t raddr, uint32_t rkey)
{
	EXPECT_EQ(qp_state(qp), IBV_QPS_ERR) << "requester QP after an error completion";
	SendWr w(9001, IBV_WR_RDMA_WRITE, src->addr(), 8, src->lkey());
	w.rdma(raddr, rkey);
	EXPECT_EQ(w.post(qp), 0) << "post_send on an ERR QP";
	SendWr s(9002, IBV_WR_SEND, src->addr(), 8, src->lkey());
	EXPECT_EQ(s.post(qp), 0) << "post_send on an ERR QP";
	auto wcs = poll_n(cq, 2, 5s);
	ASSERT_EQ(wcs.size(), 2u) << "flush completions:" << describe(wcs);
	EXPECT_EQ(wcs[0].wr_id, 9001u);
	EXPECT_EQ(wcs[0].status, IBV_WC_WR_FLUSH_ERR) << status_str(wcs[0].status);
	EXPECT_EQ(wcs[1].wr_id, 9002u);
	EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR) << status_str(wcs[1].status);
	auto extra = poll_quiet(cq, 50ms);
	EXPECT_TRUE(extra.empty()) << "unexpected completions:" << describe(extra);
}

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

// ===============================================================================
// 4. Flush
// ===============================================================================

using Flush = Traffic;

// Receives posted and SENDs queued (blocked behind an RNR wait: the peer has
// no receive, rnr_retry 7): modify to ERR and every one of them completes
// WR_FLUSH_ERR with its wr_id, unsignaled ones included; WRs posted on the
// ERR QP flush too.
TEST_F(Flush, ModifyToErrorFlushesEverything)
{
	uint64_t pcq = peer_cq();
	ibv_cq *scq = me().cq(64);
	ibv_cq *rcq = me().cq(64);
	Buffer *buf = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	PairOpts o;
	o.mine.rnr_retry = 7;
	Pair p = rc_pair(scq, rcq, pcq, o);

	for (uint64_t i = 1; i <= 4; ++i)
		ASSERT_EQ(post_recv(p.qp, i, buf->addr() + 2048 + i * 64, 64, buf->lkey()), 0);
	for (uint64_t i = 11; i <= 14; ++i) {
		SendWr s(i, IBV_WR_SEND, buf->addr(), 32, buf->lkey(), i == 13 ? 0 : IBV_SEND_SIGNALED);
		ASSERT_EQ(s.post(p.qp), 0);
	}
	auto early = poll_quiet(scq, 100ms);
	EXPECT_TRUE(early.empty()) << "sends completed while the peer had no receive:" << describe(early);
	EXPECT_EQ(qp_state(p.qp), IBV_QPS_RTS);

	to_error(p.qp);
	auto sends = poll_n(scq, 4, 5s);
	auto recvs = poll_n(rcq, 4, 5s);
	ASSERT_EQ(sends.size(), 4u) << "send flushes:" << describe(sends);
	ASSERT_EQ(recvs.size(), 4u) << "receive flushes:" << describe(recvs);
	for (size_t i = 0; i < 4; ++i) {
		EXPECT_EQ(sends[i].wr_id, 11 + i) << "send flush order";
		EXPECT_EQ(sends[i].status, IBV_WC_WR_FLUSH_ERR) << status_str(sends[i].status);
		EXPECT_EQ(sends[i].qp_num, p.qp->qp_num);
		EXPECT_EQ(recvs[i].wr_id, 1 + i) << "receive flush order";
		EXPECT_EQ(recvs[i].status, IBV_WC_WR_FLUSH_ERR) << status_str(recvs[i].status);
		EXPECT_EQ(recvs[i].qp_num, p.qp->qp_num);
	}
	EXPECT_EQ(qp_state(p.qp), IBV_QPS_ERR);

	// Posting on the ERR QP completes at once with WR_FLUSH_ERR.
	ASSERT_EQ(post_recv(p.qp, 21, buf->addr() + 2048, 64, buf->lkey()), 0);
	SendWr s(31, IBV_WR_SEND, buf->addr(), 32, buf->lkey());
	ASSERT_EQ(s.post(p.qp), 0);
	SendWr w(32, IBV_WR_RDMA_WRITE, buf->addr(), 32, buf->lkey(), 0);  // unsignaled
	ASSERT_EQ(w.rdma(0x1000, 0x1234).post(p.qp), 0);
	auto r2 = poll_n(rcq, 1, 2s);
	auto s2 = poll_n(scq, 2, 2s);
	ASSERT_EQ(r2.size(), 1u);
	EXPECT_EQ(r2[0].wr_id, 21u);
	EXPECT_EQ(r2[0].status, IBV_WC_WR_FLUSH_ERR) << status_str(r2[0].status);
	ASSERT_EQ(s2.size(), 2u) << describe(s2);
	EXPECT_EQ(s2[0].wr_id, 31u);
	EXPECT_EQ(s2[0].status, IBV_WC_WR_FLUSH_ERR) << status_str(s2[0].status);
	EXPECT_EQ(s2[1].wr_id, 32u);
	EXPECT_EQ(s2[1].status, IBV_WC_WR_FLUSH_ERR) << status_str(s2[1].status);

	// Nothing reached the peer, and the flush did not touch our buffers.
	auto delivered = peer_poll(pcq, 8, 100ms);
	EXPECT_TRUE(delivered.empty()) << describe(delivered);
	EXPECT_EQ(buf->mismatches(2048, 2048, kSrcFill), 0u) << "a flushed receive wrote its buffer";
	auto extra = poll_quiet(scq, 50ms);
	EXPECT_TRUE(extra.empty()) << describe(extra);
}

// The peer sees the flush of its own posted receives when it moves its QP
// to ERR, in the other process, with nothing in flight.
TEST_F(Flush, IdleQpToErrorFlushesReceivesOnly)
{
	uint64_t pcq = peer_cq();
	auto [cq, buf] = sender();
	Pair p = rc_pair(cq, cq, pcq);
	for (uint64_t i = 1; i <= 3; ++i)
		ASSERT_EQ(post_recv(p.qp, i, buf->addr() + i * 64, 64, buf->lkey()), 0);
	// One SEND that completes normally first (the peer has a receive).
	PeerMr rbuf = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	peer_post_recv(p.peer.id, rbuf, 0, 64, 70);
	SendWr s(5, IBV_WR_SEND, buf->addr(), 16, buf->lkey());
	ASSERT_EQ(s.post(p.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);

	to_error(p.qp);
	auto flushed = poll_n(cq, 3, 5s);
	ASSERT_EQ(flushed.size(), 3u) << describe(flushed);
	for (size_t i = 0; i < 3; ++i) {
		EXPECT_EQ(flushed[i].wr_id, i + 1);
		EXPECT_EQ(flushed[i].status, IBV_WC_WR_FLUSH_ERR) << status_str(flushed[i].status);
	}
	auto extra = poll_quiet(cq, 50ms);
	EXPECT_TRUE(extra.empty()) << "the completed SEND was flushed again?" << describe(extra);
}

// A QP with SENDs blocked forever (rnr_retry 7, no receive) can be
// destroyed, promptly, without completing them.
TEST_F(Flush, DestroyQpWithBlockedWork)
{
	uint64_t pcq = peer_cq();
	auto [cq, buf] = sender();
	PairOpts o = rnr_opts(7, 1);
	ibv_qp_init_attr attr{};
	attr.send_cq = cq;
	attr.recv_cq = cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = 16;
	attr.cap.max_recv_wr = 16;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	ibv_qp *qp = ibv_create_qp(me().pd, &attr);  // not in the cleanup list
	ASSERT_NE(qp, nullptr);
	Msg r = peer().call(Msg("qp").set("cq", pcq));
	rc_connect(qp, static_cast<uint32_t>(r.u64("qpn")), peer().gid, o.mine);
	peer().call(Msg("connect").set("qp", r.u64("id")).set("remote_qpn", qp->qp_num)
			    .set("gid", gid_hex(me().gid)).set("min_rnr_timer", 1));
	for (uint64_t i = 1; i <= 4; ++i) {
		SendWr s(i, IBV_WR_SEND, buf->addr(), 64, buf->lkey());
		ASSERT_EQ(s.post(qp), 0);
	}
	auto early = poll_quiet(cq, 50ms);
	EXPECT_TRUE(early.empty()) << describe(early);
	auto t0 = Clock::now();
	EXPECT_EQ(ibv_destroy_qp(qp), 0);
	EXPECT_LT(Clock::now() - t0, 2s) << "destroy_qp waited for blocked work";
	auto late = poll_quiet(cq, 100ms);
	EXPECT_TRUE(late.empty()) << "completions after destroy_qp:" << describe(late);
	EXPECT_TRUE(peer_poll(pcq, 4, 50ms).empty());
}

// ===============================================================================
// 5. RNR
// ===============================================================================

using Rnr = Traffic;

// No receive at the peer, rnr_retry 0..3: the SEND completes
// RNR_RETRY_EXC_ERR while we sleep in ibv_get_cq_event (armed CQ, no polling
// before the event): the device makes progress on its own.
TEST_F(Rnr, RetryExceededWakesSleepingRequester)
{
	uint64_t pcq = peer_cq();
	auto [ch, cq, buf] = event_sender();
	for (uint8_t rnr_retry : {0, 1, 2, 3}) {
		SCOPED_TRACE("rnr_retry " + std::to_string(rnr_retry));
		PairOpts o = rnr_opts(rnr_retry, 1);
		Pair p = rc_pair(cq, cq, pcq, o);
		ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
		SendWr s(100 + rnr_retry, IBV_WR_SEND, buf->addr(), 64, buf->lkey());
		ASSERT_EQ(s.post(p.qp), 0);
		ibv_cq *ev = wait_cq_event(ch, 5s);
		ASSERT_EQ(ev, cq) << "no completion event within 5 s while asleep in ibv_get_cq_event";
		ibv_wc wc{};
		ASSERT_TRUE(one_completion(cq, &wc, 1s));
		EXPECT_EQ(wc.wr_id, 100u + rnr_retry);
		EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR) << status_str(wc.status);
		EXPECT_EQ(qp_state(p.qp), IBV_QPS_ERR);
		auto extra = poll_quiet(cq, 20ms);
		EXPECT_TRUE(extra.empty()) << describe(extra);
	}
	auto delivered = peer_poll(pcq, 8, 50ms);
	EXPECT_TRUE(delivered.empty()) << describe(delivered);
}

// The RNR delay is the responder's min_rnr_timer and there are rnr_retry of
// them: 3 retries of 10.24 ms (code 20) take at least ~30 ms.
TEST_F(Rnr, RetriesWaitTheResponderTimer)
{
	uint64_t pcq = peer_cq();
	auto [ch, cq, buf] = event_sender();
	PairOpts o = rnr_opts(3, 20);  // 10.24 ms
	Pair p = rc_pair(cq, cq, pcq, o);
	ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
	auto t0 = Clock::now();
	SendWr s(1, IBV_WR_SEND, buf->addr(), 64, buf->lkey());
	ASSERT_EQ(s.post(p.qp), 0);
	ASSERT_EQ(wait_cq_event(ch, 5s), cq);
	auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc, 1s));
	EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR) << status_str(wc.status);
	EXPECT_GE(elapsed.count(), 3 * 10240 - 500) << "3 RNR waits of 10.24 ms";
	EXPECT_LT(elapsed.count(), 2000000);
}

// RDMA WRITE WITH IMM needs a receive too: without one it ends
// RNR_RETRY_EXC_ERR, and (one packet) not a byte of it was placed.
TEST_F(Rnr, WriteWithImmWithoutReceive)
{
	uint64_t pcq = peer_cq();
	PeerMr target = peer_mr(4096, kAllAccess);
	auto [cq, buf] = sender();
	PairOpts o;
	o.mine.rnr_retry = 2;
	Pair p = rc_pair(cq, cq, pcq, o);
	SendWr w(1, IBV_WR_RDMA_WRITE_WITH_IMM, buf->addr(), 64, buf->lkey());
	w.wr.imm_data = htobe32(0xabcd);
	ASSERT_EQ(w.rdma(target.addr, target.rkey).post(p.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc));
	EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR) << status_str(wc.status);
	std::string where;
	EXPECT_EQ(peer_bad_bytes(target, kPeerFill, 0, 0, &where), 0u) << where;
	EXPECT_TRUE(peer_poll(pcq, 1, 50ms).empty());
}

// rnr_retry 7 retries forever: a receive posted 50 ms later is used.
TEST_F(Rnr, InfiniteRetrySucceedsOnceAReceiveIsPosted)
{
	uint64_t pcq = peer_cq();
	PeerMr rbuf = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	auto [ch, cq, buf] = event_sender();
	PairOpts o = rnr_opts(7, 1);
	Pair p = rc_pair(cq, cq, pcq, o);
	ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
	SendWr s(1, IBV_WR_SEND, buf->addr(), 256, buf->lkey());
	ASSERT_EQ(s.post(p.qp), 0);
	std::this_thread::sleep_for(50ms);
	ibv_wc none[1];
	EXPECT_EQ(ibv_poll_cq(cq, 1, none), 0) << "the SEND completed without a receive";
	peer_post_recv(p.peer.id, rbuf, 0, 512, 77);
	ASSERT_EQ(wait_cq_event(ch, 5s), cq) << "no completion event after the receive was posted";
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc, 1s));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	EXPECT_EQ(qp_state(p.qp), IBV_QPS_RTS);
	auto got = peer_poll(pcq, 1, 5s);
	ASSERT_EQ(got.size(), 1u);
	EXPECT_EQ(got[0].wr_id, 77u);
	EXPECT_EQ(got[0].status, IBV_WC_SUCCESS) << status_str(got[0].status);
	EXPECT_EQ(got[0].byte_len, 256u);
	EXPECT_EQ(peer_bad_bytes(rbuf, kSrcFill, 0, 256), 0u);
	EXPECT_EQ(peer_bad_bytes(rbuf, 0x77, 256), 0u);
}

// ===============================================================================
// 6. Dead peer
// ===============================================================================

using DeadPeer = Traffic;

// timeout 14 (67 ms) x (retry_cnt 7 + 1) tries: ~0.5 s.
constexpr auto kRetryBound = 5s;

TEST_F(DeadPeer, SendAfterPeerKilledIsRetryExceeded)
{
	uint64_t pcq = peer_cq();
	PeerMr rbuf = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	auto [cq, buf] = sender();
	Pair p = rc_pair(cq, cq, pcq);
	peer_post_recv(p.peer.id, rbuf, 0, 256, 1);
	SendWr ok(1, IBV_WR_SEND, buf->addr(), 64, buf->lkey());
	ASSERT_EQ(ok.post(p.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc));
	ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);

	peer().kill();
	usleep(200 * 1000);  // let the device notice the death (see PeerDiedButItsContextIsStillOpen)
	auto t0 = Clock::now();
	SendWr s(2, IBV_WR_SEND, buf->addr(), 64, buf->lkey());
	ASSERT_EQ(s.post(p.qp), 0);
	ASSERT_TRUE(one_completion(cq, &wc, kRetryBound)) << "no completion for a SEND to a dead peer";
	auto elapsed = std::chrono::duration_cast<ms>(Clock::now() - t0);
	EXPECT_EQ(wc.wr_id, 2u);
	EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << status_str(wc.status);
	EXPECT_GE(elapsed.count(), 7 * 67 - 20) << "retry_cnt 7 x timeout 14 (67 ms) not honoured";
	EXPECT_EQ(qp_state(p.qp), IBV_QPS_ERR);
	expect_error_state_flushes(p.qp, cq, buf, 0x1000, 0x1234);
}

// The peer dies with receives still posted (its QP entry may outlive the
// process for a moment): still RETRY_EXC_ERR, never a responder error.
TEST_F(DeadPeer, SendToPeerKilledWithReceivesPosted)
{
	uint64_t pcq = peer_cq();
	PeerMr rbuf = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	auto [cq, buf] = sender();
	Pair p = rc_pair(cq, cq, pcq);
	peer_post_recv(p.peer.id, rbuf, 0, 256, 1, 8, 256);
	peer().kill();
	usleep(200 * 1000);  // let the device notice the death (see PeerDiedButItsContextIsStillOpen)
	SendWr s(2, IBV_WR_SEND, buf->addr(), 64, buf->lkey());
	ASSERT_EQ(s.post(p.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc, kRetryBound));
	EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << status_str(wc.status);
	EXPECT_EQ(qp_state(p.qp), IBV_QPS_ERR);
}

// The same, with the window made wide: a child of the peer holds the peer's
// command file, so the daemon has not (cannot have) released the dead
// peer's QP. Its memory is gone with it; the requester can get no answer
// from it: RETRY_EXC_ERR, not a responder error (REM_OP_ERR /
// REM_ACCESS_ERR would claim the responder examined and refused the request).
TEST_F(DeadPeer, PeerDiedButItsContextIsStillOpen)
{
	uint64_t pcq = peer_cq();
	PeerMr rbuf = peer_mr(4096, kAllAccess, 0x77);
	auto [cq, buf] = sender();
	Pair send_pair = rc_pair(cq, cq, pcq);
	Pair read_pair = rc_pair(cq, cq, pcq);
	peer_post_recv(send_pair.peer.id, rbuf, 0, 256, 1, 4, 256);
	pid_t holder = static_cast<pid_t>(peer().call(Msg("fork_holder").set("seconds", 30)).u64("pid"));
	struct Reap {
		pid_t pid;
		~Reap()
		{
			::kill(pid, SIGKILL);
			waitpid(pid, nullptr, 0);
		}
	} reap{holder};
	peer().kill();
	// The device learns of the death asynchronously (xsrcd watches the
	// owner's pidfd and moves its QPs to error), as an HCA learns of it only
	// by timeout: a send racing with that notice could still be taken.
	usleep(200 * 1000);

	SendWr s(2, IBV_WR_SEND, buf->addr(), 64, buf->lkey());
	ASSERT_EQ(s.post(send_pair.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc, kRetryBound));
	EXPECT_EQ(wc.wr_id, 2u);
	EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << "SEND to a dead peer: " << status_str(wc.status);

	SendWr r(3, IBV_WR_RDMA_READ, buf->addr() + 1024, 64, buf->lkey());
	ASSERT_EQ(r.rdma(rbuf.addr, rbuf.rkey).post(read_pair.qp), 0);
	ASSERT_TRUE(one_completion(cq, &wc, kRetryBound));
	EXPECT_EQ(wc.wr_id, 3u);
	EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << "READ from a dead peer: " << status_str(wc.status);
	EXPECT_EQ(buf->mismatches(1024, 64, kSrcFill), 0u);
}

TEST_F(DeadPeer, RdmaAfterPeerKilledIsRetryExceeded)
{
	uint64_t pcq = peer_cq();
	PeerMr target = peer_mr(4096, kAllAccess);
	ibv_cq *cq = me().cq(64);
	Buffer *dst = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kLocalFill);
	Pair p = rc_pair(cq, cq, pcq);
	peer().kill();
	usleep(200 * 1000);  // let the device notice the death (see PeerDiedButItsContextIsStillOpen)
	SendWr r(3, IBV_WR_RDMA_READ, dst->addr(), 64, dst->lkey());
	ASSERT_EQ(r.rdma(target.addr, target.rkey).post(p.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc, kRetryBound));
	EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << status_str(wc.status);
	EXPECT_EQ(dst->mismatches(0, dst->size, kLocalFill), 0u);
	EXPECT_EQ(qp_state(p.qp), IBV_QPS_ERR);
}

// SENDs blocked in RNR waits (rnr_retry 7, no receive) when the peer dies:
// they complete in error (the head RETRY_EXC_ERR, the rest flushed), within
// a bounded time, while we sleep in ibv_get_cq_event.
TEST_F(DeadPeer, RnrBlockedWorkFailsWhenPeerDies)
{
	uint64_t pcq = peer_cq();
	auto [ch, cq, buf] = event_sender();
	PairOpts o = rnr_opts(7, 1);
	Pair p = rc_pair(cq, cq, pcq, o);
	for (uint64_t i = 1; i <= 3; ++i) {
		SendWr s(i, IBV_WR_SEND, buf->addr(), 64, buf->lkey());
		ASSERT_EQ(s.post(p.qp), 0);
	}
	auto early = poll_quiet(cq, 100ms);
	ASSERT_TRUE(early.empty()) << describe(early);
	ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
	peer().kill();
	ASSERT_EQ(wait_cq_event(ch, kRetryBound), cq) << "blocked work did not complete after the peer died";
	auto wcs = poll_n(cq, 3, 2s);
	ASSERT_EQ(wcs.size(), 3u) << describe(wcs);
	EXPECT_EQ(wcs[0].wr_id, 1u);
	EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR) << status_str(wcs[0].status);
	for (size_t i = 1; i < 3; ++i) {
		EXPECT_EQ(wcs[i].wr_id, i + 1);
		EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR) << status_str(wcs[i].status);
	}
	EXPECT_EQ(qp_state(p.qp), IBV_QPS_ERR);
}

// ===============================================================================
// 7. UD
// ===============================================================================

using Ud = Traffic;

constexpr uint32_t kPeerQkey = 0x11111111;

struct UdSetup {
	uint64_t pcq;
	PeerQp peer;
	PeerMr rbuf;
	ibv_cq *cq;
	ibv_qp *qp;
	ibv_ah *ah;
	Buffer *src;
};

UdSetup ud_setup(Peer &peer, Verbs &me)
{
	UdSetup s{};
	Msg cq = peer.call(Msg("cq").set("cqe", 64));
	s.pcq = cq.u64("id");
	Msg qp = peer.call(Msg("qp").set("type", "ud").set("cq", s.pcq).set("max_recv_wr", 16));
	s.peer = {qp.u64("id"), static_cast<uint32_t>(qp.u64("qpn"))};
	peer.call(Msg("ud_up").set("qp", s.peer.id).set("qkey", kPeerQkey));
	Msg mr = peer.call(Msg("mr").set("size", 16384).set("access", IBV_ACCESS_LOCAL_WRITE).set("fill", 0x77));
	s.rbuf = {mr.u64("id"), mr.u64("addr"), 0, static_cast<uint32_t>(mr.u64("lkey")), mr.u64("len")};
	// Receives big enough for 2048 + GRH, so that only the sender can refuse
	// an over-MTU message.
	peer.call(Msg("post_recv").set("qp", s.peer.id).set("mr", s.rbuf.id).set("off", 0).set("len", 4096)
			  .set("count", 4).set("stride", 4096).set("wr_id", 100));
	s.cq = me.cq(64);
	s.qp = me.qp(IBV_QPT_UD, s.cq, s.cq);
	ud_connect(s.qp, 0x22222222);
	s.ah = me.ah(peer.gid);
	s.src = me.buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	return s;
}

// A wrong Q_Key: the sender completes SUCCESS (UD is unacknowledged), the
// receiver sees nothing and its buffer is untouched; the right Q_Key then
// uses the very first receive.
TEST_F(Ud, QkeyMismatchIsDropped)
{
	UdSetup s = ud_setup(peer(), me());
	SendWr bad(1, IBV_WR_SEND, s.src->addr(), 64, s.src->lkey());
	ASSERT_EQ(bad.ud(s.ah, s.peer.qpn, 0x33333333).post(s.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(s.cq, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	auto got = peer_poll(s.pcq, 4, 300ms);
	EXPECT_TRUE(got.empty()) << "a Q_Key violation was delivered:" << describe(got);
	std::string where;
	EXPECT_EQ(peer_bad_bytes(s.rbuf, 0x77, 0, 0, &where), 0u) << where;

	SendWr good(2, IBV_WR_SEND, s.src->addr(), 64, s.src->lkey());
	ASSERT_EQ(good.ud(s.ah, s.peer.qpn, kPeerQkey).post(s.qp), 0);
	ASSERT_TRUE(one_completion(s.cq, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	got = peer_poll(s.pcq, 1, 5s);
	ASSERT_EQ(got.size(), 1u);
	EXPECT_EQ(got[0].wr_id, 100u) << "the dropped message consumed a receive";
	EXPECT_EQ(got[0].status, IBV_WC_SUCCESS) << status_str(got[0].status);
	EXPECT_EQ(got[0].byte_len, 64u + 40u);
	EXPECT_EQ(got[0].src_qp, s.qp->qp_num);
	EXPECT_EQ(peer_bad_bytes(s.rbuf, kSrcFill, 40, 64), 0u);
}

// UD to a QPN nobody has, or to an RC QP: SUCCESS for the sender, nothing
// delivered anywhere.
TEST_F(Ud, ToMissingOrWrongTypeQpIsDropped)
{
	UdSetup s = ud_setup(peer(), me());
	uint64_t rc_cq = peer_cq();
	Msg rc = peer().call(Msg("qp").set("type", "rc").set("cq", rc_cq));
	peer().call(Msg("connect").set("qp", rc.u64("id")).set("remote_qpn", s.qp->qp_num)
			    .set("gid", gid_hex(me().gid)));  // RTS, so that it can hold a receive
	PeerMr rcbuf = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	peer_post_recv(rc.u64("id"), rcbuf, 0, 4096, 900);
	for (uint32_t qpn : {0xFFFF00u, static_cast<uint32_t>(rc.u64("qpn"))}) {
		SCOPED_TRACE("remote qpn " + std::to_string(qpn));
		SendWr w(qpn, IBV_WR_SEND, s.src->addr(), 64, s.src->lkey());
		ASSERT_EQ(w.ud(s.ah, qpn, kPeerQkey).post(s.qp), 0);
		ibv_wc wc{};
		ASSERT_TRUE(one_completion(s.cq, &wc));
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	}
	EXPECT_TRUE(peer_poll(s.pcq, 4, 200ms).empty());
	EXPECT_TRUE(peer_poll(rc_cq, 4, 50ms).empty());
	EXPECT_EQ(peer_bad_bytes(s.rbuf, 0x77), 0u);
	EXPECT_EQ(peer_bad_bytes(rcbuf, 0x77), 0u);
}

// A UD payload larger than the port MTU fails locally (LOC_LEN_ERR) and
// reaches nobody; exactly the MTU goes through.
TEST_F(Ud, PayloadOverMtuIsLocLenErr)
{
	UdSetup s = ud_setup(peer(), me());
	uint32_t mtu = me().mtu_bytes;
	ASSERT_EQ(mtu, 1024u) << "a 1500-byte netdev gives active_mtu 1024";
	SendWr fits(1, IBV_WR_SEND, s.src->addr(), mtu, s.src->lkey());
	ASSERT_EQ(fits.ud(s.ah, s.peer.qpn, kPeerQkey).post(s.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(s.cq, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	auto got = peer_poll(s.pcq, 1, 5s);
	ASSERT_EQ(got.size(), 1u);
	EXPECT_EQ(got[0].byte_len, mtu + 40);

	SendWr big(2, IBV_WR_SEND, s.src->addr(), mtu + 1, s.src->lkey());
	ASSERT_EQ(big.ud(s.ah, s.peer.qpn, kPeerQkey).post(s.qp), 0);
	ASSERT_TRUE(one_completion(s.cq, &wc));
	EXPECT_EQ(wc.wr_id, 2u);
	EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR) << status_str(wc.status);
	got = peer_poll(s.pcq, 4, 300ms);
	EXPECT_TRUE(got.empty()) << "an over-MTU message was delivered:" << describe(got);
	std::string where;
	EXPECT_EQ(peer_bad_bytes(s.rbuf, 0x77, 4096), 0u) << "the next receive buffer was written";
}

// ===============================================================================
// 8. Hammer
// ===============================================================================

using Hammer = Traffic;

constexpr int kPairs = 4;
constexpr int kThreads = 2;
constexpr int kOps = 2000;

// Every returned original of `n` FETCH_AND_ADD(+1) on a counter that started
// at 0 is distinct, and together they are exactly 0 .. n-1.
::testing::AssertionResult originals_are_a_permutation(std::vector<uint64_t> v)
{
	std::sort(v.begin(), v.end());
	for (size_t i = 0; i < v.size(); ++i)
		if (v[i] != i) {
			auto dup = std::adjacent_find(v.begin(), v.end());
			return ::testing::AssertionFailure()
			       << "sorted originals differ at " << i << ": " << v[i]
			       << (dup != v.end() ? " (duplicate original " + std::to_string(*dup) + ")" : "");
		}
	return ::testing::AssertionSuccess();
}

void expect_clean(const HammerResult &h, uint64_t total, const char *who)
{
	SCOPED_TRACE(who);
	EXPECT_FALSE(h.timed_out) << h.first_problem;
	EXPECT_EQ(h.posted, total);
	EXPECT_EQ(h.completions, total) << "completions lost or duplicated";
	EXPECT_EQ(h.errors, 0u) << h.first_problem;
	EXPECT_EQ(h.wrong_opcode, 0u) << h.first_problem;
	EXPECT_EQ(h.unknown, 0u) << h.first_problem;
	EXPECT_EQ(h.duplicates, 0u) << h.first_problem;
	EXPECT_EQ(h.missing, 0u) << h.first_problem;
}

// N QP pairs, 2 threads per QP, all doing FETCH_AND_ADD(+1) on one counter
// in the peer: the counter ends at N*threads*K, every original is distinct,
// every wr_id completes exactly once.
TEST_F(Hammer, FetchAddOneCounter)
{
	uint64_t pcq = peer_cq();
	PeerMr counter = peer_mr(4096, kAllAccess, 0);
	const uint64_t total = uint64_t(kPairs) * kThreads * kOps;
	Buffer *results = me().buffer(total * 8, IBV_ACCESS_LOCAL_WRITE, 0xFF);
	std::vector<ibv_qp *> qps;
	std::vector<ibv_cq *> cqs;
	PairOpts o;
	o.caps.max_send_wr = 64;
	for (int i = 0; i < kPairs; ++i) {
		cqs.push_back(me().cq(256));
		qps.push_back(rc_pair(cqs.back(), cqs.back(), pcq, o).qp);
	}
	HammerResult h = faa_hammer(qps, cqs, kThreads, kOps, counter.addr + 512, counter.rkey,
				    reinterpret_cast<uint64_t *>(results->data), results->lkey(), 60s);
	expect_clean(h, total, "requester");
	EXPECT_EQ(peer().call(Msg("read64").set("mr", counter.id).set("off", 512)).u64("value"), total)
		<< "final counter";
	std::vector<uint64_t> orig(reinterpret_cast<uint64_t *>(results->data),
				   reinterpret_cast<uint64_t *>(results->data) + total);
	EXPECT_TRUE(originals_are_a_permutation(orig));
	EXPECT_EQ(peer_bad_bytes(counter, 0, 0, 512), 0u) << "bytes before the counter";
	EXPECT_EQ(peer_bad_bytes(counter, 0, 520), 0u) << "bytes after the counter";
}

// Two requester processes (the test and a second peer), 4 QPs and 2
// threads each, on the same counter in a third process: atomics are atomic
// device-wide (IBV_ATOMIC_HCA), not just within one requester.
TEST_F(Hammer, FetchAddFromTwoProcesses)
{
	constexpr int k = 1000;
	const uint64_t per_process = uint64_t(kPairs) * kThreads * k;
	Peer other;  // the second requester
	uint64_t pcq = peer_cq();
	PeerMr counter = peer_mr(4096, kAllAccess, 0);
	Buffer *results = me().buffer(per_process * 8, IBV_ACCESS_LOCAL_WRITE, 0xFF);
	ASSERT_LE(per_process * 8, other.scratch_size);
	memset(other.scratch, 0xFF, per_process * 8);
	Msg smr = other.call(Msg("scratch_mr").set("access", IBV_ACCESS_LOCAL_WRITE));

	std::vector<ibv_qp *> qps;
	std::vector<ibv_cq *> cqs;
	std::string other_qps, other_cqs;
	PairOpts o;
	o.caps.max_send_wr = 64;
	for (int i = 0; i < kPairs; ++i) {
		cqs.push_back(me().cq(256));
		qps.push_back(rc_pair(cqs.back(), cqs.back(), pcq, o).qp);
		// other <-> peer
		Msg ocq = other.call(Msg("cq").set("cqe", 256));
		Msg oqp = other.call(Msg("qp").set("cq", ocq.u64("id")).set("max_send_wr", 64));
		Msg pqp = peer().call(Msg("qp").set("cq", pcq));
		other.call(Msg("connect").set("qp", oqp.u64("id")).set("remote_qpn", pqp.u64("qpn"))
				   .set("gid", gid_hex(peer().gid)));
		peer().call(Msg("connect").set("qp", pqp.u64("id")).set("remote_qpn", oqp.u64("qpn"))
				    .set("gid", gid_hex(other.gid)));
		other_qps += (i ? "," : "") + oqp.str("id");
		other_cqs += (i ? "," : "") + ocq.str("id");
	}
	other.send(Msg("faa_hammer").set("qps", other_qps).set("cqs", other_cqs).set("threads", kThreads)
			   .set("k", k).set("raddr", counter.addr + 8).set("rkey", counter.rkey)
			   .set("result_mr", smr.u64("id")).set("timeout_ms", 60000));
	HammerResult mine = faa_hammer(qps, cqs, kThreads, k, counter.addr + 8, counter.rkey,
				       reinterpret_cast<uint64_t *>(results->data), results->lkey(), 60s);
	HammerResult theirs = hammer_from_msg(other.reply(70s));
	expect_clean(mine, per_process, "test process");
	expect_clean(theirs, per_process, "second requester process");
	EXPECT_EQ(peer().call(Msg("read64").set("mr", counter.id).set("off", 8)).u64("value"), 2 * per_process)
		<< "final counter";
	std::vector<uint64_t> orig(reinterpret_cast<uint64_t *>(results->data),
				   reinterpret_cast<uint64_t *>(results->data) + per_process);
	orig.insert(orig.end(), other.scratch, other.scratch + per_process);
	EXPECT_TRUE(originals_are_a_permutation(orig));
	bool ok = false;
	EXPECT_EQ(other.finish(&ok), "");
	EXPECT_TRUE(ok);
}

// N pairs whose peer QPs share one SRQ, 2 sending threads per QP: every
// message is received exactly once, intact, and every SEND completes once.
TEST_F(Hammer, SendsIntoOneSrq)
{
	constexpr int k = 3000;
	constexpr uint32_t kMsg = 64;
	constexpr uint64_t kSlot = 128;
	constexpr uint64_t kSlots = 256;
	const uint64_t total = uint64_t(kPairs) * kThreads * k;
	uint64_t pcq = peer_cq(1024);
	uint64_t srq = peer().call(Msg("srq").set("max_wr", kSlots)).u64("id");
	PeerMr slots = peer_mr(kSlot * kSlots, IBV_ACCESS_LOCAL_WRITE, 0);
	peer_post_srq_recv(srq, slots, 0, kSlot, 0, kSlots, kSlot);

	Buffer *msgs = me().buffer(total * kMsg, IBV_ACCESS_LOCAL_WRITE, 0);
	for (uint64_t id = 0; id < total; ++id) {
		uint8_t *p = msgs->data + id * kMsg;
		uint32_t a = static_cast<uint32_t>(id), b = ~a;
		memcpy(p, &a, 4);
		memcpy(p + 4, &b, 4);
		for (uint32_t j = 8; j < kMsg; ++j)
			p[j] = static_cast<uint8_t>(a * 7 + j);
	}
	std::vector<ibv_qp *> qps;
	std::vector<ibv_cq *> cqs;
	PairOpts o;
	o.caps.max_send_wr = 64;
	o.mine.rnr_retry = 7;  // the SRQ may run dry for a moment
	o.peer_srq = static_cast<int64_t>(srq);
	for (int i = 0; i < kPairs; ++i) {
		cqs.push_back(me().cq(256));
		qps.push_back(rc_pair(cqs.back(), cqs.back(), pcq, o).qp);
	}
	peer().send(Msg("srq_sink").set("cq", pcq).set("srq", srq).set("mr", slots.id).set("slot", kSlot)
			    .set("slots", kSlots).set("expected", total).set("msg_len", kMsg)
			    .set("timeout_ms", 30000).set("linger_ms", 300));

	std::vector<std::atomic<uint32_t>> seen(total);
	std::atomic<uint64_t> completions{0}, errors{0}, unknown{0};
	std::mutex lk;
	std::string first_problem;
	std::vector<std::atomic<int>> outstanding(kPairs * kThreads);
	auto deadline = Clock::now() + 60s;
	auto reap = [&](ibv_cq *cq) {
		ibv_wc wc[16];
		int n = ibv_poll_cq(cq, 16, wc);
		for (int i = 0; i < n; ++i) {
			completions++;
			if (wc[i].wr_id >= total) {
				unknown++;
				continue;
			}
			if (seen[wc[i].wr_id]++ || wc[i].status != IBV_WC_SUCCESS) {
				errors++;
				std::lock_guard g(lk);
				if (first_problem.empty())
					first_problem = "wr_id " + std::to_string(wc[i].wr_id) + " " + status_str(wc[i].status);
			}
			outstanding[wc[i].wr_id / k]--;
		}
	};
	std::vector<std::thread> pool;
	std::atomic<bool> gave_up{false};
	for (int q = 0; q < kPairs; ++q)
		for (int t = 0; t < kThreads; ++t)
			pool.emplace_back([&, q, t] {
				int self = q * kThreads + t;
				int next = 0;
				while (Clock::now() < deadline) {
					while (next < k && outstanding[self] < 16) {
						uint64_t id = uint64_t(self) * k + next;
						SendWr s(id, IBV_WR_SEND, msgs->addr() + id * kMsg, kMsg, msgs->lkey());
						outstanding[self]++;
						if (s.post(qps[q])) {
							outstanding[self]--;
							gave_up = true;
							return;
						}
						++next;
					}
					reap(cqs[q]);
					if (next == k && outstanding[self] <= 0)
						return;
				}
				gave_up = true;
			});
	for (auto &th : pool)
		th.join();
	for (ibv_cq *cq : cqs)
		reap(cq);
	peer().send(Msg("stop"));  // every SEND has completed: the sink need not wait longer
	Msg sink = peer().reply(40s);

	EXPECT_FALSE(gave_up) << "a sender timed out or failed to post";
	EXPECT_EQ(completions.load(), total) << "send completions lost or duplicated";
	EXPECT_EQ(errors.load(), 0u) << first_problem;
	EXPECT_EQ(unknown.load(), 0u);
	EXPECT_EQ(sink.u64("received"), total) << "receive completions: " << sink.str("first_problem");
	EXPECT_EQ(sink.u64("once"), total) << "messages received exactly once";
	EXPECT_EQ(sink.u64("dup"), 0u) << "messages received twice";
	EXPECT_EQ(sink.u64("missing"), 0u) << "messages never received, e.g. ids " << sink.str("missing_ids")
					  << "; receiver async events: " << sink.str("async_events");
	EXPECT_EQ(sink.u64("bad_status"), 0u) << sink.str("first_problem");
	EXPECT_EQ(sink.u64("bad_len"), 0u) << sink.str("first_problem");
	EXPECT_EQ(sink.u64("bad_payload"), 0u) << sink.str("first_problem");
	EXPECT_EQ(sink.u64("out_of_range"), 0u) << sink.str("first_problem");
	EXPECT_EQ(sink.u64("repost_fail"), 0u);
}

// ===============================================================================
// 9. CQ overrun
// ===============================================================================

using CqOverrun = Traffic;

// The receiver's CQ (cqe 4) is never polled while more SENDs than it holds
// arrive: the owner gets IBV_EVENT_CQ_ERR for that CQ on its async fd.
TEST_F(CqOverrun, OverrunRaisesCqErr)
{
	int actual = 0;
	uint64_t pcq = peer_cq(4, false, &actual);
	ASSERT_GE(actual, 4);
	const int sends = std::max(8, actual + 4);
	PeerMr rbuf = peer_mr(64 * 64, IBV_ACCESS_LOCAL_WRITE, 0x77);
	auto [cq, buf] = sender();
	PairOpts o;
	o.peer_max_recv_wr = 64;
	o.caps.max_send_wr = 64;
	Pair p = rc_pair(cq, cq, pcq, o);
	peer_post_recv(p.peer.id, rbuf, 0, 64, 1, static_cast<size_t>(sends), 64);
	for (int i = 0; i < sends; ++i) {
		SendWr s(static_cast<uint64_t>(i), IBV_WR_SEND, buf->addr(), 16, buf->lkey());
		ASSERT_EQ(s.post(p.qp), 0);
	}
	Msg ev = peer().call(Msg("async_wait").set("type", static_cast<int>(IBV_EVENT_CQ_ERR))
				     .set("timeout_ms", 5000).set("cq", pcq), 15s);
	EXPECT_EQ(ev.u64("got"), 1u) << "no IBV_EVENT_CQ_ERR within 5 s; events seen: " << ev.str("seen", "");
	if (ev.u64("got")) {
		EXPECT_EQ(ev.u64("cq_match", 0), 1u) << "CQ_ERR names another CQ";
	}
	// Our side completes every SEND (whatever the status) within a bound.
	auto wcs = poll_n(cq, static_cast<size_t>(sends), 5s);
	EXPECT_EQ(wcs.size(), static_cast<size_t>(sends)) << describe(wcs);
	auto polled = peer_poll(pcq, 64, 100ms);
	EXPECT_LE(polled.size(), static_cast<size_t>(actual)) << "a CQ of " << actual << " returned more";
	std::string statuses;
	for (auto &w : wcs)
		statuses += " " + std::to_string(w.status);
	RecordProperty("sender_statuses", statuses);
	RecordProperty("responder_qp_state", static_cast<int>(peer_qp_state(p.peer)));
	printf("CQ overrun: sender statuses:%s; responder QP state %d; receiver polled %zu\n", statuses.c_str(),
	       static_cast<int>(peer_qp_state(p.peer)), polled.size());
}

// ===============================================================================
// 10. Completion events
// ===============================================================================

using CompletionEvents = Traffic;

// The peer arms its CQ and sleeps in ibv_get_cq_event; a SEND from this
// process wakes it.
TEST_F(CompletionEvents, RemoteCompletionWakesReceiver)
{
	uint64_t pcq = peer_cq(64, true);
	PeerMr rbuf = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	auto [cq, buf] = sender();
	Pair p = rc_pair(cq, cq, pcq);
	peer_post_recv(p.peer.id, rbuf, 0, 256, 5);
	peer().call(Msg("arm").set("cq", pcq).set("solicited", 0));
	peer().send(Msg("wait_cq_event").set("cq", pcq).set("timeout_ms", 5000));
	std::this_thread::sleep_for(100ms);  // let it fall asleep
	SendWr s(1, IBV_WR_SEND, buf->addr(), 32, buf->lkey());
	ASSERT_EQ(s.post(p.qp), 0);
	Msg r = peer().reply(15s);
	EXPECT_EQ(r.u64("woke"), 1u) << "the receiver was not woken";
	EXPECT_EQ(r.u64("same_cq"), 1u);
	auto got = peer_poll(pcq, 1, 1s);
	ASSERT_EQ(got.size(), 1u);
	EXPECT_EQ(got[0].wr_id, 5u);
	EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

// Solicited-only arming: an unsolicited SEND completes but raises no event;
// the arm stays, and a SEND with IBV_SEND_SOLICITED wakes the receiver.
TEST_F(CompletionEvents, SolicitedOnlyIgnoresUnsolicited)
{
	uint64_t pcq = peer_cq(64, true);
	PeerMr rbuf = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	auto [cq, buf] = sender();
	Pair p = rc_pair(cq, cq, pcq);
	peer_post_recv(p.peer.id, rbuf, 0, 256, 10, 2, 256);
	peer().call(Msg("arm").set("cq", pcq).set("solicited", 1));

	peer().send(Msg("wait_cq_event").set("cq", pcq).set("timeout_ms", 600));
	std::this_thread::sleep_for(100ms);
	SendWr plain(1, IBV_WR_SEND, buf->addr(), 32, buf->lkey());
	ASSERT_EQ(plain.post(p.qp), 0);
	Msg r = peer().reply(15s);
	EXPECT_EQ(r.u64("woke"), 0u) << "an unsolicited SEND woke a solicited-only arm";
	auto got = peer_poll(pcq, 1, 1s);
	ASSERT_EQ(got.size(), 1u) << "the unsolicited SEND was not delivered";
	EXPECT_EQ(got[0].wr_id, 10u);

	peer().send(Msg("wait_cq_event").set("cq", pcq).set("timeout_ms", 5000));
	std::this_thread::sleep_for(100ms);
	SendWr sol(2, IBV_WR_SEND, buf->addr(), 32, buf->lkey(), IBV_SEND_SIGNALED | IBV_SEND_SOLICITED);
	ASSERT_EQ(sol.post(p.qp), 0);
	r = peer().reply(15s);
	EXPECT_EQ(r.u64("woke"), 1u) << "a solicited SEND did not wake the receiver";
	EXPECT_EQ(r.u64("same_cq"), 1u);
	got = peer_poll(pcq, 1, 1s);
	ASSERT_EQ(got.size(), 1u);
	EXPECT_EQ(got[0].wr_id, 11u);
	EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
	auto mine = poll_n(cq, 2, 2s);
	EXPECT_EQ(mine.size(), 2u) << describe(mine);
}

// Solicited-only arming also wakes on an error completion: a SEND longer
// than the receive gives the receiver LOC_LEN_ERR, which must raise the event.
TEST_F(CompletionEvents, SolicitedOnlyWakesOnError)
{
	uint64_t pcq = peer_cq(64, true);
	PeerMr rbuf = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	auto [cq, buf] = sender();
	Pair p = rc_pair(cq, cq, pcq);
	peer_post_recv(p.peer.id, rbuf, 0, 16, 30);
	peer().call(Msg("arm").set("cq", pcq).set("solicited", 1));
	peer().send(Msg("wait_cq_event").set("cq", pcq).set("timeout_ms", 5000));
	std::this_thread::sleep_for(100ms);
	SendWr s(1, IBV_WR_SEND, buf->addr(), 64, buf->lkey());  // unsolicited, too long
	ASSERT_EQ(s.post(p.qp), 0);
	Msg r = peer().reply(15s);
	EXPECT_EQ(r.u64("woke"), 1u) << "an error completion did not wake a solicited-only arm";
	auto got = peer_poll(pcq, 1, 1s);
	ASSERT_EQ(got.size(), 1u);
	EXPECT_EQ(got[0].status, IBV_WC_LOC_LEN_ERR) << status_str(got[0].status);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc));
	EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << status_str(wc.status);
}

// The completion that wakes the receiver is written by the requester's
// progress thread (the SEND waited in RNR until the receive was posted),
// in the other process, with nobody polling anywhere.
TEST_F(CompletionEvents, DelayedDeliveryWakesReceiver)
{
	uint64_t pcq = peer_cq(64, true);
	PeerMr rbuf = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	auto [ch, cq, buf] = event_sender();
	PairOpts o = rnr_opts(7, 14);  // 0.96 ms between tries
	Pair p = rc_pair(cq, cq, pcq, o);
	ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
	SendWr s(1, IBV_WR_SEND, buf->addr(), 128, buf->lkey());
	ASSERT_EQ(s.post(p.qp), 0);  // RNR: no receive yet
	std::this_thread::sleep_for(30ms);
	peer().call(Msg("arm").set("cq", pcq).set("solicited", 0));
	peer_post_recv(p.peer.id, rbuf, 0, 256, 8);
	peer().send(Msg("wait_cq_event").set("cq", pcq).set("timeout_ms", 5000));
	// Both sides asleep: the receiver in ibv_get_cq_event, we in ours.
	EXPECT_EQ(wait_cq_event(ch, 5s), cq) << "our completion event";
	Msg r = peer().reply(15s);
	EXPECT_EQ(r.u64("woke"), 1u) << "the receiver was not woken";
	auto got = peer_poll(pcq, 1, 1s);
	ASSERT_EQ(got.size(), 1u);
	EXPECT_EQ(got[0].wr_id, 8u);
	EXPECT_EQ(got[0].status, IBV_WC_SUCCESS) << status_str(got[0].status);
	EXPECT_EQ(got[0].byte_len, 128u);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
}

// An unarmed CQ raises no event at all.
TEST_F(CompletionEvents, UnarmedCqStaysQuiet)
{
	uint64_t pcq = peer_cq(64, true);
	PeerMr rbuf = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	auto [cq, buf] = sender();
	Pair p = rc_pair(cq, cq, pcq);
	peer_post_recv(p.peer.id, rbuf, 0, 256, 10);
	peer().send(Msg("wait_cq_event").set("cq", pcq).set("timeout_ms", 400));
	std::this_thread::sleep_for(50ms);
	SendWr s(1, IBV_WR_SEND, buf->addr(), 32, buf->lkey(), IBV_SEND_SIGNALED | IBV_SEND_SOLICITED);
	ASSERT_EQ(s.post(p.qp), 0);
	Msg r = peer().reply(15s);
	EXPECT_EQ(r.u64("woke"), 0u) << "an unarmed CQ raised an event";
	EXPECT_EQ(peer_poll(pcq, 1, 1s).size(), 1u);
}

// --- a per-test watchdog ---------------------------------------------------------

class TestTimeout : public ::testing::EmptyTestEventListener {
	void OnTestStart(const ::testing::TestInfo &) override { alarm(kTestTimeoutSec); }
	void OnTestEnd(const ::testing::TestInfo &) override { alarm(0); }
};

void on_alarm(int)
{
	static const char msg[] = "\n*** traffic_errors: test exceeded its time limit (hung?) ***\n";
	ssize_t n = write(STDERR_FILENO, msg, sizeof(msg) - 1);
	(void)n;
	_exit(3);  // peers die with us (PR_SET_PDEATHSIG)
}

}  // namespace

int main(int argc, char **argv)
{
	if (auto peer = xsrc::harness::child_args(argc, argv, "--peer"))
		return peer->args.size() == 1 ? peer_main(peer->link, atoi(peer->args[0].c_str())) : 2;
	signal(SIGALRM, on_alarm);
	::testing::InitGoogleTest(&argc, argv);
	::testing::UnitTest::GetInstance()->listeners().Append(new TestTimeout);
	return RUN_ALL_TESTS();
}
