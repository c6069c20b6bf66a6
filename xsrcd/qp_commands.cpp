// Queue pairs: creation (a QP table slot and, without an SRQ, a receive
// ring in the arena), query and destruction. Modify is in qp_modify.cpp.
//
// XRC (as Linux does it): an XRC send QP (IB_QPT_XRC_INI) has a PD and a
// send CQ and no receive side at all. An XRC receive QP (IB_QPT_XRC_TGT)
// belongs to an XRC domain, not to a PD (libibverbs passes the domain's
// handle in pd_handle), has no CQs and no queues (its messages name an XRC
// SRQ of the domain), and is shared: OPEN_QP gives any context of the domain
// a handle on it by QPN, and it lives until the last handle is destroyed.
#include <algorithm>
#include <cstring>

#include "dispatcher_handlers.h"
#include "rings.h"
#include "xsrc-abi.h"
#include "xsrc-qp-state.h"

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

int check_qp_type(uint8_t type, const Caller &caller)
{
	switch (type) {
	case IBV_QPT_RC:
	case IBV_QPT_UC:
	case IBV_QPT_UD:
	case IBV_QPT_XRC_SEND:
	case IBV_QPT_XRC_RECV:
		return 0;
	case IBV_QPT_RAW_PACKET:
		// Raw Ethernet frames on the netdev: what a raw packet socket
		// needs, as the kernel asks of its callers.
		return has_net_raw(caller.pid()) ? 0 : refuse(EPERM, "a raw packet QP needs CAP_NET_RAW");
	case IBV_QPT_DRIVER:
		return refuse(EOPNOTSUPP, "driver QPs are not supported");
	default:
		return refuse(EINVAL, "unknown QP type");
	}
}

bool has_receive_side(uint8_t type)
{
	return type == IBV_QPT_RC || type == IBV_QPT_UC || type == IBV_QPT_UD || type == IBV_QPT_RAW_PACKET;
}

// What a QP type does not use is ignored, as the kernel ignores it: an XRC
// send QP's receive CQ, SRQ and receive capabilities; an XRC receive QP's
// CQs, SRQ and every capability (it has no queues; all of them read 0).
constexpr uint32_t kSgeBytes = 16;  // an ibv_sge

QpInit normalise(QpInit init)
{
	if (init.qp_type == IBV_QPT_XRC_SEND) {
		init.caps.max_recv_wr = init.caps.max_recv_sge = 0;
		init.is_srq = false;
	} else if (init.qp_type == IBV_QPT_XRC_RECV) {
		init.caps = {};
		init.is_srq = false;
	}
	// A send WQE's SGE room holds inline data as well, 16 bytes a SGE, as on
	// rxe: a program that asked for no inline data may still send that much
	// inline (librdmacm's rdma_xclient does).
	uint32_t sge_room = std::min<uint32_t>(init.caps.max_send_sge * kSgeBytes, DeviceLimits::max_inline_data);
	if (init.caps.max_send_sge <= DeviceLimits::max_sge)
		init.caps.max_inline_data = std::max(init.caps.max_inline_data, sge_room);
	return init;
}

// The objects a new QP links to: all of this context, of the right type.
struct QpLinks {
	Pd *pd = nullptr;
	Cq *send_cq = nullptr;
	Cq *recv_cq = nullptr;
	Srq *srq = nullptr;
	Xrcd *xrcd = nullptr;  // XRC receive QPs
};

int resolve_qp_links(Context &ctx, const QpInit &init, QpLinks &links)
{
	if (init.qp_type == IBV_QPT_XRC_RECV) {
		links.xrcd = lookup<Xrcd>(ctx, init.pd_handle);
		return links.xrcd ? 0 : refuse(EINVAL, "no such XRC domain handle");
	}
	links.pd = lookup<Pd>(ctx, init.pd_handle);
	links.send_cq = lookup<Cq>(ctx, init.send_cq_handle);
	if (!links.pd || !links.send_cq)
		return refuse(EINVAL, "no such PD or send CQ handle");
	if (init.qp_type == IBV_QPT_XRC_SEND)
		return 0;
	links.recv_cq = lookup<Cq>(ctx, init.recv_cq_handle);
	if (!links.recv_cq)
		return refuse(EINVAL, "no such receive CQ handle");
	if (init.is_srq) {
		links.srq = lookup<Srq>(ctx, init.srq_handle);
		if (!links.srq || (links.srq->srq_type != IBV_SRQT_BASIC &&
				   !(links.srq->srq_type == IBV_SRQT_TM && init.qp_type == IBV_QPT_RC)))
			return refuse(EINVAL, "no such SRQ handle, or not a basic SRQ (or a tag-matching one for RC)");
	}
	return 0;
}

