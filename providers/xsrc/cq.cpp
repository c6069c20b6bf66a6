// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Completion queues: the ring in the arena, polled here without a system
// call; arming is a flag in the ring that producers check.
#include "xsrc.h"

#include <algorithm>
#include <ctime>
#include <new>

namespace {

using xsrc::atomic;

// Where a ring lies in the device arena: what CQ events name it by.
uint64_t arena_offset(const xsrc_context *ctx, const xsrc_cq_ring *ring)
{
	return static_cast<uint64_t>(reinterpret_cast<const unsigned char *>(ring) - ctx->arena.base);
}

void cq_to_wc(const xsrc_cqe &c, ibv_wc &wc)
{
	wc = {};
	wc.wr_id = c.wr_id;
	wc.status = static_cast<ibv_wc_status>(c.status);
	wc.opcode = static_cast<ibv_wc_opcode>(c.opcode);
	wc.vendor_err = c.vendor_err;
	wc.byte_len = c.byte_len;
	wc.imm_data = c.imm_data;
	wc.qp_num = c.qp_num;
	wc.src_qp = c.src_qp;
	wc.wc_flags = c.wc_flags;
	wc.pkey_index = c.pkey_index;
	wc.slid = c.slid;
	wc.sl = c.sl;
	wc.dlid_path_bits = c.dlid_path_bits;
}

// True when the completion at `pos` of `ring` belongs to a QP that went back
// to RESET after it was written (xsrc_cq_clean): it is not reported.
bool cq_discarded(xsrc_cq *cq, const xsrc_cq_ring *ring, uint64_t pos, const xsrc_cqe &c)
{
	return std::any_of(cq->discards.begin(), cq->discards.end(), [&](const xsrc_cq_discard &d) {
		return d.ring == ring && d.qpn == c.qp_num && pos < d.until;
	});
}

// Takes the next completion `from` has that is not discarded; producers
// learn of it at the next publish().
bool cq_pop_from(xsrc_cq *cq, xsrc::CqConsumer &from, xsrc_cqe &c)
{
	const xsrc_local_mrs &mrs = to_xsrc_ctx(cq->vcq.cq.context)->local_mrs;
	auto may_write = [&mrs](uint64_t va, uint32_t len) { return mrs.covers(va, len); };
	for (;;) {
		if (!from.take(c, may_write))
			return false;
		if (cq->discards.empty() || !cq_discarded(cq, from.ring(), from.pos() - 1, c))
			return true;
	}
}

// The tag-matching information of a completion (driver ABI r7): a matched
// message's tag and app_ctx ride in deferred_va and vendor_err.
ibv_wc_tm_info cq_tm_info(xsrc_cqe &c)
{
	if (!(c.flags & XSRC_CQE_TM_INFO) || (c.flags & (XSRC_CQE_DEFERRED | XSRC_CQE_DEFERRED_BIG)))
		return {};
	ibv_wc_tm_info info{};
	info.tag = c.deferred_va;
	info.priv = c.vendor_err;
	c.vendor_err = 0;
	return info;
}

// A receive of the QP that last sent to a peer on this device: the answer
// will likely go to the same receive queue, so its lines start their way
// here now (xsrc_cq::reply), and the answer's post finds them here instead
// of waiting a cross-core round trip for them. ib_send_lat 8 B, one way:
// 0.63 -> 0.51 us (medians of 9 alternating runs).
void cq_expect_reply(xsrc_cq *cq, const ibv_wc &wc)
{
	if (!(wc.opcode & IBV_WC_RECV) || wc.qp_num != cq->reply.qpn.load(std::memory_order_relaxed))
		return;
	xsrc::prefetch_for_write(cq->reply.head.load(std::memory_order_relaxed));
	xsrc::prefetch_for_write(cq->reply.slot.load(std::memory_order_relaxed));
}

// One completion, oldest first: a ring left behind by a resize drains first.
bool cq_pop_one(xsrc_cq *cq, ibv_wc &wc)
{
	xsrc_cqe c;
	if (cq->old.ring()) {
		if (cq_pop_from(cq, cq->old, c)) {
			cq->old.publish(true);
			cq->polled_tm = cq_tm_info(c);
			cq_to_wc(c, wc);
			return true;
		}
		std::erase_if(cq->discards, [&](const xsrc_cq_discard &d) { return d.ring == cq->old.ring(); });
		cq->old = {};
	}
	if (!cq_pop_from(cq, cq->consumer, c)) {
		std::erase_if(cq->discards, [&](const xsrc_cq_discard &d) { return d.until <= cq->consumer.pos(); });
		return false;
	}
	cq->polled_tm = cq_tm_info(c);
	cq_to_wc(c, wc);
	cq_expect_reply(cq, wc);
	return true;
}

// An empty poll takes no lock and makes no locked instruction. It is what a
// polling application does between completions, and it cost three (the
// poll count, the lock, the unlock): 25.6 ns against 4.3 ns now on this
// VM. The slot of the next completion is published in `peek`: the address
// of its sequence word (user addresses fit 48 bits) and the low 16 bits of
// the value that marks it written. A poll that finds another value there
// has nothing to report. If another thread's poll moved on meanwhile, this
// one reads a slot already taken and reports nothing, as if it had polled
// just before that other poll.
constexpr unsigned kPeekShift = 48;

// Under poll_lock, after the consumer moved: where the next poll looks.
void cq_update_peek(xsrc_cq *cq)
{
	uint64_t word = 0;
	if (!cq->old.ring() && cq->consumer.ring()) {
		auto va = reinterpret_cast<uintptr_t>(cq->consumer.next_seq());
		if (va < (uint64_t(1) << kPeekShift))
			word = va | (cq->consumer.pos() + 1) << kPeekShift;
	}
	cq->peek.store(word, std::memory_order_release);
}

// True when a poll would find nothing, known without the lock.
bool cq_looks_empty(const xsrc_cq *cq)
{
	uint64_t word = cq->peek.load(std::memory_order_acquire);
	if (!word)
		return false;
	auto *seq = reinterpret_cast<__u64 *>(word & ((uint64_t(1) << kPeekShift) - 1));
	uint64_t ready = atomic(*seq).load(std::memory_order_relaxed);
	return ready << kPeekShift != (word >> kPeekShift) << kPeekShift;
}

// What every poll does before it looks at the ring: counts itself
// (streaming detection; a plain store, since the count only has to change
// and a locked increment would cost an empty poll its speed), takes in the
// RoCE responses that arrived, and retries what waited on a receive. False
// when the CQ is empty, known without the lock.
bool cq_poll_begin(xsrc_cq *cq)
{
	cq->polls.store(cq->polls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
	xsrc_context *ctx = to_xsrc_ctx(cq->vcq.cq.context);
	xsrc_wire_poll(ctx);
	xsrc_requester_recheck_all(ctx);
	return !cq_looks_empty(cq);
}

// The end of a locked poll: the producers learn how far it got, the next
// poll where to look.
void cq_poll_end(xsrc_cq *cq)
{
	cq->consumer.publish();
	cq_update_peek(cq);
}

// Tells producers that this provider places payloads from the ring's big
// slots (revision 5): a provider that predates them never says so, and so
// is never sent one.
void cq_accept_big_payloads(xsrc_cq_ring *ring, const xsrc::CqShape &shape)
{
#if XSRC_DRIVER_ABI_REVISION >= 5
	if (shape.big_slots)
		xsrc::store_release(ring->big_polled, 1u);
#else
	(void)ring, (void)shape;
#endif
}

// Whether our CQs arm with their tail in view (revision 11, xsrc-queues.h),
// so that their producers need no fence behind each completion.
bool cq_arms_with_tail([[maybe_unused]] const xsrc_context *ctx)
{
#if XSRC_DRIVER_ABI_REVISION >= 11
	return ctx->driver_abi >= 11;
#else
	return false;
#endif
}

// Our CQ's ring at `off` and its shape, read once: null when the shape does
// not fit the arena (its header is anyone's to write). A big pool that does
// not is left out of the shape, and never announced.
xsrc_cq_ring *cq_ring_at(xsrc_context *ctx, uint64_t off, xsrc::CqShape &shape)
{
	auto *ring = xsrc_cq_ring_at(ctx->arena, off, shape);
	if (!ring)
		return nullptr;
	if (!xsrc::cq_big_pool_sane(shape, ctx->arena.size - off))
		shape.big_slots = shape.big_stride = 0;
	cq_accept_big_payloads(ring, shape);
#if XSRC_DRIVER_ABI_REVISION >= 11
	// Before the application can arm it: xsrc_req_notify_cq looks at the
	// tail from the first arming on.
	if (cq_arms_with_tail(ctx))
		xsrc::store_release(ring->arm_sees_tail, 1u);
#endif
	return ring;
}

// --- the extended poll interface (ibv_start_poll & co) ---------------------

// A completion is stamped when the poll takes it from the ring (the device
// has no clock of its own that writers share): free-running stamps are the
// device clock of xsrc_device_clock_ns(), wall-clock stamps CLOCK_REALTIME.
void cq_stamp(xsrc_cq *cq)
{
	if (cq->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)
		cq->polled_ts = xsrc_device_clock_ns();
	else if (cq->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
		cq->polled_ts = xsrc_clock_ns(CLOCK_REALTIME);
}

int cq_start_poll(ibv_cq_ex *ibcq, ibv_poll_cq_attr *attr)
{
	xsrc_cq *cq = to_xsrc_cq(ibcq);
	if (attr->comp_mask) {
		verbs_debug(&to_xsrc_ctx(cq->vcq.cq.context)->ibv_ctx, "start_poll: comp_mask 0x%x is not supported\n",
			    attr->comp_mask);
		return EINVAL;
	}
	if (!cq_poll_begin(cq))
		return ENOENT;
	cq->poll_lock.lock();
	if (!cq_pop_one(cq, cq->polled)) {
		cq_poll_end(cq);
		cq->poll_lock.unlock();
		return ENOENT;
	}
	cq_stamp(cq);
	ibcq->wr_id = cq->polled.wr_id;
	ibcq->status = cq->polled.status;
	return 0;
}

int cq_next_poll(ibv_cq_ex *ibcq)
{
	xsrc_cq *cq = to_xsrc_cq(ibcq);
	if (!cq_pop_one(cq, cq->polled))
		return ENOENT;
	cq_stamp(cq);
	ibcq->wr_id = cq->polled.wr_id;
	ibcq->status = cq->polled.status;
	return 0;
}

void cq_end_poll(ibv_cq_ex *ibcq)
{
	xsrc_cq *cq = to_xsrc_cq(ibcq);
	cq_poll_end(cq);
	cq->poll_lock.unlock();
}

ibv_wc_opcode cq_read_opcode(ibv_cq_ex *cq) { return to_xsrc_cq(cq)->polled.opcode; }
uint32_t cq_read_vendor_err(ibv_cq_ex *cq) { return to_xsrc_cq(cq)->polled.vendor_err; }
uint32_t cq_read_byte_len(ibv_cq_ex *cq) { return to_xsrc_cq(cq)->polled.byte_len; }
__be32 cq_read_imm_data(ibv_cq_ex *cq) { return to_xsrc_cq(cq)->polled.imm_data; }
uint32_t cq_read_qp_num(ibv_cq_ex *cq) { return to_xsrc_cq(cq)->polled.qp_num; }
uint32_t cq_read_src_qp(ibv_cq_ex *cq) { return to_xsrc_cq(cq)->polled.src_qp; }
unsigned int cq_read_wc_flags(ibv_cq_ex *cq) { return to_xsrc_cq(cq)->polled.wc_flags; }
uint32_t cq_read_slid(ibv_cq_ex *cq) { return to_xsrc_cq(cq)->polled.slid; }
uint8_t cq_read_sl(ibv_cq_ex *cq) { return to_xsrc_cq(cq)->polled.sl; }
uint8_t cq_read_dlid_path_bits(ibv_cq_ex *cq) { return to_xsrc_cq(cq)->polled.dlid_path_bits; }

// A CQ with both stamps reads the free-running one from the device clock and
// the wall-clock one converted from it (one clock read per completion).
uint64_t cq_read_completion_ts(ibv_cq_ex *cq) { return to_xsrc_cq(cq)->polled_ts; }
uint64_t cq_read_completion_wallclock_ns(ibv_cq_ex *ibcq)
{
	xsrc_cq *cq = to_xsrc_cq(ibcq);
	if (!(cq->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP))
		return cq->polled_ts;
	return cq->polled_ts + (xsrc_clock_ns(CLOCK_REALTIME) - xsrc_device_clock_ns());
}

// Zero unless the completion is a matched tagged message (IBV_WC_TM_MATCH).
void cq_read_tm_info(ibv_cq_ex *cq, ibv_wc_tm_info *tm_info) { *tm_info = to_xsrc_cq(cq)->polled_tm; }

void cq_set_poll_ops(ibv_cq_ex &cq)
{
	cq.start_poll = cq_start_poll;
	cq.next_poll = cq_next_poll;
	cq.end_poll = cq_end_poll;
	cq.read_opcode = cq_read_opcode;
	cq.read_vendor_err = cq_read_vendor_err;
	cq.read_byte_len = cq_read_byte_len;
	cq.read_imm_data = cq_read_imm_data;
	cq.read_qp_num = cq_read_qp_num;
	cq.read_src_qp = cq_read_src_qp;
	cq.read_wc_flags = cq_read_wc_flags;
	cq.read_slid = cq_read_slid;
	cq.read_sl = cq_read_sl;
	cq.read_dlid_path_bits = cq_read_dlid_path_bits;
	cq.read_completion_ts = cq_read_completion_ts;
	cq.read_completion_wallclock_ns = cq_read_completion_wallclock_ns;
	cq.read_tm_info = cq_read_tm_info;
}

// Completes a CQ the daemon created: its ring, and the channel pool the
// create may have drawn from. On failure the CQ is destroyed (errno set).
bool cq_attach_ring(xsrc_context *ctx, xsrc_cq *cq, const xsrc_create_cq_resp &drv)
{
	xsrc::CqShape shape;
	xsrc_cq_ring *ring = cq_ring_at(ctx, drv.ring_off, shape);
	if (!ring) {
		verbs_err(&ctx->ibv_ctx, "create_cq: the device answered ring_off 0x%llx, not a CQ ring\n",
			  static_cast<unsigned long long>(drv.ring_off));
		ibv_cmd_destroy_cq(&cq->vcq.cq);
		delete cq;
		errno = EPROTO;
		return false;
	}
	cq->consumer = xsrc::CqConsumer(ring, shape, ctx->cq_eager_heads);
	xsrc_channel_pool_refill(ctx, drv.channel_pool_free);
	return true;
}

using create_cq_resp = verbs_drv_buf<ib_uverbs_create_cq_resp, xsrc_create_cq_resp>;
using create_cq_ex_resp = verbs_drv_buf<ib_uverbs_ex_create_cq_resp, xsrc_create_cq_resp>;

// Not CVLAN or FLOW_TAG: they belong to raw packet QPs, which xsrc lacks.
constexpr uint64_t supported_wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
					IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK | IBV_WC_EX_WITH_TM_INFO;
constexpr uint32_t supported_cq_comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
constexpr uint32_t supported_cq_flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;

}  // namespace

namespace {

ibv_cq *cq_create(ibv_context *ibctx, int cqe, ibv_comp_channel *channel, int comp_vector)
{
	xsrc_context *ctx = to_xsrc_ctx(ibctx);
	struct ibv_create_cq cmd{};
	create_cq_resp resp;
	auto *cq = new (std::nothrow) xsrc_cq{};

	if (!cq) {
		verbs_err(&ctx->ibv_ctx, "create_cq: no memory for the CQ\n");
		errno = ENOMEM;
		return nullptr;
	}
	if (int err = ibv_cmd_create_cq(ibctx, cqe, channel, comp_vector, &cq->vcq.cq, &cmd, sizeof(cmd),
					resp.core(), resp.size)) {
		verbs_err(&ctx->ibv_ctx, "create_cq: the device refused cqe %d, comp_vector %d: %s\n", cqe,
			  comp_vector, strerror(err));
		delete cq;
		errno = err;
		return nullptr;
	}
	if (!cq_attach_ring(ctx, cq, resp.driver()))
		return nullptr;
	return &cq->vcq.cq;
}

ibv_cq_ex *cq_create_ex(ibv_context *ibctx, ibv_cq_init_attr_ex *attr)
{
	xsrc_context *ctx = to_xsrc_ctx(ibctx);
	verbs_context *vctx = &ctx->ibv_ctx;
	struct ibv_create_cq_ex cmd{};
	create_cq_ex_resp resp;

	if (attr->wc_flags & ~supported_wc_flags) {
		verbs_err(vctx, "create_cq_ex: wc_flags 0x%llx has unsupported bits 0x%llx\n",
			  static_cast<unsigned long long>(attr->wc_flags),
			  static_cast<unsigned long long>(attr->wc_flags & ~supported_wc_flags));
		errno = EOPNOTSUPP;
		return nullptr;
	}
	if (attr->comp_mask & ~supported_cq_comp_mask) {
		verbs_err(vctx, "create_cq_ex: comp_mask 0x%x has unsupported bits 0x%x\n", attr->comp_mask,
			  attr->comp_mask & ~supported_cq_comp_mask);
		errno = EOPNOTSUPP;
		return nullptr;
	}
	if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (attr->flags & ~supported_cq_flags)) {
		verbs_err(vctx, "create_cq_ex: flags 0x%x have unsupported bits 0x%x\n", attr->flags,
			  attr->flags & ~supported_cq_flags);
		errno = EOPNOTSUPP;
		return nullptr;
	}
	// The ring is the device's: a parent domain gives a CQ its thread domain only.
	xsrc_parent_domain *parent = nullptr;
	if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
		parent = to_xsrc_parent_domain(attr->parent_domain);
		if (!parent || attr->parent_domain->context != ibctx) {
			verbs_err(vctx, "create_cq_ex: IBV_CQ_INIT_ATTR_MASK_PD needs a parent domain of this context\n");
			errno = EINVAL;
			return nullptr;
		}
	}
	auto *cq = new (std::nothrow) xsrc_cq{};
	if (!cq) {
		verbs_err(vctx, "create_cq_ex: no memory for the CQ\n");
		errno = ENOMEM;
		return nullptr;
	}
	if (int err = ibv_cmd_create_cq_ex(ibctx, attr, &cq->vcq, &cmd, sizeof(cmd), resp.core(), resp.size, 0)) {
		verbs_err(vctx, "create_cq_ex: the device refused cqe %u: %s\n", attr->cqe, strerror(err));
		delete cq;
		errno = err;
		return nullptr;
	}
	if (!cq_attach_ring(ctx, cq, resp.driver()))
		return nullptr;
	cq->wc_flags = attr->wc_flags;
	cq->parent_domain = parent;
	if (parent && parent->td)
		cq->poll_lock.waive();
	xsrc_parent_domain_hold(parent);
	cq_set_poll_ops(cq->vcq.cq_ex);
	return &cq->vcq.cq_ex;
}

}  // namespace

