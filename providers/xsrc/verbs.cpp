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
	return &vmr->ibv_mr;
}

int xsrc_dereg_mr(verbs_mr *vmr)
{
	if (int err = ibv_cmd_dereg_mr(vmr))
		return err;
	delete vmr;
	return 0;
}

// --- completion queues -----------------------------------------------------

// The shared-memory CQ ring arrives with the data path; until then a CQ never
// holds a completion.
int xsrc_poll_cq(ibv_cq *, int, ibv_wc *)
{
	return 0;
}

int xsrc_start_poll(ibv_cq_ex *, ibv_poll_cq_attr *attr)
{
	return attr->comp_mask ? EINVAL : ENOENT;
}

int xsrc_next_poll(ibv_cq_ex *)
{
	return ENOENT;
}

void xsrc_end_poll(ibv_cq_ex *)
{
}

// Readers of the completion start_poll/next_poll stepped onto; only the
// IBV_WC_STANDARD_FLAGS fields are offered.
ibv_wc_opcode xsrc_read_opcode(ibv_cq_ex *cq)
{
	return to_xsrc_cq(cq)->polled.opcode;
}
uint32_t xsrc_read_vendor_err(ibv_cq_ex *cq)
{
	return to_xsrc_cq(cq)->polled.vendor_err;
}
uint32_t xsrc_read_byte_len(ibv_cq_ex *cq)
{
	return to_xsrc_cq(cq)->polled.byte_len;
}
__be32 xsrc_read_imm_data(ibv_cq_ex *cq)
{
	return to_xsrc_cq(cq)->polled.imm_data;
}
uint32_t xsrc_read_qp_num(ibv_cq_ex *cq)
{
	return to_xsrc_cq(cq)->polled.qp_num;
}
uint32_t xsrc_read_src_qp(ibv_cq_ex *cq)
{
	return to_xsrc_cq(cq)->polled.src_qp;
}
unsigned int xsrc_read_wc_flags(ibv_cq_ex *cq)
{
	return to_xsrc_cq(cq)->polled.wc_flags;
}
uint32_t xsrc_read_slid(ibv_cq_ex *cq)
{
	return to_xsrc_cq(cq)->polled.slid;
}
uint8_t xsrc_read_sl(ibv_cq_ex *cq)
{
	return to_xsrc_cq(cq)->polled.sl;
}
uint8_t xsrc_read_dlid_path_bits(ibv_cq_ex *cq)
{
	return to_xsrc_cq(cq)->polled.dlid_path_bits;
}

void set_poll_ops(ibv_cq_ex &cq)
{
	cq.start_poll = xsrc_start_poll;
	cq.next_poll = xsrc_next_poll;
	cq.end_poll = xsrc_end_poll;
	cq.read_opcode = xsrc_read_opcode;
	cq.read_vendor_err = xsrc_read_vendor_err;
	cq.read_byte_len = xsrc_read_byte_len;
	cq.read_imm_data = xsrc_read_imm_data;
	cq.read_qp_num = xsrc_read_qp_num;
	cq.read_src_qp = xsrc_read_src_qp;
	cq.read_wc_flags = xsrc_read_wc_flags;
	cq.read_slid = xsrc_read_slid;
	cq.read_sl = xsrc_read_sl;
	cq.read_dlid_path_bits = xsrc_read_dlid_path_bits;
}

using create_cq_resp =
	verbs_drv_buf<ib_uverbs_create_cq_resp, xsrc_create_cq_resp>;
using create_cq_ex_resp =
	verbs_drv_buf<ib_uverbs_ex_create_cq_resp, xsrc_create_cq_resp>;

ibv_cq *xsrc_create_cq(ibv_context *ibctx, int cqe, ibv_comp_channel *channel,
		       int comp_vector)
{
	struct ibv_create_cq cmd{};
	create_cq_resp resp;
	auto *cq = new (std::nothrow) xsrc_cq{};

	if (!cq) {
		errno = ENOMEM;
		return nullptr;
	}
	if (int err = ibv_cmd_create_cq(ibctx, cqe, channel, comp_vector,
					&cq->vcq.cq, &cmd, sizeof(cmd),
					resp.core(), resp.size)) {
		delete cq;
		errno = err;
		return nullptr;
	}
	xsrc_channel_pool_refill(to_xsrc_ctx(ibctx),
				 resp.driver().channel_pool_free);
	return &cq->vcq.cq;
}

constexpr uint64_t supported_wc_flags = IBV_WC_STANDARD_FLAGS;
constexpr uint32_t supported_cq_comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
constexpr uint32_t supported_cq_flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;

ibv_cq_ex *xsrc_create_cq_ex(ibv_context *ibctx, ibv_cq_init_attr_ex *attr)
{
	struct ibv_create_cq_ex cmd{};
	create_cq_ex_resp resp;

	if ((attr->wc_flags & ~supported_wc_flags) ||
	    (attr->comp_mask & ~supported_cq_comp_mask) ||
	    ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
	     (attr->flags & ~supported_cq_flags))) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	auto *cq = new (std::nothrow) xsrc_cq{};
	if (!cq) {
		errno = ENOMEM;
		return nullptr;
	}
	if (int err = ibv_cmd_create_cq_ex(ibctx, attr, &cq->vcq, &cmd,
					   sizeof(cmd), resp.core(), resp.size,
					   0)) {
		delete cq;
		errno = err;
		return nullptr;
	}
	set_poll_ops(cq->vcq.cq_ex);
	xsrc_channel_pool_refill(to_xsrc_ctx(ibctx),
				 resp.driver().channel_pool_free);
	return &cq->vcq.cq_ex;
}

int xsrc_destroy_cq(ibv_cq *cq)
{
	if (int err = ibv_cmd_destroy_cq(cq))
		return err;
	delete to_xsrc_cq(cq);
	return 0;
}

int xsrc_resize_cq(ibv_cq *cq, int cqe)
{
	struct ibv_resize_cq cmd{};
	ib_uverbs_resize_cq_resp resp{};

	return ibv_cmd_resize_cq(cq, cqe, &cmd, sizeof(cmd), &resp,
				 sizeof(resp));
}

int xsrc_req_notify_cq(ibv_cq *cq, int solicited_only)
{
	return ibv_cmd_req_notify_cq(cq, solicited_only);
}

void xsrc_cq_event(ibv_cq *)
{
}

} // namespace

// Everything not listed falls back to libibverbs' dummy ops (EOPNOTSUPP).
const verbs_context_ops xsrc_ctx_ops = {
	.alloc_pd = xsrc_alloc_pd,
	.async_event = xsrc_async_event,
	.cq_event = xsrc_cq_event,
	.create_cq = xsrc_create_cq,
	.create_cq_ex = xsrc_create_cq_ex,
	.dealloc_pd = xsrc_dealloc_pd,
	.dereg_mr = xsrc_dereg_mr,
	.destroy_cq = xsrc_destroy_cq,
	.free_context = xsrc_free_context,
	.poll_cq = xsrc_poll_cq,
	.query_device_ex = xsrc_query_device_ex,
	.query_port = xsrc_query_port,
	.reg_mr = xsrc_reg_mr,
	.req_notify_cq = xsrc_req_notify_cq,
	.resize_cq = xsrc_resize_cq,
};
