// XRC connection scaling. Every ep of an iface connected to the same remote iface sends
// through one XRC send (INI) QP; the remote iface receives from that QP through one receive
// (TGT) QP which it creates when asked, and every TGT QP feeds the iface's one shared
// receive queue. The per-ep identity travels in the WireHdr (src_ep_id), so a receive is
// routed by (TGT QP -> remote iface, src_ep_id) to the local ep. With N eps between two
// ifaces each side has 1 INI + 1 TGT QP instead of N RC QPs.
//
// Set-up: the first ep towards a remote iface creates the INI QP and sends the remote iface
// a request (rc_iface_conn.cpp's socket) naming it; the remote creates, connects and names a
// TGT QP in its reply, and the INI QP is connected. Until then the ep answers
// UCS_ERR_NO_RESOURCE (ep_pending_add queues, ep_flush too); connect_to_ep waits up to
// `connect_wait` for the reply, which covers both ends connecting at about the same time.
//
// Sharing, per ep: flow-control credits, flush and fence stay per ep (a fence fences the
// shared QP, a flush waits for the ep's own operations, which complete in QP order after
// every earlier operation of the other eps: correct, if conservative). A failed completion
// fails the shared QP and every ep on it (each one's error handler is called); failing or
// cancelling one ep alone (ep_set_failed, flush CANCEL) leaves the QP to the others, and the
// ep's outstanding work then completes with the ep's status. The last ep to go closes the
// INI QP (outstanding work is flushed first) and tells the remote iface, which destroys its
// TGT QP. Receive QPs of a remote iface that went without saying so (its process died) are
// found within a second by progress (its socket name is free) and destroyed.
#include "rc_iface.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <sched.h>

