// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Verbs tag matching: the owner of a TM-SRQ adds, removes and syncs tagged
// buffers in the SRQ's tag table (ibv_post_srq_ops); an initiator matches a
// message against it. Both under the table's lock, which makes the table the
// SRQ's one serialisation point as a TM-SRQ is in an HCA.
#include "tm.h"

#include "xsrc.h"

#include <algorithm>
#include <optional>

#include "common/tm_table.h"

namespace {

using xsrc::TmLock;

// Whether the owner's count of unexpected messages is the device's: entries
// added out of phase become matchable when it is.
void tm_promote_if_in_phase(xsrc_tm_table *table)
{
	if (table->sw_count != table->unexpected)
		return;
	for (uint32_t i = 0; i < table->num_tags; ++i) {
		xsrc_tm_entry *e = xsrc::tm_entry_at(table, i);
		if (e->state == XSRC_TM_STALE)
			e->state = XSRC_TM_POSTED;
	}
}

xsrc_tm_entry *tm_free_entry(xsrc_tm_table *table, uint32_t &index)
{
	for (uint32_t i = 0; i < table->num_tags; ++i) {
		xsrc_tm_entry *e = xsrc::tm_entry_at(table, i);
		if (e->state == XSRC_TM_FREE) {
			index = i;
			return e;
		}
	}
	return nullptr;
}

xsrc_cqe tm_op_cqe(const ibv_ops_wr *wr, ibv_wc_opcode opcode, ibv_wc_status status)
{
	xsrc_cqe c = xsrc_make_cqe(wr->wr_id, status, opcode, xsrc::Qpn(0));
	return c;
}

// One list operation. Returns 0 or an errno (the operation did nothing);
// `cqe` is set when it completes (signalled, or failed in the table).
int tm_op(xsrc_context *ctx, xsrc_srq *srq, ibv_ops_wr *wr, std::optional<xsrc_cqe> &cqe)
{
	verbs_context *vctx = &ctx->ibv_ctx;
	xsrc_tm_table *table = srq->tm;
	bool signaled = wr->flags & IBV_OPS_SIGNALED;
	if (wr->flags & ~static_cast<int>(IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC)) {
		verbs_debug(vctx, "post_srq_ops: SRQ %u: flags 0x%x has unknown bits\n", srq->srqn.value(), wr->flags);
		return EINVAL;
	}
	switch (wr->opcode) {
	case IBV_WR_TAG_ADD:
		if (wr->tm.add.num_sge < 0 || static_cast<uint32_t>(wr->tm.add.num_sge) > table->max_sge) {
			verbs_debug(vctx, "post_srq_ops: SRQ %u: num_sge %d exceeds the tagged buffer's %u\n",
				    srq->srqn.value(), wr->tm.add.num_sge, table->max_sge);
			return EINVAL;
		}
		break;
	case IBV_WR_TAG_DEL:
		if ((wr->tm.handle & xsrc::kTmHandleIndexMask) >= table->num_tags) {
			verbs_debug(vctx, "post_srq_ops: SRQ %u: handle 0x%x names no entry\n", srq->srqn.value(),
				    wr->tm.handle);
			return EINVAL;
		}
		break;
	case IBV_WR_TAG_SYNC:
		break;
	default:
		verbs_debug(vctx, "post_srq_ops: SRQ %u: unknown opcode %d\n", srq->srqn.value(), wr->opcode);
		return EINVAL;
	}

	TmLock lock(*table, static_cast<uint32_t>(ctx->pid), ctx->direct);
	if (wr->flags & IBV_OPS_TM_SYNC)
		table->sw_count = wr->tm.unexpected_cnt;
	tm_promote_if_in_phase(table);
	switch (wr->opcode) {
	case IBV_WR_TAG_ADD: {
		uint32_t index = 0;
		xsrc_tm_entry *e = tm_free_entry(table, index);
		if (!e) {
			verbs_debug(vctx, "post_srq_ops: SRQ %u: the tag list is full (max_num_tags %u)\n",
				    srq->srqn.value(), table->num_tags);
			return ENOMEM;
		}
		e->num_sge = static_cast<uint32_t>(wr->tm.add.num_sge);
		for (uint32_t i = 0; i < e->num_sge; ++i) {
			const ibv_sge &s = wr->tm.add.sg_list[i];
			xsrc::tm_entry_sges(e)[i] = {s.addr, s.length, s.lkey};
		}
		e->tag = wr->tm.add.tag;
		e->mask = wr->tm.add.mask;
		e->wr_id = wr->tm.add.recv_wr_id;
		e->order = table->next_order++;
		e->generation = (e->generation + 1) & xsrc::kTmHandleIndexMask;
		bool in_phase = table->sw_count == table->unexpected;
		e->state = in_phase ? XSRC_TM_POSTED : XSRC_TM_STALE;
		wr->tm.handle = xsrc::tm_handle(index, e->generation);
		if (signaled) {
			cqe = tm_op_cqe(wr, IBV_WC_TM_ADD, IBV_WC_SUCCESS);
			if (!in_phase)  // it matches nothing until the owner syncs
				cqe->wc_flags |= IBV_WC_TM_SYNC_REQ;
		}
		return 0;
	}
	case IBV_WR_TAG_DEL: {
		uint32_t index = wr->tm.handle & xsrc::kTmHandleIndexMask;
		xsrc_tm_entry *e = xsrc::tm_entry_at(table, index);
		bool present = e->state != XSRC_TM_FREE &&
			       e->generation == wr->tm.handle >> xsrc::kTmHandleGenerationShift;
		if (present)
			e->state = XSRC_TM_FREE;
		else  // consumed by a message meanwhile, or removed before
			verbs_debug(vctx, "post_srq_ops: SRQ %u: handle 0x%x: no such tag in the list\n",
				    srq->srqn.value(), wr->tm.handle);
		// A failed removal always completes: the owner must learn the tag
		// was consumed (its TM_RECV completion is on the way, or polled).
		if (signaled || !present)
			cqe = tm_op_cqe(wr, IBV_WC_TM_DEL, present ? IBV_WC_SUCCESS : IBV_WC_TM_ERR);
		return 0;
	}
	default:  // IBV_WR_TAG_SYNC
		if (signaled)
			cqe = tm_op_cqe(wr, IBV_WC_TM_SYNC, IBV_WC_SUCCESS);
		return 0;
	}
}

}  // namespace

