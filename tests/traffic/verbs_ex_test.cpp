// The extended verbs on real traffic, in one process over loopback: work
// posted with ibv_wr_* on RC, completions read with ibv_start_poll /
// ibv_next_poll, the SRQ limit event of a basic SRQ, and the GRH a UD
// receive carries.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <chrono>
#include <ctime>
#include <utility>
#include <cstring>
#include <gtest/gtest.h>
#include <thread>
#include <vector>

#include "harness/qp_connect.h"

namespace {

constexpr int kPort = 1;
constexpr int kGidIndex = 1;

struct Device {
	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	Device()
	{
		int n = 0;
		ibv_device **list = ibv_get_device_list(&n);
		for (int i = 0; list && i < n && !ctx; ++i)
			if (std::strcmp(ibv_get_device_name(list[i]), "xsrc0") == 0)
				ctx = ibv_open_device(list[i]);
		ibv_free_device_list(list);
		if (ctx)
			pd = ibv_alloc_pd(ctx);
	}
	~Device()
	{
		if (pd)
			ibv_dealloc_pd(pd);
		if (ctx)
			ibv_close_device(ctx);
	}
};

ibv_cq_ex *make_cq_ex(ibv_context *ctx)
{
	ibv_cq_init_attr_ex attr{};
	attr.cqe = 64;
	attr.wc_flags = IBV_WC_STANDARD_FLAGS;
	return ibv_create_cq_ex(ctx, &attr);
}

ibv_qp *make_qp(Device &d, ibv_qp_type type, ibv_cq *cq, ibv_srq *srq, bool ex)
{
	ibv_qp_init_attr_ex attr{};
	attr.qp_type = type;
	attr.send_cq = cq;
	attr.recv_cq = cq;
	attr.srq = srq;
	attr.cap = {16, srq ? 0u : 16u, 2, 2, 64};
	attr.pd = d.pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD;
	if (ex) {
		attr.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
				      IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
				      IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
	}
	return ibv_create_qp_ex(d.ctx, &attr);
}

// RESET -> INIT -> RTR -> RTS towards `dest` on this device.
void connect_rc(Device &d, ibv_qp *qp, uint32_t dest)
{
	xsrc::harness::QpConnectAttrs a;
	a.port = kPort;
	a.sgid_index = kGidIndex;
	xsrc::harness::QpRemote remote{dest, {}};
	ASSERT_EQ(ibv_query_gid(d.ctx, kPort, kGidIndex, &remote.gid), 0);
	auto step = xsrc::harness::qp_connect(qp, remote, a);
	ASSERT_FALSE(step) << step.text();
}

struct Completion {
	uint64_t wr_id;
	ibv_wc_status status;
	ibv_wc_opcode opcode;
	uint32_t byte_len;
	uint32_t qp_num;
	unsigned wc_flags;
	uint32_t imm;
};

// Reads `n` completions through ibv_start_poll / ibv_next_poll (bounded).
std::vector<Completion> poll_ex(ibv_cq_ex *cq, size_t n)
{
	std::vector<Completion> out;
	auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
	while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
		ibv_poll_cq_attr attr{};
		if (ibv_start_poll(cq, &attr) != 0)
			continue;
		do {
			out.push_back({cq->wr_id, cq->status, ibv_wc_read_opcode(cq), ibv_wc_read_byte_len(cq),
				       ibv_wc_read_qp_num(cq), ibv_wc_read_wc_flags(cq),
				       ntohl(ibv_wc_read_imm_data(cq))});
		} while (out.size() < n && ibv_next_poll(cq) == 0);
		ibv_end_poll(cq);
	}
	return out;
}

