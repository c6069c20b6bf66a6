// The RC endpoint: connection (create, address, connect, destroy), posting work requests with
// their ordering and accounting, send completions, and the pending queue, flush, fence and
// ep_check. The data ops are in rc_ep_rma.cpp, rc_ep_am.cpp and rc_ep_atomic.cpp.
#include "rc_iface.h"

#include "modules.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace xsrc::uct {

namespace {

// XRC eps have no QP of their own: their address names their iface (its XRC key: the GID,
// in the device address, with `qpn` and `seq`) and its shared receive queue.
struct EpAddr {
	uint32_t qpn;          // RC: the QP; XRC: the iface key's pid
	uint32_t credit_rkey;
	uint64_t credit_addr;
	uint32_t rx_queue_len;
	uint32_t ep_id;
	uint32_t seq;          // XRC: the iface key's number; 0 on RC
	uint32_t srqn;         // XRC: the shared receive queue; 0 on RC
} __attribute__((packed));
static_assert(sizeof(EpAddr) == 32);  // rc_iface_conn.cpp's messages carry 32 bytes

bool uct_xsrc_rc_ep_has_resources(Ep *ep)
{
	Iface *i = ep->iface;
	return ep->state == EpState::connected && *ep->sq > 1 && !i->free_ops.empty() && !i->free_bufs.empty() &&
	       i->rops->fc_handler(i, ep) > 0;
}

}  // namespace

size_t uct_xsrc_rc_ep_addr_len() { return sizeof(EpAddr); }

// --- Posting ------------------------------------------------------------------------------------
// Whether the ep may start an operation now; `credit`: it needs a receive at the peer.
ucs_status_t uct_xsrc_rc_ep_tx_check(Ep *ep, bool credit)
{
	Iface *i = ep->iface;
	if (ep->state == EpState::failed)
		return ep->cancelled ? UCS_ERR_CANCELED : ep->fail_status;
	if (ep->state != EpState::connected)
		return UCS_ERR_NO_RESOURCE;
	if (!ep->pending.empty() && !ep->dispatching)
		return UCS_ERR_NO_RESOURCE;  // keep order behind queued requests
	if (*ep->sq <= 1)                // one work request is kept for credit grants and checks
		return UCS_ERR_NO_RESOURCE;
	if (credit && i->rops->fc_handler(i, ep) == 0)
		return UCS_ERR_NO_RESOURCE;
	if (i->free_ops.empty())
		return UCS_ERR_NO_RESOURCE;
	return UCS_OK;
}

// Scatter/gather entries from a UCT iov (each entry `count` times, `stride` apart).
ucs_status_t uct_xsrc_rc_ep_iov_to_sge(const uct_iov_t *iov, size_t iovcnt, ibv_sge *sge, unsigned max, unsigned *n, size_t *total)
{
	*n = 0;
	*total = 0;
	if (iovcnt && !iov)
		return UCS_ERR_INVALID_PARAM;
	for (size_t k = 0; k < iovcnt; ++k) {
		const uct_iov_t &v = iov[k];
		unsigned count = v.count ? v.count : 1;
		if (v.length == 0)
			continue;
		if (!v.memh || v.memh == UCT_MEM_HANDLE_NULL || !v.buffer)
			return UCS_ERR_INVALID_PARAM;
		uint32_t lkey = static_cast<Mr *>(v.memh)->mr->lkey;
		for (unsigned c = 0; c < count; ++c) {
			if (*n >= max)
				return UCS_ERR_INVALID_PARAM;
			sge[*n] = {reinterpret_cast<uintptr_t>(static_cast<char *>(v.buffer) + c * v.stride),
				   static_cast<uint32_t>(v.length), lkey};
			++*n;
			*total += v.length;
		}
	}
	return UCS_OK;
}

ucs_status_t uct_xsrc_rc_ep_tx_reserve(Ep *ep, bool credit, int *buf)
{
	ucs_status_t st = uct_xsrc_rc_ep_tx_check(ep, credit);
	if (st != UCS_OK)
		return st;
	*buf = uct_xsrc_rc_iface_buf_get(ep->iface);
	return *buf < 0 ? UCS_ERR_NO_RESOURCE : UCS_OK;
}

