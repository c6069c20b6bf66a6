// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The send queue's slots: allocated once when the QP is created.
#include "send_queue.h"

#include <cerrno>
#include <cstring>
#include <new>

int xsrc_wqe_slots::init(size_t count, uint32_t max_sge, uint32_t max_inline, const xsrc_allocator *allocator,
			 uint64_t resource_type) noexcept
{
	static_assert(sizeof(xsrc_send_wqe) % alignof(ibv_sge) == 0);
	wqes_ = nullptr;
	count_ = 0;
	size_t wqe_bytes = count * sizeof(xsrc_send_wqe), sge_bytes = count * max_sge * sizeof(ibv_sge);
	if (buf_.allocate(wqe_bytes + sge_bytes + count * max_inline, allocator, resource_type))
		return ENOMEM;
	// Only the WQEs are constructed: pages nobody writes to stay untouched.
	auto *base = static_cast<unsigned char *>(buf_.data());
	wqes_ = reinterpret_cast<xsrc_send_wqe *>(base);
	auto *sges = reinterpret_cast<ibv_sge *>(base + wqe_bytes);
	unsigned char *bytes = base + wqe_bytes + sge_bytes;
	count_ = count;
	max_sge_ = max_sge;
	max_inline_ = max_inline;
	for (size_t i = 0; i < count; ++i) {
		new (&wqes_[i]) xsrc_send_wqe{};
		wqes_[i].sge = &sges[i * max_sge];
		wqes_[i].inline_data = &bytes[i * max_inline];
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
