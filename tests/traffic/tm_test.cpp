// Verbs tag matching between two processes on xsrc0: this process owns a
// tag-matching SRQ (ibv_post_srq_ops, completions read with ibv_start_poll
// and ibv_wc_read_tm_info); a child re-executed from this binary
// (--sender) sends tagged messages over RC as told, and reports its own
// completions (the SEND's, and a rendezvous's FIN).
#include <endian.h>
#include <infiniband/tm_types.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <gtest/gtest.h>
#include <optional>
#include <vector>

#include "harness/child.h"
#include "harness/completions.h"
#include "harness/qp_connect.h"

namespace {

using xsrc::harness::Child;
using xsrc::harness::Link;
using namespace std::chrono_literals;

constexpr uint8_t kPort = 1;
constexpr uint8_t kGidIndex = 1;
constexpr size_t kBufBytes = 64 * 1024;
constexpr uint64_t kRndvDataOff = 4096;   // the sender's rendezvous data
constexpr uint64_t kFinRecvOff = 32768;   // the sender's receive for the FIN
constexpr uint8_t kNoTmh = 0xff;          // the message has no TMH at all
constexpr auto kTimeout = 5s;

// What the parent tells the sender to do.
struct Cmd {
	uint32_t quit;
	uint32_t len;        // bytes sent, TMH included
	uint8_t tmh_op;      // enum ibv_tmh_op, or kNoTmh
	uint8_t expect_fin;  // post a receive for the FIN and wait for it
	uint8_t pad[2];
	uint32_t app_ctx;
	uint64_t tag;
	uint32_t rvh_len;    // rendezvous: the data the RVH names
	uint32_t rkey_xor;   // rendezvous: spoils the RVH's rkey
	uint32_t inv_rkey;   // non-zero: SEND_WITH_INV of this rkey
	uint32_t burst;      // non-zero: this many eager messages, tags tag..tag+burst-1,
	                     // each payload the tag (8 bytes) after the TMH
};

struct Reply {
	int send_status;
	int fin_status;      // -1: none came
	uint32_t fin_len;
	uint32_t fin_opcode; // ibv_wc_opcode
	uint8_t fin_tmh_op;
	uint8_t send_first;  // the SEND's completion came before the FIN's
	uint8_t pad[2];
	uint64_t fin_tag;
};

uint8_t payload_byte(uint64_t i) { return static_cast<uint8_t>(i * 7 + 3); }
uint8_t rndv_byte(uint64_t i) { return static_cast<uint8_t>(i * 13 + 5); }

ibv_context *open_xsrc0()
{
	int n = 0;
	ibv_device **list = ibv_get_device_list(&n);
	ibv_context *ctx = nullptr;
	for (int i = 0; list && i < n && !ctx; ++i)
		if (std::strcmp(ibv_get_device_name(list[i]), "xsrc0") == 0)
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	return ctx;
}

void write_tmh(uint8_t *at, uint8_t op, uint32_t app_ctx, uint64_t tag)
{
	ibv_tmh tmh{};
	tmh.opcode = op;
	tmh.app_ctx = htobe32(app_ctx);
	tmh.tag = htobe64(tag);
	std::memcpy(at, &tmh, sizeof(tmh));
}

// --- the sender (child) --------------------------------------------------

int sender_main(Link &link)
{
	ibv_context *ctx = open_xsrc0();
	ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
	ibv_cq *cq = ctx ? ibv_create_cq(ctx, 64, nullptr, nullptr, 0) : nullptr;
	static std::vector<uint8_t> buf(kBufBytes);
	ibv_mr *mr = pd ? ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ)
			: nullptr;
	ibv_qp_init_attr attr{};
	attr.send_cq = attr.recv_cq = cq;
	attr.cap = {8, 8, 1, 1, 0};
	attr.qp_type = IBV_QPT_RC;
	ibv_qp *qp = mr && cq ? ibv_create_qp(pd, &attr) : nullptr;
	uint32_t qpn = qp ? qp->qp_num : 0;
	uint32_t peer = 0;
	if (!link.send_value(qpn) || !qp || !link.recv_value(&peer, xsrc::harness::ms(10000)))
		return 1;
	xsrc::harness::QpRemote remote{peer, {}};
	ibv_query_gid(ctx, kPort, kGidIndex, &remote.gid);
	if (xsrc::harness::qp_connect(qp, remote))
		return 2;
	if (!link.send_value(uint32_t{1}))  // connected
		return 3;
	for (;;) {
		Cmd cmd{};
		if (!link.recv_value(&cmd, xsrc::harness::ms(30000)) || cmd.quit)
			return 0;
		if (cmd.burst) {
			Reply reply{};
			reply.fin_status = -1;
			for (uint32_t i = 0; i < cmd.burst && !reply.send_status; ++i) {
				write_tmh(buf.data(), IBV_TMH_EAGER, 0, cmd.tag + i);
				uint64_t tag = cmd.tag + i;
				std::memcpy(buf.data() + sizeof(ibv_tmh), &tag, sizeof(tag));
				ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), cmd.len, mr->lkey};
				ibv_send_wr wr{}, *bad;
				wr.sg_list = &sge;
				wr.num_sge = 1;
				wr.opcode = IBV_WR_SEND;
				wr.send_flags = IBV_SEND_SIGNALED;
				if (ibv_post_send(qp, &wr, &bad))
					return 7;
				std::vector<ibv_wc> wcs = xsrc::harness::poll_completions(cq, 1, kTimeout);
				reply.send_status = wcs.size() == 1 ? wcs[0].status : -1;
			}
			if (!link.send_value(reply))
				return 6;
			continue;
		}
		for (uint64_t i = 0; i < cmd.len; ++i)
			buf[i] = payload_byte(i);
		if (cmd.tmh_op != kNoTmh)
			write_tmh(buf.data(), cmd.tmh_op, cmd.app_ctx, cmd.tag);
		if (cmd.tmh_op == IBV_TMH_RNDV) {
			ibv_rvh rvh{};
			rvh.va = htobe64(reinterpret_cast<uintptr_t>(buf.data() + kRndvDataOff));
			rvh.rkey = htobe32(mr->rkey ^ cmd.rkey_xor);
			rvh.len = htobe32(cmd.rvh_len);
			std::memcpy(buf.data() + sizeof(ibv_tmh), &rvh, sizeof(rvh));
			for (uint64_t i = 0; i < cmd.rvh_len; ++i)
				buf[kRndvDataOff + i] = rndv_byte(i);
		}
		if (cmd.expect_fin) {
			ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data() + kFinRecvOff), 64, mr->lkey};
			ibv_recv_wr rwr{}, *bad_rwr;
			rwr.wr_id = 99;
			rwr.sg_list = &sge;
			rwr.num_sge = 1;
			if (ibv_post_recv(qp, &rwr, &bad_rwr))
				return 4;
		}
		ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), cmd.len, mr->lkey};
		ibv_send_wr wr{}, *bad;
		wr.wr_id = 1;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = cmd.inv_rkey ? IBV_WR_SEND_WITH_INV : IBV_WR_SEND;
		wr.invalidate_rkey = cmd.inv_rkey;
		wr.send_flags = IBV_SEND_SIGNALED;
		if (ibv_post_send(qp, &wr, &bad))
			return 5;
		Reply reply{};
		reply.fin_status = -1;
		std::vector<ibv_wc> wcs = xsrc::harness::poll_completions(cq, cmd.expect_fin ? 2 : 1, kTimeout);
		reply.send_status = -1;
		for (size_t i = 0; i < wcs.size(); ++i) {
			const ibv_wc &wc = wcs[i];
			if (wc.wr_id == 1) {
				reply.send_status = wc.status;
				reply.send_first = i == 0;
			} else if (wc.wr_id == 99) {
				reply.fin_status = wc.status;
				reply.fin_len = wc.byte_len;
				reply.fin_opcode = wc.opcode;
				ibv_tmh fin{};
				std::memcpy(&fin, buf.data() + kFinRecvOff, sizeof(fin));
				reply.fin_tmh_op = fin.opcode;
				reply.fin_tag = be64toh(fin.tag);
			}
		}
		if (!link.send_value(reply))
			return 6;
	}
}

