// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// ibv_open_xrc_domain / ibv_close_xrc_domain on ibv_open_xrcd / ibv_close_xrcd,
// and the set of open domains that lets every call reject a stale or foreign
// domain pointer with EINVAL instead of dereferencing it.
#include "domain.h"

#include <fcntl.h>

#include <new>

namespace verbs_ext {
namespace {

struct domain_registry {
	std::mutex lock;
	std::unordered_map<ibv_xrc_domain *, opened_domain *> open;
};

// Never destroyed: programs may close domains from atexit handlers or other
// libraries' destructors, after this library's static destructors ran.
domain_registry &registry()
{
	static auto *r = new domain_registry;
	return *r;
}

}  // namespace

opened_domain *domain_lookup(ibv_xrc_domain *pub)
{
	if (!pub)
		return nullptr;
	domain_registry &r = registry();
	std::lock_guard guard(r.lock);
	auto it = r.open.find(pub);
	return it == r.open.end() ? nullptr : it->second;
}

}  // namespace verbs_ext

using namespace verbs_ext;

extern "C" ibv_xrc_domain *ibv_open_xrc_domain(ibv_context *context, int fd, int oflag)
{
	if (!context || (fd == -1 && oflag != O_CREAT))
		return fail_null<ibv_xrc_domain>(EINVAL);

	auto *domain = new (std::nothrow) opened_domain;
	if (!domain)
		return fail_null<ibv_xrc_domain>(ENOMEM);

	ibv_xrcd_init_attr attr{};
	attr.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	attr.fd = fd;
	attr.oflags = oflag;
	ibv_xrcd *xrcd = ibv_open_xrcd(context, &attr);
	if (!xrcd) {
		int err = errno;
		delete domain;
		return fail_null<ibv_xrc_domain>(err ? err : EINVAL);
	}
	domain->pub.context = context;
	domain->pub.xrcd = xrcd;

	try {
		domain_registry &r = registry();
		std::lock_guard guard(r.lock);
		r.open.emplace(&domain->pub, domain);
	} catch (const std::bad_alloc &) {
		ibv_close_xrcd(xrcd);
		delete domain;
		return fail_null<ibv_xrc_domain>(ENOMEM);
	}
	return &domain->pub;
}

extern "C" int ibv_close_xrc_domain(ibv_xrc_domain *d)
{
	opened_domain *domain = domain_lookup(d);
	if (!domain)
		return fail(EINVAL);

	{
		// Our receive-QP handles keep the XRCD busy: drop them first, as the
		// legacy close (and process exit) dropped the process's registrations.
		std::lock_guard guard(domain->lock);
		for (auto it = domain->registrations.begin(); it != domain->registrations.end();) {
			if (int err = ibv_destroy_qp(it->second))
				return fail(err);
			it = domain->registrations.erase(it);
		}
	}
	if (int err = ibv_close_xrcd(domain->pub.xrcd))
		return fail(err);

	{
		domain_registry &r = registry();
		std::lock_guard guard(r.lock);
		r.open.erase(d);
	}
	delete domain;
	return 0;
}
