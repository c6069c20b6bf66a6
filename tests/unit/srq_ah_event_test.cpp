// SRQ and AH commands, XSRC_CMD_RAISE_EVENT (completion and async events,
// their pipes and their counts, from any context of the device), and
// context teardown leaving the arena's tables empty.
#include "common/tm_table.h"
#include "command_fixture.h"

namespace xsrc::test {
namespace {

class SrqAhEventTest : public test::CommandFixture {
protected:
	void SetUp() override
	{
		CommandFixture::SetUp();
		basic_objects();
	}

	int modify_srq(uint32_t srq, uint32_t mask, uint32_t max_wr, uint32_t limit)
	{
		ib_uverbs_modify_srq cmd{};
		cmd.srq_handle = srq;
		cmd.attr_mask = mask;
		cmd.max_wr = max_wr;
		cmd.srq_limit = limit;
		return run(IB_USER_VERBS_CMD_MODIFY_SRQ, cmd);
	}

	int query_srq(uint32_t srq, ib_uverbs_query_srq_resp &resp)
	{
		ib_uverbs_query_srq cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.srq_handle = srq;
		return run(IB_USER_VERBS_CMD_QUERY_SRQ, cmd, {}, sizeof(resp));
	}

	ib_uverbs_create_ah ah_cmd(uint32_t pd) const
	{
		ib_uverbs_create_ah cmd{};
		cmd.user_handle = 0xa4;
		cmd.pd_handle = pd;
		cmd.attr.is_global = 1;
		cmd.attr.port_num = 1;
		cmd.attr.grh.sgid_index = 0;
		cmd.attr.grh.hop_limit = 1;
		cmd.attr.grh.dgid[15] = 1;
		return cmd;
	}