// --- the TM-SRQ's owner (this process) -----------------------------------

struct Wc {
	uint64_t wr_id = 0;
	ibv_wc_status status = IBV_WC_GENERAL_ERR;
	ibv_wc_opcode opcode = IBV_WC_SEND;
	unsigned flags = 0;
	uint32_t byte_len = 0;
	ibv_wc_tm_info tm{};
};

ibv_srq *make_tm_srq(ibv_context *ctx, ibv_pd *pd, ibv_cq_ex *cq, uint32_t max_num_tags, uint32_t max_sge = 1)
{
	ibv_srq_init_attr_ex attr{};
	attr.attr.max_wr = 16;
	attr.attr.max_sge = max_sge;
	attr.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
	attr.srq_type = IBV_SRQT_TM;
	attr.pd = pd;
	attr.cq = ibv_cq_ex_to_cq(cq);
	attr.tm_cap.max_num_tags = max_num_tags;
	attr.tm_cap.max_ops = 8;
	return ibv_create_srq_ex(ctx, &attr);
}

class TagMatching : public ::testing::Test {
protected:
	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	ibv_cq_ex *cq = nullptr;
	ibv_srq *srq = nullptr;
	ibv_qp *qp = nullptr;
	ibv_mr *mr = nullptr;
	std::vector<uint8_t> buf = std::vector<uint8_t>(kBufBytes);
	Child sender;

