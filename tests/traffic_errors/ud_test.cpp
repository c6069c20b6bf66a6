// traffic_errors: UD datagrams that must be dropped or refused (the fixture: traffic_fixture.h).
#include "traffic_fixture.h"

namespace xsrc_traffic {
namespace {

// ===============================================================================
// 7. UD
// ===============================================================================

using Ud = Traffic;

constexpr uint32_t kPeerQkey = 0x11111111;

struct UdSetup {
	uint64_t pcq;
	PeerQp peer;
	PeerMr rbuf;
	ibv_cq *cq;
	ibv_qp *qp;
	ibv_ah *ah;
	Buffer *src;
};

UdSetup ud_setup(Peer &peer, Verbs &me)
{
	UdSetup s{};
	Msg cq = peer.call(Msg("cq").set("cqe", 64));
	s.pcq = cq.u64("id");
	Msg qp = peer.call(Msg("qp").set("type", "ud").set("cq", s.pcq).set("max_recv_wr", 16));
	s.peer = {qp.u64("id"), static_cast<uint32_t>(qp.u64("qpn"))};
	peer.call(Msg("ud_up").set("qp", s.peer.id).set("qkey", kPeerQkey));
	Msg mr = peer.call(Msg("mr").set("size", 16384).set("access", IBV_ACCESS_LOCAL_WRITE).set("fill", 0x77));
	s.rbuf = {mr.u64("id"), mr.u64("addr"), 0, static_cast<uint32_t>(mr.u64("lkey")), mr.u64("len")};
	// Receives big enough for 2048 + GRH, so that only the sender can refuse
	// an over-MTU message.
	peer.call(Msg("post_recv").set("qp", s.peer.id).set("mr", s.rbuf.id).set("off", 0).set("len", 4096)
			  .set("count", 4).set("stride", 4096).set("wr_id", 100));
	s.cq = me.cq(64);
	s.qp = me.qp(IBV_QPT_UD, s.cq, s.cq);
	ud_connect(s.qp, 0x22222222);
	s.ah = me.ah(peer.gid);
	s.src = me.buffer(4096, IBV_ACCESS_LOCAL_WRITE, kSrcFill);
	return s;
}

// A wrong Q_Key: the sender completes SUCCESS (UD is unacknowledged), the
// receiver sees nothing and its buffer is untouched; the right Q_Key then
// uses the very first receive.
TEST_F(Ud, QkeyMismatchIsDropped)
{
	UdSetup s = ud_setup(peer(), me());
	SendWr bad(1, IBV_WR_SEND, s.src->addr(), 64, s.src->lkey());
	ASSERT_EQ(bad.ud(s.ah, s.peer.qpn, 0x33333333).post(s.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(s.cq, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	auto got = peer_poll(s.pcq, 4, 300ms);
	EXPECT_TRUE(got.empty()) << "a Q_Key violation was delivered:" << describe(got);
	std::string where;
	EXPECT_EQ(peer_bad_bytes(s.rbuf, 0x77, 0, 0, &where), 0u) << where;

	SendWr good(2, IBV_WR_SEND, s.src->addr(), 64, s.src->lkey());
	ASSERT_EQ(good.ud(s.ah, s.peer.qpn, kPeerQkey).post(s.qp), 0);
	ASSERT_TRUE(one_completion(s.cq, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	got = peer_poll(s.pcq, 1, 5s);
	ASSERT_EQ(got.size(), 1u);
	EXPECT_EQ(got[0].wr_id, 100u) << "the dropped message consumed a receive";
	EXPECT_EQ(got[0].status, IBV_WC_SUCCESS) << status_str(got[0].status);
	EXPECT_EQ(got[0].byte_len, 64u + 40u);
	EXPECT_EQ(got[0].src_qp, s.qp->qp_num);
	EXPECT_EQ(peer_bad_bytes(s.rbuf, kSrcFill, 40, 64), 0u);
}

// UD to a QPN nobody has, or to an RC QP: SUCCESS for the sender, nothing
// delivered anywhere.
TEST_F(Ud, ToMissingOrWrongTypeQpIsDropped)
{
	UdSetup s = ud_setup(peer(), me());
	uint64_t rc_cq = peer_cq();
	Msg rc = peer().call(Msg("qp").set("type", "rc").set("cq", rc_cq));
	peer().call(Msg("connect").set("qp", rc.u64("id")).set("remote_qpn", s.qp->qp_num)
			    .set("gid", gid_hex(me().gid)));  // RTS, so that it can hold a receive
	PeerMr rcbuf = peer_mr(4096, IBV_ACCESS_LOCAL_WRITE, 0x77);
	peer_post_recv(rc.u64("id"), rcbuf, 0, 4096, 900);
	for (uint32_t qpn : {0xFFFF00u, static_cast<uint32_t>(rc.u64("qpn"))}) {
		SCOPED_TRACE("remote qpn " + std::to_string(qpn));
		SendWr w(qpn, IBV_WR_SEND, s.src->addr(), 64, s.src->lkey());
		ASSERT_EQ(w.ud(s.ah, qpn, kPeerQkey).post(s.qp), 0);
		ibv_wc wc{};
		ASSERT_TRUE(one_completion(s.cq, &wc));
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	}
	EXPECT_TRUE(peer_poll(s.pcq, 4, 200ms).empty());
	EXPECT_TRUE(peer_poll(rc_cq, 4, 50ms).empty());
	EXPECT_EQ(peer_bad_bytes(s.rbuf, 0x77), 0u);
	EXPECT_EQ(peer_bad_bytes(rcbuf, 0x77), 0u);
}

// A UD payload larger than the port MTU fails locally (LOC_LEN_ERR) and
// reaches nobody; exactly the MTU goes through.
TEST_F(Ud, PayloadOverMtuIsLocLenErr)
{
	UdSetup s = ud_setup(peer(), me());
	uint32_t mtu = me().mtu_bytes;
	ASSERT_EQ(mtu, 1024u) << "a 1500-byte netdev gives active_mtu 1024";
	SendWr fits(1, IBV_WR_SEND, s.src->addr(), mtu, s.src->lkey());
	ASSERT_EQ(fits.ud(s.ah, s.peer.qpn, kPeerQkey).post(s.qp), 0);
	ibv_wc wc{};
	ASSERT_TRUE(one_completion(s.cq, &wc));
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_str(wc.status);
	auto got = peer_poll(s.pcq, 1, 5s);
	ASSERT_EQ(got.size(), 1u);
	EXPECT_EQ(got[0].byte_len, mtu + 40);

	SendWr big(2, IBV_WR_SEND, s.src->addr(), mtu + 1, s.src->lkey());
	ASSERT_EQ(big.ud(s.ah, s.peer.qpn, kPeerQkey).post(s.qp), 0);
	ASSERT_TRUE(one_completion(s.cq, &wc));
	EXPECT_EQ(wc.wr_id, 2u);
	EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR) << status_str(wc.status);
	got = peer_poll(s.pcq, 4, 300ms);
	EXPECT_TRUE(got.empty()) << "an over-MTU message was delivered:" << describe(got);
	std::string where;
	EXPECT_EQ(peer_bad_bytes(s.rbuf, 0x77, 4096), 0u) << "the next receive buffer was written";
}

}  // namespace
}  // namespace xsrc_traffic
