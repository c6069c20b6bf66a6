// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Queue buffers from a parent domain's allocator or the heap.
#include "buf.h"

#include <cerrno>
#include <cstring>
#include <new>

int xsrc_buf::allocate(size_t size, const xsrc_allocator *allocator, uint64_t resource_type) noexcept
{
	reset();
	if (allocator && allocator->alloc) {
		void *p = allocator->alloc(allocator->parent_domain, allocator->pd_context, size, kAlignment,
					   resource_type);
		if (p != IBV_ALLOCATOR_USE_DEFAULT) {
			if (!p && size)
				return ENOMEM;
			addr_ = p;
			size_ = size;
			custom_ = allocator;
			resource_type_ = resource_type;
			return 0;
		}
	}
	addr_ = ::operator new(size ? size : 1, std::align_val_t{kAlignment}, std::nothrow);
	if (!addr_)
		return ENOMEM;
	size_ = size;
	return 0;
}

void xsrc_buf::reset() noexcept
{
	if (custom_) {
		if (custom_->free)
			custom_->free(custom_->parent_domain, custom_->pd_context, addr_, resource_type_);
	} else if (addr_) {
		::operator delete(addr_, std::align_val_t{kAlignment});
	}
	addr_ = nullptr;
	size_ = 0;
	custom_ = nullptr;
	resource_type_ = 0;
}
