// The RC interface: open/close, receive set-up, flow control, progress, events, query, and
// the internal contract (internal.h) the tag and cm modules use.
#include "rc_iface.h"

#include "modules.h"
#include "ucx_module.h"

#include <xsrc/uct.h>

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

namespace xsrc::uct {

// --- The internal contract ------------------------------------------------------------------
Iface *to_iface(uct_iface_h h) { return iface_of(h); }
Ep *to_ep(uct_ep_h h) { return ep_of(h); }
Iface *ep_iface(Ep *ep) { return ep->iface; }
uct_iface_h to_uct(Iface *i) { return &i->base.super; }
uct_ep_h to_uct(Ep *ep) { return &ep->super; }
void iface_set_internal_handler(Iface *i, MsgKind k, InternalHandler cb, void *arg)
{
	auto idx = static_cast<unsigned>(k);
	if (idx == 0 || idx >= msg_kind_count)
		return;
	i->internal[idx] = {cb, arg};
}
size_t iface_internal_max(Iface *i) { return i->cfg.seg_size - sizeof(WireHdr); }
void *iface_tag_state(Iface *i) { return i->tag_state; }
void iface_set_tag_state(Iface *i, void *s) { i->tag_state = s; }
void *iface_cm_state(Iface *i) { return i->cm_state; }
void iface_set_cm_state(Iface *i, void *s) { i->cm_state = s; }
const uct_iface_params_t &iface_params(Iface *i) { return i->params; }
uct_md_h iface_md(Iface *i) { return md_handle(i->md); }
uct_worker_h iface_worker(Iface *i) { return i->worker; }
void *ep_cm_state(Ep *ep) { return ep->cm_state; }
ucs_status_t iface_watch_fd(Iface *i, int fd, bool on)
{
	if (fd < 0 || i->epfd < 0)
		return UCS_ERR_INVALID_PARAM;
	epoll_event ev{};
	ev.events = EPOLLIN;
	ev.data.fd = fd;
	int rc = on ? epoll_ctl(i->epfd, EPOLL_CTL_ADD, fd, &ev) : epoll_ctl(i->epfd, EPOLL_CTL_DEL, fd, nullptr);
	if (rc == 0 || (on && errno == EEXIST) || (!on && errno == ENOENT))
		return UCS_OK;
	return UCS_ERR_IO_ERROR;
}
void ep_set_cm_state(Ep *ep, void *s) { ep->cm_state = s; }

ssize_t ep_send_internal(Ep *ep, MsgKind kind, uct_pack_callback_t pack, void *arg)
{
	if (kind == MsgKind::user_am || static_cast<unsigned>(kind) >= msg_kind_count)
		return UCS_ERR_INVALID_PARAM;
	ssize_t packed = 0;
	ucs_status_t st = uct_xsrc_rc_ep_send_msg(ep, kind, 0, pack, arg, &packed);
	return st == UCS_OK ? packed : static_cast<ssize_t>(st);
}

// --- Op slots and bounce buffers ----------------------------------------------------------------
TxOp *uct_xsrc_rc_iface_op_get(Iface *i, OpKind kind, Ep *ep)
{
	if (i->free_ops.empty())
		return nullptr;
	unsigned idx = i->free_ops.back();
	i->free_ops.pop_back();
	TxOp &op = i->ops[idx];
	uint32_t gen = op.gen;
	op = TxOp{};
	op.gen = gen;
	op.busy = true;
	op.kind = kind;
	op.ep = ep;
	return &op;
}

void uct_xsrc_rc_iface_op_put(Iface *i, TxOp *op)
{
	if (op->buf >= 0)
		uct_xsrc_rc_iface_buf_put(i, op->buf);
	op->buf = -1;
	op->busy = false;
	++op->gen;
	i->free_ops.push_back(static_cast<unsigned>(op - i->ops.data()));
}

uint64_t uct_xsrc_rc_iface_op_wr_id(Iface *i, const TxOp *op)
{
	return (static_cast<uint64_t>(op->gen) << 32) | static_cast<uint64_t>(op - i->ops.data());
}

int uct_xsrc_rc_iface_buf_get(Iface *i)
{
	if (i->free_bufs.empty())
		return -1;
	int b = static_cast<int>(i->free_bufs.back());
	i->free_bufs.pop_back();
	return b;
}

void uct_xsrc_rc_iface_buf_put(Iface *i, int b) { i->free_bufs.push_back(static_cast<unsigned>(b)); }
char *uct_xsrc_rc_iface_buf_addr(Iface *i, int b) { return i->tx_mem + static_cast<size_t>(b) * i->cfg.seg_size; }

void uct_xsrc_rc_iface_comp_done(uct_completion_t *comp, ucs_status_t status)
{
	if (!comp)
		return;
	if (status != UCS_OK)
		comp->status = status;
	if (--comp->count == 0)
		comp->func(comp);
}

namespace {

// Receive buffers: [slack][desc pointer][rx_headroom][WireHdr][payload]. The receive is
// posted at the WireHdr; the slack makes room for the pointer and the headroom in front of
// the payload when they do not fit in the consumed wire header.
size_t rx_headroom(const Iface *i)
{
	return (i->params.field_mask & UCT_IFACE_PARAM_FIELD_RX_HEADROOM) ? i->params.rx_headroom : 0;
}
size_t rx_slack(const Iface *i)
{
	size_t need = rx_headroom(i) + sizeof(void *);
	return need > sizeof(WireHdr) ? ((need - sizeof(WireHdr) + 7) & ~size_t{7}) : 0;
}
size_t rx_stride(const Iface *i) { return rx_slack(i) + i->cfg.seg_size; }

void rx_release(uct_recv_desc_t *self, void *)
{
	auto *d = reinterpret_cast<RxDesc *>(self);
	RxPool *pool = d->pool;
	if (!d->held)
		return;  // double release: ignore
	d->held = false;
	--pool->held;
	if (pool->shared) {
		// XRC: back to the shared receive queue; the grant goes to the ep it came through.
		Iface *i = pool->iface;
		auto it = i->by_id.find(d->src_ep_id);
		uct_xsrc_rc_ep_repost(i, it == i->by_id.end() ? nullptr : it->second, d);
		return;
	}
	if (pool->orphan) {
		if (pool->held == 0) {
			if (pool->mr && !pool->borrowed)
				ibv_dereg_mr(pool->mr);
			if (!pool->borrowed)
				munmap(pool->mem, pool->mem_len);
			delete pool;
		}
		return;
	}
	Ep *ep = pool->ep;
	uct_xsrc_rc_ep_repost(ep->iface, ep, d);
}

RxPool *pool_alloc(Iface *i, unsigned n, int access)
{
	auto *pool = new (std::nothrow) RxPool();
	if (!pool)
		return nullptr;
	pool->iface = i;
	pool->mem_len = 64 + static_cast<size_t>(n) * rx_stride(i);
	void *mem = mmap(nullptr, pool->mem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED) {
		delete pool;
		return nullptr;
	}
	pool->mem = static_cast<char *>(mem);
	pool->mr = ibv_reg_mr(i->md->pd, pool->mem, pool->mem_len, access);
	if (!pool->mr) {
		munmap(pool->mem, pool->mem_len);
		delete pool;
		return nullptr;
	}
	pool->descs.resize(n);
	for (unsigned k = 0; k < n; ++k)
		pool->descs[k] = RxDesc{{rx_release}, pool, k, false, 0};
	return pool;
}

void pool_free(RxPool *pool)
{
	if (!pool->borrowed) {
		ibv_dereg_mr(pool->mr);
		munmap(pool->mem, pool->mem_len);
	}
	delete pool;
}

// XRC: a pool over part of an area the iface registered.
RxPool *pool_borrow(Iface *i, char *mem, size_t len, ibv_mr *mr, unsigned n)
{
	auto *pool = new (std::nothrow) RxPool();
	if (!pool)
		return nullptr;
	pool->iface = i;
	pool->mem = mem;
	pool->mem_len = len;
	pool->mr = mr;
	pool->borrowed = true;
	pool->descs.resize(n);
	for (unsigned k = 0; k < n; ++k)
		pool->descs[k] = RxDesc{{rx_release}, pool, k, false, 0};
	return pool;
}

size_t srq_chunk_len(const Iface *i) { return 64 + static_cast<size_t>(i->cfg.rx_queue_len) * rx_stride(i); }

ucs_status_t init_rx(Iface *i, Ep *ep)
{
	RxPool *pool;
	if (i->cfg.xrc) {
		if (i->free_credit_slots.empty())
			return UCS_ERR_EXCEEDS_LIMIT;
		unsigned slot = i->free_credit_slots.back();
		char *word = i->credit_mem + static_cast<size_t>(slot) * 64;
		pool = pool_borrow(i, word, 64, i->credit_mr, 0);
		if (!pool)
			return UCS_ERR_NO_MEMORY;
		i->free_credit_slots.pop_back();
		pool->slot = slot;
		memset(word, 0, 64);
	} else {
		pool = pool_alloc(i, i->cfg.rx_queue_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	}
	if (!pool)
		return UCS_ERR_NO_MEMORY;
	pool->ep = ep;
	ep->rx = pool;
	unsigned n = i->cfg.xrc ? 0 : i->cfg.rx_queue_len;
	if (i->cfg.xrc && i->srq_chunks.size() < i->eps.size()) {
		// One more chunk of receives in the shared queue for this ep's peer. Chunks stay with
		// the iface: an ep created later reuses the room a destroyed one left.
		size_t len = srq_chunk_len(i);
		RxPool *chunk = pool_borrow(i, i->srq_mem + i->srq_chunks.size() * len, len, i->srq_mr, i->cfg.rx_queue_len);
		if (!chunk)
			return UCS_ERR_NO_MEMORY;
		chunk->shared = true;
		i->srq_chunks.push_back(chunk);
		for (RxDesc &d : chunk->descs) {
			ucs_status_t st = uct_xsrc_rc_ep_repost(i, nullptr, &d);
			if (st != UCS_OK)
				return st;
		}
	}
	for (unsigned k = 0; k < n; ++k) {
		ucs_status_t st = uct_xsrc_rc_ep_repost(i, ep, &pool->descs[k]);
		if (st != UCS_OK)
			return st;
	}
	ep->reposted = 0;
	ep->granted = 0;
	ep->grant_wanted = false;
	return UCS_OK;
}

void cleanup_rx(Iface *i, Ep *ep)
{
	RxPool *pool = ep->rx;
	if (!pool)
		return;
	ep->rx = nullptr;
	if (pool->borrowed) {
		// XRC: a credit slot (a late grant written into it by the old peer can only over-credit
		// the next owner's peer, which then waits for receives: nothing is lost).
		i->free_credit_slots.push_back(pool->slot);
		delete pool;
		return;
	}
	if (pool->held > 0) {
		// A handler still holds descriptors: free with the last release.
		pool->orphan = true;
		pool->ep = nullptr;
		return;
	}
	pool_free(pool);
}

// Writes the count of re-posted receives into the peer's credit word.
ucs_status_t fc_ctrl(Iface *i, Ep *ep)
{
	if (ep->state != EpState::connected || ep->cancelled)
		return UCS_ERR_CANCELED;
	if (*ep->sq == 0)
		return UCS_ERR_NO_RESOURCE;
	TxOp *op = uct_xsrc_rc_iface_op_get(i, OpKind::grant, ep);
	if (!op)
		return UCS_ERR_NO_RESOURCE;
	uint64_t value = ep->reposted;
	uct_xsrc_rc_iface_op_word(i, op) = value;
	ucs_status_t st = uct_xsrc_rc_ep_post_word(ep, op, IBV_WR_RDMA_WRITE, ep->remote_credit_addr, ep->remote_credit_rkey);
	if (st != UCS_OK) {
		uct_xsrc_rc_iface_op_put(i, op);  // the grant stays wanted; the op goes back to the pool
		return st;
	}
	ep->granted = value;
	ep->grant_wanted = false;
	return UCS_OK;
}

unsigned fc_handler(Iface *, Ep *ep)
{
	if (!ep->rx)
		return 0;
	uint64_t granted = __atomic_load_n(ep->rx->credit_word(), __ATOMIC_ACQUIRE);
	uint64_t limit = granted + ep->peer_window;
	return limit > ep->sent ? static_cast<unsigned>(limit - ep->sent) : 0;
}

ucs_status_t am_stub(void *, void *, size_t, unsigned) { return UCS_OK; }

}  // namespace

const RcIfaceOps uct_xsrc_rc_iface_default_ops = {
	.init_rx = init_rx,
	.cleanup_rx = cleanup_rx,
	.fc_ctrl = fc_ctrl,
	.fc_handler = fc_handler,
};

ucs_status_t uct_xsrc_rc_ep_repost(Iface *i, Ep *ep, RxDesc *d)
{
	RxPool *pool = d->pool;
	char *at = pool->mem + 64 + static_cast<size_t>(d->index) * rx_stride(i) + rx_slack(i);
	ibv_sge sge{reinterpret_cast<uintptr_t>(at), static_cast<uint32_t>(i->cfg.seg_size), pool->mr->lkey};
	ibv_recv_wr wr{};
	ibv_recv_wr *bad = nullptr;
	wr.wr_id = reinterpret_cast<uintptr_t>(d);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	int rc = pool->shared ? ibv_post_srq_recv(i->srq, &wr, &bad) : ibv_post_recv(ep->qp, &wr, &bad);
	if (rc != 0)
		return uct_xsrc_md_errno_status(rc);
	if (!ep)
		return UCS_OK;
	++ep->reposted;
	unsigned threshold = std::max(1u, i->cfg.rx_queue_len / 4);
	if (ep->reposted - ep->granted >= threshold)
		ep->grant_wanted = true;
	return UCS_OK;
}

char *uct_xsrc_rc_iface_rx_data(Iface *i, const RxDesc *d)
{
	return d->pool->mem + 64 + static_cast<size_t>(d->index) * rx_stride(i) + rx_slack(i);
}

void iface_release_desc(Iface *i, void *data)
{
	char *desc = static_cast<char *>(data) - rx_headroom(i);
	uct_recv_desc_t *rd = uct_recv_desc(desc);
	rd->cb(rd, desc);
}

void uct_xsrc_rc_ep_rx(Iface *i, Ep *ep, RxDesc *d, size_t byte_len)
{
	RxPool *pool = d->pool;
	d->src_ep_id = ep->id;
	char *at = pool->mem + 64 + static_cast<size_t>(d->index) * rx_stride(i) + rx_slack(i);
	if (byte_len < sizeof(WireHdr)) {
		uct_xsrc_rc_ep_repost(i, ep, d);
		return;
	}
	WireHdr hdr;
	memcpy(&hdr, at, sizeof(hdr));
	char *data = at + sizeof(WireHdr);
	size_t len = byte_len - sizeof(WireHdr);
	char *desc = data - rx_headroom(i);
	uct_recv_desc(desc) = &d->release;
	d->held = true;
	++pool->held;
	ucs_status_t st = UCS_OK;
	if (hdr.kind == static_cast<uint8_t>(MsgKind::user_am)) {
		if (hdr.am_id < UCT_AM_ID_MAX) {
			UcxAmHandler &h = i->base.am[hdr.am_id];
			if (i->base.am_tracer)
				i->base.am_tracer(i->base.am_tracer_arg, UCT_AM_TRACE_TYPE_RECV, hdr.am_id, data, len, nullptr, 0);
			st = h.cb(h.arg, data, len, UCT_CB_PARAM_FLAG_DESC);
		}
	} else if (hdr.kind < msg_kind_count && i->internal[hdr.kind].cb) {
		InternalSlot &s = i->internal[hdr.kind];
		st = s.cb(s.arg, ep, data, len, UCT_CB_PARAM_FLAG_DESC);
	}
	if (st != UCS_INPROGRESS) {
		d->held = false;
		--pool->held;
		uct_xsrc_rc_ep_repost(i, ep, d);
	}
}

namespace {

void ep_fail(Iface *i, Ep *ep, ucs_status_t status, bool notify);

void handle_tx_wc(Iface *i, const ibv_wc &wc)
{
	uint32_t idx = static_cast<uint32_t>(wc.wr_id);
	uint32_t gen = static_cast<uint32_t>(wc.wr_id >> 32);
	if (idx >= i->ops.size())
		return;
	TxOp *op = &i->ops[idx];
	if (!op->busy || op->gen != gen)
		return;  // its ep was destroyed
	if (op->ini) {
		uct_xsrc_rc_xrc_tx_done(i, op, wc);  // a shared QP: failures are the QP's, and so every ep's on it
		return;
	}
	if (wc.status != IBV_WC_SUCCESS) {
		Ep *ep = op->ep;
		ucs_status_t st = uct_xsrc_verbs_wc_status(wc.status);
		if (ep->cancelled)
			st = UCS_ERR_CANCELED;
		else if (ep->state == EpState::failed)
			st = ep->fail_status;
		i->vops->handle_failure(i, wc);
		if (ep->state != EpState::failed)
			ep_fail(i, ep, st, true);
	}
	uct_xsrc_rc_ep_tx_done(i, op, wc);
}

// XRC: every receive is a shared-queue descriptor; the TGT QP names the remote iface and the
// WireHdr the remote ep. One for an ep that is gone goes back to the queue.
void handle_xrc_rx_wc(Iface *i, const ibv_wc &wc)
{
	auto *d = reinterpret_cast<RxDesc *>(wc.wr_id);
	if (wc.status != IBV_WC_SUCCESS) {
		if (wc.status != IBV_WC_WR_FLUSH_ERR)
			uct_xsrc_rc_ep_repost(i, nullptr, d);
		return;
	}
	Ep *ep = nullptr;
	if (wc.byte_len >= sizeof(WireHdr)) {
		WireHdr hdr;
		memcpy(&hdr, uct_xsrc_rc_iface_rx_data(i, d), sizeof(hdr));
		ep = uct_xsrc_rc_xrc_route(i, wc.qp_num, hdr.src_ep_id);
	}
	if (!ep) {
		uct_xsrc_rc_ep_repost(i, nullptr, d);
		return;
	}
	uct_xsrc_rc_ep_rx(i, ep, d, wc.byte_len);
}

void handle_rx_wc(Iface *i, const ibv_wc &wc)
{
	if (i->cfg.xrc)
		return handle_xrc_rx_wc(i, wc);
	auto it = i->by_qpn.find(wc.qp_num);
	if (it == i->by_qpn.end())
		return;  // the ep was destroyed: its receive buffers are gone
	Ep *ep = it->second;
	auto *d = reinterpret_cast<RxDesc *>(wc.wr_id);
	// The QP number may have been reused by a new ep: the descriptor must be its own.
	if (!ep->rx || ep->rx->descs.empty() || d < ep->rx->descs.data() || d >= ep->rx->descs.data() + ep->rx->descs.size())
		return;
	if (wc.status != IBV_WC_SUCCESS) {
		if (wc.status != IBV_WC_WR_FLUSH_ERR && ep->state != EpState::failed)
			ep_fail(i, ep, uct_xsrc_verbs_wc_status(wc.status), true);
		return;
	}
	uct_xsrc_rc_ep_rx(i, ep, d, wc.byte_len);
}

void handle_wc(Iface *i, const ibv_wc &wc, bool rx) { rx ? handle_rx_wc(i, wc) : handle_tx_wc(i, wc); }

// The ep goes to error: its RC QP is moved to the error state so outstanding work completes
// (flushed) with the failure status (an XRC ep's shared QP serves others: its outstanding work
// completes as it does, reported with the ep's status), the tag module fails its rendezvous
// operations and the user's error handler hears of it.
void ep_fail(Iface *i, Ep *ep, ucs_status_t status, bool notify)
{
	if (ep->state == EpState::failed)
		return;
	ep->state = EpState::failed;
	ep->fail_status = status;
	if (ep->qp) {
		ibv_qp_attr a{};
		a.qp_state = IBV_QPS_ERR;
		ibv_modify_qp(ep->qp, &a, IBV_QP_STATE);
	}
	i->vops->set_ep_failed(i, to_uct(ep), status);
	tag_ep_failed(i, ep, status);
	if (notify && i->base.err_handler)
		i->base.err_handler(i->base.err_handler_arg, to_uct(ep), status);
}

ucs_status_t set_ep_failed_hook(VerbsIface *, uct_ep_h, ucs_status_t) { return UCS_OK; }

const VerbsIfaceOps uct_xsrc_rc_iface_verbs_ops = [] {
	VerbsIfaceOps o = uct_xsrc_verbs_iface_default_ops;
	o.set_ep_failed = set_ep_failed_hook;
	return o;
}();

}  // namespace

void ep_set_failed(Ep *ep, ucs_status_t status) { ep_fail(ep->iface, ep, status, true); }
void uct_xsrc_rc_ep_fail_one(Ep *ep, ucs_status_t status, bool notify) { ep_fail(ep->iface, ep, status, notify); }
void uct_xsrc_rc_ep_cancel(Ep *ep)
{
	ep->cancelled = true;
	ep_fail(ep->iface, ep, UCS_ERR_CANCELED, false);
}

unsigned uct_xsrc_rc_iface_progress(uct_iface_h h)
{
	Iface *i = iface_of(h);
	unsigned count = 0;
	++i->progress_depth;
	if (!i->stash.empty()) {
		std::vector<ibv_wc> s;
		s.swap(i->stash);
		for (const ibv_wc &wc : s)
			handle_wc(i, wc, wc.opcode & IBV_WC_RECV);
		count += static_cast<unsigned>(s.size());
	}
	ibv_wc wcs[16];
	for (int dir = 1; dir >= 0; --dir) {
		int n = ibv_poll_cq(i->cq[dir], 16, wcs);
		for (int k = 0; k < n; ++k)
			handle_wc(i, wcs[k], dir == 1);
		if (n > 0)
			count += static_cast<unsigned>(n);
	}
	for (size_t k = 0; k < i->eps.size(); ++k) {
		Ep *ep = i->eps[k];
		if (ep->state != EpState::connected)
			continue;
		if (ep->grant_wanted)
			i->rops->fc_ctrl(i, ep);
		if (!ep->pending.empty())
			uct_xsrc_rc_ep_pending_dispatch(ep);
	}
	// Reading the connection socket is a system call: on every 16th progress
	// call only (and whenever messages read earlier wait), not on the hot path.
	if (!i->conn_deferred.empty() || (i->conn_tick++ & 15) == 0)
		count += uct_xsrc_rc_iface_conn_progress(i);
	if (i->cfg.xrc)
		count += uct_xsrc_rc_xrc_progress(i);
	count += tag_iface_progress(i);
	count += cm_iface_progress(i);
	--i->progress_depth;
	return count;
}

namespace {

// The worker's callback; it may still be called once after removal (UCX removes "safely").
unsigned progress_cb(void *arg)
{
	auto h = static_cast<uct_iface_h>(arg);
	return iface_of(h)->base.progress_flags ? uct_xsrc_rc_iface_progress(h) : 0;
}

void iface_progress_enable(uct_iface_h h, unsigned flags)
{
	Iface *i = iface_of(h);
	flags &= UCT_PROGRESS_SEND | UCT_PROGRESS_RECV;
	if (!flags)
		return;
	i->base.progress_flags |= flags;
	if (!i->progress_registered && i->worker) {
		uct_worker_progress_register_safe(i->worker, progress_cb, h, UCS_CALLBACKQ_FLAG_FAST, &i->base.prog.id);
		i->progress_registered = true;
	}
}

void iface_progress_disable(uct_iface_h h, unsigned flags)
{
	Iface *i = iface_of(h);
	i->base.progress_flags &= ~(flags & (UCT_PROGRESS_SEND | UCT_PROGRESS_RECV));
	if (i->progress_registered && !i->base.progress_flags) {
		uct_worker_progress_unregister_safe(i->worker, &i->base.prog.id);
		i->progress_registered = false;
	}
}

ucs_status_t iface_flush(uct_iface_h h, unsigned flags, uct_completion_t *comp)
{
	if (comp)
		return UCS_ERR_UNSUPPORTED;  // as in UCX 1.13: must be NULL
	Iface *i = iface_of(h);
	ucs_status_t result = UCS_OK;
	for (Ep *ep : i->eps) {
		ucs_status_t st = uct_xsrc_rc_ep_flush(to_uct(ep), flags, nullptr);
		if (st == UCS_ERR_NO_RESOURCE)
			return st;
		if (st == UCS_INPROGRESS)
			result = UCS_INPROGRESS;
	}
	return result;
}

ucs_status_t iface_fence(uct_iface_h h, unsigned flags)
{
	for (Ep *ep : iface_of(h)->eps)
		uct_xsrc_rc_ep_fence(to_uct(ep), flags);
	return UCS_OK;
}

ucs_status_t iface_event_fd_get(uct_iface_h h, int *fd_p)
{
	if (!fd_p)
		return UCS_ERR_INVALID_PARAM;
	*fd_p = iface_of(h)->epfd;
	return UCS_OK;
}

// Arms the CQs; UCS_ERR_BUSY when something is already waiting (completions, receives to
// hand out, pending requests that credits may now let through), as UCX's IB transports do.
ucs_status_t iface_event_arm(uct_iface_h h, unsigned events)
{
	Iface *i = iface_of(h);
	uct_xsrc_verbs_iface_drain_events(i);
	if (!i->stash.empty() || !i->conn_deferred.empty())
		return UCS_ERR_BUSY;  // (connection messages already read raise no event)
	for (Ep *ep : i->eps)
		if (!ep->pending.empty() || ep->grant_wanted)
			return UCS_ERR_BUSY;
	bool tx = events & UCT_EVENT_SEND_COMP;
	bool rx = events & (UCT_EVENT_RECV | UCT_EVENT_RECV_SIG);
	if (tx) {
		ucs_status_t st = i->vops->arm_cq(i, CqDir::tx, 0);
		if (st != UCS_OK)
			return st;
	}
	if (rx) {
		ucs_status_t st = i->vops->arm_cq(i, CqDir::rx, (events & UCT_EVENT_RECV) ? 0 : 1);
		if (st != UCS_OK)
			return st;
	}
	// Completions that arrived before the arm raise no event: keep them for progress.
	ibv_wc wcs[16];
	for (int dir = 0; dir < 2; ++dir) {
		int n;
		while ((n = ibv_poll_cq(i->cq[dir], 16, wcs)) > 0)
			for (int k = 0; k < n; ++k) {
				ibv_wc wc = wcs[k];
				if (dir == 1)
					wc.opcode = static_cast<ibv_wc_opcode>(wc.opcode | IBV_WC_RECV);
				else
					wc.opcode = static_cast<ibv_wc_opcode>(wc.opcode & ~IBV_WC_RECV);
				i->stash.push_back(wc);
			}
	}
	if (!i->stash.empty())
		return UCS_ERR_BUSY;
	// A completion event after the arm, or a watched fd with something to read.
	epoll_event ev[4];
	return epoll_wait(i->epfd, ev, 4, 0) > 0 ? UCS_ERR_BUSY : UCS_OK;
}

void iface_close(uct_iface_h h);

ucs_status_t iface_query(uct_iface_h h, uct_iface_attr_t *attr);

struct DevAddr {
	uint8_t gid[16];
	uint16_t lid;
} __attribute__((packed));

ucs_status_t iface_get_device_address(uct_iface_h h, uct_device_addr_t *addr)
{
	Iface *i = iface_of(h);
	if (!addr)
		return UCS_ERR_INVALID_PARAM;
	DevAddr d{};
	memcpy(d.gid, i->gid.raw, 16);
	d.lid = i->port_attr.lid;
	memcpy(addr, &d, sizeof(d));
	return UCS_OK;
}

ucs_status_t iface_get_address(uct_iface_h h, uct_iface_addr_t *addr) { return uct_xsrc_rc_iface_conn_get_address(iface_of(h), addr); }

// Same link layer: on RoCE any GID is routable (same host for xsrc); on IB the subnet
// prefix must match.
int iface_is_reachable(uct_iface_h h, const uct_device_addr_t *dev_addr, const uct_iface_addr_t *iface_addr)
{
	Iface *i = iface_of(h);
	if (!dev_addr || (iface_addr && !uct_xsrc_rc_iface_conn_addr_valid(iface_addr)))
		return 0;
	DevAddr d;
	memcpy(&d, dev_addr, sizeof(d));
	if (i->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET)
		return 1;
	return memcmp(d.gid, i->gid.raw, 8) == 0 && d.lid != 0;
}

}  // namespace

size_t uct_xsrc_rc_iface_dev_addr_len() { return sizeof(DevAddr); }
ucs_status_t uct_xsrc_rc_iface_dev_addr_unpack(const uct_device_addr_t *a, ibv_gid *gid, uint16_t *lid)
{
	DevAddr d;
	memcpy(&d, a, sizeof(d));
	memcpy(gid->raw, d.gid, 16);
	*lid = d.lid;
	return UCS_OK;
}

const uct_iface_ops_t uct_xsrc_rc_iface_tl_ops = {
	.ep_put_short = uct_xsrc_rc_ep_put_short,
	.ep_put_bcopy = uct_xsrc_rc_ep_put_bcopy,
	.ep_put_zcopy = uct_xsrc_rc_ep_put_zcopy,
	.ep_get_short = uct_xsrc_rc_ep_get_short,
	.ep_get_bcopy = uct_xsrc_rc_ep_get_bcopy,
	.ep_get_zcopy = uct_xsrc_rc_ep_get_zcopy,
	.ep_am_short = uct_xsrc_rc_ep_am_short,
	.ep_am_short_iov = uct_xsrc_rc_ep_am_short_iov,
	.ep_am_bcopy = uct_xsrc_rc_ep_am_bcopy,
	.ep_am_zcopy = uct_xsrc_rc_ep_am_zcopy,
	.ep_atomic_cswap64 = uct_xsrc_rc_ep_atomic_cswap64,
	.ep_atomic_cswap32 = uct_xsrc_rc_ep_atomic_cswap32,
	.ep_atomic32_post = uct_xsrc_rc_ep_atomic32_post,
	.ep_atomic64_post = uct_xsrc_rc_ep_atomic64_post,
	.ep_atomic32_fetch = uct_xsrc_rc_ep_atomic32_fetch,
	.ep_atomic64_fetch = uct_xsrc_rc_ep_atomic64_fetch,
	.ep_tag_eager_short = tag_ep_eager_short,
	.ep_tag_eager_bcopy = tag_ep_eager_bcopy,
	.ep_tag_eager_zcopy = tag_ep_eager_zcopy,
	.ep_tag_rndv_zcopy = tag_ep_rndv_zcopy,
	.ep_tag_rndv_cancel = tag_ep_rndv_cancel,
	.ep_tag_rndv_request = tag_ep_rndv_request,
	.iface_tag_recv_zcopy = tag_iface_recv_zcopy,
	.iface_tag_recv_cancel = tag_iface_recv_cancel,
	.ep_pending_add = uct_xsrc_rc_ep_pending_add,
	.ep_pending_purge = uct_xsrc_rc_ep_pending_purge,
	.ep_flush = uct_xsrc_rc_ep_flush,
	.ep_fence = uct_xsrc_rc_ep_fence,
	.ep_check = uct_xsrc_rc_ep_check,
	.ep_create = uct_xsrc_rc_ep_create,
	.ep_connect = cm_ep_connect,
	.ep_disconnect = cm_ep_disconnect,
	.cm_ep_conn_notify = cm_ep_conn_notify,
	.ep_destroy = uct_xsrc_rc_ep_destroy,
	.ep_get_address = uct_xsrc_rc_ep_get_address,
	.ep_connect_to_ep = uct_xsrc_rc_ep_connect_to_ep,
	.iface_accept = cm_iface_accept,
	.iface_reject = cm_iface_reject,
	.iface_flush = iface_flush,
	.iface_fence = iface_fence,
	.iface_progress_enable = iface_progress_enable,
	.iface_progress_disable = iface_progress_disable,
	.iface_progress = uct_xsrc_rc_iface_progress,
	.iface_event_fd_get = iface_event_fd_get,
	.iface_event_arm = iface_event_arm,
	.iface_close = iface_close,
	.iface_query = iface_query,
	.iface_get_device_address = iface_get_device_address,
	.iface_get_address = iface_get_address,
	.iface_is_reachable = iface_is_reachable,
};

namespace {

const UcxIfaceInternalOps internal_ops = {
	.iface_estimate_perf = uct_base_iface_estimate_perf,
	.iface_vfs_refresh = [](uct_iface_h) {},
	.ep_query = [](uct_ep_h, uct_ep_attr_t *) { return UCS_ERR_UNSUPPORTED; },
	.ep_invalidate = [](uct_ep_h, unsigned) { return UCS_ERR_UNSUPPORTED; },
};

void free_iface(Iface *i)
{
	uct_xsrc_rc_xrc_iface_cleanup(i);  // (says bye through the socket: before closing it)
	uct_xsrc_rc_iface_conn_close(i);
	if (i->srq)
		ibv_destroy_srq(i->srq);
	for (RxPool *chunk : i->srq_chunks)
		pool_free(chunk);  // a descriptor still held by the user dies with the iface
	i->srq_chunks.clear();
	if (i->srq_mr)
		ibv_dereg_mr(i->srq_mr);
	if (i->srq_mem)
		munmap(i->srq_mem, i->srq_mem_len);
	if (i->credit_mr)
		ibv_dereg_mr(i->credit_mr);
	if (i->credit_mem)
		munmap(i->credit_mem, static_cast<size_t>(i->cfg.max_eps) * 64);
	if (i->xrcd)
		ibv_close_xrcd(i->xrcd);
	if (i->epfd >= 0)
		close(i->epfd);
	if (i->tx_mr)
		ibv_dereg_mr(i->tx_mr);
	if (i->tx_mem)
		munmap(i->tx_mem, static_cast<size_t>(i->cfg.tx_bufs) * i->cfg.seg_size);
	if (i->atomic_mr)
		ibv_dereg_mr(i->atomic_mr);
	free(i->atomic_words);
	uct_xsrc_verbs_iface_cleanup(i);
	delete i;
}

void iface_close(uct_iface_h h)
{
	Iface *i = iface_of(h);
	tag_iface_cleanup(i);
	cm_iface_cleanup(i);
	if (i->progress_registered)
		uct_worker_progress_unregister_safe(i->worker, &i->base.prog.id);
	i->progress_registered = false;
	while (!i->eps.empty())
		uct_xsrc_rc_ep_destroy(to_uct(i->eps.back()));
	free_iface(i);
}

ucs_status_t iface_query(uct_iface_h h, uct_iface_attr_t *attr)
{
	Iface *i = iface_of(h);
	if (!attr)
		return UCS_ERR_INVALID_PARAM;
	memset(attr, 0, sizeof(*attr));
	size_t seg = i->cfg.seg_size;
	size_t payload = seg - sizeof(WireHdr);
	size_t max_short = std::min(i->cfg.max_short, payload);
	unsigned sge = i->max_sge;

	attr->cap.put.max_short = max_short;
	attr->cap.put.max_bcopy = seg;
	attr->cap.put.min_zcopy = 0;
	attr->cap.put.max_zcopy = i->max_msg;
	attr->cap.put.opt_zcopy_align = 8;
	attr->cap.put.align_mtu = 4096;
	attr->cap.put.max_iov = sge;

	attr->cap.get.max_short = max_short;
	attr->cap.get.max_bcopy = seg;
	attr->cap.get.min_zcopy = 0;
	attr->cap.get.max_zcopy = i->max_msg;
	attr->cap.get.opt_zcopy_align = 8;
	attr->cap.get.align_mtu = 4096;
	attr->cap.get.max_iov = sge;

	attr->cap.am.max_short = max_short;
	attr->cap.am.max_bcopy = payload;
	attr->cap.am.min_zcopy = 0;
	attr->cap.am.max_zcopy = payload;
	attr->cap.am.opt_zcopy_align = 8;
	attr->cap.am.align_mtu = 4096;
	attr->cap.am.max_hdr = std::min<size_t>(128, payload);
	attr->cap.am.max_iov = sge > 1 ? sge - 1 : 1;

	const uint64_t post_ops = UCS_BIT(UCT_ATOMIC_OP_ADD) | UCS_BIT(UCT_ATOMIC_OP_AND) | UCS_BIT(UCT_ATOMIC_OP_OR) |
				  UCS_BIT(UCT_ATOMIC_OP_XOR);
	const uint64_t fetch_ops = post_ops | UCS_BIT(UCT_ATOMIC_OP_SWAP) | UCS_BIT(UCT_ATOMIC_OP_CSWAP);
	bool atomics = i->md->dev_attr.atomic_cap != IBV_ATOMIC_NONE;
	if (atomics) {
		attr->cap.atomic32.op_flags = attr->cap.atomic64.op_flags = post_ops;
		attr->cap.atomic32.fop_flags = attr->cap.atomic64.fop_flags = fetch_ops;
	}

	attr->cap.flags = UCT_IFACE_FLAG_AM_SHORT | UCT_IFACE_FLAG_AM_BCOPY | UCT_IFACE_FLAG_AM_ZCOPY |
			  UCT_IFACE_FLAG_PUT_SHORT | UCT_IFACE_FLAG_PUT_BCOPY | UCT_IFACE_FLAG_PUT_ZCOPY |
			  UCT_IFACE_FLAG_GET_SHORT | UCT_IFACE_FLAG_GET_BCOPY | UCT_IFACE_FLAG_GET_ZCOPY |
			  UCT_IFACE_FLAG_PENDING | UCT_IFACE_FLAG_CONNECT_TO_EP | UCT_IFACE_FLAG_CONNECT_TO_IFACE |
			  UCT_IFACE_FLAG_CB_SYNC |
			  UCT_IFACE_FLAG_EVENT_SEND_COMP | UCT_IFACE_FLAG_EVENT_RECV | UCT_IFACE_FLAG_EVENT_FD |
			  UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE | UCT_IFACE_FLAG_EP_CHECK;
	if (atomics)
		attr->cap.flags |= UCT_IFACE_FLAG_ATOMIC_CPU | UCT_IFACE_FLAG_ATOMIC_DEVICE;
	attr->cap.event_flags = UCT_IFACE_FLAG_EVENT_SEND_COMP | UCT_IFACE_FLAG_EVENT_RECV | UCT_IFACE_FLAG_EVENT_FD;

	attr->device_addr_len = sizeof(DevAddr);
	attr->iface_addr_len = uct_xsrc_rc_iface_addr_len();
	attr->ep_addr_len = uct_xsrc_rc_ep_addr_len();
	attr->max_conn_priv = 0;
	// Measured on xsrc0 (README, bench/uct_bench): a send ~1 us, a process_vm_writev ~2.5 us.
	attr->overhead = 0.5e-6;
	attr->bandwidth.dedicated = 0;
	attr->bandwidth.shared = 5e9;
	attr->latency = ucs_linear_func_make(1.5e-6, 0);
	attr->priority = 0;
	attr->max_num_eps = i->cfg.max_eps;
	attr->dev_num_paths = 1;
	tag_iface_query(i, attr);  // after cap.get: the tag limits follow get_zcopy's
	cm_iface_query(i, attr);   // max_conn_priv, listen_sockaddr, CONNECT_TO_SOCKADDR
	return UCS_OK;
}

}  // namespace

ucs_status_t uct_xsrc_rc_iface_open(Md *md, uct_worker_h worker, const uct_iface_params_t *params, const IfaceConfig &cfg,
			   uct_iface_h *iface_p)
{
	if (!md || !params || !iface_p)
		return UCS_ERR_INVALID_PARAM;
	uint64_t fm = params->field_mask;
	const char *dev_name = nullptr;
	bool device_mode = true;
	if (fm & UCT_IFACE_PARAM_FIELD_OPEN_MODE) {
		if (params->open_mode & UCT_IFACE_OPEN_MODE_DEVICE) {
			if (params->mode.device.tl_name && strcmp(params->mode.device.tl_name, XSRC_UCT_TL_NAME) != 0)
				return UCS_ERR_NO_DEVICE;
			dev_name = params->mode.device.dev_name;
		} else if (params->open_mode &
			   (UCT_IFACE_OPEN_MODE_SOCKADDR_SERVER | UCT_IFACE_OPEN_MODE_SOCKADDR_CLIENT)) {
			device_mode = false;
		} else {
			return UCS_ERR_INVALID_PARAM;
		}
	}
	(void)device_mode;
	auto *i = new (std::nothrow) Iface();
	if (!i)
		return UCS_ERR_NO_MEMORY;
	if (static_cast<void *>(&i->base) != static_cast<void *>(i)) {
		delete i;  // libuct reads our iface as a uct_base_iface_t: it must start the object
		return UCS_ERR_UNSUPPORTED;
	}
	i->cfg = cfg;
	i->rops = &uct_xsrc_rc_iface_default_ops;
	unsigned tx_slots = cfg.tx_ops;
	// Completions of destroyed eps' work may still sit in a CQ: twice the live maximum.
	unsigned tx_cqe = 2 * tx_slots + 16;
	unsigned rx_cqe = 2 * cfg.rx_queue_len * cfg.max_eps + 16;
	unsigned max_cqe = static_cast<unsigned>(md->dev_attr.max_cqe);
	if (max_cqe && (tx_cqe > max_cqe || rx_cqe > max_cqe)) {
		delete i;
		return UCS_ERR_EXCEEDS_LIMIT;
	}
	ucs_status_t st = uct_xsrc_verbs_iface_init(i, &uct_xsrc_rc_iface_verbs_ops, md, worker, params, dev_name, tx_cqe, rx_cqe);
	if (st != UCS_OK) {
		delete i;
		return st;
	}
	// The UCX base part.
	i->base.super.ops = uct_xsrc_rc_iface_tl_ops;
	i->base.internal_ops = &internal_ops;
	i->base.md = md_handle(md);  // libuct (uct_iface_mem_alloc) sees a UCX md
	i->base.worker = worker;
	for (auto &h : i->base.am)
		h = {am_stub, nullptr, UCT_CB_FLAG_ASYNC};
	if (fm & UCT_IFACE_PARAM_FIELD_ERR_HANDLER)
		i->base.err_handler = params->err_handler;
	if (fm & UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG)
		i->base.err_handler_arg = params->err_handler_arg;
	if (fm & UCT_IFACE_PARAM_FIELD_ERR_HANDLER_FLAGS)
		i->base.err_handler_flags = params->err_handler_flags;
	i->base.prog.id = UCS_CALLBACKQ_ID_NULL;
	i->base.config.max_num_eps = cfg.max_eps;
	i->max_sge = std::max(1, std::min(md->dev_attr.max_sge, 8));
	if (md->dev_attr.max_mr_size)
		i->max_msg = std::min<size_t>(i->max_msg, md->dev_attr.max_mr_size);

	i->ops.resize(tx_slots);
	for (unsigned k = tx_slots; k-- > 0;)
		i->free_ops.push_back(k);
	i->atomic_words = static_cast<uint64_t *>(aligned_alloc(64, ((tx_slots * 8 + 63) / 64) * 64));
	size_t tx_len = static_cast<size_t>(cfg.tx_bufs) * cfg.seg_size;
	void *tx = mmap(nullptr, tx_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!i->atomic_words || tx == MAP_FAILED) {
		if (tx != MAP_FAILED)
			munmap(tx, tx_len);
		free_iface(i);
		return UCS_ERR_NO_MEMORY;
	}
	memset(i->atomic_words, 0, tx_slots * 8);
	i->tx_mem = static_cast<char *>(tx);
	i->atomic_mr = ibv_reg_mr(md->pd, i->atomic_words, tx_slots * 8, IBV_ACCESS_LOCAL_WRITE);
	i->tx_mr = ibv_reg_mr(md->pd, i->tx_mem, tx_len, IBV_ACCESS_LOCAL_WRITE);
	if (!i->atomic_mr || !i->tx_mr) {
		st = uct_xsrc_md_errno_status(errno);
		free_iface(i);
		return st;
	}
	for (unsigned k = cfg.tx_bufs; k-- > 0;)
		i->free_bufs.push_back(k);
	if (cfg.xrc) {
		// Every ep's receive chunk and credit slot, registered once (reserved, not committed:
		// chunks are touched as eps come).
		i->srq_mem_len = static_cast<size_t>(cfg.max_eps) * srq_chunk_len(i);
		if (i->srq_mem_len > (size_t{1} << 36)) {
			free_iface(i);
			return UCS_ERR_EXCEEDS_LIMIT;
		}
		void *rxm = mmap(nullptr, i->srq_mem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
				 -1, 0);
		void *cm = mmap(nullptr, static_cast<size_t>(cfg.max_eps) * 64, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		i->srq_mem = rxm == MAP_FAILED ? nullptr : static_cast<char *>(rxm);
		i->credit_mem = cm == MAP_FAILED ? nullptr : static_cast<char *>(cm);
		if (!i->srq_mem || !i->credit_mem) {
			free_iface(i);
			return UCS_ERR_NO_MEMORY;
		}
		i->srq_mr = ibv_reg_mr(md->pd, i->srq_mem, i->srq_mem_len, IBV_ACCESS_LOCAL_WRITE);
		i->credit_mr = ibv_reg_mr(md->pd, i->credit_mem, static_cast<size_t>(cfg.max_eps) * 64,
					  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!i->srq_mr || !i->credit_mr) {
			st = uct_xsrc_md_errno_status(errno);
			free_iface(i);
			return st;
		}
		for (unsigned k = cfg.max_eps; k-- > 0;)
			i->free_credit_slots.push_back(k);
		ibv_xrcd_init_attr xa{};
		xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
		xa.fd = -1;
		xa.oflags = O_CREAT;
		i->xrcd = ibv_open_xrcd(md->ctx, &xa);
		ibv_srq_init_attr_ex sa{};
		sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
		sa.srq_type = IBV_SRQT_XRC;
		sa.pd = md->pd;
		sa.xrcd = i->xrcd;
		sa.cq = i->cq[1];
		sa.attr.max_wr = cfg.rx_queue_len * cfg.max_eps;
		sa.attr.max_sge = 1;
		if (i->xrcd)
			i->srq = ibv_create_srq_ex(md->ctx, &sa);
		if (!i->xrcd || !i->srq) {
			st = uct_xsrc_md_errno_status(errno);
			free_iface(i);
			return st;
		}
	}
	i->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (i->epfd < 0 || iface_watch_fd(i, i->channel->fd, true) != UCS_OK) {
		free_iface(i);
		return UCS_ERR_IO_ERROR;
	}
	st = uct_xsrc_rc_iface_conn_open(i);
	if (st != UCS_OK) {
		free_iface(i);
		return st;
	}

	st = tag_iface_init(i, params);
	if (st == UCS_OK)
		st = cm_iface_init(i, params);
	if (st != UCS_OK) {
		tag_iface_cleanup(i);
		free_iface(i);
		return st;
	}
	*iface_p = to_uct(i);
	return UCS_OK;
}

}  // namespace xsrc::uct

using namespace xsrc::uct;

extern "C" ucs_status_t xsrc_uct_iface_open(uct_md_h md, uct_worker_h worker, const uct_iface_params_t *params,
					    const uct_iface_config_t *config, uct_iface_h *iface_p)
{
	IfaceConfig cfg;
	unsigned transport = XSRC_UCT_TRANSPORT_AUTO;
	if (config) {
		auto *c = reinterpret_cast<const xsrc_uct_iface_config_t *>(config);
		if (c->magic != XSRC_UCT_IFACE_CONFIG_MAGIC)
			return UCS_ERR_INVALID_PARAM;
		if (c->rx_queue_len)
			cfg.rx_queue_len = c->rx_queue_len;
		if (c->sq_len)
			cfg.sq_len = c->sq_len;
		if (c->tx_bufs)
			cfg.tx_bufs = c->tx_bufs;
		if (c->seg_size)
			cfg.seg_size = c->seg_size;
		if (c->max_eps)
			cfg.max_eps = c->max_eps;
		transport = c->transport;
		if (transport > XSRC_UCT_TRANSPORT_XRC)
			return UCS_ERR_INVALID_PARAM;
		if (cfg.seg_size < 256 || cfg.seg_size > (1u << 20) || cfg.rx_queue_len > 4096 || cfg.sq_len > 4096 ||
		    cfg.max_eps > 4096 || cfg.tx_bufs > 65536)
			return UCS_ERR_INVALID_PARAM;
		cfg.seg_size &= ~size_t{7};
	}
	Md *xmd = to_md(md);
	if (!xmd)
		return UCS_ERR_INVALID_PARAM;  // no md, or not one of ours
	// XRC where the device offers it (the default), RC otherwise or when asked.
	bool has_xrc = xmd->dev_attr.device_cap_flags & IBV_DEVICE_XRC;
	if (transport == XSRC_UCT_TRANSPORT_XRC && !has_xrc)
		return UCS_ERR_UNSUPPORTED;
	cfg.xrc = transport == XSRC_UCT_TRANSPORT_XRC || (transport == XSRC_UCT_TRANSPORT_AUTO && has_xrc);
	if (const char *env = getenv("XSRC_UCT_TRANSPORT")) {  // test and debugging override of AUTO
		if (transport == XSRC_UCT_TRANSPORT_AUTO && strcmp(env, "rc") == 0)
			cfg.xrc = false;
	}
	return uct_xsrc_rc_iface_open(xmd, worker, params, cfg, iface_p);
}

extern "C" unsigned xsrc_uct_iface_transport(uct_iface_h h)
{
	if (!h || h->ops.iface_close != uct_xsrc_rc_iface_tl_ops.iface_close)
		return 0;
	return iface_of(h)->cfg.xrc ? XSRC_UCT_TRANSPORT_XRC : XSRC_UCT_TRANSPORT_RC;
}
