// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
#include "harness/link.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstdint>
#include <stdexcept>

namespace xsrc::harness {

namespace {

constexpr uint32_t kMaxFrame = 1u << 20;
// Once a frame has begun, the rest of it is on its way: wait for it at least this long.
constexpr ms kFrameRest{10000};

int poll_ms(ms timeout)
{
	return timeout.count() < 0 ? -1 : static_cast<int>(timeout.count());
}

}  // namespace

std::pair<Link, Link> Link::pair()
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		throw std::runtime_error(std::string("socketpair: ") + strerror(errno));
	return {Link(xsrc::unique_fd(sv[0])), Link(xsrc::unique_fd(sv[1]))};
}

bool Link::write_all(const void *p, size_t n) const
{
	auto *c = static_cast<const char *>(p);
	for (ssize_t r; n; c += r, n -= static_cast<size_t>(r)) {
		while ((r = ::send(fd_.get(), c, n, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
		}
		if (r <= 0)
			return false;
	}
	return true;
}

bool Link::read_all(void *p, size_t n, ms timeout) const
{
	auto *c = static_cast<char *>(p);
	for (ssize_t r; n; c += r, n -= static_cast<size_t>(r)) {
		if (!readable(timeout))
			return false;
		while ((r = ::read(fd_.get(), c, n)) < 0 && errno == EINTR) {
		}
		if (r <= 0)
			return false;
	}
	return true;
}

bool Link::send_frame(std::string_view bytes) const
{
	if (bytes.size() > kMaxFrame)
		return false;
	uint32_t len = static_cast<uint32_t>(bytes.size());
	std::string frame(sizeof(len) + bytes.size(), '\0');  // one write: the frame arrives whole
	std::memcpy(frame.data(), &len, sizeof(len));
	std::memcpy(frame.data() + sizeof(len), bytes.data(), bytes.size());
	return write_all(frame.data(), frame.size());
}

bool Link::recv_frame(std::string *out, ms timeout) const
{
	if (!readable(timeout))
		return false;
	ms rest = timeout.count() < 0 ? kForever : std::max(timeout, kFrameRest);
	uint32_t len;
	if (!read_all(&len, sizeof(len), rest) || len > kMaxFrame)
		return false;
	out->assign(len, '\0');
	return read_all(out->data(), len, rest);
}

bool Link::readable(ms timeout) const
{
	pollfd pfd{fd_.get(), POLLIN, 0};
	int n;
	do
		n = poll(&pfd, 1, poll_ms(timeout));
	while (n < 0 && errno == EINTR);
	return n > 0;
}

void Link::send(const Msg &m) const
{
	if (!send_frame(m.encode()))
		throw std::runtime_error(std::string("send to the other process failed: ") + strerror(errno));
}

std::optional<Msg> Link::recv(ms timeout) const
{
	std::string text;
	if (!recv_frame(&text, timeout))
		return std::nullopt;
	return Msg::decode(text);
}

Msg Link::expect(ms timeout, const std::string &what) const
{
	if (!readable(timeout))
		throw std::runtime_error("timed out (" + std::to_string(timeout.count()) + " ms) waiting for " + what);
	auto m = recv(timeout);
	if (!m)
		throw std::runtime_error("the other process went away while waiting for " + what);
	if (m->has("error"))
		throw std::runtime_error("other process: " + m->str("error"));
	return *m;
}

}  // namespace xsrc::harness
