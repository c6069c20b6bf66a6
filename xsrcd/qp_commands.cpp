// Queue pairs: creation (a QP table slot and, without an SRQ, a receive
// ring in the arena), query and destruction. Modify is in qp_modify.cpp.
#include <cstring>

#include "command_handlers.h"
#include "rings.h"
#include "xsrc-abi.h"

namespace xsrc {
namespace {

// What CREATE_QP and EX_CREATE_QP have in common.
struct QpInit {
	uint64_t user_handle = 0;
	uint32_t pd_handle = 0;
	uint32_t send_cq_handle = 0;
	uint32_t recv_cq_handle = 0;
	uint32_t srq_handle = 0;
	QpCaps caps;
	bool sq_sig_all = false;
	uint8_t qp_type = 0;
	bool is_srq = false;
};

template <typename Cmd>
QpInit qp_init_from(const Cmd &cmd)
{
	QpInit init;
	init.user_handle = cmd.user_handle;
	init.pd_handle = cmd.pd_handle;
	init.send_cq_handle = cmd.send_cq_handle;
	init.recv_cq_handle = cmd.recv_cq_handle;
	init.srq_handle = cmd.srq_handle;
	init.caps = {cmd.max_send_wr, cmd.max_recv_wr, cmd.max_send_sge, cmd.max_recv_sge,
		     cmd.max_inline_data};
	init.sq_sig_all = cmd.sq_sig_all != 0;
	init.qp_type = cmd.qp_type;
	init.is_srq = cmd.is_srq != 0;
	return init;
}

int check_qp_type(uint8_t type)
{
	switch (type) {
	case IBV_QPT_RC:
	case IBV_QPT_UC:
	case IBV_QPT_UD:
		return 0;
	case IBV_QPT_RAW_PACKET:
	case IBV_QPT_XRC_SEND:
	case IBV_QPT_XRC_RECV:
	case IBV_QPT_DRIVER:
		return EOPNOTSUPP;
	default:
		return EINVAL;
	}
}

// The objects a new QP links to: all of this context, of the right type.
struct QpLinks {
	Pd *pd = nullptr;
	Cq *send_cq = nullptr;
	Cq *recv_cq = nullptr;
	Srq *srq = nullptr;
};

int resolve_qp_links(Context &ctx, const QpInit &init, QpLinks &links)
{
	links.pd = lookup<Pd>(ctx, init.pd_handle);
	links.send_cq = lookup<Cq>(ctx, init.send_cq_handle);
	links.recv_cq = lookup<Cq>(ctx, init.recv_cq_handle);
	if (!links.pd || !links.send_cq || !links.recv_cq)
		return EINVAL;
	if (init.is_srq) {
		links.srq = lookup<Srq>(ctx, init.srq_handle);
		if (!links.srq || links.srq->srq_type != IBV_SRQT_BASIC)
			return EINVAL;
	}
	return 0;
}

int check_qp_caps(const QpInit &init)
{
	using L = DeviceLimits;
	const QpCaps &c = init.caps;
	if (c.max_send_wr > L::max_qp_wr || c.max_send_sge > L::max_sge ||
	    c.max_inline_data > L::max_inline_data)
		return EINVAL;
	// With an SRQ the receive capabilities are the SRQ's; the QP's are ignored.
	if (!init.is_srq && (c.max_recv_wr > L::max_qp_wr || c.max_recv_sge > L::max_sge))
		return EINVAL;
	return 0;
}

// Everything but the state, which makes the entry visible (last).
void clear_qp_entry(xsrc_qp_entry &e)
{
	uint32_t generation = e.generation;
	std::memset(reinterpret_cast<unsigned char *>(&e) + sizeof(e.state), 0, sizeof(e) - sizeof(e.state));
	e.generation = generation;
}

void publish_qp(Context &ctx, const Qp &qp, const QpLinks &links)
{
	xsrc_qp_entry &e = ctx.device->arena->qp_entry(qp.index);
	clear_qp_entry(e);
	e.qpn = qp.qpn();
	++e.generation;
	e.owner_pid = static_cast<__u32>(ctx.owner);
	e.owner_context = ctx.id;
	e.qp_type = qp.qp_type;
	e.sq_sig_all = qp.sq_sig_all;
	e.pd_id = links.pd->pd_id;
	e.srqn = links.srq ? links.srq->srqn() : 0;
	e.rq_off = qp.rq_off;
	e.send_cq_off = links.send_cq->ring_off;
	e.recv_cq_off = links.recv_cq->ring_off;
	e.max_send_wr = qp.caps.max_send_wr;
	e.max_recv_wr = qp.caps.max_recv_wr;
	e.max_send_sge = qp.caps.max_send_sge;
	e.max_recv_sge = qp.caps.max_recv_sge;
	e.max_inline_data = qp.caps.max_inline_data;
	store_release<__u32>(e.state, IBV_QPS_RESET + 1);
}

// The receive ring of a QP without an SRQ: 0 when the arena is full.
uint64_t create_rq_ring(Context &ctx, const QpCaps &caps)
{
	Arena &arena = *ctx.device->arena;
	uint32_t entries = recv_ring_entries(caps.max_recv_wr);
	uint64_t off = arena.allocate(recv_ring_bytes(entries, recv_ring_stride(caps.max_recv_sge)));
	if (off)
		recv_ring_init(arena.at<xsrc_recv_ring>(off), entries, caps.max_recv_wr, caps.max_recv_sge,
			       ctx.owner);
	return off;
}

Qp new_qp(const QpInit &init)
{
	Qp qp;
	qp.user_handle = init.user_handle;
	qp.qp_type = init.qp_type;
	qp.sq_sig_all = init.sq_sig_all;
	qp.pd_handle = init.pd_handle;
	qp.send_cq_handle = init.send_cq_handle;
	qp.recv_cq_handle = init.recv_cq_handle;
	qp.caps = init.caps;
	if (init.is_srq) {
		qp.srq_handle = init.srq_handle;
		qp.caps.max_recv_wr = qp.caps.max_recv_sge = 0;  // the SRQ's count
	}
	return qp;
}

int respond_created_qp(Caller &caller, const Request &req, uint32_t handle, const Qp &qp, bool extended)
{
	ib_uverbs_ex_create_qp_resp resp{};
	resp.base.qp_handle = handle;
	resp.base.qpn = qp.qpn();
	resp.base.max_send_wr = qp.caps.max_send_wr;
	resp.base.max_recv_wr = qp.caps.max_recv_wr;
	resp.base.max_send_sge = qp.caps.max_send_sge;
	resp.base.max_recv_sge = qp.caps.max_recv_sge;
	resp.base.max_inline_data = qp.caps.max_inline_data;
	xsrc_create_qp_resp dresp{};
	dresp.rq_off = qp.rq_off;
	if (!extended)
		return respond(caller, req, as_bytes_of(resp.base), as_bytes_of(dresp));
	resp.response_length = sizeof(resp);
	return respond(caller, req, as_bytes_of(resp), as_bytes_of(dresp));
}

int create_qp(Context &ctx, Caller &caller, const Request &req, const QpInit &init, bool extended)
{
	if (int err = check_qp_type(init.qp_type))
		return err;
	QpLinks links;
	if (int err = resolve_qp_links(ctx, init, links))
		return err;
	if (int err = check_qp_caps(init))
		return err;
	if (int err = check_no_driver_data(req))
		return err;
	Device &dev = *ctx.device;
	if (dev.qp_slots.used() >= DeviceLimits::max_qp)
		return ENOMEM;

	Qp qp = new_qp(init);
	if (!init.is_srq && !(qp.rq_off = create_rq_ring(ctx, qp.caps)))
		return ENOMEM;
	uint32_t handle;
	if (int err = insert_object(ctx, qp, handle)) {
		dev.arena->release(qp.rq_off);
		return err;
	}
	std::optional<uint32_t> index = dev.qp_slots.allocate({&ctx, handle});
	if (!index) {
		erase_object(ctx, handle);
		dev.arena->release(qp.rq_off);
		return ENOMEM;
	}
	Qp &created = *lookup<Qp>(ctx, handle);
	created.index = *index;
	++links.pd->use_count;
	++links.send_cq->use_count;
	++links.recv_cq->use_count;
	if (links.srq)
		++links.srq->use_count;

	if (int err = respond_created_qp(caller, req, handle, created, extended)) {
		release_qp(ctx, handle);
		return err;
	}
	publish_qp(ctx, created, links);
	return 0;
}

// Create flags the kernel knows (enum ib_qp_create_flags, as far as the
// write ABI passes them); none of them is supported here.
constexpr uint32_t kKnownCreateFlags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB |
				       (1u << 2) | (1u << 3) | (1u << 4) |  // cross-channel
				       IBV_QP_CREATE_SCATTER_FCS | IBV_QP_CREATE_CVLAN_STRIPPING |
				       IBV_QP_CREATE_SOURCE_QPN | IBV_QP_CREATE_PCI_WRITE_END_PADDING;

}  // namespace

ibv_qp_state qp_state(Device &dev, const Qp &qp)
{
	uint32_t s = load_acquire(dev.arena->qp_entry(qp.index).state);
	if (s == XSRC_QP_STATE_FREE)
		return IBV_QPS_RESET;
	return s - 1 <= IBV_QPS_ERR ? static_cast<ibv_qp_state>(s - 1) : IBV_QPS_ERR;
}

int cmd_create_qp(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_create_qp>(req.core);
	if (cmd.reserved)
		return EINVAL;
	return create_qp(ctx, caller, req, qp_init_from(cmd), false);
}

int cmd_ex_create_qp(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_ex_create_qp>(req.core);
	if (cmd.comp_mask & ~static_cast<uint32_t>(IB_UVERBS_CREATE_QP_SUP_COMP_MASK))
		return EINVAL;
	if (cmd.reserved)
		return EINVAL;
	// An indirection table handle names no object: none can exist here.
	if (cmd.comp_mask & IB_UVERBS_CREATE_QP_MASK_IND_TABLE)
		return EINVAL;
	if (cmd.create_flags & ~kKnownCreateFlags)
		return EINVAL;
	if (cmd.create_flags)
		return EOPNOTSUPP;
	return create_qp(ctx, caller, req, qp_init_from(cmd), true);
}

int cmd_query_qp(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_query_qp>(req.core);
	Qp *qp = lookup<Qp>(ctx, cmd.qp_handle);
	if (!qp)
		return EINVAL;
	if (int err = check_no_driver_data(req))
		return err;
	const QpAttributes &a = qp->attr;
	ib_uverbs_query_qp_resp resp{};
	resp.dest = a.dest;
	resp.max_send_wr = qp->caps.max_send_wr;
	resp.max_recv_wr = qp->caps.max_recv_wr;
	resp.max_send_sge = qp->caps.max_send_sge;
	resp.max_recv_sge = qp->caps.max_recv_sge;
	resp.max_inline_data = qp->caps.max_inline_data;
	resp.qkey = a.qkey;
	resp.rq_psn = a.rq_psn;
	resp.sq_psn = a.sq_psn;
	resp.dest_qp_num = a.dest_qp_num;
	resp.qp_access_flags = a.access_flags;
	resp.pkey_index = a.pkey_index;
	resp.qp_state = resp.cur_qp_state = static_cast<uint8_t>(qp_state(*ctx.device, *qp));
	resp.path_mtu = a.path_mtu;
	resp.path_mig_state = a.path_mig_state;
	resp.sq_draining = 0;  // the send queue is drained by the time SQD is entered
	resp.max_rd_atomic = a.max_rd_atomic;
	resp.max_dest_rd_atomic = a.max_dest_rd_atomic;
	resp.min_rnr_timer = a.min_rnr_timer;
	resp.port_num = a.port_num;
	resp.timeout = a.timeout;
	resp.retry_cnt = a.retry_cnt;
	resp.rnr_retry = a.rnr_retry;
	resp.sq_sig_all = qp->sq_sig_all;
	return respond(caller, req, as_bytes_of(resp));
}

void release_qp(Context &ctx, uint32_t handle)
{
	Qp *qp = lookup<Qp>(ctx, handle);
	if (!qp)
		return;
	if (Device *dev = ctx.device) {
		xsrc_qp_entry &e = dev->arena->qp_entry(qp->index);
		store_release<__u32>(e.state, XSRC_QP_STATE_FREE);  // first: peers stop using it
		clear_qp_entry(e);
		dev->arena->release(qp->rq_off);  // quarantined: a peer may still hold the offset
		dev->qp_slots.release(qp->index);
	}
	if (Pd *pd = lookup<Pd>(ctx, qp->pd_handle))
		--pd->use_count;
	if (Cq *cq = lookup<Cq>(ctx, qp->send_cq_handle))
		--cq->use_count;
	if (Cq *cq = lookup<Cq>(ctx, qp->recv_cq_handle))
		--cq->use_count;
	if (qp->srq_handle)
		if (Srq *srq = lookup<Srq>(ctx, *qp->srq_handle))
			--srq->use_count;
	erase_object(ctx, handle);
}

int cmd_destroy_qp(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_destroy_qp>(req.core);
	Qp *qp = lookup<Qp>(ctx, cmd.qp_handle);
	if (!qp)
		return EINVAL;
	ib_uverbs_destroy_qp_resp resp{};
	resp.events_reported = qp->events_reported -
		reclaim_unread_async_events(ctx, qp->user_handle, qp->events_reported);
	if (int err = respond(caller, req, as_bytes_of(resp)))
		return err;
	release_qp(ctx, cmd.qp_handle);
	return 0;
}

}  // namespace xsrc
