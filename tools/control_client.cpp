#include "control_client.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

namespace xsrc::cli {

static constexpr time_t kReplyTimeoutSeconds = 10;
// How much of a reply it cannot parse an error message quotes.
static constexpr size_t kQuotedReplyBytes = 200;

static sockaddr_un socket_address(const fs::path &socket)
{
	sockaddr_un addr{};
	addr.sun_family = AF_UNIX;
	const std::string &path = socket.native();
	if (path.size() >= sizeof(addr.sun_path))
		throw CliError("control socket path is too long: " + path);
	std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
	return addr;
}

static unique_fd connect_to(const fs::path &socket)
{
	sockaddr_un addr = socket_address(socket);
	unique_fd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
	if (!sock)
		throw CliError("socket: " + errno_text(errno));
	timeval timeout{kReplyTimeoutSeconds, 0};
	setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
	setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
	if (connect(sock.get(), reinterpret_cast<sockaddr *>(&addr), sizeof addr) == 0)
		return sock;
	int err = errno;
	if (err == ENOENT || err == ECONNREFUSED || err == ENOTDIR)
		return {};  // no socket, or a stale one nobody listens on
	std::string hint = err == EACCES ? " (xsrc must be run as root)" : "";
	throw CliError("cannot connect to " + socket.string() + ": " + errno_text(err) + hint);
}

static std::string receive_reply(int sock)
{
	std::string reply(kControlMaxMessage, '\0');
	iovec iov{reply.data(), reply.size()};
	msghdr msg{};
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	ssize_t n;
	do
		n = recvmsg(sock, &msg, 0);
	while (n < 0 && errno == EINTR);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		throw CliError("xsrcd did not reply within " + std::to_string(kReplyTimeoutSeconds) + " s");
	if (n < 0)
		throw CliError("receiving from xsrcd: " + errno_text(errno));
	if (n == 0)
		throw CliError("xsrcd closed the connection without replying");
	if (msg.msg_flags & MSG_TRUNC)
		throw CliError("xsrcd sent a reply longer than the protocol allows");
	reply.resize(static_cast<size_t>(n));
	return reply;
}

std::optional<ControlReply> control_request(const fs::path &socket, std::string_view request)
{
	unique_fd sock = connect_to(socket);
	if (!sock)
		return std::nullopt;
	if (send(sock.get(), request.data(), request.size(), MSG_NOSIGNAL) < 0)
		throw CliError("sending to xsrcd: " + errno_text(errno));

	ControlReply reply;
	reply.text = receive_reply(sock.get());
	ucred peer{};
	socklen_t len = sizeof peer;
	if (getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0)
		reply.daemon_pid = peer.pid;
	return reply;
}

std::string expect_ok(const ControlReply &reply)
{
	std::string_view text = reply.text;
	if (text == "ok")
		return {};
	if (text.starts_with("ok ") || text.starts_with("ok\n"))
		return std::string(text.substr(3));
	if (text.starts_with("error "))
		throw CliError(std::string(text.substr(6)));
	throw CliError("unexpected reply from xsrcd: '" + std::string(text.substr(0, kQuotedReplyBytes)) + "'");
}

}  // namespace xsrc::cli