ucs_status_t uct_xsrc_rc_ep_post_rdma(Ep *ep, OpKind kind, ibv_wr_opcode opcode, ibv_sge *sge, unsigned nsge, uint64_t remote_addr,
		  uct_rkey_t rkey, uct_completion_t *comp, int buf, TxOp **op_out)
{
	Iface *i = ep->iface;
	TxOp *op = uct_xsrc_rc_iface_op_get(i, kind, ep);
	op->comp = comp;
	op->buf = buf;
	ibv_send_wr wr{};
	wr.opcode = opcode;
	wr.sg_list = sge;
	wr.num_sge = static_cast<int>(nsge);
	wr.wr.rdma.remote_addr = remote_addr;
	wr.wr.rdma.rkey = static_cast<uint32_t>(rkey);
	if (op_out)
		*op_out = op;
	ucs_status_t st = uct_xsrc_rc_ep_post(ep, op, &wr);
	if (st != UCS_OK)
		uct_xsrc_rc_iface_op_put(i, op);
	return st;
}

ucs_status_t uct_xsrc_rc_ep_post_word(Ep *ep, TxOp *op, ibv_wr_opcode opcode, uint64_t remote_addr, uint32_t rkey,
			     uint64_t compare_add, uint64_t swap)
{
	Iface *i = ep->iface;
	ibv_sge sge{reinterpret_cast<uintptr_t>(&uct_xsrc_rc_iface_op_word(i, op)), sizeof(uint64_t), i->atomic_mr->lkey};
	ibv_send_wr wr{};
	wr.opcode = opcode;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (opcode == IBV_WR_RDMA_WRITE) {
		wr.wr.rdma.remote_addr = remote_addr;
		wr.wr.rdma.rkey = rkey;
	} else {
		wr.wr.atomic.remote_addr = remote_addr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = compare_add;
		wr.wr.atomic.swap = swap;
	}
	return uct_xsrc_rc_ep_post(ep, op, &wr);
}

ucs_status_t uct_xsrc_rc_ep_post(Ep *ep, TxOp *op, ibv_send_wr *wr)
{
	Iface *i = ep->iface;
	if (*ep->sq == 0)
		return UCS_ERR_NO_RESOURCE;
	wr->wr_id = uct_xsrc_rc_iface_op_wr_id(i, op);
	wr->send_flags |= IBV_SEND_SIGNALED;
	if (ep->fence_next && (wr->opcode == IBV_WR_RDMA_READ || wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
			       wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD || wr->opcode == IBV_WR_SEND ||
			       wr->opcode == IBV_WR_RDMA_WRITE)) {
		wr->send_flags |= IBV_SEND_FENCE;
		ep->fence_next = false;
	}
	if (i->cfg.xrc)
		wr->qp_type.xrc.remote_srqn = ep->remote_srqn;
	wr->next = nullptr;
	ibv_send_wr *bad = nullptr;
	ibv_qp *qp = ep->ini ? ep->ini->qp : ep->qp;
	if (!qp)
		return UCS_ERR_NO_RESOURCE;
	int rc = ibv_post_send(qp, wr, &bad);
	if (rc != 0)
		return rc == ENOMEM ? UCS_ERR_NO_RESOURCE : uct_xsrc_md_errno_status(rc);
	--*ep->sq;
	op->ini = ep->ini;
	if (op->seq == 0) {
		op->seq = ep->next_seq++;
		ep->inflight.push_back(op->seq);
	}
	return UCS_OK;
}