TEST(VerbsEx, WrApiAndExtendedPollOnRc)
{
	Device d;
	ASSERT_NE(d.pd, nullptr);
	ibv_cq_ex *cq = make_cq_ex(d.ctx);
	ASSERT_NE(cq, nullptr);
	ibv_qp *a = make_qp(d, IBV_QPT_RC, ibv_cq_ex_to_cq(cq), nullptr, true);
	ibv_qp *b = make_qp(d, IBV_QPT_RC, ibv_cq_ex_to_cq(cq), nullptr, false);
	ASSERT_TRUE(a && b);
	connect_rc(d, a, b->qp_num);
	connect_rc(d, b, a->qp_num);

	std::vector<uint64_t> src(512, 0x1111111111111111ull), dst(512, 0), counter(1, 40);
	int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	ibv_mr *smr = ibv_reg_mr(d.pd, src.data(), 4096, rw);
	ibv_mr *dmr = ibv_reg_mr(d.pd, dst.data(), 4096, rw);
	ibv_mr *cmr = ibv_reg_mr(d.pd, counter.data(), 8, rw);
	ASSERT_TRUE(smr && dmr && cmr);

	ibv_sge rsge{reinterpret_cast<uintptr_t>(dst.data()), 1024, dmr->lkey};
	ibv_recv_wr rwr{};
	rwr.wr_id = 100;
	rwr.sg_list = &rsge;
	rwr.num_sge = 1;
	ibv_recv_wr *bad_r;
	ASSERT_EQ(ibv_post_recv(b, &rwr, &bad_r), 0);

	ibv_qp_ex *qx = ibv_qp_to_qp_ex(a);
	ASSERT_NE(qx, nullptr);
	ibv_wr_start(qx);
	qx->wr_id = 1;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(qx, htonl(0xabcd));
	ibv_wr_set_sge(qx, smr->lkey, reinterpret_cast<uintptr_t>(src.data()), 100);
	qx->wr_id = 2;
	ibv_wr_rdma_write(qx, dmr->rkey, reinterpret_cast<uintptr_t>(dst.data()) + 2048);
	ibv_wr_set_sge(qx, smr->lkey, reinterpret_cast<uintptr_t>(src.data()), 512);
	qx->wr_id = 3;
	ibv_wr_rdma_read(qx, dmr->rkey, reinterpret_cast<uintptr_t>(dst.data()) + 2048);
	ibv_wr_set_sge(qx, smr->lkey, reinterpret_cast<uintptr_t>(src.data()) + 3072, 512);
	qx->wr_id = 4;
	ibv_wr_atomic_fetch_add(qx, cmr->rkey, reinterpret_cast<uintptr_t>(counter.data()), 2);
	ibv_wr_set_sge(qx, smr->lkey, reinterpret_cast<uintptr_t>(src.data()) + 4088, 8);
	ASSERT_EQ(ibv_wr_complete(qx), 0);

	auto wcs = poll_ex(cq, 5);
	ASSERT_EQ(wcs.size(), 5u);
	std::vector<Completion> sends, recvs;
	for (auto &w : wcs)
		(w.wr_id == 100 ? recvs : sends).push_back(w);
	ASSERT_EQ(recvs.size(), 1u);
	EXPECT_EQ(recvs[0].status, IBV_WC_SUCCESS);
	EXPECT_EQ(recvs[0].opcode, IBV_WC_RECV);
	EXPECT_EQ(recvs[0].byte_len, 100u);
	EXPECT_EQ(recvs[0].qp_num, b->qp_num);
	EXPECT_TRUE(recvs[0].wc_flags & IBV_WC_WITH_IMM);
	EXPECT_EQ(recvs[0].imm, 0xabcdu);
	ASSERT_EQ(sends.size(), 4u);
	const ibv_wc_opcode expected[] = {IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_FETCH_ADD};
	for (size_t i = 0; i < 4; ++i) {
		EXPECT_EQ(sends[i].wr_id, i + 1);  // in order
		EXPECT_EQ(sends[i].status, IBV_WC_SUCCESS);
		EXPECT_EQ(sends[i].opcode, expected[i]);
		EXPECT_EQ(sends[i].qp_num, a->qp_num);
	}
	EXPECT_EQ(std::memcmp(dst.data(), src.data(), 100), 0);          // the send
	EXPECT_EQ(std::memcmp(dst.data() + 256, src.data(), 512), 0);    // the write
	EXPECT_EQ(std::memcmp(src.data() + 384, src.data(), 512), 0);    // read back
	EXPECT_EQ(src[511], 40u);   // fetch-add returned the original
	EXPECT_EQ(counter[0], 42u);

	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(dmr);
	ibv_dereg_mr(cmr);
	ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
}

