// xrc_alltoall: N processes on one host send small messages all-to-all on an
// xsrc device, connected either with RC or with XRC, and report what the
// connections cost (QPs, daemon objects, xsrcd RSS, process RSS, arena pages,
// setup time) and the message rate they reach.
//
//   xrc_alltoall --mode rc|xrc --procs N [--device xsrc0] [--seconds 3]
//                [--size 8] [--depth 1024] [--rundir /run/xsrc]
//
// Prints one line of key=value fields (bench/xrc_alltoall makes a table).
//
// RC: every process has an RC QP to every other process: N*(N-1) QPs. Each
//   process receives into one basic SRQ (as MPI libraries do), so receive
//   buffers cost the same in both modes and only the connections differ.
// XRC: all N processes are one "node": they share one XRC domain (opened by
//   file). What XRC buys: a sender needs one XRC send QP per remote *node*,
//   not per remote process, because an XRC message names the target SRQ
//   (remote_srqn) and the target node's receive QP delivers to any SRQ of
//   the domain. So here each process has ONE send QP (to the only node,
//   this one) and one XRC SRQ; the node has one XRC receive QP per sending
//   process (its peer QP), owned by one of the node's processes and used for
//   every local SRQ: N send + N receive QPs. On M nodes of P processes each
//   that is 2*P*(M-1) QPs per node against RC's P*(M*P-1).
//
// Structure: the coordinator (this process, which never touches verbs)
// forks the workers; they publish QP/SRQ numbers in shared memory and meet
// at barriers (with a timeout, and an abort if any worker dies). Sends are
// inline, signaled every 16th; receivers repost at once. The rate counts the
// messages received while the clock ran; afterwards every sender drains, and
// the totals must match (sent == received) or the run is reported as failed.
#include <infiniband/verbs.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/fd.h"
#include "harness/child.h"
#include "harness/device_stats.h"
#include "harness/qp_connect.h"

