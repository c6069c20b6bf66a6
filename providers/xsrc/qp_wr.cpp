// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The ibv_qp_ex work-request builder (ibv_wr_start ... ibv_wr_complete):
// WQEs are staged in slots the QP allocated at creation, checked together
// at wr_complete and moved into the send queue. Nothing here allocates.
#include "xsrc.h"

#include <cstring>
#include <utility>

namespace {

// Takes the WQEs no staged slot is left for: wr_complete never reads it
// (one earlier staged WQE always fails for lack of room).
xsrc_send_wqe &qp_wr_scratch(xsrc_qp *qp)
{
	return qp->staged[qp->staged.count() - 1];
}

xsrc_send_wqe *qp_wr_new(ibv_qp_ex *ibqp, ibv_wr_opcode op)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	xsrc_send_wqe &wqe = qp->staged_count + 1 < qp->staged.count() ? qp->staged[qp->staged_count++]
								       : qp_wr_scratch(qp);
	wqe.clear();
	wqe.wr_id = ibqp->wr_id;
	wqe.flags = ibqp->wr_flags;
	wqe.opcode = op;
	if (!xsrc_qp_opcode_allowed(qp->type, op)) {
		verbs_debug(&to_xsrc_ctx(ibqp->qp_base.context)->ibv_ctx,
			    "wr_complete will refuse: QP %u of type %d cannot carry opcode %d\n", qp->qpn.value(),
			    qp->type, op);
		qp->staged_error = EINVAL;
	}
	qp->wr_current = &wqe;
	return &wqe;
}

// The WQE the ibv_wr_set_* calls complete.
xsrc_send_wqe *qp_wr_last(ibv_qp_ex *ibqp)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	if (!qp->wr_current) {
		verbs_debug(&to_xsrc_ctx(ibqp->qp_base.context)->ibv_ctx,
			    "wr_complete will refuse: QP %u: ibv_wr_set_* before any work request\n", qp->qpn.value());
		qp->staged_error = EINVAL;
		return &qp_wr_scratch(qp);
	}
	return qp->wr_current;
}

void qp_wr_send(ibv_qp_ex *qp)
{
	qp_wr_new(qp, IBV_WR_SEND);
}

void qp_wr_send_imm(ibv_qp_ex *qp, __be32 imm)
{
	qp_wr_new(qp, IBV_WR_SEND_WITH_IMM)->imm_data = imm;
}

// An RDMA or atomic request at `addr` through `rkey`.
xsrc_send_wqe *qp_wr_new_remote(ibv_qp_ex *qp, ibv_wr_opcode op, uint32_t rkey, uint64_t addr)
{
	xsrc_send_wqe *w = qp_wr_new(qp, op);
	w->rkey = xsrc::Rkey(rkey);
	w->remote_addr = addr;
	return w;
}

void qp_wr_rdma_write(ibv_qp_ex *qp, uint32_t rkey, uint64_t addr)
{
	qp_wr_new_remote(qp, IBV_WR_RDMA_WRITE, rkey, addr);
}

void qp_wr_rdma_write_imm(ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, __be32 imm)
{
	qp_wr_new_remote(qp, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, addr)->imm_data = imm;
}

void qp_wr_rdma_read(ibv_qp_ex *qp, uint32_t rkey, uint64_t addr)
{
	qp_wr_new_remote(qp, IBV_WR_RDMA_READ, rkey, addr);
}

void qp_wr_atomic_cmp_swp(ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap)
{
	xsrc_send_wqe *w = qp_wr_new_remote(qp, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, addr);
	w->compare_add = compare;
	w->swap = swap;
}

void qp_wr_atomic_fetch_add(ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, uint64_t add)
{
	qp_wr_new_remote(qp, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, addr)->compare_add = add;
}

void qp_wr_atomic_write(ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, const void *atomic_wr)
{
	xsrc_send_wqe *w = qp_wr_new_remote(qp, IBV_WR_ATOMIC_WRITE, rkey, addr);
	std::memcpy(&w->swap, atomic_wr, sizeof(w->swap));
	w->atomic_value_inline = true;
}

#if XSRC_DRIVER_ABI_REVISION >= 4
void qp_wr_bind_mw(ibv_qp_ex *qp, ibv_mw *mw, uint32_t rkey, const ibv_mw_bind_info *info)
{
	xsrc_mw_wqe_bind(*qp_wr_new(qp, IBV_WR_BIND_MW), mw, rkey, *info);
}

void qp_wr_local_inv(ibv_qp_ex *qp, uint32_t invalidate_rkey)
{
	qp_wr_new(qp, IBV_WR_LOCAL_INV)->invalidate_rkey = invalidate_rkey;
}

void qp_wr_send_inv(ibv_qp_ex *qp, uint32_t invalidate_rkey)
{
	qp_wr_new(qp, IBV_WR_SEND_WITH_INV)->invalidate_rkey = invalidate_rkey;
}
#endif

