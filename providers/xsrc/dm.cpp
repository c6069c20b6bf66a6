// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Device memory (ibv_alloc_dm, ibv_memcpy_to_dm / _from_dm, ibv_reg_dm_mr).
// A software device's memory is host memory: a DM is a shared mapping of
// the allocating process, and an MR on it is an ordinary zero-based MR over
// that mapping, so every operation of every transport reaches it, and a
// peer reaches it through the MR's rkey like any other memory. The rules
// are the device-memory rules of mlx5 and of the kernel's REG_DM_MR: 4-byte
// aligned copies inside the allocation, zero-based MRs only.
#include "xsrc.h"

#include <sys/mman.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>

namespace {

// The DM access rules of HCAs: offsets and lengths of copies in 4-byte units.
constexpr uint64_t kDmAccessAlign = 4;
// A mapping is page aligned: the largest alignment an allocation can ask.
constexpr uint32_t kDmMaxLogAlign = 12;
// Keys of zero-length DM MRs: past the MR table, so no access ever matches them.
constexpr uint32_t kNoAccessKeyBase = 0xff000000u;

constexpr unsigned kDmMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ZERO_BASED;

// The memory of a DM: unmapped when the last DM object holding it goes (the
// allocation, and those imported from it).
struct dm_mapping {
	void *base = MAP_FAILED;
	size_t length = 0;  // what was allocated
	size_t mapped = 0;  // the length rounded up to whole pages
	~dm_mapping()
	{
		if (base != MAP_FAILED)
			munmap(base, mapped);
	}
};

struct xsrc_dm {
	ibv_dm dm;
	std::shared_ptr<dm_mapping> memory;
};

// The DMs of this process by handle, for ibv_import_dm (r6): a DM lives in
// the provider, so its handle is ours, unique in the process, and an import
// must come from a context on the same command file (the same device
// context) as the allocation.
struct dm_entry {
	uint64_t context_id = 0;
	std::weak_ptr<dm_mapping> memory;
};
std::mutex dm_table_lock;
std::map<uint32_t, dm_entry> dm_table;
uint32_t dm_next_handle = 1;

xsrc_dm *to_xsrc_dm(ibv_dm *dm)
{
	return reinterpret_cast<xsrc_dm *>(dm);
}

// Is [offset, offset + length) inside the DM and 4-byte aligned?
int dm_range_check(const xsrc_dm *dm, uint64_t offset, size_t length, const char *op)
{
	verbs_context *vctx = &to_xsrc_ctx(dm->dm.context)->ibv_ctx;
	if ((offset | length) & (kDmAccessAlign - 1)) {
		verbs_err(vctx, "%s: offset %lu and length %zu must be multiples of %lu\n", op,
			  static_cast<unsigned long>(offset), length, static_cast<unsigned long>(kDmAccessAlign));
		return EINVAL;
	}
	if (offset > dm->memory->length || length > dm->memory->length - offset) {
		verbs_err(vctx, "%s: offset %lu + length %zu exceed the DM's %zu bytes\n", op,
			  static_cast<unsigned long>(offset), length, dm->memory->length);
		return EFAULT;
	}
	return 0;
}

int xsrc_memcpy_to_dm(ibv_dm *ibdm, uint64_t dm_offset, const void *host_addr, size_t length)
{
	xsrc_dm *dm = to_xsrc_dm(ibdm);
	if (int err = dm_range_check(dm, dm_offset, length, "memcpy_to_dm"))
		return err;
	std::memcpy(static_cast<char *>(dm->memory->base) + dm_offset, host_addr, length);
	return 0;
}

int xsrc_memcpy_from_dm(void *host_addr, ibv_dm *ibdm, uint64_t dm_offset, size_t length)
{
	xsrc_dm *dm = to_xsrc_dm(ibdm);
	if (int err = dm_range_check(dm, dm_offset, length, "memcpy_from_dm"))
		return err;
	std::memcpy(host_addr, static_cast<const char *>(dm->memory->base) + dm_offset, length);
	return 0;
}

// A DM object of `ibctx` over `memory`: an allocation, or an import of one.
ibv_dm *dm_object(ibv_context *ibctx, std::shared_ptr<dm_mapping> memory, uint32_t handle)
{
	auto *dm = new xsrc_dm{};
	dm->memory = std::move(memory);
	dm->dm.context = ibctx;
	dm->dm.memcpy_to_dm = xsrc_memcpy_to_dm;
	dm->dm.memcpy_from_dm = xsrc_memcpy_from_dm;
	dm->dm.handle = handle;
	return &dm->dm;
}

}  // namespace