	void SetUp() override
	{
		ctx = open_xsrc0();
		ASSERT_NE(ctx, nullptr);
		ibv_device_attr_ex dev{};
		ASSERT_EQ(ibv_query_device_ex(ctx, nullptr, &dev), 0);
		ASSERT_TRUE(dev.tm_caps.flags & IBV_TM_CAP_RC);
		pd = ibv_alloc_pd(ctx);
		ibv_cq_init_attr_ex cattr{};
		cattr.cqe = 64;
		cattr.wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | IBV_WC_EX_WITH_TM_INFO;
		cq = ibv_create_cq_ex(ctx, &cattr);
		ASSERT_NE(cq, nullptr);
		srq = make_tm_srq(ctx, pd, cq, 4);
		ASSERT_NE(srq, nullptr) << strerror(errno);
		mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
		ASSERT_NE(mr, nullptr);
		ibv_qp_init_attr qattr{};
		qattr.send_cq = qattr.recv_cq = ibv_cq_ex_to_cq(cq);
		qattr.srq = srq;
		qattr.cap = {4, 0, 1, 0, 0};
		qattr.qp_type = IBV_QPT_RC;
		qp = ibv_create_qp(pd, &qattr);
		ASSERT_NE(qp, nullptr) << strerror(errno);
	}

	// The sender process, connected to our QP.
	void connect_sender() { connect_sender(sender, qp); }

	void connect_sender(Child &to, ibv_qp *ours)
	{
		to = Child::spawn("--sender");
		uint32_t peer = 0, connected = 0;
		ASSERT_TRUE(to.link().recv_value(&peer, xsrc::harness::ms(10000)));
		ASSERT_NE(peer, 0u);
		ASSERT_TRUE(to.link().send_value(ours->qp_num));
		xsrc::harness::QpRemote remote{peer, {}};
		ASSERT_EQ(ibv_query_gid(ctx, kPort, kGidIndex, &remote.gid), 0);
		xsrc::harness::QpStep step = xsrc::harness::qp_connect(ours, remote);
		ASSERT_FALSE(step) << step.text();
		ASSERT_TRUE(to.link().recv_value(&connected, xsrc::harness::ms(10000)));
	}

	void TearDown() override
	{
		if (sender.running()) {
			Cmd quit{};
			quit.quit = 1;
			sender.link().send_value(quit);
			sender.wait(xsrc::harness::ms(5000));
		}
		if (qp)
			ibv_destroy_qp(qp);
		if (srq)
			ibv_destroy_srq(srq);
		if (mr)
			ibv_dereg_mr(mr);
		if (cq)
			ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
		if (pd)
			ibv_dealloc_pd(pd);
		if (ctx)
			ibv_close_device(ctx);
	}

	Reply send(const Cmd &cmd)
	{
		Reply r{};
		r.send_status = -1;
		EXPECT_TRUE(sender.link().send_value(cmd));
		EXPECT_TRUE(sender.link().recv_value(&r, xsrc::harness::ms(15000)));
		return r;
	}

	std::optional<Wc> poll()
	{
		ibv_poll_cq_attr attr{};
		auto end = std::chrono::steady_clock::now() + kTimeout;
		int rc;
		while ((rc = ibv_start_poll(cq, &attr)) == ENOENT && std::chrono::steady_clock::now() < end) {
		}
		if (rc)
			return std::nullopt;
		Wc wc;
		wc.wr_id = cq->wr_id;
		wc.status = cq->status;
		wc.opcode = ibv_wc_read_opcode(cq);
		wc.flags = ibv_wc_read_wc_flags(cq);
		wc.byte_len = ibv_wc_read_byte_len(cq);
		ibv_wc_read_tm_info(cq, &wc.tm);
		ibv_end_poll(cq);
		return wc;
	}

	// Nothing more on the CQ for a while.
	bool quiet()
	{
		ibv_poll_cq_attr attr{};
		auto end = std::chrono::steady_clock::now() + 50ms;
		while (std::chrono::steady_clock::now() < end)
			if (ibv_start_poll(cq, &attr) == 0) {
				ibv_end_poll(cq);
				return false;
			}
		return true;
	}

	int post_op(ibv_ops_wr &op)
	{
		ibv_ops_wr *bad = nullptr;
		return ibv_post_srq_ops(srq, &op, &bad);
	}

