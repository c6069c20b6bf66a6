// Two processes on xsrc0 for the tag and cm tests: the GoogleTest process and a peer (this
// binary re-exec'd with --xsrc-uct-peer FD SCENARIO), joined by a socketpair over which they
// exchange addresses and step signals. Everything goes through UCX's public API and the
// shim's public header.
#pragma once

#include <xsrc/uct.h>

#include <gtest/gtest.h>
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

#include <sys/wait.h>
#include <unistd.h>

#include "harness/child.h"
#include "harness/uct_iface.h"

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

using xsrc::harness::Link;

// How long a side waits for the other's next frame.
constexpr xsrc::harness::ms kLinkTimeout{20000};

// One md + worker + iface on the first xsrc transport resource.
class Side : public xsrc::harness::UctIface {
public:

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
		return open_worker();
	}

	// Opens the iface with `params` (DEVICE mode filled in unless open_mode is set).
	ucs_status_t open(uct_iface_params_t params = {})
	{
		ucs_status_t st = md ? UCS_OK : open_md();
		if (st != UCS_OK)
			return st;
		st = open_iface(dev_name, params);
		if (st == UCS_OK)
			uct_iface_progress_enable(iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
		return st;
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
		if (!link.send_frame(dev) || !link.send_frame(epa) || !link.recv_frame(&rdev, kLinkTimeout) ||
		    !link.recv_frame(&repa, kLinkTimeout))
			return nullptr;
		if (uct_ep_connect_to_ep(ep, reinterpret_cast<const uct_device_addr_t *>(rdev.data()),
					 reinterpret_cast<const uct_ep_addr_t *>(repa.data())) != UCS_OK)
			return nullptr;
		return ep;
	}

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

// The running peer (this binary re-exec'd): reaped by wait(), or killed by the destructor.
class Peer {
public:
	explicit Peer(const char *scenario)
	{
		try {
			child_ = xsrc::harness::Child::spawn("--xsrc-uct-peer", {scenario});
		} catch (const std::exception &e) {
			std::fprintf(stderr, "cannot start peer %s: %s\n", scenario, e.what());
		}
	}
	bool started() const { return child_.running(); }
	// The peer's exit status (0 = all its checks passed), -1 on timeout or a signal.
	int wait(int timeout_ms = 20000)
	{
		auto status = child_.wait(xsrc::harness::ms(timeout_ms));
		return status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
	}

private:
	xsrc::harness::Child child_;

public:
	Link &link = child_.link();
};

// main(): the peer mode (`--xsrc-uct-peer FD SCENARIO`), or GoogleTest.
inline int peer_or_tests_main(int argc, char **argv)
{
	auto peer = xsrc::harness::child_args(argc, argv, "--xsrc-uct-peer");
	if (!peer) {
		::testing::InitGoogleTest(&argc, argv);
		return RUN_ALL_TESTS();
	}
	auto it = peer->args.size() == 1 ? peer_registry().find(peer->args[0]) : peer_registry().end();
	if (it == peer_registry().end()) {
		std::fprintf(stderr, "peer: unknown scenario\n");
		return 2;
	}
	return it->second(peer->link);
}

}  // namespace xsrc_uct_test
