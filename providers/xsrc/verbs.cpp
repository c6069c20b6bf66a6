// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The verbs xsrc implements, and the ops table that lists them.
#include "xsrc.h"

#include <cstdio>
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
					       &resp, &resp_size))
		return err;
	uint64_t fw = resp.base.fw_ver;
	snprintf(attr->orig_attr.fw_ver, sizeof(attr->orig_attr.fw_ver),
		 "%u.%u.%u", static_cast<unsigned>(fw >> 32) & 0xffff,
		 static_cast<unsigned>(fw >> 16) & 0xffff,
		 static_cast<unsigned>(fw) & 0xffff);
	return 0;
}

int xsrc_query_port(ibv_context *ibctx, uint8_t port_num, ibv_port_attr *attr)
{
	struct ibv_query_port cmd{};

	return ibv_cmd_query_port(ibctx, port_num, attr, &cmd, sizeof(cmd));
}

void xsrc_async_event(ibv_context *, ibv_async_event *)
{
}

// --- protection domains and memory regions ---------------------------------

ibv_pd *xsrc_alloc_pd(ibv_context *ibctx)
{
	struct ibv_alloc_pd cmd{};
	ib_uverbs_alloc_pd_resp resp{};
	auto *pd = new (std::nothrow) ibv_pd{};

	if (!pd) {
		errno = ENOMEM;
		return nullptr;
	}
	if (int err = ibv_cmd_alloc_pd(ibctx, pd, &cmd, sizeof(cmd), &resp,
				       sizeof(resp))) {
		delete pd;
		errno = err;
		return nullptr;
	}
	return pd;
}

int xsrc_dealloc_pd(ibv_pd *pd)
{
	if (int err = ibv_cmd_dealloc_pd(pd))
		return err;
	delete pd;
	return 0;
}

ibv_mr *xsrc_reg_mr(ibv_pd *pd, void *addr, size_t length, uint64_t hca_va,
		    int access)
{
	struct ibv_reg_mr cmd{};
	ib_uverbs_reg_mr_resp resp{};
	auto *vmr = new (std::nothrow) verbs_mr{};

	if (!vmr) {
		errno = ENOMEM;
		return nullptr;
	}
	if (int err = ibv_cmd_reg_mr(pd, addr, length, hca_va, access, vmr,
				     &cmd, sizeof(cmd), &resp, sizeof(resp))) {
		delete vmr;
		errno = err;
		return nullptr;
	}
	if (access & IBV_ACCESS_LOCAL_WRITE)
		to_xsrc_ctx(pd->context)->local_mrs.add(reinterpret_cast<uintptr_t>(addr), length);
	return &vmr->ibv_mr;
}

int xsrc_dereg_mr(verbs_mr *vmr)
{
	ibv_mr &mr = vmr->ibv_mr;
	xsrc_context *ctx = to_xsrc_ctx(mr.context);
	if (int err = ibv_cmd_dereg_mr(vmr))
		return err;
	if (vmr->access & IBV_ACCESS_LOCAL_WRITE)  // as ibv_cmd_reg_mr recorded it
		ctx->local_mrs.remove(reinterpret_cast<uintptr_t>(mr.addr), mr.length);
	delete vmr;
	return 0;
}

} // namespace

// Everything not listed falls back to libibverbs' dummy ops (EOPNOTSUPP).
const verbs_context_ops xsrc_ctx_ops = {
	.alloc_pd = xsrc_alloc_pd,
	.async_event = xsrc_async_event,
	.close_xrcd = xsrc_close_xrcd,
	.cq_event = xsrc_cq_event,
	.create_ah = xsrc_create_ah,
	.create_cq = xsrc_create_cq,
	.create_cq_ex = xsrc_create_cq_ex,
	.create_qp = xsrc_create_qp,
	.create_qp_ex = xsrc_create_qp_ex,
	.create_srq = xsrc_create_srq,
	.create_srq_ex = xsrc_create_srq_ex,
	.dealloc_pd = xsrc_dealloc_pd,
	.dereg_mr = xsrc_dereg_mr,
	.destroy_ah = xsrc_destroy_ah,
	.destroy_cq = xsrc_destroy_cq,
	.destroy_qp = xsrc_destroy_qp,
	.destroy_srq = xsrc_destroy_srq,
	.free_context = xsrc_free_context,
	.get_srq_num = xsrc_get_srq_num,
	.modify_qp = xsrc_modify_qp,
	.modify_srq = xsrc_modify_srq,
	.open_qp = xsrc_open_qp,
	.open_xrcd = xsrc_open_xrcd,
	.poll_cq = xsrc_poll_cq,
	.post_recv = xsrc_post_recv,
	.post_send = xsrc_post_send,
	.post_srq_recv = xsrc_post_srq_recv,
	.query_device_ex = xsrc_query_device_ex,
	.query_port = xsrc_query_port,
	.query_qp = xsrc_query_qp,
	.query_srq = xsrc_query_srq,
	.reg_mr = xsrc_reg_mr,
	.req_notify_cq = xsrc_req_notify_cq,
	.resize_cq = xsrc_resize_cq,
};
