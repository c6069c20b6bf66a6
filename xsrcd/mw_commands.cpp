// Memory windows (driver ABI revision 4): ALLOC_MW / DEALLOC_MW, and the
// private XSRC_CMD_BIND_MW / XSRC_CMD_INVALIDATE a provider issues when a
// bind, LOCAL_INV or SEND_WITH_INV work request executes. Every decision is
// taken on the daemon's own records (window, MR, QP, PDs), never on the
// arena; a bound window is then published in the arena's MR table at its own
// index, where every rkey check of the data path (and XSRC_CMD_COPY) finds
// it. The checks are the IBTA's as rxe applies them (rxe_mw.c).
#include "dispatcher_handlers.h"
#include "rings.h"
#include "xsrc-abi.h"

namespace xsrc {
namespace {

// What a window may grant (IBTA 10.6.7.2: its rights, and zero-based addressing).
constexpr uint32_t kWindowAccess = IB_UVERBS_ACCESS_LOCAL_WRITE | IB_UVERBS_ACCESS_REMOTE_WRITE |
				   IB_UVERBS_ACCESS_REMOTE_READ | IB_UVERBS_ACCESS_REMOTE_ATOMIC |
				   IB_UVERBS_ACCESS_ZERO_BASED;

PdId pd_id_of(Context &ctx, PdHandle handle)
{
	const Pd *pd = lookup<Pd>(ctx, handle);
	return pd ? pd->pd_id : PdId();
}

PdId qp_pd_id(Context &ctx, const Qp &qp)
{
	return qp.pd_handle ? pd_id_of(ctx, *qp.pd_handle) : PdId();
}

void publish_window(Context &ctx, const Mw &mw, PdId pd_id)
{
	xsrc_mr_entry &e = ctx.device->arena->mr_entry(mw.index());
	store_release<__u32>(e.key, 0);  // first: the old binding stops at once
	e.pd_id = pd_id.value();
	e.access = mw.access;
	e.owner_pid = static_cast<__u32>(ctx.owner);
	e.addr = mw.addr;
	e.length = mw.length;
	e.iova = mw.iova;
	e.mw_type = mw.type;
	e.bound_qpn = mw.type == IBV_MW_TYPE_2 ? mw.qpn.value() : 0;
	store_release<__u32>(e.key, mw.rkey.value());  // last: the entry is complete
}

// Takes the window's binding away: no access passes its rkey any more.
void unbind(Device &dev, Mw &mw)
{
	if (!mw.bound())
		return;
	xsrc_mr_entry &e = dev.arena->mr_entry(mw.index());
	store_release<__u32>(e.key, 0);
	e = xsrc_mr_entry{};
	mw.mr_index = 0;
	mw.qpn = Qpn();
	mw.addr = mw.iova = mw.length = 0;
	mw.access = 0;
}

// Why the bind of `mw` to `mr` over [addr, addr + length) with `access`
// through `qp` is refused (nullptr: it is not). Type 1 with length 0 unbinds.
const char *bind_refusal(Context &ctx, const Qp &qp, const Mw &mw, const Mr *mr, const xsrc_bind_mw &cmd)
{
	PdId mw_pd = pd_id_of(ctx, mw.pd_handle);
	if (qp.qp_type != IBV_QPT_RC && qp.qp_type != IBV_QPT_UC && qp.qp_type != IBV_QPT_XRC_SEND)
		return "the QP type has no bind";
	if ((cmd.rkey >> 8) != mw.index())
		return "the new rkey is not the window's (index bits differ)";
	if (cmd.access & ~kWindowAccess)
		return "access flags a window cannot grant";
	// C10-72 and the type 1 bind verb: the QP, the window and the MR share a PD.
	if (qp_pd_id(ctx, qp) != mw_pd)
		return "the QP's PD is not the window's";
	if (mw.type == IBV_MW_TYPE_1 && (cmd.access & IB_UVERBS_ACCESS_ZERO_BASED))
		return "a type 1 window cannot be zero based (o10-36.2.2)";
	if (mw.type == IBV_MW_TYPE_2 && mw.bound())
		return "a bound type 2 window must be invalidated first (o10-37.2.30)";
	if (mw.type == IBV_MW_TYPE_2 && (!mr || cmd.length == 0))
		return "a type 2 window cannot be unbound by a bind (o10-37.2.40)";
	if (cmd.length == 0)
		return nullptr;
	if (!mr)
		return "no such MR handle";
	if (pd_id_of(ctx, mr->pd_handle) != mw_pd)
		return "the MR's PD is not the window's";
	if (mr->access & IB_UVERBS_ACCESS_ZERO_BASED)
		return "the MR is zero based";
	if (!(mr->access & IB_UVERBS_ACCESS_MW_BIND))
		return "the MR was registered without IBV_ACCESS_MW_BIND (C10-73)";
	if ((cmd.access & (IB_UVERBS_ACCESS_REMOTE_WRITE | IB_UVERBS_ACCESS_REMOTE_ATOMIC)) &&
	    !(mr->access & IB_UVERBS_ACCESS_LOCAL_WRITE))
		return "remote write or atomic rights on an MR without local write (C10-74)";
	if (cmd.addr + cmd.length < cmd.addr || cmd.addr < mr->iova || cmd.length > mr->length ||
	    cmd.addr - mr->iova > mr->length - cmd.length)
		return "the range is not inside the MR (C10-75)";
	return nullptr;
}

}  // namespace

int cmd_alloc_mw(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_alloc_mw>(req.core);
	if (int err = check_no_driver_data(req))
		return err;
	Pd *pd = lookup<Pd>(ctx, cmd.pd_handle);
	if (!pd)
		return refuse(EINVAL, "no such PD handle");
	if (cmd.reserved[0] || cmd.reserved[1] || cmd.reserved[2])
		return refuse(EINVAL, "non-zero reserved field");
	// Not EOPNOTSUPP: there is no other window type to support.
	if (cmd.mw_type != IBV_MW_TYPE_1 && cmd.mw_type != IBV_MW_TYPE_2)
		return refuse(EINVAL, "no such window type");
	Device &dev = *ctx.device;
	if (dev.mws_by_index.size() >= DeviceLimits::max_mw)
		return refuse(ENOMEM, "limit: max_mw windows on the device");
	if (dev.mrs_by_index.size() + dev.mws_by_index.size() >= DeviceLimits::max_mr)
		return refuse(ENOMEM, "the MR table is full");
	uint32_t index = allocate_key_index(dev);
	Mw mw;
	mw.pd_handle = PdHandle(cmd.pd_handle);
	mw.type = cmd.mw_type;
	mw.rkey = Rkey(index << 8 | dev.key_salt++);
	ib_uverbs_alloc_mw_resp resp{};
	if (int err = insert_object(ctx, mw, resp.mw_handle))
		return err;
	resp.rkey = mw.rkey.value();
	if (int err = respond(caller, req, as_bytes_of(resp))) {
		erase_object(ctx, resp.mw_handle);
		return err;
	}
	dev.mws_by_index[index] = {&ctx, lookup<Mw>(ctx, resp.mw_handle)};
	++pd->use_count;
	return 0;
}

void release_mw(Context &ctx, uint32_t handle)
{
	Mw *mw = lookup<Mw>(ctx, handle);
	if (!mw)
		return;
	if (Device *dev = ctx.device) {
		unbind(*dev, *mw);
		dev->mws_by_index.erase(mw->index());
	}
	if (Pd *pd = lookup<Pd>(ctx, mw->pd_handle))
		--pd->use_count;
	erase_object(ctx, handle);
}

int cmd_dealloc_mw(Context &ctx, Caller &, const Request &req)
{
	auto cmd = load<ib_uverbs_dealloc_mw>(req.core);
	if (int err = check_no_driver_data(req))
		return err;
	if (!lookup<Mw>(ctx, cmd.mw_handle))
		return refuse(EINVAL, "no such MW handle");
	release_mw(ctx, cmd.mw_handle);
	return 0;
}

int cmd_bind_mw(Context &ctx, Caller &, const Request &req)
{
	auto cmd = load<xsrc_bind_mw>(req.core);
	if (int err = check_no_driver_data(req))
		return err;
	if (int err = check_comp_mask(cmd.comp_mask, 0))
		return err;
	Qp *qp = lookup<Qp>(ctx, cmd.qp_handle);
	Mw *mw = lookup<Mw>(ctx, cmd.mw_handle);
	if (!qp || !mw)
		return refuse(EINVAL, "no such QP or MW handle");
	const Mr *mr = cmd.mr_handle == XSRC_NO_HANDLE ? nullptr : lookup<Mr>(ctx, cmd.mr_handle);
	if (cmd.mr_handle != XSRC_NO_HANDLE && !mr)
		return refuse(EINVAL, "no such MR handle");
	if (const char *why = bind_refusal(ctx, *qp, *mw, mr, cmd))
		return refuse(EINVAL, why);
	Device &dev = *ctx.device;
	unbind(dev, *mw);
	mw->rkey = Rkey(cmd.rkey);
	if (cmd.length == 0)
		return 0;  // a type 1 window unbound: its new rkey reaches nothing
	mw->mr_index = mr->index();
	mw->qpn = qp->qpn();
	mw->addr = mr->addr + (cmd.addr - mr->iova);
	mw->iova = (cmd.access & IB_UVERBS_ACCESS_ZERO_BASED) ? 0 : cmd.addr;
	mw->length = cmd.length;
	mw->access = cmd.access & ~static_cast<uint32_t>(IB_UVERBS_ACCESS_ZERO_BASED);
	publish_window(ctx, *mw, pd_id_of(ctx, mw->pd_handle));
	return 0;
}

int cmd_invalidate(Context &ctx, Caller &, const Request &req)
{
	auto cmd = load<xsrc_invalidate>(req.core);
	if (int err = check_no_driver_data(req))
		return err;
	if (int err = check_comp_mask(cmd.comp_mask, 0))
		return err;
	if (cmd.reserved)
		return refuse(EINVAL, "non-zero reserved field");
	Device &dev = *ctx.device;
	Qp *own = lookup<Qp>(ctx, cmd.qp_handle);
	if (!own)
		return refuse(EINVAL, "no such QP handle");
	auto it = dev.mws_by_index.find(cmd.rkey >> 8);
	if (it == dev.mws_by_index.end() || it->second.second->rkey != Rkey(cmd.rkey))
		return refuse(EINVAL, "the rkey names no window (an MR's rkey cannot be invalidated)");
	auto [owner, mw] = it->second;
	// o10-37.2.26: only a type 2 window is invalidated; a type 1 is unbound by a bind.
	if (mw->type != IBV_MW_TYPE_2 || !mw->bound())
		return refuse(EINVAL, "not a bound type 2 window");
	if (cmd.kind == XSRC_INVALIDATE_LOCAL) {
		if (cmd.peer_qpn)
			return refuse(EINVAL, "a peer QP for a local invalidation");
		if (owner != &ctx || qp_pd_id(ctx, *own) != pd_id_of(ctx, mw->pd_handle))
			return refuse(EINVAL, "the window is not of the QP's PD");
	} else if (cmd.kind == XSRC_INVALIDATE_REMOTE) {
		// The responder's side: the caller's QP must be connected to the
		// peer QP and back, and the window bound to that peer QP (type 2B).
		ObjectRef ref = cmd.peer_qpn >= XSRC_QPN_BASE ? dev.qp_slots.find(cmd.peer_qpn - XSRC_QPN_BASE)
							     : ObjectRef{};
		Qp *peer = ref ? lookup<Qp>(*ref.ctx, ref.handle) : nullptr;
		if (!peer || ref.ctx != owner || own->qp_type == IBV_QPT_UD ||
		    own->attributes().dest_qp_num != cmd.peer_qpn ||
		    peer->attributes().dest_qp_num != own->qpn().value())
			return refuse(EINVAL, "the peer QP is not the one the caller's QP is connected to");
		if (mw->qpn != peer->qpn() || qp_pd_id(*owner, *peer) != pd_id_of(*owner, mw->pd_handle))
			return refuse(EINVAL, "the window is not bound to the peer QP");
	} else {
		return refuse(EINVAL, "unknown invalidation kind");
	}
	unbind(dev, *mw);
	return 0;
}

void mw_unbind_from_mr(Device &dev, uint32_t mr_index)
{
	for (auto &[index, owner_mw] : dev.mws_by_index)
		if (owner_mw.second->bound() && owner_mw.second->mr_index == mr_index)
			unbind(dev, *owner_mw.second);
}

void mw_unbind_from_qp(Device &dev, Qpn qpn)
{
	for (auto &[index, owner_mw] : dev.mws_by_index)
		if (owner_mw.second->bound() && owner_mw.second->type == IBV_MW_TYPE_2 && owner_mw.second->qpn == qpn)
			unbind(dev, *owner_mw.second);
}

bool mw_remote_invalidate(Device &dev, Context &owner, Qpn qpn, PdId pd, uint32_t rkey)
{
	auto it = dev.mws_by_index.find(rkey >> 8);
	if (it == dev.mws_by_index.end() || it->second.second->rkey != Rkey(rkey) || it->second.first != &owner)
		return false;
	Mw &mw = *it->second.second;
	// As XSRC_CMD_INVALIDATE's remote kind: a bound type 2 window, bound to
	// the responder QP, of the PD the message's keys are checked against.
	if (mw.type != IBV_MW_TYPE_2 || !mw.bound() || mw.qpn != qpn || pd_id_of(owner, mw.pd_handle) != pd)
		return false;
	unbind(dev, mw);
	return true;
}

const Mw *mw_find(Device &dev, Context &owner, uint32_t rkey)
{
	auto it = dev.mws_by_index.find(rkey >> 8);
	if (it == dev.mws_by_index.end() || it->second.first != &owner || it->second.second->rkey != Rkey(rkey) ||
	    !it->second.second->bound())
		return nullptr;
	return it->second.second;
}

}  // namespace xsrc
