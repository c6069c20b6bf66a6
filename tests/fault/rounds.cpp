// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// fault_rounds: each round runs a random workload (SEND, RDMA WRITE, RDMA
// READ, fetch-and-add, compare-and-swap) between two processes on RC or XRC
// QPs, through the UCT shim, or on RC QPs connected by rdma_cm (each side
// sends, so each finds out),
// SIGKILLs a random participant (client, server or xsrcd) at a random
// moment, and checks what the survivors see and what is left:
// - a peer's death: the survivor's work ends IBV_WC_RETRY_EXC_ERR, its QP is
//   in ERR, later work flushes (IBV_WC_WR_FLUSH_ERR), no device event;
//   (rdma_cm: flushes allowed, as the daemon moves the QP to error when it
//   tells the survivor RDMA_CM_EVENT_DISCONNECTED, which must come; UCT:
//   the error handler hears UCS_ERR_ENDPOINT_TIMEOUT, later ops fail);
// - the daemon's death: IBV_EVENT_DEVICE_FATAL, flushes, EIO from posts,
//   teardown 0 under RDMAV_ALLOW_DISASSOC_DESTROY (UCT: its ops fail; the
//   rdma_cm channel wakes its reader); `xsrc up` restarts it;
// - either way: no wait past 2 s, no fd left in the survivor, the daemon's
//   contexts, objects and fds back to where they were, no arena, node or
//   FUSE mount more than before.
// The seed is printed first: `fault_test rounds N SEED` replays a run.
#include <dirent.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <xsrc/uct.h>

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
#include "round.h"

