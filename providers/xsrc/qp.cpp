// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Queue pairs: lifetime through the daemon, and posting in user space. The
// ibv_qp_ex builder is qp_wr.cpp; what happens to a posted WQE, requester.cpp.
#include "xsrc.h"

#include <cstring>
#include <memory>
#include <new>

namespace {

constexpr uint64_t supported_send_ops =
	IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
	IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
	IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_WRITE
#if XSRC_DRIVER_ABI_REVISION >= 4
	| IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV
#endif
	;
constexpr uint32_t supported_init_mask =
	IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_CREATE_FLAGS |
	IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_IND_TABLE;
// A UD send to a group never reaches the sending QP (mcast.cpp), so blocking
// self loopback costs nothing; the other flags are for raw packet QPs or
// hardware features xsrc lacks.
constexpr uint32_t supported_ud_create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;

verbs_context *qp_vctx(const xsrc_qp *qp)
{
	return &to_xsrc_ctx(qp->vqp.qp.context)->ibv_ctx;
}

bool qp_has_send_queue(ibv_qp_type type)
{
	return type != IBV_QPT_XRC_RECV;
}

bool qp_has_recv_queue(ibv_qp_type type)
{
	return type == IBV_QPT_RC || type == IBV_QPT_UC || type == IBV_QPT_UD || type == IBV_QPT_RAW_PACKET;
}

bool inline_allowed(ibv_wr_opcode op)
{
	return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV ||
	       op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM;
}

// Builds the WQE of `wr` in place. Returns 0 or an errno.
int qp_wqe_from_wr(xsrc_qp *qp, const ibv_send_wr *wr, xsrc_send_wqe &wqe)
{
	wqe.clear();
	wqe.wr_id = wr->wr_id;
	wqe.opcode = wr->opcode;
	wqe.flags = wr->send_flags;
	wqe.imm_data = wr->imm_data;
	if (wr->num_sge < 0) {
		verbs_debug(qp_vctx(qp), "post_send: QP %u: num_sge %d is negative\n", qp->qpn.value(),
			    wr->num_sge);
		return EINVAL;
	}
	wqe.num_sge = static_cast<size_t>(wr->num_sge);
	if (wr->send_flags & IBV_SEND_INLINE)
		for (int i = 0; i < wr->num_sge; ++i)
			wqe.inline_len += wr->sg_list[i].length;
	switch (wr->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
	case IBV_WR_ATOMIC_WRITE:  // the 8 bytes come from the gather list
		wqe.remote_addr = wr->wr.rdma.remote_addr;
		wqe.rkey = xsrc::Rkey(wr->wr.rdma.rkey);
		break;
	case IBV_WR_BIND_MW:
		if (!wr->bind_mw.mw) {
			verbs_debug(qp_vctx(qp), "post_send: QP %u: a bind without a window\n", qp->qpn.value());
			return EINVAL;
		}
		xsrc_mw_wqe_bind(wqe, wr->bind_mw.mw, wr->bind_mw.rkey, wr->bind_mw.bind_info);
		wqe.num_sge = 0;
		break;
	case IBV_WR_LOCAL_INV:
		wqe.num_sge = 0;
		wqe.invalidate_rkey = wr->invalidate_rkey;
		break;
	case IBV_WR_SEND_WITH_INV:
		wqe.invalidate_rkey = wr->invalidate_rkey;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		wqe.remote_addr = wr->wr.atomic.remote_addr;
		wqe.rkey = xsrc::Rkey(wr->wr.atomic.rkey);
		wqe.compare_add = wr->wr.atomic.compare_add;
		wqe.swap = wr->wr.atomic.swap;
		break;
	default:
		break;
	}
	if (qp->type == IBV_QPT_XRC_SEND)
		wqe.remote_srqn = xsrc::Srqn(wr->qp_type.xrc.remote_srqn);
	if (qp->type == IBV_QPT_UD) {
		wqe.ah = wr->wr.ud.ah ? to_xsrc_ah(wr->wr.ud.ah) : nullptr;
		wqe.remote_qpn = xsrc::Qpn(wr->wr.ud.remote_qpn);
		wqe.remote_qkey = wr->wr.ud.remote_qkey;
	}
	if (int err = xsrc_qp_validate_wqe(qp, wqe))
		return err;
	// The application may reuse its buffers as soon as we return.
	if (wr->send_flags & IBV_SEND_INLINE)
		qp->sq.slots().set_inline_from_sge(wqe, wr->sg_list, wqe.num_sge);
	else
		qp->sq.slots().set_sge(wqe, wr->sg_list, wqe.num_sge);
	return 0;
}

// Why the device refused a QP's capabilities, named against its limits.
void qp_explain_caps(xsrc_context *ctx, const ibv_qp_cap &cap)
{
	verbs_context *vctx = &ctx->ibv_ctx;
	ibv_device_attr dev{};
	if (ibv_query_device(&ctx->ibv_ctx.context, &dev)) {
		verbs_err(vctx, "create_qp: caps refused: max_send_wr %u max_recv_wr %u max_send_sge %u "
				"max_recv_sge %u max_inline_data %u\n",
			  cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge, cap.max_inline_data);
		return;
	}
	const struct {
		const char *name;
		uint32_t asked;
		int limit;
	} caps[] = {
		{"max_send_wr", cap.max_send_wr, dev.max_qp_wr},
		{"max_recv_wr", cap.max_recv_wr, dev.max_qp_wr},
		{"max_send_sge", cap.max_send_sge, dev.max_sge},
		{"max_recv_sge", cap.max_recv_sge, dev.max_sge},
		{"max_inline_data", cap.max_inline_data, static_cast<int>(ctx->max_inline_data)},
	};
	for (const auto &c : caps)
		if (c.asked > static_cast<uint32_t>(c.limit))
			verbs_err(vctx, "create_qp: %s %u exceeds %d\n", c.name, c.asked, c.limit);
}

}  // namespace