ibv_dm *xsrc_alloc_dm(ibv_context *ibctx, ibv_alloc_dm_attr *attr)
{
	verbs_context *vctx = &to_xsrc_ctx(ibctx)->ibv_ctx;
	if (attr->comp_mask) {
		verbs_err(vctx, "alloc_dm: comp_mask 0x%x has unsupported bits\n", attr->comp_mask);
		errno = EINVAL;
		return nullptr;
	}
	if (attr->length == 0 || attr->length > XSRC_MAX_DM_SIZE) {
		verbs_err(vctx, "alloc_dm: length %zu is not within 1..max_dm_size %lu\n", attr->length,
			  static_cast<unsigned long>(XSRC_MAX_DM_SIZE));
		errno = attr->length ? ENOMEM : EINVAL;
		return nullptr;
	}
	if (attr->log_align_req > kDmMaxLogAlign) {
		verbs_err(vctx, "alloc_dm: log_align_req %u exceeds %u\n", attr->log_align_req, kDmMaxLogAlign);
		errno = EINVAL;
		return nullptr;
	}
	return xsrc_boundary(vctx, "alloc_dm", [&]() -> ibv_dm * {
		auto memory = std::make_shared<dm_mapping>();
		long page = sysconf(_SC_PAGESIZE);
		memory->length = attr->length;
		memory->mapped = (attr->length + page - 1) / page * page;
		// Shared, so that it stays one object across fork() as device memory would.
		memory->base = mmap(nullptr, memory->mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (memory->base == MAP_FAILED) {
			int err = errno;
			verbs_err(vctx, "alloc_dm: cannot map %zu bytes: %s\n", memory->mapped, strerror(err));
			errno = err;
			return nullptr;
		}
		std::lock_guard guard(dm_table_lock);
		uint32_t handle = dm_next_handle++;
		dm_table[handle] = {to_xsrc_ctx(ibctx)->context_id, memory};
		return dm_object(ibctx, std::move(memory), handle);
	});
}

int xsrc_free_dm(ibv_dm *ibdm)
{
	{
		std::lock_guard guard(dm_table_lock);
		dm_table.erase(ibdm->handle);  // imports of it keep the memory until they go
	}
	delete to_xsrc_dm(ibdm);
	return 0;
}

ibv_dm *xsrc_import_dm(ibv_context *ibctx, uint32_t dm_handle)
{
	verbs_context *vctx = &to_xsrc_ctx(ibctx)->ibv_ctx;
	return xsrc_boundary(vctx, "import_dm", [&]() -> ibv_dm * {
		std::shared_ptr<dm_mapping> memory;
		{
			std::lock_guard guard(dm_table_lock);
			auto it = dm_table.find(dm_handle);
			if (it != dm_table.end() && it->second.context_id == to_xsrc_ctx(ibctx)->context_id)
				memory = it->second.memory.lock();
		}
		if (!memory) {
			verbs_err(vctx, "import_dm: handle %u names no DM of this device context\n", dm_handle);
			errno = EINVAL;
			return nullptr;
		}
		return dm_object(ibctx, std::move(memory), dm_handle);
	});
}

void xsrc_unimport_dm(ibv_dm *ibdm)
{
	delete to_xsrc_dm(ibdm);
}

ibv_mr *xsrc_reg_dm_mr(ibv_pd *pd, ibv_dm *ibdm, uint64_t dm_offset, size_t length, unsigned int access)
{
	xsrc_context *ctx = to_xsrc_ctx(pd->context);
	xsrc_dm *dm = to_xsrc_dm(ibdm);
	// As the kernel's REG_DM_MR: zero based, and inside the allocation.
	if (!(access & IBV_ACCESS_ZERO_BASED) || (access & ~kDmMrAccess)) {
		verbs_err(&ctx->ibv_ctx, "reg_dm_mr: access 0x%x must be zero based and within 0x%x\n", access,
			  kDmMrAccess);
		errno = EINVAL;
		return nullptr;
	}
	if (dm_offset > dm->memory->length || length > dm->memory->length - dm_offset) {
		verbs_err(&ctx->ibv_ctx, "reg_dm_mr: offset %lu + length %zu exceed the DM's %zu bytes\n",
			  static_cast<unsigned long>(dm_offset), length, dm->memory->length);
		errno = EINVAL;
		return nullptr;
	}
	if (length == 0) {
		// Reaches nothing (the device has no zero-length MRs): keys no
		// access matches, and nothing for the device to release.
		auto *vmr = new (std::nothrow) verbs_mr{};
		if (!vmr) {
			errno = ENOMEM;
			return nullptr;
		}
		static std::atomic<uint32_t> next{0};
		uint32_t key = kNoAccessKeyBase | (next.fetch_add(1, std::memory_order_relaxed) & ~kNoAccessKeyBase);
		vmr->ibv_mr.context = pd->context;
		vmr->ibv_mr.pd = pd;
		vmr->ibv_mr.lkey = vmr->ibv_mr.rkey = key;
		vmr->ibv_mr.handle = XSRC_NO_MR_HANDLE;
		vmr->mr_type = IBV_MR_TYPE_MR;
		vmr->access = static_cast<int>(access);
		return &vmr->ibv_mr;
	}
	return xsrc_mr_register(pd, static_cast<char *>(dm->memory->base) + dm_offset, length, 0, static_cast<int>(access));
}