namespace xsrc::uct {

namespace {

constexpr auto connect_wait = std::chrono::milliseconds(100);
constexpr uint64_t request_retry_ns = 1000000000;  // a lost or unanswered request is sent again
constexpr uint64_t reap_ns = 1000000000;           // how often receive QPs of vanished ifaces are looked for

uint64_t uct_xsrc_rc_xrc_now_ns()
{
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

XrcIni *uct_xsrc_rc_xrc_current_ini(Iface *i, const XrcKey &k)
{
	for (XrcIni *x : i->inis)
		if (x->key == k && (x->state == XrcState::requesting || x->state == XrcState::connected))
			return x;
	return nullptr;
}

XrcIni *uct_xsrc_rc_xrc_ini_by_qpn(Iface *i, const XrcKey &k, uint32_t qpn)
{
	for (XrcIni *x : i->inis)
		if (x->key == k && x->qp->qp_num == qpn)
			return x;
	return nullptr;
}

void uct_xsrc_rc_xrc_send_request(Iface *i, XrcIni *x)
{
	XrcMsg m{};
	m.type = XrcMsgType::request;
	m.ini = x->qp->qp_num;
	ucs_status_t st = uct_xsrc_rc_iface_conn_send_xrc(i, x->key, m);
	x->request_unsent = st == UCS_ERR_NO_RESOURCE;
	x->request_ns = uct_xsrc_rc_xrc_now_ns();
	if (st != UCS_OK && st != UCS_ERR_NO_RESOURCE)
		uct_xsrc_rc_xrc_ini_fail(i, x, UCS_ERR_UNREACHABLE);  // no such iface (any more)
}

void uct_xsrc_rc_xrc_ini_destroy(Iface *i, XrcIni *x)
{
	XrcMsg m{};
	m.type = XrcMsgType::bye;
	m.ini = x->qp->qp_num;
	uct_xsrc_rc_iface_conn_send_xrc(i, x->key, m);  // lost only if the remote iface is gone or flooded
	ibv_destroy_qp(x->qp);
	std::erase(i->inis, x);
	delete x;
}

// A send work request of `x` is done (its op slot already returned).
void uct_xsrc_rc_xrc_wr_done(Iface *i, XrcIni *x)
{
	++x->sq_avail;
	if (x->eps == 0 && x->sq_avail == i->cfg.sq_len)
		uct_xsrc_rc_xrc_ini_destroy(i, x);
}

void uct_xsrc_rc_xrc_tgt_destroy(Iface *i, XrcTgt *t)
{
	ibv_destroy_qp(t->qp);
	std::erase(i->tgts, t);
	delete t;
}

// Destroys the receive QPs of remote ifaces whose socket nobody has any more (closed without
// saying bye, or their process died).
void uct_xsrc_rc_xrc_reap_tgts(Iface *i)
{
	i->xrc_reap_ns = uct_xsrc_rc_xrc_now_ns();
	std::vector<XrcKey> gone;
	for (size_t k = 0; k < i->tgts.size(); ++k) {
		const XrcKey &key = i->tgts[k]->key;
		if (std::find(gone.begin(), gone.end(), key) == gone.end() && !uct_xsrc_rc_iface_conn_iface_alive(i, key))
			gone.push_back(key);
	}
	std::erase_if(i->tgts, [&](XrcTgt *t) {
		if (std::find(gone.begin(), gone.end(), t->key) == gone.end())
			return false;
		ibv_destroy_qp(t->qp);
		delete t;
		return true;
	});
}

// A remote iface needs one receive QP (two while it replaces its send QP): more than two per
// possible ep is refused.
size_t uct_xsrc_rc_xrc_tgt_limit(const Iface *i) { return 2 * static_cast<size_t>(i->cfg.max_eps); }

void uct_xsrc_rc_xrc_on_request(Iface *i, const XrcMsg &m)
{
	XrcMsg r{};
	r.type = XrcMsgType::reply;
	r.ini = m.ini;
	XrcTgt *found = nullptr;
	for (XrcTgt *t : i->tgts)
		if (t->key == m.from && t->remote_ini == m.ini)
			found = t;  // a repeated request: the same answer
	ucs_status_t st = UCS_OK;
	if (!found && i->tgts.size() >= uct_xsrc_rc_xrc_tgt_limit(i))
		uct_xsrc_rc_xrc_reap_tgts(i);
	if (!found && i->tgts.size() >= uct_xsrc_rc_xrc_tgt_limit(i)) {
		st = UCS_ERR_EXCEEDS_LIMIT;
	} else if (!found) {
		ibv_qp_init_attr_ex ta{};
		ta.qp_type = IBV_QPT_XRC_RECV;
		ta.comp_mask = IBV_QP_INIT_ATTR_XRCD;
		ta.xrcd = i->xrcd.get();
		ibv_qp *qp = ibv_create_qp_ex(i->md->ctx, &ta);
		st = qp ? uct_xsrc_verbs_qp_init(i, qp) : uct_xsrc_md_errno_status(errno);
		ibv_gid gid;
		std::copy(m.from.gid.begin(), m.from.gid.end(), gid.raw);
		if (st == UCS_OK)
			st = uct_xsrc_verbs_qp_connect(i, qp, m.ini, gid, m.lid, false);
		if (st == UCS_OK) {
			found = new XrcTgt{m.from, m.ini, qp};
			i->tgts.push_back(found);
		} else if (qp) {
			ibv_destroy_qp(qp);
		}
	}
	r.status = st;
	r.tgt = found ? found->qp->qp_num : 0;
	uct_xsrc_rc_iface_conn_send_xrc(i, m.from, r);  // lost: the requester asks again
}

void uct_xsrc_rc_xrc_on_reply(Iface *i, const XrcMsg &m)
{
	XrcIni *x = uct_xsrc_rc_xrc_ini_by_qpn(i, m.from, m.ini);
	if (!x || x->state != XrcState::requesting)
		return;  // a repeated answer, or the QP is gone
	ucs_status_t st = static_cast<ucs_status_t>(m.status);
	if (st == UCS_OK && m.tgt == 0)
		st = UCS_ERR_INVALID_PARAM;
	if (st == UCS_OK)
		st = uct_xsrc_verbs_qp_connect(i, x->qp, m.tgt, x->gid, x->lid);
	if (st != UCS_OK) {
		uct_xsrc_rc_xrc_ini_fail(i, x, st);
		return;
	}
	x->state = XrcState::connected;
	for (Ep *ep : i->eps)
		if (ep->ini == x && ep->state == EpState::idle)
			ep->state = EpState::connected;  // progress dispatches what they queued
}

void uct_xsrc_rc_xrc_on_bye(Iface *i, const XrcMsg &m)
{
	for (XrcTgt *t : i->tgts)
		if (t->key == m.from && t->remote_ini == m.ini) {
			uct_xsrc_rc_xrc_tgt_destroy(i, t);
			return;
		}
}

}  // namespace

void uct_xsrc_rc_xrc_on_msg(Iface *i, const XrcMsg &m)
{
	if (!i->cfg.xrc)
		return;
	switch (m.type) {
	case XrcMsgType::request: uct_xsrc_rc_xrc_on_request(i, m); break;
	case XrcMsgType::reply: uct_xsrc_rc_xrc_on_reply(i, m); break;
	case XrcMsgType::bye: uct_xsrc_rc_xrc_on_bye(i, m); break;
	}
}

ucs_status_t uct_xsrc_rc_xrc_ep_connect(Ep *ep, const XrcKey &remote, const ibv_gid &gid, uint16_t lid)
{
	Iface *i = ep->iface;
	XrcIni *x = uct_xsrc_rc_xrc_current_ini(i, remote);
	if (!x) {
		ibv_qp_init_attr_ex qa{};
		qa.qp_type = IBV_QPT_XRC_SEND;
		qa.comp_mask = IBV_QP_INIT_ATTR_PD;
		qa.pd = i->md->pd;
		qa.send_cq = i->cq[0];
		qa.cap.max_send_wr = i->cfg.sq_len;
		qa.cap.max_send_sge = i->max_sge;
		ibv_qp *qp = ibv_create_qp_ex(i->md->ctx, &qa);
		if (!qp)
			return uct_xsrc_md_errno_status(errno);
		ucs_status_t st = uct_xsrc_verbs_qp_init(i, qp);
		if (st != UCS_OK) {
			ibv_destroy_qp(qp);
			return st;
		}
		x = new XrcIni();
		x->key = remote;
		x->gid = gid;
		x->lid = lid;
		x->qp = qp;
		x->sq_avail = i->cfg.sq_len;
		i->inis.push_back(x);
		uct_xsrc_rc_xrc_send_request(i, x);
	}
	// The peer answers from its progress, or from its own connect_to_ep (both ends usually
	// connect at about the same time): wait a little, answering requests meanwhile. The count
	// taken now keeps `x` alive if error handlers destroy the other eps on it meanwhile.
	++x->eps;
	auto end = std::chrono::steady_clock::now() + connect_wait;
	while (x->state == XrcState::requesting && std::chrono::steady_clock::now() < end) {
		uct_xsrc_rc_iface_conn_poll(i);
		if (x->state == XrcState::requesting)
			sched_yield();
	}
	uct_xsrc_rc_iface_conn_poll(i);  // a request of the peer's that came with its answer
	if (x->state == XrcState::failed) {
		if (--x->eps == 0 && x->sq_avail == i->cfg.sq_len)
			uct_xsrc_rc_xrc_ini_destroy(i, x);
		return UCS_ERR_UNREACHABLE;
	}
	ep->ini = x;
	ep->sq = &x->sq_avail;
	ep->remote = remote;
	i->xrc_route[{remote, ep->remote_ep_id}] = ep;
	ep->state = x->state == XrcState::connected ? EpState::connected : EpState::idle;
	return UCS_OK;
}

void uct_xsrc_rc_xrc_ep_detach(Ep *ep)
{
	Iface *i = ep->iface;
	XrcIni *x = ep->ini;
	if (!x)
		return;
	auto it = i->xrc_route.find({ep->remote, ep->remote_ep_id});
	if (it != i->xrc_route.end() && it->second == ep)
		i->xrc_route.erase(it);
	ep->ini = nullptr;
	ep->sq = &ep->own_sq;
	if (--x->eps > 0)
		return;
	if (x->state == XrcState::requesting || x->state == XrcState::connected) {
		x->state = XrcState::closing;
		if (x->sq_avail < i->cfg.sq_len) {
			// Flush what destroyed eps left behind; the last completion destroys the QP.
			ibv_qp_attr a{};
			a.qp_state = IBV_QPS_ERR;
			ibv_modify_qp(x->qp, &a, IBV_QP_STATE);
		}
	}
	if (x->sq_avail == i->cfg.sq_len)
		uct_xsrc_rc_xrc_ini_destroy(i, x);
}

Ep *uct_xsrc_rc_xrc_route(Iface *i, uint32_t tgt_qpn, uint32_t src_ep_id)
{
	for (XrcTgt *t : i->tgts)
		if (t->qp->qp_num == tgt_qpn) {
			auto it = i->xrc_route.find({t->key, src_ep_id});
			return it == i->xrc_route.end() ? nullptr : it->second;
		}
	return nullptr;
}

void uct_xsrc_rc_xrc_ini_fail(Iface *i, XrcIni *x, ucs_status_t status)
{
	if (x->state == XrcState::failed || x->state == XrcState::closing)
		return;
	x->state = XrcState::failed;
	ibv_qp_attr a{};
	a.qp_state = IBV_QPS_ERR;
	ibv_modify_qp(x->qp, &a, IBV_QP_STATE);  // outstanding work completes, flushed
	std::vector<uint32_t> ids;
	for (Ep *ep : i->eps)
		if (ep->ini == x)
			ids.push_back(ep->id);
	// Error handlers may destroy eps (and so detach them): look each one up again. `x` stays
	// alive meanwhile: the caller holds a completion of it, or an ep is still attached.
	for (uint32_t id : ids) {
		auto it = i->by_id.find(id);
		if (it != i->by_id.end() && it->second->state != EpState::failed)
			uct_xsrc_rc_ep_fail_one(it->second, status, true);
	}
}

void uct_xsrc_rc_xrc_tx_done(Iface *i, TxOp *op, const ibv_wc &wc)
{
	XrcIni *x = op->ini;
	if (wc.status != IBV_WC_SUCCESS && x->state == XrcState::connected) {
		i->vops->handle_failure(i, wc);
		uct_xsrc_rc_xrc_ini_fail(i, x, op->ep && op->ep->cancelled ? UCS_ERR_CANCELED : uct_xsrc_verbs_wc_status(wc.status));
	}
	if (op->ep) {
		uct_xsrc_rc_ep_tx_done(i, op, wc);  // returns the work request to the shared count
		return;
	}
	uct_xsrc_rc_iface_op_put(i, op);  // its ep is gone: only the accounting is left
	uct_xsrc_rc_xrc_wr_done(i, x);
}

unsigned uct_xsrc_rc_xrc_progress(Iface *i)
{
	unsigned n = 0;
	uint64_t now = 0;
	for (size_t k = 0; k < i->inis.size(); ++k) {
		XrcIni *x = i->inis[k];
		if (x->state != XrcState::requesting)
			continue;
		if (!now)
			now = uct_xsrc_rc_xrc_now_ns();
		if (x->request_unsent || now - x->request_ns >= request_retry_ns) {
			uct_xsrc_rc_xrc_send_request(i, x);
			++n;
		}
	}
	if (!i->tgts.empty()) {
		if (!now)
			now = uct_xsrc_rc_xrc_now_ns();
		if (now - i->xrc_reap_ns >= reap_ns)
			uct_xsrc_rc_xrc_reap_tgts(i);
	}
	return n;
}

void uct_xsrc_rc_xrc_iface_cleanup(Iface *i)
{
	while (!i->inis.empty())
		uct_xsrc_rc_xrc_ini_destroy(i, i->inis.back());
	while (!i->tgts.empty())
		uct_xsrc_rc_xrc_tgt_destroy(i, i->tgts.back());
	i->xrc_route.clear();
}

}  // namespace xsrc::uct