	// Adds a tagged buffer of `len` bytes at `off`; returns its handle
	// and checks the ADD's completion (`flags` its wc_flags).
	uint32_t add_tag(uint64_t tag, uint64_t mask, uint64_t wr_id, uint64_t off, uint32_t len, unsigned *flags = nullptr,
			 int sync_cnt = -1)
	{
		ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data() + off), len, mr->lkey};
		ibv_ops_wr op{};
		op.wr_id = 1000 + wr_id;
		op.opcode = IBV_WR_TAG_ADD;
		op.flags = IBV_OPS_SIGNALED | (sync_cnt >= 0 ? IBV_OPS_TM_SYNC : 0);
		op.tm.unexpected_cnt = sync_cnt >= 0 ? static_cast<uint32_t>(sync_cnt) : 0;
		op.tm.add.recv_wr_id = wr_id;
		op.tm.add.sg_list = &sge;
		op.tm.add.num_sge = 1;
		op.tm.add.tag = tag;
		op.tm.add.mask = mask;
		EXPECT_EQ(post_op(op), 0);
		std::optional<Wc> wc = poll();
		EXPECT_TRUE(wc);
		if (wc) {
			EXPECT_EQ(wc->opcode, IBV_WC_TM_ADD);
			EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
			EXPECT_EQ(wc->wr_id, 1000 + wr_id);
			if (flags)
				*flags = wc->flags;
		}
		return op.tm.handle;
	}

	// Removes an entry; the status of the DEL's completion.
	ibv_wc_status del_tag(uint32_t handle)
	{
		ibv_ops_wr op{};
		op.wr_id = 77;
		op.opcode = IBV_WR_TAG_DEL;
		op.flags = IBV_OPS_SIGNALED;
		op.tm.handle = handle;
		EXPECT_EQ(post_op(op), 0);
		std::optional<Wc> wc = poll();
		if (!wc)
			return IBV_WC_GENERAL_ERR;
		EXPECT_EQ(wc->opcode, IBV_WC_TM_DEL);
		EXPECT_EQ(wc->wr_id, 77u);
		return wc->status;
	}

	void sync(uint32_t count)
	{
		ibv_ops_wr op{};
		op.wr_id = 27;
		op.opcode = IBV_WR_TAG_SYNC;
		op.flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC;
		op.tm.unexpected_cnt = count;
		ASSERT_EQ(post_op(op), 0);
		std::optional<Wc> wc = poll();
		ASSERT_TRUE(wc);
		EXPECT_EQ(wc->opcode, IBV_WC_TM_SYNC);
		EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
		EXPECT_EQ(wc->wr_id, 27u);
	}

	void post_srq_recv(uint64_t wr_id, uint64_t off, uint32_t len)
	{
		ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data() + off), len, mr->lkey};
		ibv_recv_wr wr{}, *bad;
		wr.wr_id = wr_id;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		ASSERT_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
	}

	static Cmd eager(uint64_t tag, uint32_t len, uint32_t app_ctx = 0)
	{
		Cmd c{};
		c.len = len;
		c.tmh_op = IBV_TMH_EAGER;
		c.tag = tag;
		c.app_ctx = app_ctx;
		return c;
	}

	// The sender's payload (payload_byte) from byte `from` is at `off`.
	bool payload_at(uint64_t off, uint64_t from, uint64_t len) const
	{
		for (uint64_t i = 0; i < len; ++i)
			if (buf[off + i] != payload_byte(from + i))
				return false;
		return true;
	}
};

// An eager message matches the earliest tag whose mask accepts it; its
// payload lands past the TMH, the completion carries the tag and app_ctx.
// The consumed entry is gone: removing it fails with IBV_WC_TM_ERR.
TEST_F(TagMatching, EagerMatchesTheEarliestTagPastItsTmh)
{
	connect_sender();
	uint32_t first = add_tag(0x1200, 0xff00, 1, 0, 1024);  // any 0x12xx
	uint32_t second = add_tag(0x1234, ~0ull, 2, 2048, 1024);
	Reply r = send(eager(0x1234, 500, 0xabcd));
	EXPECT_EQ(r.send_status, IBV_WC_SUCCESS);
	std::optional<Wc> wc = poll();
	ASSERT_TRUE(wc);
	EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc->opcode, IBV_WC_TM_RECV);
	EXPECT_EQ(wc->wr_id, 1u);
	EXPECT_EQ(wc->flags, unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
	EXPECT_EQ(wc->byte_len, 500u - sizeof(ibv_tmh));
	EXPECT_EQ(wc->tm.tag, 0x1234u);
	EXPECT_EQ(wc->tm.priv, 0xabcdu);
	EXPECT_TRUE(payload_at(0, sizeof(ibv_tmh), 500 - sizeof(ibv_tmh)));
	EXPECT_EQ(del_tag(first), IBV_WC_TM_ERR);    // consumed by the message
	EXPECT_EQ(del_tag(second), IBV_WC_SUCCESS);
	EXPECT_EQ(del_tag(second), IBV_WC_TM_ERR);   // not there any more
	EXPECT_TRUE(quiet());
}

