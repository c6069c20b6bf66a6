// traffic_errors: device memory (ibv_alloc_dm, ibv_reg_dm_mr) in traffic
// between two processes — zero-based DM MRs as the source and target of
// RDMA, SENDs and READs, the DM's contents afterwards, and what HCAs refuse
// (the fixture: traffic_fixture.h).
#include "traffic_fixture.h"

namespace xsrc_traffic {
namespace {

constexpr size_t kDmSize = 4096;

class Dm : public Traffic {
protected:
	void SetUp() override
	{
		Traffic::SetUp();
		pcq_ = peer_cq();
		cq_ = me().cq(64);
	}

	// One signaled WR on a fresh RC pair; its completion status.
	ibv_wc_status run(SendWr &w)
	{
		Pair p = rc_pair(cq_, cq_, pcq_);
		EXPECT_EQ(w.post(p.qp), 0);
		ibv_wc wc{};
		EXPECT_TRUE(one_completion(cq_, &wc));
		return wc.status;
	}

	// Bytes of our DM's [off, off + len) that differ from `fill`.
	size_t dm_bad_bytes(ibv_dm *dm, uint8_t fill, size_t off, size_t len)
	{
		std::vector<uint8_t> bytes(kDmSize);
		EXPECT_EQ(ibv_memcpy_from_dm(bytes.data(), dm, 0, kDmSize), 0);
		return static_cast<size_t>(std::count_if(bytes.begin() + off, bytes.begin() + off + len,
							 [fill](uint8_t b) { return b != fill; }));
	}

