// Routing by destination GID: a QP or AH that names a GID this device does
// not have never reaches a local QP with the same number. A reliable QP
// retries, then completes with IBV_WC_RETRY_EXC_ERR; a UD datagram is lost
// (success at the sender, nothing at the receiver). The same QPs with the
// port's own GID deliver, so each case can tell the two apart.
#include <gtest/gtest.h>

#include <infiniband/verbs.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "provider_test_util.h"

namespace {

using namespace provider_test;

constexpr uint32_t kUdQkey = 0x11111111;
constexpr size_t kGrhBytes = 40;
constexpr size_t kBytes = 64;

class Route : public ::testing::Test {
protected:
	void SetUp() override
	{
		ctx = open_xsrc0();
		ASSERT_NE(ctx, nullptr);
		pd = ibv_alloc_pd(ctx);
		ASSERT_NE(pd, nullptr);
		send_cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
		recv_cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
		ASSERT_TRUE(send_cq && recv_cq);
		mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
		ASSERT_NE(mr, nullptr);
		foreign = foreign_gid();
	}
	void TearDown() override
	{
		if (ah)
			ibv_destroy_ah(ah);
		ibv_qp *qps[] = {a, b};
		ibv_cq *cqs[] = {send_cq, recv_cq};
		destroy_all(qps, std::span(&mr, 1), cqs, pd, ctx);
	}

	// A unique-local IPv6 GID that is not in the port's table.
	ibv_gid foreign_gid()
	{
		ibv_gid g{};
		g.raw[0] = 0xfd;
		g.raw[1] = 0x7e;
		g.raw[15] = 0x77;
		ibv_port_attr port{};
		EXPECT_EQ(ibv_query_port(ctx, kPort, &port), 0);
		for (int i = 0; i < port.gid_tbl_len; ++i) {
			ibv_gid entry;
			if (ibv_query_gid(ctx, kPort, i, &entry) == 0) {
				EXPECT_NE(std::memcmp(&entry, &g, sizeof(g)), 0) << "the port has it at index " << i;
			}
		}
		return g;
	}

	ibv_qp *make_qp(ibv_qp_type type)
	{
		ibv_qp_init_attr attr = rc_attr(send_cq, 8, 0);
		attr.recv_cq = recv_cq;
		attr.qp_type = type;
		return ibv_create_qp(pd, &attr);
	}

	void post_recv(ibv_qp *qp, size_t offset, size_t len)
	{
		ibv_sge sge{reinterpret_cast<uintptr_t>(buf + offset), static_cast<uint32_t>(len), mr->lkey};
		ibv_recv_wr wr{}, *bad = nullptr;
		wr.wr_id = 2;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
	}

	void post_send(ibv_qp *qp, ibv_ah *to = nullptr, uint32_t remote_qpn = 0)
	{
		std::memset(buf, 0xab, kBytes);
		ibv_sge sge{reinterpret_cast<uintptr_t>(buf), kBytes, mr->lkey};
		ibv_send_wr wr{}, *bad = nullptr;
		wr.wr_id = 1;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		if (to) {
			wr.wr.ud.ah = to;
			wr.wr.ud.remote_qpn = remote_qpn;
			wr.wr.ud.remote_qkey = kUdQkey;
		}
		ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0);
	}

	// Nothing arrives at the receive CQ within 200 ms.
	void expect_nothing_received()
	{
		auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
		ibv_wc wc;
		while (std::chrono::steady_clock::now() < deadline) {
			ASSERT_EQ(ibv_poll_cq(recv_cq, 1, &wc), 0) << "received: status " << wc.status;
			std::this_thread::sleep_for(std::chrono::milliseconds(5));
		}
	}

	void ud_to_rts(ibv_qp *qp)
	{
		ibv_qp_attr attr{};
		attr.qp_state = IBV_QPS_INIT;
		attr.port_num = kPort;
		attr.qkey = kUdQkey;
		ASSERT_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
		attr = {};
		attr.qp_state = IBV_QPS_RTR;
		ASSERT_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE), 0);
		attr.qp_state = IBV_QPS_RTS;
		ASSERT_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
	}

	ibv_ah *make_ah(const ibv_gid *dgid)
	{
		ibv_ah_attr attr{};
		attr.is_global = 1;
		attr.port_num = kPort;
		attr.grh.sgid_index = kGidIndex;
		attr.grh.hop_limit = 1;
		if (dgid)
			attr.grh.dgid = *dgid;
		else
			EXPECT_EQ(ibv_query_gid(ctx, kPort, kGidIndex, &attr.grh.dgid), 0);
		return ibv_create_ah(pd, &attr);
	}

	// UD QP a sends one datagram to UD QP b (a receive posted) through an AH
	// for `dgid` (null: the port's own GID); the send completes successfully.
	void ud_send_to(const ibv_gid *dgid)
	{
		a = make_qp(IBV_QPT_UD);
		b = make_qp(IBV_QPT_UD);
		ASSERT_TRUE(a && b);
		ud_to_rts(a);
		ud_to_rts(b);
		ah = make_ah(dgid);
		ASSERT_NE(ah, nullptr);
		post_recv(b, kBytes, kGrhBytes + kBytes);
		post_send(a, ah, b->qp_num);
		std::vector<ibv_wc> sent = poll_n(send_cq, 1);
		ASSERT_EQ(sent.size(), 1u);
		EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
	}

	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	ibv_cq *send_cq = nullptr, *recv_cq = nullptr;
	ibv_mr *mr = nullptr;
	ibv_qp *a = nullptr, *b = nullptr;
	ibv_ah *ah = nullptr;
	ibv_gid foreign{};
	alignas(64) unsigned char buf[4096] = {};
};