// --- Connection ---------------------------------------------------------------------------------
ucs_status_t uct_xsrc_rc_ep_create(const uct_ep_params_t *params, uct_ep_h *ep_p)
{
	if (!params || !ep_p)
		return UCS_ERR_INVALID_PARAM;
	uint64_t fm = params->field_mask;
	if (fm & (UCT_EP_PARAM_FIELD_SOCKADDR | UCT_EP_PARAM_FIELD_CM | UCT_EP_PARAM_FIELD_CONN_REQUEST))
		return uct_xsrc_cm_ep_create(params, ep_p);
	if (!(fm & UCT_EP_PARAM_FIELD_IFACE) || !params->iface)
		return UCS_ERR_INVALID_PARAM;
	Iface *i = iface_of(params->iface);
	if (fm & (UCT_EP_PARAM_FIELD_IFACE_ADDR | UCT_EP_PARAM_FIELD_DEV_ADDR)) {
		if (!(fm & UCT_EP_PARAM_FIELD_IFACE_ADDR) || !(fm & UCT_EP_PARAM_FIELD_DEV_ADDR) || !params->iface_addr ||
		    !params->dev_addr)
			return UCS_ERR_INVALID_PARAM;
		return uct_xsrc_rc_iface_conn_ep_create(i, params->dev_addr, params->iface_addr, ep_p);
	}
	if (i->eps.size() >= i->cfg.max_eps)
		return UCS_ERR_EXCEEDS_LIMIT;
	auto *ep = new (std::nothrow) Ep();
	if (!ep)
		return UCS_ERR_NO_MEMORY;
	ep->super.iface = params->iface;
	ep->iface = i;
	ep->id = i->next_ep_id++;
	ucs_status_t st = UCS_OK;
	if (!i->cfg.xrc) {
		// XRC: the ep gets the iface's shared QPs when it connects (rc_xrc.cpp).
		ibv_qp_init_attr qa{};
		qa.send_cq = i->cq[0];
		qa.recv_cq = i->cq[1];
		qa.qp_type = IBV_QPT_RC;
		qa.cap.max_send_wr = i->cfg.sq_len;
		qa.cap.max_recv_wr = i->cfg.rx_queue_len;
		qa.cap.max_send_sge = i->max_sge;
		qa.cap.max_recv_sge = 1;
		st = i->vops->create_qp(i, &qa, &ep->qp);
		if (st == UCS_OK)
			st = uct_xsrc_verbs_qp_init(i, ep->qp);
	}
	if (st != UCS_OK) {
		if (ep->qp)
			ibv_destroy_qp(ep->qp);
		delete ep;
		return st;
	}
	ep->own_sq = i->cfg.xrc ? 0 : i->cfg.sq_len;
	i->eps.push_back(ep);
	i->by_id[ep->id] = ep;
	if (ep->qp)
		i->by_qpn[ep->qp->qp_num] = ep;  // where its receives complete
	st = i->rops->init_rx(i, ep);
	if (st != UCS_OK) {
		uct_xsrc_rc_ep_destroy(to_uct(ep));
		return st;
	}
	*ep_p = to_uct(ep);
	return UCS_OK;
}

void uct_xsrc_rc_ep_destroy(uct_ep_h tl_ep)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	uct_xsrc_tag_ep_failed(i, ep, UCS_ERR_CANCELED);
	uct_xsrc_cm_ep_destroy(ep);
	i->eps.erase(std::find(i->eps.begin(), i->eps.end(), ep));
	i->by_id.erase(ep->id);
	if (ep->qp) {
		uint32_t qpn = ep->qp->qp_num;
		auto it = i->by_qpn.find(qpn);
		if (it != i->by_qpn.end() && it->second == ep)
			i->by_qpn.erase(it);
		// Unhandled completions of this ep's own receive buffers go with it. (XRC receives
		// are routed when handled: a destroyed ep's go back to the shared queue then.)
		std::erase_if(i->stash, [&](const ibv_wc &wc) { return wc.qp_num == qpn; });
	}
	for (TxOp &op : i->ops) {
		if (!op.busy || op.ep != ep)
			continue;
		if (op.ini) {
			// Posted on a shared QP that lives on: its completion still comes, for nobody.
			op.ep = nullptr;
			op.comp = nullptr;
		} else {
			uct_xsrc_rc_iface_op_put(i, &op);
		}
	}
	uct_xsrc_rc_xrc_ep_detach(ep);
	if (ep->qp)
		ibv_destroy_qp(ep->qp);
	i->rops->cleanup_rx(i, ep);
	delete ep;
}

ucs_status_t uct_xsrc_rc_ep_get_address(uct_ep_h tl_ep, uct_ep_addr_t *addr)
{
	Ep *ep = ep_of(tl_ep);
	if (!addr || !ep->rx)
		return UCS_ERR_INVALID_PARAM;
	Iface *i = ep->iface;
	EpAddr a{0, ep->rx->mr->rkey, reinterpret_cast<uintptr_t>(ep->rx->mem), i->cfg.rx_queue_len, ep->id, 0, 0};
	if (i->cfg.xrc) {
		XrcKey self = uct_xsrc_rc_iface_conn_self_key(i);
		a.qpn = self.pid;
		a.seq = self.seq;
		uint32_t srqn = 0;
		if (ibv_get_srq_num(i->srq.get(), &srqn) != 0)
			return UCS_ERR_IO_ERROR;
		a.srqn = srqn;
	} else {
		a.qpn = ep->qp->qp_num;
	}
	memcpy(addr, &a, sizeof(a));
	return UCS_OK;
}

