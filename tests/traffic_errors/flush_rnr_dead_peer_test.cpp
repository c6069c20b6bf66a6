// traffic_errors: flushes, RNR waits and a peer that dies (the fixture: traffic_fixture.h).
#include "traffic_fixture.h"

namespace xsrc_traffic {
namespace {

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
	auto sends = poll_completions(scq, 4, 5s);
	auto recvs = poll_completions(rcq, 4, 5s);
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
	auto r2 = poll_completions(rcq, 1, 2s);
	auto s2 = poll_completions(scq, 2, 2s);
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
	auto flushed = poll_completions(cq, 3, 5s);
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
	auto wcs = poll_completions(cq, 3, 2s);
	ASSERT_EQ(wcs.size(), 3u) << describe(wcs);
	EXPECT_EQ(wcs[0].wr_id, 1u);
	EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR) << status_str(wcs[0].status);
	for (size_t i = 1; i < 3; ++i) {
		EXPECT_EQ(wcs[i].wr_id, i + 1);
		EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR) << status_str(wcs[i].status);
	}
	EXPECT_EQ(qp_state(p.qp), IBV_QPS_ERR);
}

}  // namespace
}  // namespace xsrc_traffic
