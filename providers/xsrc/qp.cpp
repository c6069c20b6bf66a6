// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Queue pairs: lifetime through the daemon, posting in user space, and the
// ibv_qp_ex work-request builder (ibv_wr_*).
#include "xsrc.h"

#include <cstring>
#include <new>

namespace {

using xsrc::atomic;

constexpr uint64_t supported_send_ops =
	IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
	IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
	IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
constexpr uint32_t supported_init_mask =
	IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_XRCD;

uint32_t qp_state(const xsrc_qp *qp)
{
	uint32_t s = atomic(qp->entry->state).load(std::memory_order_acquire);
	return s ? s - 1 : uint32_t(IBV_QPS_UNKNOWN);
}

// Is `op` a request this QP type can carry?
bool opcode_allowed(ibv_qp_type type, ibv_wr_opcode op)
{
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
		return type == IBV_QPT_RC || type == IBV_QPT_XRC_SEND;
	default:
		return false;
	}
}

// Checks what a HCA checks when a WQE is posted. Returns 0 or an errno.
int validate(xsrc_qp *qp, const xsrc_send_wqe &wqe, size_t num_sge, uint64_t inline_len)
{
	uint32_t state = qp_state(qp);
	if (state != IBV_QPS_RTS && state != IBV_QPS_SQD && state != IBV_QPS_SQE && state != IBV_QPS_ERR)
		return EINVAL;
	if (!opcode_allowed(qp->type, wqe.opcode))
		return EINVAL;
	if (num_sge > qp->max_send_sge)
		return EINVAL;
	if ((wqe.flags & IBV_SEND_INLINE) && inline_len > qp->max_inline_data)
		return EINVAL;
	if ((wqe.flags & IBV_SEND_INLINE) &&
	    wqe.opcode != IBV_WR_SEND && wqe.opcode != IBV_WR_SEND_WITH_IMM &&
	    wqe.opcode != IBV_WR_RDMA_WRITE && wqe.opcode != IBV_WR_RDMA_WRITE_WITH_IMM)
		return EINVAL;
	if (qp->type == IBV_QPT_UD && !wqe.ah)
		return EINVAL;
	if (qp->type == IBV_QPT_XRC_SEND && !wqe.remote_srqn)
		return EINVAL;
	if (qp->type == IBV_QPT_XRC_RECV)
		return EINVAL;  // a receive QP has no send queue
	if (qp->sq.size() >= qp->max_send_wr)
		return ENOMEM;
	return 0;
}

int wqe_from_wr(xsrc_qp *qp, const ibv_send_wr *wr, xsrc_send_wqe &wqe)
{
	wqe.wr_id = wr->wr_id;
	wqe.opcode = wr->opcode;
	wqe.flags = wr->send_flags;
	wqe.imm_data = wr->imm_data;
	uint64_t inline_len = 0;
	if (wr->num_sge < 0)
		return EINVAL;
	for (int i = 0; i < wr->num_sge; ++i)
		inline_len += wr->sg_list[i].length;
	switch (wr->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
		wqe.remote_addr = wr->wr.rdma.remote_addr;
		wqe.rkey = wr->wr.rdma.rkey;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		wqe.remote_addr = wr->wr.atomic.remote_addr;
		wqe.rkey = wr->wr.atomic.rkey;
		wqe.compare_add = wr->wr.atomic.compare_add;
		wqe.swap = wr->wr.atomic.swap;
		break;
	default:
		break;
	}
	if (qp->type == IBV_QPT_XRC_SEND)
		wqe.remote_srqn = wr->qp_type.xrc.remote_srqn;
	if (qp->type == IBV_QPT_UD) {
		wqe.ah = wr->wr.ud.ah ? to_xsrc_ah(wr->wr.ud.ah) : nullptr;
		wqe.remote_qpn = wr->wr.ud.remote_qpn;
		wqe.remote_qkey = wr->wr.ud.remote_qkey;
	}
	if (int err = validate(qp, wqe, static_cast<size_t>(wr->num_sge), inline_len))
		return err;
	if (wr->send_flags & IBV_SEND_INLINE) {
		// The application may reuse its buffers as soon as we return.
		wqe.inline_data.reserve(inline_len);
		for (int i = 0; i < wr->num_sge; ++i) {
			auto *p = reinterpret_cast<const unsigned char *>(wr->sg_list[i].addr);
			wqe.inline_data.insert(wqe.inline_data.end(), p, p + wr->sg_list[i].length);
		}
	} else {
		wqe.sge.assign(wr->sg_list, wr->sg_list + wr->num_sge);
	}
	return 0;
}

