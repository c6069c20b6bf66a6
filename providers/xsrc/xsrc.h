// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The xsrc provider's objects, shared by xsrc.cpp (device and context
// lifetime, channel pool) and verbs.cpp (the verbs and the ops table).
#pragma once

#include "verbs_private.h"

#include <xsrc-abi.h>

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

// Owns one file descriptor.
class unique_fd {
public:
	unique_fd() = default;
	explicit unique_fd(int fd) noexcept : fd_(fd) {}
	unique_fd(unique_fd &&other) noexcept : fd_(other.release()) {}
	unique_fd &operator=(unique_fd &&other) noexcept
	{
		reset(other.release());
		return *this;
	}
	~unique_fd() { reset(); }

	int get() const noexcept { return fd_; }
	int release() noexcept { return std::exchange(fd_, -1); }
	void reset(int fd = -1) noexcept
	{
		if (fd_ >= 0) {
			int saved = errno; // errors are reported after cleanup
			close(fd_);
			errno = saved;
		}
		fd_ = fd;
	}

private:
	int fd_ = -1;
};

struct pipe_fds {
	unique_fd rd;
	unique_fd wr;
};

// Returns 0 or errno.
int xsrc_make_pipe(pipe_fds &pipe);

// Unused completion-channel pipes the provider keeps registered.
constexpr uint32_t XSRC_CHANNEL_POOL_TARGET = 4;
static_assert(XSRC_CHANNEL_POOL_TARGET <= XSRC_MAX_CHANNEL_FDS);

struct xsrc_device {
	verbs_device ibv_dev;
	verbs_sysfs_dev *sysfs_dev;
};

// Read ends of the completion-channel pipes registered with the daemon. It
// hands them out FIFO, so the last `channel_pool_free` entries are still ours;
// the earlier ones belong to the application's comp channels.
struct xsrc_comp_channels {
	std::mutex lock;
	std::vector<int> read_fds; // registration order
};

struct xsrc_context {
	verbs_context ibv_ctx; // libibverbs callocs the whole struct
	xsrc_comp_channels channels; // so this is constructed in place
	uint64_t context_id;
	uint32_t max_inline_data;
};

struct xsrc_cq {
	verbs_cq vcq;
	ibv_wc polled; // the completion start_poll/next_poll stepped onto
};

// The casts below rely on these.
static_assert(std::is_standard_layout_v<xsrc_device> &&
	      offsetof(xsrc_device, ibv_dev.device) == 0);
static_assert(std::is_standard_layout_v<xsrc_context> &&
	      offsetof(xsrc_context, ibv_ctx) == 0);
static_assert(std::is_standard_layout_v<xsrc_cq> &&
	      offsetof(xsrc_cq, vcq.cq) == 0 &&
	      offsetof(xsrc_cq, vcq.cq_ex) == 0);

inline xsrc_device *to_xsrc_dev(ibv_device *dev)
{
	return reinterpret_cast<xsrc_device *>(dev);
}

// ibv_context is the last member of verbs_context, not the first.
inline xsrc_context *to_xsrc_ctx(ibv_context *ctx)
{
	return reinterpret_cast<xsrc_context *>(
		reinterpret_cast<char *>(ctx) -
		offsetof(xsrc_context, ibv_ctx.context));
}

inline xsrc_cq *to_xsrc_cq(ibv_cq *cq)
{
	return reinterpret_cast<xsrc_cq *>(cq);
}

inline xsrc_cq *to_xsrc_cq(ibv_cq_ex *cq)
{
	return reinterpret_cast<xsrc_cq *>(cq);
}

// A command reported `free_now` unused channel pipes: register more until the
// pool holds XSRC_CHANNEL_POOL_TARGET again. Best effort, never fails.
void xsrc_channel_pool_refill(xsrc_context *ctx, uint32_t free_now);

void xsrc_free_context(ibv_context *ibctx);  // xsrc.cpp
extern const verbs_context_ops xsrc_ctx_ops; // verbs.cpp