int xsrc_qp_prepare_send(xsrc_context *ctx, xsrc_qp *qp, bool builder)
{
	// A receive QP's send queue refuses every WQE, from one slot.
	bool has_sq = qp_has_send_queue(qp->type);
	uint32_t wr = has_sq ? qp->max_send_wr : 0, sge = has_sq ? qp->max_send_sge : 0,
		 inl = has_sq ? qp->max_inline_data : 0;
	const xsrc_allocator *alloc = xsrc_pd_allocator(qp->parent_domain);
	if (qp->sq.init(wr, sge, inl, alloc) ||
	    (builder && qp->staged.init(size_t(wr) + 2, sge, inl, alloc, XSRC_RES_TYPE_SQ_STAGING))) {
		verbs_err(&ctx->ibv_ctx,
			  "create_qp: no memory for a send queue of %u WQEs of %u SGEs and %u inline bytes\n", wr,
			  sge, inl);
		return ENOMEM;
	}
	return has_sq ? xsrc_progress_prepare(ctx) : 0;
}

namespace {

ibv_qp *qp_create(ibv_context *ibctx, ibv_qp_init_attr_ex *attr)
{
	xsrc_context *ctx = to_xsrc_ctx(ibctx);
	verbs_context *vctx = &ctx->ibv_ctx;
	if (attr->comp_mask & ~supported_init_mask) {
		verbs_err(vctx, "create_qp: comp_mask 0x%x has unsupported bits 0x%x\n", attr->comp_mask,
			  attr->comp_mask & ~supported_init_mask);
		errno = EOPNOTSUPP;
		return nullptr;
	}
	uint32_t create_flags = (attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) ? attr->create_flags : 0;
	if (create_flags & ~(attr->qp_type == IBV_QPT_UD ? supported_ud_create_flags : 0)) {
		verbs_err(vctx, "create_qp: create_flags 0x%x are not supported on QP type %d\n", create_flags,
			  attr->qp_type);
		errno = EOPNOTSUPP;
		return nullptr;
	}
	if ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	    (attr->send_ops_flags & ~supported_send_ops)) {
		verbs_err(vctx, "create_qp: send_ops_flags 0x%llx has unsupported bits 0x%llx\n",
			  static_cast<unsigned long long>(attr->send_ops_flags),
			  static_cast<unsigned long long>(attr->send_ops_flags & ~supported_send_ops));
		errno = EOPNOTSUPP;
		return nullptr;
	}
	if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UC && attr->qp_type != IBV_QPT_UD &&
	    attr->qp_type != IBV_QPT_XRC_SEND && attr->qp_type != IBV_QPT_XRC_RECV &&
	    attr->qp_type != IBV_QPT_RAW_PACKET) {
		verbs_err(vctx, "create_qp: qp_type %d is not supported\n", attr->qp_type);
		errno = EOPNOTSUPP;
		return nullptr;
	}
	// A raw packet QP's frames go out of the netdev's packet socket.
	if (attr->qp_type == IBV_QPT_RAW_PACKET)
		if (int err = xsrc_raw_prepare(ctx)) {
			verbs_err(vctx, "create_qp: no packet socket for a raw packet QP: %s\n", strerror(err));
			errno = err;
			return nullptr;
		}
	// A hash QP (RSS) is, to the device, a raw packet QP without queues.
	xsrc_rss *rss = nullptr;
	ibv_qp_init_attr_ex hashed;
	if (attr->comp_mask & (IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_IND_TABLE)) {
		hashed = *attr;
		if (int err = xsrc_rss_prepare(ctx, hashed, rss)) {
			errno = err;
			return nullptr;
		}
		attr = &hashed;
	}
	auto *qp = new (std::nothrow) xsrc_qp{};
	if (!qp) {
		verbs_err(vctx, "create_qp: no memory for the QP\n");
		xsrc_rss_release(rss);
		errno = ENOMEM;
		return nullptr;
	}
	qp->rss = rss;
	ibv_qp_cap asked = attr->cap;
	struct ibv_create_qp_ex cmd{};
	verbs_drv_buf<ib_uverbs_ex_create_qp_resp, xsrc_create_qp_resp> resp;
	if (int err = ibv_cmd_create_qp_ex2(ibctx, &qp->vqp, attr, &cmd, sizeof(cmd), resp.core(), resp.size)) {
		xsrc_rss_release(qp->rss);
		delete qp;
		if (err == EINVAL)
			qp_explain_caps(ctx, asked);
		verbs_err(vctx, "create_qp: the device refused a QP of type %d: %s\n", attr->qp_type, strerror(err));
		errno = err;
		return nullptr;
	}
	qp->qpn = xsrc::Qpn(qp->vqp.qp.qp_num);
	qp->entry = ctx->arena.qp(qp->qpn);
	qp->rq = xsrc_recv_ring_at(ctx->arena, resp.driver().rq_off, qp->rq_shape);
	bool has_rq = qp_has_recv_queue(attr->qp_type);
	qp->send_cq = attr->send_cq ? to_xsrc_cq(attr->send_cq) : nullptr;
	qp->recv_cq = has_rq && attr->recv_cq ? to_xsrc_cq(attr->recv_cq) : nullptr;
	qp->srq = has_rq && attr->srq ? to_xsrc_srq(attr->srq) : nullptr;
	qp->type = attr->qp_type;
	if (qp->type == IBV_QPT_RAW_PACKET)
		qp->engine = &xsrc_raw_transport;
	qp->max_send_wr = attr->cap.max_send_wr;
	qp->max_send_sge = attr->cap.max_send_sge;
	qp->max_recv_sge = attr->cap.max_recv_sge;
	qp->max_inline_data = attr->cap.max_inline_data;
	qp->sq_sig_all = attr->sq_sig_all;
	if (attr->comp_mask & IBV_QP_INIT_ATTR_PD)
		qp->parent_domain = to_xsrc_parent_domain(attr->pd);
	int err = 0;
	if (!qp->entry || qp->entry->qpn != qp->qpn.value() || (has_rq && !qp->srq && !qp->rq)) {
		verbs_err(vctx, "create_qp: QP %u: the device answered no %s\n", qp->qpn.value(),
			  qp->entry && qp->entry->qpn == qp->qpn.value() ? "receive ring" : "QP table entry");
		err = EPROTO;
	} else {
		err = xsrc_qp_prepare_send(ctx, qp, attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS);
	}
	if (!err && has_rq && !qp->srq &&
	    (err = qp->rq_shadow.attach(ctx, xsrc_rq_shadow::queue::qp, qp->vqp.qp.handle,
					static_cast<uint32_t>(qp->rq_shape.entries), qp->max_recv_sge)))
		verbs_err(vctx, "create_qp: QP %u: the device took no record of its receives: %s\n", qp->qpn.value(),
			  strerror(err));
	if (err) {
		ibv_cmd_destroy_qp(&qp->vqp.qp);
		xsrc_rss_release(qp->rss);
		delete qp;
		errno = err;
		return nullptr;
	}
	if (qp->rss)
		xsrc_rss_bind(qp->rss);
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		xsrc_qp_wr_set_ops(qp->vqp.qp_ex);
		qp->vqp.comp_mask |= VERBS_QP_EX;
	}
	// The send queue stays locked: the progress thread shares it.
	if (qp->parent_domain && qp->parent_domain->td)
		qp->rq_lock.waive();
	xsrc_parent_domain_hold(qp->parent_domain);
	xsrc_context_add_qp(ctx, qp);
	return &qp->vqp.qp;
}

}  // namespace

