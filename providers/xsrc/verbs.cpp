// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The verbs xsrc implements, and the ops table that lists them.
#include "xsrc.h"

#include "tm.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <new>

namespace {

// --- device and port -------------------------------------------------------

int xsrc_query_device_ex(ibv_context *ibctx,
			 const ibv_query_device_ex_input *input,
			 ibv_device_attr_ex *attr, size_t attr_size)
{
	ib_uverbs_ex_query_device_resp resp{};
	size_t resp_size = sizeof(resp);

	if (int err = ibv_cmd_query_device_any(ibctx, input, attr, attr_size,
					       &resp, &resp_size)) {
		verbs_debug(&to_xsrc_ctx(ibctx)->ibv_ctx, "query_device: the device refused: %s\n",
			    strerror(err));
		return err;
	}
	// fw_ver packs major.minor.sub_minor in 16-bit fields, as HCAs do.
	constexpr unsigned kFwMajorShift = 32, kFwMinorShift = 16, kFwFieldMask = 0xffff;
	uint64_t fw = resp.base.fw_ver;
	snprintf(attr->orig_attr.fw_ver, sizeof(attr->orig_attr.fw_ver), "%u.%u.%u",
		 static_cast<unsigned>(fw >> kFwMajorShift) & kFwFieldMask,
		 static_cast<unsigned>(fw >> kFwMinorShift) & kFwFieldMask,
		 static_cast<unsigned>(fw) & kFwFieldMask);
	// Device memory is the provider's (dm.cpp), whatever the daemon says.
	if (attr_size >= offsetof(ibv_device_attr_ex, max_dm_size) + sizeof(attr->max_dm_size))
		attr->max_dm_size = XSRC_MAX_DM_SIZE;
	return 0;
}

// The raw clock as mlx5 gives it: the whole count in tv_nsec (tv_sec 0), in
// the units of the free-running completion timestamps (hca_core_clock).
int xsrc_query_rt_values(ibv_context *ibctx, ibv_values_ex *values)
{
	if (values->comp_mask & ~static_cast<uint32_t>(IBV_VALUES_MASK_RAW_CLOCK)) {
		verbs_debug(&to_xsrc_ctx(ibctx)->ibv_ctx, "query_rt_values: comp_mask 0x%x has unsupported bits\n",
			    values->comp_mask);
		return EINVAL;
	}
	if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) {
		values->raw_clock.tv_sec = 0;
		values->raw_clock.tv_nsec = static_cast<long>(xsrc_device_clock_ns());
	}
	return 0;
}

int xsrc_query_port(ibv_context *ibctx, uint8_t port_num, ibv_port_attr *attr)
{
	struct ibv_query_port cmd{};

	int err = ibv_cmd_query_port(ibctx, port_num, attr, &cmd, sizeof(cmd));
	if (err)
		verbs_debug(&to_xsrc_ctx(ibctx)->ibv_ctx, "query_port: the device refused port %u: %s\n",
			    port_num, strerror(err));
	return err;
}

void xsrc_async_event(ibv_context *, ibv_async_event *)
{
}

// --- protection domains and memory regions ---------------------------------

ibv_pd *xsrc_alloc_pd(ibv_context *ibctx)
{
	struct ibv_alloc_pd cmd{};
	ib_uverbs_alloc_pd_resp resp{};
	verbs_context *vctx = &to_xsrc_ctx(ibctx)->ibv_ctx;
	auto *pd = new (std::nothrow) xsrc_pd{};

	if (!pd) {
		verbs_err(vctx, "alloc_pd: no memory for the PD\n");
		errno = ENOMEM;
		return nullptr;
	}
	if (int err = ibv_cmd_alloc_pd(ibctx, &pd->pd, &cmd, sizeof(cmd), &resp,
				       sizeof(resp))) {
		verbs_err(vctx, "alloc_pd: the device refused: %s\n", strerror(err));
		delete pd;
		errno = err;
		return nullptr;
	}
	return &pd->pd;
}

int xsrc_dealloc_pd(ibv_pd *pd)
{
	if (xsrc_parent_domain *parent = to_xsrc_parent_domain(pd))
		return xsrc_dealloc_parent_domain(parent);
	if (uint32_t n = to_xsrc_pd(pd)->refcount.load(std::memory_order_acquire); n > 1) {
		verbs_err(&to_xsrc_ctx(pd->context)->ibv_ctx, "dealloc_pd: %u parent domains still use the PD\n",
			  n - 1);
		return EBUSY;
	}
	if (int err = xsrc_destroy_status(to_xsrc_ctx(pd->context), ibv_cmd_dealloc_pd(pd))) {
		verbs_err(&to_xsrc_ctx(pd->context)->ibv_ctx, "dealloc_pd: the device refused: %s\n",
			  strerror(err));
		return err;
	}
	delete to_xsrc_pd(pd);
	return 0;
}

}  // namespace

