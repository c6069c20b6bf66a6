// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// ibv_create_xrc_srq on ibv_create_srq_ex(IBV_SRQT_XRC); the legacy
// srq->xrc_srq_num field on ibv_get_srq_num().
#include "domain.h"

using namespace verbs_ext;

extern "C" ibv_srq *ibv_create_xrc_srq(ibv_pd *pd, ibv_xrc_domain *xrc_domain, ibv_cq *xrc_cq,
				       ibv_srq_init_attr *srq_init_attr)
{
	opened_domain *domain = domain_lookup(xrc_domain);
	if (!pd || !domain || !xrc_cq || !srq_init_attr)
		return fail_null<ibv_srq>(EINVAL);
	if (pd->context != domain->pub.context || xrc_cq->context != pd->context)
		return fail_null<ibv_srq>(EINVAL);

	ibv_srq_init_attr_ex attr{};
	attr.srq_context = srq_init_attr->srq_context;
	attr.attr = srq_init_attr->attr;
	attr.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
			 IBV_SRQ_INIT_ATTR_CQ;
	attr.srq_type = IBV_SRQT_XRC;
	attr.pd = pd;
	attr.xrcd = domain->pub.xrcd;
	attr.cq = xrc_cq;
	ibv_srq *srq = ibv_create_srq_ex(pd->context, &attr);
	if (!srq)
		return nullptr;	 // errno from libibverbs
	srq_init_attr->attr = attr.attr;
	return srq;
}

extern "C" uint32_t ibv_xrc_srq_num(ibv_srq *srq)
{
	if (!srq) {
		errno = EINVAL;
		return IBV_XRC_INVALID_SRQ_NUM;
	}
	uint32_t srq_num = 0;
	if (int err = ibv_get_srq_num(srq, &srq_num)) {
		errno = err;
		return IBV_XRC_INVALID_SRQ_NUM;
	}
	return srq_num;
}
