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

void xsrc_wqe_slots::set_inline(xsrc_send_wqe &wqe, const ibv_data_buf *bufs, size_t n) const noexcept
{
	uint64_t total = 0;
	for (size_t i = 0; i < n; ++i) {
		if (total + bufs[i].length <= max_inline_ && bufs[i].length)
			std::memcpy(wqe.inline_data + total, bufs[i].addr, bufs[i].length);
		total += bufs[i].length;
	}
	wqe.inline_len = total;
}

void xsrc_wqe_slots::set_inline_from_sge(xsrc_send_wqe &wqe, const ibv_sge *list, size_t n) const noexcept
{
	uint64_t total = 0;
	for (size_t i = 0; i < n; ++i) {
		if (total + list[i].length <= max_inline_ && list[i].length)
			std::memcpy(wqe.inline_data + total, reinterpret_cast<const void *>(list[i].addr),
				    list[i].length);
		total += list[i].length;
	}
	wqe.inline_len = total;
}