int check_qp_caps(const QpInit &init)
{
	using L = DeviceLimits;
	const QpCaps &c = init.caps;
	if (c.max_send_wr > L::max_qp_wr || c.max_send_sge > L::max_sge ||
	    c.max_inline_data > L::max_inline_data)
		return refuse(EINVAL, "limit: send queue size, SGEs or inline data over the device's");
	// With an SRQ the receive capabilities are the SRQ's; the QP's are ignored.
	if (!init.is_srq && (c.max_recv_wr > L::max_qp_wr || c.max_recv_sge > L::max_sge))
		return refuse(EINVAL, "limit: receive queue size or SGEs over the device's");
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
	e.qpn = qp.qpn().value();
	++e.generation;
	e.owner_pid = static_cast<__u32>(ctx.owner);
	e.owner_context = ctx.id;
	e.qp_type = qp.qp_type;
	e.sq_sig_all = qp.sq_sig_all;
	e.pd_id = links.pd ? links.pd->pd_id.value() : 0;
	e.srqn = links.srq ? links.srq->srqn().value() : 0;
	e.xrcd_id = links.xrcd ? links.xrcd->xrcd_id.value() : 0;
	e.rq_off = qp.rq_off;
	e.send_cq_off = links.send_cq ? links.send_cq->ring_off : 0;
	e.recv_cq_off = links.recv_cq ? links.recv_cq->ring_off : 0;
	e.max_send_wr = qp.caps.max_send_wr;
	e.max_recv_wr = qp.caps.max_recv_wr;
	e.max_send_sge = qp.caps.max_send_sge;
	e.max_recv_sge = qp.caps.max_recv_sge;
	e.max_inline_data = qp.caps.max_inline_data;
	store_release(e.state, xsrc_qp_state_encode(IBV_QPS_RESET));
}

// The receive ring of a QP without an SRQ, of `shape`: 0 when the arena is full.
uint64_t create_rq_ring(Context &ctx, const QpCaps &caps, const RecvShape &shape)
{
	Arena &arena = *ctx.device->arena;
	uint64_t off = arena.allocate(recv_ring_bytes(shape));
	if (off)
		recv_ring_init(arena.at<xsrc_recv_ring>(off), shape, caps.max_recv_wr, caps.max_recv_sge, ctx.owner);
	return off;
}

Qp new_qp(const QpInit &init, const QpLinks &links)
{
	Qp qp;
	qp.user_handle = init.user_handle;
	qp.qp_type = init.qp_type;
	qp.sq_sig_all = init.sq_sig_all;
	if (links.pd)
		qp.pd_handle = PdHandle(init.pd_handle);
	if (links.send_cq)
		qp.send_cq_handle = init.send_cq_handle;
	if (links.recv_cq)
		qp.recv_cq_handle = init.recv_cq_handle;
	if (links.xrcd)
		qp.xrcd_handle = init.pd_handle;
	qp.caps = init.caps;
	if (links.srq) {
		qp.srq_handle = init.srq_handle;
		qp.caps.max_recv_wr = qp.caps.max_recv_sge = 0;  // the SRQ's count
	}
	return qp;
}

// The shared QP's slot and arena entry name its oldest handle: the one whose
// context answers for it (owner_pid / owner_context).
void hand_over(Device &dev, const Qp &qp)
{
	ObjectRef next = qp.shared->holders.front();
	dev.qp_slots.rebind(qp.index, next);
	xsrc_qp_entry &e = dev.arena->qp_entry(qp.index);
	store_release<__u32>(e.owner_pid, static_cast<__u32>(next.ctx->owner));
	store_release<__u64>(e.owner_context, next.ctx->id);
}

// Drops a QP's reference on an object it links to.
template <typename T>
void unuse(Context &ctx, const auto &handle)
{
	if (handle)
		if (T *obj = lookup<T>(ctx, *handle))
			--obj->use_count;
}

// A live XRC receive QP by number, through any of its handles.
Qp *find_xrc_recv_qp(Device &dev, uint32_t qpn)
{
	if (qpn < XSRC_QPN_BASE)
		return nullptr;
	ObjectRef ref = dev.qp_slots.find(qpn - XSRC_QPN_BASE);
	if (!ref)
		return nullptr;
	Qp *qp = lookup<Qp>(*ref.ctx, ref.handle);
	return qp && qp->shared ? qp : nullptr;
}