bool xsrc_qp_opcode_allowed(ibv_qp_type type, ibv_wr_opcode op)
{
	if (type == IBV_QPT_RAW_PACKET)  // a frame is all a raw packet QP sends
		return op == IBV_WR_SEND;
	switch (op) {
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
		return true;
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return type == IBV_QPT_RC || type == IBV_QPT_UC || type == IBV_QPT_XRC_SEND;
	case IBV_WR_RDMA_READ:
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
	case IBV_WR_ATOMIC_WRITE:
		return type == IBV_QPT_RC || type == IBV_QPT_XRC_SEND;
#if XSRC_DRIVER_ABI_REVISION >= 4
	case IBV_WR_BIND_MW:
	case IBV_WR_LOCAL_INV:
	case IBV_WR_SEND_WITH_INV:
		return type == IBV_QPT_RC || type == IBV_QPT_UC || type == IBV_QPT_XRC_SEND;
#endif
	default:
		return false;
	}
}

int xsrc_qp_validate_wqe(xsrc_qp *qp, const xsrc_send_wqe &wqe)
{
	verbs_context *vctx = qp_vctx(qp);
	uint32_t qpn = qp->qpn.value();
	ibv_qp_state state = xsrc::qp_state_load(*qp->entry);
	bool inl = wqe.flags & IBV_SEND_INLINE;
	if (state != IBV_QPS_RTS && state != IBV_QPS_SQD && state != IBV_QPS_SQE && state != IBV_QPS_ERR) {
		verbs_debug(vctx, "post_send: QP %u is in state %d, which takes no sends\n", qpn, state);
		return EINVAL;
	}
	if (!xsrc_qp_opcode_allowed(qp->type, wqe.opcode)) {
		verbs_debug(vctx, "post_send: QP %u of type %d cannot carry opcode %d\n", qpn, qp->type, wqe.opcode);
		return EINVAL;
	}
	if (wqe.num_sge > qp->max_send_sge) {
		verbs_debug(vctx, "post_send: QP %u: num_sge %zu exceeds max_send_sge %u\n", qpn, wqe.num_sge,
			    qp->max_send_sge);
		return EINVAL;
	}
	if (inl && wqe.inline_len > qp->max_inline_data) {
		verbs_debug(vctx, "post_send: QP %u: %llu inline bytes exceed max_inline_data %u\n", qpn,
			    static_cast<unsigned long long>(wqe.inline_len), qp->max_inline_data);
		return EINVAL;
	}
	if (inl && !inline_allowed(wqe.opcode)) {
		verbs_debug(vctx, "post_send: QP %u: opcode %d cannot be IBV_SEND_INLINE\n", qpn, wqe.opcode);
		return EINVAL;
	}
	if (qp->type == IBV_QPT_UD && !wqe.ah) {
		verbs_debug(vctx, "post_send: UD QP %u: a send needs an address handle\n", qpn);
		return EINVAL;
	}
	if (qp->type == IBV_QPT_XRC_SEND && !wqe.remote_srqn.value()) {
		verbs_debug(vctx, "post_send: XRC QP %u: a send needs remote_srqn\n", qpn);
		return EINVAL;
	}
	if (qp->type == IBV_QPT_XRC_RECV) {
		verbs_debug(vctx, "post_send: XRC receive QP %u has no send queue\n", qpn);
		return EINVAL;
	}
	if (qp->sq.size() >= qp->max_send_wr) {
		verbs_debug(vctx, "post_send: QP %u: the send queue holds max_send_wr %u blocked WQEs\n", qpn,
			    qp->max_send_wr);
		return ENOMEM;
	}
	return 0;
}