	int create_ah(ib_uverbs_create_ah cmd, uint32_t &handle)
	{
		ib_uverbs_create_ah_resp resp{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		int err = run(IB_USER_VERBS_CMD_CREATE_AH, cmd, {}, sizeof(resp));
		handle = resp.ah_handle;
		return err;
	}

	int destroy_ah(uint32_t ah)
	{
		ib_uverbs_destroy_ah cmd{ah};
		return run(IB_USER_VERBS_CMD_DESTROY_AH, cmd);
	}
};

TEST_F(SrqAhEventTest, SrqCreatePublishesEntryAndRing)
{
	ib_uverbs_create_srq_resp core{};
	xsrc_create_srq_resp drv{};
	uint32_t srq;
	ASSERT_EQ(create_srq(pd0, 100, 4, srq, &core, &drv), 0);
	EXPECT_EQ(core.max_wr, 100u);
	EXPECT_EQ(core.max_sge, 4u);
	EXPECT_GE(core.srqn, uint32_t(XSRC_SRQN_BASE));
	const xsrc_srq_entry &e = srq_entry(core.srqn);
	EXPECT_EQ(e.srqn, core.srqn);
	EXPECT_EQ(e.owner_pid, uint32_t(getpid()));
	EXPECT_EQ(e.owner_context, ctx.id);
	EXPECT_EQ(e.ring_off, drv.ring_off);
	EXPECT_EQ(e.pd_id, pd0_id);
	EXPECT_EQ(e.srq_type, uint32_t(IBV_SRQT_BASIC));
	EXPECT_EQ(e.cq_off, 0u);
	auto &ring = arena().at<xsrc_recv_ring>(drv.ring_off);
	EXPECT_EQ(ring.num_entries, 256u);  // pow2 >= 2 * (100 + 1)
	EXPECT_EQ(ring.stride, 128u);  // 24 + 4 * 16 = 88, 64-aligned
	EXPECT_EQ(ring.max_wr, 100u);
	EXPECT_EQ(ring.max_sge, 4u);
	EXPECT_EQ(ring.srq_limit, 0u);

	ASSERT_EQ(destroy_srq(srq), 0);
	EXPECT_EQ(e.srqn, 0u);
	EXPECT_EQ(e.ring_off, 0u);
	EXPECT_FALSE(arena().allocated(drv.ring_off));
	EXPECT_EQ(destroy_srq(srq), EINVAL);
}

TEST_F(SrqAhEventTest, SrqCreateValidates)
{
	uint32_t srq;
	EXPECT_EQ(create_srq(pd0, 0, 1, srq), EINVAL);
	EXPECT_EQ(create_srq(pd0, DeviceLimits::max_srq_wr + 1, 1, srq), EINVAL);
	EXPECT_EQ(create_srq(pd0, 8, DeviceLimits::max_sge + 1, srq), EINVAL);
	EXPECT_EQ(create_srq(cq0, 8, 1, srq), EINVAL);

	Resp<ib_uverbs_create_srq_resp, xsrc_create_srq_resp> resp;
	ib_uverbs_create_xsrq x{};
	x.response = reinterpret_cast<uintptr_t>(&resp);
	x.pd_handle = pd0;
	x.max_wr = 8;
	x.max_sge = 1;
	x.srq_type = IBV_SRQT_XRC;  // without an XRC domain handle (xrc_commands_test.cpp has them)
	x.xrcd_handle = pd0;
	x.cq_handle = cq0;
	EXPECT_EQ(run(IB_USER_VERBS_CMD_CREATE_XSRQ, x, {}, sizeof(resp)), EINVAL);
	x.srq_type = IBV_SRQT_TM;  // a tag list of 0, or longer than the device's
	EXPECT_EQ(run(IB_USER_VERBS_CMD_CREATE_XSRQ, x, {}, sizeof(resp)), EINVAL);
	x.max_num_tags = DeviceLimits::max_num_tags + 1;
	EXPECT_EQ(run(IB_USER_VERBS_CMD_CREATE_XSRQ, x, {}, sizeof(resp)), EINVAL);
	x.max_num_tags = 4;
	x.cq_handle = pd0;  // not a CQ
	EXPECT_EQ(run(IB_USER_VERBS_CMD_CREATE_XSRQ, x, {}, sizeof(resp)), EINVAL);
	x.cq_handle = cq0;
	x.max_num_tags = 0;
	x.srq_type = 7;
	EXPECT_EQ(run(IB_USER_VERBS_CMD_CREATE_XSRQ, x, {}, sizeof(resp)), EINVAL);
	x.srq_type = IBV_SRQT_BASIC;
	ASSERT_EQ(run(IB_USER_VERBS_CMD_CREATE_XSRQ, x, {}, sizeof(resp)), 0);
	EXPECT_EQ(srq_entry(resp.core().srqn).ring_off, resp.drv().ring_off);
	EXPECT_EQ(dev.srq_slots.used(), 1u);
}

// A tag-matching SRQ (driver ABI r7): its tag table follows its ring, every
// entry free, sized by max_num_tags and the SRQ's SGEs; the CQ is held.
TEST_F(SrqAhEventTest, TmSrqLaysOutItsTagTable)
{
	Resp<ib_uverbs_create_srq_resp, xsrc_create_srq_resp> resp;
	ib_uverbs_create_xsrq x{};
	x.response = reinterpret_cast<uintptr_t>(&resp);
	x.pd_handle = pd0;
	x.max_wr = 8;
	x.max_sge = 2;
	x.srq_type = IBV_SRQT_TM;
	x.cq_handle = cq0;
	x.max_num_tags = 5;
	ASSERT_EQ(run(IB_USER_VERBS_CMD_CREATE_XSRQ, x, {}, sizeof(resp)), 0);
	const xsrc_srq_entry &e = srq_entry(resp.core().srqn);
	EXPECT_EQ(e.srq_type, uint32_t(IBV_SRQT_TM));
	auto &ring = arena().at<xsrc_recv_ring>(resp.drv().ring_off);
	auto &table = arena().at<xsrc_tm_table>(tm_table_offset(resp.drv().ring_off, ring));
	EXPECT_EQ(table.num_tags, 5u);
	EXPECT_EQ(table.max_sge, 2u);
	EXPECT_EQ(table.stride, tm_entry_stride(2));
	EXPECT_TRUE(tm_table_sane(table, tm_table_bytes(5, 2)));
	for (uint32_t i = 0; i < table.num_tags; ++i)
		EXPECT_EQ(tm_entry_at(&table, i)->state, uint32_t(XSRC_TM_FREE));
	EXPECT_EQ(destroy_cq(cq0), EBUSY);  // the SRQ's list operations complete there
}

TEST_F(SrqAhEventTest, SrqLimitAndResizeWithinTheRing)
{
	uint32_t srq;
	xsrc_create_srq_resp drv{};
	ASSERT_EQ(create_srq(pd0, 100, 1, srq, nullptr, &drv), 0);  // a ring of 256
	auto &ring = arena().at<xsrc_recv_ring>(drv.ring_off);

	ASSERT_EQ(modify_srq(srq, IBV_SRQ_LIMIT, 0, 10), 0);
	EXPECT_EQ(ring.srq_limit, 10u);
	EXPECT_EQ(modify_srq(srq, IBV_SRQ_LIMIT, 0, 101), EINVAL);
	EXPECT_EQ(modify_srq(srq, 4, 0, 0), EINVAL);

	EXPECT_EQ(modify_srq(srq, IBV_SRQ_MAX_WR, 128, 0), EOPNOTSUPP);  // beyond the ring
	ASSERT_EQ(modify_srq(srq, IBV_SRQ_MAX_WR, 127, 0), 0);
	EXPECT_EQ(ring.max_wr, 127u);
	ring.tail = 50;  // fifty posted receives
	EXPECT_EQ(modify_srq(srq, IBV_SRQ_MAX_WR, 49, 0), EINVAL);
	ASSERT_EQ(modify_srq(srq, IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT, 60, 5), 0);
	EXPECT_EQ(modify_srq(srq, IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT, 60, 61), EINVAL);

	ib_uverbs_query_srq_resp q{};
	ASSERT_EQ(query_srq(srq, q), 0);
	EXPECT_EQ(q.max_wr, 60u);
	EXPECT_EQ(q.max_sge, 1u);
	EXPECT_EQ(q.srq_limit, 5u);
	EXPECT_EQ(query_srq(pd0, q), EINVAL);
}

TEST_F(SrqAhEventTest, AddressHandles)
{
	uint32_t ah;
	auto cmd = ah_cmd(pd0);
	ASSERT_EQ(create_ah(cmd, ah), 0);
	EXPECT_EQ(std::get<Ah>(ctx.objects.at(ah)).attr.grh.dgid[15], 1);
	ib_uverbs_dealloc_pd dealloc{pd0};
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEALLOC_PD, dealloc), EBUSY);