// --- ibv_qp_ex: ibv_wr_start ... ibv_wr_complete --------------------------

xsrc_send_wqe *wr_new(ibv_qp_ex *ibqp, ibv_wr_opcode op)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	xsrc_send_wqe &wqe = qp->staged.emplace_back();
	wqe.wr_id = ibqp->wr_id;
	wqe.flags = ibqp->wr_flags;
	wqe.opcode = op;
	if (!opcode_allowed(qp->type, op))
		qp->staged_error = EINVAL;
	return &wqe;
}

xsrc_send_wqe *wr_last(ibv_qp_ex *ibqp)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	if (qp->staged.empty()) {
		qp->staged_error = EINVAL;
		static thread_local xsrc_send_wqe scratch;
		return &scratch;
	}
	return &qp->staged.back();
}

void wr_send(ibv_qp_ex *qp)
{
	wr_new(qp, IBV_WR_SEND);
}

void wr_send_imm(ibv_qp_ex *qp, __be32 imm)
{
	wr_new(qp, IBV_WR_SEND_WITH_IMM)->imm_data = imm;
}

void wr_rdma_write(ibv_qp_ex *qp, uint32_t rkey, uint64_t addr)
{
	xsrc_send_wqe *w = wr_new(qp, IBV_WR_RDMA_WRITE);
	w->rkey = rkey;
	w->remote_addr = addr;
}

void wr_rdma_write_imm(ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, __be32 imm)
{
	xsrc_send_wqe *w = wr_new(qp, IBV_WR_RDMA_WRITE_WITH_IMM);
	w->rkey = rkey;
	w->remote_addr = addr;
	w->imm_data = imm;
}

void wr_rdma_read(ibv_qp_ex *qp, uint32_t rkey, uint64_t addr)
{
	xsrc_send_wqe *w = wr_new(qp, IBV_WR_RDMA_READ);
	w->rkey = rkey;
	w->remote_addr = addr;
}

void wr_atomic_cmp_swp(ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap)
{
	xsrc_send_wqe *w = wr_new(qp, IBV_WR_ATOMIC_CMP_AND_SWP);
	w->rkey = rkey;
	w->remote_addr = addr;
	w->compare_add = compare;
	w->swap = swap;
}

void wr_atomic_fetch_add(ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, uint64_t add)
{
	xsrc_send_wqe *w = wr_new(qp, IBV_WR_ATOMIC_FETCH_AND_ADD);
	w->rkey = rkey;
	w->remote_addr = addr;
	w->compare_add = add;
}

void wr_set_sge(ibv_qp_ex *qp, uint32_t lkey, uint64_t addr, uint32_t length)
{
	xsrc_send_wqe *w = wr_last(qp);
	ibv_sge one{addr, length, lkey};
	w->sge.assign(&one, &one + 1);
}

void wr_set_sge_list(ibv_qp_ex *qp, size_t num_sge, const ibv_sge *sg_list)
{
	wr_last(qp)->sge.assign(sg_list, sg_list + num_sge);
}

void wr_set_inline_data(ibv_qp_ex *qp, void *addr, size_t length)
{
	xsrc_send_wqe *w = wr_last(qp);
	auto *p = static_cast<const unsigned char *>(addr);
	w->flags |= IBV_SEND_INLINE;
	w->inline_data.assign(p, p + length);
}

