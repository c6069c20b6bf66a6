// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The buffers the provider allocates for a queue it owns (a QP's send
// queue): from the allocator of the parent domain the object was created
// through (ibv_alloc_parent_domain(3)), else from the heap. The rings in the
// arena are the device's and never come from an application's allocator.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

// The resource_type a parent domain's allocator is called with: the driver
// id in the upper 32 bits (xsrc registers as RDMA_DRIVER_UNKNOWN, 0), then
// which buffer.
enum : uint64_t {
	XSRC_RES_TYPE_SQ = 1,          // a QP's send queue: WQE slots, gather lists, inline bytes
	XSRC_RES_TYPE_SQ_STAGING = 2,  // a QP's ibv_wr_* staging slots (IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
};

// A parent domain's custom allocator (IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS).
struct xsrc_allocator {
	ibv_pd *parent_domain = nullptr;  // what alloc and free are told
	void *pd_context = nullptr;
	void *(*alloc)(ibv_pd *pd, void *pd_context, size_t size, size_t alignment, uint64_t resource_type) = nullptr;
	void (*free)(ibv_pd *pd, void *pd_context, void *ptr, uint64_t resource_type) = nullptr;
};

// One buffer and how to give it back. Move-only; freed by its destructor.
class xsrc_buf {
public:
	// Every buffer starts on a cache line of its own.
	static constexpr size_t kAlignment = 64;

	xsrc_buf() = default;
	~xsrc_buf() { reset(); }
	xsrc_buf(const xsrc_buf &) = delete;
	xsrc_buf &operator=(const xsrc_buf &) = delete;

	// `size` bytes from `allocator` (null: the heap; so too when its alloc
	// answers IBV_ALLOCATOR_USE_DEFAULT). Frees what it held first.
	// Returns 0 or ENOMEM (the allocator answered NULL).
	int allocate(size_t size, const xsrc_allocator *allocator, uint64_t resource_type) noexcept;
	void reset() noexcept;

	void *data() const noexcept { return addr_; }
	size_t size() const noexcept { return size_; }
	// Its memory came from a parent domain's allocator.
	bool custom() const noexcept { return custom_ != nullptr; }

private:
	void *addr_ = nullptr;
	size_t size_ = 0;
	const xsrc_allocator *custom_ = nullptr;  // the allocator to free through; null: the heap
	uint64_t resource_type_ = 0;
};
