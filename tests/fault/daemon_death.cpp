// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// fault_daemon_death: xsrcd is SIGKILLed under two processes with traffic in
// flight. Each gets IBV_EVENT_DEVICE_FATAL, its posted work flushes, later
// posts and destroys fail with EIO (0 under RDMAV_ALLOW_DISASSOC_DESTROY), a
// thread asleep in ibv_get_cq_event wakes, nothing blocks past 2 s; then
// `xsrc up` serves fresh contexts and leaves no stale arena or node behind.
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>

#include "fault.h"
#include "harness/child.h"
#include "harness/device_stats.h"

namespace xsrc::fault {
namespace {

using harness::Child;
using harness::Link;

int failures = 0;

void expect(bool ok, const std::string &what)
{
	std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
	failures += !ok;
}

struct WriterReport {
	int status = -1;     // the completion that ended its writes (-1: a post ended them)
	int post_err = 0;    // the post that ended them
	int fatal = -1;      // the async event that followed
	int later_post = 0;  // a post after that
	int destroy = -1;    // ibv_destroy_qp, then the rest with RDMAV_ALLOW_DISASSOC_DESTROY
	int teardown = -1;
	long slowest_ms = 0;
};

// The other process: RDMA writes into A's buffer until the device dies.
int writer(Link &link)
{
	Side s;
	Info peer;
	if (!s.open(false) || !link.send_value(s.info()) || !link.recv_value(&peer, kBound) || !s.connect(peer) ||
	    !link.send_value('r'))
		return 10;
	WriterReport rep;
	for (uint64_t id = 1;; ++id) {
		if ((rep.post_err = s.post_op(Op::write, peer, id)))
			break;
		ibv_wc wc;
		if (!poll_one(s.send_cq, wc, ms{5000}))
			return 11;
		if (wc.status != IBV_WC_SUCCESS) {
			rep.status = wc.status;
			break;
		}
	}
	auto t = Clock::now();
	rep.fatal = wait_async_event(s.ctx, kBound);
	rep.later_post = s.post_op(Op::write, peer, 0);
	rep.destroy = ibv_destroy_qp(s.qp);
	setenv("RDMAV_ALLOW_DISASSOC_DESTROY", "1", 1);
	rep.teardown = s.teardown();
	rep.slowest_ms = std::chrono::duration_cast<ms>(Clock::now() - t).count();
	return link.send_value(rep) ? 0 : 12;
}

long ms_since(Clock::time_point t)
{
	return std::chrono::duration_cast<ms>(Clock::now() - t).count();
}

bool exists(const std::string &path)
{
	struct stat st;
	return lstat(path.c_str(), &st) == 0;
}

}  // namespace

int daemon_death()
{
	const std::string rundir = env_or("XSRC_RUNDIR", "/run/xsrc");
	// A second device whose files the dead daemon leaves: `xsrc up` must clean them.
	if (!run_xsrc("up --name xsrc1 --netdev lo"))
		return 1;
	const std::string stale_arena = harness::device_arena_path("xsrc1");

	Child b = Child::run(writer);
	Side a;
	Info binfo;
	char ready;
	if (!a.open(true) || !b.link().send_value(a.info()) || !b.link().recv_value(&binfo, kBound) ||
	    !a.connect(binfo) || !b.link().recv_value(&ready, kBound)) {
		std::printf("FAIL: set-up\n");
		return 1;
	}
	constexpr int kSends = 4, kRecvs = 8;
	for (int i = 0; i < kRecvs; ++i)
		expect(a.post_recv(100 + i) == 0, "post_recv before the fault");
	// B posts no receives: these wait in RNR retries (forever) on the progress thread.
	for (int i = 0; i < kSends; ++i)
		expect(a.post_op(Op::send, binfo, 200 + i) == 0, "post_send before the fault");
	expect(ibv_req_notify_cq(a.recv_cq, 0) == 0, "arm the receive CQ");
	// An SRQ and a QP with the ibv_wr_* builder: their posts fail too.
	ibv_srq_init_attr sa{};
	sa.attr = {4, 1, 0};
	ibv_srq *srq = ibv_create_srq(a.pd, &sa);
	ibv_qp_init_attr_ex xa{};
	xa.qp_type = IBV_QPT_RC;
	xa.send_cq = xa.recv_cq = a.send_cq;
	xa.cap = {4, 4, 1, 1, 0};
	xa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	xa.pd = a.pd;
	xa.send_ops_flags = IBV_QP_EX_WITH_SEND;
	ibv_qp *wr_qp = ibv_create_qp_ex(a.ctx, &xa);
	expect(srq && wr_qp, "an SRQ and a QP with send_ops_flags");

	auto sleeper = std::async(std::launch::async, [&] {
		ibv_cq *cq = nullptr;
		void *cq_ctx = nullptr;
		int rc = ibv_get_cq_event(a.channel, &cq, &cq_ctx);
		if (rc == 0)
			ibv_ack_cq_events(cq, 1);
		return rc;
	});
	auto fatal = std::async(std::launch::async, [&] { return wait_async_event(a.ctx, ms{10'000}); });
	std::this_thread::sleep_for(ms{100});  // B's writes flow; the sleeper sleeps
	expect(sleeper.wait_for(ms{0}) == std::future_status::timeout, "the sleeper sleeps before the fault");

	pid_t daemon = harness::daemon_pid(rundir);
	if (daemon <= 0 || kill(daemon, SIGKILL) != 0) {
		std::printf("FAIL: cannot kill xsrcd (pid %d)\n", daemon);
		return 1;
	}
	auto killed = Clock::now();
	std::printf("killed xsrcd (pid %d)\n", daemon);

	expect(fatal.wait_for(kBound) == std::future_status::ready && fatal.get() == IBV_EVENT_DEVICE_FATAL,
	       "IBV_EVENT_DEVICE_FATAL on the async fd within 2 s");
	bool woke = sleeper.wait_for(kBound - ms{std::min<long>(ms_since(killed), 1900)}) ==
		    std::future_status::ready;
	expect(woke, "the thread in ibv_get_cq_event woke within 2 s");
	if (woke)
		std::printf("  ibv_get_cq_event returned %d\n", sleeper.get());
	int flushed_sends = 0, flushed_recvs = 0;
	ibv_wc wc;
	while (flushed_sends < kSends && poll_one(a.send_cq, wc, kBound))
		flushed_sends += wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id >= 200;
	while (flushed_recvs < kRecvs && poll_one(a.recv_cq, wc, kBound))
		flushed_recvs += wc.status == IBV_WC_WR_FLUSH_ERR && wc.opcode == IBV_WC_RECV;
	expect(flushed_sends == kSends, "the RNR-waiting sends completed IBV_WC_WR_FLUSH_ERR (" +
						std::to_string(flushed_sends) + ")");
	expect(flushed_recvs == kRecvs, "the posted receives completed IBV_WC_WR_FLUSH_ERR (" +
						std::to_string(flushed_recvs) + ")");
	expect(ibv_poll_cq(a.send_cq, 1, &wc) == 0, "nothing more to poll");
	expect(a.post_op(Op::send, binfo, 1) == EIO, "ibv_post_send after the fault: EIO");
	expect(a.post_recv(1) == EIO, "ibv_post_recv after the fault: EIO");
	if (srq) {
		ibv_sge sge{reinterpret_cast<uintptr_t>(a.buf.data()), 8, a.mr->lkey};
		ibv_recv_wr rwr{}, *bad = nullptr;
		rwr.sg_list = &sge;
		rwr.num_sge = 1;
		expect(ibv_post_srq_recv(srq, &rwr, &bad) == EIO && bad == &rwr, "ibv_post_srq_recv after the fault: EIO");
	}
	if (wr_qp) {
		ibv_qp_ex *qpx = ibv_qp_to_qp_ex(wr_qp);
		ibv_wr_start(qpx);
		ibv_wr_send(qpx);
		ibv_wr_set_sge(qpx, a.mr->lkey, reinterpret_cast<uintptr_t>(a.buf.data()), 8);
		expect(ibv_wr_complete(qpx) == EIO, "ibv_wr_complete after the fault: EIO");
	}
	expect(ibv_destroy_qp(a.qp) == EIO, "ibv_destroy_qp after the fault: EIO");
	expect(ibv_dereg_mr(a.mr) == EIO, "ibv_dereg_mr after the fault: EIO");

	WriterReport rep;
	expect(b.link().recv_value(&rep, ms{5000}), "the other process reports");
	expect(rep.post_err == EIO || rep.status == IBV_WC_WR_FLUSH_ERR,
	       "its writes end with EIO or a flush (post " + std::to_string(rep.post_err) + ", status " +
		       std::to_string(rep.status) + ")");
	expect(rep.fatal == IBV_EVENT_DEVICE_FATAL, "it got IBV_EVENT_DEVICE_FATAL");
	expect(rep.later_post == EIO, "its later post: EIO");
	expect(rep.destroy == EIO, "its ibv_destroy_qp: EIO");
	expect(rep.teardown == 0, "its teardown with RDMAV_ALLOW_DISASSOC_DESTROY: 0");
	expect(rep.slowest_ms < kBound.count(), "its waits and teardown took " + std::to_string(rep.slowest_ms) + " ms");

	setenv("RDMAV_ALLOW_DISASSOC_DESTROY", "1", 1);
	auto t = Clock::now();
	expect((!wr_qp || ibv_destroy_qp(wr_qp) == 0) && (!srq || ibv_destroy_srq(srq) == 0),
	       "ibv_destroy_qp and ibv_destroy_srq with RDMAV_ALLOW_DISASSOC_DESTROY: 0");
	expect(a.teardown() == 0, "teardown with RDMAV_ALLOW_DISASSOC_DESTROY: every destroy 0, close_device 0");
	expect(ms_since(t) < kBound.count(), "teardown took " + std::to_string(ms_since(t)) + " ms");
	unsetenv("RDMAV_ALLOW_DISASSOC_DESTROY");
	expect(b.wait(kBound).has_value(), "the other process exits");

	// A new daemon: the dead one's files go, fresh contexts work.
	expect(run_xsrc("up --name xsrc0 --netdev lo"), "xsrc up after the dead daemon");
	expect(!stale_arena.empty() && !exists(stale_arena), "the dead daemon's arena " + stale_arena + " is gone");
	expect(!exists("/dev/infiniband/uverbs1"), "its /dev/infiniband/uverbs1 is gone");
	Side c, d;
	bool up = c.open(false) && d.open(false) && c.connect(d.info()) && d.connect(c.info());
	expect(up, "fresh contexts connect");
	if (up) {
		expect(d.post_recv(7) == 0 && c.post_op(Op::send, d.info(), 8) == 0, "fresh QPs post");
		ibv_wc w1, w2;
		expect(poll_one(c.send_cq, w1, kBound) && w1.status == IBV_WC_SUCCESS &&
			       poll_one(d.recv_cq, w2, kBound) && w2.status == IBV_WC_SUCCESS && w2.wr_id == 7,
		       "a send between fresh contexts completes");
	}
	expect(c.teardown() == 0 && d.teardown() == 0, "fresh contexts tear down");
	expect(wait_device_idle(kBound), "the new daemon's objects return to zero");
	std::printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
	return failures ? 1 : 0;
}

}  // namespace xsrc::fault
