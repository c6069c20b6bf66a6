// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The original OpenFabrics SRC proposal's names for the XRC domain and SRQ
// calls: same objects, same semantics.
#include <infiniband/verbs_ext.h>

extern "C" ibv_xrc_domain *ibv_open_src_domain(ibv_context *context, int fd, int oflag)
{
	return ibv_open_xrc_domain(context, fd, oflag);
}

extern "C" int ibv_close_src_domain(ibv_xrc_domain *d)
{
	return ibv_close_xrc_domain(d);
}

extern "C" ibv_srq *ibv_create_src_srq(ibv_pd *pd, ibv_xrc_domain *src_domain, ibv_cq *src_cq,
				       ibv_srq_init_attr *srq_init_attr)
{
	return ibv_create_xrc_srq(pd, src_domain, src_cq, srq_init_attr);
}
