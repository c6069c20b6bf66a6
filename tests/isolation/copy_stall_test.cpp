// A long copy through the device does not stall other contexts' commands.
// Root registers a 256 MiB buffer; a child running as uid 65534 RDMA-writes
// it whole, several times (another user's memory: xsrcd moves the bytes,
// XSRC_CMD_COPY); meanwhile a third process times ibv_reg_mr and
// ibv_create_qp on a context of its own. Each must take under 10 ms (issue
// 16), where a daemon that holds its lock for a whole copy makes them wait
// for the copy (tens of ms per 256 MiB here). Prints the figures; exits 0
// only when the writes all succeeded, every byte arrived and the probe stayed
// under the bound. This VM is noisy (a process can lose the CPU for 10 ms):
// up to kAttempts runs, one within the bound passes; a daemon that stalls
// its commands fails every one.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "device_test_util.h"
#include "harness/child.h"
#include "harness/completions.h"
#include "harness/qp_connect.h"

using namespace xsrc::harness;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kBytes = 256u << 20;
constexpr int kWrites = 4;
constexpr int kAttempts = 5;
constexpr long long kBoundUs = 10'000;
constexpr uid_t kNobody = 65534;
constexpr ms kStep{30'000};

long long micros_since(Clock::time_point t0)
{
	return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
}

// One side's verbs objects: a PD, a CQ, an RC QP and a registered buffer.
struct Side {
	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	ibv_cq *cq = nullptr;
	ibv_qp *qp = nullptr;
	ibv_mr *mr = nullptr;
	void *buf = MAP_FAILED;

	Side() = default;
	Side(const Side &) = delete;
	Side &operator=(const Side &) = delete;
	~Side()
	{
		if (qp)
			ibv_destroy_qp(qp);
		if (mr)
			ibv_dereg_mr(mr);
		if (buf != MAP_FAILED)
			munmap(buf, kBytes);
		if (cq)
			ibv_destroy_cq(cq);
		if (pd)
			ibv_dealloc_pd(pd);
		if (ctx)
			ibv_close_device(ctx);
	}

	bool open(uint32_t access)
	{
		ctx = xsrc_test::open_device("xsrc0");
		pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
		cq = pd ? ibv_create_cq(ctx, 16, nullptr, nullptr, 0) : nullptr;
		if (!cq)
			return false;
		ibv_qp_init_attr attr{};
		attr.send_cq = attr.recv_cq = cq;
		attr.qp_type = IBV_QPT_RC;
		attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
		attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
		qp = ibv_create_qp(pd, &attr);
		buf = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		if (!qp || buf == MAP_FAILED)
			return false;
		mr = ibv_reg_mr(pd, buf, kBytes, access);
		return mr != nullptr;
	}
	// Exchanges QPN and GID over `link` and connects the QP.
	bool connect(Link &link)
	{
		QpRemote mine{qp->qp_num, {}}, theirs;
		if (ibv_query_gid(ctx, 1, 1, &mine.gid) || !link.send_value(mine) || !link.recv_value(&theirs, kStep))
			return false;
		return !qp_connect(qp, theirs);
	}
};

struct Target {
	uint64_t addr;
	uint32_t rkey;
};

struct WriterResult {
	int failed_writes;
	long long slowest_write_us;
};

struct ProbeResult {
	long long rounds;
	long long reg_mr_max_us;
	long long create_qp_max_us;
};

// As uid 65534: writes the target whole, kWrites times, one WR each.
int writer(Link &link)
{
	if (setresgid(kNobody, kNobody, kNobody) || setresuid(kNobody, kNobody, kNobody))
		return 2;
	Side s;
	Target t;
	if (!s.open(IBV_ACCESS_LOCAL_WRITE) || !s.connect(link) || !link.recv_value(&t, kStep))
		return 3;
	std::memset(s.buf, 0x5a, kBytes);
	WriterResult r{0, 0};
	for (int i = 0; i < kWrites; ++i) {
		ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf), static_cast<uint32_t>(kBytes), s.mr->lkey};
		ibv_send_wr wr{}, *bad = nullptr;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.rdma.remote_addr = t.addr;
		wr.wr.rdma.rkey = t.rkey;
		auto t0 = Clock::now();
		std::vector<ibv_wc> wc;
		if (ibv_post_send(s.qp, &wr, &bad) == 0)
			wc = poll_completions(s.cq, 1, kStep);
		r.slowest_write_us = std::max(r.slowest_write_us, micros_since(t0));
		if (wc.size() != 1 || wc[0].status != IBV_WC_SUCCESS)
			++r.failed_writes;
	}
	return link.send_value(r) ? 0 : 4;
}

