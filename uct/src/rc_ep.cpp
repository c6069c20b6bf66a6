// The RC endpoint: connection, data ops (put, get, active messages, atomics), pending
// queue, flush, fence and ep_check.
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

// Whether the ep may start an operation now; `credit`: it needs a receive at the peer.
ucs_status_t tx_check(Ep *ep, bool credit)
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
ucs_status_t iov_to_sge(const uct_iov_t *iov, size_t iovcnt, ibv_sge *sge, unsigned max, unsigned *n, size_t *total)
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

uint64_t atomic_apply(const TxOp &op, uint64_t old64, bool *changes)
{
	uint64_t mask = op.bits == 64 ? ~uint64_t{0} : uint64_t{0xffffffff};
	uint64_t field = (old64 >> op.shift) & mask;
	uint64_t nf = field;
	*changes = true;
	switch (op.aop) {
	case UCT_ATOMIC_OP_ADD: nf = field + op.operand; break;
	case UCT_ATOMIC_OP_AND: nf = field & op.operand; break;
	case UCT_ATOMIC_OP_OR: nf = field | op.operand; break;
	case UCT_ATOMIC_OP_XOR: nf = field ^ op.operand; break;
	case UCT_ATOMIC_OP_SWAP: nf = op.operand; break;
	case UCT_ATOMIC_OP_CSWAP:
		if (field != (op.compare & mask))
			*changes = false;
		else
			nf = op.operand;
		break;
	default: break;
	}
	nf &= mask;
	return (old64 & ~(mask << op.shift)) | (nf << op.shift);
}

ucs_status_t post_cswap(Ep *ep, TxOp *op, uint64_t compare, uint64_t swap)
{
	return uct_xsrc_rc_ep_post_word(ep, op, IBV_WR_ATOMIC_CMP_AND_SWP, op->remote_word, op->rkey, compare, swap);
}

// Starts an atomic: 64-bit ADD and CSWAP are the device's; the rest (AND, OR, XOR, SWAP, and
// every 32-bit op on its aligned 64-bit word) are compare-and-swap loops. Atomic with respect
// to the device's atomics (IBV_ATOMIC_HCA) and so to every shim user.
ucs_status_t atomic_start(uct_ep_h tl_ep, uct_atomic_op_t aop, unsigned bits, uint64_t operand, uint64_t compare,
			  uint64_t remote_addr, uct_rkey_t rkey, void *result, uct_completion_t *comp)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	if (i->md->dev_attr.atomic_cap == IBV_ATOMIC_NONE)
		return UCS_ERR_UNSUPPORTED;
	if (aop >= UCT_ATOMIC_OP_LAST)
		return UCS_ERR_INVALID_PARAM;
	if ((bits == 64 && (remote_addr & 7)) || (bits == 32 && (remote_addr & 3)))
		return UCS_ERR_INVALID_PARAM;
	ucs_status_t st = tx_check(ep, false);
	if (st != UCS_OK)
		return st;
	bool native = bits == 64 && (aop == UCT_ATOMIC_OP_ADD || aop == UCT_ATOMIC_OP_CSWAP);
	TxOp *op = uct_xsrc_rc_iface_op_get(i, native ? (aop == UCT_ATOMIC_OP_ADD ? OpKind::atomic_fadd : OpKind::atomic_cswap)
				    : OpKind::atomic_emul,
			  ep);
	op->aop = aop;
	op->bits = bits;
	op->shift = bits == 32 ? static_cast<unsigned>((remote_addr & 4) * 8) : 0;
	op->operand = operand;
	op->compare = compare;
	op->remote_word = remote_addr & ~uint64_t{7};
	op->rkey = static_cast<uint32_t>(rkey);
	op->result = result;
	op->comp = comp;
	if (!native) {
		// First guess: the word is 0. A wrong guess costs one round trip and teaches the value.
		op->expect = 0;
		bool changes;
		st = post_cswap(ep, op, 0, atomic_apply(*op, 0, &changes));
	} else if (aop == UCT_ATOMIC_OP_CSWAP) {
		st = post_cswap(ep, op, compare, operand);
	} else {
		st = uct_xsrc_rc_ep_post_word(ep, op, IBV_WR_ATOMIC_FETCH_AND_ADD, op->remote_word, op->rkey, operand, 0);
	}
	if (st != UCS_OK) {
		uct_xsrc_rc_iface_op_put(i, op);
		return st;
	}
	return result ? UCS_INPROGRESS : UCS_OK;
}