	uint32_t bad;
	cmd = ah_cmd(pd0);
	cmd.attr.port_num = 2;
	EXPECT_EQ(create_ah(cmd, bad), EINVAL);
	cmd = ah_cmd(pd0);
	cmd.attr.is_global = 0;
	EXPECT_EQ(create_ah(cmd, bad), EINVAL);
	cmd = ah_cmd(pd0);
	cmd.attr.grh.sgid_index = DeviceLimits::gid_tbl_len;
	EXPECT_EQ(create_ah(cmd, bad), EINVAL);
	cmd = ah_cmd(cq0);
	EXPECT_EQ(create_ah(cmd, bad), EINVAL);
	cmd = ah_cmd(pd0);
	cmd.reserved = 1;
	EXPECT_EQ(create_ah(cmd, bad), EINVAL);

	EXPECT_EQ(destroy_ah(pd0), EINVAL);
	ASSERT_EQ(destroy_ah(ah), 0);
	EXPECT_EQ(destroy_ah(ah), EINVAL);
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEALLOC_PD, dealloc), 0);
}

TEST_F(SrqAhEventTest, CompletionEventsGoToTheChannelAndAreCounted)
{
	int ch;
	ASSERT_EQ(create_channel(ch), 0);
	uint32_t cq;
	uint64_t ring = 0;
	ASSERT_EQ(create_cq(16, ch, cq, &ring, 0xc0ffee), 0);
	ASSERT_EQ(raise_event(XSRC_EVENT_CQ_COMPLETION, ring), 0);
	ASSERT_EQ(raise_event(XSRC_EVENT_CQ_COMPLETION, ring), 0);
	auto events = test::records<ib_uverbs_comp_event_desc>(chan[0].drain());
	ASSERT_EQ(events.size(), 2u);
	EXPECT_EQ(events[0].cq_handle, 0xc0ffeeu);

	// A full pipe drops the event: not counted, or ibv_destroy_cq would wait forever.
	fcntl(chan[0].wr, F_SETFL, O_WRONLY | O_NONBLOCK);
	uint64_t filler = 0;
	while (write(chan[0].wr, &filler, sizeof(filler)) == sizeof(filler)) {
	}
	ASSERT_EQ(raise_event(XSRC_EVENT_CQ_COMPLETION, ring), 0);
	chan[0].drain();

	// A CQ without a channel has nobody to wake.
	ASSERT_EQ(raise_event(XSRC_EVENT_CQ_COMPLETION, cq0_ring), 0);

	// The ring a resize retired still names the CQ.
	Resp<ib_uverbs_resize_cq_resp, xsrc_resize_cq_resp> rr;
	ib_uverbs_resize_cq resize{};
	resize.response = reinterpret_cast<uintptr_t>(&rr);
	resize.cq_handle = cq;
	resize.cqe = 500;
	ASSERT_EQ(run(IB_USER_VERBS_CMD_RESIZE_CQ, resize, {}, sizeof(rr)), 0);
	ASSERT_EQ(raise_event(XSRC_EVENT_CQ_COMPLETION, ring), 0);
	ASSERT_EQ(raise_event(XSRC_EVENT_CQ_COMPLETION, rr.drv().ring_off), 0);
	EXPECT_EQ(chan[0].drain().size(), 16u);

	ib_uverbs_destroy_cq_resp dr{};
	ASSERT_EQ(destroy_cq(cq, &dr), 0);
	EXPECT_EQ(dr.comp_events_reported, 4u);
	EXPECT_EQ(dr.async_events_reported, 0u);
	EXPECT_EQ(raise_event(XSRC_EVENT_CQ_COMPLETION, ring), EINVAL);  // gone
}

