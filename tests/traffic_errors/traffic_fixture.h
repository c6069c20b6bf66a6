// traffic_errors: the error paths of the data path, between two processes.
//
// The test process is the requester (mostly); a peer process (this binary
// re-exec'd with --peer, see peer.h) owns the responder's QPs, CQs, SRQs and
// MRs and does what the test asks over a socketpair (harness/link.h). Each test starts its
// peer before it opens a context of its own. RC QPs are connected like
// `ibv_rc_pingpong -g 1`: GRH, sgid index 1, the peer's GID from
// ibv_query_gid, path MTU 1024, timeout 14, retry_cnt 7.
//
// Every case asserts the completion status and, where the spec says nothing
// may move, that the target memory still holds its fill pattern. Every wait
// is bounded; a per-test alarm ends a hung test with a message instead of
// hanging CI.
//
// This header: the fixture every case family shares (a peer process and our own
// verbs objects, and the requests the test makes of the peer). The families are in
// *_test.cpp beside it, main() in traffic_errors_main.cpp.
#pragma once

#include <gtest/gtest.h>
#include <endian.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "peer.h"
#include "traffic_util.h"

namespace xsrc_traffic {

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
			out[i].imm_data = static_cast<uint32_t>(r.u64("imm" + s));
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
	// Two requester processes on the peer's memory: `pairs` RC pairs from us
	// (a CQ each, our send queues `max_send_wr` deep) and as many from
	// `other`, whose faa_hammer writes its originals into its scratch
	// (`other_ops` of them, 0xFF until then).
	struct TwoRequesters {
		Peer &other;
		std::vector<ibv_qp *> qps;  // ours, and their CQs
		std::vector<ibv_cq *> cqs;
		std::string other_qps, other_cqs;  // ids in `other`, comma-separated
		uint64_t other_results = 0;        // the MR over other's scratch

		// Sets `other` doing `k` FETCH_AND_ADD(+1) per thread on raddr;
		// its HammerResult is hammer_from_msg(other.reply(...)).
		void start(int threads, int k, uint64_t raddr, uint32_t rkey)
		{
			other.send(Msg("faa_hammer").set("qps", other_qps).set("cqs", other_cqs).set("threads", threads)
					   .set("k", k).set("raddr", raddr).set("rkey", rkey)
					   .set("result_mr", other_results).set("timeout_ms", 60000));
		}
		// Appends other's first `n` originals to `to`.
		void add_originals(std::vector<uint64_t> &to, uint64_t n) const
		{
			to.insert(to.end(), other.scratch, other.scratch + n);
		}
		void finish()
		{
			bool ok = false;
			EXPECT_EQ(other.finish(&ok), "");
			EXPECT_TRUE(ok);
		}
	};
	TwoRequesters two_requesters(Peer &other, uint64_t pcq, int pairs, uint64_t other_ops,
				     uint32_t max_send_wr = 64)
	{
		TwoRequesters r{other, {}, {}, {}, {}, 0};
		EXPECT_LE(other_ops * 8, other.scratch_size);
		memset(other.scratch, 0xFF, std::min<uint64_t>(other_ops * 8, other.scratch_size));
		r.other_results = other.call(Msg("scratch_mr").set("access", IBV_ACCESS_LOCAL_WRITE)).u64("id");
		PairOpts o;
		o.caps.max_send_wr = max_send_wr;
		for (int i = 0; i < pairs; ++i) {
			r.cqs.push_back(me().cq(256));
			r.qps.push_back(rc_pair(r.cqs.back(), r.cqs.back(), pcq, o).qp);
			Msg ocq = other.call(Msg("cq").set("cqe", 256));
			Msg oqp = other.call(Msg("qp").set("cq", ocq.u64("id")).set("max_send_wr", 64));
			Msg pqp = peer().call(Msg("qp").set("cq", pcq));
			other.call(Msg("connect").set("qp", oqp.u64("id")).set("remote_qpn", pqp.u64("qpn"))
					   .set("gid", gid_hex(peer().gid)));
			peer().call(Msg("connect").set("qp", pqp.u64("id")).set("remote_qpn", oqp.u64("qpn"))
					    .set("gid", gid_hex(other.gid)));
			r.other_qps += (i ? "," : "") + oqp.str("id");
			r.other_cqs += (i ? "," : "") + ocq.str("id");
		}
		return r;
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

// Every returned original of `n` FETCH_AND_ADD(+1) on a counter that started
// at 0 is distinct, and together they are exactly 0 .. n-1.
inline ::testing::AssertionResult originals_are_a_permutation(std::vector<uint64_t> v)
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

inline void expect_clean(const HammerResult &h, uint64_t total, const char *who)
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

// One completion within `timeout` (a failure if none).
inline ::testing::AssertionResult one_completion(ibv_cq *cq, ibv_wc *out, ms timeout = 5s)
{
	auto wcs = poll_completions(cq, 1, timeout);
	if (wcs.empty())
		return ::testing::AssertionFailure() << "no completion within " << timeout.count() << " ms";
	*out = wcs[0];
	return ::testing::AssertionSuccess();
}

// After a requester error: the QP is in ERR and what is posted next is
// flushed (a WRITE and a SEND, in order), and nothing else completes.
inline void expect_error_state_flushes(ibv_qp *qp, ibv_cq *cq, Buffer *src, uint64_t raddr, uint32_t rkey)
{
	EXPECT_EQ(qp_state(qp), IBV_QPS_ERR) << "requester QP after an error completion";
	SendWr w(9001, IBV_WR_RDMA_WRITE, src->addr(), 8, src->lkey());
	w.rdma(raddr, rkey);
	EXPECT_EQ(w.post(qp), 0) << "post_send on an ERR QP";
	SendWr s(9002, IBV_WR_SEND, src->addr(), 8, src->lkey());
	EXPECT_EQ(s.post(qp), 0) << "post_send on an ERR QP";
	auto wcs = poll_completions(cq, 2, 5s);
	ASSERT_EQ(wcs.size(), 2u) << "flush completions:" << describe(wcs);
	EXPECT_EQ(wcs[0].wr_id, 9001u);
	EXPECT_EQ(wcs[0].status, IBV_WC_WR_FLUSH_ERR) << status_str(wcs[0].status);
	EXPECT_EQ(wcs[1].wr_id, 9002u);
	EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR) << status_str(wcs[1].status);
	auto extra = poll_quiet(cq, 50ms);
	EXPECT_TRUE(extra.empty()) << "unexpected completions:" << describe(extra);
}

}  // namespace xsrc_traffic