ibv_cq *xsrc_create_cq(ibv_context *ibctx, int cqe, ibv_comp_channel *channel, int comp_vector)
{
	return xsrc_boundary(&to_xsrc_ctx(ibctx)->ibv_ctx, "create_cq",
			     [&] { return cq_create(ibctx, cqe, channel, comp_vector); });
}

ibv_cq_ex *xsrc_create_cq_ex(ibv_context *ibctx, ibv_cq_init_attr_ex *attr)
{
	return xsrc_boundary(&to_xsrc_ctx(ibctx)->ibv_ctx, "create_cq_ex", [&] { return cq_create_ex(ibctx, attr); });
}

int xsrc_destroy_cq(ibv_cq *cq)
{
	if (int err = xsrc_destroy_status(to_xsrc_ctx(cq->context), ibv_cmd_destroy_cq(cq))) {
		verbs_err(&to_xsrc_ctx(cq->context)->ibv_ctx, "destroy_cq: the device refused: %s\n", strerror(err));
		return err;
	}
	xsrc_parent_domain_release(to_xsrc_cq(cq)->parent_domain);
	delete to_xsrc_cq(cq);
	return 0;
}

int xsrc_resize_cq(ibv_cq *ibcq, int cqe)
{
	xsrc_cq *cq = to_xsrc_cq(ibcq);
	struct ibv_resize_cq cmd{};
	verbs_drv_buf<ib_uverbs_resize_cq_resp, xsrc_resize_cq_resp> resp;

	std::lock_guard guard(cq->poll_lock);
	// The device counts what is outstanding from the head we published.
	cq->consumer.publish(true);
	if (int err = ibv_cmd_resize_cq(ibcq, cqe, &cmd, sizeof(cmd), resp.core(), resp.size)) {
		verbs_err(&to_xsrc_ctx(ibcq->context)->ibv_ctx, "resize_cq: the device refused cqe %d: %s\n", cqe,
			  strerror(err));
		return err;
	}
	xsrc_context *ctx = to_xsrc_ctx(ibcq->context);
	xsrc::CqShape shape;
	xsrc_cq_ring *ring = cq_ring_at(ctx, resp.driver().ring_off, shape);
	if (ring) {
		// A ring left behind drains first; the same ring has another cqe,
		// and so another pace for its head.
		if (ring != cq->ring())
			cq->old = cq->consumer;
		cq->consumer = xsrc::CqConsumer(ring, shape, ctx->cq_eager_heads);
		cq_update_peek(cq);
	}
	return 0;
}

