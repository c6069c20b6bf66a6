// Shared receive queues: an SRQ table slot and a receive ring in the arena
// that the owner posts to and initiators in any process consume from. An XRC
// SRQ also names its XRC domain and the CQ its receives complete to: an XRC
// message names the SRQ, which must be of the receive QP's domain. A
// tag-matching SRQ (revision 7) also has a CQ, for its list operations, and
// a tag table after its ring (common/tm_table.h).
#include <algorithm>
#include <cstring>

#include "common/tm_table.h"

#include "dispatcher_handlers.h"
#include "rings.h"
#include "xsrc-abi.h"

namespace xsrc {
namespace {

struct SrqInit {
	uint64_t user_handle = 0;
	uint32_t pd_handle = 0;
	uint32_t max_wr = 0;
	uint32_t max_sge = 0;
	uint32_t srq_type = IBV_SRQT_BASIC;
	uint32_t xrcd_handle = 0;  // XRC only
	uint32_t cq_handle = 0;    // XRC and TM
	uint32_t max_num_tags = 0; // TM only
};

void publish_srq(Context &ctx, const Srq &srq, const Pd &pd, const Cq *cq, const Xrcd *xrcd)
{
	xsrc_srq_entry &e = ctx.device->arena->srq_entry(srq.index);
	e.owner_pid = static_cast<__u32>(ctx.owner);
	e.owner_context = ctx.id;
	e.ring_off = srq.ring_off;
	e.cq_off = cq ? cq->ring_off : 0;
	e.pd_id = pd.pd_id.value();
	e.xrcd_id = xrcd ? xrcd->xrcd_id.value() : 0;
	e.srq_type = srq.srq_type;
	e.reserved = 0;
	store_release<__u32>(e.srqn, srq.srqn().value());  // last: the entry is complete
}

// Shared by CREATE_SRQ and CREATE_XSRQ (basic and XRC SRQs). The SRQ limit
// of the request is ignored, as verbs defines it: a new SRQ is not armed.
int create_srq(Context &ctx, Caller &caller, const Request &req, const SrqInit &init)
{
	Pd *pd = lookup<Pd>(ctx, init.pd_handle);
	if (!pd)
		return refuse(EINVAL, "no such PD handle");
	Xrcd *xrcd = nullptr;
	Cq *cq = nullptr;
	if (init.srq_type == IBV_SRQT_XRC) {
		xrcd = lookup<Xrcd>(ctx, init.xrcd_handle);
		cq = lookup<Cq>(ctx, init.cq_handle);
		if (!xrcd || !cq)
			return refuse(EINVAL, "no such XRC domain or CQ handle");
	}
	if (init.srq_type == IBV_SRQT_TM) {
		cq = lookup<Cq>(ctx, init.cq_handle);
		if (!cq)
			return refuse(EINVAL, "no such CQ handle");
		if (init.max_num_tags == 0 || init.max_num_tags > DeviceLimits::max_num_tags)
			return refuse(EINVAL, "limit: max_num_tags is 0 or over the device's");
	}
	if (init.max_wr == 0 || init.max_wr > DeviceLimits::max_srq_wr || init.max_sge > DeviceLimits::max_sge)
		return refuse(EINVAL, "limit: max_wr is 0 or over max_srq_wr, or max_sge over max_sge");
	if (int err = check_no_driver_data(req))
		return err;
	Device &dev = *ctx.device;
	if (dev.srq_slots.used() >= DeviceLimits::max_srq)
		return refuse(ENOMEM, "limit: max_srq SRQs on the device");
	const RecvShape shape = recv_ring_shape(init.max_wr, init.max_sge);
	uint64_t ring_bytes = recv_ring_bytes(shape);
	// A tagged buffer holds as many SGEs as a receive, and at least one.
	uint32_t tag_sges = std::max(init.max_sge, 1u);
	uint64_t tm_bytes = init.srq_type == IBV_SRQT_TM ? tm_table_bytes(init.max_num_tags, tag_sges) : 0;
	uint64_t ring_off = dev.arena->allocate(ring_bytes + tm_bytes);
	if (!ring_off)
		return refuse(ENOMEM, "arena full");
	xsrc_recv_ring &ring = dev.arena->at<xsrc_recv_ring>(ring_off);
	recv_ring_init(ring, shape, init.max_wr, init.max_sge, ctx.owner);
	if (tm_bytes)
		tm_table_init(dev.arena->at<xsrc_tm_table>(ring_off + ring_bytes), init.max_num_tags, tag_sges);

	Srq srq;
	srq.user_handle = init.user_handle;
	srq.pd_handle = PdHandle(init.pd_handle);
	srq.srq_type = init.srq_type;
	if (xrcd)
		srq.xrcd_handle = init.xrcd_handle;
	if (cq)
		srq.cq_handle = init.cq_handle;
	srq.ring_off = ring_off;
	srq.ring_shape = shape;
	srq.max_wr = init.max_wr;
	srq.max_sge = init.max_sge;
	uint32_t handle;
	if (int err = insert_object(ctx, srq, handle)) {
		dev.arena->release(ring_off);
		return err;
	}
	std::optional<uint32_t> index = dev.srq_slots.allocate({&ctx, ObjHandle(handle)});
	if (!index) {
		erase_object(ctx, handle);
		dev.arena->release(ring_off);
		return refuse(ENOMEM, "limit: the device's SRQ numbers");
	}
	Srq &created = *lookup<Srq>(ctx, handle);
	created.index = *index;
	++pd->use_count;
	if (xrcd)
		++xrcd->use_count;
	if (cq)
		++cq->use_count;

	ib_uverbs_create_srq_resp resp{};
	resp.srq_handle = handle;
	resp.max_wr = created.max_wr;
	resp.max_sge = created.max_sge;
	resp.srqn = created.srqn().value();
	xsrc_create_srq_resp dresp{};
	dresp.ring_off = ring_off;
	if (int err = respond(caller, req, as_bytes_of(resp), as_bytes_of(dresp))) {
		release_srq(ctx, handle);
		return err;
	}
	publish_srq(ctx, created, *pd, cq, xrcd);
	return 0;
}

}  // namespace

int cmd_create_srq(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_create_srq>(req.core);
	return create_srq(ctx, caller, req, {cmd.user_handle, cmd.pd_handle, cmd.max_wr, cmd.max_sge});
}

int cmd_create_xsrq(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_create_xsrq>(req.core);
	SrqInit init{cmd.user_handle, cmd.pd_handle, cmd.max_wr, cmd.max_sge};
	switch (cmd.srq_type) {
	case IBV_SRQT_BASIC:
		break;  // the XRC domain, CQ and tag fields do not apply
	case IBV_SRQT_XRC:
		init.srq_type = IBV_SRQT_XRC;
		init.xrcd_handle = cmd.xrcd_handle;
		init.cq_handle = cmd.cq_handle;
		break;
	case IBV_SRQT_TM:
		if (abi_revision(ctx) < 7)
			return refuse(EOPNOTSUPP, "tag-matching SRQs need driver ABI revision 7");
		init.srq_type = IBV_SRQT_TM;
		init.cq_handle = cmd.cq_handle;
		init.max_num_tags = cmd.max_num_tags;
		break;
	default:
		return refuse(EINVAL, "unknown SRQ type");
	}
	return create_srq(ctx, caller, req, init);
}

// IBV_SRQ_LIMIT arms (or with 0 disarms) the limit event. IBV_SRQ_MAX_WR may
// move the limit of outstanding WQEs within the ring the SRQ was created
// with; a larger ring would have to move under live consumers in other
// processes, so growing beyond it is not supported.
int cmd_modify_srq(Context &ctx, Caller &, const Request &req)
{
	auto cmd = load<ib_uverbs_modify_srq>(req.core);
	Srq *srq = lookup<Srq>(ctx, cmd.srq_handle);
	if (!srq)
		return refuse(EINVAL, "no such SRQ handle");
	if (cmd.attr_mask & ~static_cast<uint32_t>(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))
		return refuse(EINVAL, "unknown attr_mask bits");
	if (int err = check_no_driver_data(req))
		return err;
	xsrc_recv_ring &ring = ctx.device->arena->at<xsrc_recv_ring>(srq->ring_off);
	uint32_t max_wr = srq->max_wr;
	if (cmd.attr_mask & IBV_SRQ_MAX_WR) {
		if (cmd.max_wr == 0 || cmd.max_wr > DeviceLimits::max_srq_wr)
			return refuse(EINVAL, "limit: max_wr is 0 or over max_srq_wr");
		if (recv_ring_entries(cmd.max_wr) > srq->ring_shape.entries)  // keep the ring's slack
			return refuse(EOPNOTSUPP, "max_wr past the ring: an SRQ does not grow");
		if (cmd.max_wr < recv_ring_pending(ring))
			return refuse(EINVAL, "max_wr below the receives pending");
		max_wr = cmd.max_wr;
	}
	if ((cmd.attr_mask & IBV_SRQ_LIMIT) && cmd.srq_limit > max_wr)
		return refuse(EINVAL, "srq_limit over max_wr");

	if (cmd.attr_mask & IBV_SRQ_MAX_WR) {
		srq->max_wr = max_wr;
		store_release<__u32>(ring.max_wr, max_wr);
	}
	if (cmd.attr_mask & IBV_SRQ_LIMIT)
		store_release<__u32>(ring.srq_limit, cmd.srq_limit);
	return 0;
}

int cmd_query_srq(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_query_srq>(req.core);
	Srq *srq = lookup<Srq>(ctx, cmd.srq_handle);
	if (!srq)
		return refuse(EINVAL, "no such SRQ handle");
	if (int err = check_no_driver_data(req))
		return err;
	xsrc_recv_ring &ring = ctx.device->arena->at<xsrc_recv_ring>(srq->ring_off);
	ib_uverbs_query_srq_resp resp{};
	resp.max_wr = srq->max_wr;
	resp.max_sge = srq->max_sge;
	resp.srq_limit = load_acquire(ring.srq_limit);
	return respond(caller, req, as_bytes_of(resp));
}

void release_srq(Context &ctx, uint32_t handle)
{
	Srq *srq = lookup<Srq>(ctx, handle);
	if (!srq)
		return;
	if (Device *dev = ctx.device) {
		xsrc_srq_entry &e = dev->arena->srq_entry(srq->index);
		store_release<__u32>(e.srqn, 0);  // first: peers stop using it
		std::memset(reinterpret_cast<unsigned char *>(&e) + sizeof(e.srqn), 0, sizeof(e) - sizeof(e.srqn));
		dev->arena->release(srq->ring_off);
		dev->srq_slots.release(srq->index);
	}
	if (Pd *pd = lookup<Pd>(ctx, srq->pd_handle))
		--pd->use_count;
	if (srq->xrcd_handle)
		if (Xrcd *xrcd = lookup<Xrcd>(ctx, *srq->xrcd_handle))
			--xrcd->use_count;
	if (srq->cq_handle)
		if (Cq *cq = lookup<Cq>(ctx, *srq->cq_handle))
			--cq->use_count;
	erase_object(ctx, handle);
}

int cmd_destroy_srq(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_destroy_srq>(req.core);
	Srq *srq = lookup<Srq>(ctx, cmd.srq_handle);
	if (!srq)
		return refuse(EINVAL, "no such SRQ handle");
	if (srq->use_count)
		return refuse(EBUSY, "still in use");
	ib_uverbs_destroy_srq_resp resp{};
	resp.events_reported = srq->events_reported -
		reclaim_unread_async_events(ctx, srq->user_handle, srq->events_reported);
	if (int err = respond(caller, req, as_bytes_of(resp)))
		return err;
	release_srq(ctx, cmd.srq_handle);
	return 0;
}

}  // namespace xsrc
