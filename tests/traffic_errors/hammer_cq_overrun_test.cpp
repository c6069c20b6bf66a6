// traffic_errors: many requesters on one responder, and a CQ that overruns (the fixture: traffic_fixture.h).
#include "traffic_fixture.h"

namespace xsrc_traffic {
namespace {

// ===============================================================================
// 8. Hammer
// ===============================================================================

using Hammer = Traffic;

constexpr int kPairs = 4;
constexpr int kThreads = 2;
constexpr int kOps = 2000;

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
	TwoRequesters two = two_requesters(other, pcq, kPairs, per_process);
	two.start(kThreads, k, counter.addr + 8, counter.rkey);
	HammerResult mine = faa_hammer(two.qps, two.cqs, kThreads, k, counter.addr + 8, counter.rkey,
				       reinterpret_cast<uint64_t *>(results->data), results->lkey(), 60s);
	HammerResult theirs = hammer_from_msg(other.reply(70s));
	expect_clean(mine, per_process, "test process");
	expect_clean(theirs, per_process, "second requester process");
	EXPECT_EQ(peer().call(Msg("read64").set("mr", counter.id).set("off", 8)).u64("value"), 2 * per_process)
		<< "final counter";
	std::vector<uint64_t> orig(reinterpret_cast<uint64_t *>(results->data),
				   reinterpret_cast<uint64_t *>(results->data) + per_process);
	two.add_originals(orig, per_process);
	EXPECT_TRUE(originals_are_a_permutation(orig));
	two.finish();
}

// As FetchAddOneCounter with most atomics unsignaled (every 8th signaled):
// the device runs them in batches (one read and one write of the words for
// many), spread over four words 64 bytes apart, while a second process
// hammers word 0 one signaled atomic at a time. Every word sums exactly, and
// word 0's originals, from both processes, are a permutation.
TEST_F(Hammer, FetchAddBatchesAgainstSingleOps)
{
	constexpr int k = 2000, kWords = 4, kEvery = 8;
	const uint64_t mine_total = uint64_t(kPairs) * kThreads * k;
	const uint64_t theirs_total = uint64_t(kPairs) * kThreads * (k / 2);
	Peer other;  // the second requester: one op at a time
	uint64_t pcq = peer_cq();
	PeerMr counter = peer_mr(4096, kAllAccess, 0);
	Buffer *results = me().buffer(mine_total * 8, IBV_ACCESS_LOCAL_WRITE, 0xFF);
	TwoRequesters two = two_requesters(other, pcq, kPairs, theirs_total, 128);
	two.start(kThreads, k / 2, counter.addr, counter.rkey);
	HammerResult mine = faa_hammer(two.qps, two.cqs, kThreads, k, counter.addr, counter.rkey,
				       reinterpret_cast<uint64_t *>(results->data), results->lkey(), 60s, 48, kEvery,
				       kWords);
	HammerResult theirs = hammer_from_msg(other.reply(70s));
	// Signaled: every kEvery-th op of a thread (k is a multiple of it).
	{
		SCOPED_TRACE("batched process");
		EXPECT_FALSE(mine.timed_out) << mine.first_problem;
		EXPECT_EQ(mine.posted, mine_total);
		EXPECT_EQ(mine.completions, mine_total / kEvery) << "signaled completions lost or duplicated";
		EXPECT_EQ(mine.errors + mine.wrong_opcode + mine.unknown + mine.duplicates + mine.missing, 0u)
			<< mine.first_problem;
	}
	expect_clean(theirs, theirs_total, "single-op process");
	const uint64_t per_word = mine_total / kWords;
	for (int w = 0; w < kWords; ++w) {
		uint64_t want = per_word + (w == 0 ? theirs_total : 0);
		EXPECT_EQ(peer().call(Msg("read64").set("mr", counter.id).set("off", 64 * w)).u64("value"), want)
			<< "word " << w;
		EXPECT_EQ(peer_bad_bytes(counter, 0, 64 * w + 8, 56), 0u) << "bytes after word " << w;
	}
	const uint64_t *r = reinterpret_cast<const uint64_t *>(results->data);
	for (int w = 0; w < kWords; ++w) {
		std::vector<uint64_t> orig;
		for (uint64_t i = 0; i < mine_total; ++i)
			if (static_cast<int>(i % k) % kWords == w)
				orig.push_back(r[i]);
		if (w == 0)
			two.add_originals(orig, theirs_total);
		EXPECT_TRUE(originals_are_a_permutation(orig)) << "word " << w;
	}
	two.finish();
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
	auto wcs = poll_completions(cq, static_cast<size_t>(sends), 5s);
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

// A CQ filled to exactly its cqe is no overrun, although its consumer (the
// peer) may publish its head lazily (driver ABI revision 10): the peer takes
// fewer than cqe / 2 completions, which it need not publish yet, then we
// send a whole cqe more. Our provider of revision 10 finds the room in the
// ring's slots; run as compat_r1_cq_heads (this process on the revision-1
// provider, which trusts the head; the peer on today's, through
// XSRC_PEER_RDMAV_DRIVERS), the daemon counts our context and the peer
// publishes its head at every poll.
TEST_F(CqOverrun, AFullCqIsNoOverrunWhateverTheProducersRevision)
{
	int actual = 0;
	uint64_t pcq = peer_cq(16, false, &actual);
	ASSERT_GE(actual, 16);
	const int lag = actual / 2 - 1;
	const int total = lag + actual;
	PeerMr rbuf = peer_mr(64 * size_t(total), IBV_ACCESS_LOCAL_WRITE, 0x77);
	auto [cq, buf] = sender();
	PairOpts o;
	o.peer_max_recv_wr = static_cast<uint32_t>(total);
	o.caps.max_send_wr = static_cast<uint32_t>(actual);
	Pair p = rc_pair(cq, cq, pcq, o);
	peer_post_recv(p.peer.id, rbuf, 0, 64, 0, static_cast<size_t>(total), 64);
	auto send = [&](int first, int count) {
		for (int i = first; i < first + count; ++i) {
			SendWr s(static_cast<uint64_t>(i), IBV_WR_SEND, buf->addr(), 16, buf->lkey());
			ASSERT_EQ(s.post(p.qp), 0);
		}
		auto wcs = poll_completions(cq, static_cast<size_t>(count), 5s);
		ASSERT_EQ(wcs.size(), static_cast<size_t>(count)) << describe(wcs);
		for (auto &w : wcs)
			EXPECT_EQ(w.status, IBV_WC_SUCCESS) << describe(wcs);
	};
	send(0, lag);
	auto taken = peer_poll(pcq, static_cast<size_t>(lag), 5s);
	ASSERT_EQ(taken.size(), static_cast<size_t>(lag)) << describe(taken);
	send(lag, actual);
	auto polled = peer_poll(pcq, static_cast<size_t>(actual), 5s);
	ASSERT_EQ(polled.size(), static_cast<size_t>(actual)) << describe(polled);
	for (int i = 0; i < actual; ++i) {
		EXPECT_EQ(polled[i].status, IBV_WC_SUCCESS) << describe(polled);
		EXPECT_EQ(polled[i].wr_id, uint64_t(lag + i)) << "receive completions in posting order";
	}
	Msg ev = peer().call(Msg("async_wait").set("type", static_cast<int>(IBV_EVENT_CQ_ERR))
				     .set("timeout_ms", 300).set("cq", pcq), 10s);
	EXPECT_EQ(ev.u64("got"), 0u) << "IBV_EVENT_CQ_ERR on a CQ that never held more than its cqe";
}

}  // namespace
}  // namespace xsrc_traffic