int xsrc_poll_cq(ibv_cq *ibcq, int num_entries, ibv_wc *wc) noexcept
{
	xsrc_cq *cq = to_xsrc_cq(ibcq);
	if (!cq_poll_begin(cq))
		return 0;
	std::lock_guard guard(cq->poll_lock);
	int n = 0;
	while (n < num_entries && cq_pop_one(cq, wc[n]))
		++n;
	cq_poll_end(cq);
	return n;
}

// Arming is a store the producers see: no command, as on an HCA's doorbell.
// A ring we said arms with its tail in view (revision 11) also looks at the
// completions claimed from our position on but not yet published.
int xsrc_req_notify_cq(ibv_cq *ibcq, int solicited_only)
{
	xsrc_cq *cq = to_xsrc_cq(ibcq);
	xsrc_context *ctx = to_xsrc_ctx(ibcq->context);
	const uint32_t mode = solicited_only ? XSRC_CQ_ARMED_SOLICITED : XSRC_CQ_ARMED_NEXT;
	if (cq_arms_with_tail(ctx)) {
		std::lock_guard guard(cq->poll_lock);
		xsrc_cq_ring *ring = cq->ring();
		if (xsrc::cq_arm(ring, cq->consumer.entries(), mode, cq->consumer.pos()))
			xsrc_context_raise_event(ctx, XSRC_EVENT_CQ_COMPLETION, arena_offset(ctx, ring));
	} else {
		atomic(cq->ring()->armed).store(mode, std::memory_order_seq_cst);
	}
	xsrc_wire_armed(ctx);
	return 0;
}