TEST_F(SrqAhEventTest, RaiseEventValidates)
{
	EXPECT_EQ(raise_event(XSRC_EVENT_CQ_COMPLETION, cq0_ring, 1), EINVAL);  // reserved
	EXPECT_EQ(raise_event(99, cq0_ring), EINVAL);
	EXPECT_EQ(raise_event(0, cq0_ring), EINVAL);
	EXPECT_EQ(raise_event(XSRC_EVENT_CQ_COMPLETION, cq0_ring + 4096), EINVAL);
	EXPECT_EQ(raise_event(XSRC_EVENT_CQ_ERR, 0), EINVAL);
	EXPECT_EQ(raise_event(XSRC_EVENT_SRQ_LIMIT, XSRC_SRQN_BASE), EINVAL);
	EXPECT_EQ(raise_event(XSRC_EVENT_SRQ_LIMIT, 0), EINVAL);
	EXPECT_EQ(raise_event(XSRC_EVENT_QP_FATAL, XSRC_QPN_BASE), EINVAL);
	EXPECT_EQ(raise_event(XSRC_EVENT_QP_FATAL, 1ull << 40), EINVAL);
	EXPECT_EQ(raise_event(XSRC_EVENT_QP_LAST_WQE, 5), EINVAL);
	CreatedQp qp;
	ASSERT_EQ(create_qp(qp_spec(), qp), 0);
	EXPECT_EQ(raise_event(XSRC_EVENT_QP_FATAL, qp.qpn), EINVAL);  // RESET does no work
	EXPECT_TRUE(async.drain().empty());
}

