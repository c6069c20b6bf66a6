// Two processes on xsrc0 talking through the UCT shim: each runs a Node (worker, md, iface,
// one ep, a registered buffer), they swap addresses over a socketpair, and the tests drive
// the ops through UCX's public API (uct_ep_put_short, uct_iface_progress, ...).
#pragma once

#include <xsrc/uct.h>

#include <gtest/gtest.h>

#include "harness/child.h"
#include "harness/uct_iface.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

namespace uctpair {

inline const char *dev_name() { return getenv("XSRC_UCT_DEV") ? getenv("XSRC_UCT_DEV") : "xsrc0"; }

using xsrc::harness::Child;
using xsrc::harness::Link;

// --- Blobs and numbers between the sides (no time limit: ctest's ends a hung test) ---------
inline bool send_blob(const Link &link, const std::vector<uint8_t> &b) { return link.send_frame(b); }
inline bool recv_blob(const Link &link, std::vector<uint8_t> &b) { return link.recv_frame(&b, xsrc::harness::kForever); }
inline bool send_u64(const Link &link, uint64_t v) { return link.send_value(v); }
inline uint64_t recv_u64(const Link &link)
{
	uint64_t v = ~uint64_t{0};
	return link.recv_value(&v, xsrc::harness::kForever) ? v : ~uint64_t{0};
}

// --- One side -------------------------------------------------------------------------------
struct Node : xsrc::harness::UctIface {
	uct_ep_h ep = nullptr;
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
		ucs_status_t st = open_md();
		if (st != UCS_OK)
			return st;
		return open_iface_ep(mem_len, reinterpret_cast<const uct_iface_config_t *>(cfg), rx_headroom);
	}

	// open() in two steps, for a configuration that needs the md (uct_md_iface_config_read):
	// the worker and md, then the iface (with `config`: null, an xsrc_uct_iface_config_t or
	// UCX's), the registered buffer and the ep.
	ucs_status_t open_md()
	{
		ucs_status_t st = open_worker();
		if (st != UCS_OK)
			return st;
		return xsrc_uct_md_open(dev_name(), nullptr, &md);
	}
	ucs_status_t open_iface_ep(size_t mem_len, const uct_iface_config_t *config, size_t rx_headroom = 0)
	{
		uct_iface_params_t p{};
		p.field_mask = UCT_IFACE_PARAM_FIELD_ERR_HANDLER | UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG |
			       UCT_IFACE_PARAM_FIELD_ERR_HANDLER_FLAGS;
		p.err_handler = on_error;
		p.err_handler_arg = this;
		p.err_handler_flags = UCT_CB_FLAG_ASYNC;
		if (rx_headroom) {
			p.field_mask |= UCT_IFACE_PARAM_FIELD_RX_HEADROOM;
			p.rx_headroom = rx_headroom;
		}
		ucs_status_t st = open_iface(std::string(dev_name()) + ":1", p, config);
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
	ucs_status_t connect(const Link &link)
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
		if (!send_blob(link, mine) || !recv_blob(link, theirs) || theirs.size() != mine.size())
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
		UctIface::close();
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

// Runs `child` in a forked process with one end of the link (exit code = its result), and
// `parent` here with the other end. The parent's assertions are GoogleTest's; the child
// reports by exit status (0 = good; a line on stderr says what failed). Returns the
// child's exit code (128 + signal for a signal).
inline int run_pair(const std::function<int(Link &)> &child, const std::function<void(Link &, const Child &)> &parent)
{
	Child peer = Child::run(child);
	parent(peer.link(), peer);
	peer.link().close();
	auto status = peer.wait(xsrc::harness::kForever);
	return status ? xsrc::harness::exit_code(*status) : -1;
}

#define CHILD_CHECK(cond)                                                                        \
	do {                                                                                     \
		if (!(cond)) {                                                                   \
			fprintf(stderr, "child: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			return 1;                                                                \
		}                                                                                \
	} while (0)

}  // namespace uctpair
