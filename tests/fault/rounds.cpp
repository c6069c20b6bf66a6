// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// fault_rounds: each round runs a random workload (SEND, RDMA WRITE, RDMA
// READ, fetch-and-add, compare-and-swap) between two processes on RC or XRC
// QPs (each side sends, so each finds out),
// SIGKILLs a random participant (client, server or xsrcd) at a random
// moment, and checks what the survivors see and what is left:
// - a peer's death: the survivor's work ends IBV_WC_RETRY_EXC_ERR, its QP is
//   in ERR, later work flushes (IBV_WC_WR_FLUSH_ERR), no device event;
// - the daemon's death: IBV_EVENT_DEVICE_FATAL, flushes, EIO from posts,
//   teardown 0 under RDMAV_ALLOW_DISASSOC_DESTROY; `xsrc up` restarts it;
// - either way: no wait past 2 s, no fd left in the survivor, the daemon's
//   contexts, objects and fds back to where they were, no arena, node or
//   FUSE mount more than before.
// The seed is printed first: `fault_test rounds N SEED` replays a run.
#include <dirent.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "fault.h"
#include "harness/child.h"
#include "harness/device_stats.h"

namespace xsrc::fault {
namespace {

using harness::Child;
using harness::Link;

enum class Victim : int { client, server, daemon, count };

const char *victim_name(Victim v)
{
	return v == Victim::client ? "client" : v == Victim::server ? "server" : "xsrcd";
}

struct Report {
	int first_status = -1;  // the completion that ended the workload (-1: a post did)
	int post_err = 0;       // the post that ended it
	int fatal = -1;         // the async event that came (-1: none)
	int bad_status = -1;    // a completion status no rule allows
	int later_post = 0;     // a post after the fault
	int later_status = -1;  // its completion
	int qp_state = -1;      // ibv_query_qp after a peer's death
	int teardown = 0;
	int fd_leak = 0;        // open fds after ibv_close_device less those before ibv_open_device
	long slowest_ms = 0;    // the longest wait or teardown after the fault
	int hung = 0;           // a completion that never came
};

bool status_allowed(int status, Victim v)
{
	if (status == IBV_WC_SUCCESS || status == IBV_WC_WR_FLUSH_ERR)
		return true;
	return v == Victim::daemon && status == IBV_WC_RETRY_EXC_ERR;
}

// Polls every completion left on `cq` (until it stays empty for 20 ms).
void drain(ibv_cq *cq, Victim v, Report &rep)
{
	ibv_wc wc;
	while (poll_one(cq, wc, ms{20}))
		if (!status_allowed(wc.status, v))
			rep.bad_status = wc.status;
}

void note_slowest(Report &rep, Clock::time_point since)
{
	rep.slowest_ms = std::max<long>(rep.slowest_ms, std::chrono::duration_cast<ms>(Clock::now() - since).count());
}

// Runs the workload until it fails; false when it hung instead.
void workload(Side &s, Op op, const Info &peer, Report &rep)
{
	for (uint64_t id = 1000;; ++id) {
		if ((rep.post_err = s.post_op(op, peer, id)))
			return;
		ibv_wc wc;
		if (!poll_one(s.send_cq, wc, ms{5000})) {
			rep.hung = 1;
			return;
		}
		if (wc.status != IBV_WC_SUCCESS) {
			rep.first_status = wc.status;
			return;
		}
		while (ibv_poll_cq(s.recv_cq, 1, &wc) > 0) {
			if (wc.status != IBV_WC_SUCCESS) {
				rep.first_status = wc.status;
				return;
			}
			if ((rep.post_err = s.post_recv(wc.wr_id)))
				return;
		}
	}
}

// One participant: connects, runs the workload, reports what the fault did.
int participant(Link &link)
{
	const int fds_before = open_fd_count();
	Report rep;
	{
		Side s;
		Info peer;
		int op = 0, victim = 0, xrc = 0;
		if (!link.recv_value(&xrc, ms{5000}) || !s.open(false, xrc) || !link.send_value(s.info()) || !link.recv_value(&peer, ms{5000}) ||
		    !s.connect(peer))
			return 10;
		for (int i = 0; i < Side::kRecvs; ++i)
			if (s.post_recv(i))
				return 11;
		if (!link.send_value('r') || !link.recv_value(&op, ms{5000}))
			return 12;
		workload(s, static_cast<Op>(op), peer, rep);
		if (!link.send_value('e') || !link.recv_value(&victim, ms{5000}))
			return 13;
		const auto v = static_cast<Victim>(victim);
		auto t = Clock::now();
		if (v == Victim::daemon) {
			rep.fatal = wait_async_event(s.ctx, kBound);
			note_slowest(rep, t);
			rep.later_post = s.post_op(static_cast<Op>(op), peer, 1);
			setenv("RDMAV_ALLOW_DISASSOC_DESTROY", "1", 1);
		} else {
			// A peer's death is no device event: nothing should be waiting.
			rep.fatal = wait_async_event(s.ctx, ms{0});
			ibv_qp_attr attr{};
			ibv_qp_init_attr init{};
			if (ibv_query_qp(s.qp, &attr, IBV_QP_STATE, &init) == 0)
				rep.qp_state = attr.qp_state;
			rep.later_post = s.post_op(static_cast<Op>(op), peer, 1);
			ibv_wc wc;
			t = Clock::now();
			if (!rep.later_post && poll_one(s.send_cq, wc, kBound))
				rep.later_status = wc.status;
			note_slowest(rep, t);
		}
		t = Clock::now();
		drain(s.send_cq, v, rep);
		drain(s.recv_cq, v, rep);
		rep.teardown = s.teardown();
		note_slowest(rep, t);
	}
	rep.fd_leak = open_fd_count() - fds_before;
	return link.send_value(rep) ? 0 : 14;
}

// What the device has on this host: files, nodes, mounts, the daemon's fds.
struct HostState {
	std::set<std::string> shm, nodes;
	int fuse_mounts = 0;
	int daemon_fds = 0;
	bool operator==(const HostState &) const = default;
};

std::set<std::string> names_in(const char *dir)
{
	std::set<std::string> names;
	if (DIR *d = opendir(dir)) {
		while (dirent *e = readdir(d))
			if (e->d_name[0] != '.')
				names.insert(e->d_name);
		closedir(d);
	}
	return names;
}

HostState host_state(const std::string &rundir)
{
	HostState h;
	h.shm = names_in("/dev/shm");
	h.nodes = names_in("/dev/infiniband");
	std::ifstream mounts("/proc/self/mountinfo");
	for (std::string line; std::getline(mounts, line);)
		h.fuse_mounts += line.find(" - fuse.xsrc ") != std::string::npos;
	pid_t pid = harness::daemon_pid(rundir);
	h.daemon_fds = pid > 0 ? static_cast<int>(names_in(("/proc/" + std::to_string(pid) + "/fd").c_str()).size()) : -1;
	return h;
}

std::string describe(const HostState &h)
{
	std::string s = "shm {";
	for (const auto &n : h.shm)
		s += " " + n;
	s += " } nodes {";
	for (const auto &n : h.nodes)
		s += " " + n;
	return s + " } fuse mounts " + std::to_string(h.fuse_mounts) + ", xsrcd fds " + std::to_string(h.daemon_fds);
}

// Every broken rule of one survivor's report, "" when none.
std::string judge(const Report &r, Victim v, long detect_ms)
{
	std::string bad;
	auto rule = [&](bool ok, const std::string &what) {
		if (!ok)
			bad += " [" + what + "]";
	};
	rule(!r.hung, "a completion never came");
	rule(detect_ms <= kBound.count(), "the fault took " + std::to_string(detect_ms) + " ms to show");
	rule(r.slowest_ms <= kBound.count(), "a wait took " + std::to_string(r.slowest_ms) + " ms");
	rule(r.bad_status < 0, "completion status " + std::to_string(r.bad_status));
	rule(r.teardown == 0, "teardown: " + std::to_string(r.teardown));
	rule(r.fd_leak == 0, std::to_string(r.fd_leak) + " fds left");
	if (v == Victim::daemon) {
		rule(r.post_err == EIO || r.first_status == IBV_WC_WR_FLUSH_ERR || r.first_status == IBV_WC_RETRY_EXC_ERR,
		     "the workload ended with post " + std::to_string(r.post_err) + ", status " +
			     std::to_string(r.first_status));
		rule(r.fatal == IBV_EVENT_DEVICE_FATAL, "async event " + std::to_string(r.fatal));
		rule(r.later_post == EIO, "a later post: " + std::to_string(r.later_post));
	} else {
		rule(r.post_err == 0 && r.first_status == IBV_WC_RETRY_EXC_ERR,
		     "the workload ended with post " + std::to_string(r.post_err) + ", status " +
			     std::to_string(r.first_status));
		rule(r.fatal != IBV_EVENT_DEVICE_FATAL, "DEVICE_FATAL without a device fault");
		rule(r.qp_state == IBV_QPS_ERR, "QP state " + std::to_string(r.qp_state));
		rule(r.later_post == 0 && r.later_status == IBV_WC_WR_FLUSH_ERR,
		     "a later post: " + std::to_string(r.later_post) + ", status " + std::to_string(r.later_status));
	}
	return bad;
}

struct Round {
	Op op;
	bool xrc;
	Victim victim;
	std::chrono::microseconds delay;
};

// One round; "" when every rule held, else what broke.
std::string run_round(const Round &round, const std::string &rundir, HostState &baseline)
{
	Child a = Child::run(participant);  // the client
	Child b = Child::run(participant);  // the server
	Info ia, ib;
	char ra, rb;
	const int xrc = round.xrc;
	if (!a.link().send_value(xrc) || !b.link().send_value(xrc) || !a.link().recv_value(&ia, ms{5000}) || !b.link().recv_value(&ib, ms{5000}) || !a.link().send_value(ib) ||
	    !b.link().send_value(ia) || !a.link().recv_value(&ra, ms{5000}) || !b.link().recv_value(&rb, ms{5000}))
		return "set-up failed";
	const int op = static_cast<int>(round.op);
	if (!a.link().send_value(op) || !b.link().send_value(op))
		return "cannot start the workload";
	std::this_thread::sleep_for(round.delay);

	switch (round.victim) {
	case Victim::client: a.kill(); break;
	case Victim::server: b.kill(); break;
	default:
		if (pid_t pid = harness::daemon_pid(rundir); pid <= 0 || kill(pid, SIGKILL) != 0)
			return "cannot kill xsrcd";
	}
	const auto killed = Clock::now();
	std::string bad;
	for (Child *c : {&a, &b}) {
		if (!c->running())
			continue;
		const int victim = static_cast<int>(round.victim);
		char ended;
		Report rep;
		bool told = c->link().send_value(victim) && c->link().recv_value(&ended, ms{10'000});
		long detect_ms = std::chrono::duration_cast<ms>(Clock::now() - killed).count();
		if (!told || !c->link().recv_value(&rep, ms{10'000})) {
			bad += " [a survivor did not report]";
			continue;
		}
		if (std::string b2 = judge(rep, round.victim, detect_ms); !b2.empty())
			bad += std::string(c == &a ? " client:" : " server:") + b2;
		auto st = c->wait(kBound);
		if (!st || harness::exit_code(*st) != 0)
			bad += " [a survivor did not exit 0]";
	}
	if (round.victim == Victim::daemon) {
		if (!run_xsrc("up --name xsrc0 --netdev lo"))
			return bad + " [xsrc up after the fault failed]";
		if (!wait_device_idle(kBound))
			return bad + " [the new daemon is not idle]";
		baseline.daemon_fds = host_state(rundir).daemon_fds;
	}
	// What the daemon frees after a process's death is asynchronous: wait for it.
	auto until = Clock::now() + kBound;
	HostState now = host_state(rundir);
	while (!(now == baseline) && Clock::now() < until) {
		std::this_thread::sleep_for(ms{20});
		now = host_state(rundir);
	}
	if (!(now == baseline))
		bad += " [left behind: " + describe(now) + "; before: " + describe(baseline) + "]";
	if (!wait_device_idle(kBound))
		bad += " [the daemon's contexts or objects did not return to zero]";
	return bad;
}

}  // namespace

int rounds(int count, unsigned long seed)
{
	std::printf("fault_rounds: %d rounds, seed %lu (replay: fault_test rounds %d %lu)\n", count, seed, count, seed);
	const std::string rundir = env_or("XSRC_RUNDIR", "/run/xsrc");
	if (!wait_device_idle(kBound))
		return 1;
	HostState baseline = host_state(rundir);
	std::printf("before: %s\n", describe(baseline).c_str());
	std::mt19937_64 rng(seed);
	int passed = 0, failed = 0;
	int by_victim[3] = {};
	auto start = Clock::now();
	for (int i = 1; i <= count; ++i) {
		Round r{static_cast<Op>(rng() % static_cast<int>(Op::count)), rng() % 3 == 0,
			static_cast<Victim>(rng() % static_cast<int>(Victim::count)),
			std::chrono::microseconds(rng() % 20'000)};
		std::string bad = run_round(r, rundir, baseline);
		++by_victim[static_cast<int>(r.victim)];
		std::printf("round %d: %s %s, kill %s after %.1f ms: %s%s\n", i, r.xrc ? "XRC" : "RC", op_name(r.op),
			    victim_name(r.victim),
			    r.delay.count() / 1000.0, bad.empty() ? "ok" : "FAIL", bad.c_str());
		bad.empty() ? ++passed : ++failed;
		if (failed >= 5)
			break;  // enough to go on; the seed replays it
	}
	long secs = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start).count();
	std::printf("%d rounds in %ld s (client %d, server %d, xsrcd %d killed), seed %lu\n", passed + failed, secs,
		    by_victim[0], by_victim[1], by_victim[2], seed);
	std::printf("%d passed, %d failed\n", passed, failed);
	return failed || passed != count ? 1 : 0;
}

}  // namespace xsrc::fault