// As an HCA's provider does when a QP goes back to RESET (libmlx5's
// mlx5_cq_clean): the QP's completions still in the CQ are not reported.
void xsrc_cq_clean(xsrc_cq *cq, xsrc::Qpn qpn) noexcept
{
	std::lock_guard guard(cq->poll_lock);
	try {
		if (xsrc_cq_ring *old = cq->old.ring())
			cq->discards.push_back({old, qpn.value(), atomic(old->tail).load(std::memory_order_acquire)});
		cq->discards.push_back({cq->ring(), qpn.value(), atomic(cq->ring()->tail).load(std::memory_order_acquire)});
	} catch (const std::bad_alloc &) {
		verbs_err(&to_xsrc_ctx(cq->vcq.cq.context)->ibv_ctx,
			  "modify_qp: no memory to drop QP %u's completions at RESET; they stay\n", qpn.value());
	}
}

void xsrc_cq_event(ibv_cq *)
{
}

void xsrc_cq_complete(xsrc_context *ctx, xsrc_cq_ring *ring, uint64_t ring_off, const xsrc_cqe &cqe,
		      xsrc::CqPayload payload) noexcept
{
	if (!ring_off)
		ring_off = arena_offset(ctx, ring);
	// The shape is read from the header, which anyone may write: a ring that
	// says it reaches past the arena gets nothing from us.
	const xsrc::CqShape shape = xsrc::cq_shape(ring);
	if (!xsrc::cq_shape_fits(shape, ctx->arena.size - ring_off))
		return;
	xsrc_cq_complete(ctx, ring, shape, ring_off, cqe, payload);
}

void xsrc_cq_complete(xsrc_context *ctx, xsrc_cq_ring *ring, const xsrc::CqShape &shape, uint64_t ring_off,
		      const xsrc_cqe &cqe, xsrc::CqPayload payload) noexcept
{
	switch (xsrc::cq_push_notify(ring, shape, cqe, payload, xsrc::kUnboundedTries)) {
	case xsrc::CqPushed::full:
		if (xsrc::cq_first_overrun(ring))
			xsrc_context_raise_event(ctx, XSRC_EVENT_CQ_ERR, ring_off);
		break;
	case xsrc::CqPushed::event:
		xsrc_context_raise_event(ctx, XSRC_EVENT_CQ_COMPLETION, ring_off);
		break;
	case xsrc::CqPushed::placed:
		break;
	}
}