TEST_F(SrqAhEventTest, AsyncEventsReachTheOwnerAndAreCounted)
{
	uint32_t srq;
	ib_uverbs_create_srq_resp srq_core{};
	xsrc_create_srq_resp srq_drv{};
	ASSERT_EQ(create_srq(pd0, 64, 1, srq, &srq_core, &srq_drv), 0);
	QpSpec s = qp_spec();
	s.srq = srq;
	s.user_handle = 0x9999;
	CreatedQp qp;
	ASSERT_EQ(create_qp(s, qp), 0);
	ib_uverbs_modify_qp init{};
	init.qp_handle = qp.handle;
	init.attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	init.qp_state = IBV_QPS_INIT;
	init.port_num = 1;
	ASSERT_EQ(modify_qp(init), 0);

	ASSERT_EQ(raise_event(XSRC_EVENT_CQ_ERR, cq0_ring), 0);
	ASSERT_EQ(modify_srq(srq, IBV_SRQ_LIMIT, 0, 8), 0);
	ASSERT_EQ(raise_event(XSRC_EVENT_SRQ_LIMIT, srq_core.srqn), 0);
	EXPECT_EQ(arena().at<xsrc_recv_ring>(srq_drv.ring_off).srq_limit, 0u);  // disarmed
	ASSERT_EQ(raise_event(XSRC_EVENT_QP_FATAL, qp.qpn), 0);
	EXPECT_EQ(qp_entry(qp.qpn).state, xsrc_qp_state_encode(IBV_QPS_ERR));
	ASSERT_EQ(raise_event(XSRC_EVENT_QP_LAST_WQE, qp.qpn), 0);  // already reported

	auto events = test::records<ib_uverbs_async_event_desc>(async.drain());
	ASSERT_EQ(events.size(), 4u);
	EXPECT_EQ(events[0].element, 0x1234u);
	EXPECT_EQ(events[0].event_type, uint32_t(IBV_EVENT_CQ_ERR));
	EXPECT_EQ(events[1].element, 0x5150u);
	EXPECT_EQ(events[1].event_type, uint32_t(IBV_EVENT_SRQ_LIMIT_REACHED));
	EXPECT_EQ(events[2].element, 0x9999u);
	EXPECT_EQ(events[2].event_type, uint32_t(IBV_EVENT_QP_FATAL));
	EXPECT_EQ(events[3].element, 0x9999u);
	EXPECT_EQ(events[3].event_type, uint32_t(IBV_EVENT_QP_LAST_WQE_REACHED));

	uint32_t qp_events = 0, srq_events = 0;
	ASSERT_EQ(destroy_qp(qp.handle, &qp_events), 0);
	EXPECT_EQ(qp_events, 2u);
	ASSERT_EQ(destroy_srq(srq, &srq_events), 0);
	EXPECT_EQ(srq_events, 1u);
	ib_uverbs_destroy_cq_resp dr{};
	ASSERT_EQ(destroy_cq(cq0, &dr), 0);
	EXPECT_EQ(dr.async_events_reported, 1u);
}