xsrc_tm_table *xsrc_tm_table_of(const xsrc::Arena &arena, uint64_t ring_off) noexcept
{
	auto *ring = arena.at<xsrc_recv_ring>(ring_off);
	if (!ring || !ring->num_entries)
		return nullptr;
	uint64_t off = xsrc::tm_table_offset(ring_off, *ring);
	if (off >= arena.size)
		return nullptr;
	auto *table = arena.at<xsrc_tm_table>(off);
	return table && xsrc::tm_table_sane(*table, arena.size - off) ? table : nullptr;
}

xsrc_tm_outcome xsrc_tm_match(xsrc_tm_table *table, xsrc_recv_ring *ring, const xsrc::RecvShape &shape, uint64_t tag,
			      uint32_t me, bool direct, xsrc::RecvWqe &out) noexcept
{
	TmLock lock(*table, me, direct);
	xsrc_tm_entry *best = nullptr;
	for (uint32_t i = 0; i < table->num_tags; ++i) {
		xsrc_tm_entry *e = xsrc::tm_entry_at(table, i);
		if (e->state == XSRC_TM_POSTED && (tag & e->mask) == (e->tag & e->mask) &&
		    (!best || e->order < best->order))
			best = e;
	}
	if (best) {
		out.wr_id = best->wr_id;
		out.num_sge = std::min<uint32_t>(best->num_sge, table->max_sge);
		std::copy_n(xsrc::tm_entry_sges(best), out.num_sge, out.sge);
		best->state = XSRC_TM_FREE;
		return xsrc_tm_outcome::matched;
	}
	if (!ring || !xsrc::recv_pop(ring, shape, out))
		return xsrc_tm_outcome::no_receive;
	++table->unexpected;
	return xsrc_tm_outcome::unexpected;
}

int xsrc_post_srq_ops(ibv_srq *ibsrq, ibv_ops_wr *wr, ibv_ops_wr **bad_wr) noexcept
{
	xsrc_srq *srq = to_xsrc_srq(ibsrq);
	xsrc_context *ctx = to_xsrc_ctx(ibsrq->context);
	if (!srq->tm) {
		verbs_debug(&ctx->ibv_ctx, "post_srq_ops: SRQ %u is not a tag-matching SRQ\n", srq->srqn.value());
		*bad_wr = wr;
		return EINVAL;
	}
	if (xsrc_device_gone(ctx)) {
		*bad_wr = wr;
		return EIO;
	}
	std::lock_guard guard(srq->post_lock);
	for (; wr; wr = wr->next) {
		std::optional<xsrc_cqe> cqe;
		if (int err = tm_op(ctx, srq, wr, cqe)) {
			*bad_wr = wr;
			return err;
		}
		if (cqe)
			xsrc_cq_complete(ctx, srq->tm_cq->ring(), 0, *cqe);
	}
	return 0;
}