// The list holds max_num_tags entries: one more is ENOMEM (and bad_wr
// names it); after a removal there is room again. Operations the device
// cannot take are refused without a completion.
TEST_F(TagMatching, ListFullAndBadOperationsAreRefused)
{
	std::vector<uint32_t> handles;
	for (uint64_t i = 0; i < 4; ++i)
		handles.push_back(add_tag(i, ~0ull, i, i * 64, 64));
	ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), 64, mr->lkey};
	ibv_ops_wr one{}, two{};
	one.opcode = two.opcode = IBV_WR_TAG_ADD;
	one.tm.add.sg_list = two.tm.add.sg_list = &sge;
	one.tm.add.num_sge = two.tm.add.num_sge = 1;
	one.next = &two;
	ibv_ops_wr *bad = nullptr;
	EXPECT_EQ(ibv_post_srq_ops(srq, &one, &bad), ENOMEM);
	EXPECT_EQ(bad, &one);
	EXPECT_EQ(del_tag(handles[2]), IBV_WC_SUCCESS);
	add_tag(9, ~0ull, 9, 0, 64);

	ibv_ops_wr op{};
	op.opcode = IBV_WR_TAG_DEL;
	op.tm.handle = 4;  // past max_num_tags
	EXPECT_EQ(post_op(op), EINVAL);
	op.opcode = static_cast<ibv_ops_wr_opcode>(7);
	EXPECT_EQ(post_op(op), EINVAL);
	op.opcode = IBV_WR_TAG_ADD;
	op.tm.add.num_sge = 2;  // the SRQ's tagged buffers hold one SGE
	op.tm.add.sg_list = &sge;
	EXPECT_EQ(post_op(op), EINVAL);
	EXPECT_TRUE(quiet());

	// A basic SRQ has no tag list; a TM SRQ's list has a device limit.
	ibv_srq_init_attr basic_attr{};
	basic_attr.attr = {4, 1, 0};
	ibv_srq *basic = ibv_create_srq(pd, &basic_attr);
	ASSERT_NE(basic, nullptr);
	op.opcode = IBV_WR_TAG_SYNC;
	bad = nullptr;
	EXPECT_EQ(ibv_post_srq_ops(basic, &op, &bad), EINVAL);
	EXPECT_EQ(bad, &op);
	ibv_destroy_srq(basic);
	ibv_device_attr_ex dev{};
	ASSERT_EQ(ibv_query_device_ex(ctx, nullptr, &dev), 0);
	errno = 0;
	EXPECT_EQ(make_tm_srq(ctx, pd, cq, dev.tm_caps.max_num_tags + 1), nullptr);
	EXPECT_EQ(errno, EINVAL);
}

// A tagged message no entry matches takes a receive of the SRQ, whole (TMH
// included): IBV_WC_TM_RECV without flags or tag. A tag added before the
// owner has synced with that is out of phase (IBV_WC_TM_SYNC_REQ) and
// matches nothing until IBV_WR_TAG_SYNC reports the unexpected count.
// Messages without an EAGER/RNDV TMH are IBV_WC_TM_NO_TAG and do not count.
TEST_F(TagMatching, UnexpectedMessagesGoToTheSrqUntilSynced)
{
	connect_sender();
	add_tag(1, ~0ull, 1, 0, 1024);
	post_srq_recv(50, 8192, 1024);
	Reply r = send(eager(2, 300));
	EXPECT_EQ(r.send_status, IBV_WC_SUCCESS);
	std::optional<Wc> wc = poll();
	ASSERT_TRUE(wc);
	EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc->opcode, IBV_WC_TM_RECV);
	EXPECT_EQ(wc->wr_id, 50u);
	EXPECT_EQ(wc->flags, 0u);
	EXPECT_EQ(wc->byte_len, 300u);
	EXPECT_EQ(wc->tm.tag, 0u);
	ibv_tmh tmh;
	std::memcpy(&tmh, buf.data() + 8192, sizeof(tmh));
	EXPECT_EQ(tmh.opcode, uint8_t{IBV_TMH_EAGER});
	EXPECT_EQ(be64toh(tmh.tag), 2u);
	EXPECT_TRUE(payload_at(8192 + sizeof(tmh), sizeof(tmh), 300 - sizeof(tmh)));

	// Software has not seen it yet (count 0): the new tag 2 is out of phase.
	unsigned flags = 0;
	add_tag(2, ~0ull, 2, 2048, 1024, &flags, 0);
	EXPECT_EQ(flags, unsigned{IBV_WC_TM_SYNC_REQ});
	post_srq_recv(51, 8192, 1024);
	r = send(eager(2, 100));
	EXPECT_EQ(r.send_status, IBV_WC_SUCCESS);
	wc = poll();
	ASSERT_TRUE(wc);
	EXPECT_EQ(wc->wr_id, 51u);  // not the stale tag
	EXPECT_EQ(wc->flags, 0u);
	sync(2);
	r = send(eager(2, 100));
	wc = poll();
	ASSERT_TRUE(wc);
	EXPECT_EQ(wc->wr_id, 2u);
	EXPECT_EQ(wc->flags, unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});

	// No TMH worth matching: the SRQ's receive, TM_NO_TAG; the tag 1 stays.
	post_srq_recv(52, 8192, 1024);
	Cmd no_tag = eager(1, 200);
	no_tag.tmh_op = IBV_TMH_NO_TAG;
	r = send(no_tag);
	EXPECT_EQ(r.send_status, IBV_WC_SUCCESS);
	wc = poll();
	ASSERT_TRUE(wc);
	EXPECT_EQ(wc->opcode, IBV_WC_TM_NO_TAG);
	EXPECT_EQ(wc->wr_id, 52u);
	EXPECT_EQ(wc->byte_len, 200u);
	post_srq_recv(53, 8192, 1024);
	Cmd tiny = eager(1, 8);  // shorter than a TMH
	tiny.tmh_op = kNoTmh;
	r = send(tiny);
	wc = poll();
	ASSERT_TRUE(wc);
	EXPECT_EQ(wc->opcode, IBV_WC_TM_NO_TAG);
	EXPECT_EQ(wc->byte_len, 8u);
	r = send(eager(1, 64));
	wc = poll();
	ASSERT_TRUE(wc);
	EXPECT_EQ(wc->wr_id, 1u);  // in phase all along: NO_TAG messages do not count
	EXPECT_TRUE(quiet());
}