ucs_status_t rdma(Ep *ep, OpKind kind, ibv_wr_opcode opcode, ibv_sge *sge, unsigned nsge, uint64_t remote_addr,
		  uct_rkey_t rkey, uct_completion_t *comp, int buf, TxOp **op_out = nullptr)
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

}  // namespace

size_t uct_xsrc_rc_ep_addr_len() { return sizeof(EpAddr); }

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

ucs_status_t uct_xsrc_rc_ep_send_msg(Ep *ep, MsgKind kind, uint8_t am_id, uct_pack_callback_t pack, void *arg, ssize_t *packed)
{
	Iface *i = ep->iface;
	ucs_status_t st = tx_check(ep, true);
	if (st != UCS_OK)
		return st;
	int buf = uct_xsrc_rc_iface_buf_get(i);
	if (buf < 0)
		return UCS_ERR_NO_RESOURCE;
	char *at = uct_xsrc_rc_iface_buf_addr(i, buf);
	WireHdr hdr{static_cast<uint8_t>(kind), am_id, 0, ep->id, 0};
	memcpy(at, &hdr, sizeof(hdr));
	size_t len = pack(at + sizeof(WireHdr), arg);
	if (len > i->cfg.seg_size - sizeof(WireHdr)) {
		uct_xsrc_rc_iface_buf_put(i, buf);
		return UCS_ERR_EXCEEDS_LIMIT;
	}
	if (i->base.am_tracer && kind == MsgKind::user_am)
		i->base.am_tracer(i->base.am_tracer_arg, UCT_AM_TRACE_TYPE_SEND, am_id, at + sizeof(WireHdr), len, nullptr, 0);
	ibv_sge sge{reinterpret_cast<uintptr_t>(at), static_cast<uint32_t>(sizeof(WireHdr) + len), i->tx_mr->lkey};
	st = rdma(ep, OpKind::send, IBV_WR_SEND, &sge, 1, 0, 0, nullptr, buf);
	if (st != UCS_OK)
		return st;
	++ep->sent;
	*packed = static_cast<ssize_t>(len);
	return UCS_OK;
}

// --- Connection ---------------------------------------------------------------------------------
ucs_status_t uct_xsrc_rc_ep_create(const uct_ep_params_t *params, uct_ep_h *ep_p)
{
	if (!params || !ep_p)
		return UCS_ERR_INVALID_PARAM;
	uint64_t fm = params->field_mask;
	if (fm & (UCT_EP_PARAM_FIELD_SOCKADDR | UCT_EP_PARAM_FIELD_CM | UCT_EP_PARAM_FIELD_CONN_REQUEST))
		return cm_ep_create(params, ep_p);
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
	tag_ep_failed(i, ep, UCS_ERR_CANCELED);
	cm_ep_destroy(ep);
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
		if (ibv_get_srq_num(i->srq, &srqn) != 0)
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
		if (st == UCS_OK) {
			if (word != op->expect) {
				// Lost the race (or guessed wrong): go round again from the value seen.
				bool changes;
				uint64_t next = atomic_apply(*op, word, &changes);
				op->expect = word;
				if (!changes) {
					// A compare-and-swap whose compare fails: the seen value is the answer.
				} else if (post_cswap(ep, op, word, next) == UCS_OK) {
					return;
				} else {
					st = UCS_ERR_IO_ERROR;
				}
			}
			if (st == UCS_OK && op->result) {
				uint64_t field = (word >> op->shift) & (op->bits == 64 ? ~uint64_t{0} : 0xffffffffull);
				if (op->bits == 64)
					*static_cast<uint64_t *>(op->result) = field;
				else
					*static_cast<uint32_t *>(op->result) = static_cast<uint32_t>(field);
			}
		}
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

// --- RMA ------------------------------------------------------------------------------------------
ucs_status_t uct_xsrc_rc_ep_put_short(uct_ep_h tl_ep, const void *buffer, unsigned length, uint64_t remote_addr,
			     uct_rkey_t rkey)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	if (length > std::min(i->cfg.max_short, i->cfg.seg_size) || (length && !buffer))
		return UCS_ERR_INVALID_PARAM;
	ucs_status_t st = tx_check(ep, false);
	if (st != UCS_OK)
		return st;
	int buf = uct_xsrc_rc_iface_buf_get(i);
	if (buf < 0)
		return UCS_ERR_NO_RESOURCE;
	memcpy(uct_xsrc_rc_iface_buf_addr(i, buf), buffer, length);
	ibv_sge sge{reinterpret_cast<uintptr_t>(uct_xsrc_rc_iface_buf_addr(i, buf)), length, i->tx_mr->lkey};
	st = rdma(ep, OpKind::put, IBV_WR_RDMA_WRITE, &sge, 1, remote_addr, rkey, nullptr, buf);
	return st;
}