ucs_status_t uct_xsrc_rc_ep_connect_to_ep(uct_ep_h tl_ep, const uct_device_addr_t *dev_addr, const uct_ep_addr_t *ep_addr)
{
	Ep *ep = ep_of(tl_ep);
	if (!dev_addr || !ep_addr)
		return UCS_ERR_INVALID_PARAM;
	if (ep->state != EpState::idle || ep->ini)
		return UCS_ERR_ALREADY_EXISTS;
	EpAddr a;
	memcpy(&a, ep_addr, sizeof(a));
	if (a.rx_queue_len == 0 || a.credit_addr == 0)
		return UCS_ERR_INVALID_PARAM;
	ibv_gid gid;
	uint16_t lid;
	uct_xsrc_rc_iface_dev_addr_unpack(dev_addr, &gid, &lid);
	Iface *i = ep->iface;
	if ((a.srqn != 0) != i->cfg.xrc)
		return UCS_ERR_UNREACHABLE;  // one side RC, the other XRC
	ep->remote_credit_addr = a.credit_addr;
	ep->remote_credit_rkey = a.credit_rkey;
	ep->peer_window = a.rx_queue_len;
	if (i->cfg.xrc) {
		// The shared send QP towards the peer's iface (connected now, or when it answers).
		XrcKey remote;
		memcpy(remote.gid.data(), gid.raw, 16);
		remote.pid = a.qpn;
		remote.seq = a.seq;
		ep->remote_ep_id = a.ep_id;
		ep->remote_srqn = a.srqn;
		return uct_xsrc_rc_xrc_ep_connect(ep, remote, gid, lid);
	}
	ucs_status_t st = uct_xsrc_verbs_qp_connect(i, ep->qp, a.qpn, gid, lid);
	if (st != UCS_OK)
		return st;
	ep->state = EpState::connected;
	return UCS_OK;
}


// --- Completions ------------------------------------------------------------------------------
void uct_xsrc_rc_ep_tx_done(Iface *i, TxOp *op, const ibv_wc &wc)
{
	Ep *ep = op->ep;
	++*ep->sq;
	ucs_status_t st = wc.status == IBV_WC_SUCCESS ? UCS_OK : (ep->cancelled ? UCS_ERR_CANCELED : ep->fail_status);
	if (st == UCS_OK && wc.status != IBV_WC_SUCCESS)
		st = uct_xsrc_verbs_wc_status(wc.status);
	if (op->ini && ep->state == EpState::failed)
		st = ep->cancelled ? UCS_ERR_CANCELED : ep->fail_status;  // failed alone: the shared QP went on
	uint64_t word = uct_xsrc_rc_iface_op_word(i, op);
	switch (op->kind) {
	case OpKind::get_bcopy:
		if (st == UCS_OK)
			op->unpack(op->unpack_arg, uct_xsrc_rc_iface_buf_addr(i, op->buf), op->length);
		break;
	case OpKind::get_short:
		if (st == UCS_OK)
			memcpy(op->dst, uct_xsrc_rc_iface_buf_addr(i, op->buf), op->length);
		break;
	case OpKind::atomic_fadd:
	case OpKind::atomic_cswap:
		if (st == UCS_OK && op->result)
			*static_cast<uint64_t *>(op->result) = word;
		break;
	case OpKind::atomic_emul:
		if (uct_xsrc_rc_ep_atomic_done(ep, op, word, &st))
			return;  // posted again
		break;
	case OpKind::check:
		ep->check_inflight = false;
		break;
	default:
		break;
	}
	uct_completion_t *comp = op->comp;
	auto it = std::find(ep->inflight.begin(), ep->inflight.end(), op->seq);
	if (it != ep->inflight.end())
		ep->inflight.erase(it);
	uct_xsrc_rc_iface_op_put(i, op);
	// Callbacks last: a callback may destroy the ep.
	std::vector<uct_completion_t *> flushed;
	while (!ep->flush_waiters.empty() &&
	       (ep->inflight.empty() || ep->inflight.front() > ep->flush_waiters.front().first)) {
		flushed.push_back(ep->flush_waiters.front().second);
		ep->flush_waiters.pop_front();
	}
	ucs_status_t flush_st = ep->state == EpState::failed && !ep->cancelled ? ep->fail_status : UCS_OK;
	uct_xsrc_rc_iface_comp_done(comp, st);
	for (uct_completion_t *c : flushed)
		uct_xsrc_rc_iface_comp_done(c, flush_st);
}