TEST(VerbsEx, BasicSrqLimitEvent)
{
	Device d;
	ASSERT_NE(d.pd, nullptr);
	ibv_cq *cq = ibv_create_cq(d.ctx, 64, nullptr, nullptr, 0);
	ibv_srq_init_attr sattr{};
	sattr.attr = {32, 1, 0};
	ibv_srq *srq = ibv_create_srq(d.pd, &sattr);
	ASSERT_TRUE(cq && srq);
	ibv_qp *a = make_qp(d, IBV_QPT_RC, cq, nullptr, false);
	ibv_qp *b = make_qp(d, IBV_QPT_RC, cq, srq, false);
	ASSERT_TRUE(a && b);
	connect_rc(d, a, b->qp_num);
	connect_rc(d, b, a->qp_num);

	std::vector<char> buf(4096);
	ibv_mr *mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(mr, nullptr);
	for (int i = 0; i < 4; ++i) {
		ibv_sge s{reinterpret_cast<uintptr_t>(buf.data()) + 64u * i, 64, mr->lkey};
		ibv_recv_wr r{};
		r.wr_id = 10 + i;
		r.sg_list = &s;
		r.num_sge = 1;
		ibv_recv_wr *bad;
		ASSERT_EQ(ibv_post_srq_recv(srq, &r, &bad), 0);
	}
	ibv_srq_attr lim{};
	lim.srq_limit = 3;
	ASSERT_EQ(ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT), 0);

	// Two sends take the SRQ from 4 to 2 receives: below the limit of 3.
	for (int i = 0; i < 2; ++i) {
		ibv_sge s{reinterpret_cast<uintptr_t>(buf.data()) + 2048, 8, mr->lkey};
		ibv_send_wr w{};
		w.wr_id = i;
		w.sg_list = &s;
		w.num_sge = 1;
		w.opcode = IBV_WR_SEND;
		w.send_flags = IBV_SEND_SIGNALED;
		ibv_send_wr *bad;
		ASSERT_EQ(ibv_post_send(a, &w, &bad), 0);
	}
	pollfd p{d.ctx->async_fd, POLLIN, 0};
	ASSERT_EQ(poll(&p, 1, 5000), 1) << "no SRQ limit event";
	ibv_async_event ev{};
	ASSERT_EQ(ibv_get_async_event(d.ctx, &ev), 0);
	EXPECT_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
	EXPECT_EQ(ev.element.srq, srq);
	ibv_ack_async_event(&ev);
	ibv_srq_attr now{};
	ASSERT_EQ(ibv_query_srq(srq, &now), 0);
	EXPECT_EQ(now.srq_limit, 0u);  // the event disarms it

	ibv_wc wc[8];
	int got = 0;
	for (int spins = 0; got < 4 && spins < 1000000; ++spins)
		got += ibv_poll_cq(cq, 8 - got, wc + got);
	EXPECT_EQ(got, 4);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_srq(srq);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
}

