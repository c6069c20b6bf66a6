// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Receive-side scaling for raw packet QPs: receive work queues (ibv_wq),
// indirection tables over them (ibv_rwq_ind_table) and hash QPs
// (IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_IND_TABLE) that spread the
// frames their flows match over the table's WQs by the Toeplitz hash of the
// fields the QP names, as a NIC's RSS does.
//
// WQs and tables live in the process that made them: only its own raw
// receive thread (raw_packet.cpp) consumes them, so the device keeps no
// record of them. A hash QP is a raw packet QP of the device with no queues
// of its own (its number, its PD, its lifetime); its flows deliver into the
// WQs, whose receives are checked against the hash QP's PD.
#include "raw_packet.h"
#include "xsrc.h"

#include <netinet/in.h>

#include <algorithm>
#include <atomic>

struct xsrc_wq {
	ibv_wq wq;
	std::mutex lock;  // the ring, the state
	std::vector<xsrc::RecvWqe> ring;
	size_t head = 0, count = 0;
	uint32_t max_sge = 0;
	std::atomic<uint32_t> tables{0};  // indirection tables naming it
};

struct xsrc_ind_table {
	ibv_rwq_ind_table table;
	std::vector<xsrc_wq *> wqs;
	std::atomic<uint32_t> qps{0};  // hash QPs using it
};

struct xsrc_rss {
	xsrc_ind_table *table = nullptr;
	uint8_t key[XSRC_RSS_KEY_MAX] = {};
	uint8_t key_len = 0;
	uint64_t fields = 0;
};

