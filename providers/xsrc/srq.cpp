// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Shared receive queues: a receive ring in the arena that the QPs using it
// consume from; the limit event is raised by whichever consumer crosses it.
#include "xsrc.h"

#include <new>

namespace {

using create_srq_resp = verbs_drv_buf<ib_uverbs_create_srq_resp, xsrc_create_srq_resp>;

// Completes the setup of an SRQ the daemon created.
ibv_srq *finish(xsrc_context *ctx, xsrc_srq *srq, const xsrc_create_srq_resp &drv, uint32_t max_sge)
{
	srq->ring = ctx->arena.at<xsrc_recv_ring>(drv.ring_off);
	srq->srqn = srq->vsrq.srq_num;
	srq->max_sge = max_sge;
	if (!srq->ring || !srq->ring->num_entries) {
		ibv_cmd_destroy_srq(&srq->vsrq.srq);
		delete srq;
		errno = EPROTO;
		return nullptr;
	}
	return &srq->vsrq.srq;
}

}  // namespace

ibv_srq *xsrc_create_srq_ex(ibv_context *ibctx, ibv_srq_init_attr_ex *attr)
{
	constexpr uint32_t supported = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
				       IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
	if ((attr->comp_mask & ~supported) ||
	    ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type != IBV_SRQT_BASIC &&
	     attr->srq_type != IBV_SRQT_XRC)) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	auto *srq = new (std::nothrow) xsrc_srq{};
	if (!srq) {
		errno = ENOMEM;
		return nullptr;
	}
	struct ibv_create_xsrq cmd{};
	create_srq_resp resp;
	if (int err = ibv_cmd_create_srq_ex(ibctx, &srq->vsrq, attr, &cmd, sizeof(cmd), resp.core(), resp.size)) {
		delete srq;
		errno = err;
		return nullptr;
	}
	srq->vsrq.srq_num = resp.core()->srqn;
	return finish(to_xsrc_ctx(ibctx), srq, resp.driver(), attr->attr.max_sge);
}

ibv_srq *xsrc_create_srq(ibv_pd *pd, ibv_srq_init_attr *attr)
{
	auto *srq = new (std::nothrow) xsrc_srq{};
	if (!srq) {
		errno = ENOMEM;
		return nullptr;
	}
	struct ibv_create_srq cmd{};
	create_srq_resp resp;
	if (int err = ibv_cmd_create_srq(pd, &srq->vsrq.srq, attr, &cmd, sizeof(cmd), resp.core(), resp.size)) {
		delete srq;
		errno = err;
		return nullptr;
	}
	srq->vsrq.srq_num = resp.core()->srqn;
	return finish(to_xsrc_ctx(pd->context), srq, resp.driver(), attr->attr.max_sge);
}

int xsrc_modify_srq(ibv_srq *srq, ibv_srq_attr *attr, int attr_mask)
{
	struct ibv_modify_srq cmd{};
	return ibv_cmd_modify_srq(srq, attr, attr_mask, &cmd, sizeof(cmd));
}

int xsrc_query_srq(ibv_srq *srq, ibv_srq_attr *attr)
{
	struct ibv_query_srq cmd{};
	return ibv_cmd_query_srq(srq, attr, &cmd, sizeof(cmd));
}

int xsrc_destroy_srq(ibv_srq *ibsrq)
{
	if (int err = ibv_cmd_destroy_srq(ibsrq))
		return err;
	delete to_xsrc_srq(ibsrq);
	return 0;
}

int xsrc_get_srq_num(ibv_srq *srq, uint32_t *srq_num)
{
	*srq_num = to_xsrc_srq(srq)->srqn;
	return 0;
}

int xsrc_post_srq_recv(ibv_srq *ibsrq, ibv_recv_wr *wr, ibv_recv_wr **bad_wr)
{
	xsrc_srq *srq = to_xsrc_srq(ibsrq);
	std::lock_guard guard(srq->post_lock);
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > srq->max_sge) {
			*bad_wr = wr;
			return EINVAL;
		}
		if (!xsrc_recv_post(srq->ring, wr)) {
			*bad_wr = wr;
			return ENOMEM;
		}
	}
	return 0;
}