void qp_wr_set_sge(ibv_qp_ex *qp, uint32_t lkey, uint64_t addr, uint32_t length)
{
	ibv_sge one{addr, length, lkey};
	to_xsrc_qp(qp)->staged.set_sge(*qp_wr_last(qp), &one, 1);
}

void qp_wr_set_sge_list(ibv_qp_ex *qp, size_t num_sge, const ibv_sge *sg_list)
{
	to_xsrc_qp(qp)->staged.set_sge(*qp_wr_last(qp), sg_list, num_sge);
}

void qp_wr_set_inline_data(ibv_qp_ex *qp, void *addr, size_t length)
{
	xsrc_send_wqe *w = qp_wr_last(qp);
	ibv_data_buf one{addr, length};
	w->flags |= IBV_SEND_INLINE;
	to_xsrc_qp(qp)->staged.set_inline(*w, &one, 1);
}

void qp_wr_set_inline_data_list(ibv_qp_ex *qp, size_t num_buf, const ibv_data_buf *buf_list)
{
	xsrc_send_wqe *w = qp_wr_last(qp);
	w->flags |= IBV_SEND_INLINE;
	to_xsrc_qp(qp)->staged.set_inline(*w, buf_list, num_buf);
}

void qp_wr_set_ud_addr(ibv_qp_ex *qp, ibv_ah *ah, uint32_t remote_qpn, uint32_t remote_qkey)
{
	xsrc_send_wqe *w = qp_wr_last(qp);
	w->ah = ah ? to_xsrc_ah(ah) : nullptr;
	w->remote_qpn = xsrc::Qpn(remote_qpn);
	w->remote_qkey = remote_qkey;
}

void qp_wr_set_xrc_srqn(ibv_qp_ex *qp, uint32_t remote_srqn)
{
	qp_wr_last(qp)->remote_srqn = xsrc::Srqn(remote_srqn);
}

void qp_wr_start(ibv_qp_ex *ibqp)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	qp->sq_lock.lock();
	qp->staged_count = 0;
	qp->staged_error = 0;
	qp->wr_current = nullptr;
}

int qp_wr_complete(ibv_qp_ex *ibqp)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	int err = xsrc_device_gone(to_xsrc_ctx(ibqp->qp_base.context)) ? EIO : qp->staged_error;
	// Deferred WQEs (requester.cpp) hold queue slots only until they run:
	// run them rather than refuse the list for want of room.
	if (!err && qp->sq.size() + qp->staged_count >= qp->max_send_wr)
		xsrc_requester_run_deferred(qp);
	for (size_t i = 0; !err && i < qp->staged_count; ++i) {
		err = xsrc_qp_validate_wqe(qp, qp->staged[i]);
		if (!err && qp->sq.size() + i >= qp->max_send_wr) {
			verbs_debug(&to_xsrc_ctx(ibqp->qp_base.context)->ibv_ctx,
				    "wr_complete: QP %u: %zu work requests and %zu blocked exceed max_send_wr %u\n",
				    qp->qpn.value(), qp->staged_count, qp->sq.size(), qp->max_send_wr);
			err = ENOMEM;
		}
	}
	if (!err)
		for (size_t i = 0; i < qp->staged_count; ++i) {
			// Same-sized slots: trading them moves the WQE with its storage.
			std::swap(qp->sq.next(), qp->staged[i]);
			xsrc_requester_post(qp);
		}
	qp->staged_count = 0;
	qp->wr_current = nullptr;
	qp->sq_lock.unlock();
	return err;
}

void qp_wr_abort(ibv_qp_ex *ibqp)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	qp->staged_count = 0;
	qp->wr_current = nullptr;
	qp->sq_lock.unlock();
}

}  // namespace

void xsrc_qp_wr_set_ops(ibv_qp_ex &q)
{
	q.wr_send = qp_wr_send;
	q.wr_send_imm = qp_wr_send_imm;
	q.wr_rdma_write = qp_wr_rdma_write;
	q.wr_rdma_write_imm = qp_wr_rdma_write_imm;
	q.wr_rdma_read = qp_wr_rdma_read;
	q.wr_atomic_cmp_swp = qp_wr_atomic_cmp_swp;
	q.wr_atomic_fetch_add = qp_wr_atomic_fetch_add;
	q.wr_atomic_write = qp_wr_atomic_write;
#if XSRC_DRIVER_ABI_REVISION >= 4
	q.wr_bind_mw = qp_wr_bind_mw;
	q.wr_local_inv = qp_wr_local_inv;
	q.wr_send_inv = qp_wr_send_inv;
#endif
	q.wr_set_sge = qp_wr_set_sge;
	q.wr_set_sge_list = qp_wr_set_sge_list;
	q.wr_set_inline_data = qp_wr_set_inline_data;
	q.wr_set_inline_data_list = qp_wr_set_inline_data_list;
	q.wr_set_ud_addr = qp_wr_set_ud_addr;
	q.wr_set_xrc_srqn = qp_wr_set_xrc_srqn;
	q.wr_start = qp_wr_start;
	q.wr_complete = qp_wr_complete;
	q.wr_abort = qp_wr_abort;
}
