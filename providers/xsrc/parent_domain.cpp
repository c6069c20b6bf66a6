// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Thread domains and parent domains (ibv_alloc_td(3),
// ibv_alloc_parent_domain(3)): provider objects over a real PD, never seen
// by the device. Objects made through a parent domain take their queue
// buffers from its allocator and, with a thread domain, go without the
// locks that only guard against the application's own threads.
#include "xsrc.h"

#include <new>

namespace {

constexpr uint32_t supported_pd_comp_mask =
	IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;

ibv_pd *parent_domain_alloc(ibv_context *ibctx, const ibv_parent_domain_init_attr *attr)
{
	verbs_context *vctx = &to_xsrc_ctx(ibctx)->ibv_ctx;
	if (!attr->pd) {
		verbs_err(vctx, "alloc_parent_domain: a parent domain needs a PD\n");
		errno = EINVAL;
		return nullptr;
	}
	if (attr->comp_mask & ~supported_pd_comp_mask) {
		verbs_err(vctx, "alloc_parent_domain: comp_mask 0x%x has unknown bits 0x%x\n", attr->comp_mask,
			  attr->comp_mask & ~supported_pd_comp_mask);
		errno = EINVAL;
		return nullptr;
	}
	xsrc_pd *pd = to_xsrc_pd(attr->pd);
	if (attr->pd->context != ibctx || pd->protection_domain) {
		verbs_err(vctx, "alloc_parent_domain: the PD is %s\n",
			  pd->protection_domain ? "itself a parent domain" : "of another context");
		errno = EINVAL;
		return nullptr;
	}
	if (attr->td && attr->td->context != ibctx) {
		verbs_err(vctx, "alloc_parent_domain: the thread domain is of another context\n");
		errno = EINVAL;
		return nullptr;
	}
	bool allocators = attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
	if (allocators && (!attr->alloc || !attr->free)) {
		verbs_err(vctx, "alloc_parent_domain: IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS without %s\n",
			  attr->alloc ? "a free callback" : "an alloc callback");
		errno = EINVAL;
		return nullptr;
	}
	auto *parent = new (std::nothrow) xsrc_parent_domain{};
	if (!parent) {
		verbs_err(vctx, "alloc_parent_domain: no memory for the parent domain\n");
		errno = ENOMEM;
		return nullptr;
	}
	// Interchangeable with the PD for libibverbs and the device.
	parent->xpd.pd.context = ibctx;
	parent->xpd.pd.handle = attr->pd->handle;
	parent->xpd.protection_domain = pd;
	pd->refcount.fetch_add(1, std::memory_order_relaxed);
	if (attr->td) {
		parent->td = reinterpret_cast<xsrc_td *>(attr->td);
		parent->td->refcount.fetch_add(1, std::memory_order_relaxed);
	}
	parent->allocator.parent_domain = &parent->xpd.pd;
	if (allocators) {
		parent->allocator.alloc = attr->alloc;
		parent->allocator.free = attr->free;
	}
	if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)
		parent->allocator.pd_context = attr->pd_context;
	return &parent->xpd.pd;
}

}  // namespace

ibv_td *xsrc_alloc_td(ibv_context *ibctx, ibv_td_init_attr *attr)
{
	verbs_context *vctx = &to_xsrc_ctx(ibctx)->ibv_ctx;
	if (attr->comp_mask) {
		verbs_err(vctx, "alloc_td: comp_mask 0x%x has unknown bits\n", attr->comp_mask);
		errno = EINVAL;
		return nullptr;
	}
	auto *td = new (std::nothrow) xsrc_td{};
	if (!td) {
		verbs_err(vctx, "alloc_td: no memory for the thread domain\n");
		errno = ENOMEM;
		return nullptr;
	}
	td->td.context = ibctx;
	return &td->td;
}

int xsrc_dealloc_td(ibv_td *ibtd)
{
	auto *td = reinterpret_cast<xsrc_td *>(ibtd);
	if (uint32_t n = td->refcount.load(std::memory_order_acquire); n > 1) {
		verbs_err(&to_xsrc_ctx(ibtd->context)->ibv_ctx, "dealloc_td: %u parent domains still hold it\n",
			  n - 1);
		return EBUSY;
	}
	delete td;
	return 0;
}

ibv_pd *xsrc_alloc_parent_domain(ibv_context *ibctx, ibv_parent_domain_init_attr *attr)
{
	return xsrc_boundary(&to_xsrc_ctx(ibctx)->ibv_ctx, "alloc_parent_domain",
			     [&] { return parent_domain_alloc(ibctx, attr); });
}

int xsrc_dealloc_parent_domain(xsrc_parent_domain *parent)
{
	if (uint32_t n = parent->xpd.refcount.load(std::memory_order_acquire); n > 1) {
		verbs_err(&to_xsrc_ctx(parent->xpd.pd.context)->ibv_ctx,
			  "dealloc_pd: %u QPs, SRQs or CQs made through the parent domain still hold it\n", n - 1);
		return EBUSY;
	}
	parent->xpd.protection_domain->refcount.fetch_sub(1, std::memory_order_release);
	if (parent->td)
		parent->td->refcount.fetch_sub(1, std::memory_order_release);
	delete parent;
	return 0;
}
