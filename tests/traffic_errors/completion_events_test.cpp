// traffic_errors: completion events across the two processes (the fixture: traffic_fixture.h).
#include "traffic_fixture.h"

namespace xsrc_traffic {
namespace {

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
	auto mine = poll_completions(cq, 2, 2s);
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

}  // namespace
}  // namespace xsrc_traffic
