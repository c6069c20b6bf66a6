// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Import (driver ABI r6): ibv_import_pd and ibv_import_mr name objects of the
// context whose command file an imported context shares (ibv_import_device
// of a dup of it, xsrc.cpp). The device checks each handle on its own
// records (XSRC_CMD_QUERY_OBJECT) and says what it names; the imported
// object is then a second provider object of the same device object:
// unimport drops ours, dealloc/dereg destroy the device's, as in the kernel.
#include "xsrc.h"

#include <memory>

#if XSRC_DRIVER_ABI_REVISION >= 6
namespace {

// What the device says `handle` names, or errno (EINVAL: nothing of `type`).
int query_object(ibv_context *ibctx, uint32_t type, uint32_t handle, xsrc_query_object_resp &resp)
{
	xsrc_query_object cmd{};
	cmd.type = type;
	cmd.handle = handle;
	return xsrc_private_command(ibctx->cmd_fd, XSRC_CMD_QUERY_OBJECT, cmd, resp);
}

}  // namespace

ibv_pd *xsrc_import_pd(ibv_context *ibctx, uint32_t pd_handle)
{
	verbs_context *vctx = &to_xsrc_ctx(ibctx)->ibv_ctx;
	xsrc_query_object_resp resp{};
	if (int err = query_object(ibctx, XSRC_OBJECT_PD, pd_handle, resp)) {
		verbs_err(vctx, "import_pd: handle %u: %s\n", pd_handle, strerror(err));
		errno = err;
		return nullptr;
	}
	auto *pd = new (std::nothrow) xsrc_pd{};
	if (!pd) {
		errno = ENOMEM;
		return nullptr;
	}
	pd->pd.context = ibctx;
	pd->pd.handle = pd_handle;
	return &pd->pd;
}

void xsrc_unimport_pd(ibv_pd *pd)
{
	delete to_xsrc_pd(pd);
}

ibv_mr *xsrc_import_mr(ibv_pd *pd, uint32_t mr_handle)
{
	xsrc_context *ctx = to_xsrc_ctx(pd->context);
	xsrc_query_object_resp resp{};
	if (int err = query_object(pd->context, XSRC_OBJECT_MR, mr_handle, resp)) {
		verbs_err(&ctx->ibv_ctx, "import_mr: handle %u: %s\n", mr_handle, strerror(err));
		errno = err;
		return nullptr;
	}
	if (resp.pd_handle != pd->handle) {
		verbs_err(&ctx->ibv_ctx, "import_mr: MR %u is on PD %u, not on PD %u\n", mr_handle, resp.pd_handle,
			  pd->handle);
		errno = EINVAL;
		return nullptr;
	}
	std::unique_ptr<verbs_mr> vmr(new (std::nothrow) verbs_mr{});
	if (!vmr) {
		errno = ENOMEM;
		return nullptr;
	}
	ibv_mr &mr = vmr->ibv_mr;
	mr.context = pd->context;
	mr.pd = pd;
	mr.addr = reinterpret_cast<void *>(static_cast<uintptr_t>(resp.addr));
	mr.length = resp.length;
	mr.handle = mr_handle;
	mr.lkey = resp.lkey;
	mr.rkey = resp.rkey;
	vmr->mr_type = IBV_MR_TYPE_IMPORTED_MR;
	vmr->access = static_cast<int>(resp.access);
	if (!xsrc_mr_track(ctx, {mr.lkey, pd, resp.addr, resp.length, resp.iova}, vmr->access)) {
		errno = ENOMEM;
		return nullptr;
	}
	return &vmr.release()->ibv_mr;
}

void xsrc_unimport_mr(ibv_mr *mr)
{
	auto *vmr = reinterpret_cast<verbs_mr *>(mr);
	xsrc_mr_untrack(to_xsrc_ctx(mr->context), *mr, vmr->access);
	delete vmr;
}
#endif  // XSRC_DRIVER_ABI_REVISION >= 6
