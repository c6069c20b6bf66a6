// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Shared receive queues: a receive ring in the arena that the QPs using it
// consume from; the limit event is raised by whichever consumer crosses it.
#include "xsrc.h"

#include <new>

#include "tm.h"

namespace {

using create_srq_resp = verbs_drv_buf<ib_uverbs_create_srq_resp, xsrc_create_srq_resp>;

constexpr uint32_t supported_srq_init_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
					      IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;

xsrc_srq *srq_alloc(verbs_context *vctx)
{
	auto *srq = new (std::nothrow) xsrc_srq{};
	if (!srq) {
		verbs_err(vctx, "create_srq: no memory for the SRQ\n");
		errno = ENOMEM;
	}
	return srq;
}

// The device refused to create it.
ibv_srq *srq_refused(verbs_context *vctx, xsrc_srq *srq, const ibv_srq_attr &attr, int err)
{
	verbs_err(vctx, "create_srq: the device refused max_wr %u max_sge %u srq_limit %u: %s\n", attr.max_wr,
		  attr.max_sge, attr.srq_limit, strerror(err));
	delete srq;
	errno = err;
	return nullptr;
}

// Completes the setup of an SRQ the daemon created through `pd` (null: none).
ibv_srq *srq_finish(xsrc_context *ctx, xsrc_srq *srq, create_srq_resp &resp, uint32_t max_sge, ibv_pd *pd)
{
	srq->vsrq.srq_num = resp.core()->srqn;
	const xsrc_create_srq_resp &drv = resp.driver();
	srq->ring = xsrc_recv_ring_at(ctx->arena, drv.ring_off, srq->ring_shape);
	srq->srqn = xsrc::Srqn(srq->vsrq.srq_num);
	srq->max_sge = max_sge;
	if (!srq->ring) {
		verbs_err(&ctx->ibv_ctx, "create_srq: SRQ %u: the device answered ring_off 0x%llx, not a receive ring\n",
			  srq->srqn.value(), static_cast<unsigned long long>(drv.ring_off));
		ibv_cmd_destroy_srq(&srq->vsrq.srq);
		delete srq;
		errno = EPROTO;
		return nullptr;
	}
	if (!srq->tm) {
		if (int err = srq->shadow.attach(ctx, xsrc_rq_shadow::queue::srq, srq->vsrq.srq.handle,
						 static_cast<uint32_t>(srq->ring_shape.entries), max_sge)) {
			verbs_err(&ctx->ibv_ctx, "create_srq: SRQ %u: the device took no record of its receives: %s\n",
				  srq->srqn.value(), strerror(err));
			ibv_cmd_destroy_srq(&srq->vsrq.srq);
			delete srq;
			errno = err;
			return nullptr;
		}
	}
	srq->parent_domain = to_xsrc_parent_domain(pd);
	if (srq->parent_domain && srq->parent_domain->td)
		srq->post_lock.waive();
	xsrc_parent_domain_hold(srq->parent_domain);
	return &srq->vsrq.srq;
}

ibv_srq *srq_create_ex(ibv_context *ibctx, ibv_srq_init_attr_ex *attr)
{
	xsrc_context *ctx = to_xsrc_ctx(ibctx);
	if (attr->comp_mask & ~supported_srq_init_mask) {
		verbs_err(&ctx->ibv_ctx, "create_srq_ex: comp_mask 0x%x has unsupported bits 0x%x\n", attr->comp_mask,
			  attr->comp_mask & ~supported_srq_init_mask);
		errno = EOPNOTSUPP;
		return nullptr;
	}
	ibv_srq_type type = attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE ? attr->srq_type : IBV_SRQT_BASIC;
	if (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC && type != IBV_SRQT_TM) {
		verbs_err(&ctx->ibv_ctx, "create_srq_ex: srq_type %d is not supported\n", attr->srq_type);
		errno = EOPNOTSUPP;
		return nullptr;
	}
	// libibverbs checks a TM SRQ has a CQ and max_num_tags; the device
	// checks max_num_tags against its own. List operations never stay
	// outstanding (they execute as posted), so max_ops only has a ceiling.
	if (type == IBV_SRQT_TM && attr->tm_cap.max_ops > XSRC_TM_MAX_OPS) {
		verbs_err(&ctx->ibv_ctx, "create_srq_ex: tm_cap.max_ops %u is over the device's %u\n",
			  attr->tm_cap.max_ops, XSRC_TM_MAX_OPS);
		errno = EINVAL;
		return nullptr;
	}
	xsrc_srq *srq = srq_alloc(&ctx->ibv_ctx);
	if (!srq)
		return nullptr;
	struct ibv_create_xsrq cmd{};
	create_srq_resp resp;
	if (int err = ibv_cmd_create_srq_ex(ibctx, &srq->vsrq, attr, &cmd, sizeof(cmd), resp.core(), resp.size))
		return srq_refused(&ctx->ibv_ctx, srq, attr->attr, err);
	if (type == IBV_SRQT_TM) {
		srq->tm = xsrc_tm_table_of(ctx->arena, resp.driver().ring_off);
		srq->tm_cq = to_xsrc_cq(attr->cq);
		if (!srq->tm) {
			verbs_err(&ctx->ibv_ctx, "create_srq_ex: SRQ %u: the device laid out no tag table\n",
				  resp.core()->srqn);
			ibv_cmd_destroy_srq(&srq->vsrq.srq);
			delete srq;
			errno = EPROTO;
			return nullptr;
		}
	}
	return srq_finish(ctx, srq, resp, attr->attr.max_sge,
			  attr->comp_mask & IBV_SRQ_INIT_ATTR_PD ? attr->pd : nullptr);
}

ibv_srq *srq_create(ibv_pd *pd, ibv_srq_init_attr *attr)
{
	xsrc_context *ctx = to_xsrc_ctx(pd->context);
	xsrc_srq *srq = srq_alloc(&ctx->ibv_ctx);
	if (!srq)
		return nullptr;
	struct ibv_create_srq cmd{};
	create_srq_resp resp;
	if (int err = ibv_cmd_create_srq(pd, &srq->vsrq.srq, attr, &cmd, sizeof(cmd), resp.core(), resp.size))
		return srq_refused(&ctx->ibv_ctx, srq, attr->attr, err);
	return srq_finish(ctx, srq, resp, attr->attr.max_sge, pd);
}

verbs_context *srq_vctx(const ibv_srq *srq)
{
	return &to_xsrc_ctx(srq->context)->ibv_ctx;
}

}  // namespace