void wr_set_inline_data_list(ibv_qp_ex *qp, size_t num_buf, const ibv_data_buf *buf_list)
{
	xsrc_send_wqe *w = wr_last(qp);
	w->flags |= IBV_SEND_INLINE;
	w->inline_data.clear();
	for (size_t i = 0; i < num_buf; ++i) {
		auto *p = static_cast<const unsigned char *>(buf_list[i].addr);
		w->inline_data.insert(w->inline_data.end(), p, p + buf_list[i].length);
	}
}

void wr_set_ud_addr(ibv_qp_ex *qp, ibv_ah *ah, uint32_t remote_qpn, uint32_t remote_qkey)
{
	xsrc_send_wqe *w = wr_last(qp);
	w->ah = ah ? to_xsrc_ah(ah) : nullptr;
	w->remote_qpn = remote_qpn;
	w->remote_qkey = remote_qkey;
}

void wr_set_xrc_srqn(ibv_qp_ex *qp, uint32_t remote_srqn)
{
	wr_last(qp)->remote_srqn = remote_srqn;
}

void wr_start(ibv_qp_ex *ibqp)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	qp->sq_lock.lock();
	qp->staged.clear();
	qp->staged_error = 0;
}

int wr_complete(ibv_qp_ex *ibqp)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	int err = qp->staged_error;
	for (size_t i = 0; !err && i < qp->staged.size(); ++i) {
		const xsrc_send_wqe &w = qp->staged[i];
		uint64_t len = w.inline_data.size();
		err = validate(qp, w, w.sge.size(), len);
		if (!err && qp->sq.size() + i >= qp->max_send_wr)
			err = ENOMEM;
	}
	if (!err)
		for (xsrc_send_wqe &w : qp->staged)
			xsrc_sq_post(qp, std::move(w));
	qp->staged.clear();
	qp->sq_lock.unlock();
	return err;
}

void wr_abort(ibv_qp_ex *ibqp)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	qp->staged.clear();
	qp->sq_lock.unlock();
}

void set_wr_ops(ibv_qp_ex &q)
{
	q.wr_send = wr_send;
	q.wr_send_imm = wr_send_imm;
	q.wr_rdma_write = wr_rdma_write;
	q.wr_rdma_write_imm = wr_rdma_write_imm;
	q.wr_rdma_read = wr_rdma_read;
	q.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
	q.wr_atomic_fetch_add = wr_atomic_fetch_add;
	q.wr_set_sge = wr_set_sge;
	q.wr_set_sge_list = wr_set_sge_list;
	q.wr_set_inline_data = wr_set_inline_data;
	q.wr_set_inline_data_list = wr_set_inline_data_list;
	q.wr_set_ud_addr = wr_set_ud_addr;
	q.wr_set_xrc_srqn = wr_set_xrc_srqn;
	q.wr_start = wr_start;
	q.wr_complete = wr_complete;
	q.wr_abort = wr_abort;
}

using create_qp_resp = verbs_drv_buf<ib_uverbs_ex_create_qp_resp, xsrc_create_qp_resp>;

}  // namespace

