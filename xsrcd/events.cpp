// Events: completion events to a CQ's channel pipe, async events to the
// owner's async pipe, each counted when delivered; libibverbs waits at destroy
// time for the application to acknowledge exactly as many as it *read*, so
// destroy takes back the object's unread events (reclaim_unread_*); and
// XSRC_CMD_RAISE_EVENT, through which the data path in any process of the
// device asks for them.
#include <sys/uio.h>
#include <unistd.h>

#include "dispatcher_handlers.h"
#include "rings.h"
#include "xsrc-abi.h"

namespace xsrc {
namespace {

// An object of some context of the device, found by a device-wide number.
template <typename T>
struct Found {
	Context *owner = nullptr;
	T *object = nullptr;
	explicit operator bool() const { return object != nullptr; }
};

template <typename T>
Found<T> resolve(ObjectRef ref)
{
	if (!ref)
		return {};
	return {ref.ctx, lookup<T>(*ref.ctx, ref.handle)};
}

Found<Cq> find_cq_by_ring(Device &dev, uint64_t ring_off)
{
	auto it = dev.cqs_by_ring.find(ring_off);
	return it == dev.cqs_by_ring.end() ? Found<Cq>{} : resolve<Cq>(it->second);
}

Found<Qp> find_qp(Device &dev, uint64_t qpn)
{
	return qpn < XSRC_QPN_BASE ? Found<Qp>{} : resolve<Qp>(dev.qp_slots.find(qpn - XSRC_QPN_BASE));
}

Found<Srq> find_srq(Device &dev, uint64_t srqn)
{
	return srqn < XSRC_SRQN_BASE ? Found<Srq>{} : resolve<Srq>(dev.srq_slots.find(srqn - XSRC_SRQN_BASE));
}

int raise_cq_event(Device &dev, uint64_t ring_off, bool completion)
{
	Found<Cq> cq = find_cq_by_ring(dev, ring_off);
	if (!cq)
		return refuse(EINVAL, "no CQ with that ring");
	if (completion)
		post_completion_event(*cq.owner, *cq.object);
	else
		post_cq_event(*cq.owner, *cq.object, IBV_EVENT_CQ_ERR);
	return 0;
}

// The limit is disarmed as it fires: one event per arming.
int raise_srq_limit(Device &dev, uint64_t srqn)
{
	Found<Srq> srq = find_srq(dev, srqn);
	if (!srq)
		return refuse(EINVAL, "no SRQ with that number");
	store_release<__u32>(dev.arena->at<xsrc_recv_ring>(srq.object->ring_off).srq_limit, 0);
	post_srq_event(*srq.owner, *srq.object, IBV_EVENT_SRQ_LIMIT_REACHED);
	return 0;
}

int raise_qp_event(Device &dev, uint64_t qpn, uint32_t kind)
{
	Found<Qp> qp = find_qp(dev, qpn);
	// A QP in RESET does no work that could fail.
	if (!qp || qp_current_state(dev, *qp.object) == IBV_QPS_RESET)
		return refuse(EINVAL, "no QP with that number, or a QP in RESET");
	if (kind == XSRC_EVENT_QP_FATAL) {
		qp_enter_error(*qp.owner, *qp.object);
		post_qp_event(*qp.owner, *qp.object, IBV_EVENT_QP_FATAL);
	}
	qp_report_last_wqe(*qp.owner, *qp.object);
	return 0;
}

}  // namespace

// A shared XRC receive QP's events go to every handle on it, each with its
// own user handle and count, as the kernel's shared-QP event handler hands
// them to every opened QP.
void post_qp_event(Context &owner, Qp &qp, ibv_event_type type)
{
	if (qp.shared) {
		for (const ObjectRef &ref : qp.shared->holders)
			if (Qp *held = lookup<Qp>(*ref.ctx, ref.handle))
				if (ref.ctx->post_async_event(held->user_handle, type))
					++held->events_reported;
		return;
	}
	if (owner.post_async_event(qp.user_handle, type))
		++qp.events_reported;
}

void post_srq_event(Context &owner, Srq &srq, ibv_event_type type)
{
	if (owner.post_async_event(srq.user_handle, type))
		++srq.events_reported;
}

void post_cq_event(Context &owner, Cq &cq, ibv_event_type type)
{
	if (owner.post_async_event(cq.user_handle, type))
		++cq.async_events_reported;
}

void post_completion_event(Context &owner, Cq &cq)
{
	auto channel = owner.channels.find(cq.channel_fd);
	if (cq.channel_fd < 0 || channel == owner.channels.end())
		return;  // no channel: nobody waits for events
	ib_uverbs_comp_event_desc ev{};
	ev.cq_handle = cq.user_handle;
	if (write(channel->second.wr.get(), &ev, sizeof(ev)) == sizeof(ev))
		++cq.comp_events_reported;
}

namespace {

// Reads every event queued in a pipe without blocking (RWF_NOWAIT: the read
// end's O_NONBLOCK is the application's to set), keeps those `is_mine` picks
// and writes the others back. Returns how many it kept.
template <typename Event, typename Pred>
uint32_t reclaim(const unique_fd &rd, const unique_fd &wr, Pred is_mine)
{
	if (!rd || !wr)
		return 0;
	std::vector<Event> others;
	uint32_t mine = 0;
	for (;;) {
		Event ev;
		iovec iov{&ev, sizeof(ev)};
		if (preadv2(rd.get(), &iov, 1, -1, RWF_NOWAIT) != sizeof(ev))
			break;
		if (is_mine(ev))
			++mine;
		else
			others.push_back(ev);
	}
	for (const auto &ev : others)
		if (write(wr.get(), &ev, sizeof(ev)) != sizeof(ev))
			break;
	return mine;
}

}  // namespace

uint32_t reclaim_unread_events(Context &owner, Cq &cq)
{
	auto channel = owner.channels.find(cq.channel_fd);
	if (cq.channel_fd < 0 || channel == owner.channels.end())
		return 0;
	uint32_t mine = reclaim<ib_uverbs_comp_event_desc>(
		channel->second.rd, channel->second.wr,
		[&](const ib_uverbs_comp_event_desc &ev) { return ev.cq_handle == cq.user_handle; });
	return std::min(mine, cq.comp_events_reported);
}

uint32_t reclaim_unread_async_events(Context &owner, uint64_t user_handle, uint32_t reported)
{
	uint32_t mine = reclaim<ib_uverbs_async_event_desc>(
		owner.async_rd, owner.async_wr,
		[&](const ib_uverbs_async_event_desc &ev) {
			// Port and device events carry a port number, not an object.
			return ev.element == user_handle && ev.event_type != IBV_EVENT_PORT_ACTIVE &&
			       ev.event_type != IBV_EVENT_PORT_ERR && ev.event_type != IBV_EVENT_GID_CHANGE &&
			       ev.event_type != IBV_EVENT_DEVICE_FATAL;
		});
	return std::min(mine, reported);
}

int cmd_raise_event(Context &ctx, Caller &, const Request &req)
{
	auto cmd = load<xsrc_raise_event>(req.core);
	if (cmd.reserved)
		return refuse(EINVAL, "non-zero reserved field");
	if (int err = check_no_driver_data(req))
		return err;
	Device &dev = *ctx.device;
	switch (cmd.kind) {
	case XSRC_EVENT_CQ_COMPLETION:
		return raise_cq_event(dev, cmd.object, true);
	case XSRC_EVENT_CQ_ERR:
		return raise_cq_event(dev, cmd.object, false);
	case XSRC_EVENT_SRQ_LIMIT:
		return raise_srq_limit(dev, cmd.object);
	case XSRC_EVENT_QP_FATAL:
	case XSRC_EVENT_QP_LAST_WQE:
		return raise_qp_event(dev, cmd.object, cmd.kind);
	default:
		return refuse(EINVAL, "unknown event kind");
	}
}

}  // namespace xsrc