TEST(VerbsEx, UdReceiveCarriesTheGrh)
{
	Device d;
	ASSERT_NE(d.pd, nullptr);
	ibv_cq *cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
	ibv_qp_init_attr qa{};
	qa.send_cq = qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_UD;
	qa.cap = {4, 4, 1, 1, 0};
	ibv_qp *a = ibv_create_qp(d.pd, &qa), *b = ibv_create_qp(d.pd, &qa);
	ASSERT_TRUE(cq && a && b);
	xsrc::harness::QpConnectAttrs ud;
	ud.port = kPort;
	ud.qkey = 0x11111111;
	for (ibv_qp *qp : {a, b}) {
		auto step = xsrc::harness::qp_connect(qp, {}, ud);
		ASSERT_FALSE(step) << step.text();
	}
	std::vector<unsigned char> buf(256, 0);
	ibv_mr *mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
	ibv_sge rs{reinterpret_cast<uintptr_t>(buf.data()), 128, mr->lkey};
	ibv_recv_wr r{};
	r.sg_list = &rs;
	r.num_sge = 1;
	ibv_recv_wr *bad_r;
	ASSERT_EQ(ibv_post_recv(b, &r, &bad_r), 0);

	ibv_ah_attr ah{};
	ah.is_global = 1;
	ah.port_num = kPort;
	ah.grh.sgid_index = kGidIndex;
	ah.grh.hop_limit = 1;
	ibv_gid gid;
	ASSERT_EQ(ibv_query_gid(d.ctx, kPort, kGidIndex, &gid), 0);
	ah.grh.dgid = gid;
	ibv_ah *handle = ibv_create_ah(d.pd, &ah);
	ASSERT_NE(handle, nullptr);
	std::memcpy(buf.data() + 200, "payload!", 8);
	ibv_sge ss{reinterpret_cast<uintptr_t>(buf.data()) + 200, 8, mr->lkey};
	ibv_send_wr w{};
	w.sg_list = &ss;
	w.num_sge = 1;
	w.opcode = IBV_WR_SEND;
	w.send_flags = IBV_SEND_SIGNALED;
	w.wr.ud.ah = handle;
	w.wr.ud.remote_qpn = b->qp_num;
	w.wr.ud.remote_qkey = 0x11111111;
	ibv_send_wr *bad;
	ASSERT_EQ(ibv_post_send(a, &w, &bad), 0);

	ibv_wc wc[2];
	int got = 0;
	for (int spins = 0; got < 2 && spins < 1000000; ++spins)
		got += ibv_poll_cq(cq, 2 - got, wc + got);
	ASSERT_EQ(got, 2);
	const ibv_wc &recv = wc[0].opcode == IBV_WC_RECV ? wc[0] : wc[1];
	EXPECT_EQ(recv.status, IBV_WC_SUCCESS);
	EXPECT_EQ(recv.byte_len, 40u + 8u);
	EXPECT_TRUE(recv.wc_flags & IBV_WC_GRH);
	EXPECT_EQ(recv.src_qp, a->qp_num);
	ibv_grh grh;
	std::memcpy(&grh, buf.data(), sizeof(grh));
	EXPECT_EQ(std::memcmp(&grh.sgid, &gid, 16), 0);
	EXPECT_EQ(std::memcmp(&grh.dgid, &gid, 16), 0);
	EXPECT_EQ(std::memcmp(buf.data() + 40, "payload!", 8), 0);

	ibv_destroy_ah(handle);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
}

}  // namespace

