// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Address handles: created through the daemon (which checks the GID index);
// the provider keeps the attributes a UD send needs.
#include "xsrc.h"

#include <new>

ibv_ah *xsrc_create_ah(ibv_pd *pd, ibv_ah_attr *attr)
{
	verbs_context *vctx = &to_xsrc_ctx(pd->context)->ibv_ctx;
	auto *ah = new (std::nothrow) xsrc_ah{};
	if (!ah) {
		verbs_err(vctx, "create_ah: no memory for the AH\n");
		errno = ENOMEM;
		return nullptr;
	}
	ah->attr = *attr;
	if (attr->is_global && ibv_query_gid(pd->context, attr->port_num, attr->grh.sgid_index, &ah->sgid)) {
		verbs_err(vctx, "create_ah: port %u has no GID at sgid_index %u\n", attr->port_num,
			  attr->grh.sgid_index);
		delete ah;
		errno = EINVAL;
		return nullptr;
	}
	// Looked up once here, not at every UD send on the wire: libibverbs
	// reads it from sysfs (several system calls).
	ibv_gid_entry entry{};
	if (attr->is_global && !ibv_query_gid_ex(pd->context, attr->port_num, attr->grh.sgid_index, &entry, 0))
		ah->sgid_ifindex = entry.ndev_ifindex;
	ib_uverbs_create_ah_resp resp{};
	if (int err = ibv_cmd_create_ah(pd, &ah->ah, attr, &resp, sizeof(resp))) {
		verbs_err(vctx, "create_ah: the device refused port %u, dlid %u, is_global %u: %s\n", attr->port_num,
			  attr->dlid, attr->is_global, strerror(err));
		delete ah;
		errno = err;
		return nullptr;
	}
	ah->engine = xsrc_route(pd->context, *attr);
	ah->multicast = attr->is_global && xsrc_is_multicast_gid(attr->grh.dgid.raw);
	return &ah->ah;
}

int xsrc_destroy_ah(ibv_ah *ah)
{
	if (int err = xsrc_destroy_status(to_xsrc_ctx(ah->context), ibv_cmd_destroy_ah(ah))) {
		verbs_err(&to_xsrc_ctx(ah->context)->ibv_ctx, "destroy_ah: the device refused: %s\n", strerror(err));
		return err;
	}
	delete to_xsrc_ah(ah);
	return 0;
}