ibv_qp *xsrc_create_qp_ex(ibv_context *ibctx, ibv_qp_init_attr_ex *attr)
{
	return xsrc_boundary(&to_xsrc_ctx(ibctx)->ibv_ctx, "create_qp", [&] { return qp_create(ibctx, attr); });
}

ibv_qp *xsrc_create_qp(ibv_pd *pd, ibv_qp_init_attr *attr)
{
	ibv_qp_init_attr_ex ex{};
	ex.qp_context = attr->qp_context;
	ex.send_cq = attr->send_cq;
	ex.recv_cq = attr->recv_cq;
	ex.srq = attr->srq;
	ex.cap = attr->cap;
	ex.qp_type = attr->qp_type;
	ex.sq_sig_all = attr->sq_sig_all;
	ex.comp_mask = IBV_QP_INIT_ATTR_PD;
	ex.pd = pd;
	ibv_qp *qp = xsrc_create_qp_ex(pd->context, &ex);
	if (qp)
		attr->cap = ex.cap;
	return qp;
}

int xsrc_modify_qp(ibv_qp *ibqp, ibv_qp_attr *attr, int attr_mask)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	struct ibv_modify_qp cmd{};
	// A path to another host needs the wire's response socket first: without
	// it nothing would ever acknowledge the QP's messages.
	const xsrc_transport *engine = qp->engine;
	if ((attr_mask & IBV_QP_AV) && qp->type != IBV_QPT_UD)
		engine = xsrc_route(ibqp->context, attr->ah_attr);
	if (engine == &xsrc_wire_transport)
		if (int err = xsrc_wire_prepare(qp)) {
			verbs_err(qp_vctx(qp), "modify_qp: QP %u cannot reach another host: %s\n", qp->qpn.value(),
				  strerror(err));
			return err;
		}
	if (int err = ibv_cmd_modify_qp(ibqp, attr, attr_mask, &cmd, sizeof(cmd))) {
		verbs_debug(qp_vctx(qp), "modify_qp: the device refused QP %u attr_mask 0x%x%s: %s\n",
			    qp->qpn.value(), attr_mask, attr_mask & IBV_QP_STATE ? " with a state change" : "",
			    strerror(err));
		return err;
	}
	// The RTR path names the destination: route by its GID.
	qp->engine = engine;
	// Another host: the wire engine learns the path, PSNs and MTU.
	if (qp->engine == &xsrc_wire_transport || qp->wire)
		if (int err = xsrc_wire_qp_modify(qp, *attr, attr_mask)) {
			verbs_err(qp_vctx(qp), "modify_qp: QP %u cannot reach its peer on the wire: %s\n",
				  qp->qpn.value(), strerror(err));
			return err;
		}
	if (!(attr_mask & IBV_QP_STATE))
		return 0;
	if (attr->qp_state == IBV_QPS_ERR) {
		std::lock_guard guard(qp->sq_lock);
		xsrc_requester_flush(qp);  // deferred WQEs too: not executed yet
	} else if (attr->qp_state == IBV_QPS_RESET) {
		// Back to RESET: the queues are emptied without completions.
		std::lock_guard guard(qp->sq_lock);
		qp->sq.clear();
		qp->retry_at_ns = 0;
		qp->rnr_rq = nullptr;
		xsrc_wire_qp_flush(qp, true);
		xsrc::RecvWqe discard;
		while (qp->rq && xsrc::recv_pop(qp->rq, qp->rq_shape, discard)) {
		}
		// ... and so are its completions still in the CQs (flushes, say).
		if (qp->send_cq)
			xsrc_cq_clean(qp->send_cq, qp->qpn);
		if (qp->recv_cq && qp->recv_cq != qp->send_cq)
			xsrc_cq_clean(qp->recv_cq, qp->qpn);
	}
	return 0;
}

