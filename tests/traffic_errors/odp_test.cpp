// traffic_errors: on-demand paging (the fixture: traffic_fixture.h). ODP MRs
// over pages nobody touched yet, implicit MRs, pages unmapped under a
// registered MR (a completion error on the side whose memory it is, no crash,
// both processes go on) and ibv_advise_mr.
#include <sys/mman.h>

#include <vector>

#include "traffic_fixture.h"

namespace xsrc_traffic {
namespace {

constexpr size_t kPage = 4096;
// Below mmap_min_addr: never mapped in any process.
constexpr uint64_t kNeverMapped = 0x1000;
// Holes are made after everything else is set up: a later mmap (a QP's, a
// buffer's) could land in them.

class Odp : public Traffic {
protected:
	void SetUp() override
	{
		Traffic::SetUp();
		pcq_ = peer_cq();
		cq_ = me().cq(64);
	}

	PeerMr peer_odp_mr(size_t size, uint32_t access, bool implicit = false)
	{
		Msg r = peer().call(Msg("odp_mr").set("size", size).set("access", access).set("implicit", implicit));
		return {r.u64("id"), r.u64("addr"), static_cast<uint32_t>(r.u64("rkey")),
			static_cast<uint32_t>(r.u64("lkey")), r.u64("len")};
	}
	void peer_unmap(const PeerMr &mr, size_t off, size_t len)
	{
		peer().call(Msg("unmap").set("mr", mr.id).set("off", off).set("len", len));
	}
	// Posts `w` and returns its completion's status (IBV_WC_GENERAL_ERR if none came).
	ibv_wc_status run(SendWr w, ibv_qp *qp)
	{
		EXPECT_EQ(w.post(qp), 0) << "post_send";
		ibv_wc wc{};
		if (!one_completion(cq_, &wc))
			return IBV_WC_GENERAL_ERR;
		EXPECT_EQ(wc.wr_id, w.wr.wr_id);
		return wc.status;
	}
	uint64_t peer_read64(const PeerMr &mr, size_t off)
	{
		return peer().call(Msg("read64").set("mr", mr.id).set("off", off)).u64("value");
	}

