// The RC/XRC interface's receive side: receive pools (an ep's own on RC, chunks of the shared
// receive queue on XRC), end-to-end flow control (credit grants, see rc_iface.h) and the
// dispatch of a received message to its AM or internal handler.
#include "rc_iface.h"

#include "common/atomic.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace xsrc::uct {

namespace {

// A credit grant is written once this share of the peer's window has been re-posted.
constexpr unsigned grant_window_divisor = 4;

// Receive buffers: [slack][desc pointer][rx_headroom][WireHdr][payload]. The receive is
// posted at the WireHdr; the slack makes room for the pointer and the headroom in front of
// the payload when they do not fit in the consumed wire header.
size_t uct_xsrc_rc_rx_headroom(const Iface *i)
{
	return (i->params.field_mask & UCT_IFACE_PARAM_FIELD_RX_HEADROOM) ? i->params.rx_headroom : 0;
}

size_t uct_xsrc_rc_rx_slack(const Iface *i)
{
	size_t need = uct_xsrc_rc_rx_headroom(i) + sizeof(void *);
	return need > sizeof(WireHdr) ? ((need - sizeof(WireHdr) + 7) & ~size_t{7}) : 0;
}

size_t uct_xsrc_rc_rx_stride(const Iface *i) { return uct_xsrc_rc_rx_slack(i) + i->cfg.seg_size; }

// Where descriptor `d` receives (its WireHdr).
char *uct_xsrc_rc_rx_at(Iface *i, const RxDesc *d)
{
	return d->pool->mem + credit_slot_size + static_cast<size_t>(d->index) * uct_xsrc_rc_rx_stride(i) +
	       uct_xsrc_rc_rx_slack(i);
}

void uct_xsrc_rc_rx_release(uct_recv_desc_t *self, void *)
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
		if (pool->held == 0)
			uct_xsrc_rc_rx_pool_free(pool);
		return;
	}
	Ep *ep = pool->ep;
	uct_xsrc_rc_ep_repost(ep->iface, ep, d);
}

RxPool *uct_xsrc_rc_rx_pool_new(Iface *i, unsigned n)
{
	auto *pool = new (std::nothrow) RxPool();
	if (!pool)
		return nullptr;
	pool->iface = i;
	pool->descs.resize(n);
	for (unsigned k = 0; k < n; ++k)
		pool->descs[k] = RxDesc{{uct_xsrc_rc_rx_release}, pool, k, false, 0};
	return pool;
}

// RC: a pool of `n` receives in memory of its own.
RxPool *uct_xsrc_rc_rx_pool_alloc(Iface *i, unsigned n, int access)
{
	RxPool *pool = uct_xsrc_rc_rx_pool_new(i, n);
	if (!pool)
		return nullptr;
	pool->own_mem = Mapping(credit_slot_size + static_cast<size_t>(n) * uct_xsrc_rc_rx_stride(i));
	if (pool->own_mem)
		pool->own_mr.reset(ibv_reg_mr(i->md->pd, pool->own_mem.data(), pool->own_mem.size(), access));
	if (!pool->own_mr) {
		delete pool;
		return nullptr;
	}
	pool->mem = pool->own_mem.data();
	pool->mem_len = pool->own_mem.size();
	pool->mr = pool->own_mr.get();
	return pool;
}

// XRC: a pool over part of an area the iface registered.
RxPool *uct_xsrc_rc_rx_pool_borrow(Iface *i, char *mem, size_t len, ibv_mr *mr, unsigned n)
{
	RxPool *pool = uct_xsrc_rc_rx_pool_new(i, n);
	if (!pool)
		return nullptr;
	pool->mem = mem;
	pool->mem_len = len;
	pool->mr = mr;
	pool->borrowed = true;
	return pool;
}

// XRC: an ep's credit slot, and (the first time the iface has this many eps) one more chunk of
// receives in the shared queue for its peer. Chunks stay with the iface: an ep created later
// reuses the room a destroyed one left.
ucs_status_t uct_xsrc_rc_iface_xrc_init_rx(Iface *i, Ep *ep)
{
	if (i->free_credit_slots.empty())
		return UCS_ERR_EXCEEDS_LIMIT;
	unsigned slot = i->free_credit_slots.back();
	char *word = i->credit_mem.data() + static_cast<size_t>(slot) * credit_slot_size;
	RxPool *pool = uct_xsrc_rc_rx_pool_borrow(i, word, credit_slot_size, i->credit_mr.get(), 0);
	if (!pool)
		return UCS_ERR_NO_MEMORY;
	i->free_credit_slots.pop_back();
	pool->slot = slot;
	memset(word, 0, credit_slot_size);
	pool->ep = ep;
	ep->rx = pool;
	if (i->srq_chunks.size() < i->eps.size()) {
		size_t len = uct_xsrc_rc_iface_srq_chunk_len(i);
		RxPool *chunk = uct_xsrc_rc_rx_pool_borrow(i, i->srq_mem.data() + i->srq_chunks.size() * len, len,
							   i->srq_mr.get(), i->cfg.rx_queue_len);
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
	return UCS_OK;
}

ucs_status_t uct_xsrc_rc_iface_init_rx(Iface *i, Ep *ep)
{
	if (i->cfg.xrc) {
		ucs_status_t st = uct_xsrc_rc_iface_xrc_init_rx(i, ep);
		if (st != UCS_OK)
			return st;
	} else {
		RxPool *pool = uct_xsrc_rc_rx_pool_alloc(i, i->cfg.rx_queue_len,
							 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!pool)
			return UCS_ERR_NO_MEMORY;
		pool->ep = ep;
		ep->rx = pool;
		for (RxDesc &d : pool->descs) {
			ucs_status_t st = uct_xsrc_rc_ep_repost(i, ep, &d);
			if (st != UCS_OK)
				return st;
		}
	}
	ep->reposted = 0;
	ep->granted = 0;
	ep->grant_wanted = false;
	return UCS_OK;
}

void uct_xsrc_rc_iface_cleanup_rx(Iface *i, Ep *ep)
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
	uct_xsrc_rc_rx_pool_free(pool);
}