int xsrc_query_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr)
{
	struct ibv_query_qp cmd{};
	int err = ibv_cmd_query_qp(qp, attr, attr_mask, init_attr, &cmd, sizeof(cmd));
	if (err)
		verbs_debug(qp_vctx(to_xsrc_qp(qp)), "query_qp: the device refused QP %u attr_mask 0x%x: %s\n",
			    qp->qp_num, attr_mask, strerror(err));
	return err;
}

int xsrc_destroy_qp(ibv_qp *ibqp)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	xsrc_context *ctx = to_xsrc_ctx(ibqp->context);
	// Flows hold their QP, as in the kernel: destroy them first.
	if (xsrc_raw_qp_has_flows(ctx, qp)) {
		verbs_err(qp_vctx(qp), "destroy_qp: QP %u still has flows\n", qp->qpn.value());
		return EBUSY;
	}
	{
		std::lock_guard guard(qp->sq_lock);
		xsrc_requester_run_deferred(qp);  // posted before the QP went: it moves
		qp->destroying = true;            // a poll's early retry leaves it alone now
	}
	xsrc_progress_forget(ctx, qp);
	if (int err = xsrc_destroy_status(ctx, ibv_cmd_destroy_qp(ibqp))) {
		verbs_err(qp_vctx(qp), "destroy_qp: the device refused QP %u: %s\n", qp->qpn.value(), strerror(err));
		return err;
	}
	xsrc_wire_qp_destroy(ctx, qp);
	xsrc_context_remove_qp(ctx, qp);
	xsrc_parent_domain_release(qp->parent_domain);
	xsrc_rss_release(qp->rss);
	delete qp;
	return 0;
}