namespace {

uint64_t clock_ns(clockid_t clock)
{
	timespec ts{};
	clock_gettime(clock, &ts);
	return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

ibv_cq_ex *make_stamped_cq(ibv_context *ctx, uint64_t stamp)
{
	ibv_cq_init_attr_ex attr{};
	attr.cqe = 16;
	attr.wc_flags = IBV_WC_STANDARD_FLAGS | stamp;
	return ibv_create_cq_ex(ctx, &attr);
}

// One signaled SEND a -> b; returns {send stamp, receive stamp}.
std::pair<uint64_t, uint64_t> stamped_send(Device &d, ibv_cq_ex *scq, ibv_cq_ex *rcq, bool wallclock)
{
	ibv_qp_init_attr_ex attr{};
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = ibv_cq_ex_to_cq(scq);
	attr.recv_cq = ibv_cq_ex_to_cq(rcq);
	attr.cap = {4, 4, 1, 1, 0};
	attr.pd = d.pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD;
	ibv_qp *a = ibv_create_qp_ex(d.ctx, &attr);
	ibv_qp *b = ibv_create_qp_ex(d.ctx, &attr);
	EXPECT_TRUE(a && b);
	if (!a || !b)
		return {0, 0};
	connect_rc(d, a, b->qp_num);
	connect_rc(d, b, a->qp_num);
	std::vector<char> buf(64, 'x');
	ibv_mr *mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
	EXPECT_NE(mr, nullptr);
	ibv_sge rsge{reinterpret_cast<uintptr_t>(buf.data()) + 32, 32, mr->lkey};
	ibv_recv_wr rwr{};
	rwr.sg_list = &rsge;
	rwr.num_sge = 1;
	ibv_recv_wr *bad_r;
	EXPECT_EQ(ibv_post_recv(b, &rwr, &bad_r), 0);
	ibv_sge ssge{reinterpret_cast<uintptr_t>(buf.data()), 32, mr->lkey};
	ibv_send_wr swr{};
	swr.sg_list = &ssge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	ibv_send_wr *bad_s;
	EXPECT_EQ(ibv_post_send(a, &swr, &bad_s), 0);
	uint64_t stamps[2] = {0, 0};
	ibv_cq_ex *cqs[2] = {scq, rcq};
	for (int i = 0; i < 2; ++i) {
		ibv_poll_cq_attr pa{};
		auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
		int ret;
		while ((ret = ibv_start_poll(cqs[i], &pa)) == ENOENT && std::chrono::steady_clock::now() < deadline)
			;
		EXPECT_EQ(ret, 0);
		if (ret)
			continue;
		EXPECT_EQ(cqs[i]->status, IBV_WC_SUCCESS);
		stamps[i] = wallclock ? ibv_wc_read_completion_wallclock_ns(cqs[i]) : ibv_wc_read_completion_ts(cqs[i]);
		ibv_end_poll(cqs[i]);
	}
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(mr);
	return {stamps[0], stamps[1]};
}

}  // namespace

// The free-running stamps are the device clock ibv_query_rt_values_ex reads,
// in hca_core_clock units; the wall-clock ones are CLOCK_REALTIME.
TEST(VerbsEx, CompletionTimestampsFollowTheDeviceClock)
{
	Device d;
	ASSERT_NE(d.pd, nullptr);
	ibv_device_attr_ex dev{};
	ASSERT_EQ(ibv_query_device_ex(d.ctx, nullptr, &dev), 0);
	EXPECT_EQ(dev.hca_core_clock, 1000000u);  // kHz: a nanosecond counter
	EXPECT_EQ(dev.completion_timestamp_mask, UINT64_MAX);

	ibv_values_ex before{};
	before.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
	ASSERT_EQ(ibv_query_rt_values_ex(d.ctx, &before), 0);
	EXPECT_EQ(before.comp_mask, static_cast<uint32_t>(IBV_VALUES_MASK_RAW_CLOCK));
	EXPECT_EQ(before.raw_clock.tv_sec, 0);
	ibv_cq_ex *scq = make_stamped_cq(d.ctx, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP);
	ibv_cq_ex *rcq = make_stamped_cq(d.ctx, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP);
	ASSERT_TRUE(scq && rcq);
	auto [s, r] = stamped_send(d, scq, rcq, false);
	ibv_values_ex after{};
	after.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
	ASSERT_EQ(ibv_query_rt_values_ex(d.ctx, &after), 0);
	uint64_t t0 = static_cast<uint64_t>(before.raw_clock.tv_nsec);
	uint64_t t1 = static_cast<uint64_t>(after.raw_clock.tv_nsec);
	EXPECT_LE(t0, s);
	EXPECT_LE(s, r);  // polled in that order
	EXPECT_LE(r, t1);
	ibv_destroy_cq(ibv_cq_ex_to_cq(scq));
	ibv_destroy_cq(ibv_cq_ex_to_cq(rcq));

	uint64_t w0 = clock_ns(CLOCK_REALTIME);
	scq = make_stamped_cq(d.ctx, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK);
	rcq = make_stamped_cq(d.ctx, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK);
	ASSERT_TRUE(scq && rcq);
	auto [ws, wr] = stamped_send(d, scq, rcq, true);
	uint64_t w1 = clock_ns(CLOCK_REALTIME);
	EXPECT_LE(w0, ws);
	EXPECT_LE(ws, wr);
	EXPECT_LE(wr, w1);
	ibv_destroy_cq(ibv_cq_ex_to_cq(scq));
	ibv_destroy_cq(ibv_cq_ex_to_cq(rcq));

	ibv_values_ex bad{};
	bad.comp_mask = 1u << 5;
	EXPECT_EQ(ibv_query_rt_values_ex(d.ctx, &bad), EINVAL);
}

// Raw-packet-only completion fields stay refused; so do CQ flags xsrc lacks.
TEST(VerbsEx, CqExRefusesWhatItCannotReport)
{
	Device d;
	ASSERT_NE(d.ctx, nullptr);
	for (uint64_t flag : {uint64_t{IBV_WC_EX_WITH_CVLAN}, uint64_t{IBV_WC_EX_WITH_FLOW_TAG}}) {
		ibv_cq_init_attr_ex attr{};
		attr.cqe = 4;
		attr.wc_flags = flag;
		errno = 0;
		EXPECT_EQ(ibv_create_cq_ex(d.ctx, &attr), nullptr);
		EXPECT_EQ(errno, EOPNOTSUPP);
	}
	ibv_cq_init_attr_ex attr{};
	attr.cqe = 4;
	attr.wc_flags = IBV_WC_EX_WITH_TM_INFO;
	ibv_cq_ex *cq = ibv_create_cq_ex(d.ctx, &attr);
	ASSERT_NE(cq, nullptr);  // tm_info reads zero but for a matched tagged message (tm_test)
	ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
	attr.cqe = 1u << 30;   // over max_cqe
	errno = 0;
	EXPECT_EQ(ibv_create_cq_ex(d.ctx, &attr), nullptr);
	EXPECT_EQ(errno, EINVAL);
}

// IBV_QP_INIT_ATTR_CREATE_FLAGS: none, or BLOCK_SELF_MCAST_LB on UD; anything
// else is EOPNOTSUPP.
TEST(VerbsEx, QpCreateFlags)
{
	Device d;
	ASSERT_NE(d.pd, nullptr);
	ibv_cq *cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
	ASSERT_NE(cq, nullptr);
	auto create = [&](ibv_qp_type type, uint32_t flags) {
		ibv_qp_init_attr_ex attr{};
		attr.qp_type = type;
		attr.send_cq = cq;
		attr.recv_cq = cq;
		attr.cap = {4, 4, 1, 1, 0};
		attr.pd = d.pd;
		attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
		attr.create_flags = flags;
		errno = 0;
		return ibv_create_qp_ex(d.ctx, &attr);
	};
	for (ibv_qp_type type : {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD}) {
		ibv_qp *qp = create(type, 0);
		ASSERT_NE(qp, nullptr) << type;
		ibv_destroy_qp(qp);
	}
	ibv_qp *ud = create(IBV_QPT_UD, IBV_QP_CREATE_BLOCK_SELF_MCAST_LB);
	ASSERT_NE(ud, nullptr);
	ibv_destroy_qp(ud);
	EXPECT_EQ(create(IBV_QPT_RC, IBV_QP_CREATE_BLOCK_SELF_MCAST_LB), nullptr);
	EXPECT_EQ(errno, EOPNOTSUPP);
	EXPECT_EQ(create(IBV_QPT_UD, IBV_QP_CREATE_SCATTER_FCS), nullptr);
	EXPECT_EQ(errno, EOPNOTSUPP);
	ibv_destroy_cq(cq);
}

// A QP moved back to RESET takes its completions still in the CQ with it (as
// libmlx5 does), and only its own: another QP's completion stays.
TEST(VerbsEx, ResetDropsTheQpsCompletions)
{
	Device d;
	ASSERT_NE(d.pd, nullptr);
	ibv_cq *cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
	ASSERT_NE(cq, nullptr);
	ibv_qp_init_attr_ex attr{};
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = cq;
	attr.recv_cq = cq;
	attr.cap = {4, 4, 1, 1, 0};
	attr.pd = d.pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD;
	ibv_qp *a = ibv_create_qp_ex(d.ctx, &attr);
	ibv_qp *b = ibv_create_qp_ex(d.ctx, &attr);
	ASSERT_TRUE(a && b);
	std::vector<char> buf(64);
	ibv_mr *mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(mr, nullptr);
	ibv_qp_attr init{};
	init.qp_state = IBV_QPS_INIT;
	init.port_num = kPort;
	for (ibv_qp *qp : {a, b}) {
		ASSERT_EQ(ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
		ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), 64, mr->lkey};
		ibv_recv_wr rwr{};
		rwr.wr_id = qp->qp_num;
		rwr.sg_list = &sge;
		rwr.num_sge = 1;
		ibv_recv_wr *bad;
		ASSERT_EQ(ibv_post_recv(qp, &rwr, &bad), 0);
		ibv_qp_attr err{};
		err.qp_state = IBV_QPS_ERR;
		ASSERT_EQ(ibv_modify_qp(qp, &err, IBV_QP_STATE), 0);  // flushes the receive
	}
	ibv_qp_attr reset{};
	reset.qp_state = IBV_QPS_RESET;
	ASSERT_EQ(ibv_modify_qp(a, &reset, IBV_QP_STATE), 0);
	ibv_wc wc[4];
	ASSERT_EQ(ibv_poll_cq(cq, 4, wc), 1);
	EXPECT_EQ(wc[0].qp_num, b->qp_num);
	EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
	EXPECT_EQ(ibv_poll_cq(cq, 4, wc), 0);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
}
