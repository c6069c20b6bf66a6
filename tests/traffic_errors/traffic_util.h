// Helpers shared by the traffic_errors test (the requester, a GoogleTest
// program) and its peers (the same binary re-exec'd with --peer): verbs
// objects with cleanup, RC/UD connection set-up, bounded polling and
// completion-channel waits, the message link between the two processes, and
// the atomic hammer both sides can run.
//
// Failures inside these helpers throw std::runtime_error: GoogleTest reports
// an exception in a test body as a failure, and the peer turns it into an
// error reply.
#pragma once

#include <infiniband/verbs.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/shm.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "device_test_util.h"
#include "harness/completions.h"
#include "harness/link.h"
#include "harness/qp_connect.h"

namespace xsrc_traffic {

using namespace std::chrono_literals;
using ms = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Connection parameters of the suite (ibv_rc_pingpong -g 1 style).
constexpr int kGidIndex = 1;
constexpr uint8_t kPort = 1;
constexpr ibv_mtu kPathMtu = IBV_MTU_1024;
constexpr uint8_t kTimeout = 14;   // 4.096 us << 14 = 67 ms per try
constexpr uint8_t kRetryCnt = 7;
constexpr uint8_t kMinRnrTimer = 1;  // 10 us
constexpr uint32_t kAllRemote =
	IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
constexpr uint32_t kAllAccess = IBV_ACCESS_LOCAL_WRITE | kAllRemote;

[[noreturn]] inline void fail(const std::string &what)
{
	throw std::runtime_error(what);
}

// A call that returned null / -1 with errno set.
inline void check(bool ok, const std::string &what)
{
	if (!ok)
		fail(what + ": " + strerror(errno));
}

// A verb that returns an errno value (0 on success).
inline void check_rc(int rc, const std::string &what)
{
	if (rc)
		fail(what + ": " + strerror(rc > 0 ? rc : errno) + " (" + std::to_string(rc) + ")");
}

inline std::string status_str(int status)
{
	return std::string(ibv_wc_status_str(static_cast<ibv_wc_status>(status))) + " (" +
	       std::to_string(status) + ")";
}

inline std::string gid_hex(const ibv_gid &gid)
{
	char out[33];
	for (int i = 0; i < 16; ++i)
		snprintf(out + 2 * i, 3, "%02x", gid.raw[i]);
	return out;
}

inline ibv_gid gid_from_hex(const std::string &hex)
{
	ibv_gid gid{};
	if (hex.size() != 32)
		fail("bad gid " + hex);
	for (int i = 0; i < 16; ++i)
		gid.raw[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
	return gid;
}

// --- messages between the test and a peer ----------------------------------

using xsrc::harness::Link;
using xsrc::harness::Msg;

// --- verbs objects ---------------------------------------------------------

// Page-aligned memory (so that "one byte past" is a real neighbour), filled
// with a pattern, with an MR over [mr_off, mr_off + mr_len).
struct Buffer {
	uint8_t *data = nullptr;
	size_t size = 0;
	size_t mr_off = 0;
	ibv_mr *mr = nullptr;

	uint8_t *mr_start() const { return data + mr_off; }
	uint64_t addr() const { return reinterpret_cast<uintptr_t>(data + mr_off); }
	uint32_t lkey() const { return mr->lkey; }
	uint32_t rkey() const { return mr->rkey; }
	// Bytes of [off, off+len) that differ from `fill`; the first at *first.
	size_t mismatches(size_t off, size_t len, uint8_t fill, size_t *first = nullptr) const
	{
		size_t bad = 0;
		for (size_t i = off; i < off + len && i < size; ++i)
			if (data[i] != fill) {
				if (!bad && first)
					*first = i;
				++bad;
			}
		return bad;
	}
};

struct QpCaps {
	uint32_t max_send_wr = 16;
	uint32_t max_recv_wr = 16;
	uint32_t max_send_sge = 2;
	uint32_t max_recv_sge = 2;
	uint32_t max_inline_data = 0;
};

// A context and PD on the test device, and everything created through it,
// destroyed in reverse order by close() (or the destructor).
class Verbs {
public:
	Verbs()
	{
		ctx = xsrc_test::open_device(xsrc_test::test_device());
		check(ctx != nullptr, "ibv_open_device(" + xsrc_test::test_device() + ")");
		undo_.push_back([c = ctx]() { return ibv_close_device(c) ? std::string("ibv_close_device") : ""; });
		pd = new_pd();
		check_rc(ibv_query_gid(ctx, kPort, kGidIndex, &gid), "ibv_query_gid(1, 1)");
		ibv_port_attr port{};
		check_rc(ibv_query_port(ctx, kPort, &port), "ibv_query_port");
		mtu_bytes = 128u << port.active_mtu;
	}
	~Verbs() { close(); }
	Verbs(const Verbs &) = delete;
	Verbs &operator=(const Verbs &) = delete;

	// Destroys everything; returns what failed ("" if nothing).
	std::string close()
	{
		std::string errors;
		while (!undo_.empty()) {
			std::string e = undo_.back()();
			undo_.pop_back();
			if (!e.empty())
				errors += (errors.empty() ? "" : "; ") + e + ": " + strerror(errno);
		}
		return errors;
	}

	ibv_pd *new_pd()
	{
		ibv_pd *p = ibv_alloc_pd(ctx);
		check(p != nullptr, "ibv_alloc_pd");
		undo_.push_back([p]() { return ibv_dealloc_pd(p) ? std::string("ibv_dealloc_pd") : ""; });
		return p;
	}

	ibv_comp_channel *channel()
	{
		ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
		check(ch != nullptr, "ibv_create_comp_channel");
		undo_.push_back([ch]() {
			return ibv_destroy_comp_channel(ch) ? std::string("ibv_destroy_comp_channel") : "";
		});
		return ch;
	}

	ibv_cq *cq(int cqe, ibv_comp_channel *ch = nullptr)
	{
		ibv_cq *c = ibv_create_cq(ctx, cqe, nullptr, ch, 0);
		check(c != nullptr, "ibv_create_cq(" + std::to_string(cqe) + ")");
		undo_.push_back([c]() { return ibv_destroy_cq(c) ? std::string("ibv_destroy_cq") : ""; });
		return c;
	}

	ibv_srq *srq(uint32_t max_wr, uint32_t max_sge = 1, ibv_pd *on = nullptr)
	{
		ibv_srq_init_attr attr{};
		attr.attr.max_wr = max_wr;
		attr.attr.max_sge = max_sge;
		ibv_srq *s = ibv_create_srq(on ? on : pd, &attr);
		check(s != nullptr, "ibv_create_srq");
		undo_.push_back([s]() { return ibv_destroy_srq(s) ? std::string("ibv_destroy_srq") : ""; });
		return s;
	}

	ibv_qp *qp(ibv_qp_type type, ibv_cq *send_cq, ibv_cq *recv_cq, const QpCaps &caps = {},
		   ibv_srq *srq = nullptr, bool sig_all = false, ibv_pd *on = nullptr)
	{
		ibv_qp_init_attr attr{};
		attr.send_cq = send_cq;
		attr.recv_cq = recv_cq;
		attr.srq = srq;
		attr.qp_type = type;
		attr.sq_sig_all = sig_all;
		attr.cap.max_send_wr = caps.max_send_wr;
		attr.cap.max_recv_wr = srq ? 0 : caps.max_recv_wr;
		attr.cap.max_send_sge = caps.max_send_sge;
		attr.cap.max_recv_sge = srq ? 0 : caps.max_recv_sge;
		attr.cap.max_inline_data = caps.max_inline_data;
		ibv_qp *q = ibv_create_qp(on ? on : pd, &attr);
		check(q != nullptr, "ibv_create_qp");
		undo_.push_back([q]() { return ibv_destroy_qp(q) ? std::string("ibv_destroy_qp") : ""; });
		return q;
	}

	Buffer *buffer(size_t size, uint32_t access, uint8_t fill, ibv_pd *on = nullptr, size_t mr_off = 0,
		       size_t mr_len = 0)
	{
		auto b = std::make_unique<Buffer>();
		size_t page = 4096;
		b->size = (size + page - 1) / page * page;
		void *p = mmap(nullptr, b->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		check(p != MAP_FAILED, "mmap");
		b->data = static_cast<uint8_t *>(p);
		memset(b->data, fill, b->size);
		b->mr_off = mr_off;
		if (!mr_len)
			mr_len = size - mr_off;
		undo_.push_back([data = b->data, sz = b->size]() {
			munmap(data, sz);
			return std::string();
		});
		b->mr = ibv_reg_mr(on ? on : pd, b->data + mr_off, mr_len, static_cast<int>(access));
		check(b->mr != nullptr, "ibv_reg_mr");
		Buffer *raw = b.get();
		undo_.push_back([raw]() { return raw->mr && ibv_dereg_mr(raw->mr) ? std::string("ibv_dereg_mr") : ""; });
		buffers_.push_back(std::move(b));
		return raw;
	}

	// As buffer(), in a SysV shared memory segment of our own (what
	// perftest --use_hugepages registers), removed at once so that it goes
	// with its last attachment. dereg() may deregister its MR early.
	Buffer *shm_buffer(size_t size, uint32_t access, uint8_t fill)
	{
		auto b = std::make_unique<Buffer>();
		b->size = (size + 4095) / 4096 * 4096;
		int id = shmget(IPC_PRIVATE, b->size, IPC_CREAT | 0600);
		check(id >= 0, "shmget");
		void *p = shmat(id, nullptr, 0);
		shmctl(id, IPC_RMID, nullptr);
		check(p != reinterpret_cast<void *>(-1), "shmat");
		b->data = static_cast<uint8_t *>(p);
		memset(b->data, fill, b->size);
		undo_.push_back([p]() { return shmdt(p) ? std::string("shmdt") : ""; });
		b->mr = ibv_reg_mr(pd, b->data, b->size, static_cast<int>(access));
		check(b->mr != nullptr, "ibv_reg_mr");
		Buffer *raw = b.get();
		undo_.push_back([raw]() { return raw->mr && ibv_dereg_mr(raw->mr) ? std::string("ibv_dereg_mr") : ""; });
		buffers_.push_back(std::move(b));
		return raw;
	}
	// Deregisters a buffer()'s or shm_buffer()'s MR now; its memory stays.
	void dereg(Buffer *b)
	{
		check(ibv_dereg_mr(b->mr) == 0, "ibv_dereg_mr");
		b->mr = nullptr;
	}

	// Device memory of `size` bytes filled with `fill`, with a zero-based MR
	// over [mr_off, mr_off + mr_len) of it.
	struct DevMem {
		ibv_dm *dm = nullptr;
		ibv_mr *mr = nullptr;
		size_t size = 0;
	};
	DevMem dev_mem(size_t size, uint32_t access, uint8_t fill, size_t mr_off = 0, size_t mr_len = 0)
	{
		DevMem d;
		ibv_alloc_dm_attr attr{};
		attr.length = size;
		d.size = size;
		d.dm = ibv_alloc_dm(ctx, &attr);
		check(d.dm != nullptr, "ibv_alloc_dm(" + std::to_string(size) + ")");
		undo_.push_back([dm = d.dm]() { return ibv_free_dm(dm) ? std::string("ibv_free_dm") : ""; });
		std::vector<uint8_t> bytes(size, fill);
		check_rc(ibv_memcpy_to_dm(d.dm, 0, bytes.data(), size), "ibv_memcpy_to_dm");
		d.mr = ibv_reg_dm_mr(pd, d.dm, mr_off, mr_len ? mr_len : size - mr_off,
				     access | IBV_ACCESS_ZERO_BASED);
		check(d.mr != nullptr, "ibv_reg_dm_mr");
		undo_.push_back([mr = d.mr]() { return ibv_dereg_mr(mr) ? std::string("ibv_dereg_mr") : ""; });
		return d;
	}

	// An on-demand-paging MR over fresh anonymous memory that nobody has
	// touched yet (no page exists until the first access); `implicit`: the
	// MR is the implicit one covering the whole address space, and the
	// buffer just memory inside it.
	Buffer *odp_buffer(size_t size, uint32_t access, bool implicit = false, ibv_pd *on = nullptr)
	{
		auto b = std::make_unique<Buffer>();
		size_t page = 4096;
		b->size = (size + page - 1) / page * page;
		void *p = mmap(nullptr, b->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		check(p != MAP_FAILED, "mmap");
		b->data = static_cast<uint8_t *>(p);
		undo_.push_back([data = b->data, sz = b->size]() {
			munmap(data, sz);
			return std::string();
		});
		int odp_access = static_cast<int>(access | IBV_ACCESS_ON_DEMAND);
		b->mr = implicit ? ibv_reg_mr(on ? on : pd, nullptr, SIZE_MAX, odp_access)
				 : ibv_reg_mr(on ? on : pd, b->data, b->size, odp_access);
		check(b->mr != nullptr, "ibv_reg_mr (ODP)");
		undo_.push_back([mr = b->mr]() { return ibv_dereg_mr(mr) ? std::string("ibv_dereg_mr") : ""; });
		Buffer *raw = b.get();
		buffers_.push_back(std::move(b));
		return raw;
	}

	// An MR over memory the caller owns (and keeps mapped).
	Buffer *wrap(uint8_t *data, size_t size, uint32_t access)
	{
		auto b = std::make_unique<Buffer>();
		b->data = data;
		b->size = size;
		b->mr = ibv_reg_mr(pd, data, size, static_cast<int>(access));
		check(b->mr != nullptr, "ibv_reg_mr");
		undo_.push_back([mr = b->mr]() { return ibv_dereg_mr(mr) ? std::string("ibv_dereg_mr") : ""; });
		Buffer *raw = b.get();
		buffers_.push_back(std::move(b));
		return raw;
	}

	ibv_ah *ah(const ibv_gid &dgid)
	{
		ibv_ah_attr attr{};
		attr.is_global = 1;
		attr.grh.dgid = dgid;
		attr.grh.sgid_index = kGidIndex;
		attr.grh.hop_limit = 1;
		attr.port_num = kPort;
		ibv_ah *a = ibv_create_ah(pd, &attr);
		check(a != nullptr, "ibv_create_ah");
		undo_.push_back([a]() { return ibv_destroy_ah(a) ? std::string("ibv_destroy_ah") : ""; });
		return a;
	}

	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	ibv_gid gid{};
	uint32_t mtu_bytes = 0;

private:
	std::vector<std::function<std::string()>> undo_;
	std::vector<std::unique_ptr<Buffer>> buffers_;
};

// --- QP state transitions --------------------------------------------------

struct RcParams {
	uint32_t access = kAllRemote;     // qp_access_flags (as a responder)
	uint8_t min_rnr_timer = kMinRnrTimer;
	uint8_t rnr_retry = 7;
	uint8_t retry_cnt = kRetryCnt;
	uint8_t timeout = kTimeout;
};

// RESET -> INIT -> RTR -> RTS towards (dest_qpn, dgid), GRH with sgid index 1.
inline void rc_connect(ibv_qp *qp, uint32_t dest_qpn, const ibv_gid &dgid, const RcParams &p)
{
	xsrc::harness::QpConnectAttrs a;
	a.port = kPort;
	a.access = p.access;
	a.sgid_index = kGidIndex;
	a.path_mtu = kPathMtu;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = p.min_rnr_timer;
	a.timeout = p.timeout;
	a.retry_cnt = p.retry_cnt;
	a.rnr_retry = p.rnr_retry;
	a.max_rd_atomic = 16;
	if (auto step = xsrc::harness::qp_connect(qp, {dest_qpn, dgid}, a))
		fail("modify_qp " + step.text());
}

inline void ud_connect(ibv_qp *qp, uint32_t qkey)
{
	xsrc::harness::QpConnectAttrs a;
	a.port = kPort;
	a.qkey = qkey;
	if (auto step = xsrc::harness::qp_connect(qp, {}, a))
		fail("modify_qp " + step.text() + " (UD)");
}

inline void to_error(ibv_qp *qp)
{
	if (auto step = xsrc::harness::qp_to_error(qp))
		fail("modify_qp " + step.text());
}

using xsrc::harness::qp_state;

// --- posting -----------------------------------------------------------------

// One receive with one SGE, posted by `post` (ibv_post_recv or ibv_post_srq_recv).
template <typename Queue>
inline int post_one_recv(int (*post)(Queue *, ibv_recv_wr *, ibv_recv_wr **), Queue *q, uint64_t wr_id,
			 uint64_t addr, uint32_t len, uint32_t lkey)
{
	ibv_sge sge{addr, len, lkey};
	ibv_recv_wr wr{};
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	ibv_recv_wr *bad = nullptr;
	return post(q, &wr, &bad);
}

inline int post_recv(ibv_qp *qp, uint64_t wr_id, uint64_t addr, uint32_t len, uint32_t lkey)
{
	return post_one_recv(ibv_post_recv, qp, wr_id, addr, len, lkey);
}

inline int post_srq_recv(ibv_srq *srq, uint64_t wr_id, uint64_t addr, uint32_t len, uint32_t lkey)
{
	return post_one_recv(ibv_post_srq_recv, srq, wr_id, addr, len, lkey);
}

// One work request with one SGE (num_sge 0 when len == 0).
struct SendWr {
	ibv_sge sge{};
	ibv_send_wr wr{};

	SendWr(uint64_t wr_id, ibv_wr_opcode op, uint64_t addr, uint32_t len, uint32_t lkey,
	       unsigned flags = IBV_SEND_SIGNALED)
	{
		sge = {addr, len, lkey};
		wr.wr_id = wr_id;
		wr.opcode = op;
		wr.send_flags = flags;
		wr.sg_list = &sge;
		wr.num_sge = len ? 1 : 0;
	}
	SendWr &rdma(uint64_t raddr, uint32_t rkey)
	{
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
		return *this;
	}
	SendWr &atomic(uint64_t raddr, uint32_t rkey, uint64_t compare_add, uint64_t swap = 0)
	{
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = compare_add;
		wr.wr.atomic.swap = swap;
		return *this;
	}
	SendWr &ud(ibv_ah *ah, uint32_t qpn, uint32_t qkey)
	{
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = qpn;
		wr.wr.ud.remote_qkey = qkey;
		return *this;
	}
	int post(ibv_qp *qp)
	{
		wr.sg_list = &sge;
		ibv_send_wr *bad = nullptr;
		return ibv_post_send(qp, &wr, &bad);
	}
};

// --- completions -------------------------------------------------------------

using xsrc::harness::poll_completions;

// Everything that arrives within `quiet` (expected: nothing).
inline std::vector<ibv_wc> poll_quiet(ibv_cq *cq, ms quiet)
{
	return poll_completions(cq, 1024, quiet);
}

inline std::string describe(const std::vector<ibv_wc> &wcs)
{
	std::string out;
	for (const ibv_wc &wc : wcs)
		out += " {wr_id=" + std::to_string(wc.wr_id) + " " + status_str(wc.status) +
		       " opcode=" + std::to_string(wc.opcode) + " len=" + std::to_string(wc.byte_len) + "}";
	return out.empty() ? " (none)" : out;
}

// Sleeps in ibv_get_cq_event (the channel fd stays blocking) for at most
// `timeout`: a watchdog interrupts the read with SIGUSR1 (a handler without
// SA_RESTART) when the time is up. Returns the CQ (event acknowledged), or
// nullptr when no event came.
inline ibv_cq *wait_cq_event(ibv_comp_channel *ch, ms timeout)
{
	static std::once_flag once;
	std::call_once(once, [] {
		struct sigaction sa{};
		sa.sa_handler = [](int) {};
		sigemptyset(&sa.sa_mask);
		sa.sa_flags = 0;  // no SA_RESTART: read() returns EINTR
		sigaction(SIGUSR1, &sa, nullptr);
	});
	std::mutex m;
	std::condition_variable cv;
	bool done = false;
	pthread_t self = pthread_self();
	std::thread dog([&] {
		std::unique_lock lk(m);
		if (cv.wait_for(lk, timeout, [&] { return done; }))
			return;
		while (!done) {  // until the read has really been interrupted
			pthread_kill(self, SIGUSR1);
			cv.wait_for(lk, 20ms, [&] { return done; });
		}
	});
	ibv_cq *cq = nullptr;
	void *cq_ctx = nullptr;
	int rc = ibv_get_cq_event(ch, &cq, &cq_ctx);
	{
		std::lock_guard lk(m);
		done = true;
	}
	cv.notify_all();
	dog.join();
	if (rc != 0)
		return nullptr;
	ibv_ack_cq_events(cq, 1);
	return cq;
}

// --- the atomic hammer -------------------------------------------------------

struct HammerResult {
	uint64_t posted = 0;
	uint64_t completions = 0;
	uint64_t errors = 0;        // completions with a status other than SUCCESS
	uint64_t wrong_opcode = 0;
	uint64_t unknown = 0;       // wr_id out of range
	uint64_t duplicates = 0;    // a second completion for a wr_id
	uint64_t missing = 0;       // wr_ids never completed
	bool timed_out = false;
	std::string first_problem;
};



// qps.size() * threads threads; thread (q, t) posts `k` FETCH_AND_ADD(+1) on
// (raddr, rkey) through qps[q], at most `window` outstanding, the original
// value of op i landing in results[(q * threads + t) * k + i] (results is in
// an MR with `lkey`). wr_id = that index. cqs[q] is qps[q]'s send CQ, shared
// by its threads: whoever polls a completion accounts it to its owner.
// `signal_every` > 1: only every such op of a thread (and its last) is
// signaled, and its completion retires the unsignaled ones before it (the
// device batches those); only signaled ones count as completions. `words` >
// 1: op i of a thread adds to the word at raddr + (i % words) * word_stride.
inline HammerResult faa_hammer(const std::vector<ibv_qp *> &qps, const std::vector<ibv_cq *> &cqs,
			       int threads, int k, uint64_t raddr, uint32_t rkey, uint64_t *results,
			       uint32_t lkey, ms limit, int window = 16, int signal_every = 1, int words = 1,
			       uint64_t word_stride = 64)
{
	auto signaled = [&](int i) { return (i + 1) % signal_every == 0 || i == k - 1; };
	const size_t nthreads = qps.size() * static_cast<size_t>(threads);
	const size_t total = nthreads * static_cast<size_t>(k);
	std::vector<std::atomic<uint32_t>> seen(total);
	std::vector<std::atomic<int>> outstanding(nthreads), retired(nthreads);
	std::atomic<uint64_t> completions{0}, errors{0}, wrong_opcode{0}, unknown{0}, duplicates{0},
		posted{0};
	std::atomic<bool> timed_out{false};
	std::mutex problem_lock;
	std::string first_problem;
	auto problem = [&](const std::string &what) {
		std::lock_guard g(problem_lock);
		if (first_problem.empty())
			first_problem = what;
	};
	auto deadline = Clock::now() + limit;

	auto reap = [&](ibv_cq *cq) {
		ibv_wc wc[16];
		int n = ibv_poll_cq(cq, 16, wc);
		if (n < 0) {
			problem("ibv_poll_cq < 0");
			return;
		}
		for (int i = 0; i < n; ++i) {
			completions++;
			if (wc[i].wr_id >= total) {
				unknown++;
				problem("unknown wr_id " + std::to_string(wc[i].wr_id));
				continue;
			}
			if (seen[wc[i].wr_id]++ != 0) {
				duplicates++;
				problem("duplicate completion for wr_id " + std::to_string(wc[i].wr_id));
			}
			if (wc[i].status != IBV_WC_SUCCESS) {
				errors++;
				problem("wr_id " + std::to_string(wc[i].wr_id) + ": " + status_str(wc[i].status));
			} else if (wc[i].opcode != IBV_WC_FETCH_ADD) {
				wrong_opcode++;
				problem("opcode " + std::to_string(wc[i].opcode));
			}
			// In order on a QP: this one retires the thread's ops before it.
			size_t owner = wc[i].wr_id / static_cast<uint64_t>(k);
			int upto = static_cast<int>(wc[i].wr_id % static_cast<uint64_t>(k)) + 1;
			int was = retired[owner].load();
			while (was < upto && !retired[owner].compare_exchange_weak(was, upto)) {
			}
			if (was < upto)
				outstanding[owner] -= upto - was;
		}
	};

	std::vector<std::thread> pool;
	for (size_t q = 0; q < qps.size(); ++q)
		for (int t = 0; t < threads; ++t)
			pool.emplace_back([&, q, t] {
				size_t me = q * static_cast<size_t>(threads) + static_cast<size_t>(t);
				int next = 0;
				for (;;) {
					if (Clock::now() > deadline) {
						timed_out = true;
						return;
					}
					while (next < k && outstanding[me].load() < window) {
						uint64_t idx = me * static_cast<uint64_t>(k) + static_cast<uint64_t>(next);
						SendWr w(idx, IBV_WR_ATOMIC_FETCH_AND_ADD,
							 reinterpret_cast<uintptr_t>(&results[idx]), 8, lkey,
							 signaled(next) ? IBV_SEND_SIGNALED : 0);
						w.atomic(raddr + static_cast<uint64_t>(next % words) * word_stride, rkey, 1);
						outstanding[me]++;
						if (int rc = w.post(qps[q])) {
							outstanding[me]--;
							problem("ibv_post_send: " + std::string(strerror(rc)));
							timed_out = true;  // give up
							return;
						}
						posted++;
						++next;
					}
					reap(cqs[q]);
					if (next == k && outstanding[me].load() <= 0)
						return;
				}
			});
	for (auto &th : pool)
		th.join();
	// Late completions of threads that gave up.
	for (ibv_cq *cq : cqs)
		reap(cq);

	HammerResult r;
	r.posted = posted;
	r.completions = completions;
	r.errors = errors;
	r.wrong_opcode = wrong_opcode;
	r.unknown = unknown;
	r.duplicates = duplicates;
	r.timed_out = timed_out;
	for (size_t i = 0; i < total; ++i)
		if (seen[i] == 0 && signaled(static_cast<int>(i % static_cast<size_t>(k))))
			r.missing++;
	r.first_problem = first_problem;
	return r;
}

inline Msg hammer_to_msg(const HammerResult &r)
{
	Msg m;
	m.set("posted", r.posted).set("completions", r.completions).set("errors", r.errors);
	m.set("wrong_opcode", r.wrong_opcode).set("unknown", r.unknown).set("duplicates", r.duplicates);
	m.set("missing", r.missing).set("timed_out", r.timed_out).set("first_problem", r.first_problem);
	return m;
}

inline HammerResult hammer_from_msg(const Msg &m)
{
	HammerResult r;
	r.posted = m.u64("posted");
	r.completions = m.u64("completions");
	r.errors = m.u64("errors");
	r.wrong_opcode = m.u64("wrong_opcode");
	r.unknown = m.u64("unknown");
	r.duplicates = m.u64("duplicates");
	r.missing = m.u64("missing");
	r.timed_out = m.u64("timed_out") != 0;
	r.first_problem = m.str("first_problem", "");
	return r;
}

}  // namespace xsrc_traffic
