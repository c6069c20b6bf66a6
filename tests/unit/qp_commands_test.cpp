// QP commands: create (caps, links, types), the state machine of MODIFY_QP
// checked against an oracle written down here independently of
// xsrcd/qp_state.cpp (IBTA / Linux ib_modify_qp_is_ok), attribute values,
// QUERY_QP, DESTROY_QP, and what the arena's QP table shows throughout.
#include "command_fixture.h"
#include "qp_state.h"

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace xsrc::test {
namespace {

constexpr ibv_qp_state kStates[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS,
				    IBV_QPS_SQD,   IBV_QPS_SQE,  IBV_QPS_ERR};
constexpr uint8_t kTypes[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD};

// --- the oracle --------------------------------------------------------------

bool legal(uint8_t type, ibv_qp_state from, ibv_qp_state to)
{
	if (to == IBV_QPS_RESET)
		return true;
	if (to == IBV_QPS_ERR)
		return from != IBV_QPS_RESET;
	auto is = [&](ibv_qp_state f, ibv_qp_state t) { return from == f && to == t; };
	return is(IBV_QPS_RESET, IBV_QPS_INIT) || is(IBV_QPS_INIT, IBV_QPS_INIT) ||
	       is(IBV_QPS_INIT, IBV_QPS_RTR) || is(IBV_QPS_RTR, IBV_QPS_RTS) ||
	       is(IBV_QPS_RTS, IBV_QPS_RTS) || is(IBV_QPS_RTS, IBV_QPS_SQD) ||
	       is(IBV_QPS_SQD, IBV_QPS_SQD) || is(IBV_QPS_SQD, IBV_QPS_RTS) ||
	       (type != IBV_QPT_RC && is(IBV_QPS_SQE, IBV_QPS_RTS));
}

uint32_t required(uint8_t type, ibv_qp_state from, ibv_qp_state to)
{
	if (from == IBV_QPS_RESET && to == IBV_QPS_INIT)
		return IBV_QP_PKEY_INDEX | IBV_QP_PORT | (type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
	if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
		if (type == IBV_QPT_UD)
			return 0;
		uint32_t m = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
		return type == IBV_QPT_RC ? m | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : m;
	}
	if (from == IBV_QPS_RTR && to == IBV_QPS_RTS)
		return type == IBV_QPT_RC ? IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
						    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC
					  : IBV_QP_SQ_PSN;
	return 0;
}

class QpCommandsTest : public test::CommandFixture {
protected:
	void SetUp() override
	{
		CommandFixture::SetUp();
		basic_objects();
	}

	ibv_qp_state state_of(const CreatedQp &qp) { return xsrc_qp_state_decode(qp_entry(qp.qpn).state); }

	int step(const CreatedQp &qp, uint8_t type, ibv_qp_state from, ibv_qp_state to)
	{
		return modify_qp(modify_cmd(qp.handle, to, IBV_QP_STATE | required(type, from, to)));
	}

	// Drives a QP from RESET to `target` through legal transitions. SQE,
	// which only the data path enters, is set in the arena as a device would.
	void bring_to(const CreatedQp &qp, uint8_t type, ibv_qp_state target)
	{
		const ibv_qp_state path[] = {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS};
		ibv_qp_state cur = IBV_QPS_RESET;
		if (target == IBV_QPS_RESET)
			return;
		if (target == IBV_QPS_ERR) {
			ASSERT_EQ(step(qp, type, cur, IBV_QPS_INIT), 0);
			ASSERT_EQ(step(qp, type, IBV_QPS_INIT, IBV_QPS_ERR), 0);
			return;
		}
		for (ibv_qp_state s : path) {
			ASSERT_EQ(step(qp, type, cur, s), 0) << "to " << s;
			cur = s;
			if (s == target)
				return;
		}
		if (target == IBV_QPS_SQD) {
			ASSERT_EQ(step(qp, type, IBV_QPS_RTS, IBV_QPS_SQD), 0);
		} else if (target == IBV_QPS_SQE) {
			qp_entry(qp.qpn).state = xsrc_qp_state_encode(IBV_QPS_SQE);
		}
	}

	CreatedQp make_qp(uint8_t type)
	{
		CreatedQp qp;
		EXPECT_EQ(create_qp(qp_spec(type), qp), 0);
		return qp;
	}
};

TEST_F(QpCommandsTest, CreatePublishesAResetQpAndItsReceiveRing)
{
	QpSpec s = qp_spec(IBV_QPT_RC);
	s.max_recv_wr = 100;
	s.max_recv_sge = 3;
	s.user_handle = 0xfeed;
	CreatedQp qp;
	ASSERT_EQ(create_qp(s, qp), 0);
	EXPECT_GE(qp.qpn, uint32_t(XSRC_QPN_BASE));
	EXPECT_EQ(qp.core.max_send_wr, 16u);
	EXPECT_EQ(qp.core.max_recv_wr, 100u);
	EXPECT_EQ(qp.core.max_send_sge, 2u);
	EXPECT_EQ(qp.core.max_recv_sge, 3u);
	EXPECT_EQ(qp.core.max_inline_data, 64u);

	const xsrc_qp_entry &e = qp_entry(qp.qpn);
	EXPECT_EQ(e.state, xsrc_qp_state_encode(IBV_QPS_RESET));
	EXPECT_EQ(e.qpn, qp.qpn);
	EXPECT_EQ(e.generation, 1u);
	EXPECT_EQ(e.owner_pid, uint32_t(getpid()));
	EXPECT_EQ(e.owner_context, ctx.id);
	EXPECT_EQ(e.qp_type, IBV_QPT_RC);
	EXPECT_EQ(e.pd_id, pd0_id);
	EXPECT_EQ(e.send_cq_off, cq0_ring);
	EXPECT_EQ(e.recv_cq_off, cq0_ring);
	EXPECT_EQ(e.srqn, 0u);
	EXPECT_EQ(e.rq_off, qp.drv.rq_off);
	EXPECT_EQ(e.max_recv_wr, 100u);

	ASSERT_NE(qp.drv.rq_off, 0u);
	auto &rq = arena().at<xsrc_recv_ring>(qp.drv.rq_off);
	EXPECT_EQ(rq.num_entries, 256u);  // pow2 >= 2 * (100 + 1)
	EXPECT_EQ(rq.stride, 128u);       // 24 + 3 * 16 = 72, 64-aligned
	EXPECT_EQ(rq.max_wr, 100u);
	EXPECT_EQ(rq.max_sge, 3u);
	EXPECT_EQ(rq.owner_pid, uint32_t(getpid()));
	EXPECT_EQ(rq.srq_limit, 0u);
	for (uint32_t i = 0; i < rq.num_entries; ++i) {
		auto *wqe = reinterpret_cast<xsrc_recv_wqe *>(reinterpret_cast<char *>(&rq + 1) + i * rq.stride);
		ASSERT_EQ(wqe->seq, i);
	}

	uint32_t events = ~0u;
	ASSERT_EQ(destroy_qp(qp.handle, &events), 0);
	EXPECT_EQ(events, 0u);
	EXPECT_EQ(e.state, uint32_t(XSRC_QP_STATE_FREE));
	EXPECT_EQ(e.generation, 1u);  // survives, so the next QP in the slot is told apart
	EXPECT_FALSE(arena().allocated(qp.drv.rq_off));
	EXPECT_EQ(destroy_qp(qp.handle), EINVAL);
}

TEST_F(QpCommandsTest, CapsAreCheckedAgainstTheDevice)
{
	using L = DeviceLimits;
	auto try_caps = [&](auto edit) {
		QpSpec s = qp_spec();
		edit(s);
		CreatedQp qp;
		int err = create_qp(s, qp);
		if (!err)
			destroy_qp(qp.handle);
		return err;
	};
	EXPECT_EQ(try_caps([](QpSpec &s) { s.max_send_wr = L::max_qp_wr + 1; }), EINVAL);
	EXPECT_EQ(try_caps([](QpSpec &s) { s.max_recv_wr = L::max_qp_wr + 1; }), EINVAL);
	EXPECT_EQ(try_caps([](QpSpec &s) { s.max_send_sge = L::max_sge + 1; }), EINVAL);
	EXPECT_EQ(try_caps([](QpSpec &s) { s.max_recv_sge = L::max_sge + 1; }), EINVAL);
	EXPECT_EQ(try_caps([](QpSpec &s) { s.max_inline_data = L::max_inline_data + 1; }), EINVAL);
	EXPECT_EQ(try_caps([](QpSpec &s) { s.max_send_wr = L::max_qp_wr; s.max_recv_wr = L::max_qp_wr; }), 0);

	// No receive queue at all is fine: a send-only QP.
	QpSpec s = qp_spec();
	s.max_recv_wr = s.max_recv_sge = 0;
	CreatedQp qp;
	ASSERT_EQ(create_qp(s, qp), 0);
	auto &rq = arena().at<xsrc_recv_ring>(qp.drv.rq_off);
	EXPECT_EQ(rq.num_entries, 2u);
	EXPECT_EQ(rq.max_wr, 0u);
	EXPECT_EQ(rq.stride, 64u);
}

TEST_F(QpCommandsTest, CreateChecksHandlesAndTypes)
{
	CreatedQp qp;
	QpSpec s = qp_spec();
	s.pd = cq0;  // a CQ is not a PD
	EXPECT_EQ(create_qp(s, qp), EINVAL);
	s = qp_spec();
	s.send_cq = pd0;
	EXPECT_EQ(create_qp(s, qp), EINVAL);
	s = qp_spec();
	s.recv_cq = 999;
	EXPECT_EQ(create_qp(s, qp), EINVAL);
	s = qp_spec();
	s.srq = pd0;  // is_srq with a handle that is no SRQ
	EXPECT_EQ(create_qp(s, qp), EINVAL);
	EXPECT_EQ(create_qp(qp_spec(IBV_QPT_DRIVER), qp), EOPNOTSUPP);
	// An XRC receive QP names an XRC domain where the others name a PD.
	EXPECT_EQ(create_qp(qp_spec(IBV_QPT_XRC_RECV), qp), EINVAL);
	EXPECT_EQ(create_qp(qp_spec(42), qp), EINVAL);

	Resp<ib_uverbs_create_qp_resp, xsrc_create_qp_resp> resp;
	ib_uverbs_create_qp cmd = create_qp_cmd(qp_spec());
	cmd.response = reinterpret_cast<uintptr_t>(&resp);
	cmd.reserved = 1;
	EXPECT_EQ(run(IB_USER_VERBS_CMD_CREATE_QP, cmd, {}, sizeof(resp)), EINVAL);
	cmd.reserved = 0;
	uint64_t junk = 1;
	EXPECT_EQ(run(IB_USER_VERBS_CMD_CREATE_QP, cmd, std::as_bytes(std::span(&junk, 1)), sizeof(resp)),
		  EOPNOTSUPP);
	EXPECT_EQ(dev.qp_slots.used(), 0u);
	EXPECT_EQ(arena().allocation_count(), 1u);  // only the CQ's ring: failures leave nothing
}

TEST_F(QpCommandsTest, ExtendedCreateQp)
{
	struct {
		ib_uverbs_ex_create_qp_resp core;
		xsrc_create_qp_resp drv;
	} resp{};
	ib_uverbs_ex_create_qp cmd{};
	ib_uverbs_create_qp base = create_qp_cmd(qp_spec(IBV_QPT_UD));
	cmd.user_handle = base.user_handle;
	cmd.pd_handle = base.pd_handle;
	cmd.send_cq_handle = base.send_cq_handle;
	cmd.recv_cq_handle = base.recv_cq_handle;
	cmd.max_send_wr = 8;
	cmd.max_recv_wr = 8;
	cmd.max_send_sge = 1;
	cmd.max_recv_sge = 1;
	cmd.qp_type = IBV_QPT_UD;
	auto run_it = [&] {
		return run_ex(IB_USER_VERBS_EX_CMD_CREATE_QP, cmd, &resp, sizeof(resp.core), sizeof(resp.drv));
	};
	cmd.comp_mask = 2;
	EXPECT_EQ(run_it(), EINVAL);
	cmd.comp_mask = IB_UVERBS_CREATE_QP_MASK_IND_TABLE;
	EXPECT_EQ(run_it(), EINVAL);  // there are no indirection tables
	cmd.comp_mask = 0;
	cmd.create_flags = 1u << 30;
	EXPECT_EQ(run_it(), EINVAL);
	cmd.create_flags = IBV_QP_CREATE_SCATTER_FCS;
	EXPECT_EQ(run_it(), EOPNOTSUPP);
	cmd.qp_type = IBV_QPT_RC;  // blocking multicast loopback: UD only
	cmd.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
	EXPECT_EQ(run_it(), EOPNOTSUPP);
	cmd.qp_type = IBV_QPT_UD;
	cmd.reserved = 1;
	EXPECT_EQ(run_it(), EINVAL);
	cmd.reserved = 0;
	ASSERT_EQ(run_it(), 0);  // a UD QP that never sees its own multicast sends
	EXPECT_EQ(resp.core.response_length, sizeof(resp.core));
	EXPECT_EQ(resp.core.base.max_recv_wr, 8u);
	EXPECT_NE(resp.drv.rq_off, 0u);
	EXPECT_EQ(qp_entry(resp.core.base.qpn).qp_type, IBV_QPT_UD);
	EXPECT_EQ(qp_entry(resp.core.base.qpn).rq_off, resp.drv.rq_off);
}

// Every (from, to) pair for RC, UC and UD: legal ones succeed with exactly the
// required attributes and fail without any one of them; illegal ones fail and
// leave the state alone.
TEST_F(QpCommandsTest, StateMachineMatchesTheSpecification)
{
	for (uint8_t type : kTypes) {
		for (ibv_qp_state from : kStates) {
			for (ibv_qp_state to : kStates) {
				SCOPED_TRACE(testing::Message() << "type " << int(type) << ": " << from << " -> " << to);
				CreatedQp qp = make_qp(type);
				bring_to(qp, type, from);
				ASSERT_EQ(state_of(qp), from);
				uint32_t req = required(type, from, to);
				if (!legal(type, from, to)) {
					EXPECT_EQ(modify_qp(modify_cmd(qp.handle, to, IBV_QP_STATE | req)), EINVAL);
					EXPECT_EQ(state_of(qp), from);
				} else {
					for (uint32_t bit = 1; bit; bit <<= 1) {
						if (!(req & bit))
							continue;
						auto without = modify_cmd(qp.handle, to, IBV_QP_STATE | (req & ~bit));
						EXPECT_EQ(modify_qp(without), EINVAL) << "without attribute " << bit;
					}
					EXPECT_EQ(state_of(qp), from);
					EXPECT_EQ(modify_qp(modify_cmd(qp.handle, to, IBV_QP_STATE | req)), 0);
					EXPECT_EQ(state_of(qp), to);
				}
				ASSERT_EQ(destroy_qp(qp.handle), 0);
			}
		}
	}
}

TEST_F(QpCommandsTest, AttributesOutsideTheTransitionAreRefused)
{
	CreatedQp rc = make_qp(IBV_QPT_RC), ud = make_qp(IBV_QPT_UD);
	uint32_t init_rc = IBV_QP_STATE | required(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT);
	EXPECT_EQ(modify_qp(modify_cmd(rc.handle, IBV_QPS_INIT, init_rc | IBV_QP_QKEY)), EINVAL);
	EXPECT_EQ(modify_qp(modify_cmd(rc.handle, IBV_QPS_INIT, init_rc | IBV_QP_AV)), EINVAL);
	EXPECT_EQ(modify_qp(modify_cmd(rc.handle, IBV_QPS_INIT, init_rc | IBV_QP_SQ_PSN)), EINVAL);
	bring_to(rc, IBV_QPT_RC, IBV_QPS_RTS);
	bring_to(ud, IBV_QPT_UD, IBV_QPS_RTS);

	// Without IBV_QP_STATE a modify keeps the state: RTS -> RTS with optional attributes.
	EXPECT_EQ(modify_qp(modify_cmd(rc.handle, IBV_QPS_RTS, IBV_QP_MIN_RNR_TIMER | IBV_QP_ACCESS_FLAGS)), 0);
	EXPECT_EQ(modify_qp(modify_cmd(ud.handle, IBV_QPS_RTS, IBV_QP_MIN_RNR_TIMER)), EINVAL);
	EXPECT_EQ(modify_qp(modify_cmd(ud.handle, IBV_QPS_RTS, IBV_QP_QKEY)), 0);
	EXPECT_EQ(modify_qp(modify_cmd(rc.handle, IBV_QPS_RTS, IBV_QP_TIMEOUT)), EINVAL);  // only in SQD

	// A drained RC QP takes new requester attributes.
	ASSERT_EQ(modify_qp(modify_cmd(rc.handle, IBV_QPS_SQD, IBV_QP_STATE)), 0);
	EXPECT_EQ(modify_qp(modify_cmd(rc.handle, IBV_QPS_SQD, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_AV)), 0);
	EXPECT_EQ(modify_qp(modify_cmd(rc.handle, IBV_QPS_SQD, IBV_QP_SQ_PSN)), EINVAL);

	// RTR -> RTR does not exist, with or without attributes.
	CreatedQp uc = make_qp(IBV_QPT_UC);
	bring_to(uc, IBV_QPT_UC, IBV_QPS_RTR);
	EXPECT_EQ(modify_qp(modify_cmd(uc.handle, IBV_QPS_RTR, 0)), EINVAL);
	EXPECT_EQ(modify_qp(modify_cmd(uc.handle, IBV_QPS_RTR, IBV_QP_STATE)), EINVAL);
}

TEST_F(QpCommandsTest, CurrentStateMustMatch)
{
	CreatedQp qp = make_qp(IBV_QPT_UC);
	bring_to(qp, IBV_QPT_UC, IBV_QPS_RTS);
	auto cmd = modify_cmd(qp.handle, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_CUR_STATE);
	cmd.cur_qp_state = IBV_QPS_RTS;
	EXPECT_EQ(modify_qp(cmd), 0);
	cmd.cur_qp_state = IBV_QPS_SQD;
	EXPECT_EQ(modify_qp(cmd), EINVAL);
	cmd.cur_qp_state = 9;
	EXPECT_EQ(modify_qp(cmd), EINVAL);

	// The device moved the QP to SQE: the consumer says so and resumes it.
	qp_entry(qp.qpn).state = xsrc_qp_state_encode(IBV_QPS_SQE);
	cmd.cur_qp_state = IBV_QPS_RTS;
	EXPECT_EQ(modify_qp(cmd), EINVAL);
	cmd.cur_qp_state = IBV_QPS_SQE;
	EXPECT_EQ(modify_qp(cmd), 0);
	EXPECT_EQ(state_of(qp), IBV_QPS_RTS);

	// The current state is not an attribute of INIT -> RTR.
	CreatedQp other = make_qp(IBV_QPT_UC);
	bring_to(other, IBV_QPT_UC, IBV_QPS_INIT);
	auto rtr = modify_cmd(other.handle, IBV_QPS_RTR,
			      IBV_QP_STATE | IBV_QP_CUR_STATE | required(IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR));
	rtr.cur_qp_state = IBV_QPS_INIT;
	EXPECT_EQ(modify_qp(rtr), EINVAL);

	// A provider that found an error set ERR: the daemon sees it.
	qp_entry(qp.qpn).state = xsrc_qp_state_encode(IBV_QPS_ERR);
	EXPECT_EQ(modify_qp(modify_cmd(qp.handle, IBV_QPS_RTS, IBV_QP_STATE)), EINVAL);
	EXPECT_EQ(modify_qp(modify_cmd(qp.handle, IBV_QPS_RESET, IBV_QP_STATE)), 0);
}

TEST_F(QpCommandsTest, AttributeValuesAreChecked)
{
	CreatedQp qp = make_qp(IBV_QPT_RC);
	const uint32_t init = IBV_QP_STATE | required(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT);
	auto to_init = [&](auto edit) {
		auto cmd = modify_cmd(qp.handle, IBV_QPS_INIT, init);
		edit(cmd);
		return modify_qp(cmd);
	};
	EXPECT_EQ(to_init([](auto &c) { c.port_num = 2; }), EINVAL);
	EXPECT_EQ(to_init([](auto &c) { c.pkey_index = 1; }), EINVAL);
	EXPECT_EQ(to_init([](auto &c) { c.qp_access_flags |= IBV_ACCESS_MW_BIND; }), EINVAL);
	EXPECT_EQ(to_init([](auto &c) { c.qp_access_flags |= IBV_ACCESS_ZERO_BASED; }), EINVAL);
	EXPECT_EQ(to_init([](auto &c) { c.qp_state = 7; }), EINVAL);
	// LOCAL_WRITE is common in applications' QP access flags: accepted, not published.
	ASSERT_EQ(to_init([](auto &c) {
			  c.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
		  }),
		  0);
	EXPECT_EQ(qp_entry(qp.qpn).access_flags, uint32_t(IBV_ACCESS_REMOTE_ATOMIC));

	const uint32_t rtr = IBV_QP_STATE | required(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR);
	auto to_rtr = [&](auto edit, uint32_t extra = 0) {
		auto cmd = modify_cmd(qp.handle, IBV_QPS_RTR, rtr | extra);
		edit(cmd);
		return modify_qp(cmd);
	};
	EXPECT_EQ(to_rtr([](auto &c) { c.path_mtu = 0; }), EINVAL);
	EXPECT_EQ(to_rtr([](auto &c) { c.path_mtu = IBV_MTU_4096 + 1; }), EINVAL);
	EXPECT_EQ(to_rtr([](auto &c) { c.max_dest_rd_atomic = DeviceLimits::max_qp_rd_atom + 1; }), EINVAL);
	EXPECT_EQ(to_rtr([](auto &c) { c.min_rnr_timer = 32; }), EINVAL);
	EXPECT_EQ(to_rtr([](auto &c) { c.dest_qp_num = 1u << 24; }), EINVAL);
	EXPECT_EQ(to_rtr([](auto &c) { c.dest.is_global = 0; }), EINVAL);  // RoCE needs a GRH
	EXPECT_EQ(to_rtr([](auto &c) { c.dest.port_num = 2; }), EINVAL);
	EXPECT_EQ(to_rtr([](auto &c) { c.dest.sgid_index = DeviceLimits::gid_tbl_len; }), EINVAL);
	EXPECT_EQ(to_rtr([&](auto &c) { c.dest.sgid_index = uint8_t(dev.view.port.gids.size()); }), EINVAL);
	EXPECT_EQ(to_rtr([](auto &c) { c.dest.sl = 16; }), EINVAL);
	EXPECT_EQ(to_rtr([](auto &) {}, IBV_QP_ALT_PATH), EINVAL);  // no APM on RoCE
	EXPECT_EQ(state_of(qp), IBV_QPS_INIT);
	// Any flow label is taken, as the kernel does (UCX passes ~0); 20 bits are kept.
	ASSERT_EQ(to_rtr([](auto &c) {
		c.rq_psn = 0xff000123;
		c.dest.flow_label = ~0u;
	}), 0);
	EXPECT_EQ(qp_entry(qp.qpn).rq_psn, 0x123u);  // PSNs are 24 bits, as the kernel masks them
	ib_uverbs_query_qp_resp q{};
	ASSERT_EQ(query_qp(qp.handle, q), 0);
	EXPECT_EQ(q.dest.flow_label, 0xfffffu);

	const uint32_t rts = IBV_QP_STATE | required(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS);
	auto to_rts = [&](auto edit) {
		auto cmd = modify_cmd(qp.handle, IBV_QPS_RTS, rts);
		edit(cmd);
		return modify_qp(cmd);
	};
	EXPECT_EQ(to_rts([](auto &c) { c.timeout = 32; }), EINVAL);
	EXPECT_EQ(to_rts([](auto &c) { c.retry_cnt = 8; }), EINVAL);
	EXPECT_EQ(to_rts([](auto &c) { c.rnr_retry = 8; }), EINVAL);
	EXPECT_EQ(to_rts([](auto &c) { c.max_rd_atomic = DeviceLimits::max_qp_rd_atom + 1; }), EINVAL);
	EXPECT_EQ(to_rts([](auto &c) { c.max_rd_atomic = DeviceLimits::max_qp_rd_atom; }), 0);

	auto mig = modify_cmd(qp.handle, IBV_QPS_RTS, IBV_QP_PATH_MIG_STATE);
	mig.path_mig_state = IBV_MIG_ARMED + 1;
	EXPECT_EQ(modify_qp(mig), EINVAL);
	EXPECT_EQ(modify_qp(modify_cmd(999, IBV_QPS_INIT, init)), EINVAL);  // no such QP
}

TEST_F(QpCommandsTest, ArenaEntryAndQueryFollowModify)
{
	QpSpec s = qp_spec(IBV_QPT_RC);
	s.user_handle = 0x77;
	CreatedQp qp;
	ASSERT_EQ(create_qp(s, qp), 0);
	bring_to(qp, IBV_QPT_RC, IBV_QPS_RTS);

	const xsrc_qp_entry &e = qp_entry(qp.qpn);
	EXPECT_EQ(e.state, xsrc_qp_state_encode(IBV_QPS_RTS));
	EXPECT_EQ(e.port_num, 1);
	EXPECT_EQ(e.path_mtu, kModifyPathMtu);
	EXPECT_EQ(e.dest_qpn, kModifyDestQpn);
	EXPECT_EQ(std::memcmp(e.dgid, kPeerGid, 16), 0);
	EXPECT_EQ(e.rq_psn, 0x111u);
	EXPECT_EQ(e.sq_psn, kModifySqPsn);
	EXPECT_EQ(e.access_flags, uint32_t(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
	EXPECT_EQ(e.min_rnr_timer, 12);
	EXPECT_EQ(e.timeout, 14);
	EXPECT_EQ(e.retry_cnt, 6);
	EXPECT_EQ(e.rnr_retry, 7);
	EXPECT_EQ(e.max_rd_atomic, 4u);
	EXPECT_EQ(e.max_dest_rd_atomic, 8u);

	ib_uverbs_query_qp_resp q{};
	ASSERT_EQ(query_qp(qp.handle, q), 0);
	EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
	EXPECT_EQ(q.cur_qp_state, IBV_QPS_RTS);
	EXPECT_EQ(std::memcmp(q.dest.dgid, kPeerGid, 16), 0);
	EXPECT_EQ(q.dest.hop_limit, 64);
	EXPECT_EQ(q.dest.traffic_class, 3);
	EXPECT_EQ(q.dest.is_global, 1);
	EXPECT_EQ(q.dest.port_num, 1);
	EXPECT_EQ(q.max_send_wr, 16u);
	EXPECT_EQ(q.max_recv_wr, 16u);
	EXPECT_EQ(q.max_send_sge, 2u);
	EXPECT_EQ(q.max_recv_sge, 2u);
	EXPECT_EQ(q.max_inline_data, 64u);
	EXPECT_EQ(q.rq_psn, 0x111u);
	EXPECT_EQ(q.sq_psn, kModifySqPsn);
	EXPECT_EQ(q.dest_qp_num, kModifyDestQpn);
	EXPECT_EQ(q.qp_access_flags, uint32_t(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
	EXPECT_EQ(q.pkey_index, 0);
	EXPECT_EQ(q.path_mtu, kModifyPathMtu);
	EXPECT_EQ(q.sq_draining, 0);
	EXPECT_EQ(q.max_rd_atomic, 4);
	EXPECT_EQ(q.max_dest_rd_atomic, 8);
	EXPECT_EQ(q.min_rnr_timer, 12);
	EXPECT_EQ(q.port_num, 1);
	EXPECT_EQ(q.timeout, 14);
	EXPECT_EQ(q.retry_cnt, 6);
	EXPECT_EQ(q.rnr_retry, 7);
	EXPECT_EQ(q.alt_port_num, 0);
	EXPECT_EQ(q.sq_sig_all, 0);
	EXPECT_EQ(query_qp(cq0, q), EINVAL);

	// Reset empties the receive queue in place.
	auto &rq = arena().at<xsrc_recv_ring>(qp.drv.rq_off);
	auto *slot0 = reinterpret_cast<xsrc_recv_wqe *>(&rq + 1);
	rq.tail = 3;
	rq.head = 1;
	slot0->seq = 17;
	ASSERT_EQ(modify_qp(modify_cmd(qp.handle, IBV_QPS_RESET, IBV_QP_STATE)), 0);
	EXPECT_EQ(e.state, xsrc_qp_state_encode(IBV_QPS_RESET));
	EXPECT_EQ(rq.tail, 0u);
	EXPECT_EQ(rq.head, 0u);
	EXPECT_EQ(slot0->seq, 0u);
}

TEST_F(QpCommandsTest, ExtendedModifyQp)
{
	CreatedQp qp = make_qp(IBV_QPT_UD);
	ib_uverbs_ex_modify_qp cmd{};
	cmd.base = modify_cmd(qp.handle, IBV_QPS_INIT, IBV_QP_STATE | required(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT));
	ib_uverbs_ex_modify_qp_resp resp{~0u, ~0u};
	cmd.base.attr_mask |= 1u << 26;
	EXPECT_EQ(run_ex(IB_USER_VERBS_EX_CMD_MODIFY_QP, cmd, &resp, sizeof(resp)), EOPNOTSUPP);
	cmd.base.attr_mask &= ~(1u << 26);
	cmd.base.attr_mask |= IBV_QP_RATE_LIMIT;  // raw packet QPs only
	EXPECT_EQ(run_ex(IB_USER_VERBS_EX_CMD_MODIFY_QP, cmd, &resp, sizeof(resp)), EINVAL);
	cmd.base.attr_mask &= ~IBV_QP_RATE_LIMIT;
	ASSERT_EQ(run_ex(IB_USER_VERBS_EX_CMD_MODIFY_QP, cmd, &resp, sizeof(resp)), 0);
	EXPECT_EQ(resp.comp_mask, 0u);
	EXPECT_EQ(resp.response_length, sizeof(resp));
	EXPECT_EQ(state_of(qp), IBV_QPS_INIT);

	// Without a response, and with the write ABI's narrower mask.
	cmd.base = modify_cmd(qp.handle, IBV_QPS_RTR, IBV_QP_STATE);
	ASSERT_EQ(run_ex(IB_USER_VERBS_EX_CMD_MODIFY_QP, cmd, nullptr, 0), 0);
	EXPECT_EQ(state_of(qp), IBV_QPS_RTR);
	auto plain = modify_cmd(qp.handle, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RATE_LIMIT);
	EXPECT_EQ(modify_qp(plain), EOPNOTSUPP);
}

TEST_F(QpCommandsTest, ObjectsInUseAreBusy)
{
	uint32_t srq;
	ASSERT_EQ(create_srq(pd0, 32, 1, srq), 0);
	uint32_t send_cq;
	ASSERT_EQ(create_cq(8, -1, send_cq), 0);
	QpSpec s = qp_spec(IBV_QPT_RC);
	s.send_cq = send_cq;
	s.srq = srq;
	CreatedQp qp;
	ASSERT_EQ(create_qp(s, qp), 0);
	EXPECT_EQ(qp.drv.rq_off, 0u);     // receives come from the SRQ
	EXPECT_EQ(qp.core.max_recv_wr, 0u);
	EXPECT_EQ(qp_entry(qp.qpn).srqn, std::get<Srq>(ctx.objects.at(srq)).srqn().value());

	ib_uverbs_dealloc_pd dealloc{pd0};
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEALLOC_PD, dealloc), EBUSY);
	EXPECT_EQ(destroy_cq(send_cq), EBUSY);
	EXPECT_EQ(destroy_cq(cq0), EBUSY);
	EXPECT_EQ(destroy_srq(srq), EBUSY);
	ASSERT_EQ(destroy_qp(qp.handle), 0);
	EXPECT_EQ(destroy_cq(send_cq), 0);
	EXPECT_EQ(destroy_cq(cq0), 0);
	EXPECT_EQ(destroy_srq(srq), 0);
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEALLOC_PD, dealloc), 0);
}

TEST_F(QpCommandsTest, ResizeCqRepointsItsQps)
{
	uint32_t other;
	uint64_t other_ring;
	ASSERT_EQ(create_cq(8, -1, other, &other_ring), 0);
	QpSpec s = qp_spec(IBV_QPT_UC);
	s.recv_cq = other;
	CreatedQp qp;
	ASSERT_EQ(create_qp(s, qp), 0);
	EXPECT_EQ(qp_entry(qp.qpn).send_cq_off, cq0_ring);
	EXPECT_EQ(qp_entry(qp.qpn).recv_cq_off, other_ring);

	Resp<ib_uverbs_resize_cq_resp, xsrc_resize_cq_resp> resp;
	ib_uverbs_resize_cq cmd{};
	cmd.response = reinterpret_cast<uintptr_t>(&resp);
	cmd.cq_handle = other;
	cmd.cqe = 4000;
	ASSERT_EQ(run(IB_USER_VERBS_CMD_RESIZE_CQ, cmd, {}, sizeof(resp)), 0);
	EXPECT_NE(resp.drv().ring_off, other_ring);
	EXPECT_EQ(qp_entry(qp.qpn).recv_cq_off, resp.drv().ring_off);
	EXPECT_EQ(qp_entry(qp.qpn).send_cq_off, cq0_ring);
}

TEST_F(QpCommandsTest, DrainingAndErrorsRaiseTheirEvents)
{
	// RTS -> SQD with notification: the send queue is drained at once.
	QpSpec s = qp_spec(IBV_QPT_RC);
	s.user_handle = 0x5d;
	CreatedQp qp;
	ASSERT_EQ(create_qp(s, qp), 0);
	bring_to(qp, IBV_QPT_RC, IBV_QPS_RTS);
	auto sqd = modify_cmd(qp.handle, IBV_QPS_SQD, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY);
	sqd.en_sqd_async_notify = 1;
	ASSERT_EQ(modify_qp(sqd), 0);
	auto events = test::records<ib_uverbs_async_event_desc>(async.drain());
	ASSERT_EQ(events.size(), 1u);
	EXPECT_EQ(events[0].element, 0x5du);
	EXPECT_EQ(events[0].event_type, uint32_t(IBV_EVENT_SQ_DRAINED));

	// A QP on an SRQ reports its last WQE once it is in error.
	uint32_t srq;
	ASSERT_EQ(create_srq(pd0, 16, 1, srq), 0);
	s.srq = srq;
	s.user_handle = 0x1a57;
	CreatedQp on_srq;
	ASSERT_EQ(create_qp(s, on_srq), 0);
	bring_to(on_srq, IBV_QPT_RC, IBV_QPS_INIT);
	ASSERT_EQ(modify_qp(modify_cmd(on_srq.handle, IBV_QPS_ERR, IBV_QP_STATE)), 0);
	ASSERT_EQ(modify_qp(modify_cmd(on_srq.handle, IBV_QPS_ERR, IBV_QP_STATE)), 0);  // once only
	events = test::records<ib_uverbs_async_event_desc>(async.drain());
	ASSERT_EQ(events.size(), 1u);
	EXPECT_EQ(events[0].element, 0x1a57u);
	EXPECT_EQ(events[0].event_type, uint32_t(IBV_EVENT_QP_LAST_WQE_REACHED));

	uint32_t reported = 0;
	ASSERT_EQ(destroy_qp(qp.handle, &reported), 0);
	EXPECT_EQ(reported, 1u);
	ASSERT_EQ(destroy_qp(on_srq.handle, &reported), 0);
	EXPECT_EQ(reported, 1u);
}

TEST_F(QpCommandsTest, TableCoversXrc)
{
	// XRC QPs are driven through these columns (xrc_commands_test.cpp).
	EXPECT_TRUE(qp_modify_allowed(IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPT_XRC_RECV,
				      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN));
	EXPECT_FALSE(qp_modify_allowed(IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPT_XRC_SEND,
				       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN));
	EXPECT_FALSE(qp_modify_allowed(IBV_QPS_SQE, IBV_QPS_RTS, IBV_QPT_XRC_SEND, IBV_QP_STATE));
	EXPECT_FALSE(qp_transition(IBV_QPS_RTS, IBV_QPS_INIT, IBV_QPT_RAW_PACKET));
}

TEST_F(QpCommandsTest, TableCoversRawPacket)
{
	// As the kernel's table: a port to INIT, nothing more to RTR and RTS.
	EXPECT_FALSE(qp_modify_allowed(IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPT_RAW_PACKET, IBV_QP_STATE));
	EXPECT_TRUE(qp_modify_allowed(IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPT_RAW_PACKET, IBV_QP_STATE | IBV_QP_PORT));
	EXPECT_FALSE(qp_modify_allowed(IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPT_RAW_PACKET,
				       IBV_QP_STATE | IBV_QP_PORT | IBV_QP_QKEY));
	EXPECT_TRUE(qp_modify_allowed(IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPT_RAW_PACKET, IBV_QP_STATE));
	EXPECT_FALSE(qp_modify_allowed(IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPT_RAW_PACKET, IBV_QP_STATE | IBV_QP_AV));
	EXPECT_TRUE(qp_modify_allowed(IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPT_RAW_PACKET, IBV_QP_STATE));
	EXPECT_TRUE(qp_modify_allowed(IBV_QPS_RTS, IBV_QPS_ERR, IBV_QPT_RAW_PACKET, IBV_QP_STATE));
}

// A raw packet QP takes CAP_NET_RAW of the daemon's user namespace: root's
// is enough, a capability a process holds only in a user namespace of its
// own is not (the kernel's capable()).
TEST_F(QpCommandsTest, RawPacketNeedsNetRaw)
{
	CreatedQp qp;
	if (has_net_raw(getpid())) {  // root, as CI runs it
		EXPECT_EQ(create_qp(qp_spec(IBV_QPT_RAW_PACKET), qp), 0);
		EXPECT_EQ(qp_entry(qp.qpn).qp_type, IBV_QPT_RAW_PACKET);
	}
	EXPECT_FALSE(has_net_raw(-1));
	int ready[2];
	ASSERT_EQ(pipe(ready), 0);
	pid_t child = fork();
	ASSERT_GE(child, 0);
	if (child == 0) {
		char ok = unshare(CLONE_NEWUSER) == 0 ? 1 : 0;
		if (write(ready[1], &ok, 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	char ok = 0;
	ASSERT_EQ(read(ready[0], &ok, 1), 1);
	if (ok) {  // all capabilities, in its own user namespace only
		EXPECT_FALSE(has_net_raw(child));
	}
	kill(child, SIGKILL);
	waitpid(child, nullptr, 0);
	close(ready[0]);
	close(ready[1]);
}

}  // namespace
}  // namespace xsrc::test
