// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// fault_rounds' UCT kind: the workload goes through the shim (uct/) with
// UCX's public API, one op and a flush at a time, until an op, a flush or
// the iface's error handler reports a failure.
#include <sched.h>

#include <chrono>
#include <cstring>

#include "round.h"
#include "uct/uct_pair.h"

namespace xsrc::fault {
namespace {

constexpr ms kOpWait{5000};
// How often a waiting participant checks that its peer is alive, as UCP's
// keepalive does: an ep waiting for credits a dead peer will never return
// has nothing in flight that could fail.
constexpr ms kKeepalive{100};

ucs_status_t am_count(void *arg, void *, size_t, unsigned)
{
	++*static_cast<uint64_t *>(arg);
	return UCS_OK;
}

// Progresses until `done`: UCS_OK; UCS_ERR_TIMED_OUT (with rep.hung) when
// `timeout` passed first. Every kKeepalive the peer is checked; a check
// that fails (the device is gone) ends the wait with its status.
template <typename Pred>
ucs_status_t progress_until(uctpair::Node &n, Pred done, ms timeout, Report &rep)
{
	auto until = Clock::now() + timeout, check = Clock::now() + kKeepalive;
	while (!done()) {
		auto now = Clock::now();
		if (now >= until) {
			rep.hung = 1;
			return UCS_ERR_TIMED_OUT;
		}
		if (now >= check) {
			ucs_status_t st = uct_ep_check(n.ep, 0, nullptr);
			if (st != UCS_OK && st != UCS_ERR_NO_RESOURCE)
				return st;
			check = now + kKeepalive;
		}
		if (n.progress() == 0)
			sched_yield();
	}
	return UCS_OK;
}

// Calls `start` until it takes (not UCS_ERR_NO_RESOURCE), then, while it is
// UCS_INPROGRESS, waits for `comp`: the operation's final status.
template <typename Start>
ucs_status_t complete(uctpair::Node &n, Start start, const uctpair::Comp &comp, Report &rep)
{
	ucs_status_t st = UCS_ERR_NO_RESOURCE;
	if (ucs_status_t w = progress_until(n, [&] { return (st = start()) != UCS_ERR_NO_RESOURCE; }, kOpWait, rep))
		return w;
	if (st != UCS_INPROGRESS)
		return st;
	if (ucs_status_t w = progress_until(n, [&] { return comp.calls > 0; }, kOpWait, rep))
		return w;
	return comp.status;
}

// One op of kind `op` to the peer's buffer and a flush of the ep: the
// first status that is not UCS_OK, or UCS_OK.
ucs_status_t one_op(uctpair::Node &n, Op op, uint64_t id, Report &rep)
{
	uctpair::Comp comp;
	uint64_t result = 0;
	const uint64_t remote = n.peer_addr + 64;
	const uct_rkey_t rkey = n.peer_rkey.rkey;
	auto issue = [&] {
		switch (op) {
		case Op::send: return uct_ep_am_short(n.ep, 1, id, nullptr, 0);
		case Op::write: return uct_ep_put_short(n.ep, n.mem.data(), 64, remote, rkey);
		case Op::read: {
			// get_short takes no completion: its data is there once the ep is flushed
			ucs_status_t st = uct_ep_get_short(n.ep, n.mem.data() + 256, 64, remote, rkey);
			return st == UCS_INPROGRESS ? UCS_OK : st;
		}
		case Op::fetch_add:
			return uct_ep_atomic64_fetch(n.ep, UCT_ATOMIC_OP_ADD, 1, &result, n.peer_addr, rkey, &comp.c);
		default: return uct_ep_atomic_cswap64(n.ep, 0, id, n.peer_addr, rkey, &result, &comp.c);
		}
	};
	if (ucs_status_t st = complete(n, issue, comp, rep))
		return st;
	uctpair::Comp flushed;
	return complete(n, [&] { return uct_ep_flush(n.ep, 0, &flushed.c); }, flushed, rep);
}

}  // namespace

int uct_participant(harness::Link &link, const Setup &setup)
{
	const int fds_before = open_fd_count();
	Report rep;
	{
		uctpair::Node n;
		uint64_t ams = 0;
		Victim v;
		if (n.open() != UCS_OK || uct_iface_set_am_handler(n.iface, 1, am_count, &ams, 0) != UCS_OK ||
		    n.connect(link) != UCS_OK)
			return 10;
		if (!ready_and_go(link))
			return 12;
		for (uint64_t id = 1000;; ++id) {
			ucs_status_t st = one_op(n, setup.op, id, rep);
			n.progress();
			if (st != UCS_OK || n.errors) {
				rep.uct_end = st != UCS_OK ? st : n.last_error;
				break;
			}
		}
		if (!ended_and_told(link, v))
			return 13;
		auto t = Clock::now();
		if (v == Victim::daemon)
			setenv("RDMAV_ALLOW_DISASSOC_DESTROY", "1", 1);
		else if (!n.errors)  // a peer's death reaches the error handler
			progress_until(n, [&] { return n.errors > 0; }, kBound, rep);
		rep.ep_error = n.errors ? n.last_error : 0;
		rep.uct_later = one_op(n, setup.op, 1, rep);
		note_slowest(rep, t);
		t = Clock::now();
		n.close();
		note_slowest(rep, t);
	}
	rep.fd_leak = open_fd_count() - fds_before;
	return link.send_value(rep) ? 0 : 14;
}

}  // namespace xsrc::fault