ssize_t uct_xsrc_rc_ep_put_bcopy(uct_ep_h tl_ep, uct_pack_callback_t pack_cb, void *arg, uint64_t remote_addr, uct_rkey_t rkey)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	ucs_status_t st = tx_check(ep, false);
	if (st != UCS_OK)
		return st;
	int buf = uct_xsrc_rc_iface_buf_get(i);
	if (buf < 0)
		return UCS_ERR_NO_RESOURCE;
	size_t len = pack_cb(uct_xsrc_rc_iface_buf_addr(i, buf), arg);
	if (len > i->cfg.seg_size) {
		uct_xsrc_rc_iface_buf_put(i, buf);
		return UCS_ERR_EXCEEDS_LIMIT;
	}
	ibv_sge sge{reinterpret_cast<uintptr_t>(uct_xsrc_rc_iface_buf_addr(i, buf)), static_cast<uint32_t>(len), i->tx_mr->lkey};
	st = rdma(ep, OpKind::put, IBV_WR_RDMA_WRITE, &sge, 1, remote_addr, rkey, nullptr, buf);
	return st == UCS_OK ? static_cast<ssize_t>(len) : static_cast<ssize_t>(st);
}

namespace {

// Zero-copy RDMA from or into the caller's registered iov.
ucs_status_t rdma_zcopy(uct_ep_h tl_ep, OpKind kind, ibv_wr_opcode opcode, const uct_iov_t *iov, size_t iovcnt,
			uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	ibv_sge sge[8];
	unsigned n;
	size_t total;
	ucs_status_t st = iov_to_sge(iov, iovcnt, sge, i->max_sge, &n, &total);
	if (st != UCS_OK)
		return st;
	if (total > i->max_msg)
		return UCS_ERR_INVALID_PARAM;
	st = tx_check(ep, false);
	if (st != UCS_OK)
		return st;
	st = rdma(ep, kind, opcode, sge, n, remote_addr, rkey, comp, -1);
	return st == UCS_OK ? UCS_INPROGRESS : st;
}

// An RDMA READ of `length` bytes into a bounce buffer; *op finishes the copy out.
ucs_status_t read_to_bounce(Ep *ep, OpKind kind, size_t length, uint64_t remote_addr, uct_rkey_t rkey,
			    uct_completion_t *comp, TxOp **op)
{
	Iface *i = ep->iface;
	ucs_status_t st = tx_check(ep, false);
	if (st != UCS_OK)
		return st;
	int buf = uct_xsrc_rc_iface_buf_get(i);
	if (buf < 0)
		return UCS_ERR_NO_RESOURCE;
	ibv_sge sge{reinterpret_cast<uintptr_t>(uct_xsrc_rc_iface_buf_addr(i, buf)), static_cast<uint32_t>(length), i->tx_mr->lkey};
	return rdma(ep, kind, IBV_WR_RDMA_READ, &sge, 1, remote_addr, rkey, comp, buf, op);
}

}  // namespace

