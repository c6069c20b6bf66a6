// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The send queue's slots: allocated once when the QP is created.
#include "send_queue.h"

#include <cerrno>
#include <cstring>
#include <new>

int xsrc_wqe_slots::init(size_t count, uint32_t max_sge, uint32_t max_inline) noexcept
{
	// Default-initialised storage: pages nobody writes to stay untouched.
	wqes_.reset(new (std::nothrow) xsrc_send_wqe[count]);
	sges_.reset(new (std::nothrow) ibv_sge[count * max_sge]);
	bytes_.reset(new (std::nothrow) unsigned char[count * max_inline]);
	if (!wqes_ || !sges_ || !bytes_)
		return ENOMEM;
	count_ = count;
	max_sge_ = max_sge;
	max_inline_ = max_inline;
	for (size_t i = 0; i < count; ++i) {
		wqes_[i].sge = &sges_[i * max_sge];
		wqes_[i].inline_data = &bytes_[i * max_inline];
	}
	return 0;
}

void xsrc_wqe_slots::set_sge(xsrc_send_wqe &wqe, const ibv_sge *list, size_t n) const noexcept
{
	wqe.num_sge = n;
	if (n <= max_sge_ && n)
		std::memcpy(wqe.sge, list, n * sizeof(*list));
}

namespace {

// Copies the pieces into `dst` while they fit in `room`; returns their total.
template <typename Piece, typename AddressOf>
uint64_t gather_inline(unsigned char *dst, uint32_t room, const Piece *pieces, size_t n, AddressOf address_of)
{
	uint64_t total = 0;
	for (size_t i = 0; i < n; ++i) {
		if (total + pieces[i].length <= room && pieces[i].length)
			std::memcpy(dst + total, address_of(pieces[i]), pieces[i].length);
		total += pieces[i].length;
	}
	return total;
}

}  // namespace

void xsrc_wqe_slots::set_inline(xsrc_send_wqe &wqe, const ibv_data_buf *bufs, size_t n) const noexcept
{
	wqe.inline_len = gather_inline(wqe.inline_data, max_inline_, bufs, n,
				       [](const ibv_data_buf &b) { return b.addr; });
}

void xsrc_wqe_slots::set_inline_from_sge(xsrc_send_wqe &wqe, const ibv_sge *list, size_t n) const noexcept
{
	wqe.inline_len = gather_inline(wqe.inline_data, max_inline_, list, n, [](const ibv_sge &s) {
		return reinterpret_cast<const void *>(s.addr);
	});
}
