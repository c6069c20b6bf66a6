// Two processes on xsrc0 talking through the UCT shim: each runs a Node (worker, md, iface,
// one ep, a registered buffer), they swap addresses over a socketpair, and the tests drive
// the ops through UCX's public API (uct_ep_put_short, uct_iface_progress, ...).
#pragma once

#include <xsrc/uct.h>

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace uctpair {

inline const char *dev_name() { return getenv("XSRC_UCT_DEV") ? getenv("XSRC_UCT_DEV") : "xsrc0"; }

// --- A tiny message channel over a stream socket -------------------------------------------
inline bool write_all(int fd, const void *p, size_t n)
{
	auto *c = static_cast<const char *>(p);
	while (n) {
		ssize_t r = write(fd, c, n);
		if (r <= 0)
			return false;
		c += r;
		n -= static_cast<size_t>(r);
	}
	return true;
}
inline bool read_all(int fd, void *p, size_t n)
{
	auto *c = static_cast<char *>(p);
	while (n) {
		ssize_t r = read(fd, c, n);
		if (r <= 0)
			return false;
		c += r;
		n -= static_cast<size_t>(r);
	}
	return true;
}
inline bool send_blob(int fd, const std::vector<uint8_t> &b)
{
	uint32_t n = static_cast<uint32_t>(b.size());
	return write_all(fd, &n, 4) && write_all(fd, b.data(), n);
}
inline bool recv_blob(int fd, std::vector<uint8_t> &b)
{
	uint32_t n;
	if (!read_all(fd, &n, 4) || n > (1u << 20))
		return false;
	b.resize(n);
	return read_all(fd, b.data(), n);
}
inline bool send_u64(int fd, uint64_t v) { return write_all(fd, &v, 8); }
inline uint64_t recv_u64(int fd)
{
	uint64_t v = ~uint64_t{0};
	return read_all(fd, &v, 8) ? v : ~uint64_t{0};
}

// --- One side -------------------------------------------------------------------------------
struct Node {
	ucs_async_context_t *async = nullptr;
	uct_worker_h worker = nullptr;
	uct_md_h md = nullptr;
	uct_iface_h iface = nullptr;
	uct_ep_h ep = nullptr;
	uct_iface_attr_t attr{};
	std::vector<char> mem;
	uct_mem_h memh = nullptr;
	uct_rkey_bundle_t peer_rkey{};
	uint64_t peer_addr = 0;
	pid_t peer_pid = 0;
	// Error handler record.
	int errors = 0;
	ucs_status_t last_error = UCS_OK;
	uct_ep_h error_ep = nullptr;

	static ucs_status_t on_error(void *arg, uct_ep_h ep, ucs_status_t status)
	{
		auto *n = static_cast<Node *>(arg);
		++n->errors;
		n->last_error = status;
		n->error_ep = ep;
		return UCS_OK;
	}

	// Opens everything but the ep connection. Returns a status, never asserts (runs in children too).
	ucs_status_t open(size_t mem_len = 1 << 20, const xsrc_uct_iface_config_t *cfg = nullptr, size_t rx_headroom = 0)
	{
		ucs_status_t st = ucs_async_context_create(UCS_ASYNC_MODE_POLL, &async);
		if (st != UCS_OK)
			return st;
		st = uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker);
		if (st != UCS_OK)
			return st;
		st = xsrc_uct_md_open(dev_name(), nullptr, &md);
		if (st != UCS_OK)
			return st;
		uct_iface_params_t p{};
		std::string dev = std::string(dev_name()) + ":1";
		p.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_ERR_HANDLER |
			       UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG | UCT_IFACE_PARAM_FIELD_ERR_HANDLER_FLAGS;
		p.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
		p.mode.device.tl_name = XSRC_UCT_TL_NAME;
		p.mode.device.dev_name = dev.c_str();
		p.err_handler = on_error;
		p.err_handler_arg = this;
		p.err_handler_flags = UCT_CB_FLAG_ASYNC;
		if (rx_headroom) {
			p.field_mask |= UCT_IFACE_PARAM_FIELD_RX_HEADROOM;
			p.rx_headroom = rx_headroom;
		}
		st = xsrc_uct_iface_open(md, worker, &p, reinterpret_cast<const uct_iface_config_t *>(cfg), &iface);
		if (st != UCS_OK)
			return st;
		st = uct_iface_query(iface, &attr);
		if (st != UCS_OK)
			return st;
		mem.assign(mem_len, 0);
		st = xsrc_uct_md_mem_reg(md, mem.data(), mem.size(), UCT_MD_MEM_ACCESS_ALL, &memh);
		if (st != UCS_OK)
			return st;
		uct_ep_params_t ep_params{};
		ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE;
		ep_params.iface = iface;
		return uct_ep_create(&ep_params, &ep);
	}

	// Swaps device and ep addresses, buffer address and rkey with the peer; connects.
	ucs_status_t connect(int fd)
	{
		std::vector<uint8_t> mine(attr.device_addr_len + attr.ep_addr_len + 8 + 8 + 4);
		uint8_t *p = mine.data();
		ucs_status_t st = uct_iface_get_device_address(iface, reinterpret_cast<uct_device_addr_t *>(p));
		if (st != UCS_OK)
			return st;
		p += attr.device_addr_len;
		st = uct_ep_get_address(ep, reinterpret_cast<uct_ep_addr_t *>(p));
		if (st != UCS_OK)
			return st;
		p += attr.ep_addr_len;
		uint64_t addr = reinterpret_cast<uintptr_t>(mem.data());
		memcpy(p, &addr, 8);
		p += 8;
		st = xsrc_uct_md_mkey_pack(md, memh, p);
		if (st != UCS_OK)
			return st;
		p += 8;
		int32_t pid = getpid();
		memcpy(p, &pid, 4);
		std::vector<uint8_t> theirs;
		if (!send_blob(fd, mine) || !recv_blob(fd, theirs) || theirs.size() != mine.size())
			return UCS_ERR_IO_ERROR;
		const uint8_t *q = theirs.data();
		auto *dev = reinterpret_cast<const uct_device_addr_t *>(q);
		if (!uct_iface_is_reachable(iface, dev, nullptr))
			return UCS_ERR_UNREACHABLE;
		st = uct_ep_connect_to_ep(ep, dev, reinterpret_cast<const uct_ep_addr_t *>(q + attr.device_addr_len));
		if (st != UCS_OK)
			return st;
		q += attr.device_addr_len + attr.ep_addr_len;
		memcpy(&peer_addr, q, 8);
		st = xsrc_uct_rkey_unpack(nullptr, q + 8, &peer_rkey);
		int32_t ppid;
		memcpy(&ppid, q + 16, 4);
		peer_pid = ppid;
		return st;
	}

	unsigned progress() { return uct_iface_progress(iface); }

	// Progresses until pred() or the deadline; true if pred() became true.
	bool wait(const std::function<bool()> &pred, double seconds = 10)
	{
		auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
		while (!pred()) {
			if (std::chrono::steady_clock::now() > end)
				return false;
			if (progress() == 0)
				sched_yield();
		}
		return true;
	}

	ucs_status_t flush()
	{
		ucs_status_t st;
		auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
		while ((st = uct_ep_flush(ep, 0, nullptr)) == UCS_INPROGRESS || st == UCS_ERR_NO_RESOURCE) {
			if (std::chrono::steady_clock::now() > end)
				return UCS_ERR_TIMED_OUT;
			progress();
		}
		return st;
	}

	void close()
	{
		if (ep)
			uct_ep_destroy(ep);
		ep = nullptr;
		if (memh)
			xsrc_uct_md_mem_dereg(md, memh);
		memh = nullptr;
		if (iface)
			uct_iface_close(iface);
		iface = nullptr;
		if (md)
			xsrc_uct_md_close(md);
		md = nullptr;
		if (worker)
			uct_worker_destroy(worker);
		worker = nullptr;
		if (async)
			ucs_async_context_destroy(async);
		async = nullptr;
	}
	~Node() { close(); }
};

