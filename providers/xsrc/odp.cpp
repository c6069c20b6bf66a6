// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// On-demand paging. The data path never pins pages: it translates every
// access through the MR table and moves bytes with process_vm_* (which
// fault pages in, and fail on a hole), so an ODP MR needs no more than a
// registration the device does not check against the mappings, and
// ibv_advise_mr, which libibverbs sends only through the ioctl ABI, is
// served here without a device round trip.
#include "xsrc.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <mutex>

// --- the registry ----------------------------------------------------------

void xsrc_odp_mrs::add(const mr &m)
{
	std::unique_lock guard(lock_);
	mrs_.push_back(m);
}

void xsrc_odp_mrs::remove(uint32_t lkey)
{
	std::unique_lock guard(lock_);
	std::erase_if(mrs_, [&](const mr &m) { return m.lkey == lkey; });
}

bool xsrc_odp_mrs::find(uint32_t lkey, mr &out) const
{
	std::shared_lock guard(lock_);
	auto it = std::find_if(mrs_.begin(), mrs_.end(), [&](const mr &m) { return m.lkey == lkey; });
	if (it == mrs_.end())
		return false;
	out = *it;
	return true;
}

// --- mappings --------------------------------------------------------------

namespace {

uint64_t page_size()
{
	static const uint64_t size = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
	return size;
}

// The whole pages that hold [addr, addr+len), len > 0 and no wrap.
struct Pages {
	uint64_t start, bytes;
};

Pages pages_of(uint64_t addr, uint64_t len)
{
	uint64_t ps = page_size();
	uint64_t start = addr & ~(ps - 1);
	uint64_t end = addr + len;
	end = end > UINT64_MAX - (ps - 1) ? UINT64_MAX & ~(ps - 1) : (end + ps - 1) & ~(ps - 1);
	return {start, end - start};
}

}  // namespace

bool xsrc_odp_mapped(uint64_t addr, uint64_t len) noexcept
{
	if (len == 0)
		return true;
	if (addr + len < addr)
		return false;
	Pages p = pages_of(addr, len);
	// mincore fails with ENOMEM on any hole; it needs a byte per page.
	constexpr uint64_t kPagesPerCall = 4096;
	std::array<unsigned char, kPagesPerCall> vec;
	uint64_t step = kPagesPerCall * page_size();
	for (uint64_t off = 0; off < p.bytes; off += step) {
		uint64_t n = std::min(step, p.bytes - off);
		if (mincore(reinterpret_cast<void *>(p.start + off), n, vec.data()) != 0)
			return false;
	}
	return true;
}

// --- ibv_advise_mr ---------------------------------------------------------

namespace {

// Faults the pages in for reading or writing, as a prefetch does on an
// HCA. MADV_POPULATE_* (Linux 5.14) fail on a hole or on pages the
// process may not access so; an older kernel (EINVAL) gets the mapping
// check alone.
int prefetch(uint64_t addr, uint64_t len, bool write)
{
#ifdef MADV_POPULATE_WRITE
	Pages p = pages_of(addr, len);
	if (madvise(reinterpret_cast<void *>(p.start), p.bytes, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0)
		return 0;
	if (errno != EINVAL)
		return EFAULT;
#else
	(void)write;
#endif
	return xsrc_odp_mapped(addr, len) ? 0 : EFAULT;
}

int advise_mr(ibv_pd *pd, ibv_advise_mr_advice advice, uint32_t flags, const ibv_sge *sg_list, uint32_t num_sge)
{
	xsrc_context *ctx = to_xsrc_ctx(pd->context);
	verbs_context *vctx = &ctx->ibv_ctx;
	if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
	    advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT) {
		verbs_err(vctx, "advise_mr: unknown advice %d\n", advice);
		return EOPNOTSUPP;
	}
	if (flags & ~uint32_t(IBV_ADVISE_MR_FLAG_FLUSH)) {
		verbs_err(vctx, "advise_mr: unknown flags 0x%x\n", flags);
		return EINVAL;
	}
	if (num_sge == 0 || !sg_list) {
		verbs_err(vctx, "advise_mr: no SGE\n");
		return EINVAL;
	}
	bool write = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE;
	// Every SGE is checked before any page is touched, as the kernel does.
	for (uint32_t i = 0; i < num_sge; ++i) {
		const ibv_sge &sge = sg_list[i];
		xsrc_odp_mrs::mr mr;
		if (!ctx->odp_mrs.find(sge.lkey, mr) || mr.pd != pd) {
			// As the kernel's mlx5: an lkey that names no ODP MR of this PD.
			verbs_err(vctx, "advise_mr: lkey 0x%x is no ODP MR of this PD\n", sge.lkey);
			return ENOENT;
		}
		if (write && !mr.writable) {
			verbs_err(vctx, "advise_mr: PREFETCH_WRITE into lkey 0x%x without local write\n", sge.lkey);
			return ENOENT;
		}
		if (sge.addr < mr.iova || sge.length > mr.length || sge.addr - mr.iova > mr.length - sge.length) {
			verbs_err(vctx, "advise_mr: SGE %u (0x%llx, %u bytes) is outside lkey 0x%x\n", i,
				  static_cast<unsigned long long>(sge.addr), sge.length, sge.lkey);
			return EFAULT;
		}
	}
	// NO_FAULT only snapshots what is mapped; without FLUSH the prefetch is
	// asynchronous and its failures are not reported (the access will be).
	bool faulting = advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT;
	bool sync = flags & IBV_ADVISE_MR_FLAG_FLUSH;
	for (uint32_t i = 0; i < num_sge && faulting; ++i) {
		const ibv_sge &sge = sg_list[i];
		xsrc_odp_mrs::mr mr;
		ctx->odp_mrs.find(sge.lkey, mr);
		if (sge.length == 0)
			continue;
		uint64_t va = mr.addr + (sge.addr - mr.iova);
		if (!sync) {
			Pages p = pages_of(va, sge.length);
			madvise(reinterpret_cast<void *>(p.start), p.bytes, MADV_WILLNEED);
			continue;
		}
		if (int err = prefetch(va, sge.length, write)) {
			verbs_err(vctx, "advise_mr: SGE %u (0x%llx, %u bytes) is not mapped\n", i,
				  static_cast<unsigned long long>(sge.addr), sge.length);
			return err;
		}
	}
	return 0;
}

}  // namespace

int xsrc_advise_mr(ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags, ibv_sge *sg_list,
		   uint32_t num_sge)
{
	return xsrc_boundary(&to_xsrc_ctx(pd->context)->ibv_ctx, "advise_mr",
			     [&] { return advise_mr(pd, advice, flags, sg_list, num_sge); });
}