// The data path completes work on other processes' queues: any context of
// the device raises events for any object of the device.
TEST_F(SrqAhEventTest, AnyContextOfTheDeviceMayRaise)
{
	int ch;
	ASSERT_EQ(create_channel(ch), 0);
	uint32_t cq;
	uint64_t ring = 0;
	ASSERT_EQ(create_cq(16, ch, cq, &ring, 0xbeef), 0);

	Context peer;
	peer.id = 2;
	peer.device = &dev;
	peer.owner = getpid();
	peer.caller = std::make_unique<ProcessCaller>(getpid());
	dev.contexts.push_back(&peer);
	Pipe peer_async;
	xsrc_get_context_req drv{};
	drv.async_fds = peer_async.pair();
	Resp<ib_uverbs_get_context_resp, xsrc_get_context_resp> resp;
	ib_uverbs_get_context get{};
	get.response = reinterpret_cast<uintptr_t>(&resp);
	ASSERT_EQ(run_on(peer, IB_USER_VERBS_CMD_GET_CONTEXT, get, std::as_bytes(std::span(&drv, 1)), sizeof(resp)),
		  0);

	xsrc_raise_event ev{XSRC_EVENT_CQ_COMPLETION, 0, ring};
	ASSERT_EQ(run_on(peer, XSRC_CMD_RAISE_EVENT, ev), 0);
	ev.kind = XSRC_EVENT_CQ_ERR;
	ASSERT_EQ(run_on(peer, XSRC_CMD_RAISE_EVENT, ev), 0);
	EXPECT_EQ(test::records<ib_uverbs_comp_event_desc>(chan[0].drain()).size(), 1u);
	auto events = test::records<ib_uverbs_async_event_desc>(async.drain());
	ASSERT_EQ(events.size(), 1u);
	EXPECT_EQ(events[0].element, 0xbeefu);
	EXPECT_TRUE(peer_async.drain().empty());

	destroy_context_objects(peer);
	std::erase(dev.contexts, &peer);
}

TEST_F(SrqAhEventTest, TeardownEmptiesTheArenaTables)
{
	std::vector<char> buf(4096);
	ib_uverbs_reg_mr_resp mr{};
	ASSERT_EQ(reg_mr(pd0, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE, mr), 0);
	uint32_t srq, ah;
	ASSERT_EQ(create_srq(pd0, 16, 1, srq), 0);
	ASSERT_EQ(create_ah(ah_cmd(pd0), ah), 0);
	std::vector<CreatedQp> qps(3);
	QpSpec with_srq = qp_spec(IBV_QPT_RC);
	with_srq.srq = srq;
	ASSERT_EQ(create_qp(qp_spec(IBV_QPT_RC), qps[0]), 0);
	ASSERT_EQ(create_qp(qp_spec(IBV_QPT_UD), qps[1]), 0);
	ASSERT_EQ(create_qp(with_srq, qps[2]), 0);
	int ch;
	ASSERT_EQ(create_channel(ch), 0);
	uint32_t cq;
	ASSERT_EQ(create_cq(8, ch, cq), 0);
	EXPECT_GT(arena().allocation_count(), 0u);

	destroy_context_objects(ctx);
	EXPECT_TRUE(ctx.objects.empty());
	EXPECT_EQ(arena().allocation_count(), 0u);
	EXPECT_EQ(dev.qp_slots.used(), 0u);
	EXPECT_EQ(dev.srq_slots.used(), 0u);
	EXPECT_TRUE(dev.cqs_by_ring.empty());
	EXPECT_TRUE(dev.mrs_by_index.empty());
	EXPECT_TRUE(dev.pd_ids.empty());
	for (uint32_t n : dev.object_counts)
		EXPECT_EQ(n, 0u);
	for (const CreatedQp &qp : qps)
		EXPECT_EQ(qp_entry(qp.qpn).state, uint32_t(XSRC_QP_STATE_FREE));
	for (uint32_t i = 0; i < XSRC_SRQ_TABLE_LEN; ++i)
		ASSERT_EQ(arena().srq_entry(i).srqn, 0u);
	EXPECT_EQ(arena().mr_entry(mr.lkey >> 8).key, 0u);
}

}  // namespace
}  // namespace xsrc::test