	uint64_t pcq_ = 0;
	ibv_cq *cq_ = nullptr;
};

// Every page is first touched by the operation itself (on the responder) or
// after registration (ours): WRITE, READ, both atomics and SEND all work.
TEST_F(Odp, PagesTouchedOnlyAfterRegistrationCarryEveryOperation)
{
	PeerMr target = peer_odp_mr(4 * kPage, kAllAccess);
	Buffer *src = me().odp_buffer(kPage, IBV_ACCESS_LOCAL_WRITE);
	memset(src->data, kSrcFill, kPage);  // first touched now
	Buffer *dst = me().odp_buffer(kPage, IBV_ACCESS_LOCAL_WRITE);  // untouched until the READ lands
	Pair p = rc_pair(cq_, cq_, pcq_);

	SendWr w(1, IBV_WR_RDMA_WRITE, src->addr(), 64, src->lkey());
	EXPECT_EQ(run(w.rdma(target.addr + 128, target.rkey), p.qp), IBV_WC_SUCCESS);
	EXPECT_EQ(peer_bad_bytes(target, kSrcFill, 128, 64), 0u) << "written bytes";
	EXPECT_EQ(peer_bad_bytes(target, 0, 0, 128), 0u) << "bytes before (a fresh page)";

	SendWr r(2, IBV_WR_RDMA_READ, dst->addr(), 64, dst->lkey());
	EXPECT_EQ(run(r.rdma(target.addr + 128, target.rkey), p.qp), IBV_WC_SUCCESS);
	EXPECT_EQ(dst->mismatches(0, 64, kSrcFill), 0u) << "read bytes";

	SendWr faa(3, IBV_WR_ATOMIC_FETCH_AND_ADD, dst->addr() + 512, 8, dst->lkey());
	EXPECT_EQ(run(faa.atomic(target.addr + kPage, target.rkey, 5), p.qp), IBV_WC_SUCCESS);
	uint64_t orig;
	memcpy(&orig, dst->data + 512, 8);
	EXPECT_EQ(orig, 0u);
	EXPECT_EQ(peer_read64(target, kPage), 5u);
	SendWr cas(4, IBV_WR_ATOMIC_CMP_AND_SWP, dst->addr() + 520, 8, dst->lkey());
	EXPECT_EQ(run(cas.atomic(target.addr + kPage, target.rkey, 5, 9), p.qp), IBV_WC_SUCCESS);
	memcpy(&orig, dst->data + 520, 8);
	EXPECT_EQ(orig, 5u);
	EXPECT_EQ(peer_read64(target, kPage), 9u);

	// A small SEND into an untouched page of an ODP receive buffer.
	peer_post_recv(p.peer.id, target, 2 * kPage, 256, 77);
	SendWr s(5, IBV_WR_SEND, src->addr(), 100, src->lkey());
	EXPECT_EQ(run(s, p.qp), IBV_WC_SUCCESS);
	auto wcs = peer_poll(pcq_, 1, 5s);
	ASSERT_EQ(wcs.size(), 1u);
	EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << status_str(wcs[0].status);
	EXPECT_EQ(wcs[0].byte_len, 100u);
	EXPECT_EQ(peer_bad_bytes(target, kSrcFill, 2 * kPage, 100), 0u) << "received bytes";
	EXPECT_EQ(qp_state(p.qp), IBV_QPS_RTS);
	EXPECT_EQ(peer_qp_state(p.peer), IBV_QPS_RTS);
}

// The implicit MR (addr 0, SIZE_MAX) covers memory allocated after it was
// registered, on both sides; an address nothing maps is a remote access error.
TEST_F(Odp, ImplicitMrsCoverTheWholeAddressSpace)
{
	PeerMr target = peer_odp_mr(2 * kPage, kAllAccess, true);
	EXPECT_EQ(target.len, UINT64_MAX);
	Buffer *implicit = me().odp_buffer(kPage, IBV_ACCESS_LOCAL_WRITE, true);
	std::vector<uint8_t> src(kPage, kSrcFill), back(kPage, 0);  // after the registration
	Pair p = rc_pair(cq_, cq_, pcq_);

	SendWr w(1, IBV_WR_RDMA_WRITE, reinterpret_cast<uintptr_t>(src.data()), 200, implicit->lkey());
	EXPECT_EQ(run(w.rdma(target.addr + kPage - 100, target.rkey), p.qp), IBV_WC_SUCCESS);  // spans two pages
	EXPECT_EQ(peer_bad_bytes(target, kSrcFill, kPage - 100, 200), 0u);
	SendWr r(2, IBV_WR_RDMA_READ, reinterpret_cast<uintptr_t>(back.data()), 200, implicit->lkey());
	EXPECT_EQ(run(r.rdma(target.addr + kPage - 100, target.rkey), p.qp), IBV_WC_SUCCESS);
	EXPECT_EQ(std::count(back.begin(), back.begin() + 200, kSrcFill), 200);

	SendWr hole(3, IBV_WR_RDMA_WRITE, reinterpret_cast<uintptr_t>(src.data()), 8, implicit->lkey());
	EXPECT_EQ(run(hole.rdma(kNeverMapped, target.rkey), p.qp), IBV_WC_REM_ACCESS_ERR);
	EXPECT_EQ(qp_state(p.qp), IBV_QPS_ERR);
	EXPECT_EQ(peer_qp_state(p.peer), IBV_QPS_ERR);

	// Nothing broke: a new pair still uses both implicit MRs.
	Pair q = rc_pair(cq_, cq_, pcq_);
	SendWr again(4, IBV_WR_RDMA_WRITE, reinterpret_cast<uintptr_t>(src.data()), 16, implicit->lkey());
	EXPECT_EQ(run(again.rdma(target.addr, target.rkey), q.qp), IBV_WC_SUCCESS);
	EXPECT_EQ(peer_bad_bytes(target, kSrcFill, 0, 16), 0u);
}

// The responder unmaps a page under its ODP MR: every access to it is an
// error the requester sees as the responder's (its QP goes to error), no byte
// lands elsewhere, and the responder goes on — its other pages still work.
TEST_F(Odp, UnmappedResponderPagesAreRemoteErrors)
{
	PeerMr target = peer_odp_mr(3 * kPage, kAllAccess);
	Buffer *src = me().buffer(kPage, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	Buffer *dst = me().buffer(kPage, IBV_ACCESS_LOCAL_WRITE, kLocalFill);
	std::vector<Pair> pairs;
	for (int i = 0; i < 5; ++i)
		pairs.push_back(rc_pair(cq_, cq_, pcq_));
	peer_unmap(target, kPage, kPage);

	struct Case {
		const char *what;
		SendWr wr;
	};
	SendWr w(1, IBV_WR_RDMA_WRITE, src->addr(), 64, src->lkey());
	SendWr r(2, IBV_WR_RDMA_READ, dst->addr(), 64, dst->lkey());
	SendWr a(3, IBV_WR_ATOMIC_FETCH_AND_ADD, dst->addr(), 8, dst->lkey());
	size_t n = 0;
	for (Case c : {Case{"WRITE", w.rdma(target.addr + kPage, target.rkey)},
		       Case{"READ", r.rdma(target.addr + kPage + 64, target.rkey)},
		       Case{"FETCH_AND_ADD", a.atomic(target.addr + kPage + 8, target.rkey, 1)}}) {
		SCOPED_TRACE(c.what);
		Pair &p = pairs[n++];
		EXPECT_EQ(run(c.wr, p.qp), IBV_WC_REM_ACCESS_ERR);
		expect_error_state_flushes(p.qp, cq_, src, target.addr, target.rkey);
		EXPECT_EQ(peer_qp_state(p.peer), IBV_QPS_ERR);
		EXPECT_EQ(dst->mismatches(0, kPage, kLocalFill), 0u) << "our buffer changed";
	}

	// A SEND into a receive buffer on the hole: the responder's receive
	// completes with a local protection error, the requester's with a remote
	// operation error.
	Pair &p = pairs[3];
	peer_post_recv(p.peer.id, target, kPage, 64, 55);
	SendWr s(4, IBV_WR_SEND, src->addr(), 32, src->lkey());
	EXPECT_EQ(run(s, p.qp), IBV_WC_REM_OP_ERR);
	auto wcs = peer_poll(pcq_, 1, 5s);
	ASSERT_EQ(wcs.size(), 1u);
	EXPECT_EQ(wcs[0].wr_id, 55u);
	EXPECT_EQ(wcs[0].status, IBV_WC_LOC_PROT_ERR) << status_str(wcs[0].status);

	// The pages around the hole still work, through the same MR.
	Pair &q = pairs[4];
	SendWr ok1(5, IBV_WR_RDMA_WRITE, src->addr(), 64, src->lkey());
	EXPECT_EQ(run(ok1.rdma(target.addr, target.rkey), q.qp), IBV_WC_SUCCESS);
	SendWr ok2(6, IBV_WR_RDMA_WRITE, src->addr(), 64, src->lkey());
	EXPECT_EQ(run(ok2.rdma(target.addr + 2 * kPage, target.rkey), q.qp), IBV_WC_SUCCESS);
	EXPECT_EQ(peer_bad_bytes(target, kSrcFill, 0, 64), 0u);
	EXPECT_EQ(peer_bad_bytes(target, kSrcFill, 2 * kPage, 64), 0u);
	EXPECT_EQ(peer_qp_state(q.peer), IBV_QPS_RTS);
}

// The requester's own ODP page is gone: a local protection error on the
// requester, found before the responder sees anything (its memory is
// untouched, its QP stays ready and its receive stays posted).
TEST_F(Odp, UnmappedRequesterPagesAreLocalProtectionErrors)
{
	PeerMr target = peer_mr(kPage, kAllAccess, kPeerFill);
	Buffer *local = me().odp_buffer(2 * kPage, IBV_ACCESS_LOCAL_WRITE);
	memset(local->data, kSrcFill, kPage);
	std::vector<Pair> pairs;
	for (int i = 0; i < 5; ++i)
		pairs.push_back(rc_pair(cq_, cq_, pcq_));
	ASSERT_EQ(munmap(local->data + kPage, kPage), 0);
	uint64_t hole = local->addr() + kPage;

	SendWr w(1, IBV_WR_RDMA_WRITE, hole, 64, local->lkey());
	SendWr r(2, IBV_WR_RDMA_READ, hole, 64, local->lkey());
	SendWr a(3, IBV_WR_ATOMIC_FETCH_AND_ADD, hole, 8, local->lkey());
	SendWr s(4, IBV_WR_SEND, hole - 16, 32, local->lkey());  // runs into the hole
	int n = 0;
	for (SendWr wr : {w.rdma(target.addr, target.rkey), r.rdma(target.addr, target.rkey),
			  a.atomic(target.addr, target.rkey, 1), s}) {
		Pair &p = pairs[n];
		SCOPED_TRACE("case " + std::to_string(n++));
		peer_post_recv(p.peer.id, target, 0, 64, 100 + n);
		EXPECT_EQ(run(wr, p.qp), IBV_WC_LOC_PROT_ERR);
		EXPECT_EQ(qp_state(p.qp), IBV_QPS_ERR);
		EXPECT_EQ(peer_qp_state(p.peer), IBV_QPS_RTS);
		EXPECT_TRUE(peer_poll(pcq_, 1, 100ms).empty()) << "the responder's receive was consumed";
		EXPECT_EQ(peer_bad_bytes(target), 0u) << "the responder's memory changed";
	}

	// The mapped page of the same MR still sends.
	Pair &p = pairs[4];
	peer_post_recv(p.peer.id, target, 0, 64, 200);
	SendWr ok(5, IBV_WR_SEND, local->addr(), 64, local->lkey());
	EXPECT_EQ(run(ok, p.qp), IBV_WC_SUCCESS);
	auto wcs = peer_poll(pcq_, 1, 5s);
	ASSERT_EQ(wcs.size(), 1u);
	EXPECT_EQ(wcs[0].wr_id, 200u);
	EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << status_str(wcs[0].status);
	EXPECT_EQ(peer_bad_bytes(target, kSrcFill, 0, 64), 0u);
}

// ibv_advise_mr: a prefetch of an ODP MR's mapped pages succeeds (sync or
// not, implicit or not); the errors are those of the kernel (mlx5).
TEST_F(Odp, AdviseMrPrefetchesOdpMrsAndRefusesWhatItCannot)
{
	Buffer *odp = me().odp_buffer(3 * kPage, IBV_ACCESS_LOCAL_WRITE);
	Buffer *implicit = me().odp_buffer(kPage, IBV_ACCESS_LOCAL_WRITE, true);
	Buffer *read_only = me().odp_buffer(kPage, 0);
	Buffer *pinned = me().buffer(kPage, IBV_ACCESS_LOCAL_WRITE, 0);
	ibv_pd *other_pd = me().new_pd();
	Buffer *other = me().odp_buffer(kPage, IBV_ACCESS_LOCAL_WRITE, false, other_pd);
	ASSERT_EQ(munmap(odp->data + kPage, kPage), 0);
	ibv_pd *pd = odp->mr->pd;
	auto advise = [&](ibv_advise_mr_advice advice, uint32_t flags, uint64_t addr, uint32_t len, uint32_t lkey) {
		ibv_sge sge{addr, len, lkey};
		return ibv_advise_mr(pd, advice, flags, &sge, 1);
	};
	constexpr uint32_t kSync = IBV_ADVISE_MR_FLAG_FLUSH;
	const uint64_t base = odp->addr(), hole = base + kPage;

	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, kSync, base, kPage, odp->lkey()), 0);
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH, kSync, base + 2 * kPage, 100, odp->lkey()), 0);
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH, 0, base, 3 * kPage, odp->lkey()), 0);  // async
	// Two SGEs at once.
	ibv_sge two[2] = {{base, 8, odp->lkey()}, {base + 2 * kPage, 8, odp->lkey()}};
	EXPECT_EQ(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, kSync, two, 2), 0);

	// The hole: a synchronous faulting prefetch fails; one that does not
	// fault, or is asynchronous, does not.
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH, kSync, hole, 8, odp->lkey()), EFAULT);
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, kSync, base, 2 * kPage, odp->lkey()), EFAULT);
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, kSync, hole, 8, odp->lkey()), 0);
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH, 0, hole, 8, odp->lkey()), 0);

	// Keys: not an ODP MR, another PD's, a write prefetch of a read-only MR,
	// no MR at all.
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH, kSync, pinned->addr(), 8, pinned->lkey()), ENOENT);
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH, kSync, other->addr(), 8, other->lkey()), ENOENT);
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH, kSync, read_only->addr(), 8, read_only->lkey()), 0);
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, kSync, read_only->addr(), 8, read_only->lkey()),
		  ENOENT);
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH, kSync, base, 8, 0xdead00), ENOENT);
	// The range: outside the MR, even asynchronously.
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH, kSync, base + 3 * kPage - 4, 8, odp->lkey()), EFAULT);
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH, 0, base - 8, 8, odp->lkey()), EFAULT);
	// The request itself: an unknown advice or flag, no SGE.
	EXPECT_EQ(advise(static_cast<ibv_advise_mr_advice>(7), kSync, base, 8, odp->lkey()), EOPNOTSUPP);
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH, 1u << 5, base, 8, odp->lkey()), EINVAL);
	EXPECT_EQ(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, kSync, two, 0), EINVAL);
	// A failed advice changed nothing: the MR still prefetches.
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, kSync, base, kPage, odp->lkey()), 0);

	// The implicit MR: anything mapped, nothing else.
	std::vector<uint8_t> heap(3 * kPage);
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, kSync, reinterpret_cast<uintptr_t>(heap.data()),
			 static_cast<uint32_t>(heap.size()), implicit->lkey()), 0);
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH, kSync, kNeverMapped, 8, implicit->lkey()), EFAULT);
	EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, kSync, kNeverMapped, 8, implicit->lkey()), 0);
}

}  // namespace
}  // namespace xsrc_traffic