ucs_status_t uct_xsrc_rc_ep_put_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov, size_t iovcnt, uint64_t remote_addr,
			     uct_rkey_t rkey, uct_completion_t *comp)
{
	return rdma_zcopy(tl_ep, OpKind::put, IBV_WR_RDMA_WRITE, iov, iovcnt, remote_addr, rkey, comp);
}

ucs_status_t uct_xsrc_rc_ep_get_short(uct_ep_h tl_ep, void *buffer, unsigned length, uint64_t remote_addr, uct_rkey_t rkey)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	if (length > std::min(i->cfg.max_short, i->cfg.seg_size) || (length && !buffer))
		return UCS_ERR_INVALID_PARAM;
	TxOp *op = nullptr;
	ucs_status_t st = read_to_bounce(ep, OpKind::get_short, length, remote_addr, rkey, nullptr, &op);
	if (st != UCS_OK)
		return st;
	op->dst = buffer;
	op->length = length;
	return UCS_INPROGRESS;  // the data is in `buffer` once the ep is flushed
}

ucs_status_t uct_xsrc_rc_ep_get_bcopy(uct_ep_h tl_ep, uct_unpack_callback_t unpack_cb, void *arg, size_t length,
			     uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	if (length > i->cfg.seg_size || !unpack_cb)
		return UCS_ERR_INVALID_PARAM;
	TxOp *op = nullptr;
	ucs_status_t st = read_to_bounce(ep, OpKind::get_bcopy, length, remote_addr, rkey, comp, &op);
	if (st != UCS_OK)
		return st;
	op->unpack = unpack_cb;
	op->unpack_arg = arg;
	op->length = length;
	return UCS_INPROGRESS;
}

ucs_status_t uct_xsrc_rc_ep_get_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov, size_t iovcnt, uint64_t remote_addr,
			     uct_rkey_t rkey, uct_completion_t *comp)
{
	return rdma_zcopy(tl_ep, OpKind::get_zcopy, IBV_WR_RDMA_READ, iov, iovcnt, remote_addr, rkey, comp);
}

// --- Active messages --------------------------------------------------------------------------
namespace {

struct ShortArgs {
	uint64_t header;
	const void *payload;
	unsigned length;
};

size_t pack_short(void *dest, void *arg)
{
	auto *a = static_cast<ShortArgs *>(arg);
	memcpy(dest, &a->header, sizeof(a->header));
	if (a->length)
		memcpy(static_cast<char *>(dest) + sizeof(a->header), a->payload, a->length);
	return sizeof(a->header) + a->length;
}

struct IovArgs {
	const uct_iov_t *iov;
	size_t iovcnt;
};

size_t pack_iov(void *dest, void *arg)
{
	auto *a = static_cast<IovArgs *>(arg);
	size_t off = 0;
	for (size_t k = 0; k < a->iovcnt; ++k) {
		unsigned count = a->iov[k].count ? a->iov[k].count : 1;
		for (unsigned c = 0; c < count; ++c) {
			memcpy(static_cast<char *>(dest) + off,
			       static_cast<const char *>(a->iov[k].buffer) + c * a->iov[k].stride, a->iov[k].length);
			off += a->iov[k].length;
		}
	}
	return off;
}

size_t iov_bytes(const uct_iov_t *iov, size_t iovcnt)
{
	size_t t = 0;
	for (size_t k = 0; k < iovcnt; ++k)
		t += iov[k].length * (iov[k].count ? iov[k].count : 1);
	return t;
}

}  // namespace

ucs_status_t uct_xsrc_rc_ep_am_short(uct_ep_h tl_ep, uint8_t id, uint64_t header, const void *payload, unsigned length)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	if (id >= UCT_AM_ID_MAX || (length && !payload) ||
	    sizeof(header) + length > std::min(i->cfg.max_short, i->cfg.seg_size - sizeof(WireHdr)))
		return UCS_ERR_INVALID_PARAM;
	ShortArgs a{header, payload, length};
	ssize_t packed;
	return uct_xsrc_rc_ep_send_msg(ep, MsgKind::user_am, id, pack_short, &a, &packed);
}

