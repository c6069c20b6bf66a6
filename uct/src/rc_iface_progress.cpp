// The RC/XRC interface's progress: work completions (sends, receives, failures), the worker's
// progress callback, completion events (event fd, event arm), and iface-wide flush and fence.
#include "rc_iface.h"

#include "modules.h"

#include <cerrno>
#include <cstring>
#include <sys/epoll.h>

namespace xsrc::uct {

namespace {

// Work completions taken from a CQ at a time.
constexpr int cq_poll_batch = 16;
// Reading the connection socket is a system call: progress reads it on one call in this many
// (and whenever messages read earlier wait), not on the hot path. A power of two.
constexpr unsigned conn_poll_every = 16;
static_assert((conn_poll_every & (conn_poll_every - 1)) == 0);

void uct_xsrc_rc_iface_ep_fail(Iface *i, Ep *ep, ucs_status_t status, bool notify);

void uct_xsrc_rc_iface_handle_tx_wc(Iface *i, const ibv_wc &wc)
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
			uct_xsrc_rc_iface_ep_fail(i, ep, st, true);
	}
	uct_xsrc_rc_ep_tx_done(i, op, wc);
}

// XRC: every receive is a shared-queue descriptor; the TGT QP names the remote iface and the
// WireHdr the remote ep. One for an ep that is gone goes back to the queue.
void uct_xsrc_rc_iface_handle_xrc_rx_wc(Iface *i, const ibv_wc &wc)
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

void uct_xsrc_rc_iface_handle_rx_wc(Iface *i, const ibv_wc &wc)
{
	if (i->cfg.xrc)
		return uct_xsrc_rc_iface_handle_xrc_rx_wc(i, wc);
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
			uct_xsrc_rc_iface_ep_fail(i, ep, uct_xsrc_verbs_wc_status(wc.status), true);
		return;
	}
	uct_xsrc_rc_ep_rx(i, ep, d, wc.byte_len);
}

void uct_xsrc_rc_iface_handle_wc(Iface *i, const ibv_wc &wc, bool rx)
{
	rx ? uct_xsrc_rc_iface_handle_rx_wc(i, wc) : uct_xsrc_rc_iface_handle_tx_wc(i, wc);
}

// The ep goes to error: its RC QP is moved to the error state so outstanding work completes
// (flushed) with the failure status (an XRC ep's shared QP serves others: its outstanding work
// completes as it does, reported with the ep's status), the tag module fails its rendezvous
// operations and the user's error handler hears of it.
void uct_xsrc_rc_iface_ep_fail(Iface *i, Ep *ep, ucs_status_t status, bool notify)
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
	uct_xsrc_tag_ep_failed(i, ep, status);
	if (notify && i->base.err_handler)
		i->base.err_handler(i->base.err_handler_arg, to_uct(ep), status);
}

ucs_status_t uct_xsrc_rc_iface_set_ep_failed(VerbsIface *, uct_ep_h, ucs_status_t) { return UCS_OK; }

// The worker's callback; it may still be called once after removal (UCX removes "safely").
unsigned uct_xsrc_rc_iface_progress_cb(void *arg)
{
	auto h = static_cast<uct_iface_h>(arg);
	return iface_of(h)->base.progress_flags ? uct_xsrc_rc_iface_progress(h) : 0;
}

}  // namespace

const VerbsIfaceOps uct_xsrc_rc_iface_verbs_ops = [] {
	VerbsIfaceOps o = uct_xsrc_verbs_iface_default_ops;
	o.set_ep_failed = uct_xsrc_rc_iface_set_ep_failed;
	return o;
}();

void ep_set_failed(Ep *ep, ucs_status_t status) { uct_xsrc_rc_iface_ep_fail(ep->iface, ep, status, true); }
void uct_xsrc_rc_ep_fail_one(Ep *ep, ucs_status_t status, bool notify)
{
	uct_xsrc_rc_iface_ep_fail(ep->iface, ep, status, notify);
}
void uct_xsrc_rc_ep_cancel(Ep *ep)
{
	ep->cancelled = true;
	uct_xsrc_rc_iface_ep_fail(ep->iface, ep, UCS_ERR_CANCELED, false);
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
			uct_xsrc_rc_iface_handle_wc(i, wc, wc.opcode & IBV_WC_RECV);
		count += static_cast<unsigned>(s.size());
	}
	ibv_wc wcs[cq_poll_batch];
	for (int dir = 1; dir >= 0; --dir) {
		int n = ibv_poll_cq(i->cq[dir], cq_poll_batch, wcs);
		for (int k = 0; k < n; ++k)
			uct_xsrc_rc_iface_handle_wc(i, wcs[k], dir == 1);
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
	if (!i->conn_deferred.empty() || (i->conn_tick++ & (conn_poll_every - 1)) == 0)
		count += uct_xsrc_rc_iface_conn_progress(i);
	if (i->cfg.xrc)
		count += uct_xsrc_rc_xrc_progress(i);
	count += uct_xsrc_tag_iface_progress(i);
	count += uct_xsrc_cm_iface_progress(i);
	--i->progress_depth;
	return count;
}

void uct_xsrc_rc_iface_progress_enable(uct_iface_h h, unsigned flags)
{
	Iface *i = iface_of(h);
	flags &= UCT_PROGRESS_SEND | UCT_PROGRESS_RECV;
	if (!flags)
		return;
	i->base.progress_flags |= flags;
	if (!i->progress_registered && i->worker) {
		uct_worker_progress_register_safe(i->worker, uct_xsrc_rc_iface_progress_cb, h, UCS_CALLBACKQ_FLAG_FAST,
						  &i->base.prog.id);
		i->progress_registered = true;
	}
}

void uct_xsrc_rc_iface_progress_disable(uct_iface_h h, unsigned flags)
{
	Iface *i = iface_of(h);
	i->base.progress_flags &= ~(flags & (UCT_PROGRESS_SEND | UCT_PROGRESS_RECV));
	if (i->progress_registered && !i->base.progress_flags) {
		uct_worker_progress_unregister_safe(i->worker, &i->base.prog.id);
		i->progress_registered = false;
	}
}

ucs_status_t uct_xsrc_rc_iface_flush(uct_iface_h h, unsigned flags, uct_completion_t *comp)
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

ucs_status_t uct_xsrc_rc_iface_fence(uct_iface_h h, unsigned flags)
{
	for (Ep *ep : iface_of(h)->eps)
		uct_xsrc_rc_ep_fence(to_uct(ep), flags);
	return UCS_OK;
}

ucs_status_t uct_xsrc_rc_iface_event_fd_get(uct_iface_h h, int *fd_p)
{
	if (!fd_p)
		return UCS_ERR_INVALID_PARAM;
	*fd_p = iface_of(h)->epfd.get();
	return UCS_OK;
}

// Arms the CQs; UCS_ERR_BUSY when something is already waiting (completions, receives to
// hand out, pending requests that credits may now let through), as UCX's IB transports do.
ucs_status_t uct_xsrc_rc_iface_event_arm(uct_iface_h h, unsigned events)
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
	ibv_wc wcs[cq_poll_batch];
	for (int dir = 0; dir < 2; ++dir) {
		int n;
		while ((n = ibv_poll_cq(i->cq[dir], cq_poll_batch, wcs)) > 0)
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
	epoll_event ev[1];
	return epoll_wait(i->epfd.get(), ev, 1, 0) > 0 ? UCS_ERR_BUSY : UCS_OK;
}

}  // namespace xsrc::uct
