// Two processes on xsrc0 for the tag and cm tests: the GoogleTest process and a peer (this
// binary re-exec'd with --xsrc-uct-peer SCENARIO FD), joined by a socketpair over which they
// exchange addresses and step signals. Everything goes through UCX's public API and the
// shim's public header.
#pragma once

#include <xsrc/uct.h>

#include <ucs/async/async_fwd.h>
#include <uct/api/uct.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace xsrc_uct_test {

// In the peer, a failed check ends the process with a message (the test side sees exit 1).
[[noreturn]] inline void peer_fail(const char *file, int line, const char *what)
{
	std::fprintf(stderr, "peer: %s:%d: check failed: %s\n", file, line, what);
	std::fflush(stderr);
	_exit(1);
}
#define PEER_CHECK(c) ((c) ? (void)0 : ::xsrc_uct_test::peer_fail(__FILE__, __LINE__, #c))
#define PEER_CHECK_EQ(a, b) PEER_CHECK((a) == (b))

// Length-prefixed messages over the socketpair.
class Link {
public:
	explicit Link(int fd = -1) : fd_(fd) {}
	Link(const Link &) = delete;
	Link &operator=(const Link &) = delete;
	~Link()
	{
		if (fd_ >= 0)
			close(fd_);
	}
	int fd() const { return fd_; }
	void reset(int fd)
	{
		if (fd_ >= 0)
			close(fd_);
		fd_ = fd;
	}

	bool send(std::string_view data)
	{
		uint32_t len = static_cast<uint32_t>(data.size());
		return write_all(&len, sizeof(len)) && write_all(data.data(), data.size());
	}
	// Empty optional-like: returns false on EOF/timeout.
	bool recv(std::string *out, int timeout_ms = 20000)
	{
		uint32_t len;
		if (!read_all(&len, sizeof(len), timeout_ms))
			return false;
		out->assign(len, '\0');
		return read_all(out->data(), len, timeout_ms);
	}
	std::string recv_or_fail()
	{
		std::string s;
		if (!recv(&s))
			peer_fail(__FILE__, __LINE__, "link closed or timed out");
		return s;
	}
	// True when a message (or EOF) is waiting.
	bool readable(int timeout_ms = 0)
	{
		pollfd pfd{fd_, POLLIN, 0};
		return poll(&pfd, 1, timeout_ms) > 0;
	}
	template <class T> bool send_val(const T &v) { return send({reinterpret_cast<const char *>(&v), sizeof(v)}); }
	template <class T> bool recv_val(T *v)
	{
		std::string s;
		if (!recv(&s) || s.size() != sizeof(T))
			return false;
		std::memcpy(v, s.data(), sizeof(T));
		return true;
	}

private:
	bool write_all(const void *p, size_t n)
	{
		auto *c = static_cast<const char *>(p);
		while (n) {
			ssize_t r = write(fd_, c, n);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				return false;
			c += r;
			n -= static_cast<size_t>(r);
		}
		return true;
	}
	bool read_all(void *p, size_t n, int timeout_ms)
	{
		auto *c = static_cast<char *>(p);
		while (n) {
			pollfd pfd{fd_, POLLIN, 0};
			int pr = poll(&pfd, 1, timeout_ms);
			if (pr < 0 && errno == EINTR)
				continue;
			if (pr <= 0)
				return false;
			ssize_t r = read(fd_, c, n);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				return false;
			c += r;
			n -= static_cast<size_t>(r);
		}
		return true;
	}
	int fd_;
};

// One md + worker + iface on the first xsrc transport resource.
class Side {
public:
	Side() = default;
	Side(const Side &) = delete;
	Side &operator=(const Side &) = delete;
	~Side() { close_all(); }

