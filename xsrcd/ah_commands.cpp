// Address handles: kept per context for the UD data path; on RoCE every
// address is a GID, so each AH carries a GRH with a valid source GID.
#include "dispatcher_handlers.h"
#include "ib_fields.h"

namespace xsrc {

bool valid_sgid_index(const Device &dev, uint32_t index)
{
	const PortView &port = dev.view.port;
	return index < port.gid_tbl_len && index < port.gids.size() && port.gids[index] != Gid{};
}

int cmd_create_ah(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_create_ah>(req.core);
	Pd *pd = lookup<Pd>(ctx, cmd.pd_handle);
	if (!pd)
		return refuse(EINVAL, "no such PD handle");
	ib_uverbs_ah_attr a = cmd.attr;
	if (cmd.reserved || a.reserved || a.grh.reserved)
		return refuse(EINVAL, "non-zero reserved field");
	if (a.port_num != 1 || !a.is_global || !valid_sgid_index(*ctx.device, a.grh.sgid_index))
		return refuse(EINVAL, "address not on port 1, not global, or a bad source GID index");
	if (a.sl > ib::kMaxServiceLevel)
		return refuse(EINVAL, "service level over 15");
	a.grh.flow_label &= ib::kFlowLabelMask;  // any value is taken and masked, as the kernel does
	if (int err = check_no_driver_data(req))
		return err;
	if (device_object_count<Ah>(*ctx.device) >= DeviceLimits::max_ah)
		return refuse(ENOMEM, "limit: max_ah address handles on the device");

	ib_uverbs_create_ah_resp resp{};
	if (int err = insert_object(ctx, Ah{cmd.user_handle, PdHandle(cmd.pd_handle), a}, resp.ah_handle))
		return err;
	if (int err = respond(caller, req, as_bytes_of(resp))) {
		erase_object(ctx, resp.ah_handle);
		return err;
	}
	++pd->use_count;
	return 0;
}

void release_ah(Context &ctx, uint32_t handle)
{
	Ah *ah = lookup<Ah>(ctx, handle);
	if (!ah)
		return;
	if (Pd *pd = lookup<Pd>(ctx, ah->pd_handle))
		--pd->use_count;
	erase_object(ctx, handle);
}

int cmd_destroy_ah(Context &ctx, Caller &, const Request &req)
{
	auto cmd = load<ib_uverbs_destroy_ah>(req.core);
	if (!lookup<Ah>(ctx, cmd.ah_handle))
		return refuse(EINVAL, "no such AH handle");
	release_ah(ctx, cmd.ah_handle);
	return 0;
}

}  // namespace xsrc