TEST_F(Route, RcToAForeignGidRetriesThenFailsAndNeverReachesTheLocalQpn)
{
	a = make_qp(IBV_QPT_RC);
	b = make_qp(IBV_QPT_RC);
	ASSERT_TRUE(a && b);
	// a names b's QPN, but at a GID of another host; b answers a's QPN here.
	Path elsewhere;
	elsewhere.dgid = &foreign;
	elsewhere.timeout = 1;  // 8 us
	elsewhere.retry_cnt = 2;
	ASSERT_EQ(rc_connect(a, b->qp_num, elsewhere), 0);
	ASSERT_EQ(rc_connect(b, a->qp_num), 0);
	post_recv(b, kBytes, kBytes);
	post_send(a);
	std::vector<ibv_wc> wc = poll_n(send_cq, 1);
	ASSERT_EQ(wc.size(), 1u);
	EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
	ibv_qp_attr attr{};
	ibv_qp_init_attr init{};
	ASSERT_EQ(ibv_query_qp(a, &attr, IBV_QP_STATE, &init), 0);
	EXPECT_EQ(attr.qp_state, IBV_QPS_ERR);
	expect_nothing_received();
	for (size_t i = kBytes; i < 2 * kBytes; ++i)
		ASSERT_EQ(buf[i], 0) << "byte " << i << " of b's receive buffer was written";
}

TEST_F(Route, RcToTheLocalGidDelivers)
{
	a = make_qp(IBV_QPT_RC);
	b = make_qp(IBV_QPT_RC);
	ASSERT_TRUE(a && b);
	ASSERT_EQ(rc_connect(a, b->qp_num), 0);
	ASSERT_EQ(rc_connect(b, a->qp_num), 0);
	post_recv(b, kBytes, kBytes);
	post_send(a);
	std::vector<ibv_wc> sent = poll_n(send_cq, 1);
	ASSERT_EQ(sent.size(), 1u);
	EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
	std::vector<ibv_wc> got = poll_n(recv_cq, 1);
	ASSERT_EQ(got.size(), 1u);
	EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
	EXPECT_EQ(got[0].byte_len, kBytes);
	EXPECT_EQ(buf[kBytes], 0xab);
}

TEST_F(Route, UdToAForeignGidIsLostNotDeliveredLocally)
{
	ASSERT_NO_FATAL_FAILURE(ud_send_to(&foreign));  // a datagram leaves; nobody is there
	expect_nothing_received();
}

// Across hosts a datagram is one RoCE v2 packet: more than the port's MTU
// fails at the sender, as on an HCA, and nothing leaves.
TEST_F(Route, UdToAForeignGidLargerThanThePortMtuFailsLocLen)
{
	a = make_qp(IBV_QPT_UD);
	ASSERT_NE(a, nullptr);
	ud_to_rts(a);
	ibv_gid mapped{};  // ::ffff:127.0.0.77, of the sender's family (kGidIndex is IPv4-mapped)
	mapped.raw[10] = mapped.raw[11] = 0xff;
	mapped.raw[12] = 127;
	mapped.raw[15] = 77;
	ah = make_ah(&mapped);
	ASSERT_NE(ah, nullptr);
	ibv_port_attr port{};
	ASSERT_EQ(ibv_query_port(ctx, kPort, &port), 0);
	uint32_t mtu = 128u << port.active_mtu;
	ASSERT_LT(mtu, sizeof(buf));
	ibv_sge sge{reinterpret_cast<uintptr_t>(buf), mtu + 1, mr->lkey};
	ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = 1;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = a->qp_num;
	wr.wr.ud.remote_qkey = kUdQkey;
	ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);
	std::vector<ibv_wc> sent = poll_n(send_cq, 1);
	ASSERT_EQ(sent.size(), 1u);
	EXPECT_EQ(sent[0].status, IBV_WC_LOC_LEN_ERR);
}

TEST_F(Route, UdToTheLocalGidDelivers)
{
	ASSERT_NO_FATAL_FAILURE(ud_send_to(nullptr));
	std::vector<ibv_wc> got = poll_n(recv_cq, 1);
	ASSERT_EQ(got.size(), 1u);
	EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
	EXPECT_EQ(got[0].byte_len, kGrhBytes + kBytes);
}

}  // namespace
