// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Scatter lists: the pieces of a list of iovecs that cover a byte range of
// the bytes they hold end to end. Shared by the provider (its copies and
// wire segments) and the daemon (its copies and wire deliveries).
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

namespace xsrc {

// Writes to `out` the pieces of `src` that cover bytes [from, from + len);
// returns how many (`out` has room for as many as `src` has).
inline size_t iov_slice(std::span<const iovec> src, uint64_t from, uint64_t len, iovec *out) noexcept
{
	size_t n = 0;
	uint64_t pos = 0;
	for (const iovec &v : src) {
		uint64_t lo = std::max<uint64_t>(pos, from), hi = std::min<uint64_t>(pos + v.iov_len, from + len);
		if (lo < hi)
			out[n++] = {static_cast<char *>(v.iov_base) + (lo - pos), hi - lo};
		pos += v.iov_len;
	}
	return n;
}

}  // namespace xsrc