// A completion that counts.
struct Comp {
	uct_completion_t c{};
	int calls = 0;
	ucs_status_t status = UCS_OK;
	explicit Comp(int count = 1)
	{
		c.func = [](uct_completion_t *self) {
			auto *me = reinterpret_cast<Comp *>(self);
			++me->calls;
			me->status = self->status;
		};
		c.count = count;
		c.status = UCS_OK;
	}
};
static_assert(offsetof(Comp, c) == 0);

// Runs `child` in a forked process with one end of a socketpair (exit code = its result),
// and `parent` here with the other end. The parent's assertions are GoogleTest's; the
// child reports by exit status (0 = good; a line on stderr says what failed).
inline int run_pair(const std::function<int(int fd)> &child, const std::function<void(int fd, pid_t pid)> &parent)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		return -1;
	fflush(nullptr);
	pid_t pid = fork();
	if (pid == 0) {
		::close(sv[0]);
		int rc = child(sv[1]);
		_exit(rc);
	}
	::close(sv[1]);
	parent(sv[0], pid);
	::close(sv[0]);
	int status = 0;
	if (waitpid(pid, &status, 0) != pid) {
		kill(pid, SIGKILL);
		return -1;
	}
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return WEXITSTATUS(status);
}

// Waits until the child has died, leaving it for run_pair to reap.
inline void wait_dead(pid_t pid)
{
	siginfo_t si{};
	waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOWAIT);
}

#define CHILD_CHECK(cond)                                                                        \
	do {                                                                                     \
		if (!(cond)) {                                                                   \
			fprintf(stderr, "child: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			return 1;                                                                \
		}                                                                                \
	} while (0)

}  // namespace uctpair