int respond_created_qp(Caller &caller, const Request &req, uint32_t handle, const Qp &qp, bool extended)
{
	ib_uverbs_ex_create_qp_resp resp{};
	resp.base.qp_handle = handle;
	resp.base.qpn = qp.qpn().value();
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

int create_qp(Context &ctx, Caller &caller, const Request &req, const QpInit &request, bool extended)
{
	if (int err = check_qp_type(request.qp_type, caller))
		return err;
	const QpInit init = normalise(request);
	QpLinks links;
	if (int err = resolve_qp_links(ctx, init, links))
		return err;
	if (int err = check_qp_caps(init))
		return err;
	if (int err = check_no_driver_data(req))
		return err;
	Device &dev = *ctx.device;
	if (dev.qp_slots.used() >= DeviceLimits::max_qp)
		return refuse(ENOMEM, "limit: max_qp QPs on the device");

	Qp qp = new_qp(init, links);
	bool own_rq = has_receive_side(init.qp_type) && !init.is_srq;
	if (own_rq) {
		qp.rq_shape = recv_ring_shape(qp.caps.max_recv_wr, qp.caps.max_recv_sge);
		if (!(qp.rq_off = create_rq_ring(ctx, qp.caps, qp.rq_shape)))
			return refuse(ENOMEM, "arena full");
	}
	uint32_t handle;
	if (int err = insert_object(ctx, qp, handle)) {
		dev.arena->release(qp.rq_off);
		return err;
	}
	std::optional<uint32_t> index = dev.qp_slots.allocate({&ctx, ObjHandle(handle)});
	if (!index) {
		erase_object(ctx, handle);
		dev.arena->release(qp.rq_off);
		return refuse(ENOMEM, "limit: the device's QP numbers");
	}
	Qp &created = *lookup<Qp>(ctx, handle);
	created.index = *index;
	if (links.pd)
		++links.pd->use_count;
	if (links.send_cq)
		++links.send_cq->use_count;
	if (links.recv_cq)
		++links.recv_cq->use_count;
	if (links.srq)
		++links.srq->use_count;
	if (links.xrcd) {
		created.shared = std::make_shared<XrcTgtQp>();
		created.shared->xrcd_id = links.xrcd->xrcd_id;
		created.shared->holders.push_back({&ctx, ObjHandle(handle)});
		++links.xrcd->use_count;
	}

	if (int err = respond_created_qp(caller, req, handle, created, extended)) {
		release_qp(ctx, handle);
		return err;
	}
	publish_qp(ctx, created, links);
	return 0;
}

// The kernel's cross-channel create flags (enum ib_qp_create_flags), which
// libibverbs has no names for.
constexpr uint32_t kCreateCrossChannel = 1u << 2;
constexpr uint32_t kCreateManagedSend = 1u << 3;
constexpr uint32_t kCreateManagedRecv = 1u << 4;

// Create flags the kernel knows (enum ib_qp_create_flags, as far as the
// write ABI passes them). Only BLOCK_MULTICAST_LOOPBACK is supported, on UD
// QPs: a send to a group never reaches the sending QP here anyway.
constexpr uint32_t kKnownCreateFlags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB |
				       kCreateCrossChannel | kCreateManagedSend | kCreateManagedRecv |
				       IBV_QP_CREATE_SCATTER_FCS | IBV_QP_CREATE_CVLAN_STRIPPING |
				       IBV_QP_CREATE_SOURCE_QPN | IBV_QP_CREATE_PCI_WRITE_END_PADDING;

}  // namespace

ibv_qp_state qp_current_state(Device &dev, const Qp &qp)
{
	ibv_qp_state state = xsrc_qp_state_decode(load_acquire(dev.arena->qp_entry(qp.index).state));
	// A live QP's slot is never free unless a provider scribbled on it: the
	// daemon has always read that as RESET.
	return state == IBV_QPS_UNKNOWN ? IBV_QPS_RESET : state;
}

int cmd_create_qp(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_create_qp>(req.core);
	if (cmd.reserved)
		return refuse(EINVAL, "non-zero reserved field");
	return create_qp(ctx, caller, req, qp_init_from(cmd), false);
}

int cmd_ex_create_qp(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_ex_create_qp>(req.core);
	if (cmd.comp_mask & ~static_cast<uint32_t>(IB_UVERBS_CREATE_QP_SUP_COMP_MASK))
		return refuse(EINVAL, "unknown comp_mask bits");
	if (cmd.reserved)
		return refuse(EINVAL, "non-zero reserved field");
	// An indirection table handle names no object: none can exist here.
	if (cmd.comp_mask & IB_UVERBS_CREATE_QP_MASK_IND_TABLE)
		return refuse(EINVAL, "an indirection table (no such object here)");
	if (cmd.create_flags & ~kKnownCreateFlags)
		return refuse(EINVAL, "unknown create_flags");
	if (cmd.create_flags & ~static_cast<uint32_t>(IBV_QP_CREATE_BLOCK_SELF_MCAST_LB))
		return refuse(EOPNOTSUPP, "create_flags not supported");
	if (cmd.create_flags && cmd.qp_type != IBV_QPT_UD)
		return refuse(EOPNOTSUPP, "BLOCK_MULTICAST_LOOPBACK on a QP that is not UD");
	return create_qp(ctx, caller, req, qp_init_from(cmd), true);
}