// A matched eager message larger than its tagged buffer: the tag is used
// up, its completion is IBV_WC_LOC_LEN_ERR, the responder QP goes to error
// and the sender learns IBV_WC_REM_INV_REQ_ERR.
TEST_F(TagMatching, TooSmallTaggedBufferIsALengthError)
{
	connect_sender();
	uint32_t handle = add_tag(5, ~0ull, 5, 0, 32);
	Reply r = send(eager(5, 100));
	EXPECT_EQ(r.send_status, IBV_WC_REM_INV_REQ_ERR);
	std::optional<Wc> wc = poll();
	ASSERT_TRUE(wc);
	EXPECT_EQ(wc->status, IBV_WC_LOC_LEN_ERR);
	EXPECT_EQ(wc->opcode, IBV_WC_TM_RECV);
	EXPECT_EQ(wc->wr_id, 5u);
	EXPECT_EQ(xsrc::harness::qp_state(qp), IBV_QPS_ERR);
	EXPECT_EQ(del_tag(handle), IBV_WC_TM_ERR);
}

// SEND_WITH_INV that matches a tag: the responder invalidates the rkey as
// for any receive; an rkey that names no window bound to the QP is an
// invalid request, the tag's completion says so.
TEST_F(TagMatching, SendWithInvalidateOfNoWindowFailsTheTag)
{
	connect_sender();
	add_tag(6, ~0ull, 6, 0, 1024);
	Cmd c = eager(6, 64);
	c.inv_rkey = mr->rkey;  // an MR's key: no window to invalidate
	Reply r = send(c);
	EXPECT_EQ(r.send_status, IBV_WC_REM_INV_REQ_ERR);
	std::optional<Wc> wc = poll();
	ASSERT_TRUE(wc);
	EXPECT_EQ(wc->status, IBV_WC_REM_INV_REQ_ERR);
	EXPECT_EQ(wc->opcode, IBV_WC_TM_RECV);
	EXPECT_EQ(wc->wr_id, 6u);
	EXPECT_EQ(xsrc::harness::qp_state(qp), IBV_QPS_ERR);
}

