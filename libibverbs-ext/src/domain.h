// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// An opened legacy XRC domain: the upstream XRCD plus this process's XRC
// receive-QP registrations in it (one upstream QP handle per registration).
#pragma once

#include <infiniband/verbs_ext.h>

#include <cerrno>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace verbs_ext {

struct opened_domain {
	ibv_xrc_domain pub{};			// what the caller holds
	std::mutex lock;			// guards registrations
	std::unordered_map<uint32_t, ibv_qp *> registrations;	// QPN -> our handle
};

// The domain behind a caller's pointer, or nullptr if this library has no
// open domain at that address (never opened, or closed).
opened_domain *domain_lookup(ibv_xrc_domain *pub);

// QP numbers are 24 bits wide on the wire.
constexpr uint32_t qpn_mask = 0xffffff;

// The int-returning calls' convention: the errno value, also left in errno.
inline int fail(int err)
{
	errno = err;
	return err;
}

// The pointer-returning calls' convention: NULL with errno.
template <typename T>
T *fail_null(int err)
{
	errno = err;
	return nullptr;
}

}  // namespace verbs_ext