// Times reg_mr and create_qp on a context of its own until told to stop.
int probe(Link &link)
{
	Side s;
	s.ctx = xsrc_test::open_device("xsrc0");
	s.pd = s.ctx ? ibv_alloc_pd(s.ctx) : nullptr;
	s.cq = s.pd ? ibv_create_cq(s.ctx, 16, nullptr, nullptr, 0) : nullptr;
	char go;
	if (!s.cq || !link.send_value('r') || !link.recv_value(&go, kStep))
		return 3;
	std::vector<char> buf(4096);
	ProbeResult r{0, 0, 0};
	while (!link.readable()) {
		auto t0 = Clock::now();
		ibv_mr *mr = ibv_reg_mr(s.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
		long long reg = micros_since(t0);
		ibv_qp_init_attr attr{};
		attr.send_cq = attr.recv_cq = s.cq;
		attr.qp_type = IBV_QPT_RC;
		attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
		attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
		auto t1 = Clock::now();
		ibv_qp *qp = ibv_create_qp(s.pd, &attr);
		long long create = micros_since(t1);
		if (!mr || !qp)
			return 4;
		ibv_destroy_qp(qp);
		ibv_dereg_mr(mr);
		r.reg_mr_max_us = std::max(r.reg_mr_max_us, reg);
		r.create_qp_max_us = std::max(r.create_qp_max_us, create);
		++r.rounds;
	}
	return link.send_value(r) ? 0 : 5;
}

// One run: false when the copies failed or a command waited too long.
bool attempt()
{
	Child w = Child::run(writer);
	Child p = Child::run(probe);
	Side root;
	char ready;
	if (!root.open(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) || !root.connect(w.link()) ||
	    !p.link().recv_value(&ready, kStep)) {
		std::printf("FAIL: set-up: %s\n", std::strerror(errno));
		return false;
	}
	Target t{reinterpret_cast<uintptr_t>(root.buf), root.mr->rkey};
	WriterResult wr{};
	ProbeResult pr{};
	bool ok = p.link().send_value('g') && w.link().send_value(t) && w.link().recv_value(&wr, ms{120'000});
	ok = p.link().send_value('s') && p.link().recv_value(&pr, kStep) && ok;
	if (!ok) {
		std::printf("FAIL: a child did not report (writer %d, probe %d)\n", exit_code(*w.wait(kStep)),
			    exit_code(*p.wait(kStep)));
		return false;
	}
	const auto *bytes = static_cast<const unsigned char *>(root.buf);
	bool arrived = std::all_of(bytes, bytes + kBytes, [](unsigned char b) { return b == 0x5a; });
	std::printf("%d writes of %zu MiB from uid %u: %d failed, slowest %lld us; every byte arrived: %s\n",
		    kWrites, kBytes >> 20, kNobody, wr.failed_writes, wr.slowest_write_us, arrived ? "yes" : "no");
	std::printf("meanwhile %lld rounds: ibv_reg_mr at most %lld us, ibv_create_qp at most %lld us (bound %lld)\n",
		    pr.rounds, pr.reg_mr_max_us, pr.create_qp_max_us, kBoundUs);
	bool pass = wr.failed_writes == 0 && arrived && pr.rounds > 0 && pr.reg_mr_max_us < kBoundUs &&
		    pr.create_qp_max_us < kBoundUs;
	return pass;
}

}  // namespace

int main()
{
	for (int i = 1; i <= kAttempts; ++i) {
		bool pass = attempt();
		std::printf("attempt %d: %s\n", i, pass ? "ok" : "FAIL");
		if (pass)
			return 0;
	}
	return 1;
}