namespace xsrc::fault {

using harness::Child;
using harness::Link;

namespace {

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

}  // namespace

const char *kind_name(Kind k)
{
	switch (k) {
	case Kind::rc: return "RC";
	case Kind::xrc: return "XRC";
	case Kind::uct: return "UCT";
	case Kind::cm: return "rdma_cm";
	default: return "?";
	}
}

void note_slowest(Report &rep, Clock::time_point since)
{
	rep.slowest_ms = std::max<long>(rep.slowest_ms, std::chrono::duration_cast<ms>(Clock::now() - since).count());
}

bool ready_and_go(Link &link)
{
	int go = 0;
	return link.send_value('r') && link.recv_value(&go, ms{5000});
}

bool ended_and_told(Link &link, Victim &victim)
{
	return link.send_value('e') && link.recv_value(&victim, ms{5000});
}

void verbs_workload(Side &s, Op op, const Info &peer, Report &rep)
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

void verbs_after_fault(Side &s, Op op, const Info &peer, Victim v, Report &rep)
{
	auto t = Clock::now();
	if (v == Victim::daemon) {
		rep.fatal = wait_async_event(s.ctx, kBound);
		note_slowest(rep, t);
		rep.later_post = s.post_op(op, peer, 1);
		setenv("RDMAV_ALLOW_DISASSOC_DESTROY", "1", 1);
	} else {
		// A peer's death is no device event: nothing should be waiting.
		rep.fatal = wait_async_event(s.ctx, ms{0});
		ibv_qp_attr attr{};
		ibv_qp_init_attr init{};
		if (ibv_query_qp(s.qp, &attr, IBV_QP_STATE, &init) == 0)
			rep.qp_state = attr.qp_state;
		rep.later_post = s.post_op(op, peer, 1);
		ibv_wc wc;
		t = Clock::now();
		if (!rep.later_post && poll_one(s.send_cq, wc, kBound))
			rep.later_status = wc.status;
		note_slowest(rep, t);
	}
	t = Clock::now();
	drain(s.send_cq, v, rep);
	drain(s.recv_cq, v, rep);
	note_slowest(rep, t);
}

int verbs_run(Link &link, Side &s, Op op, const Info &peer, Report &rep, const std::function<void(Victim)> &also)
{
	Victim v;
	if (!ready_and_go(link))
		return 12;
	verbs_workload(s, op, peer, rep);
	if (!ended_and_told(link, v))
		return 13;
	verbs_after_fault(s, op, peer, v, rep);
	auto t = Clock::now();
	if (also)
		also(v);
	rep.teardown = s.teardown();
	note_slowest(rep, t);
	return 0;
}

int verbs_participant(Link &link, const Setup &setup)
{
	const int fds_before = open_fd_count();
	Report rep;
	{
		Side s;
		Info peer;
		if (!s.open(false, setup.kind == Kind::xrc) || !link.send_value(s.info()) || !link.recv_value(&peer, ms{5000}) ||
		    !s.connect(peer))
			return 10;
		for (int i = 0; i < Side::kRecvs; ++i)
			if (s.post_recv(i))
				return 11;
		if (int err = verbs_run(link, s, setup.op, peer, rep))
			return err;
	}
	rep.fd_leak = open_fd_count() - fds_before;
	return link.send_value(rep) ? 0 : 14;
}

namespace {

const char *victim_name(Victim v)
{
	return v == Victim::client ? "client" : v == Victim::server ? "server" : "xsrcd";
}

// One participant: its Setup, then the kind's own.
int participant(Link &link)
{
	Setup setup;
	if (!link.recv_value(&setup, ms{5000}))
		return 9;
	switch (setup.kind) {
	case Kind::uct: return uct_participant(link, setup);
	case Kind::cm: return cm_participant(link, setup);
	default: return verbs_participant(link, setup);
	}
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

// The new daemon's fds once it has closed what our status queries opened
// (it does so on its own time): the fewest seen over 200 ms.
int settled_daemon_fds(const std::string &rundir)
{
	int fewest = host_state(rundir).daemon_fds;
	for (int i = 0; i < 10; ++i) {
		std::this_thread::sleep_for(ms{20});
		fewest = std::min(fewest, host_state(rundir).daemon_fds);
	}
	return fewest;
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
std::string judge(const Report &r, Kind k, Victim v, long detect_ms)
{
	std::string bad;
	auto rule = [&](bool ok, const std::string &what) {
		if (!ok)
			bad += " [" + what + "]";
	};
	auto num = [](int n) { return std::to_string(n); };
	rule(!r.hung, "a completion never came");
	rule(detect_ms <= kBound.count(), "the fault took " + num(detect_ms) + " ms to show");
	rule(r.slowest_ms <= kBound.count(), "a wait took " + std::to_string(r.slowest_ms) + " ms");
	rule(r.teardown == 0, "teardown: " + num(r.teardown));
	rule(r.fd_leak == 0, num(r.fd_leak) + " fds left");
	if (k == Kind::uct) {
		rule(r.uct_end < 0, "the workload ended with " + num(r.uct_end));
		rule(r.uct_later < 0, "an op after the fault: " + num(r.uct_later));
		if (v != Victim::daemon)
			rule(r.ep_error == UCS_ERR_ENDPOINT_TIMEOUT, "the error handler got " + num(r.ep_error));
		return bad;
	}
	rule(r.bad_status < 0, "completion status " + num(r.bad_status));
	const std::string ended = "the workload ended with post " + num(r.post_err) + ", status " + num(r.first_status);
	if (v == Victim::daemon) {
		rule(r.post_err == EIO || r.first_status == IBV_WC_WR_FLUSH_ERR || r.first_status == IBV_WC_RETRY_EXC_ERR,
		     ended);
		rule(r.fatal == IBV_EVENT_DEVICE_FATAL, "async event " + num(r.fatal));
		rule(r.later_post == EIO, "a later post: " + num(r.later_post));
		if (k == Kind::cm)
			rule(r.cm_event != -1, "the rdma_cm channel stayed asleep");
		return bad;
	}
	// rdma_cm moves the survivor's QP to error as it reports the disconnection.
	rule(r.post_err == 0 && (r.first_status == IBV_WC_RETRY_EXC_ERR ||
				 (k == Kind::cm && r.first_status == IBV_WC_WR_FLUSH_ERR)),
	     ended);
	rule(r.fatal != IBV_EVENT_DEVICE_FATAL, "DEVICE_FATAL without a device fault");
	rule(r.qp_state == IBV_QPS_ERR, "QP state " + num(r.qp_state));
	rule(r.later_post == 0 && r.later_status == IBV_WC_WR_FLUSH_ERR,
	     "a later post: " + num(r.later_post) + ", status " + num(r.later_status));
	if (k == Kind::cm)
		rule(r.cm_event == RDMA_CM_EVENT_DISCONNECTED, "rdma_cm event " + num(r.cm_event));
	return bad;
}

struct Round {
	Kind kind;
	Op op;
	Victim victim;
	std::chrono::microseconds delay;
};

// Carries one frame from each child to the other.
bool relay(Child &a, Child &b)
{
	std::string fa, fb;
	return a.link().recv_frame(&fa, ms{5000}) && b.link().recv_frame(&fb, ms{5000}) && a.link().send_frame(fb) &&
	       b.link().send_frame(fa);
}

// One round; "" when every rule held, else what broke.
std::string run_round(const Round &round, uint16_t port, const std::string &rundir, HostState &baseline)
{
	Child a = Child::run(participant);  // the client
	Child b = Child::run(participant);  // the server
	char ra, rb;
	if (!a.link().send_value(Setup{round.kind, round.op, false, port}) ||
	    !b.link().send_value(Setup{round.kind, round.op, true, port}))
		return "set-up failed";
	// rdma_cm: the server listens before the client connects.
	char listening = 0;
	if (round.kind == Kind::cm && (!b.link().recv_value(&listening, ms{5000}) || !a.link().send_value(listening)))
		return "the rdma_cm server did not listen";
	if (!relay(a, b) || !a.link().recv_value(&ra, ms{5000}) || !b.link().recv_value(&rb, ms{5000}))
		return "set-up failed";
	const int go = 1;
	if (!a.link().send_value(go) || !b.link().send_value(go))
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
		if (std::string b2 = judge(rep, round.kind, round.victim, detect_ms); !b2.empty())
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
		baseline.daemon_fds = settled_daemon_fds(rundir);
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
	int by_victim[3] = {}, by_kind[4] = {};
	auto start = Clock::now();
	for (int i = 1; i <= count; ++i) {
		Round r{static_cast<Kind>(rng() % static_cast<int>(Kind::count)),
			static_cast<Op>(rng() % static_cast<int>(Op::count)),
			static_cast<Victim>(rng() % static_cast<int>(Victim::count)),
			std::chrono::microseconds(rng() % 20'000)};
		// rdma_cm: a port of the round's own, so no listener of an earlier round is in the way.
		std::string bad = run_round(r, static_cast<uint16_t>(20000 + i % 10000), rundir, baseline);
		++by_victim[static_cast<int>(r.victim)];
		++by_kind[static_cast<int>(r.kind)];
		std::printf("round %d: %s %s, kill %s after %.1f ms: %s%s\n", i, kind_name(r.kind), op_name(r.op),
			    victim_name(r.victim),
			    r.delay.count() / 1000.0, bad.empty() ? "ok" : "FAIL", bad.c_str());
		bad.empty() ? ++passed : ++failed;
		if (failed >= 5)
			break;  // enough to go on; the seed replays it
	}
	long secs = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start).count();
	std::printf("%d rounds in %ld s (client %d, server %d, xsrcd %d killed; RC %d, XRC %d, UCT %d, rdma_cm %d), "
		    "seed %lu\n",
		    passed + failed, secs, by_victim[0], by_victim[1], by_victim[2], by_kind[0], by_kind[1], by_kind[2],
		    by_kind[3], seed);
	std::printf("%d passed, %d failed\n", passed, failed);
	return failed || passed != count ? 1 : 0;
}

}  // namespace xsrc::fault
