// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The legacy XRC send QP (IBV_QPT_XRC in ibv_create_qp) on
// ibv_create_qp_ex(IBV_QPT_XRC_SEND), and the legacy
// ibv_send_wr::xrc_remote_srq_num on ibv_send_wr::qp_type.xrc.remote_srqn.
#include "domain.h"

using namespace verbs_ext;

extern "C" ibv_qp *ibv_create_xrc_qp(ibv_pd *pd, ibv_xrc_qp_init_attr *qp_init_attr)
{
	if (!pd || !qp_init_attr || qp_init_attr->qp_type == IBV_QPT_XRC_RECV)
		return fail_null<ibv_qp>(EINVAL);

	if (qp_init_attr->qp_type != IBV_QPT_XRC) {
		ibv_qp_init_attr attr{};
		attr.qp_context = qp_init_attr->qp_context;
		attr.send_cq = qp_init_attr->send_cq;
		attr.recv_cq = qp_init_attr->recv_cq;
		attr.srq = qp_init_attr->srq;
		attr.cap = qp_init_attr->cap;
		attr.qp_type = qp_init_attr->qp_type;
		attr.sq_sig_all = qp_init_attr->sq_sig_all;
		ibv_qp *qp = ibv_create_qp(pd, &attr);
		if (qp)
			qp_init_attr->cap = attr.cap;
		return qp;
	}

	// Legacy XRC send QPs named their domain; upstream ones need none, but a
	// domain that is given must be a live one of this device.
	if (qp_init_attr->xrc_domain) {
		opened_domain *domain = domain_lookup(qp_init_attr->xrc_domain);
		if (!domain || domain->pub.context != pd->context)
			return fail_null<ibv_qp>(EINVAL);
	}
	if (!qp_init_attr->send_cq)
		return fail_null<ibv_qp>(EINVAL);

	ibv_qp_init_attr_ex attr{};
	attr.qp_context = qp_init_attr->qp_context;
	attr.send_cq = qp_init_attr->send_cq;
	attr.recv_cq = qp_init_attr->send_cq;	// an INI QP receives nothing
	attr.cap = qp_init_attr->cap;
	attr.cap.max_recv_wr = 0;
	attr.cap.max_recv_sge = 0;
	attr.qp_type = IBV_QPT_XRC_SEND;
	attr.sq_sig_all = qp_init_attr->sq_sig_all;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD;
	attr.pd = pd;
	ibv_qp *qp = ibv_create_qp_ex(pd->context, &attr);
	if (!qp)
		return nullptr;	 // errno from libibverbs
	qp_init_attr->cap = attr.cap;
	return qp;
}

extern "C" int ibv_post_xrc_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr,
				 uint32_t xrc_remote_srq_num)
{
	if (!qp || !wr || !bad_wr || (xrc_remote_srq_num & ~qpn_mask)) {
		if (bad_wr)
			*bad_wr = wr;
		return fail(EINVAL);
	}
	for (ibv_send_wr *w = wr; w; w = w->next)
		w->qp_type.xrc.remote_srqn = xrc_remote_srq_num;
	if (int err = ibv_post_send(qp, wr, bad_wr))
		return fail(err);
	return 0;
}