ibv_mr *xsrc_mr_register(ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access)
{
	xsrc_context *ctx = to_xsrc_ctx(pd->context);
	struct ibv_reg_mr cmd{};
	ib_uverbs_reg_mr_resp resp{};
	std::unique_ptr<verbs_mr> vmr(new (std::nothrow) verbs_mr{});

	if (!vmr) {
		verbs_err(&ctx->ibv_ctx, "reg_mr: no memory for the MR\n");
		errno = ENOMEM;
		return nullptr;
	}
	if (int err = ibv_cmd_reg_mr(pd, addr, length, hca_va, access, vmr.get(),
				     &cmd, sizeof(cmd), &resp, sizeof(resp))) {
		verbs_err(&ctx->ibv_ctx, "reg_mr: the device refused %zu bytes at %p, access 0x%x: %s\n", length,
			  addr, access, strerror(err));
		errno = err;
		return nullptr;
	}
	if (!xsrc_mr_track(ctx, {vmr->ibv_mr.lkey, pd, reinterpret_cast<uintptr_t>(addr), length, hca_va}, access)) {
		verbs_err(&ctx->ibv_ctx, "reg_mr: no memory to record %zu bytes at %p as ours\n", length, addr);
		ibv_cmd_dereg_mr(vmr.get());
		errno = ENOMEM;
		return nullptr;
	}
	return &vmr.release()->ibv_mr;
}

bool xsrc_mr_track(xsrc_context *ctx, const xsrc_mr_span &mr, int access) noexcept
{
	try {
		// An ODP MR's pages may be unmapped: no payload is placed in
		// them by a poll (the sender never defers into one).
		if (access & IBV_ACCESS_ON_DEMAND)
			ctx->odp_mrs.add({mr.lkey, mr.pd, mr.iova, mr.length, mr.addr, (access & IBV_ACCESS_LOCAL_WRITE) != 0});
		else if (access & IBV_ACCESS_LOCAL_WRITE)
			ctx->local_mrs.add(mr.addr, mr.length);
		return true;
	} catch (const std::bad_alloc &) {
		return false;
	}
}

void xsrc_mr_untrack(xsrc_context *ctx, const ibv_mr &mr, int access) noexcept
{
	if (access & IBV_ACCESS_ON_DEMAND)
		ctx->odp_mrs.remove(mr.lkey);
	else if (access & IBV_ACCESS_LOCAL_WRITE)
		ctx->local_mrs.remove(reinterpret_cast<uintptr_t>(mr.addr), mr.length);
}

namespace {

ibv_mr *xsrc_reg_mr(ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access)
{
	return xsrc_boundary(&to_xsrc_ctx(pd->context)->ibv_ctx, "reg_mr",
			     [&] { return xsrc_mr_register(pd, addr, length, hca_va, access); });
}

// The bytes this context may have written into move with the MR (the CQ
// ring's payload check, local_mrs) once the device has accepted the change.
int xsrc_rereg_mr(verbs_mr *vmr, int flags, ibv_pd *pd, void *addr, size_t length, int access)
{
	ibv_mr &mr = vmr->ibv_mr;
	xsrc_context *ctx = to_xsrc_ctx(mr.context);
	return xsrc_boundary(&ctx->ibv_ctx, "rereg_mr", [&] {
		struct ibv_rereg_mr cmd{};
		ib_uverbs_rereg_mr_resp resp{};
		bool wrote = vmr->access & IBV_ACCESS_LOCAL_WRITE;
		uint64_t old_addr = reinterpret_cast<uintptr_t>(mr.addr), old_length = mr.length;
		int new_access = (flags & IBV_REREG_MR_CHANGE_ACCESS) ? access : vmr->access;
		uint64_t new_addr = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? reinterpret_cast<uintptr_t>(addr) : old_addr;
		uint64_t new_length = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? length : old_length;
		if (int err = ibv_cmd_rereg_mr(vmr, flags, addr, length, reinterpret_cast<uintptr_t>(addr), access, pd,
					       &cmd, sizeof(cmd), &resp, sizeof(resp))) {
			verbs_err(&ctx->ibv_ctx, "rereg_mr: the device refused flags 0x%x for lkey 0x%x: %s\n", flags,
				  mr.lkey, strerror(err));
			errno = err;  // ibv_rereg_mr answers IBV_REREG_MR_ERR_CMD; errno says why
			return err;
		}
		if (wrote)
			ctx->local_mrs.remove(old_addr, old_length);
		if (new_access & IBV_ACCESS_LOCAL_WRITE)
			ctx->local_mrs.add(new_addr, new_length);
		vmr->access = new_access;
		return 0;
	});
}

int xsrc_dereg_mr(verbs_mr *vmr)
{
	ibv_mr &mr = vmr->ibv_mr;
	xsrc_context *ctx = to_xsrc_ctx(mr.context);
	if (mr.handle == XSRC_NO_MR_HANDLE) {
		delete vmr;
		return 0;
	}
	if (int err = xsrc_destroy_status(ctx, ibv_cmd_dereg_mr(vmr))) {
		verbs_err(&ctx->ibv_ctx, "dereg_mr: the device refused lkey 0x%x: %s\n", mr.lkey, strerror(err));
		return err;
	}
	xsrc_mr_untrack(ctx, mr, vmr->access);  // as mr_register recorded it
	delete vmr;
	return 0;
}

} // namespace