ucs_status_t uct_xsrc_rc_ep_am_short_iov(uct_ep_h tl_ep, uint8_t id, const uct_iov_t *iov, size_t iovcnt)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	if (id >= UCT_AM_ID_MAX || (iovcnt && !iov) ||
	    iov_bytes(iov, iovcnt) > std::min(i->cfg.max_short, i->cfg.seg_size - sizeof(WireHdr)))
		return UCS_ERR_INVALID_PARAM;
	IovArgs a{iov, iovcnt};
	ssize_t packed;
	return uct_xsrc_rc_ep_send_msg(ep, MsgKind::user_am, id, pack_iov, &a, &packed);
}

ssize_t uct_xsrc_rc_ep_am_bcopy(uct_ep_h tl_ep, uint8_t id, uct_pack_callback_t pack_cb, void *arg, unsigned)
{
	if (id >= UCT_AM_ID_MAX || !pack_cb)
		return UCS_ERR_INVALID_PARAM;
	ssize_t packed = 0;
	ucs_status_t st = uct_xsrc_rc_ep_send_msg(ep_of(tl_ep), MsgKind::user_am, id, pack_cb, arg, &packed);
	return st == UCS_OK ? packed : static_cast<ssize_t>(st);
}

ucs_status_t uct_xsrc_rc_ep_am_zcopy(uct_ep_h tl_ep, uint8_t id, const void *header, unsigned header_length,
			    const uct_iov_t *iov, size_t iovcnt, unsigned, uct_completion_t *comp)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	if (id >= UCT_AM_ID_MAX || header_length > 128 || (header_length && !header))
		return UCS_ERR_INVALID_PARAM;
	ibv_sge sge[8];
	unsigned n;
	size_t total;
	ucs_status_t st = iov_to_sge(iov, iovcnt, sge + 1, i->max_sge - 1, &n, &total);
	if (st != UCS_OK)
		return st;
	if (header_length + total > i->cfg.seg_size - sizeof(WireHdr))
		return UCS_ERR_INVALID_PARAM;
	st = tx_check(ep, true);
	if (st != UCS_OK)
		return st;
	int buf = uct_xsrc_rc_iface_buf_get(i);
	if (buf < 0)
		return UCS_ERR_NO_RESOURCE;
	char *at = uct_xsrc_rc_iface_buf_addr(i, buf);
	WireHdr hdr{static_cast<uint8_t>(MsgKind::user_am), id, 0, ep->id, 0};
	memcpy(at, &hdr, sizeof(hdr));
	if (header_length)
		memcpy(at + sizeof(hdr), header, header_length);
	sge[0] = {reinterpret_cast<uintptr_t>(at), static_cast<uint32_t>(sizeof(hdr) + header_length), i->tx_mr->lkey};
	st = rdma(ep, OpKind::send, IBV_WR_SEND, sge, n + 1, 0, 0, comp, buf);
	if (st != UCS_OK)
		return st;
	++ep->sent;
	return UCS_INPROGRESS;
}

// --- Atomics ------------------------------------------------------------------------------------
ucs_status_t uct_xsrc_rc_ep_atomic_cswap64(uct_ep_h ep, uint64_t compare, uint64_t swap, uint64_t remote_addr, uct_rkey_t rkey,
				  uint64_t *result, uct_completion_t *comp)
{
	if (!result)
		return UCS_ERR_INVALID_PARAM;
	return atomic_start(ep, UCT_ATOMIC_OP_CSWAP, 64, swap, compare, remote_addr, rkey, result, comp);
}

ucs_status_t uct_xsrc_rc_ep_atomic_cswap32(uct_ep_h ep, uint32_t compare, uint32_t swap, uint64_t remote_addr, uct_rkey_t rkey,
				  uint32_t *result, uct_completion_t *comp)
{
	if (!result)
		return UCS_ERR_INVALID_PARAM;
	return atomic_start(ep, UCT_ATOMIC_OP_CSWAP, 32, swap, compare, remote_addr, rkey, result, comp);
}

