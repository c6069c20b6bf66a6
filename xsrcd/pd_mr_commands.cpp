// Protection domains and memory regions: device-wide PD ids and the arena's
// MR table, against which the data path checks every key.
#include "device.h"
#include "dispatcher_handlers.h"
#include "rings.h"
#include "xsrc-abi.h"

namespace xsrc {
namespace {

constexpr uint32_t kPdIdLimit = 1u << 24;

constexpr uint32_t kSupportedAccess =
	IB_UVERBS_ACCESS_LOCAL_WRITE | IB_UVERBS_ACCESS_REMOTE_WRITE |
	IB_UVERBS_ACCESS_REMOTE_READ | IB_UVERBS_ACCESS_REMOTE_ATOMIC |
	IB_UVERBS_ACCESS_ZERO_BASED | IB_UVERBS_ACCESS_HUGETLB |
	IB_UVERBS_ACCESS_OPTIONAL_RANGE | IB_UVERBS_ACCESS_MW_BIND;

// Ids count up and wrap, so that a freed id is not reused at once.
PdId allocate_pd_id(Device &dev)
{
	uint32_t id = dev.next_pd_id;
	while (id == 0 || id >= kPdIdLimit || dev.pd_ids.count(PdId(id)))
		id = id >= kPdIdLimit - 1 ? 1 : id + 1;
	dev.next_pd_id = id + 1;
	dev.pd_ids.insert(PdId(id));
	return PdId(id);
}

void publish_mr(Context &ctx, const Mr &mr, PdId pd_id)
{
	xsrc_mr_entry &e = ctx.device->arena->mr_entry(mr.index());
	e.pd_id = pd_id.value();
	e.access = mr.access;
	e.owner_pid = static_cast<__u32>(ctx.owner);
	e.addr = mr.addr;
	e.length = mr.length;
	e.iova = mr.iova;
	e.mw_type = 0;
	e.bound_qpn = 0;
	store_release<__u32>(e.key, mr.lkey.value());  // last: the entry is complete
}

}  // namespace

// MR table indices (of MRs and windows); keys are (index << 8 | salt), as
// HCAs build them, so a stale key whose index was reused still misses.
uint32_t allocate_key_index(Device &dev)
{
	uint32_t index = dev.next_mr_index;
	while (index == 0 || index >= XSRC_MR_TABLE_LEN || dev.mrs_by_index.count(index) ||
	       dev.mws_by_index.count(index))
		index = index >= XSRC_MR_TABLE_LEN - 1 ? 1 : index + 1;
	dev.next_mr_index = index + 1;
	return index;
}

int cmd_alloc_pd(Context &ctx, Caller &caller, const Request &req)
{
	if (int err = check_no_driver_data(req))
		return err;
	Device &dev = *ctx.device;
	if (dev.pd_ids.size() >= DeviceLimits::max_pd)
		return refuse(ENOMEM, "limit: max_pd PDs on the device");
	PdId pd_id = allocate_pd_id(dev);
	ib_uverbs_alloc_pd_resp resp{};
	if (int err = insert_object(ctx, Pd{pd_id, 0}, resp.pd_handle)) {
		dev.pd_ids.erase(pd_id);
		return err;
	}
	xsrc_alloc_pd_resp dresp{};
	dresp.pd_id = pd_id.value();
	if (int err = respond(caller, req, as_bytes_of(resp), as_bytes_of(dresp))) {
		release_pd(ctx, resp.pd_handle);
		return err;
	}
	return 0;
}

void release_pd(Context &ctx, uint32_t handle)
{
	Pd *pd = lookup<Pd>(ctx, handle);
	if (!pd)
		return;
	if (ctx.device)
		ctx.device->pd_ids.erase(pd->pd_id);
	erase_object(ctx, handle);
}

int cmd_dealloc_pd(Context &ctx, Caller &, const Request &req)
{
	auto cmd = load<ib_uverbs_dealloc_pd>(req.core);
	Pd *pd = lookup<Pd>(ctx, cmd.pd_handle);
	if (!pd)
		return refuse(EINVAL, "no such PD handle");
	if (pd->use_count)
		return refuse(EBUSY, "still in use");
	release_pd(ctx, cmd.pd_handle);
	return 0;
}

// r6: what ibv_import_pd and ibv_import_mr learn of a handle of this
// context (the same command file, so the same objects).
int cmd_query_object(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<xsrc_query_object>(req.core);
	if (int err = check_no_driver_data(req))
		return err;
	if (req.resp_len < sizeof(xsrc_query_object_resp))
		return refuse(ENOSPC, "no room for the response");
	xsrc_query_object_resp resp{};
	switch (cmd.type) {
	case XSRC_OBJECT_PD: {
		const Pd *pd = lookup<Pd>(ctx, cmd.handle);
		if (!pd)
			return refuse(EINVAL, "no such PD handle");
		resp.pd_handle = cmd.handle;
		resp.pd_id = pd->pd_id.value();
		break;
	}
	case XSRC_OBJECT_MR: {
		const Mr *mr = lookup<Mr>(ctx, cmd.handle);
		const Pd *pd = mr ? lookup<Pd>(ctx, mr->pd_handle) : nullptr;
		if (!pd)
			return refuse(EINVAL, "no such MR handle");
		resp.pd_handle = mr->pd_handle.value();
		resp.pd_id = pd->pd_id.value();
		resp.lkey = mr->lkey.value();
		resp.rkey = mr->rkey.value();
		resp.addr = mr->addr;
		resp.iova = mr->iova;
		resp.length = mr->length;
		resp.access = mr->access;
		break;
	}
	default:
		return refuse(EINVAL, "no such object type");
	}
	return respond(caller, req, as_bytes_of(resp));
}

int cmd_reg_mr(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_reg_mr>(req.core);
	if (int err = check_no_driver_data(req))
		return err;
	Pd *pd = lookup<Pd>(ctx, cmd.pd_handle);
	if (!pd)
		return refuse(EINVAL, "no such PD handle");
	bool odp = cmd.access_flags & IB_UVERBS_ACCESS_ON_DEMAND;
	if (odp && !odp_supported(*ctx.device))
		return refuse(EOPNOTSUPP, "on-demand paging needs driver ABI revision 3");
	if ((cmd.access_flags & IB_UVERBS_ACCESS_MW_BIND) && !mw_supported(*ctx.device))
		return refuse(EOPNOTSUPP, "memory windows need driver ABI revision 4");
	if (cmd.access_flags & ~(kSupportedAccess | IB_UVERBS_ACCESS_ON_DEMAND))
		return refuse(EOPNOTSUPP, "unsupported access flags");
	// IBTA o10-37: remote write or atomic access requires local write.
	if ((cmd.access_flags & (IB_UVERBS_ACCESS_REMOTE_WRITE | IB_UVERBS_ACCESS_REMOTE_ATOMIC)) &&
	    !(cmd.access_flags & IB_UVERBS_ACCESS_LOCAL_WRITE))
		return refuse(EINVAL, "remote write or atomic access without local write");
	// An implicit ODP MR (start 0, length U64_MAX) is the whole address space.
	bool implicit = odp && cmd.start == 0 && cmd.length == UINT64_MAX;
	if (implicit && cmd.hca_va != 0)
		return refuse(EINVAL, "an implicit ODP MR starts at iova 0");
	if (cmd.length == 0 || (!implicit && cmd.start + cmd.length < cmd.start))
		return refuse(EINVAL, "zero length, or the range wraps around");
	Device &dev = *ctx.device;
	if (dev.mrs_by_index.size() >= DeviceLimits::max_mr ||
	    dev.mrs_by_index.size() + dev.mws_by_index.size() >= DeviceLimits::max_mr)
		return refuse(ENOMEM, "limit: max_mr MRs on the device");
	bool writable = cmd.access_flags & (IB_UVERBS_ACCESS_LOCAL_WRITE |
					    IB_UVERBS_ACCESS_REMOTE_WRITE |
					    IB_UVERBS_ACCESS_REMOTE_ATOMIC);
	// ODP pages may be mapped later: the data path checks each access.
	if (!odp)
		if (int err = caller.check_mapped(cmd.start, cmd.length, writable))
			return refuse(err, "the range is not mapped in the caller, or not writable");

	uint32_t index = allocate_key_index(dev);
	uint32_t key = index << 8 | dev.key_salt++;
	Mr mr{PdHandle(cmd.pd_handle), cmd.start, cmd.length, cmd.hca_va, cmd.access_flags,
	      Lkey(key), Rkey(key)};
	ib_uverbs_reg_mr_resp resp{};
	if (int err = insert_object(ctx, mr, resp.mr_handle))
		return err;
	resp.lkey = key;
	resp.rkey = key;
	if (int err = respond(caller, req, as_bytes_of(resp))) {
		erase_object(ctx, resp.mr_handle);
		return err;
	}
	dev.mrs_by_index[index] = lookup<Mr>(ctx, resp.mr_handle);
	++pd->use_count;
	publish_mr(ctx, mr, pd->pd_id);
	return 0;
}

void release_mr(Context &ctx, uint32_t handle)
{
	Mr *mr = lookup<Mr>(ctx, handle);
	if (!mr)
		return;
	if (Device *dev = ctx.device) {
		mw_unbind_from_mr(*dev, mr->index());
		xsrc_mr_entry &e = dev->arena->mr_entry(mr->index());
		store_release<__u32>(e.key, 0);  // first: no new access passes the check
		e = xsrc_mr_entry{};
		dev->mrs_by_index.erase(mr->index());
	}
	if (Pd *pd = lookup<Pd>(ctx, mr->pd_handle))
		--pd->use_count;
	erase_object(ctx, handle);
}

// As the kernel's rereg: the MR keeps its handle and here its keys too, so a
// peer's old rkey reaches the new range, PD and access at once. The entry is
// taken out of the table while it changes (as dereg does), then published.
int cmd_rereg_mr(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_rereg_mr>(req.core);
	if (int err = check_no_driver_data(req))
		return err;
	// enum ib_mr_rereg_flags (the kernel's; <rdma/ib_user_verbs.h> has no names)
	constexpr uint32_t IB_MR_REREG_TRANS = 1, IB_MR_REREG_PD = 2, IB_MR_REREG_ACCESS = 4;
	constexpr uint32_t kRereg = IB_MR_REREG_TRANS | IB_MR_REREG_PD | IB_MR_REREG_ACCESS;
	if (!cmd.flags || (cmd.flags & ~kRereg))
		return refuse(EINVAL, "no flags, or unknown rereg flags");
	constexpr uint64_t kPageOffset = 4095;
	if ((cmd.flags & IB_MR_REREG_TRANS) && (cmd.start & kPageOffset) != (cmd.hca_va & kPageOffset))
		return refuse(EINVAL, "start and hca_va differ in their page offset");
	Mr *mr = lookup<Mr>(ctx, cmd.mr_handle);
	if (!mr)
		return refuse(EINVAL, "no such MR handle");
	Mr next = *mr;
	Pd *new_pd = nullptr;
	if (cmd.flags & IB_MR_REREG_PD) {
		new_pd = lookup<Pd>(ctx, cmd.pd_handle);
		if (!new_pd)
			return refuse(EINVAL, "no such PD handle");
		next.pd_handle = PdHandle(cmd.pd_handle);
	}
	if (cmd.flags & IB_MR_REREG_ACCESS) {
		if (cmd.access_flags & ~kSupportedAccess)
			return refuse(EOPNOTSUPP, "unsupported access flags");
		if ((cmd.access_flags & IB_UVERBS_ACCESS_MW_BIND) && !mw_supported(*ctx.device))
			return refuse(EOPNOTSUPP, "memory windows need driver ABI revision 4");
		if ((cmd.access_flags & (IB_UVERBS_ACCESS_REMOTE_WRITE | IB_UVERBS_ACCESS_REMOTE_ATOMIC)) &&
		    !(cmd.access_flags & IB_UVERBS_ACCESS_LOCAL_WRITE))
			return refuse(EINVAL, "remote write or atomic access without local write");
		next.access = cmd.access_flags;
	}
	if (cmd.flags & IB_MR_REREG_TRANS) {
		if (cmd.length == 0 || cmd.start + cmd.length < cmd.start)
			return refuse(EINVAL, "zero length, or the range wraps around");
		next.addr = cmd.start;
		next.length = cmd.length;
		next.iova = cmd.hca_va;
	}
	// The caller's mappings decide for the range and access the MR will have.
	bool writable = next.access & (IB_UVERBS_ACCESS_LOCAL_WRITE | IB_UVERBS_ACCESS_REMOTE_WRITE |
				       IB_UVERBS_ACCESS_REMOTE_ATOMIC);
	if (int err = caller.check_mapped(next.addr, next.length, writable))
		return refuse(err, "the range is not mapped in the caller, or not writable");
	ib_uverbs_rereg_mr_resp resp{};
	resp.lkey = next.lkey.value();
	resp.rkey = next.rkey.value();
	if (int err = respond(caller, req, as_bytes_of(resp)))
		return err;
	Pd *old_pd = lookup<Pd>(ctx, mr->pd_handle);
	if (new_pd && new_pd != old_pd) {
		++new_pd->use_count;
		if (old_pd)
			--old_pd->use_count;
	}
	// Windows bound to the old MR do not follow it to its new range or rights.
	mw_unbind_from_mr(*ctx.device, mr->index());
	xsrc_mr_entry &e = ctx.device->arena->mr_entry(mr->index());
	store_release<__u32>(e.key, 0);  // first: no access passes the check while it changes
	*mr = next;
	Pd *pd = lookup<Pd>(ctx, mr->pd_handle);
	publish_mr(ctx, *mr, pd ? pd->pd_id : PdId(0));
	return 0;
}

int cmd_dereg_mr(Context &ctx, Caller &, const Request &req)
{
	auto cmd = load<ib_uverbs_dereg_mr>(req.core);
	if (!lookup<Mr>(ctx, cmd.mr_handle))
		return refuse(EINVAL, "no such MR handle");
	release_mr(ctx, cmd.mr_handle);
	return 0;
}

}  // namespace xsrc