// Two senders race for the same tagged buffers (every tag matches: mask
// 0) while this process re-adds each buffer as it is consumed and keeps
// receives posted for the messages that find none: every message arrives
// exactly once, matched into a buffer of its own (its payload, the tag, is
// there) or unexpected (whole, TMH first), and both kinds happen.
TEST_F(TagMatching, SendersRacingForTagsGetEachMessageOnce)
{
	constexpr uint32_t kPerSender = 300;
	constexpr uint32_t kSlots = 4, kRecvs = 8;
	constexpr uint64_t kTagOff = 0, kRecvOff = 8192, kSlotBytes = 1024;
	ibv_qp_init_attr qattr{};
	qattr.send_cq = qattr.recv_cq = ibv_cq_ex_to_cq(cq);
	qattr.srq = srq;
	qattr.cap = {4, 0, 1, 0, 0};
	qattr.qp_type = IBV_QPT_RC;
	ibv_qp *qp2 = ibv_create_qp(pd, &qattr);
	ASSERT_NE(qp2, nullptr);
	Child sender2;
	connect_sender();
	connect_sender(sender2, qp2);

	uint32_t unexpected = 0;
	auto add_slot = [&](uint32_t k) {
		ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data() + kTagOff + k * kSlotBytes), kSlotBytes, mr->lkey};
		ibv_ops_wr op{};
		op.opcode = IBV_WR_TAG_ADD;
		op.flags = IBV_OPS_TM_SYNC;  // unsignalled, in phase with what we have seen
		op.tm.unexpected_cnt = unexpected;
		op.tm.add.recv_wr_id = 100 + k;
		op.tm.add.sg_list = &sge;
		op.tm.add.num_sge = 1;
		op.tm.add.mask = 0;
		return post_op(op);
	};
	for (uint32_t k = 0; k < kSlots; ++k)
		ASSERT_EQ(add_slot(k), 0);
	for (uint32_t j = 0; j < kRecvs; ++j)
		post_srq_recv(200 + j, kRecvOff + j * kSlotBytes, kSlotBytes);

	Cmd burst{};
	burst.len = sizeof(ibv_tmh) + 64;
	burst.burst = kPerSender;
	burst.tag = 1ull << 32;
	ASSERT_TRUE(sender.link().send_value(burst));
	burst.tag = 2ull << 32;
	ASSERT_TRUE(sender2.link().send_value(burst));

	std::vector<uint64_t> tags;
	uint32_t matched = 0;
	// After 100 matches, consumed buffers are held back until a message
	// found none free: the unexpected path is taken on a quiet machine too,
	// where the owner would otherwise re-add every buffer in time.
	std::vector<uint32_t> held;
	auto end = std::chrono::steady_clock::now() + 60s;
	while (tags.size() < 2 * kPerSender && std::chrono::steady_clock::now() < end) {
		ibv_poll_cq_attr attr{};
		if (ibv_start_poll(cq, &attr) != 0)
			continue;
		uint64_t wr_id = cq->wr_id;
		ibv_wc_status status = cq->status;
		unsigned flags = ibv_wc_read_wc_flags(cq);
		ibv_wc_tm_info tm{};
		ibv_wc_read_tm_info(cq, &tm);
		ibv_end_poll(cq);
		ASSERT_EQ(status, IBV_WC_SUCCESS);
		if (flags & IBV_WC_TM_MATCH) {
			ASSERT_GE(wr_id, 100u);
			ASSERT_LT(wr_id, 100u + kSlots);
			uint32_t k = static_cast<uint32_t>(wr_id - 100);
			uint64_t payload;
			std::memcpy(&payload, buf.data() + kTagOff + k * kSlotBytes, sizeof(payload));
			EXPECT_EQ(payload, tm.tag);
			tags.push_back(tm.tag);
			++matched;
			if (unexpected == 0 && matched >= 100)
				held.push_back(k);
			else
				ASSERT_EQ(add_slot(k), 0);
		} else {
			ASSERT_GE(wr_id, 200u);
			ASSERT_LT(wr_id, 200u + kRecvs);
			uint32_t j = static_cast<uint32_t>(wr_id - 200);
			ibv_tmh tmh;
			std::memcpy(&tmh, buf.data() + kRecvOff + j * kSlotBytes, sizeof(tmh));
			tags.push_back(be64toh(tmh.tag));
			++unexpected;
			ibv_ops_wr sync_op{};
			sync_op.opcode = IBV_WR_TAG_SYNC;
			sync_op.flags = IBV_OPS_TM_SYNC;
			sync_op.tm.unexpected_cnt = unexpected;
			ASSERT_EQ(post_op(sync_op), 0);
			post_srq_recv(wr_id, kRecvOff + j * kSlotBytes, kSlotBytes);
			for (uint32_t k : held)
				ASSERT_EQ(add_slot(k), 0);
			held.clear();
		}
	}
	Reply r1{}, r2{};
	ASSERT_TRUE(sender.link().recv_value(&r1, xsrc::harness::ms(15000)));
	ASSERT_TRUE(sender2.link().recv_value(&r2, xsrc::harness::ms(15000)));
	EXPECT_EQ(r1.send_status, IBV_WC_SUCCESS);
	EXPECT_EQ(r2.send_status, IBV_WC_SUCCESS);
	ASSERT_EQ(tags.size(), 2u * kPerSender);
	std::sort(tags.begin(), tags.end());
	for (uint32_t i = 0; i < kPerSender; ++i) {
		EXPECT_EQ(tags[i], (1ull << 32) + i);
		EXPECT_EQ(tags[kPerSender + i], (2ull << 32) + i);
	}
	EXPECT_GT(matched, 0u);
	EXPECT_GT(unexpected, 0u) << "no message found every buffer taken";
	printf("%u matched, %u unexpected\n", matched, unexpected);
	Cmd quit{};
	quit.quit = 1;
	sender2.link().send_value(quit);
	sender2.wait(xsrc::harness::ms(5000));
	ibv_destroy_qp(qp2);
}

// A rendezvous: matched (IBV_WC_TM_MATCH, the tag), the data the RVH names
// read into the tagged buffer (IBV_WC_TM_DATA_VALID), then the FIN reaches
// the sender after its SEND's own completion.
TEST_F(TagMatching, RendezvousReadsTheDataAndSendsTheFin)
{
	connect_sender();
	add_tag(0x77, ~0ull, 7, 0, 16384);
	Cmd c{};
	c.len = sizeof(ibv_tmh) + sizeof(ibv_rvh);
	c.tmh_op = IBV_TMH_RNDV;
	c.tag = 0x77;
	c.app_ctx = 9;
	c.rvh_len = 10000;
	c.expect_fin = 1;
	Reply r = send(c);
	EXPECT_EQ(r.send_status, IBV_WC_SUCCESS);
	EXPECT_EQ(r.fin_status, IBV_WC_SUCCESS);
	EXPECT_EQ(r.fin_opcode, unsigned{IBV_WC_RECV});
	EXPECT_EQ(r.fin_len, sizeof(ibv_tmh));
	EXPECT_EQ(r.fin_tmh_op, uint8_t{IBV_TMH_FIN});
	EXPECT_EQ(r.fin_tag, 0x77u);
	EXPECT_TRUE(r.send_first);
	std::optional<Wc> matched = poll(), data = poll();
	ASSERT_TRUE(matched && data);
	EXPECT_EQ(matched->opcode, IBV_WC_TM_RECV);
	EXPECT_EQ(matched->wr_id, 7u);
	EXPECT_EQ(matched->flags, unsigned{IBV_WC_TM_MATCH});
	EXPECT_EQ(matched->tm.tag, 0x77u);
	EXPECT_EQ(matched->tm.priv, 9u);
	EXPECT_EQ(data->status, IBV_WC_SUCCESS);
	EXPECT_EQ(data->opcode, IBV_WC_TM_RECV);
	EXPECT_EQ(data->wr_id, 7u);
	EXPECT_EQ(data->flags, unsigned{IBV_WC_TM_DATA_VALID});
	EXPECT_EQ(data->byte_len, 10000u);
	bool same = true;
	for (uint64_t i = 0; i < 10000; ++i)
		same = same && buf[i] == rndv_byte(i);
	EXPECT_TRUE(same);
}

