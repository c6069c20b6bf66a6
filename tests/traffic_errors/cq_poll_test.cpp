// traffic_errors: polling a CQ — an empty poll looks at the next slot without
// the CQ's lock (cq.cpp: cq_looks_empty), so what the lock used to make
// plain is asserted here: a resize that moves the ring, and several
// threads polling one CQ (the fixture: traffic_fixture.h).
#include "traffic_fixture.h"

#include <atomic>
#include <thread>

namespace xsrc_traffic {
namespace {

// Our RC QP whose send CQ (of `cqe`) is the one polled, RDMA WRITEs of 8
// bytes from `src` into the peer's `dst`.
class CqPoll : public Traffic {
protected:
	void writer(int cqe, uint32_t max_send_wr)
	{
		uint64_t pcq = peer_cq();
		dst = peer_mr(4096, kAllAccess);
		cq = me().cq(cqe);
		src = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
		PairOpts o;
		o.caps.max_send_wr = max_send_wr;
		qp = rc_pair(cq, cq, pcq, o).qp;
	}
	int post_write(uint64_t wr_id)
	{
		SendWr w(wr_id, IBV_WR_RDMA_WRITE, src->addr(), 8, src->lkey());
		w.rdma(dst.addr, dst.rkey);
		return w.post(qp);
	}
	// Signaled writes, wr_ids from `first` on.
	void post_writes(uint64_t first, int count)
	{
		for (int i = 0; i < count; ++i)
			ASSERT_EQ(post_write(first + static_cast<uint64_t>(i)), 0) << "write " << first + i;
	}

	PeerMr dst;
	ibv_cq *cq = nullptr;
	Buffer *src = nullptr;
	ibv_qp *qp = nullptr;
};

// Completions left in the ring a resize moved away from come first, then
// those of the new ring; a poll between finds what is there, and an empty
// CQ polls empty both before and after the move.
TEST_F(CqPoll, ResizeThatMovesTheRingKeepsEveryCompletionInOrder)
{
	writer(16, 64);

	ibv_wc wc[4];
	EXPECT_EQ(ibv_poll_cq(cq, 4, wc), 0) << "a new CQ polls empty";
	post_writes(0, 8);
	// One taken before the move: the poll's view of the ring is set up.
	auto first = poll_completions(cq, 1, 5s);
	ASSERT_EQ(first.size(), 1u);
	EXPECT_EQ(first[0].wr_id, 0u);
	ASSERT_EQ(ibv_resize_cq(cq, 200), 0);
	ASSERT_GE(cq->cqe, 200);
	// What the old ring holds, with nothing in the new one yet.
	auto wcs = poll_completions(cq, 7, 5s);
	ASSERT_EQ(wcs.size(), 7u) << "the old ring's completions after the move:" << describe(wcs);
	post_writes(8, 8);
	auto more = poll_completions(cq, 8, 5s);
	ASSERT_EQ(more.size(), 8u) << describe(more);
	wcs.insert(wcs.end(), more.begin(), more.end());
	for (size_t i = 0; i < wcs.size(); ++i) {
		EXPECT_EQ(wcs[i].wr_id, i + 1) << "completion " << i << ":" << describe(wcs);
		EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS) << "completion " << i;
	}
	EXPECT_EQ(ibv_poll_cq(cq, 4, wc), 0) << "drained after the move";
	post_writes(16, 1);
	auto last = poll_completions(cq, 1, 5s);
	ASSERT_EQ(last.size(), 1u) << "a completion after the move and an empty poll";
	EXPECT_EQ(last[0].wr_id, 16u);
	EXPECT_EQ(ibv_poll_cq(cq, 4, wc), 0);
}

// Two threads poll one CQ while a third posts: each completion is taken
// exactly once, none is lost, and the CQ polls empty at the end.
TEST_F(CqPoll, TwoThreadsPollingOneCqTakeEachCompletionOnce)
{
	constexpr int kWrites = 20000;
	constexpr int kInFlight = 64;
	writer(256, 128);

	std::atomic<int> taken{0};
	std::atomic<bool> failed{false};
	std::vector<uint64_t> seen[2];
	auto poller = [&](int me_index) {
		ibv_wc wc[4];
		auto deadline = std::chrono::steady_clock::now() + 60s;
		while (taken.load() < kWrites && std::chrono::steady_clock::now() < deadline) {
			int n = ibv_poll_cq(cq, 4, wc);
			if (n < 0) {
				failed = true;
				return;
			}
			for (int i = 0; i < n; ++i) {
				if (wc[i].status != IBV_WC_SUCCESS)
					failed = true;
				seen[me_index].push_back(wc[i].wr_id);
			}
			taken += n;
		}
	};
	std::thread a(poller, 0), b(poller, 1);
	auto deadline = std::chrono::steady_clock::now() + 60s;
	for (int posted = 0; posted < kWrites && std::chrono::steady_clock::now() < deadline;) {
		if (posted - taken.load() >= kInFlight)
			continue;
		if (post_write(static_cast<uint64_t>(posted))) {
			failed = true;
			break;
		}
		++posted;
	}
	a.join();
	b.join();
	EXPECT_FALSE(failed) << "a poll or post failed, or a completion was not a success";
	std::vector<uint64_t> all(seen[0]);
	all.insert(all.end(), seen[1].begin(), seen[1].end());
	std::sort(all.begin(), all.end());
	ASSERT_EQ(all.size(), static_cast<size_t>(kWrites));
	for (size_t i = 0; i < all.size(); ++i)
		ASSERT_EQ(all[i], i) << "wr_id " << i << " taken twice or never";
	ibv_wc wc[4];
	EXPECT_EQ(ibv_poll_cq(cq, 4, wc), 0);
	printf("two pollers took %zu and %zu completions\n", seen[0].size(), seen[1].size());
}

}  // namespace
}  // namespace xsrc_traffic