ucs_status_t uct_xsrc_rc_ep_atomic32_post(uct_ep_h ep, unsigned opcode, uint32_t value, uint64_t remote_addr, uct_rkey_t rkey)
{
	if (opcode == UCT_ATOMIC_OP_SWAP || opcode == UCT_ATOMIC_OP_CSWAP)
		return UCS_ERR_UNSUPPORTED;
	return atomic_start(ep, static_cast<uct_atomic_op_t>(opcode), 32, value, 0, remote_addr, rkey, nullptr, nullptr);
}

ucs_status_t uct_xsrc_rc_ep_atomic64_post(uct_ep_h ep, unsigned opcode, uint64_t value, uint64_t remote_addr, uct_rkey_t rkey)
{
	if (opcode == UCT_ATOMIC_OP_SWAP || opcode == UCT_ATOMIC_OP_CSWAP)
		return UCS_ERR_UNSUPPORTED;
	return atomic_start(ep, static_cast<uct_atomic_op_t>(opcode), 64, value, 0, remote_addr, rkey, nullptr, nullptr);
}

ucs_status_t uct_xsrc_rc_ep_atomic32_fetch(uct_ep_h ep, unsigned opcode, uint32_t value, uint32_t *result,
				  uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp)
{
	if (!result || opcode == UCT_ATOMIC_OP_CSWAP)
		return UCS_ERR_INVALID_PARAM;
	return atomic_start(ep, static_cast<uct_atomic_op_t>(opcode), 32, value, 0, remote_addr, rkey, result, comp);
}

ucs_status_t uct_xsrc_rc_ep_atomic64_fetch(uct_ep_h ep, unsigned opcode, uint64_t value, uint64_t *result,
				  uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp)
{
	if (!result || opcode == UCT_ATOMIC_OP_CSWAP)
		return UCS_ERR_INVALID_PARAM;
	return atomic_start(ep, static_cast<uct_atomic_op_t>(opcode), 64, value, 0, remote_addr, rkey, result, comp);
}

// --- Pending, flush, fence, check ---------------------------------------------------------------
namespace {

bool has_resources(Ep *ep)
{
	Iface *i = ep->iface;
	return ep->state == EpState::connected && *ep->sq > 1 && !i->free_ops.empty() && !i->free_bufs.empty() &&
	       i->rops->fc_handler(i, ep) > 0;
}

}  // namespace

ucs_status_t uct_xsrc_rc_ep_pending_add(uct_ep_h tl_ep, uct_pending_req_t *req, unsigned)
{
	Ep *ep = ep_of(tl_ep);
	if (!req || !req->func)
		return UCS_ERR_INVALID_PARAM;
	if (ep->pending.empty() && has_resources(ep))
		return UCS_ERR_BUSY;
	ep->pending.push_back(req);
	return UCS_OK;
}

void uct_xsrc_rc_ep_pending_dispatch(Ep *ep)
{
	ep->dispatching = true;
	while (!ep->pending.empty() && has_resources(ep)) {
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
	Iface *i = ep->iface;
	if (flags != 0 || comp)
		return UCS_ERR_INVALID_PARAM;
	if (ep->state == EpState::failed || ep->state == EpState::idle || ep->check_inflight)
		return UCS_OK;
	if (*ep->sq == 0)
		return UCS_ERR_NO_RESOURCE;
	TxOp *op = uct_xsrc_rc_iface_op_get(i, OpKind::check, ep);
	if (!op)
		return UCS_ERR_NO_RESOURCE;
	uct_xsrc_rc_iface_op_word(i, op) = ep->granted;
	ucs_status_t st = uct_xsrc_rc_ep_post_word(ep, op, IBV_WR_RDMA_WRITE, ep->remote_credit_addr, ep->remote_credit_rkey);
	if (st != UCS_OK) {
		uct_xsrc_rc_iface_op_put(i, op);
		return st;
	}
	ep->check_inflight = true;
	return UCS_OK;
}

}  // namespace xsrc::uct
