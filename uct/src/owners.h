// Owners of what an iface allocates from verbs and the kernel: each frees its object when it
// goes, so a half-built iface cleans itself up (fds: xsrc::unique_fd, common/fd.h).
#pragma once

#include <infiniband/verbs.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <utility>

namespace xsrc::uct {

// A unique_ptr deleter calling the verbs destructor `Destroy` (its status is of no use here).
template <auto Destroy>
struct VerbsDeleter {
	template <typename T>
	void operator()(T *object) const noexcept
	{
		Destroy(object);
	}
};

using ContextPtr = std::unique_ptr<ibv_context, VerbsDeleter<ibv_close_device>>;
using PdPtr = std::unique_ptr<ibv_pd, VerbsDeleter<ibv_dealloc_pd>>;
using DeviceListPtr = std::unique_ptr<ibv_device *, VerbsDeleter<ibv_free_device_list>>;
using MrPtr = std::unique_ptr<ibv_mr, VerbsDeleter<ibv_dereg_mr>>;
using SrqPtr = std::unique_ptr<ibv_srq, VerbsDeleter<ibv_destroy_srq>>;
// (ibv_close_xrcd is an inline function of verbs.h: no template argument.)
struct XrcdDeleter {
	void operator()(ibv_xrcd *xrcd) const noexcept { ibv_close_xrcd(xrcd); }
};
using XrcdPtr = std::unique_ptr<ibv_xrcd, XrcdDeleter>;

struct FreeDeleter {
	void operator()(void *p) const noexcept { std::free(p); }
};

// An anonymous private mapping (mmap), unmapped with its owner.
class Mapping {
public:
	Mapping() = default;
	// `extra_flags`: e.g. MAP_NORESERVE. Empty (!*this) if the kernel refuses.
	explicit Mapping(size_t len, int extra_flags = 0) noexcept
	{
		void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | extra_flags, -1, 0);
		if (p != MAP_FAILED) {
			mem_ = static_cast<char *>(p);
			len_ = len;
		}
	}
	Mapping(Mapping &&o) noexcept : mem_(std::exchange(o.mem_, nullptr)), len_(std::exchange(o.len_, 0)) {}
	Mapping &operator=(Mapping &&o) noexcept
	{
		Mapping gone(std::move(*this));
		mem_ = std::exchange(o.mem_, nullptr);
		len_ = std::exchange(o.len_, 0);
		return *this;
	}
	Mapping(const Mapping &) = delete;
	Mapping &operator=(const Mapping &) = delete;
	~Mapping()
	{
		if (mem_)
			munmap(mem_, len_);
	}

	char *data() const noexcept { return mem_; }
	size_t size() const noexcept { return len_; }
	explicit operator bool() const noexcept { return mem_ != nullptr; }

private:
	char *mem_ = nullptr;
	size_t len_ = 0;
};

}  // namespace xsrc::uct