namespace {

constexpr uint32_t kMaxWqWr = 16384;
constexpr uint32_t kMaxLogIndTable = 10;
constexpr uint64_t kSupportedFields = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 | IBV_RX_HASH_SRC_IPV6 |
				      IBV_RX_HASH_DST_IPV6 | IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP |
				      IBV_RX_HASH_SRC_PORT_UDP | IBV_RX_HASH_DST_PORT_UDP;

std::atomic<uint32_t> next_wq_num{1}, next_ind_table_num{1};

xsrc_wq *to_xsrc_wq(ibv_wq *wq)
{
	return reinterpret_cast<xsrc_wq *>(wq);
}

xsrc_ind_table *to_xsrc_ind_table(ibv_rwq_ind_table *t)
{
	return reinterpret_cast<xsrc_ind_table *>(t);
}

int fail(xsrc_context *ctx, const char *what, int err)
{
	verbs_debug(&ctx->ibv_ctx, "%s: %s\n", what, strerror(err));
	errno = err;
	return err;
}

int wq_post_recv(ibv_wq *ibwq, ibv_recv_wr *wr, ibv_recv_wr **bad)
{
	xsrc_wq *wq = to_xsrc_wq(ibwq);
	std::lock_guard guard(wq->lock);
	for (; wr; wr = wr->next) {
		int err = 0;
		if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > wq->max_sge)
			err = EINVAL;
		else if (wq->count == wq->ring.size())
			err = ENOMEM;
		if (err) {
			*bad = wr;
			return err;
		}
		xsrc::RecvWqe &r = wq->ring[(wq->head + wq->count++) % wq->ring.size()];
		r.wr_id = wr->wr_id;
		r.num_sge = static_cast<uint32_t>(wr->num_sge);
		for (int i = 0; i < wr->num_sge; ++i)
			r.sge[i] = {wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
	}
	return 0;
}

// Completes every posted receive of `wq` (held) with `status`, or drops them.
void wq_drain_locked(xsrc_context *ctx, xsrc_wq *wq, bool flush)
{
	for (; wq->count; --wq->count, wq->head = (wq->head + 1) % wq->ring.size())
		if (flush)
			xsrc_cq_complete(ctx, to_xsrc_cq(wq->wq.cq)->ring(), 0,
					 xsrc_make_cqe(wq->ring[wq->head].wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV,
						       xsrc::Qpn(wq->wq.wq_num)));
}

// The Toeplitz hash of `in` under `key` (Microsoft's RSS definition): for
// each set input bit, the 32 key bits starting at that bit's position.
uint32_t toeplitz(const uint8_t *key, size_t key_len, const uint8_t *in, size_t n)
{
	auto key_byte = [&](size_t i) -> uint32_t { return i < key_len ? key[i] : 0; };
	uint32_t window = key_byte(0) << 24 | key_byte(1) << 16 | key_byte(2) << 8 | key_byte(3);
	uint32_t hash = 0;
	for (size_t i = 0; i < n; ++i)
		for (int bit = 7; bit >= 0; --bit) {
			if ((in[i] >> bit) & 1)
				hash ^= window;
			window = window << 1 | ((key_byte(i + 4) >> bit) & 1);
		}
	return hash;
}

// The hash input of a frame: source and destination address, then source and
// destination port, each only if the QP names it (and the frame has it).
size_t hash_input(const xsrc_rss &rss, const uint8_t *frame, size_t len, uint8_t (&out)[36])
{
	xsrc::FrameFields f = xsrc::frame_fields(frame, len);
	size_t n = 0;
	auto put = [&](const uint8_t *p, size_t k) {
		std::memcpy(out + n, p, k);
		n += k;
	};
	if (f.ipv4) {
		if (rss.fields & IBV_RX_HASH_SRC_IPV4)
			put(f.l3 + 12, 4);
		if (rss.fields & IBV_RX_HASH_DST_IPV4)
			put(f.l3 + 16, 4);
	} else if (f.ipv6) {
		if (rss.fields & IBV_RX_HASH_SRC_IPV6)
			put(f.l3 + 8, 16);
		if (rss.fields & IBV_RX_HASH_DST_IPV6)
			put(f.l3 + 24, 16);
	}
	bool tcp = f.l4_proto == IPPROTO_TCP, udp = f.l4_proto == IPPROTO_UDP;
	if (f.l4 && f.l4_len >= 4 && (tcp || udp)) {
		if (rss.fields & (tcp ? IBV_RX_HASH_SRC_PORT_TCP : IBV_RX_HASH_SRC_PORT_UDP))
			put(f.l4, 2);
		if (rss.fields & (tcp ? IBV_RX_HASH_DST_PORT_TCP : IBV_RX_HASH_DST_PORT_UDP))
			put(f.l4 + 2, 2);
	}
	return n;
}

}  // namespace

ibv_wq *xsrc_create_wq(ibv_context *ibctx, ibv_wq_init_attr *attr)
{
	xsrc_context *ctx = to_xsrc_ctx(ibctx);
	if (attr->wq_type != IBV_WQT_RQ || (attr->comp_mask & ~IBV_WQ_INIT_ATTR_FLAGS) ||
	    ((attr->comp_mask & IBV_WQ_INIT_ATTR_FLAGS) && attr->create_flags)) {
		fail(ctx, "create_wq: a type, mask or flag the device does not have", EOPNOTSUPP);
		return nullptr;
	}
	if (!attr->pd || !attr->cq || attr->max_wr == 0 || attr->max_wr > kMaxWqWr ||
	    attr->max_sge > XSRC_MAX_RECV_SGE) {
		fail(ctx, "create_wq: no PD or CQ, or max_wr / max_sge out of range", EINVAL);
		return nullptr;
	}
	auto *wq = new (std::nothrow) xsrc_wq{};
	if (!wq) {
		errno = ENOMEM;
		return nullptr;
	}
	try {
		wq->ring.resize(attr->max_wr);
	} catch (const std::bad_alloc &) {
		delete wq;
		errno = ENOMEM;
		return nullptr;
	}
	wq->max_sge = attr->max_sge;
	wq->wq.context = ibctx;
	wq->wq.wq_context = attr->wq_context;
	wq->wq.pd = attr->pd;
	wq->wq.cq = attr->cq;
	wq->wq.wq_num = next_wq_num.fetch_add(1);
	wq->wq.state = IBV_WQS_RESET;
	wq->wq.wq_type = IBV_WQT_RQ;
	wq->wq.post_recv = wq_post_recv;
	return &wq->wq;
}

