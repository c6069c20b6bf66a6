// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// One end of the socketpair between the two processes of a test. It carries frames
// (a 32-bit length, then the bytes): raw blobs, plain values, and key=value messages.
//
// Frames and values report failure by their return value (for children that report by
// exit status); messages throw std::runtime_error (GoogleTest turns an exception in a
// test body into a failure, and a peer turns it into an error reply).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/fd.h"
#include "harness/message.h"

namespace xsrc::harness {

using ms = std::chrono::milliseconds;

// A wait without a time limit.
inline constexpr ms kForever{-1};

class Link {
public:
	Link() = default;
	explicit Link(xsrc::unique_fd fd) : fd_(std::move(fd)) {}

	// Both ends of a new AF_UNIX stream socketpair (close-on-exec); throws on failure.
	static std::pair<Link, Link> pair();

	int fd() const { return fd_.get(); }
	explicit operator bool() const { return static_cast<bool>(fd_); }
	void close() { fd_.reset(); }

	// One frame; false when the other end is gone.
	bool send_frame(std::string_view bytes) const;
	bool send_frame(const std::vector<uint8_t> &bytes) const
	{
		return send_frame({reinterpret_cast<const char *>(bytes.data()), bytes.size()});
	}
	// The next frame, which must begin within `timeout`; false on timeout, EOF or error.
	bool recv_frame(std::string *out, ms timeout) const;
	bool recv_frame(std::vector<uint8_t> *out, ms timeout) const
	{
		std::string s;
		if (!recv_frame(&s, timeout))
			return false;
		out->assign(s.begin(), s.end());
		return true;
	}
	// True when a frame (or EOF) is waiting.
	bool readable(ms timeout = ms{0}) const;

	template <typename T>
	bool send_value(const T &v) const
	{
		static_assert(std::is_trivially_copyable_v<T>);
		return send_frame({reinterpret_cast<const char *>(&v), sizeof(v)});
	}
	// A frame of exactly sizeof(T) bytes.
	template <typename T>
	bool recv_value(T *v, ms timeout) const
	{
		static_assert(std::is_trivially_copyable_v<T>);
		std::string s;
		if (!recv_frame(&s, timeout) || s.size() != sizeof(T))
			return false;
		std::memcpy(v, s.data(), sizeof(T));
		return true;
	}

	// A message; throws when the other end is gone.
	void send(const Msg &m) const;
	// The next message within `timeout`; nullopt on timeout or when the other end is gone.
	std::optional<Msg> recv(ms timeout) const;
	// The next message, which must come within `timeout` and carry no "error" field;
	// throws otherwise, naming `what` was awaited.
	Msg expect(ms timeout, const std::string &what) const;

private:
	bool write_all(const void *p, size_t n) const;
	bool read_all(void *p, size_t n, ms timeout) const;

	xsrc::unique_fd fd_;
};

}  // namespace xsrc::harness
