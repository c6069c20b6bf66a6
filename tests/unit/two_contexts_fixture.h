// Two contexts of one device, both "owned" by this test process: the
// fixture's (the requester) and a peer's (the responder), each with an RC QP
// connected to the other's, and the peer's MRs over `target`. The daemon
// moves bytes with process_vm_*, so what it writes shows up in our own
// buffers. Used by the XSRC_CMD_COPY and memory-window tests.
#pragma once

#include <sys/uio.h>

#include <algorithm>

#include "command_fixture.h"

namespace xsrc::test {

inline constexpr uint32_t kAll = IB_UVERBS_ACCESS_LOCAL_WRITE | IB_UVERBS_ACCESS_REMOTE_WRITE |
			  IB_UVERBS_ACCESS_REMOTE_READ | IB_UVERBS_ACCESS_REMOTE_ATOMIC;

class TwoContexts : public CommandFixture {
protected:
	void SetUp() override
	{
		CommandFixture::SetUp();
		basic_objects();
		peer.id = 2;
		peer.device = &dev;
		peer.owner = getpid();
		peer.caller = std::make_unique<ProcessCaller>(getpid());
		dev.contexts.push_back(&peer);
		xsrc_get_context_req drv{};
		drv.async_fds = peer_async.pair();
		Resp<ib_uverbs_get_context_resp, xsrc_get_context_resp> gresp;
		ib_uverbs_get_context get{};
		get.response = reinterpret_cast<uintptr_t>(&gresp);
		ASSERT_EQ(run_on(peer, IB_USER_VERBS_CMD_GET_CONTEXT, get, std::as_bytes(std::span(&drv, 1)),
				 sizeof(gresp)),
			  0);

		Resp<ib_uverbs_alloc_pd_resp, xsrc_alloc_pd_resp> pd;
		ib_uverbs_alloc_pd apd{};
		apd.response = reinterpret_cast<uintptr_t>(&pd);
		ASSERT_EQ(run_on(peer, IB_USER_VERBS_CMD_ALLOC_PD, apd, {}, sizeof(pd)), 0);
		peer_pd = pd.core().pd_handle;
		peer_pd_id = pd.drv().pd_id;
		Resp<ib_uverbs_create_cq_resp, xsrc_create_cq_resp> cq;
		ib_uverbs_create_cq ccq{};
		ccq.response = reinterpret_cast<uintptr_t>(&cq);
		ccq.cqe = 16;
		ccq.comp_channel = -1;
		ASSERT_EQ(run_on(peer, IB_USER_VERBS_CMD_CREATE_CQ, ccq, {}, sizeof(cq)), 0);
		QpSpec ps = qp_spec();
		ps.pd = peer_pd;
		ps.send_cq = ps.recv_cq = cq.core().cq_handle;
		Resp<ib_uverbs_create_qp_resp, xsrc_create_qp_resp> pq;
		ib_uverbs_create_qp cqp = create_qp_cmd(ps);
		cqp.response = reinterpret_cast<uintptr_t>(&pq);
		ASSERT_EQ(run_on(peer, IB_USER_VERBS_CMD_CREATE_QP, cqp, {}, sizeof(pq)), 0);
		peer_qp = pq.core().qp_handle;
		peer_qpn = pq.core().qpn;
		ASSERT_EQ(create_qp(qp_spec(), own), 0);
		ASSERT_EQ(create_qp(qp_spec(), stranger), 0);  // never connected

		connect(ctx, own.handle, peer_qpn, kAll);
		connect(peer, peer_qp, own.qpn, kAll);
		connect(ctx, stranger.handle, peer_qpn, kAll);  // one-sided: the peer is not connected back

		std::memset(target, 0, sizeof(target));
		peer_mr = reg_on(peer, peer_pd, target, sizeof(target), kAll);
		peer_ro = reg_on(peer, peer_pd, target, sizeof(target), IB_UVERBS_ACCESS_LOCAL_WRITE);
		peer_noloc = reg_on(peer, peer_pd, target, sizeof(target), 0);
	}
	void TearDown() override
	{
		destroy_context_objects(peer);
		CommandFixture::TearDown();
	}

	void connect(Context &c, uint32_t qp, uint32_t dest, uint32_t access)
	{
		ib_uverbs_modify_qp m{};
		m.qp_handle = qp;
		m.qp_state = IBV_QPS_INIT;
		m.attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
		m.port_num = 1;
		m.qp_access_flags = access & ~IB_UVERBS_ACCESS_LOCAL_WRITE;
		ASSERT_EQ(run_on(c, IB_USER_VERBS_CMD_MODIFY_QP, m), 0);
		m = {};
		m.qp_handle = qp;
		m.qp_state = IBV_QPS_RTR;
		m.attr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		m.dest.is_global = 1;
		m.dest.hop_limit = 64;
		m.dest.port_num = 1;
		m.dest.sgid_index = 0;
		m.path_mtu = IBV_MTU_1024;
		m.dest_qp_num = dest;
		m.max_dest_rd_atomic = 1;
		m.min_rnr_timer = 1;
		ASSERT_EQ(run_on(c, IB_USER_VERBS_CMD_MODIFY_QP, m), 0);
		m.qp_state = IBV_QPS_RTS;
		m.attr_mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			      IBV_QP_MAX_QP_RD_ATOMIC;
		m.timeout = 14;
		m.retry_cnt = 7;
		m.rnr_retry = 7;
		m.max_rd_atomic = 1;
		ASSERT_EQ(run_on(c, IB_USER_VERBS_CMD_MODIFY_QP, m), 0);
	}

	uint32_t reg_on(Context &c, uint32_t pd, void *addr, size_t len, uint32_t access)
	{
		ib_uverbs_reg_mr_resp resp{};
		EXPECT_EQ(reg_mr_on(c, pd, addr, len, access, resp), 0);
		return resp.rkey;
	}

	// A COPY as the provider sends it; the command's errno, the status in `resp`.
	int copy(xsrc_copy cmd, void *local, size_t len, xsrc_copy_resp &resp)
	{
		iov = {local, len};
		resp = {~0u, ~0u, ~0ull};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		if (!cmd.local_iov) {
			cmd.local_iov = reinterpret_cast<uintptr_t>(&iov);
			cmd.num_local = 1;
		}
		if (!cmd.length)
			cmd.length = len;
		return run(XSRC_CMD_COPY, cmd, {}, sizeof(resp));
	}

	xsrc_copy rkey_op(uint32_t op, uint32_t key, size_t offset = 0)
	{
		xsrc_copy c{};
		c.op = op;
		c.key_kind = XSRC_COPY_RKEY;
		c.key = key;
		c.qp_handle = own.handle;
		c.peer_qpn = peer_qpn;
		c.peer_addr = reinterpret_cast<uintptr_t>(target) + offset;
		return c;
	}

	bool target_is_zero() const
	{
		return std::all_of(std::begin(target), std::end(target), [](unsigned char b) { return b == 0; });
	}

	Context peer;
	Pipe peer_async;
	uint32_t peer_pd = 0, peer_pd_id = 0, peer_qp = 0, peer_qpn = 0;
	uint32_t peer_mr = 0, peer_ro = 0, peer_noloc = 0;
	CreatedQp own, stranger;
	alignas(8) unsigned char target[4096];
	iovec iov{};
};

}  // namespace xsrc::test