int xsrc_modify_wq(ibv_wq *ibwq, ibv_wq_attr *attr)
{
	xsrc_wq *wq = to_xsrc_wq(ibwq);
	xsrc_context *ctx = to_xsrc_ctx(ibwq->context);
	constexpr uint32_t known = IBV_WQ_ATTR_STATE | IBV_WQ_ATTR_CURR_STATE | IBV_WQ_ATTR_FLAGS;
	if (attr->attr_mask & ~known)
		return fail(ctx, "modify_wq: unknown attribute", EINVAL);
	if ((attr->attr_mask & IBV_WQ_ATTR_FLAGS) && attr->flags_mask)
		return fail(ctx, "modify_wq: WQ flags", EOPNOTSUPP);
	std::lock_guard guard(wq->lock);
	ibv_wq_state cur = wq->wq.state;
	if ((attr->attr_mask & IBV_WQ_ATTR_CURR_STATE) && attr->curr_wq_state != cur)
		return fail(ctx, "modify_wq: curr_wq_state is not the WQ's state", EINVAL);
	if (!(attr->attr_mask & IBV_WQ_ATTR_STATE))
		return 0;
	ibv_wq_state next = attr->wq_state;
	bool allowed = next == IBV_WQS_RESET || (next == IBV_WQS_RDY && cur != IBV_WQS_ERR) ||
		       (next == IBV_WQS_ERR && cur != IBV_WQS_RESET);
	if (!allowed)
		return fail(ctx, "modify_wq: transition not allowed", EINVAL);
	if (next == IBV_WQS_ERR || next == IBV_WQS_RESET)
		wq_drain_locked(ctx, wq, next == IBV_WQS_ERR);
	wq->wq.state = next;
	return 0;
}

int xsrc_destroy_wq(ibv_wq *ibwq)
{
	xsrc_wq *wq = to_xsrc_wq(ibwq);
	if (wq->tables.load())
		return fail(to_xsrc_ctx(ibwq->context), "destroy_wq: an indirection table still names it", EBUSY);
	delete wq;
	return 0;
}

ibv_rwq_ind_table *xsrc_create_rwq_ind_table(ibv_context *ibctx, ibv_rwq_ind_table_init_attr *attr)
{
	xsrc_context *ctx = to_xsrc_ctx(ibctx);
	if (attr->comp_mask) {
		fail(ctx, "create_rwq_ind_table: comp_mask", EOPNOTSUPP);
		return nullptr;
	}
	if (attr->log_ind_tbl_size > kMaxLogIndTable || !attr->ind_tbl) {
		fail(ctx, "create_rwq_ind_table: log_ind_tbl_size out of range", EINVAL);
		return nullptr;
	}
	size_t size = size_t(1) << attr->log_ind_tbl_size;
	for (size_t i = 0; i < size; ++i)
		if (!attr->ind_tbl[i] || attr->ind_tbl[i]->context != ibctx) {
			fail(ctx, "create_rwq_ind_table: an entry names no WQ of this context", EINVAL);
			return nullptr;
		}
	auto *t = new (std::nothrow) xsrc_ind_table{};
	if (!t) {
		errno = ENOMEM;
		return nullptr;
	}
	try {
		for (size_t i = 0; i < size; ++i)
			t->wqs.push_back(to_xsrc_wq(attr->ind_tbl[i]));
	} catch (const std::bad_alloc &) {
		delete t;
		errno = ENOMEM;
		return nullptr;
	}
	for (xsrc_wq *wq : t->wqs)
		wq->tables.fetch_add(1);
	t->table.context = ibctx;
	t->table.ind_tbl_num = static_cast<int>(next_ind_table_num.fetch_add(1));
	t->table.ind_tbl_handle = t->table.ind_tbl_num;
	return &t->table;
}

