#include "control.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include "control_protocol.h"
#include "daemon.h"

namespace xsrc {
namespace {

constexpr int kListenBacklog = 16;
// A client that never speaks must not stall the control thread.
constexpr timeval kClientTimeout{5, 0};
// How much of an unknown request the error reply quotes.
constexpr size_t kQuotedRequestBytes = 64;

}  // namespace

ControlServer::ControlServer(Daemon &daemon, std::string socket_path, void (*on_shutdown)())
	: daemon_(daemon), path_(std::move(socket_path)), on_shutdown_(on_shutdown)
{
}

ControlServer::~ControlServer()
{
	if (thread_.joinable()) {
		uint64_t one = 1;
		if (write(stop_fd_.get(), &one, sizeof(one)) < 0) {
			// the thread still exits when the listening socket closes
		}
		thread_.join();
	}
	if (listen_fd_) {
		listen_fd_.reset();
		unlink(path_.c_str());
	}
	stop_fd_.reset();
}

int ControlServer::start()
{
	sockaddr_un addr{};
	addr.sun_family = AF_UNIX;
	if (path_.size() >= sizeof(addr.sun_path))
		return ENAMETOOLONG;
	std::strcpy(addr.sun_path, path_.c_str());
	listen_fd_.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
	stop_fd_.reset(eventfd(0, EFD_CLOEXEC));
	if (!listen_fd_ || !stop_fd_)
		return errno;
	unlink(path_.c_str());
	mode_t old = umask(077);  // root only: the socket creates and removes devices
	int rc = bind(listen_fd_.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr));
	umask(old);
	if (rc || listen(listen_fd_.get(), kListenBacklog))
		return errno;
	thread_ = std::thread([this] { serve(); });
	return 0;
}

void ControlServer::serve()
{
	std::vector<char> buf(kControlMaxMessage);
	for (;;) {
		// The daemon's owner watch rides on this loop: it is as idle.
		pollfd fds[3] = {{listen_fd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0},
				 {daemon_.owner_watch_fd(), POLLIN, 0}};
		if (poll(fds, 3, -1) < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		if (fds[1].revents)
			return;
		if (fds[2].revents) {
			daemon_.owner_exits();
			if (!(fds[0].revents & POLLIN))
				continue;
		}
		unique_fd conn(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
		if (!conn)
			continue;
		setsockopt(conn.get(), SOL_SOCKET, SO_RCVTIMEO, &kClientTimeout, sizeof(kClientTimeout));
		ssize_t n = recv(conn.get(), buf.data(), buf.size() - 1, 0);
		bool shutdown = false;
		if (n > 0) {
			std::string reply = handle(std::string(buf.data(), static_cast<size_t>(n)), shutdown);
			if (reply.size() > kControlMaxMessage)
				reply.resize(kControlMaxMessage);
			send(conn.get(), reply.data(), reply.size(), MSG_NOSIGNAL);
		}
		conn.reset();
		if (shutdown) {
			on_shutdown_();
			return;
		}
	}
}

std::string ControlServer::handle(const std::string &request, bool &shutdown)
{
	std::istringstream in(request);
	std::string verb, name, netdev, extra;
	in >> verb >> name >> netdev >> extra;
	if (!extra.empty())
		return "error too many arguments";
	if (verb == "up" && !name.empty()) {
		std::string error;
		int err = daemon_.add_device(name, netdev, error);
		if (err == 0)
			return "ok created";
		if (err == EEXIST)
			return "ok exists";
		return "error " + error;
	}
	if (verb == "down" && !name.empty() && netdev.empty()) {
		int err = daemon_.remove_device(name);
		return err ? "error no device named " + name : "ok";
	}
	if (verb == "status" && name.empty()) {
		std::string devices = daemon_.status();
		// rdma_cm is one device for all, listed while any device is up.
		if (cm_ && !devices.empty())
			devices += "rdma_cm objects=" + std::to_string(cm_->object_count()) +
				   " cm_listeners=" + std::to_string(cm_->listener_count()) + cm_->wire_status() + "\n";
		return "ok\n" + devices;
	}
	if (verb == "shutdown" && name.empty()) {
		daemon_.remove_all_devices();
		shutdown = true;
		return "ok";
	}
	return "error unknown request '" + request.substr(0, kQuotedRequestBytes) + "'";
}

}  // namespace xsrc
