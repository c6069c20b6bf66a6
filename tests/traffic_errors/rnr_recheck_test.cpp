// traffic_errors: a sender that outruns a receiver which reposts as it polls
// (the fixture: traffic_fixture.h). RC: the SEND that found no receive is
// retried as soon as one is posted (the requester watches the queue while
// it polls), not after the responder's RNR timer; a poll with no receive
// posted shortens nothing, so rnr_retry counts as before. UD: a datagram
// for a queue that ran dry is held a moment for a repost, then dropped.
// Every message that arrives is intact and arrives once.
#include "traffic_fixture.h"

namespace xsrc_traffic {
namespace {

using RnrRecheck = Traffic;

constexpr uint32_t kMsg = 1024;
constexpr uint64_t kSlot = 2048;
constexpr uint64_t kSlots = 16;     // a small ring: the sender runs it dry all the time
constexpr uint32_t kGrh = 40;
constexpr uint32_t kUdQkey = 0x11111111;

// Message `id`'s bytes as peer.cpp's payload_ok() checks them.
Buffer *hammer_messages(Verbs &me, uint64_t count)
{
	Buffer *msgs = me.buffer(count * kMsg, IBV_ACCESS_LOCAL_WRITE, 0);
	for (uint64_t id = 0; id < count; ++id) {
		uint8_t *p = msgs->data + id * kMsg;
		uint32_t a = static_cast<uint32_t>(id), b = ~a;
		memcpy(p, &a, 4);
		memcpy(p + 4, &b, 4);
		for (uint32_t j = 8; j < kMsg; ++j)
			p[j] = static_cast<uint8_t>(a * 7 + j);
	}
	return msgs;
}

struct Streamed {
	uint64_t completions = 0, errors = 0;
	bool gave_up = false;
	std::string first_problem;
};

// Posts `total` SENDs (wr_id = message id), at most `window` unfinished,
// polling `cq` between posts, until all completed or `deadline`.
Streamed stream_sends(ibv_qp *qp, ibv_cq *cq, Buffer *msgs, uint64_t total, int window, Clock::time_point deadline,
		      ibv_ah *ah = nullptr, uint32_t remote_qpn = 0)
{
	Streamed r;
	uint64_t next = 0;
	int outstanding = 0;
	while (next < total || outstanding > 0) {
		if (Clock::now() >= deadline) {
			r.gave_up = true;
			break;
		}
		while (next < total && outstanding < window) {
			SendWr s(next, IBV_WR_SEND, msgs->addr() + next * kMsg, kMsg, msgs->lkey());
			if (ah)
				s.ud(ah, remote_qpn, kUdQkey);
			if (s.post(qp)) {
				r.gave_up = true;
				r.first_problem = "post_send failed at message " + std::to_string(next);
				return r;
			}
			++next;
			++outstanding;
		}
		ibv_wc wc[16];
		int n = ibv_poll_cq(cq, 16, wc);
		for (int i = 0; i < n; ++i) {
			++r.completions;
			--outstanding;
			if (wc[i].status != IBV_WC_SUCCESS && r.errors++ == 0)
				r.first_problem = "wr_id " + std::to_string(wc[i].wr_id) + " " + status_str(wc[i].status);
		}
	}
	return r;
}

// The responder's RNR timer is half a second (code 31) and its SRQ holds 16
// receives, which it reposts as it polls (napping when it finds nothing).
// Thousands of SENDs through it finish in seconds: each one that ran the
// queue dry went as soon as a receive was back, and every message arrived
// once and whole.
TEST_F(RnrRecheck, RcSenderWaitsForTheRepostNotTheTimer)
{
	constexpr uint64_t kTotal = 4000;
	uint64_t pcq = peer_cq(1024);
	uint64_t srq = peer().call(Msg("srq").set("max_wr", kSlots)).u64("id");
	PeerMr slots = peer_mr(kSlot * kSlots, IBV_ACCESS_LOCAL_WRITE, 0);
	peer_post_srq_recv(srq, slots, 0, kSlot, 0, kSlots, kSlot);
	Buffer *msgs = hammer_messages(me(), kTotal);
	ibv_cq *cq = me().cq(256);
	PairOpts o = rnr_opts(7, 31);  // 491.52 ms a wait: a few of them would blow the deadline
	o.caps.max_send_wr = 128;
	o.peer_srq = static_cast<int64_t>(srq);
	Pair p = rc_pair(cq, cq, pcq, o);
	peer().send(Msg("srq_sink").set("cq", pcq).set("srq", srq).set("mr", slots.id).set("slot", kSlot)
			    .set("slots", kSlots).set("expected", kTotal).set("msg_len", kMsg)
			    .set("timeout_ms", 30000).set("linger_ms", 300));
	auto t0 = Clock::now();
	Streamed r = stream_sends(p.qp, cq, msgs, kTotal, 128, t0 + 25s);
	auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
	peer().send(Msg("stop"));
	Msg sink = peer().reply(40s);

	EXPECT_FALSE(r.gave_up) << "not done after " << took.count() << " ms: " << r.completions
				<< " completions; " << r.first_problem;
	EXPECT_EQ(r.completions, kTotal);
	EXPECT_EQ(r.errors, 0u) << r.first_problem;
	EXPECT_EQ(sink.u64("received"), kTotal) << sink.str("first_problem");
	EXPECT_EQ(sink.u64("once"), kTotal) << "messages received exactly once";
	EXPECT_EQ(sink.u64("dup"), 0u);
	EXPECT_EQ(sink.u64("missing"), 0u) << "e.g. ids " << sink.str("missing_ids");
	EXPECT_EQ(sink.u64("bad_len"), 0u) << sink.str("first_problem");
	EXPECT_EQ(sink.u64("bad_payload"), 0u) << sink.str("first_problem");
	EXPECT_EQ(sink.u64("repost_fail"), 0u);
}

// With no receive posted at all, polling the send CQ does not shorten the
// RNR waits: 3 retries of 10.24 ms still take ~30 ms, then
// RNR_RETRY_EXC_ERR, and nothing was delivered.
TEST_F(RnrRecheck, PollingWithoutAReceiveKeepsTheTimer)
{
	uint64_t pcq = peer_cq();
	auto [cq, buf] = sender();
	PairOpts o = rnr_opts(3, 20);  // 10.24 ms
	Pair p = rc_pair(cq, cq, pcq, o);
	auto t0 = Clock::now();
	SendWr s(1, IBV_WR_SEND, buf->addr(), 64, buf->lkey());
	ASSERT_EQ(s.post(p.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(cq, &wc, 5s));  // polls all along
	auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0);
	EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR) << status_str(wc.status);
	EXPECT_GE(elapsed.count(), 3 * 10240 - 500) << "3 RNR waits of 10.24 ms";
	EXPECT_TRUE(peer_poll(pcq, 1, 50ms).empty());
}

// UD: a datagram for a queue whose receives ran out is held a moment and
// dropped when none is posted meanwhile (the sender completes SUCCESS);
// it is not kept for a receive posted later, which takes the next datagram.
TEST_F(RnrRecheck, UdHeldDatagramIsDroppedWithoutARepost)
{
	Msg cq = peer().call(Msg("cq").set("cqe", 64));
	uint64_t pcq = cq.u64("id");
	Msg pqp = peer().call(Msg("qp").set("type", "ud").set("cq", pcq).set("max_recv_wr", 16));
	uint32_t pqpn = static_cast<uint32_t>(pqp.u64("qpn"));
	peer().call(Msg("ud_up").set("qp", pqp.u64("id")).set("qkey", kUdQkey));
	PeerMr rbuf = peer_mr(4 * 4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	peer().call(Msg("post_recv").set("qp", pqp.u64("id")).set("mr", rbuf.id).set("off", 0).set("len", 4096)
			    .set("count", 1).set("stride", 4096).set("wr_id", 100));
	ibv_cq *mycq = me().cq(64);
	ibv_qp *qp = me().qp(IBV_QPT_UD, mycq, mycq);
	ud_connect(qp, 0x22222222);
	ibv_ah *ah = me().ah(peer().gid);
	Buffer *src = me().buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill);

	for (uint64_t id : {1, 2}) {  // the first takes the receive, the second finds none
		SendWr s(id, IBV_WR_SEND, src->addr(), 64, src->lkey());
		ASSERT_EQ(s.ud(ah, pqpn, kUdQkey).post(qp), 0);
		ibv_wc wc{};
		ASSERT_TRUE(one_completion(mycq, &wc, 5s)) << "datagram " << id << " never completed";
		EXPECT_EQ(wc.wr_id, id);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	}
	auto got = peer_poll(pcq, 2, 300ms);
	ASSERT_EQ(got.size(), 1u) << describe(got);
	EXPECT_EQ(got[0].wr_id, 100u);
	peer().call(Msg("post_recv").set("qp", pqp.u64("id")).set("mr", rbuf.id).set("off", 4096).set("len", 4096)
			    .set("count", 1).set("stride", 4096).set("wr_id", 101));
	EXPECT_TRUE(peer_poll(pcq, 1, 100ms).empty()) << "a dropped datagram was kept for later";
	SendWr s(3, IBV_WR_SEND, src->addr(), 128, src->lkey());
	ASSERT_EQ(s.ud(ah, pqpn, kUdQkey).post(qp), 0);
	got = peer_poll(pcq, 1, 5s);
	ASSERT_EQ(got.size(), 1u);
	EXPECT_EQ(got[0].wr_id, 101u);
	EXPECT_EQ(got[0].byte_len, 128u + kGrh);
}

// UD into an SRQ of 16 receives that the receiver reposts as it polls
// (napping when it finds nothing): datagrams that find the queue dry wait
// for the repost, so most arrive (dropping each at once lost nearly all),
// and each that arrives is whole and arrives once.
TEST_F(RnrRecheck, UdSenderOutrunningARepostingReceiver)
{
	constexpr uint64_t kTotal = 4000;
	uint64_t pcq = peer_cq(1024);
	uint64_t srq = peer().call(Msg("srq").set("max_wr", kSlots)).u64("id");
	PeerMr slots = peer_mr(kSlot * kSlots, IBV_ACCESS_LOCAL_WRITE, 0);
	peer_post_srq_recv(srq, slots, 0, kSlot, 0, kSlots, kSlot);
	Msg pqp = peer().call(Msg("qp").set("type", "ud").set("cq", pcq).set("srq", srq));
	uint32_t pqpn = static_cast<uint32_t>(pqp.u64("qpn"));
	peer().call(Msg("ud_up").set("qp", pqp.u64("id")).set("qkey", kUdQkey));
	Buffer *msgs = hammer_messages(me(), kTotal);
	ibv_cq *cq = me().cq(256);
	QpCaps caps;
	caps.max_send_wr = 128;  // room for the window, whatever waits in it
	ibv_qp *qp = me().qp(IBV_QPT_UD, cq, cq, caps);
	ud_connect(qp, 0x22222222);
	ibv_ah *ah = me().ah(peer().gid);
	peer().send(Msg("srq_sink").set("cq", pcq).set("srq", srq).set("mr", slots.id).set("slot", kSlot)
			    .set("slots", kSlots).set("expected", kTotal).set("msg_len", kMsg).set("head", kGrh)
			    .set("timeout_ms", 30000).set("linger_ms", 300));
	Streamed r = stream_sends(qp, cq, msgs, kTotal, 64, Clock::now() + 25s, ah, pqpn);
	peer().send(Msg("stop"));
	Msg sink = peer().reply(40s);

	EXPECT_FALSE(r.gave_up) << r.completions << " completions; " << r.first_problem;
	EXPECT_EQ(r.completions, kTotal) << "a datagram's send completes, delivered or dropped";
	EXPECT_EQ(r.errors, 0u) << r.first_problem;
	uint64_t received = sink.u64("received");
	RecordProperty("received", std::to_string(received));
	EXPECT_GE(received, kTotal / 2) << "most datagrams were dropped though the receiver reposts";
	EXPECT_EQ(sink.u64("once"), received) << "every datagram that arrived is whole and arrived once";
	EXPECT_EQ(sink.u64("dup"), 0u);
	EXPECT_EQ(sink.u64("bad_status"), 0u) << sink.str("first_problem");
	EXPECT_EQ(sink.u64("bad_len"), 0u) << sink.str("first_problem");
	EXPECT_EQ(sink.u64("bad_payload"), 0u) << sink.str("first_problem");
	EXPECT_EQ(sink.u64("repost_fail"), 0u);
}

}  // namespace
}  // namespace xsrc_traffic
