// traffic_errors: ibv_rereg_mr on the peer's MR while we hold its rkey — a
// new range, access or PD applies to our next access at once (the fixture:
// traffic_fixture.h).
#include "traffic_fixture.h"

namespace xsrc_traffic {
namespace {

constexpr size_t kPage = 4096;

class Rereg : public Traffic {
protected:
	void SetUp() override
	{
		Traffic::SetUp();
		pcq_ = peer_cq();
		// Three pages; the MR starts over the first.
		target_ = peer_mr(3 * kPage, kAllAccess, kPeerFill, 0, kPage);
		cq_ = me().cq(64);
		src_ = me().buffer(kPage, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	}

	// One RDMA WRITE of 64 bytes to `raddr` with `rkey` on a fresh pair.
	ibv_wc_status write64(uint64_t raddr, uint32_t rkey)
	{
		Pair p = rc_pair(cq_, cq_, pcq_);
		SendWr w(1, IBV_WR_RDMA_WRITE, src_->addr(), 64, src_->lkey());
		EXPECT_EQ(w.rdma(raddr, rkey).post(p.qp), 0);
		ibv_wc wc{};
		EXPECT_TRUE(one_completion(cq_, &wc));
		return wc.status;
	}

	Msg rereg(int flags, size_t off = 0, size_t len = 0, uint32_t access = 0, uint64_t pd = 0)
	{
		return peer().call(Msg("rereg").set("mr", target_.id).set("flags", flags).set("off", off)
					   .set("len", len).set("access", access).set("pd", pd));
	}

	uint64_t pcq_ = 0;
	PeerMr target_;
	ibv_cq *cq_ = nullptr;
	Buffer *src_ = nullptr;
};

// The key we hold reaches the new range, and no longer the old one.
TEST_F(Rereg, TranslationMovesWhatTheOldRkeyReaches)
{
	ASSERT_EQ(write64(target_.addr, target_.rkey), IBV_WC_SUCCESS);
	Msg r = rereg(IBV_REREG_MR_CHANGE_TRANSLATION, 2 * kPage, kPage);
	ASSERT_EQ(r.i64("rc"), 0) << "errno " << r.i64("errno");
	EXPECT_EQ(r.u64("rkey"), target_.rkey);  // keys stay, as an HCA's rereg in place
	uint64_t moved = target_.addr + 2 * kPage;
	EXPECT_EQ(r.u64("addr"), moved);

	EXPECT_EQ(write64(moved + 128, target_.rkey), IBV_WC_SUCCESS);
	EXPECT_EQ(peer_bad_bytes(target_, kSrcFill, 2 * kPage + 128, 64), 0u) << "bytes in the new range";
	EXPECT_EQ(write64(target_.addr + 256, target_.rkey), IBV_WC_REM_ACCESS_ERR);
	EXPECT_EQ(peer_bad_bytes(target_, kPeerFill, 64, 2 * kPage + 64), 0u) << "the old range changed";
	EXPECT_EQ(peer_bad_bytes(target_, kPeerFill, 2 * kPage + 192), 0u);
}

// Remote write taken away: REM_ACCESS_ERR and nothing written; given back: it works.
TEST_F(Rereg, AccessChangeAppliesAtOnce)
{
	Msg r = rereg(IBV_REREG_MR_CHANGE_ACCESS, 0, 0, IBV_ACCESS_LOCAL_WRITE);
	ASSERT_EQ(r.i64("rc"), 0) << "errno " << r.i64("errno");
	EXPECT_EQ(write64(target_.addr, target_.rkey), IBV_WC_REM_ACCESS_ERR);
	EXPECT_EQ(peer_bad_bytes(target_, kPeerFill), 0u) << "written without remote write access";
	r = rereg(IBV_REREG_MR_CHANGE_ACCESS, 0, 0, kAllAccess);
	ASSERT_EQ(r.i64("rc"), 0) << "errno " << r.i64("errno");
	EXPECT_EQ(write64(target_.addr, target_.rkey), IBV_WC_SUCCESS);
	EXPECT_EQ(peer_bad_bytes(target_, kSrcFill, 0, 64), 0u);
}

// In another PD than the peer's QP the MR is out of reach; moved back, in reach.
TEST_F(Rereg, PdChangeAppliesAtOnce)
{
	uint64_t other_pd = peer().call(Msg("pd")).u64("id");
	Msg r = rereg(IBV_REREG_MR_CHANGE_PD, 0, 0, 0, other_pd);
	ASSERT_EQ(r.i64("rc"), 0) << "errno " << r.i64("errno");
	EXPECT_EQ(write64(target_.addr, target_.rkey), IBV_WC_REM_ACCESS_ERR);
	EXPECT_EQ(peer_bad_bytes(target_, kPeerFill), 0u);
	r = rereg(IBV_REREG_MR_CHANGE_PD, 0, 0, 0, 0);
	ASSERT_EQ(r.i64("rc"), 0) << "errno " << r.i64("errno");
	EXPECT_EQ(write64(target_.addr, target_.rkey), IBV_WC_SUCCESS);
}

// Refusals as the kernel's (IBV_REREG_MR_ERR_CMD, errno says why); a refused
// rereg changes nothing.
TEST_F(Rereg, RefusalsChangeNothing)
{
	Msg r = rereg(0);
	EXPECT_EQ(r.i64("rc"), IBV_REREG_MR_ERR_CMD);
	EXPECT_EQ(r.i64("errno"), EINVAL) << "no flags";
	r = rereg(IBV_REREG_MR_CHANGE_ACCESS, 0, 0, IBV_ACCESS_REMOTE_WRITE);
	EXPECT_EQ(r.i64("rc"), IBV_REREG_MR_ERR_CMD);
	EXPECT_EQ(r.i64("errno"), EINVAL) << "remote write without local write";
	constexpr uint32_t kFlushGlobal = 1 << 8;  // the kernel's IB_UVERBS_ACCESS_FLUSH_GLOBAL (Linux 6.2)
	r = rereg(IBV_REREG_MR_CHANGE_ACCESS, 0, 0, IBV_ACCESS_LOCAL_WRITE | kFlushGlobal);
	EXPECT_EQ(r.i64("rc"), IBV_REREG_MR_ERR_CMD);
	EXPECT_EQ(r.i64("errno"), EOPNOTSUPP) << "flush access (no FLUSH here)";
	// Far past the peer's mappings (beyond the user address space).
	r = rereg(IBV_REREG_MR_CHANGE_TRANSLATION, size_t{1} << 47, kPage);
	EXPECT_NE(r.i64("rc"), 0);
	EXPECT_EQ(r.i64("errno"), EFAULT) << "a range the peer has not mapped";
	EXPECT_EQ(write64(target_.addr, target_.rkey), IBV_WC_SUCCESS) << "the MR as it was";
	EXPECT_EQ(write64(target_.addr + 2 * kPage, target_.rkey), IBV_WC_REM_ACCESS_ERR);
}

}  // namespace
}  // namespace xsrc_traffic