int cmd_query_qp(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_query_qp>(req.core);
	Qp *qp = lookup<Qp>(ctx, cmd.qp_handle);
	if (!qp)
		return refuse(EINVAL, "no such QP handle");
	if (int err = check_no_driver_data(req))
		return err;
	const QpAttributes &a = qp->attributes();
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
	resp.qp_state = resp.cur_qp_state = static_cast<uint8_t>(qp_current_state(*ctx.device, *qp));
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

// Drops one handle. The QP goes with it unless it is a shared XRC receive QP
// that other handles (in this or other contexts) still hold.
void release_qp(Context &ctx, uint32_t handle)
{
	Qp *qp = lookup<Qp>(ctx, handle);
	if (!qp)
		return;
	bool last = true;
	if (qp->shared) {
		std::erase(qp->shared->holders, ObjectRef{&ctx, ObjHandle(handle)});
		last = qp->shared->holders.empty();
		if (!last && ctx.device)
			hand_over(*ctx.device, *qp);
	}
	mcast_leave_all(ctx, *qp);
	if (Device *dev = ctx.device; dev && last) {
		xsrc_qp_entry &e = dev->arena->qp_entry(qp->index);
		store_release<__u32>(e.state, XSRC_QP_STATE_FREE);  // first: peers stop using it
		clear_qp_entry(e);
		dev->arena->release(qp->rq_off);  // quarantined: a peer may still hold the offset
		dev->qp_slots.release(qp->index);
		mw_unbind_from_qp(*dev, qp->qpn());  // a later QP of this number reaches none of them
	}
	unuse<Pd>(ctx, qp->pd_handle);
	unuse<Cq>(ctx, qp->send_cq_handle);
	unuse<Cq>(ctx, qp->recv_cq_handle);
	unuse<Srq>(ctx, qp->srq_handle);
	unuse<Xrcd>(ctx, qp->xrcd_handle);
	erase_object(ctx, handle);
}

// OPEN_QP: a handle on a live XRC receive QP of the domain the given XRC
// domain handle names. Any other QP number, type or domain is EINVAL, as the
// kernel's ib_open_qp answers.
int cmd_open_qp(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_open_qp>(req.core);
	Xrcd *xrcd = lookup<Xrcd>(ctx, cmd.pd_handle);
	if (!xrcd || cmd.qp_type != IBV_QPT_XRC_RECV)
		return refuse(EINVAL, "no such XRC domain handle, or not an XRC receive QP");
	if (int err = check_no_driver_data(req))
		return err;
	const Qp *target = find_xrc_recv_qp(*ctx.device, cmd.qpn);
	if (!target || target->shared->xrcd_id != xrcd->xrcd_id)
		return refuse(EINVAL, "no such QP in this XRC domain");

	Qp qp;
	qp.user_handle = cmd.user_handle;
	qp.qp_type = IBV_QPT_XRC_RECV;
	qp.sq_sig_all = target->sq_sig_all;
	qp.xrcd_handle = cmd.pd_handle;
	qp.shared = target->shared;
	qp.index = target->index;
	uint32_t handle;
	if (int err = insert_object(ctx, std::move(qp), handle))
		return err;
	Qp &opened = *lookup<Qp>(ctx, handle);
	opened.shared->holders.push_back({&ctx, ObjHandle(handle)});
	++xrcd->use_count;
	if (int err = respond_created_qp(caller, req, handle, opened, false)) {
		release_qp(ctx, handle);
		return err;
	}
	return 0;
}

int cmd_destroy_qp(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_destroy_qp>(req.core);
	Qp *qp = lookup<Qp>(ctx, cmd.qp_handle);
	if (!qp)
		return refuse(EINVAL, "no such QP handle");
	// As the kernel: an application detaches first. (A context that goes
	// detaches its QPs itself: release_qp.)
	if (!qp->mcast_groups.empty())
		return refuse(EBUSY, "the QP is still attached to multicast groups");
	ib_uverbs_destroy_qp_resp resp{};
	resp.events_reported = qp->events_reported -
		reclaim_unread_async_events(ctx, qp->user_handle, qp->events_reported);
	if (int err = respond(caller, req, as_bytes_of(resp)))
		return err;
	release_qp(ctx, cmd.qp_handle);
	return 0;
}

}  // namespace xsrc