// --- Pending, flush, fence, check ---------------------------------------------------------------
ucs_status_t uct_xsrc_rc_ep_pending_add(uct_ep_h tl_ep, uct_pending_req_t *req, unsigned)
{
	Ep *ep = ep_of(tl_ep);
	if (!req || !req->func)
		return UCS_ERR_INVALID_PARAM;
	if (ep->pending.empty() && uct_xsrc_rc_ep_has_resources(ep))
		return UCS_ERR_BUSY;
	ep->pending.push_back(req);
	return UCS_OK;
}

void uct_xsrc_rc_ep_pending_dispatch(Ep *ep)
{
	ep->dispatching = true;
	while (!ep->pending.empty() && uct_xsrc_rc_ep_has_resources(ep)) {
		uct_pending_req_t *req = ep->pending.front();
		ep->pending.pop_front();
		ucs_status_t st = req->func(req);
		if (st == UCS_ERR_NO_RESOURCE) {
			ep->pending.push_front(req);
			break;
		}
	}
	ep->dispatching = false;
}

void uct_xsrc_rc_ep_pending_purge(uct_ep_h tl_ep, uct_pending_purge_callback_t cb, void *arg)
{
	Ep *ep = ep_of(tl_ep);
	while (!ep->pending.empty()) {
		uct_pending_req_t *req = ep->pending.front();
		ep->pending.pop_front();
		if (cb)
			cb(req, arg);
	}
}

ucs_status_t uct_xsrc_rc_ep_flush(uct_ep_h tl_ep, unsigned flags, uct_completion_t *comp)
{
	Ep *ep = ep_of(tl_ep);
	if (flags & UCT_FLUSH_FLAG_CANCEL) {
		if (ep->state != EpState::failed)
			uct_xsrc_rc_ep_cancel(ep);
		else
			ep->cancelled = true;
	} else if (!ep->pending.empty()) {
		return UCS_ERR_NO_RESOURCE;
	} else if (ep->state == EpState::idle && ep->ini) {
		return UCS_ERR_NO_RESOURCE;  // XRC: waiting for the peer to answer (ep_pending_add queues)
	}
	if (ep->inflight.empty()) {
		if (ep->state == EpState::failed && !ep->cancelled)
			return ep->fail_status;
		return UCS_OK;
	}
	if (comp)
		ep->flush_waiters.emplace_back(ep->next_seq - 1, comp);
	return UCS_INPROGRESS;
}

ucs_status_t uct_xsrc_rc_ep_fence(uct_ep_h tl_ep, unsigned)
{
	Ep *ep = ep_of(tl_ep);
	if (!ep->inflight.empty())
		ep->fence_next = true;
	return UCS_OK;
}

// A keepalive: rewrite the credit grant the peer already has (idempotent). If the peer is
// gone the write exhausts its retries, the ep fails and the error handler runs.
ucs_status_t uct_xsrc_rc_ep_check(uct_ep_h tl_ep, unsigned flags, uct_completion_t *comp)
{
	Ep *ep = ep_of(tl_ep);
	if (flags != 0 || comp)
		return UCS_ERR_INVALID_PARAM;
	if (ep->state == EpState::failed || ep->state == EpState::idle || ep->check_inflight)
		return UCS_OK;
	ucs_status_t st = uct_xsrc_rc_ep_write_credit(ep, OpKind::check, ep->granted);
	if (st != UCS_OK)
		return st;
	ep->check_inflight = true;
	return UCS_OK;
}

ucs_status_t uct_xsrc_rc_ep_write_credit(Ep *ep, OpKind kind, uint64_t value)
{
	Iface *i = ep->iface;
	if (*ep->sq == 0)
		return UCS_ERR_NO_RESOURCE;
	TxOp *op = uct_xsrc_rc_iface_op_get(i, kind, ep);
	if (!op)
		return UCS_ERR_NO_RESOURCE;
	uct_xsrc_rc_iface_op_word(i, op) = value;
	ucs_status_t st = uct_xsrc_rc_ep_post_word(ep, op, IBV_WR_RDMA_WRITE, ep->remote_credit_addr, ep->remote_credit_rkey);
	if (st != UCS_OK)
		uct_xsrc_rc_iface_op_put(i, op);  // the op goes back to the pool
	return st;
}

}  // namespace xsrc::uct
