// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Legacy XRC receive QPs on upstream XRC TGT QPs. A legacy receive QP belongs
// to its domain and lives while any process is registered with it; upstream,
// an XRC TGT QP lives while any process holds a handle to it. So a
// registration is a handle: created (ibv_create_qp_ex) or opened
// (ibv_open_qp) into the domain's table, and destroyed to unregister.
#include "domain.h"

#include <new>

using namespace verbs_ext;

namespace {

// A new handle to the receive QP qpn of domain, or nullptr with the error.
ibv_qp *open_rcv_qp(opened_domain *domain, uint32_t qpn, int *err)
{
	ibv_qp_open_attr attr{};
	attr.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	attr.qp_num = qpn;
	attr.xrcd = domain->pub.xrcd;
	attr.qp_type = IBV_QPT_XRC_RECV;
	ibv_qp *qp = ibv_open_qp(domain->pub.context, &attr);
	if (!qp) {
		// Upstream reports "no such QP in this XRCD" as EINVAL.
		*err = (errno == EINVAL || errno == ENOENT || !errno) ? ENOENT : errno;
		return nullptr;
	}
	return qp;
}

// Runs op on this process's handle to qpn, or on a temporary one if this
// process is not registered. Returns op's result or the error.
template <typename Op>
int with_rcv_qp(ibv_xrc_domain *xrc_domain, uint32_t qpn, Op op)
{
	opened_domain *domain = domain_lookup(xrc_domain);
	if (!domain || (qpn & ~qpn_mask))
		return fail(EINVAL);

	std::lock_guard guard(domain->lock);
	if (auto it = domain->registrations.find(qpn); it != domain->registrations.end()) {
		if (int err = op(it->second))
			return fail(err);
		return 0;
	}
	int err = 0;
	ibv_qp *qp = open_rcv_qp(domain, qpn, &err);
	if (!qp)
		return fail(err);
	err = op(qp);
	// Dropping a temporary handle never destroys a QP that someone holds.
	int destroy_err = ibv_destroy_qp(qp);
	if (err || destroy_err)
		return fail(err ? err : destroy_err);
	return 0;
}

}  // namespace

extern "C" int ibv_create_xrc_rcv_qp(ibv_xrc_qp_init_attr *init_attr, uint32_t *xrc_rcv_qpn)
{
	if (!init_attr || !xrc_rcv_qpn)
		return fail(EINVAL);
	opened_domain *domain = domain_lookup(init_attr->xrc_domain);
	if (!domain)
		return fail(EINVAL);

	ibv_qp_init_attr_ex attr{};
	attr.qp_context = init_attr->qp_context;
	attr.qp_type = IBV_QPT_XRC_RECV;
	attr.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	attr.xrcd = domain->pub.xrcd;

	std::lock_guard guard(domain->lock);
	ibv_qp *qp = ibv_create_qp_ex(domain->pub.context, &attr);
	if (!qp)
		return fail(errno ? errno : EINVAL);
	try {
		domain->registrations.emplace(qp->qp_num, qp);
	} catch (const std::bad_alloc &) {
		ibv_destroy_qp(qp);
		return fail(ENOMEM);
	}
	*xrc_rcv_qpn = qp->qp_num;
	return 0;
}

extern "C" int ibv_reg_xrc_rcv_qp(ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num)
{
	opened_domain *domain = domain_lookup(xrc_domain);
	if (!domain || (xrc_qp_num & ~qpn_mask))
		return fail(EINVAL);

	std::lock_guard guard(domain->lock);
	if (domain->registrations.contains(xrc_qp_num))
		return 0;  // a process is registered once
	int err = 0;
	ibv_qp *qp = open_rcv_qp(domain, xrc_qp_num, &err);
	if (!qp)
		return fail(err);
	try {
		domain->registrations.emplace(xrc_qp_num, qp);
	} catch (const std::bad_alloc &) {
		ibv_destroy_qp(qp);
		return fail(ENOMEM);
	}
	return 0;
}

extern "C" int ibv_unreg_xrc_rcv_qp(ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num)
{
	opened_domain *domain = domain_lookup(xrc_domain);
	if (!domain || (xrc_qp_num & ~qpn_mask))
		return fail(EINVAL);

	std::lock_guard guard(domain->lock);
	auto it = domain->registrations.find(xrc_qp_num);
	if (it == domain->registrations.end())
		return fail(ENOENT);
	if (int err = ibv_destroy_qp(it->second))
		return fail(err);
	domain->registrations.erase(it);
	return 0;
}

extern "C" int ibv_modify_xrc_rcv_qp(ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num,
				     ibv_qp_attr *attr, int attr_mask)
{
	if (!attr)
		return fail(EINVAL);
	return with_rcv_qp(xrc_domain, xrc_qp_num,
			   [&](ibv_qp *qp) { return ibv_modify_qp(qp, attr, attr_mask); });
}

extern "C" int ibv_query_xrc_rcv_qp(ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num,
				    ibv_qp_attr *attr, int attr_mask,
				    ibv_xrc_qp_init_attr *init_attr)
{
	if (!attr)
		return fail(EINVAL);
	return with_rcv_qp(xrc_domain, xrc_qp_num, [&](ibv_qp *qp) {
		ibv_qp_init_attr upstream{};
		if (int err = ibv_query_qp(qp, attr, attr_mask, &upstream))
			return err;
		if (init_attr) {
			init_attr->qp_context = upstream.qp_context;
			init_attr->send_cq = upstream.send_cq;
			init_attr->recv_cq = upstream.recv_cq;
			init_attr->srq = upstream.srq;
			init_attr->cap = upstream.cap;
			init_attr->qp_type = IBV_QPT_XRC_RECV;
			init_attr->sq_sig_all = upstream.sq_sig_all;
			init_attr->xrc_domain = xrc_domain;
		}
		return 0;
	});
}