	uint64_t pcq_ = 0;
	ibv_cq *cq_ = nullptr;
};

// Our DM as the source of a WRITE and a SEND and the target of a READ
// (addresses are offsets: the MR is zero based); the DM keeps what came in.
TEST_F(Dm, ZeroBasedDmMrIsSourceAndTargetOfTraffic)
{
	Verbs::DevMem dm = me().dev_mem(kDmSize, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	PeerMr target = peer_mr(kDmSize, kAllAccess);

	SendWr write(1, IBV_WR_RDMA_WRITE, 64, 256, dm.mr->lkey);
	ASSERT_EQ(run(write.rdma(target.addr, target.rkey)), IBV_WC_SUCCESS);
	EXPECT_EQ(peer_bad_bytes(target, kSrcFill, 0, 256), 0u) << "the WRITE's bytes";
	EXPECT_EQ(peer_bad_bytes(target, kPeerFill, 256), 0u) << "past the WRITE";

	SendWr read(2, IBV_WR_RDMA_READ, 1024, 512, dm.mr->lkey);
	ASSERT_EQ(run(read.rdma(target.addr + 2048, target.rkey)), IBV_WC_SUCCESS);
	EXPECT_EQ(dm_bad_bytes(dm.dm, kPeerFill, 1024, 512), 0u) << "the READ's bytes in the DM";
	EXPECT_EQ(dm_bad_bytes(dm.dm, kSrcFill, 0, 1024), 0u) << "the DM before them";
	EXPECT_EQ(dm_bad_bytes(dm.dm, kSrcFill, 1536, kDmSize - 1536), 0u) << "the DM after them";

	PeerMr sink = peer_mr(kDmSize, IBV_ACCESS_LOCAL_WRITE);
	Pair p = rc_pair(cq_, cq_, pcq_);
	peer_post_recv(p.peer.id, sink, 0, kDmSize, 7);
	SendWr send(3, IBV_WR_SEND, 1024, 100, dm.mr->lkey);
	ASSERT_EQ(send.post(p.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq_, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_EQ(peer_bad_bytes(sink, kPeerFill, 0, 100), 0u) << "the SEND carried the DM's bytes";
}

// The peer's DM through its rkey: a WRITE inside lands at the offset; one
// past the MR is REM_ACCESS_ERR and writes nothing.
TEST_F(Dm, PeerDmTakesRemoteWritesWithinItsMr)
{
	Msg r = peer().call(Msg("dm_mr").set("size", kDmSize).set("len", 2048)
				    .set("access", IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
				    .set("fill", kPeerFill));
	uint64_t id = r.u64("id");
	auto rkey = static_cast<uint32_t>(r.u64("rkey"));
	Buffer *src = me().buffer(kDmSize, IBV_ACCESS_LOCAL_WRITE, kSrcFill);

	SendWr in(1, IBV_WR_RDMA_WRITE, src->addr(), 256, src->lkey());
	ASSERT_EQ(run(in.rdma(128, rkey)), IBV_WC_SUCCESS);
	EXPECT_EQ(peer().call(Msg("dm_check").set("dm", id).set("fill", kSrcFill).set("off", 128).set("len", 256))
			  .u64("bad"), 0u);
	SendWr past(2, IBV_WR_RDMA_WRITE, src->addr(), 256, src->lkey());
	EXPECT_EQ(run(past.rdma(2048 - 128, rkey)), IBV_WC_REM_ACCESS_ERR);
	EXPECT_EQ(peer().call(Msg("dm_check").set("dm", id).set("fill", kPeerFill).set("off", 384)).u64("bad"), 0u)
		<< "written past the DM MR";
}

// An SGE past the DM MR is ours to refuse; a zero-length DM MR reaches nothing.
TEST_F(Dm, LocalAccessOutsideTheDmMrIsLocProtErr)
{
	Verbs::DevMem dm = me().dev_mem(kDmSize, IBV_ACCESS_LOCAL_WRITE, kSrcFill, 0, 1024);
	PeerMr target = peer_mr(kDmSize, kAllAccess);
	SendWr past(1, IBV_WR_RDMA_WRITE, 1000, 100, dm.mr->lkey);
	EXPECT_EQ(run(past.rdma(target.addr, target.rkey)), IBV_WC_LOC_PROT_ERR);

	ibv_mr *empty = ibv_reg_dm_mr(me().pd, dm.dm, 0, 0, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(empty, nullptr) << strerror(errno);
	EXPECT_EQ(empty->length, 0u);
	SendWr through(2, IBV_WR_RDMA_WRITE, 0, 8, empty->lkey);
	EXPECT_EQ(run(through.rdma(target.addr, target.rkey)), IBV_WC_LOC_PROT_ERR);
	EXPECT_EQ(ibv_dereg_mr(empty), 0);
	EXPECT_EQ(peer_bad_bytes(target, kPeerFill), 0u) << "something was written";
}

// What HCAs refuse: sizes past max_dm_size, unknown comp_mask bits,
// unaligned or out-of-range copies, MRs that are not zero based or overrun
// the DM.
TEST_F(Dm, RefusesWhatHcasRefuse)
{
	ibv_device_attr_ex attr{};
	ASSERT_EQ(ibv_query_device_ex(me().ctx, nullptr, &attr), 0);
	ASSERT_GE(attr.max_dm_size, kDmSize);

	ibv_alloc_dm_attr too_big{};
	too_big.length = attr.max_dm_size + 1;
	errno = 0;
	EXPECT_EQ(ibv_alloc_dm(me().ctx, &too_big), nullptr);
	EXPECT_EQ(errno, ENOMEM);
	ibv_alloc_dm_attr bad_mask{};
	bad_mask.length = kDmSize;
	bad_mask.comp_mask = 1;
	errno = 0;
	EXPECT_EQ(ibv_alloc_dm(me().ctx, &bad_mask), nullptr);
	EXPECT_EQ(errno, EINVAL);

	Verbs::DevMem dm = me().dev_mem(kDmSize, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	std::vector<uint8_t> bytes(kDmSize + 8, 0);
	EXPECT_EQ(ibv_memcpy_to_dm(dm.dm, 1, bytes.data(), 8), EINVAL) << "unaligned offset";
	EXPECT_EQ(ibv_memcpy_to_dm(dm.dm, 0, bytes.data(), 6), EINVAL) << "unaligned length";
	EXPECT_EQ(ibv_memcpy_to_dm(dm.dm, kDmSize - 4, bytes.data(), 8), EFAULT) << "past the end";
	EXPECT_EQ(ibv_memcpy_from_dm(bytes.data(), dm.dm, kDmSize + 4, 4), EFAULT) << "past the end";
	EXPECT_EQ(dm_bad_bytes(dm.dm, kSrcFill, 0, kDmSize), 0u) << "a refused copy changed the DM";

	errno = 0;
	EXPECT_EQ(ibv_reg_dm_mr(me().pd, dm.dm, 0, 64, IBV_ACCESS_LOCAL_WRITE), nullptr) << "not zero based";
	EXPECT_EQ(errno, EINVAL);
	errno = 0;
	EXPECT_EQ(ibv_reg_dm_mr(me().pd, dm.dm, 64, kDmSize, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE),
		  nullptr) << "past the DM";
	EXPECT_EQ(errno, EINVAL);
}

}  // namespace
}  // namespace xsrc_traffic