namespace {

using namespace xsrc::harness;

constexpr int kMaxProcs = 64;
constexpr int kSignalEvery = 16;
constexpr uint64_t kWindow = 256;  // unacknowledged sends per destination
constexpr int kBarriers = 5;
constexpr int kBarrierTimeoutS = 60;

struct Options {
	std::string mode = "rc";
	int procs = 4;
	std::string device = "xsrc0";
	double seconds = 3;
	uint32_t size = 8;
	uint32_t depth = 1024;
	std::string rundir = "/run/xsrc";
};

struct WorkerInfo {
	pid_t pid;
	uint32_t srqn;                 // XRC: its XRC SRQ
	uint32_t xrc_send_qpn;         // XRC: its one send QP
	uint32_t xrc_recv_qpn;         // XRC: the receive QP it owns for sender (i+1) % N
	uint32_t rc_qpn[kMaxProcs];    // RC: its QP to process j
	uint32_t qps;                  // QPs it created
	uint64_t sent, received;       // totals after the drain
	uint64_t received_at_stop;     // counted when it saw the clock stop
	uint64_t out_of_order;         // messages not next in their sender's sequence
	uint64_t async_events;
	int failed;
	char error[256];
};

struct Shared {
	std::atomic<int> arrived[kBarriers];
	std::atomic<int> abort;
	std::atomic<int> stop;
	WorkerInfo w[kMaxProcs];
};

Shared *g_shared;
Options g_opt;

double now_s()
{
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

[[noreturn]] void fail(const std::string &what)
{
	throw std::runtime_error(what);
}

std::string err_text(int e)
{
	return std::to_string(e) + " (" + strerror(e) + ")";
}

// Everyone (N workers + the coordinator) arrives at barrier k; `idle` runs
// while waiting (a worker keeps serving its receives there).
void barrier(int k, const std::function<void()> &idle = {})
{
	int parties = g_opt.procs + 1;
	g_shared->arrived[k].fetch_add(1);
	double deadline = now_s() + kBarrierTimeoutS;
	while (g_shared->arrived[k].load() < parties) {
		if (g_shared->abort.load())
			fail("aborted at barrier " + std::to_string(k));
		if (now_s() > deadline) {
			g_shared->abort.store(1);
			fail("timed out at barrier " + std::to_string(k));
		}
		if (idle)
			idle();
		else
			usleep(200);
		sched_yield();
	}
}

// ---- the worker --------------------------------------------------------------

struct Worker {
	int me;
	int n;
	bool xrc;
	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	ibv_cq *send_cq = nullptr;
	ibv_cq *recv_cq = nullptr;
	ibv_srq *srq = nullptr;
	ibv_xrcd *xrcd = nullptr;
	xsrc::unique_fd xrcd_fd;
	ibv_mr *mr = nullptr;
	std::vector<uint8_t> recv_buf;
	std::vector<ibv_qp *> send_qps;   // RC: index = peer; XRC: [0]
	ibv_qp *xrc_recv_qp = nullptr;
	std::vector<uint64_t> posted, acked;
	std::vector<uint64_t> seq_to, seq_from;  // per peer: next message number
	uint64_t sent = 0, received = 0, out_of_order = 0, async_events = 0;
	std::string first_gap;
	std::vector<uint8_t> slot_posted;  // a receive completing twice shows here
	uint64_t double_completions = 0, duplicates = 0, gaps = 0;
	static constexpr uint32_t kSlot = 64;

	uint64_t window() const { return xrc ? kWindow * (n - 1) : kWindow; }

	void open()
	{
		int num = 0;
		ibv_device **list = ibv_get_device_list(&num);
		if (!list)
			fail("ibv_get_device_list: " + err_text(errno));
		for (int i = 0; i < num && !ctx; ++i)
			if (g_opt.device == ibv_get_device_name(list[i]))
				ctx = ibv_open_device(list[i]);
		ibv_free_device_list(list);
		if (!ctx)
			fail("cannot open " + g_opt.device);
		if (!(pd = ibv_alloc_pd(ctx)))
			fail("ibv_alloc_pd: " + err_text(errno));
		// Signaled sends outstanding: one per kSignalEvery of each window.
		int send_cqe = (n - 1) * static_cast<int>(kWindow / kSignalEvery + 2) + 16;
		if (!(send_cq = ibv_create_cq(ctx, send_cqe, nullptr, nullptr, 0)))
			fail("ibv_create_cq: " + err_text(errno));
		if (!(recv_cq = ibv_create_cq(ctx, static_cast<int>(g_opt.depth), nullptr, nullptr, 0)))
			fail("ibv_create_cq: " + err_text(errno));
		recv_buf.resize(size_t(g_opt.depth) * kSlot);
		if (!(mr = ibv_reg_mr(pd, recv_buf.data(), recv_buf.size(), IBV_ACCESS_LOCAL_WRITE)))
			fail("ibv_reg_mr: " + err_text(errno));
	}

	// Every QP talks to a QP on this device; none grants remote access.
	static xsrc::harness::QpConnectAttrs qp_attrs()
	{
		xsrc::harness::QpConnectAttrs a;
		a.access = 0;
		a.hop_limit = 64;
		a.rnr_retry = 7;  // receivers share 2 cores: wait for them
		return a;
	}

	void to_init(ibv_qp *qp)
	{
		if (auto step = xsrc::harness::qp_to_init(qp, qp_attrs()))
			fail("modify " + step.text());
	}

	// RC and XRC receive QPs take the responder attributes too.
	void to_rtr(ibv_qp *qp, uint32_t dest)
	{
		xsrc::harness::QpRemote remote{dest, {}};
		if (ibv_query_gid(ctx, 1, 1, &remote.gid))
			fail("ibv_query_gid");
		if (auto step = xsrc::harness::qp_to_rtr(qp, remote, qp_attrs()))
			fail("modify " + step.text());
	}

	void to_rts(ibv_qp *qp)
	{
		if (auto step = xsrc::harness::qp_to_rts(qp, qp_attrs()))
			fail("modify " + step.text());
	}

	ibv_qp *create_send_qp(ibv_qp_type type)
	{
		ibv_qp_init_attr_ex a{};
		a.qp_type = type;
		a.send_cq = send_cq;
		a.recv_cq = recv_cq;
		a.srq = type == IBV_QPT_RC ? srq : nullptr;
		// An XRC send QP carries the traffic of all n-1 destinations.
		a.cap.max_send_wr = static_cast<uint32_t>(window() + kSignalEvery);
		a.cap.max_send_sge = 1;
		a.cap.max_inline_data = 64;
		a.comp_mask = IBV_QP_INIT_ATTR_PD;
		a.pd = pd;
		ibv_qp *qp = ibv_create_qp_ex(ctx, &a);
		if (!qp)
			fail("ibv_create_qp_ex: " + err_text(errno));
		to_init(qp);
		return qp;
	}

	void create(const std::string &domain_file)
	{
		WorkerInfo &info = g_shared->w[me];
		if (xrc) {
			xrcd_fd.reset(::open(domain_file.c_str(), O_RDONLY));
			if (!xrcd_fd)
				fail("open " + domain_file + ": " + err_text(errno));
			ibv_xrcd_init_attr xa{};
			xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
			xa.fd = xrcd_fd.get();
			xa.oflags = O_CREAT;
			if (!(xrcd = ibv_open_xrcd(ctx, &xa)))
				fail("ibv_open_xrcd: " + err_text(errno));
			ibv_srq_init_attr_ex sa{};
			sa.attr.max_wr = g_opt.depth;
			sa.attr.max_sge = 1;
			sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
				       IBV_SRQ_INIT_ATTR_PD;
			sa.srq_type = IBV_SRQT_XRC;
			sa.xrcd = xrcd;
			sa.cq = recv_cq;
			sa.pd = pd;
			if (!(srq = ibv_create_srq_ex(ctx, &sa)))
				fail("ibv_create_srq_ex: " + err_text(errno));
			if (ibv_get_srq_num(srq, &info.srqn))
				fail("ibv_get_srq_num");
			send_qps.push_back(create_send_qp(IBV_QPT_XRC_SEND));
			info.xrc_send_qpn = send_qps[0]->qp_num;
			ibv_qp_init_attr_ex ra{};
			ra.qp_type = IBV_QPT_XRC_RECV;
			ra.comp_mask = IBV_QP_INIT_ATTR_XRCD;
			ra.xrcd = xrcd;
			if (!(xrc_recv_qp = ibv_create_qp_ex(ctx, &ra)))
				fail("ibv_create_qp_ex(XRC_RECV): " + err_text(errno));
			to_init(xrc_recv_qp);
			info.xrc_recv_qpn = xrc_recv_qp->qp_num;
			info.qps = 2;
		} else {
			ibv_srq_init_attr sa{};
			sa.attr.max_wr = g_opt.depth;
			sa.attr.max_sge = 1;
			if (!(srq = ibv_create_srq(pd, &sa)))
				fail("ibv_create_srq: " + err_text(errno));
			send_qps.assign(n, nullptr);
			for (int j = 0; j < n; ++j)
				if (j != me) {
					send_qps[j] = create_send_qp(IBV_QPT_RC);
					info.rc_qpn[j] = send_qps[j]->qp_num;
				}
			info.qps = n - 1;
		}
		posted.assign(send_qps.size(), 0);
		acked.assign(send_qps.size(), 0);
		seq_to.assign(n, 0);
		seq_from.assign(n, 0);
	}

	void connect()
	{
		const WorkerInfo *w = g_shared->w;
		if (xrc) {
			// My receive QP serves sender (me+1) % n; mine is served by (me-1) % n.
			to_rtr(xrc_recv_qp, w[(me + 1) % n].xrc_send_qpn);
			to_rtr(send_qps[0], w[(me + n - 1) % n].xrc_recv_qpn);
			to_rts(send_qps[0]);
		} else {
			for (int j = 0; j < n; ++j)
				if (j != me) {
					to_rtr(send_qps[j], w[j].rc_qpn[me]);
					to_rts(send_qps[j]);
				}
		}
		post_recvs(nullptr, 0);
	}

	// Posts the receives of the slots named (all slots when none given).
	void post_recvs(const uint64_t *slots, size_t count)
	{
		if (!slots)
			count = g_opt.depth;
		std::vector<ibv_sge> sge(count);
		std::vector<ibv_recv_wr> wr(count);
		for (size_t k = 0; k < count; ++k) {
			uint64_t slot = slots ? slots[k] : k;
			if (slot_posted.size() < g_opt.depth)
				slot_posted.resize(g_opt.depth);
			slot_posted[slot] = 1;
			sge[k] = {reinterpret_cast<uintptr_t>(recv_buf.data() + slot * kSlot), kSlot, mr->lkey};
			wr[k] = {};
			wr[k].wr_id = slot;
			wr[k].sg_list = &sge[k];
			wr[k].num_sge = 1;
			wr[k].next = k + 1 < count ? &wr[k + 1] : nullptr;
		}
		ibv_recv_wr *bad = nullptr;
		if (count)
			if (int e = ibv_post_srq_recv(srq, wr.data(), &bad))
				fail("ibv_post_srq_recv: " + err_text(e));
	}

	// Receives that completed: counted and posted again. Returns how many.
	int serve_recvs()
	{
		ibv_wc wc[64];
		int got = ibv_poll_cq(recv_cq, 64, wc);
		if (got < 0)
			fail("ibv_poll_cq(recv)");
		uint64_t slots[64];
		for (int k = 0; k < got; ++k) {
			if (wc[k].status != IBV_WC_SUCCESS)
				fail(std::string("receive completion: ") + ibv_wc_status_str(wc[k].status));
			if (wc[k].wr_id >= g_opt.depth)
				fail("receive completion with wr_id " + std::to_string(wc[k].wr_id));
			slots[k] = wc[k].wr_id;
			// Every sender's messages to me arrive in order, none missing.
			uint64_t word;
			std::memcpy(&word, recv_buf.data() + wc[k].wr_id * kSlot, sizeof(word));
			uint64_t src = word >> 48, seq = word & ((1ull << 48) - 1);
			if (!slot_posted[wc[k].wr_id])
				++double_completions;
			slot_posted[wc[k].wr_id] = 0;
			if (src < uint64_t(n) && seq < seq_from[src])
				++duplicates;
			if (src < uint64_t(n) && seq > seq_from[src])
				gaps += seq - seq_from[src];
			if (src >= uint64_t(n) || seq != seq_from[src]) {
				if (!out_of_order++)
					first_gap = "from " + std::to_string(src) + ": got #" + std::to_string(seq) +
						    ", expected #" + std::to_string(src < uint64_t(n) ? seq_from[src] : 0);
			}
			if (src < uint64_t(n))
				seq_from[src] = seq + 1;
		}
		received += got;
		post_recvs(slots, got);
		return got;
	}

	void serve_sends()
	{
		ibv_wc wc[64];
		int got = ibv_poll_cq(send_cq, 64, wc);
		if (got < 0)
			fail("ibv_poll_cq(send)");
		for (int k = 0; k < got; ++k) {
			if (wc[k].status != IBV_WC_SUCCESS)
				fail(std::string("send completion: ") + ibv_wc_status_str(wc[k].status));
			size_t q = wc[k].wr_id >> 40;
			acked[q] = wc[k].wr_id & ((1ull << 40) - 1);
		}
	}

	// One message to process `dest`; false if its QP's window is full.
	bool send_to(int dest, bool force_signal = false)
	{
		size_t q = xrc ? 0 : static_cast<size_t>(dest);
		if (posted[q] - acked[q] >= window())
			return false;
		uint64_t payload[8] = {(uint64_t(me) << 48) | seq_to[dest]};
		ibv_sge sge{reinterpret_cast<uintptr_t>(payload), g_opt.size, 0};
		ibv_send_wr wr{};
		bool signal = force_signal || (posted[q] + 1) % kSignalEvery == 0;
		wr.wr_id = (uint64_t(q) << 40) | (posted[q] + 1);
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_INLINE | (signal ? IBV_SEND_SIGNALED : 0);
		if (xrc)
			wr.qp_type.xrc.remote_srqn = g_shared->w[dest].srqn;
		ibv_send_wr *bad = nullptr;
		if (int e = ibv_post_send(send_qps[q], &wr, &bad)) {
			if (e == ENOMEM)
				return false;  // send queue full behind an RNR wait
			fail("ibv_post_send: " + err_text(e));
		}
		++posted[q];
		++seq_to[dest];
		++sent;
		return true;
	}

	void run()
	{
		std::vector<int> peers;
		for (int j = 0; j < n; ++j)
			if (j != me)
				peers.push_back(j);
		size_t rr = me % peers.size();
		while (!g_shared->stop.load(std::memory_order_relaxed)) {
			for (int b = 0; b < 16; ++b) {
				if (!send_to(peers[rr]))
					break;
				rr = (rr + 1) % peers.size();
			}
			serve_recvs();
			serve_sends();
			if (g_shared->abort.load(std::memory_order_relaxed))
				fail("aborted");
		}
		g_shared->w[me].received_at_stop = received;
		// Drain: the last send of every QP signaled, then all acknowledged.
		for (size_t q = 0; q < send_qps.size(); ++q) {
			if (!send_qps[q] || posted[q] == acked[q] || posted[q] % kSignalEvery == 0)
				continue;
			int dest = xrc ? peers[rr] : static_cast<int>(q);
			while (!send_to(dest, true)) {
				serve_recvs();
				serve_sends();
			}
		}
		double deadline = now_s() + 30;
		for (;;) {
			serve_recvs();
			serve_sends();
			bool done = true;
			for (size_t q = 0; q < send_qps.size(); ++q)
				done = done && posted[q] == acked[q];
			if (done)
				break;
			if (now_s() > deadline)
				fail("sends not acknowledged after the run");
			if (g_shared->abort.load())
				fail("aborted");
		}
	}

	// Async events (a CQ overrun would be one): counted, not expected.
	void check_async()
	{
		int flags = fcntl(ctx->async_fd, F_GETFL);
		fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
		ibv_async_event ev;
		while (ibv_get_async_event(ctx, &ev) == 0) {
			if (!async_events++)
				first_gap += std::string(first_gap.empty() ? "" : "; ") + "async event " +
					     ibv_event_type_str(ev.event_type) +
					     (ev.event_type != IBV_EVENT_CQ_ERR ? ""
					      : ev.element.cq == recv_cq ? " (receive CQ)" : " (send CQ)");
			ibv_ack_async_event(&ev);
		}
		fcntl(ctx->async_fd, F_SETFL, flags);
	}

	~Worker()
	{
		for (ibv_qp *qp : send_qps)
			if (qp)
				ibv_destroy_qp(qp);
		if (xrc_recv_qp)
			ibv_destroy_qp(xrc_recv_qp);
		if (srq)
			ibv_destroy_srq(srq);
		if (xrcd)
			ibv_close_xrcd(xrcd);
		xrcd_fd.reset();
		if (mr)
			ibv_dereg_mr(mr);
		if (recv_cq)
			ibv_destroy_cq(recv_cq);
		if (send_cq)
			ibv_destroy_cq(send_cq);
		if (pd)
			ibv_dealloc_pd(pd);
		if (ctx)
			ibv_close_device(ctx);
	}
};

int worker_main(int me, const std::string &domain_file)
{
	WorkerInfo &info = g_shared->w[me];
	info.pid = getpid();
	try {
		Worker w;
		w.me = me;
		w.n = g_opt.procs;
		w.xrc = g_opt.mode == "xrc";
		w.open();
		w.create(domain_file);
		barrier(0);
		w.connect();
		barrier(1);  // the coordinator measures
		barrier(2);  // go
		w.run();
		barrier(3, [&] { w.serve_recvs(); w.serve_sends(); });
		while (w.serve_recvs() > 0) {
		}
		w.check_async();
		if (w.out_of_order)
			w.first_gap += "; duplicates " + std::to_string(w.duplicates) + ", missing " +
				       std::to_string(w.gaps) + ", receives completed twice " +
				       std::to_string(w.double_completions);
		info.sent = w.sent;
		info.received = w.received;
		info.out_of_order = w.out_of_order + w.double_completions;
		info.async_events = w.async_events;
		snprintf(info.error, sizeof(info.error), "%s", w.first_gap.c_str());
		barrier(4);
		return 0;
	} catch (const std::exception &e) {
		info.failed = 1;
		snprintf(info.error, sizeof(info.error), "%s", e.what());
		g_shared->abort.store(1);
		return 1;
	}
}

// ---- the coordinator -----------------------------------------------------------

void usage()
{
	fprintf(stderr,
		"usage: xrc_alltoall --mode rc|xrc --procs N [--device NAME] [--seconds S]\n"
		"                    [--size BYTES] [--depth RECEIVES] [--rundir DIR]\n");
	exit(2);
}

Options parse(int argc, char **argv)
{
	Options o;
	for (int i = 1; i < argc; ++i) {
		std::string a = argv[i];
		auto value = [&]() -> std::string {
			if (i + 1 >= argc)
				usage();
			return argv[++i];
		};
		if (a == "--mode")
			o.mode = value();
		else if (a == "--procs")
			o.procs = std::stoi(value());
		else if (a == "--device")
			o.device = value();
		else if (a == "--seconds")
			o.seconds = std::stod(value());
		else if (a == "--size")
			o.size = static_cast<uint32_t>(std::stoul(value()));
		else if (a == "--depth")
			o.depth = static_cast<uint32_t>(std::stoul(value()));
		else if (a == "--rundir")
			o.rundir = value();
		else
			usage();
	}
	if ((o.mode != "rc" && o.mode != "xrc") || o.procs < 2 || o.procs > kMaxProcs || o.size > 64 ||
	    o.size < 1 || o.depth < 16)
		usage();
	return o;
}

}  // namespace

int main(int argc, char **argv)
{
	g_opt = parse(argc, argv);
	const int n = g_opt.procs;
	void *mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	g_shared = new (mem) Shared{};

	char domain_file[] = "/tmp/xrc_alltoall_XXXXXX";
	int dfd = mkstemp(domain_file);
	if (dfd < 0) {
		perror("mkstemp");
		return 1;
	}
	close(dfd);

	const pid_t xsrcd = daemon_pid(g_opt.rundir);
	const std::string arena = device_arena_path(g_opt.device);
	const long daemon_rss0 = proc_status_kb(xsrcd, "VmRSS");
	const long daemon_anon0 = proc_status_kb(xsrcd, "RssAnon");
	const long arena0 = allocated_kb(arena);
	const long objects0 = device_objects(g_opt.device);

	const double t0 = now_s();
	std::vector<Child> workers;
	for (int i = 0; i < n; ++i) {
		try {
			workers.push_back(Child::run([i, &domain_file](Link &) {
				alarm(static_cast<unsigned>(g_opt.seconds) + 2 * kBarrierTimeoutS);
				return worker_main(i, domain_file);
			}));
		} catch (const std::exception &e) {
			fprintf(stderr, "xrc_alltoall: %s\n", e.what());
			g_shared->abort.store(1);
			break;
		}
	}

	// Waiting at a barrier, the coordinator watches for dead workers.
	auto reap_check = [&] {
		for (Child &c : workers)
			if (c.running() && c.wait(xsrc::harness::ms{0}))
				g_shared->abort.store(1);
		usleep(500);
	};

	int rc = 0;
	long daemon_rss = -1, daemon_anon = -1, procs_rss = 0, procs_anon = 0, arena1 = -1, objects1 = -1;
	double setup_s = 0, run_s = 0;
	try {
		barrier(0, reap_check);
		barrier(1, reap_check);
		setup_s = now_s() - t0;
		daemon_rss = proc_status_kb(xsrcd, "VmRSS");
		daemon_anon = proc_status_kb(xsrcd, "RssAnon");
		for (const Child &c : workers) {
			procs_rss += proc_status_kb(c.pid(), "VmRSS");
			procs_anon += proc_status_kb(c.pid(), "RssAnon");
		}
		arena1 = allocated_kb(arena);
		objects1 = device_objects(g_opt.device);
		barrier(2, reap_check);
		double start = now_s();
		while (now_s() - start < g_opt.seconds && !g_shared->abort.load())
			usleep(10000);
		g_shared->stop.store(1);
		run_s = now_s() - start;
		barrier(3, reap_check);
		barrier(4, reap_check);
	} catch (const std::exception &e) {
		fprintf(stderr, "xrc_alltoall: %s\n", e.what());
		rc = 1;
	}
	for (Child &c : workers) {
		if (!c.running())
			continue;
		if (rc) {
			c.kill();
			continue;
		}
		auto st = c.wait(xsrc::harness::kForever);
		if (!st || !WIFEXITED(*st) || WEXITSTATUS(*st) != 0)
			rc = 1;
	}
	unlink(domain_file);

	uint64_t sent = 0, received = 0, at_stop = 0, out_of_order = 0, async_events = 0;
	long qps = 0;
	for (int i = 0; i < n; ++i) {
		const WorkerInfo &w = g_shared->w[i];
		if (w.failed) {
			fprintf(stderr, "xrc_alltoall: worker %d: %s\n", i, w.error);
			rc = 1;
		}
		if (!w.failed && (w.out_of_order || w.async_events))
			fprintf(stderr, "xrc_alltoall: worker %d: %llu out of order, %llu async events: %s\n", i,
				(unsigned long long)w.out_of_order, (unsigned long long)w.async_events, w.error);
		out_of_order += w.out_of_order;
		async_events += w.async_events;
		sent += w.sent;
		received += w.received;
		at_stop += w.received_at_stop;
		qps += w.qps;
	}
	if (!rc && (out_of_order || async_events))
		rc = 1;
	if (!rc && sent != received) {
		fprintf(stderr, "xrc_alltoall: %llu messages sent but %llu received\n",
			(unsigned long long)sent, (unsigned long long)received);
		rc = 1;
	}
	long send_qps = g_opt.mode == "xrc" ? n : long(n) * (n - 1);
	printf("mode=%s procs=%d qps=%ld send_qps=%ld recv_qps=%ld daemon_objects=%ld "
	       "daemon_rss_kb=%ld daemon_rss_delta_kb=%ld daemon_anon_delta_kb=%ld "
	       "procs_rss_kb=%ld procs_anon_kb=%ld arena_kb=%ld arena_delta_kb=%ld setup_ms=%.1f "
	       "seconds=%.2f messages=%llu rate=%.0f size=%u ok=%d\n",
	       g_opt.mode.c_str(), n, qps, send_qps, qps - send_qps,
	       objects0 >= 0 && objects1 >= 0 ? objects1 - objects0 : -1, daemon_rss,
	       daemon_rss - daemon_rss0, daemon_anon - daemon_anon0, procs_rss, procs_anon, arena1,
	       arena1 - arena0, setup_s * 1e3, run_s, (unsigned long long)at_stop,
	       run_s > 0 ? at_stop / run_s : 0.0, g_opt.size, rc == 0);
	return rc;
}