int xsrc_destroy_rwq_ind_table(ibv_rwq_ind_table *ibt)
{
	xsrc_ind_table *t = to_xsrc_ind_table(ibt);
	if (t->qps.load())
		return fail(to_xsrc_ctx(ibt->context), "destroy_rwq_ind_table: a QP still uses it", EBUSY);
	for (xsrc_wq *wq : t->wqs)
		wq->tables.fetch_sub(1);
	delete t;
	return 0;
}

int xsrc_rss_prepare(xsrc_context *ctx, ibv_qp_init_attr_ex &attr, xsrc_rss *&out)
{
	constexpr uint32_t both = IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_IND_TABLE;
	if ((attr.comp_mask & both) != both || attr.qp_type != IBV_QPT_RAW_PACKET || !attr.rwq_ind_tbl)
		return fail(ctx, "create_qp: a hash QP is a raw packet QP with RX_HASH and IND_TABLE", EINVAL);
	const ibv_rx_hash_conf &h = attr.rx_hash_conf;
	if (h.rx_hash_function != IBV_RX_HASH_FUNC_TOEPLITZ || (h.rx_hash_fields_mask & ~kSupportedFields))
		return fail(ctx, "create_qp: a hash function or field the device does not have", EOPNOTSUPP);
	if (h.rx_hash_key_len == 0 || h.rx_hash_key_len > XSRC_RSS_KEY_MAX || !h.rx_hash_key)
		return fail(ctx, "create_qp: RSS key length", EINVAL);
	xsrc_ind_table *t = to_xsrc_ind_table(attr.rwq_ind_tbl);
	for (xsrc_wq *wq : t->wqs)
		if (wq->wq.pd != attr.pd)
			return fail(ctx, "create_qp: the table's WQs must be of the hash QP's PD", EINVAL);
	auto *rss = new (std::nothrow) xsrc_rss{};
	if (!rss)
		return ENOMEM;
	rss->table = t;
	std::memcpy(rss->key, h.rx_hash_key, h.rx_hash_key_len);
	rss->key_len = h.rx_hash_key_len;
	rss->fields = h.rx_hash_fields_mask;
	// The device's QP: a raw packet QP with no queues, on the first WQ's CQ.
	attr.comp_mask &= ~both;
	attr.send_cq = attr.recv_cq = t->wqs.front()->wq.cq;
	attr.srq = nullptr;
	attr.cap = {};
	out = rss;
	return 0;
}

void xsrc_rss_bind(xsrc_rss *rss)
{
	rss->table->qps.fetch_add(1);
}

void xsrc_rss_release(xsrc_rss *rss)
{
	if (!rss)
		return;
	if (rss->table)
		rss->table->qps.fetch_sub(1);
	delete rss;
}

void xsrc_rss_receive(xsrc_context *ctx, xsrc_qp *qp, const uint8_t *frame, size_t len) noexcept
{
	const xsrc_rss &rss = *qp->rss;
	uint8_t in[36];
	size_t n = hash_input(rss, frame, len, in);
	uint32_t hash = toeplitz(rss.key, rss.key_len, in, n);
	xsrc_wq *wq = rss.table->wqs[hash & (rss.table->wqs.size() - 1)];
	std::lock_guard guard(wq->lock);
	if (wq->wq.state != IBV_WQS_RDY || wq->count == 0)
		return;  // dropped, as on a NIC
	xsrc::RecvWqe rwqe = wq->ring[wq->head];
	wq->head = (wq->head + 1) % wq->ring.size();
	--wq->count;
	xsrc_raw_scatter(ctx, rwqe, xsrc::PdId(qp->entry->pd_id), frame, len, to_xsrc_cq(wq->wq.cq)->ring(), qp->qpn);
}
