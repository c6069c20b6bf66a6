// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The one owner of a file descriptor, for every part of xsrc.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <utility>

namespace xsrc {

// Owns one file descriptor and closes it on destruction. Closing keeps errno,
// so an error can be reported after cleanup.
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
	unique_fd(const unique_fd &) = delete;
	unique_fd &operator=(const unique_fd &) = delete;
	~unique_fd() { reset(); }

	int get() const noexcept { return fd_; }
	explicit operator bool() const noexcept { return fd_ >= 0; }
	int release() noexcept { return std::exchange(fd_, -1); }
	void reset(int fd = -1) noexcept
	{
		if (fd_ >= 0 && fd_ != fd) {
			int saved = errno;
			::close(fd_);
			errno = saved;
		}
		fd_ = fd;
	}

private:
	int fd_ = -1;
};

}  // namespace xsrc