// --- where CQ-ring payloads may go -----------------------------------------

void xsrc_local_mrs::add(uint64_t addr, uint64_t length)
{
	std::unique_lock guard(lock_);
	spans_.push_back({addr, addr + length});
}

void xsrc_local_mrs::remove(uint64_t addr, uint64_t length)
{
	std::unique_lock guard(lock_);
	auto it = std::find_if(spans_.begin(), spans_.end(), [&](const span &s) {
		return s.start == addr && s.end == addr + length;
	});
	if (it != spans_.end())
		spans_.erase(it);
}

bool xsrc_local_mrs::covers(uint64_t addr, uint64_t length) const
{
	if (length == 0)
		return true;  // nothing is written
	if (addr + length < addr)
		return false;
	std::shared_lock guard(lock_);
	return std::any_of(spans_.begin(), spans_.end(), [&](const span &s) {
		return s.start <= addr && addr + length <= s.end;
	});
}

// Everything not listed falls back to libibverbs' dummy ops (EOPNOTSUPP).
const verbs_context_ops xsrc_ctx_ops = {
	.advise_mr = xsrc_advise_mr,
	.alloc_dm = xsrc_alloc_dm,
#if XSRC_DRIVER_ABI_REVISION >= 4
	.alloc_mw = xsrc_mw_alloc,
#endif
	.alloc_parent_domain = xsrc_alloc_parent_domain,
	.alloc_pd = xsrc_alloc_pd,
	.alloc_td = xsrc_alloc_td,
	.async_event = xsrc_async_event,
#if XSRC_DRIVER_ABI_REVISION >= 3
	.attach_mcast = xsrc_attach_mcast,
#endif
#if XSRC_DRIVER_ABI_REVISION >= 4
	.bind_mw = xsrc_mw_bind,
#endif
	.close_xrcd = xsrc_close_xrcd,
	.cq_event = xsrc_cq_event,
	.create_ah = xsrc_create_ah,
	.create_cq = xsrc_create_cq,
	.create_cq_ex = xsrc_create_cq_ex,
	.create_flow = xsrc_create_flow,
	.create_qp = xsrc_create_qp,
	.create_qp_ex = xsrc_create_qp_ex,
	.create_rwq_ind_table = xsrc_create_rwq_ind_table,
	.create_srq = xsrc_create_srq,
	.create_srq_ex = xsrc_create_srq_ex,
	.create_wq = xsrc_create_wq,
#if XSRC_DRIVER_ABI_REVISION >= 4
	.dealloc_mw = xsrc_mw_dealloc,
#endif
	.dealloc_pd = xsrc_dealloc_pd,
	.dealloc_td = xsrc_dealloc_td,
	.dereg_mr = xsrc_dereg_mr,
	.destroy_ah = xsrc_destroy_ah,
	.destroy_cq = xsrc_destroy_cq,
	.destroy_flow = xsrc_destroy_flow,
	.destroy_qp = xsrc_destroy_qp,
	.destroy_rwq_ind_table = xsrc_destroy_rwq_ind_table,
	.destroy_srq = xsrc_destroy_srq,
	.destroy_wq = xsrc_destroy_wq,
#if XSRC_DRIVER_ABI_REVISION >= 3
	.detach_mcast = xsrc_detach_mcast,
#endif
	.free_context = xsrc_free_context,
	.free_dm = xsrc_free_dm,
	.get_srq_num = xsrc_get_srq_num,
#if XSRC_DRIVER_ABI_REVISION >= 6
	.import_dm = xsrc_import_dm,
	.import_mr = xsrc_import_mr,
	.import_pd = xsrc_import_pd,
#endif
	.modify_qp = xsrc_modify_qp,
	.modify_srq = xsrc_modify_srq,
	.modify_wq = xsrc_modify_wq,
	.open_qp = xsrc_open_qp,
	.open_xrcd = xsrc_open_xrcd,
	.poll_cq = xsrc_poll_cq,
	.post_recv = xsrc_post_recv,
	.post_send = xsrc_post_send,
	.post_srq_ops = xsrc_post_srq_ops,
	.post_srq_recv = xsrc_post_srq_recv,
	.query_device_ex = xsrc_query_device_ex,
	.query_port = xsrc_query_port,
	.query_qp = xsrc_query_qp,
	.query_rt_values = xsrc_query_rt_values,
	.query_srq = xsrc_query_srq,
	.reg_dm_mr = xsrc_reg_dm_mr,
	.reg_mr = xsrc_reg_mr,
	.req_notify_cq = xsrc_req_notify_cq,
	.rereg_mr = xsrc_rereg_mr,
	.resize_cq = xsrc_resize_cq,
#if XSRC_DRIVER_ABI_REVISION >= 6
	.unimport_dm = xsrc_unimport_dm,
	.unimport_mr = xsrc_unimport_mr,
	.unimport_pd = xsrc_unimport_pd,
#endif
};