// A rendezvous whose data would not fit the tagged buffer is left to
// software (IBV_WC_TM_RNDV_INCOMPLETE): the RVH lands in the buffer, no
// read, no FIN. One whose rkey is not the sender's: the read fails with
// IBV_WC_REM_ACCESS_ERR, the responder QP goes to error; the SEND itself
// was delivered.
TEST_F(TagMatching, RendezvousThatCannotReadEndsInSoftwareOrError)
{
	connect_sender();
	add_tag(3, ~0ull, 3, 0, 1024);
	Cmd c{};
	c.len = sizeof(ibv_tmh) + sizeof(ibv_rvh);
	c.tmh_op = IBV_TMH_RNDV;
	c.tag = 3;
	c.rvh_len = 4096;  // over the 1024-byte buffer
	Reply r = send(c);
	EXPECT_EQ(r.send_status, IBV_WC_SUCCESS);
	EXPECT_EQ(r.fin_status, -1);
	std::optional<Wc> wc = poll();
	ASSERT_TRUE(wc);
	EXPECT_EQ(wc->status, IBV_WC_TM_RNDV_INCOMPLETE);
	EXPECT_EQ(wc->wr_id, 3u);
	EXPECT_EQ(wc->flags, unsigned{IBV_WC_TM_MATCH});
	EXPECT_EQ(wc->tm.tag, 3u);
	EXPECT_EQ(wc->byte_len, sizeof(ibv_rvh));
	ibv_rvh rvh;
	std::memcpy(&rvh, buf.data(), sizeof(rvh));
	EXPECT_EQ(be32toh(rvh.len), 4096u);
	EXPECT_TRUE(quiet());

	add_tag(4, ~0ull, 4, 0, 16384);
	c.tag = 4;
	c.rvh_len = 100;
	c.rkey_xor = 0x100;  // another key index
	r = send(c);
	EXPECT_EQ(r.send_status, IBV_WC_SUCCESS);
	std::optional<Wc> matched = poll(), failed = poll();
	ASSERT_TRUE(matched && failed);
	EXPECT_EQ(matched->flags, unsigned{IBV_WC_TM_MATCH});
	EXPECT_EQ(failed->status, IBV_WC_REM_ACCESS_ERR);
	EXPECT_EQ(failed->wr_id, 4u);
	EXPECT_EQ(xsrc::harness::qp_state(qp), IBV_QPS_ERR);
}

// A daemon serving driver ABI revision 1 to 6 (compat tests, `xsrc up
// --abi 6`): no tm_caps, and a TM SRQ is EOPNOTSUPP.
TEST(TmAbsent, BeforeRevision7)
{
	const char *expect = getenv("XSRC_EXPECT_NO_TM");
	if (!expect || std::strcmp(expect, "1") != 0)
		GTEST_SKIP() << "for the compat tests (XSRC_EXPECT_NO_TM=1)";
	ibv_context *ctx = open_xsrc0();
	ASSERT_NE(ctx, nullptr);
	ibv_device_attr_ex dev{};
	EXPECT_EQ(ibv_query_device_ex(ctx, nullptr, &dev), 0);
	EXPECT_EQ(dev.tm_caps.flags, 0u);
	EXPECT_EQ(dev.tm_caps.max_num_tags, 0u);
	ibv_pd *pd = ibv_alloc_pd(ctx);
	ibv_cq_init_attr_ex cattr{};
	cattr.cqe = 4;
	ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &cattr);
	ASSERT_TRUE(pd && cq);
	errno = 0;
	EXPECT_EQ(make_tm_srq(ctx, pd, cq, 4), nullptr);
	EXPECT_EQ(errno, EOPNOTSUPP);
	ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
}

}  // namespace

int main(int argc, char **argv)
{
	if (auto child = xsrc::harness::child_args(argc, argv, "--sender"))
		return sender_main(child->link);
	::testing::InitGoogleTest(&argc, argv);
	return RUN_ALL_TESTS();
}