// The fast path: each WQE is built in the send queue's free slot and
// executed from there; nothing allocates, nothing throws.
int xsrc_post_send(ibv_qp *ibqp, ibv_send_wr *wr, ibv_send_wr **bad_wr) noexcept
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	if (xsrc_device_gone(to_xsrc_ctx(ibqp->context))) {
		*bad_wr = wr;
		return EIO;  // as uverbs after a disassociation
	}
	std::lock_guard guard(qp->sq_lock);
	for (; wr; wr = wr->next) {
		if (int err = qp_wqe_from_wr(qp, wr, qp->sq.next())) {
			*bad_wr = wr;
			return err;
		}
		xsrc_requester_post(qp);
	}
	return 0;
}

int xsrc_post_recv(ibv_qp *ibqp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) noexcept
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	xsrc_context *ctx = to_xsrc_ctx(ibqp->context);
	if (xsrc_device_gone(ctx)) {
		*bad_wr = wr;
		return EIO;
	}
	std::lock_guard guard(qp->rq_lock);
	for (; wr; wr = wr->next) {
		ibv_qp_state state = xsrc::qp_state_load(*qp->entry);
		if (!qp->rq || state == IBV_QPS_RESET || wr->num_sge < 0 ||
		    static_cast<uint32_t>(wr->num_sge) > qp->max_recv_sge) {
			verbs_debug(&ctx->ibv_ctx, "post_recv: QP %u refuses: %s (num_sge %d, max_recv_sge %u)\n",
				    qp->qpn.value(),
				    !qp->rq ? "no receive queue (an SRQ's QP?)"
				    : state == IBV_QPS_RESET ? "the QP is in RESET"
							     : "num_sge out of range",
				    wr->num_sge, qp->max_recv_sge);
			*bad_wr = wr;
			return EINVAL;
		}
		if (state == IBV_QPS_ERR) {
			xsrc_cq_complete(ctx, qp->recv_cq->ring(), 0,
					 xsrc_make_cqe(wr->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, qp->qpn));
			continue;
		}
		if (!xsrc_recv_post(qp->rq, qp->rq_shape, qp->rq_shadow, wr)) {
			verbs_debug(&ctx->ibv_ctx, "post_recv: QP %u: the receive queue is full\n", qp->qpn.value());
			*bad_wr = wr;
			return ENOMEM;
		}
	}
	return 0;
}