ibv_srq *xsrc_create_srq_ex(ibv_context *ibctx, ibv_srq_init_attr_ex *attr)
{
	return xsrc_boundary(&to_xsrc_ctx(ibctx)->ibv_ctx, "create_srq_ex", [&] { return srq_create_ex(ibctx, attr); });
}

ibv_srq *xsrc_create_srq(ibv_pd *pd, ibv_srq_init_attr *attr)
{
	return xsrc_boundary(&to_xsrc_ctx(pd->context)->ibv_ctx, "create_srq", [&] { return srq_create(pd, attr); });
}

int xsrc_modify_srq(ibv_srq *srq, ibv_srq_attr *attr, int attr_mask)
{
	struct ibv_modify_srq cmd{};
	int err = ibv_cmd_modify_srq(srq, attr, attr_mask, &cmd, sizeof(cmd));
	if (err)
		verbs_debug(srq_vctx(srq), "modify_srq: the device refused SRQ %u attr_mask 0x%x: %s\n",
			    to_xsrc_srq(srq)->srqn.value(), attr_mask, strerror(err));
	return err;
}

int xsrc_query_srq(ibv_srq *srq, ibv_srq_attr *attr)
{
	struct ibv_query_srq cmd{};
	int err = ibv_cmd_query_srq(srq, attr, &cmd, sizeof(cmd));
	if (err)
		verbs_debug(srq_vctx(srq), "query_srq: the device refused SRQ %u: %s\n", to_xsrc_srq(srq)->srqn.value(),
			    strerror(err));
	return err;
}

int xsrc_destroy_srq(ibv_srq *ibsrq)
{
	if (int err = xsrc_destroy_status(to_xsrc_ctx(ibsrq->context), ibv_cmd_destroy_srq(ibsrq))) {
		verbs_err(srq_vctx(ibsrq), "destroy_srq: the device refused SRQ %u: %s\n",
			  to_xsrc_srq(ibsrq)->srqn.value(), strerror(err));
		return err;
	}
	xsrc_parent_domain_release(to_xsrc_srq(ibsrq)->parent_domain);
	delete to_xsrc_srq(ibsrq);
	return 0;
}

int xsrc_get_srq_num(ibv_srq *srq, uint32_t *srq_num)
{
	*srq_num = to_xsrc_srq(srq)->srqn.value();
	return 0;
}

int xsrc_post_srq_recv(ibv_srq *ibsrq, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) noexcept
{
	xsrc_srq *srq = to_xsrc_srq(ibsrq);
	if (xsrc_device_gone(to_xsrc_ctx(ibsrq->context))) {
		*bad_wr = wr;
		return EIO;
	}
	std::lock_guard guard(srq->post_lock);
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > srq->max_sge) {
			verbs_debug(srq_vctx(ibsrq), "post_srq_recv: SRQ %u: num_sge %d exceeds max_sge %u\n",
				    srq->srqn.value(), wr->num_sge, srq->max_sge);
			*bad_wr = wr;
			return EINVAL;
		}
		if (!xsrc_recv_post(srq->ring, srq->ring_shape, srq->shadow, wr)) {
			verbs_debug(srq_vctx(ibsrq), "post_srq_recv: SRQ %u is full\n", srq->srqn.value());
			*bad_wr = wr;
			return ENOMEM;
		}
	}
	return 0;
}