// Writes the count of re-posted receives into the peer's credit word.
ucs_status_t uct_xsrc_rc_iface_fc_ctrl(Iface *, Ep *ep)
{
	if (ep->state != EpState::connected || ep->cancelled)
		return UCS_ERR_CANCELED;
	uint64_t value = ep->reposted;
	ucs_status_t st = uct_xsrc_rc_ep_write_credit(ep, OpKind::grant, value);
	if (st != UCS_OK)
		return st;  // the grant stays wanted
	ep->granted = value;
	ep->grant_wanted = false;
	return UCS_OK;
}

unsigned uct_xsrc_rc_iface_fc_handler(Iface *, Ep *ep)
{
	if (!ep->rx)
		return 0;
	uint64_t granted = xsrc::load_acquire(ep->rx->credit_word());
	uint64_t limit = granted + ep->peer_window;
	return limit > ep->sent ? static_cast<unsigned>(limit - ep->sent) : 0;
}

}  // namespace

const RcIfaceOps uct_xsrc_rc_iface_default_ops = {
	.init_rx = uct_xsrc_rc_iface_init_rx,
	.cleanup_rx = uct_xsrc_rc_iface_cleanup_rx,
	.fc_ctrl = uct_xsrc_rc_iface_fc_ctrl,
	.fc_handler = uct_xsrc_rc_iface_fc_handler,
};

size_t uct_xsrc_rc_iface_srq_chunk_len(const Iface *i)
{
	return credit_slot_size + static_cast<size_t>(i->cfg.rx_queue_len) * uct_xsrc_rc_rx_stride(i);
}

void uct_xsrc_rc_rx_pool_free(RxPool *pool) { delete pool; }  // own memory and MR go with it

ucs_status_t uct_xsrc_rc_ep_repost(Iface *i, Ep *ep, RxDesc *d)
{
	RxPool *pool = d->pool;
	ibv_sge sge{reinterpret_cast<uintptr_t>(uct_xsrc_rc_rx_at(i, d)), static_cast<uint32_t>(i->cfg.seg_size),
		    pool->mr->lkey};
	ibv_recv_wr wr{};
	ibv_recv_wr *bad = nullptr;
	wr.wr_id = reinterpret_cast<uintptr_t>(d);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	int rc = pool->shared ? ibv_post_srq_recv(i->srq.get(), &wr, &bad) : ibv_post_recv(ep->qp, &wr, &bad);
	if (rc != 0)
		return uct_xsrc_md_errno_status(rc);
	if (!ep)
		return UCS_OK;
	++ep->reposted;
	unsigned threshold = std::max(1u, i->cfg.rx_queue_len / grant_window_divisor);
	if (ep->reposted - ep->granted >= threshold)
		ep->grant_wanted = true;
	return UCS_OK;
}

char *uct_xsrc_rc_iface_rx_data(Iface *i, const RxDesc *d) { return uct_xsrc_rc_rx_at(i, d); }

void iface_release_desc(Iface *i, void *data)
{
	char *desc = static_cast<char *>(data) - uct_xsrc_rc_rx_headroom(i);
	uct_recv_desc_t *rd = uct_recv_desc(desc);
	rd->cb(rd, desc);
}

void uct_xsrc_rc_ep_rx(Iface *i, Ep *ep, RxDesc *d, size_t byte_len)
{
	RxPool *pool = d->pool;
	d->src_ep_id = ep->id;
	char *at = uct_xsrc_rc_rx_at(i, d);
	if (byte_len < sizeof(WireHdr)) {
		uct_xsrc_rc_ep_repost(i, ep, d);
		return;
	}
	WireHdr hdr;
	memcpy(&hdr, at, sizeof(hdr));
	char *data = at + sizeof(WireHdr);
	size_t len = byte_len - sizeof(WireHdr);
	char *desc = data - uct_xsrc_rc_rx_headroom(i);
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

}  // namespace xsrc::uct
