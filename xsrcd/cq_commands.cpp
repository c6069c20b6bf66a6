// Completion queues: each one is a ring in the arena that any process
// completing work on the CQ's QPs writes into and the owner polls.
#include <algorithm>

#include "dispatcher_handlers.h"
#include "rings.h"
#include "xsrc-abi.h"

namespace xsrc {
namespace {

// Big payload slots (revision 5): as many as the CQ has entries (a sender
// runs ahead of a receiver by up to its receive queue), in 64s, at most
// XSRC_CQ_BIG_SLOTS: up to a MiB of arena per CQ (only the pages a payload
// touched cost memory). A CQ gets them while most of the arena is free, so
// that many small CQs still fit; one without them works, with a system call
// per medium message.
uint32_t cq_big_slots(const Context &ctx, const Arena &arena, uint32_t cqe, uint32_t entries)
{
	if (abi_revision(ctx) < 5)
		return 0;
	uint32_t slots = std::min<uint32_t>((std::max<uint32_t>(cqe, 1) + 63) / 64 * 64, XSRC_CQ_BIG_SLOTS);
	uint64_t free_bytes = arena.free_pages() * kArenaPage;
	if (free_bytes < XSRC_ARENA_SIZE / 2 + cq_ring_bytes(entries, slots))
		return 0;
	return slots;
}

// A new ring of `entries` for `cqe`, initialised; 0 when the arena is full.
uint64_t create_cq_ring(Context &ctx, uint32_t cqe, uint32_t entries)
{
	Arena &arena = *ctx.device->arena;
	uint32_t big_slots = cq_big_slots(ctx, arena, cqe, entries);
	uint64_t off = arena.allocate(cq_ring_bytes(entries, big_slots));
	if (off)
		cq_ring_init(arena.at<xsrc_cq_ring>(off), entries, cqe, ctx.owner, big_slots);
	return off;
}

// Shared by CREATE_CQ and EX_CREATE_CQ.
int create_cq(Context &ctx, Caller &caller, const Request &req, uint64_t user_handle,
	      uint32_t cqe, uint32_t comp_vector, int32_t comp_channel, bool extended)
{
	if (cqe == 0 || cqe > DeviceLimits::max_cqe)
		return refuse(EINVAL, "limit: cqe is 0 or over max_cqe");
	if (comp_vector >= DeviceLimits::num_comp_vectors)
		return refuse(EINVAL, "no such completion vector");
	if (comp_channel >= 0 && !ctx.channels.count(comp_channel))
		return refuse(EINVAL, "no such completion channel");
	if (comp_channel < -1)
		return refuse(EINVAL, "bad completion channel fd");
	if (int err = check_no_driver_data(req))
		return err;
	if (device_object_count<Cq>(*ctx.device) >= DeviceLimits::max_cq)
		return refuse(ENOMEM, "limit: max_cq CQs on the device");
	const uint32_t entries = cq_ring_entries(cqe);
	uint64_t ring_off = create_cq_ring(ctx, cqe, entries);
	if (!ring_off)
		return refuse(ENOMEM, "arena full");

	Cq cq{};
	cq.user_handle = user_handle;
	cq.cqe = cqe;
	cq.channel_fd = comp_channel;
	cq.ring_off = ring_off;
	cq.ring_entries = entries;
	ib_uverbs_ex_create_cq_resp resp{};
	if (int err = insert_object(ctx, std::move(cq), resp.base.cq_handle)) {
		ctx.device->arena->release(ring_off);
		return err;
	}
	ctx.device->cqs_by_ring[ring_off] = {&ctx, ObjHandle(resp.base.cq_handle)};

	resp.base.cqe = cqe;
	xsrc_create_cq_resp dresp{};
	dresp.channel_pool_free = static_cast<uint32_t>(ctx.channel_pool.size());
	dresp.ring_off = ring_off;
	int err;
	if (extended) {
		resp.response_length = sizeof(resp);
		err = respond(caller, req, as_bytes_of(resp), as_bytes_of(dresp));
	} else {
		err = respond(caller, req, as_bytes_of(resp.base), as_bytes_of(dresp));
	}
	if (err)
		release_cq(ctx, resp.base.cq_handle);
	return err;
}

// Points every QP and XRC SRQ completing into the CQ at its new ring.
void repoint_queues(Context &ctx, uint32_t cq_handle, uint64_t ring_off)
{
	Arena &arena = *ctx.device->arena;
	for (auto &[handle, obj] : ctx.objects) {
		if (Qp *qp = std::get_if<Qp>(&obj)) {
			xsrc_qp_entry &e = arena.qp_entry(qp->index);
			if (qp->send_cq_handle == cq_handle)
				store_release<__u64>(e.send_cq_off, ring_off);
			if (qp->recv_cq_handle == cq_handle)
				store_release<__u64>(e.recv_cq_off, ring_off);
		} else if (Srq *srq = std::get_if<Srq>(&obj); srq && srq->cq_handle == cq_handle) {
			store_release<__u64>(arena.srq_entry(srq->index).cq_off, ring_off);
		}
	}
}

}  // namespace

int cmd_create_cq(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_create_cq>(req.core);
	if (cmd.reserved)
		return refuse(EINVAL, "non-zero reserved field");
	return create_cq(ctx, caller, req, cmd.user_handle, cmd.cqe, cmd.comp_vector,
			 cmd.comp_channel, false);
}

int cmd_ex_create_cq(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_ex_create_cq>(req.core);
	if (cmd.comp_mask || cmd.reserved)
		return refuse(EINVAL, "non-zero comp_mask or reserved field");
	// Timestamps are the provider's (it stamps what it polls): nothing to keep here.
	constexpr uint32_t known_flags = IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION | IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN;
	if (cmd.flags & ~known_flags)
		return refuse(EOPNOTSUPP, "unknown CQ flags");
	return create_cq(ctx, caller, req, cmd.user_handle, cmd.cqe, cmd.comp_vector,
			 cmd.comp_channel, true);
}

// A CQ that still fits its ring just changes its limit; a larger one gets a
// new ring, and the old one stays until the CQ is destroyed so that the
// owner can drain it.
int cmd_resize_cq(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_resize_cq>(req.core);
	if (int err = check_no_driver_data(req))
		return err;
	Cq *cq = lookup<Cq>(ctx, cmd.cq_handle);
	if (!cq)
		return refuse(EINVAL, "no such CQ handle");
	if (cmd.cqe == 0 || cmd.cqe > DeviceLimits::max_cqe)
		return refuse(EINVAL, "limit: cqe is 0 or over max_cqe");
	Arena &arena = *ctx.device->arena;
	xsrc_cq_ring &ring = arena.at<xsrc_cq_ring>(cq->ring_off);
	// Would drop completions the owner has not polled.
	if (cmd.cqe < cq_ring_pending(ring))
		return refuse(EINVAL, "fewer entries than completions pending");
	bool moves = uint64_t(cmd.cqe) + 1 > cq->ring_entries;
	const uint32_t entries = moves ? cq_ring_entries(cmd.cqe) : cq->ring_entries;
	uint64_t new_off = moves ? create_cq_ring(ctx, cmd.cqe, entries) : cq->ring_off;
	if (!new_off)
		return refuse(ENOMEM, "arena full");

	ib_uverbs_resize_cq_resp resp{};
	resp.cqe = cmd.cqe;
	xsrc_resize_cq_resp dresp{};
	dresp.ring_off = new_off;
	if (int err = respond(caller, req, as_bytes_of(resp), as_bytes_of(dresp))) {
		if (moves)
			arena.release(new_off);
		return err;
	}
	cq->cqe = cmd.cqe;
	if (!moves) {
		store_release<__u32>(ring.cqe, cmd.cqe);
		return 0;
	}
	xsrc_cq_ring &new_ring = arena.at<xsrc_cq_ring>(new_off);
	store_release<__u32>(new_ring.armed, load_acquire(ring.armed));
	cq->retired_rings.push_back({cq->ring_off, cq->ring_entries});
	cq->ring_off = new_off;
	cq->ring_entries = entries;
	ctx.device->cqs_by_ring[new_off] = {&ctx, ObjHandle(cmd.cq_handle)};
	repoint_queues(ctx, cmd.cq_handle, new_off);
	return 0;
}

void release_cq(Context &ctx, uint32_t handle)
{
	Cq *cq = lookup<Cq>(ctx, handle);
	if (!cq)
		return;
	if (Device *dev = ctx.device) {
		cq->retired_rings.push_back({cq->ring_off, cq->ring_entries});
		for (const Cq::Retired &r : cq->retired_rings) {
			dev->cqs_by_ring.erase(r.off);
			dev->arena->release(r.off);
		}
	}
	erase_object(ctx, handle);
}

int cmd_destroy_cq(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_destroy_cq>(req.core);
	Cq *cq = lookup<Cq>(ctx, cmd.cq_handle);
	if (!cq)
		return refuse(EINVAL, "no such CQ handle");
	if (cq->use_count)
		return refuse(EBUSY, "still in use");
	ib_uverbs_destroy_cq_resp resp{};
	// libibverbs waits until the application acked this many events, and
	// the kernel counts an event when it is read: take back the unread ones.
	resp.comp_events_reported = cq->comp_events_reported - reclaim_unread_events(ctx, *cq);
	resp.async_events_reported = cq->async_events_reported -
		reclaim_unread_async_events(ctx, cq->user_handle, cq->async_events_reported);
	if (int err = respond(caller, req, as_bytes_of(resp)))
		return err;
	release_cq(ctx, cmd.cq_handle);
	return 0;
}

// The provider usually arms the ring itself; this is the same through the daemon.
int cmd_req_notify_cq(Context &ctx, Caller &, const Request &req)
{
	auto cmd = load<ib_uverbs_req_notify_cq>(req.core);
	Cq *cq = lookup<Cq>(ctx, cmd.cq_handle);
	if (!cq)
		return refuse(EINVAL, "no such CQ handle");
	xsrc_cq_ring &ring = ctx.device->arena->at<xsrc_cq_ring>(cq->ring_off);
	uint32_t mode = cmd.solicited_only ? XSRC_CQ_ARMED_SOLICITED : XSRC_CQ_ARMED_NEXT;
	// A consumer that arms with the tail in view (revision 11) has producers
	// that rely on it; the published head is at or behind its position. The
	// slots are those of the ring we made (its header is anyone's to write).
	if (cq_arm_sees_tail(&ring)) {
		if (cq_arm(&ring, cq->ring_entries, mode, load_acquire(ring.head)))
			post_completion_event(ctx, *cq);
		return 0;
	}
	atomic(ring.armed).store(mode, std::memory_order_seq_cst);
	return 0;
}

}  // namespace xsrc