ibv_qp *xsrc_create_qp_ex(ibv_context *ibctx, ibv_qp_init_attr_ex *attr)
{
	xsrc_context *ctx = to_xsrc_ctx(ibctx);
	if ((attr->comp_mask & ~supported_init_mask) || attr->create_flags) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	if ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	    (attr->send_ops_flags & ~supported_send_ops)) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UC && attr->qp_type != IBV_QPT_UD &&
	    attr->qp_type != IBV_QPT_XRC_SEND && attr->qp_type != IBV_QPT_XRC_RECV) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	auto *qp = new (std::nothrow) xsrc_qp{};
	if (!qp) {
		errno = ENOMEM;
		return nullptr;
	}
	struct ibv_create_qp_ex cmd{};
	create_qp_resp resp;
	if (int err = ibv_cmd_create_qp_ex2(ibctx, &qp->vqp, attr, &cmd, sizeof(cmd), resp.core(), resp.size)) {
		delete qp;
		errno = err;
		return nullptr;
	}
	qp->qpn = qp->vqp.qp.qp_num;
	qp->entry = ctx->arena.qp(qp->qpn);
	qp->rq = ctx->arena.at<xsrc_recv_ring>(resp.driver().rq_off);
	bool has_rq = attr->qp_type == IBV_QPT_RC || attr->qp_type == IBV_QPT_UC || attr->qp_type == IBV_QPT_UD;
	qp->send_cq = attr->send_cq ? to_xsrc_cq(attr->send_cq) : nullptr;
	qp->recv_cq = has_rq && attr->recv_cq ? to_xsrc_cq(attr->recv_cq) : nullptr;
	qp->srq = has_rq && attr->srq ? to_xsrc_srq(attr->srq) : nullptr;
	qp->type = attr->qp_type;
	qp->max_send_wr = attr->cap.max_send_wr;
	qp->max_send_sge = attr->cap.max_send_sge;
	qp->max_recv_sge = attr->cap.max_recv_sge;
	qp->max_inline_data = attr->cap.max_inline_data;
	qp->sq_sig_all = attr->sq_sig_all;
	if (!qp->entry || qp->entry->qpn != qp->qpn || (has_rq && !qp->srq && !qp->rq)) {
		ibv_cmd_destroy_qp(&qp->vqp.qp);
		delete qp;
		errno = EPROTO;
		return nullptr;
	}
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		set_wr_ops(qp->vqp.qp_ex);
		qp->vqp.comp_mask |= VERBS_QP_EX;
	}
	return &qp->vqp.qp;
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
	if (int err = ibv_cmd_modify_qp(ibqp, attr, attr_mask, &cmd, sizeof(cmd)))
		return err;
	if (!(attr_mask & IBV_QP_STATE))
		return 0;
	if (attr->qp_state == IBV_QPS_ERR) {
		std::lock_guard guard(qp->sq_lock);
		xsrc_qp_flush(qp);
	} else if (attr->qp_state == IBV_QPS_RESET) {
		// Back to RESET: the queues are emptied without completions.
		std::lock_guard guard(qp->sq_lock);
		qp->sq.clear();
		qp->retry_at_ns = 0;
		xsrc::RecvWqe discard;
		while (qp->rq && xsrc::recv_pop(qp->rq, discard)) {
		}
	}
	return 0;
}

int xsrc_query_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr)
{
	struct ibv_query_qp cmd{};
	return ibv_cmd_query_qp(qp, attr, attr_mask, init_attr, &cmd, sizeof(cmd));
}

int xsrc_destroy_qp(ibv_qp *ibqp)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	xsrc_progress_forget(to_xsrc_ctx(ibqp->context), qp);
	if (int err = ibv_cmd_destroy_qp(ibqp))
		return err;
	delete qp;
	return 0;
}

int xsrc_post_send(ibv_qp *ibqp, ibv_send_wr *wr, ibv_send_wr **bad_wr)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	std::lock_guard guard(qp->sq_lock);
	for (; wr; wr = wr->next) {
		xsrc_send_wqe wqe;
		if (int err = wqe_from_wr(qp, wr, wqe)) {
			*bad_wr = wr;
			return err;
		}
		xsrc_sq_post(qp, std::move(wqe));
	}
	return 0;
}

int xsrc_post_recv(ibv_qp *ibqp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	xsrc_context *ctx = to_xsrc_ctx(ibqp->context);
	std::lock_guard guard(qp->rq_lock);
	for (; wr; wr = wr->next) {
		uint32_t state = qp_state(qp);
		if (!qp->rq || state == IBV_QPS_RESET || wr->num_sge < 0 ||
		    static_cast<uint32_t>(wr->num_sge) > qp->max_recv_sge) {
			*bad_wr = wr;
			return EINVAL;
		}
		if (state == IBV_QPS_ERR) {
			xsrc_cqe c{};
			c.wr_id = wr->wr_id;
			c.status = IBV_WC_WR_FLUSH_ERR;
			c.opcode = IBV_WC_RECV;
			c.qp_num = qp->qpn;
			xsrc_cq_complete(ctx, qp->recv_cq->ring, 0, c);
			continue;
		}
		if (!xsrc_recv_post(qp->rq, wr)) {
			*bad_wr = wr;
			return ENOMEM;
		}
	}
	return 0;
}