	// Opens the md and worker and returns the transport's device name ("xsrc0:1").
	ucs_status_t open_md()
	{
		uct_md_resource_desc_t *mds;
		unsigned nmd;
		ucs_status_t st = xsrc_uct_query_md_resources(&mds, &nmd);
		if (st != UCS_OK)
			return st;
		if (!nmd) {
			xsrc_uct_release_md_resources(mds);
			return UCS_ERR_NO_DEVICE;
		}
		st = xsrc_uct_md_open(mds[0].md_name, nullptr, &md);
		xsrc_uct_release_md_resources(mds);
		if (st != UCS_OK)
			return st;
		uct_tl_resource_desc_t *tls;
		unsigned ntl;
		st = xsrc_uct_md_query_tl_resources(md, &tls, &ntl);
		if (st != UCS_OK)
			return st;
		if (!ntl) {
			xsrc_uct_release_tl_resource_list(tls);
			return UCS_ERR_NO_DEVICE;
		}
		dev_name = tls[0].dev_name;
		xsrc_uct_release_tl_resource_list(tls);
		st = ucs_async_context_create(UCS_ASYNC_MODE_POLL, &async);
		if (st != UCS_OK)
			return st;
		return uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker);
	}

	// Opens the iface with `params` (DEVICE mode filled in unless open_mode is set).
	ucs_status_t open(uct_iface_params_t params = {})
	{
		ucs_status_t st = md ? UCS_OK : open_md();
		if (st != UCS_OK)
			return st;
		if (!(params.field_mask & UCT_IFACE_PARAM_FIELD_OPEN_MODE)) {
			params.field_mask |= UCT_IFACE_PARAM_FIELD_OPEN_MODE;
			params.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
			params.mode.device.tl_name = XSRC_UCT_TL_NAME;
			params.mode.device.dev_name = dev_name.c_str();
		}
		st = xsrc_uct_iface_open(md, worker, &params, nullptr, &iface);
		if (st != UCS_OK)
			return st;
		uct_iface_progress_enable(iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
		return uct_iface_query(iface, &attr);
	}

	// A new ep connected to the peer's ep (addresses exchanged over `link`).
	uct_ep_h connect(Link &link)
	{
		uct_ep_params_t p{};
		p.field_mask = UCT_EP_PARAM_FIELD_IFACE;
		p.iface = iface;
		uct_ep_h ep;
		if (uct_ep_create(&p, &ep) != UCS_OK)
			return nullptr;
		std::string dev(attr.device_addr_len, '\0'), epa(attr.ep_addr_len, '\0');
		if (uct_iface_get_device_address(iface, reinterpret_cast<uct_device_addr_t *>(dev.data())) != UCS_OK ||
		    uct_ep_get_address(ep, reinterpret_cast<uct_ep_addr_t *>(epa.data())) != UCS_OK)
			return nullptr;
		std::string rdev, repa;
		if (!link.send(dev) || !link.send(epa) || !link.recv(&rdev) || !link.recv(&repa))
			return nullptr;
		if (uct_ep_connect_to_ep(ep, reinterpret_cast<const uct_device_addr_t *>(rdev.data()),
					 reinterpret_cast<const uct_ep_addr_t *>(repa.data())) != UCS_OK)
			return nullptr;
		return ep;
	}

	unsigned progress() { return uct_iface_progress(iface); }

	// Progresses until pred() holds; false on timeout.
	bool progress_until(const std::function<bool()> &pred, int timeout_ms = 10000)
	{
		auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
		while (!pred()) {
			if (std::chrono::steady_clock::now() > end)
				return false;
			if (!progress())
				usleep(20);
		}
		return true;
	}
	// Progresses for a while (to show that something does NOT happen).
	void progress_for(int ms)
	{
		auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
		while (std::chrono::steady_clock::now() < end)
			if (!progress())
				usleep(50);
	}

	// Retries an op that may answer UCS_ERR_NO_RESOURCE, progressing in between.
	template <class Op> auto retry(Op op)
	{
		auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
		for (;;) {
			auto r = op();
			if (static_cast<ssize_t>(r) != UCS_ERR_NO_RESOURCE || std::chrono::steady_clock::now() > end)
				return r;
			progress();
		}
	}

	uct_mem_h reg(void *p, size_t len)
	{
		uct_mem_h memh = nullptr;
		if (xsrc_uct_md_mem_reg(md, p, len, UCT_MD_MEM_ACCESS_ALL, &memh) != UCS_OK)
			return nullptr;
		return memh;
	}

	void close_all()
	{
		if (iface)
			uct_iface_close(iface);
		iface = nullptr;
		if (worker)
			uct_worker_destroy(worker);
		worker = nullptr;
		if (async)
			ucs_async_context_destroy(async);
		async = nullptr;
		if (md)
			xsrc_uct_md_close(md);
		md = nullptr;
	}

	ucs_async_context_t *async = nullptr;
	uct_worker_h worker = nullptr;
	uct_md_h md = nullptr;
	uct_iface_h iface = nullptr;
	uct_iface_attr_t attr{};
	std::string dev_name;
};

// --- Peer processes -----------------------------------------------------------------------
using PeerFn = int (*)(Link &);

inline std::map<std::string, PeerFn> &peer_registry()
{
	static std::map<std::string, PeerFn> r;
	return r;
}

struct PeerRegistrar {
	PeerRegistrar(const char *name, PeerFn fn) { peer_registry()[name] = fn; }
};
#define XSRC_UCT_PEER(name)                                                               \
	static int peer_##name(::xsrc_uct_test::Link &);                                  \
	static ::xsrc_uct_test::PeerRegistrar peer_reg_##name(#name, peer_##name);       \
	static int peer_##name(::xsrc_uct_test::Link &link)

// The running peer: started by spawn(), reaped by wait() (or killed by the destructor).
class Peer {
public:
	explicit Peer(const char *scenario)
	{
		int sv[2];
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
			return;
		pid_ = fork();
		if (pid_ == 0) {
			close(sv[0]);
			int fd = dup(sv[1]);  // without CLOEXEC: it survives the exec
			std::string fds = std::to_string(fd);
			execl("/proc/self/exe", "/proc/self/exe", "--xsrc-uct-peer", scenario, fds.c_str(),
			      static_cast<char *>(nullptr));
			_exit(127);
		}
		close(sv[1]);
		if (pid_ > 0)
			link.reset(sv[0]);
		else
			close(sv[0]);
	}
	~Peer()
	{
		if (pid_ > 0) {
			kill(pid_, SIGKILL);
			waitpid(pid_, nullptr, 0);
		}
	}
	bool started() const { return pid_ > 0; }
	// The peer's exit status (0 = all its checks passed), -1 on timeout or a signal.
	int wait(int timeout_ms = 20000)
	{
		auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
		while (pid_ > 0) {
			int status;
			pid_t r = waitpid(pid_, &status, WNOHANG);
			if (r == pid_) {
				pid_ = -1;
				return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
			}
			if (std::chrono::steady_clock::now() > end)
				return -1;
			usleep(1000);
		}
		return -1;
	}
	Link link;

private:
	pid_t pid_ = -1;
};

// main(): the peer mode, or GoogleTest.
inline int peer_main(int argc, char **argv, bool *is_peer)
{
	*is_peer = argc == 4 && std::string_view(argv[1]) == "--xsrc-uct-peer";
	if (!*is_peer)
		return 0;
	auto it = peer_registry().find(argv[2]);
	if (it == peer_registry().end()) {
		std::fprintf(stderr, "peer: unknown scenario %s\n", argv[2]);
		return 2;
	}
	Link link(std::atoi(argv[3]));
	return it->second(link);
}

}  // namespace xsrc_uct_test
