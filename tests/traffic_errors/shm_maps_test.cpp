// traffic_errors: RDMA on a peer's MR over SysV shared memory, which a
// same-user requester attaches and then reaches with loads, stores and CPU
// atomics (providers/xsrc/peer_shm.h): the bytes, the keys and the atomics
// behave as through the device (the fixture: traffic_fixture.h).
#include <fstream>

#include "traffic_fixture.h"

namespace xsrc_traffic {
namespace {

using ShmMaps = Traffic;

constexpr uint32_t kShmAccess =
	IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// SysV segments attached in this process (/proc/self/maps).
size_t sysv_mappings()
{
	std::ifstream maps("/proc/self/maps");
	size_t n = 0;
	for (std::string line; std::getline(maps, line);)
		n += line.find("/SYSV") != std::string::npos;
	return n;
}

PeerMr peer_shm_mr(Peer &peer, size_t size, uint32_t access, uint8_t fill)
{
	Msg r = peer.call(Msg("shm_mr").set("size", size).set("access", access).set("fill", fill));
	return {r.u64("id"), r.u64("addr"), static_cast<uint32_t>(r.u64("rkey")),
		static_cast<uint32_t>(r.u64("lkey")), r.u64("len")};
}

// One signaled work request on `qp`, and its status.
ibv_wc_status run(ibv_qp *qp, ibv_cq *cq, SendWr &w)
{
	if (w.post(qp) != 0)
		return IBV_WC_GENERAL_ERR;
	ibv_wc wc{};
	if (!one_completion(cq, &wc))
		return IBV_WC_GENERAL_ERR;
	return wc.status;
}

// WRITE, READ, fetch-and-add and compare-and-swap on a SysV segment of the
// peer: the right bytes move, nothing around them, and the segment is
// attached here (the loads-and-stores path, not a system call each).
TEST_F(ShmMaps, WriteReadAndAtomicsMoveTheRightBytes)
{
	size_t before = sysv_mappings();
	uint64_t pcq = peer_cq();
	ibv_cq *cq = me().cq(64);
	Pair p = rc_pair(cq, cq, pcq);
	PeerMr seg = peer_shm_mr(peer(), 1 << 16, kShmAccess, kPeerFill);
	Buffer *src = me().buffer(8192, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	Buffer *dst = me().buffer(8192, IBV_ACCESS_LOCAL_WRITE, kLocalFill);

	SendWr w(1, IBV_WR_RDMA_WRITE, src->addr(), 3000, src->lkey());
	w.rdma(seg.addr + 100, seg.rkey);
	ASSERT_EQ(run(p.qp, cq, w), IBV_WC_SUCCESS);
	std::string where;
	EXPECT_EQ(peer_bad_bytes(seg, kSrcFill, 100, 3000, &where), 0u) << where;
	EXPECT_EQ(peer_bad_bytes(seg, kPeerFill, 0, 100), 0u) << "bytes before the write";
	EXPECT_EQ(peer_bad_bytes(seg, kPeerFill, 3100), 0u) << "bytes after the write";
	EXPECT_EQ(sysv_mappings(), before + 1) << "the peer's segment is not attached here";

	SendWr r(2, IBV_WR_RDMA_READ, dst->addr(), 4000, dst->lkey());
	r.rdma(seg.addr + 3100, seg.rkey);
	ASSERT_EQ(run(p.qp, cq, r), IBV_WC_SUCCESS);
	EXPECT_EQ(dst->mismatches(0, 4000, kPeerFill), 0u);
	EXPECT_EQ(dst->mismatches(4000, 4192, kLocalFill), 0u) << "read past its length";

	const uint64_t word = 0xA5A5A5A5A5A5A5A5ull;
	SendWr faa(3, IBV_WR_ATOMIC_FETCH_AND_ADD, dst->addr(), 8, dst->lkey());
	faa.atomic(seg.addr + 8192, seg.rkey, 5);
	ASSERT_EQ(run(p.qp, cq, faa), IBV_WC_SUCCESS);
	uint64_t orig;
	std::memcpy(&orig, dst->data, 8);
	EXPECT_EQ(orig, word);
	EXPECT_EQ(peer().call(Msg("read64").set("mr", seg.id).set("off", 8192)).u64("value"), word + 5);

	SendWr cas(4, IBV_WR_ATOMIC_CMP_AND_SWP, dst->addr(), 8, dst->lkey());
	cas.atomic(seg.addr + 8192, seg.rkey, word + 5, 77);
	ASSERT_EQ(run(p.qp, cq, cas), IBV_WC_SUCCESS);
	EXPECT_EQ(peer().call(Msg("read64").set("mr", seg.id).set("off", 8192)).u64("value"), 77u);
	SendWr miss(5, IBV_WR_ATOMIC_CMP_AND_SWP, dst->addr(), 8, dst->lkey());
	miss.atomic(seg.addr + 8192, seg.rkey, 1, 99);
	ASSERT_EQ(run(p.qp, cq, miss), IBV_WC_SUCCESS);
	EXPECT_EQ(peer().call(Msg("read64").set("mr", seg.id).set("off", 8192)).u64("value"), 77u)
		<< "a compare that failed swapped";
	EXPECT_EQ(sysv_mappings(), before + 1) << "one segment, attached once";
}

// The MR over a segment we hold attached is deregistered: the next WRITE
// is a remote access error and the segment keeps its bytes.
TEST_F(ShmMaps, DeregisteredMrIsUnreachableThroughAHeldMapping)
{
	uint64_t pcq = peer_cq();
	ibv_cq *cq = me().cq(64);
	Pair p = rc_pair(cq, cq, pcq);
	PeerMr seg = peer_shm_mr(peer(), 1 << 16, kShmAccess, kPeerFill);
	Buffer *src = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	SendWr w(1, IBV_WR_RDMA_WRITE, src->addr(), 64, src->lkey());
	w.rdma(seg.addr, seg.rkey);
	ASSERT_EQ(run(p.qp, cq, w), IBV_WC_SUCCESS);
	ASSERT_EQ(peer_bad_bytes(seg, kSrcFill, 0, 64), 0u);

	peer().call(Msg("dereg").set("mr", seg.id));
	SendWr again(2, IBV_WR_RDMA_WRITE, src->addr(), 64, src->lkey());
	again.rdma(seg.addr + 64, seg.rkey);
	EXPECT_EQ(run(p.qp, cq, again), IBV_WC_REM_ACCESS_ERR);
	EXPECT_EQ(peer_bad_bytes(seg, kPeerFill, 64), 0u) << "a write reached a deregistered MR";
}

// A re-registration that takes REMOTE_WRITE away is seen by the very next
// WRITE, though the segment stays attached here.
TEST_F(ShmMaps, AccessTakenAwayByReregIsSeenAtOnce)
{
	uint64_t pcq = peer_cq();
	ibv_cq *cq = me().cq(64);
	Pair p = rc_pair(cq, cq, pcq);
	PeerMr seg = peer_shm_mr(peer(), 1 << 16, kShmAccess, kPeerFill);
	Buffer *src = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	SendWr w(1, IBV_WR_RDMA_WRITE, src->addr(), 64, src->lkey());
	w.rdma(seg.addr, seg.rkey);
	ASSERT_EQ(run(p.qp, cq, w), IBV_WC_SUCCESS);

	peer().call(Msg("rereg").set("mr", seg.id).set("flags", IBV_REREG_MR_CHANGE_ACCESS)
			    .set("access", IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
	SendWr again(2, IBV_WR_RDMA_WRITE, src->addr(), 64, src->lkey());
	again.rdma(seg.addr + 64, seg.rkey);
	EXPECT_EQ(run(p.qp, cq, again), IBV_WC_REM_ACCESS_ERR);
	EXPECT_EQ(peer_bad_bytes(seg, kPeerFill, 64), 0u) << "a write went past the access taken away";
}

// Fetch-and-adds on one counter in a peer's segment from this process
// (through the attached segment) and from a second requester with
// XSRC_SHM_MAPS=0 (a system call each): atomic with respect to each other,
// the counter ends at the exact sum and every original is seen once.
TEST_F(ShmMaps, AtomicsOnTheMappingAndThroughTheDeviceSumExactly)
{
	constexpr int kPairs = 2, kThreads = 2, k = 2000;
	const uint64_t per_process = uint64_t(kPairs) * kThreads * k;
	setenv("XSRC_SHM_MAPS", "0", 1);
	Peer other;  // the second requester, without mappings
	unsetenv("XSRC_SHM_MAPS");
	uint64_t pcq = peer_cq();
	PeerMr seg = peer_shm_mr(peer(), 4096, kShmAccess, 0);
	Buffer *results = me().buffer(per_process * 8, IBV_ACCESS_LOCAL_WRITE, 0xFF);
	TwoRequesters two = two_requesters(other, pcq, kPairs, per_process);
	size_t before = sysv_mappings();
	two.start(kThreads, k, seg.addr + 8, seg.rkey);
	HammerResult mine = faa_hammer(two.qps, two.cqs, kThreads, k, seg.addr + 8, seg.rkey,
				       reinterpret_cast<uint64_t *>(results->data), results->lkey(), 60s);
	HammerResult theirs = hammer_from_msg(other.reply(70s));
	expect_clean(mine, per_process, "test process (mapped)");
	expect_clean(theirs, per_process, "second requester (system calls)");
	EXPECT_EQ(sysv_mappings(), before + 1) << "this process did not use the segment";
	EXPECT_EQ(peer().call(Msg("read64").set("mr", seg.id).set("off", 8)).u64("value"), 2 * per_process)
		<< "final counter";
	std::vector<uint64_t> orig(reinterpret_cast<uint64_t *>(results->data),
				   reinterpret_cast<uint64_t *>(results->data) + per_process);
	two.add_originals(orig, per_process);
	EXPECT_TRUE(originals_are_a_permutation(orig));
	EXPECT_EQ(peer_bad_bytes(seg, 0, 0, 8), 0u) << "bytes before the counter";
	EXPECT_EQ(peer_bad_bytes(seg, 0, 16), 0u) << "bytes after the counter";
	two.finish();
}

// XSRC_SHM_MAPS=0: the same WRITE works and attaches nothing.
TEST_F(ShmMaps, TurnedOffAttachesNothing)
{
	me_.reset();  // our context reads the variable when it opens
	setenv("XSRC_SHM_MAPS", "0", 1);
	me_ = std::make_unique<Verbs>();
	unsetenv("XSRC_SHM_MAPS");
	size_t before = sysv_mappings();
	uint64_t pcq = peer_cq();
	ibv_cq *cq = me().cq(64);
	Pair p = rc_pair(cq, cq, pcq);
	PeerMr seg = peer_shm_mr(peer(), 1 << 16, kShmAccess, kPeerFill);
	Buffer *src = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	SendWr w(1, IBV_WR_RDMA_WRITE, src->addr(), 64, src->lkey());
	w.rdma(seg.addr, seg.rkey);
	ASSERT_EQ(run(p.qp, cq, w), IBV_WC_SUCCESS);
	EXPECT_EQ(peer_bad_bytes(seg, kSrcFill, 0, 64), 0u);
	EXPECT_EQ(sysv_mappings(), before);
}

}  // namespace
}  // namespace xsrc_traffic
