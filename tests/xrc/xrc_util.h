// Helpers of the XRC tests: a second process to talk to (the test binary
// re-exec'd, spoken to over a SOCK_SEQPACKET socketpair with bounded waits),
// owning wrappers for verbs objects, and the steps that bring XRC QPs up.
#pragma once

#include <infiniband/verbs.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace xrc_test {

using namespace std::chrono_literals;
using ms = std::chrono::milliseconds;

[[noreturn]] inline void fail(const std::string &what)
{
	throw std::runtime_error(what);
}

inline std::string errno_text(int err)
{
	return std::to_string(err) + " (" + strerror(err) + ")";
}

// --- messages ----------------------------------------------------------------

// "key=value" lines. Values are text; numbers are decimal.
class Msg {
public:
	Msg() = default;
	Msg &set(const std::string &k, uint64_t v) { return set(k, std::to_string(v)); }
	Msg &set(const std::string &k, int v) { return set(k, std::to_string(v)); }
	Msg &set(const std::string &k, unsigned v) { return set(k, std::to_string(v)); }
	Msg &set(const std::string &k, const std::string &v)
	{
		f_[k] = v;
		return *this;
	}
	Msg &set(const std::string &k, const char *v) { return set(k, std::string(v)); }
	bool has(const std::string &k) const { return f_.count(k) != 0; }
	const std::string &str(const std::string &k) const
	{
		auto it = f_.find(k);
		if (it == f_.end())
			fail("message has no field '" + k + "': " + encode());
		return it->second;
	}
	uint64_t u(const std::string &k) const { return std::stoull(str(k), nullptr, 0); }
	uint64_t u(const std::string &k, uint64_t fallback) const { return has(k) ? u(k) : fallback; }
	std::string encode() const
	{
		std::string out;
		for (auto &[k, v] : f_)
			out += k + "=" + v + "\n";
		return out;
	}
	static Msg decode(const std::string &text)
	{
		Msg m;
		std::istringstream in(text);
		for (std::string line; std::getline(in, line);) {
			auto eq = line.find('=');
			if (eq != std::string::npos)
				m.f_[line.substr(0, eq)] = line.substr(eq + 1);
		}
		return m;
	}

private:
	std::map<std::string, std::string> f_;
};

// One end of the socketpair. recv() waits at most `timeout`; an "error"
// field from the other side becomes an exception here.
class Link {
public:
	explicit Link(int fd = -1) : fd_(fd) {}
	~Link()
	{
		if (fd_ >= 0)
			close(fd_);
	}
	Link(const Link &) = delete;
	Link &operator=(const Link &) = delete;
	Link(Link &&o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
	Link &operator=(Link &&o) noexcept
	{
		if (this != &o) {
			if (fd_ >= 0)
				close(fd_);
			fd_ = o.fd_;
			o.fd_ = -1;
		}
		return *this;
	}

	void send(const Msg &m)
	{
		std::string text = m.encode();
		if (::send(fd_, text.data(), text.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(text.size()))
			fail("send to the other process failed: " + errno_text(errno));
	}
	Msg recv(ms timeout, const std::string &what)
	{
		pollfd p{fd_, POLLIN, 0};
		int n;
		do
			n = poll(&p, 1, static_cast<int>(timeout.count()));
		while (n < 0 && errno == EINTR);
		if (n == 0)
			fail("timed out (" + std::to_string(timeout.count()) + " ms) waiting for " + what);
		std::vector<char> buf(1 << 20);
		ssize_t len = ::recv(fd_, buf.data(), buf.size(), 0);
		if (len <= 0)
			fail("the other process went away while waiting for " + what);
		Msg m = Msg::decode(std::string(buf.data(), static_cast<size_t>(len)));
		if (m.has("error"))
			fail("other process: " + m.str("error"));
		return m;
	}
	int fd() const { return fd_; }

private:
	int fd_;
};

// The test binary re-exec'd as `--child ROLE FD ARGS...`. The child dies
// with the parent (PR_SET_PDEATHSIG) and is killed by the destructor.
class Child {
public:
	Child(const std::string &role, const std::vector<std::string> &args = {})
	{
		int sv[2];
		if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv))
			fail("socketpair: " + errno_text(errno));
		pid_t parent = getpid();
		pid_ = fork();
		if (pid_ < 0)
			fail("fork: " + errno_text(errno));
		if (pid_ == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() != parent)
				_exit(1);
			close(sv[0]);
			fcntl(sv[1], F_SETFD, 0);
			std::vector<std::string> argv_s{"xrc_test", "--child", role, std::to_string(sv[1])};
			argv_s.insert(argv_s.end(), args.begin(), args.end());
			std::vector<char *> argv;
			for (auto &s : argv_s)
				argv.push_back(s.data());
			argv.push_back(nullptr);
			execv("/proc/self/exe", argv.data());
			_exit(127);
		}
		close(sv[1]);
		link_ = Link(sv[0]);
	}
	~Child() { kill(); }
	Child(const Child &) = delete;
	Child &operator=(const Child &) = delete;

	Link &link() { return link_; }
	pid_t pid() const { return pid_; }

	// A command and its reply.
	Msg call(const Msg &m, ms timeout = 10s)
	{
		link_.send(m);
		return link_.recv(timeout, "the reply to '" + m.str("cmd") + "'");
	}

	// SIGKILL and reap.
	void kill()
	{
		if (pid_ <= 0)
			return;
		::kill(pid_, SIGKILL);
		int st;
		while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
		}
		pid_ = -1;
	}
	// Waits for a clean exit; false (and killed) if it does not come in time.
	bool wait_exit(ms timeout, int *status = nullptr)
	{
		auto deadline = std::chrono::steady_clock::now() + timeout;
		while (pid_ > 0) {
			int st;
			pid_t r = waitpid(pid_, &st, WNOHANG);
			if (r == pid_) {
				pid_ = -1;
				if (status)
					*status = st;
				return WIFEXITED(st) && WEXITSTATUS(st) == 0;
			}
			if (std::chrono::steady_clock::now() >= deadline)
				break;
			std::this_thread::sleep_for(10ms);
		}
		kill();
		return false;
	}

private:
	pid_t pid_ = -1;
	Link link_;
};

// --- verbs objects -------------------------------------------------------------

template <auto F>
struct Destroy {
	template <typename T>
	void operator()(T *p) const
	{
		if (p)
			F(p);
	}
};
using CtxPtr = std::unique_ptr<ibv_context, Destroy<ibv_close_device>>;
using PdPtr = std::unique_ptr<ibv_pd, Destroy<ibv_dealloc_pd>>;
using MrPtr = std::unique_ptr<ibv_mr, Destroy<ibv_dereg_mr>>;
using CqPtr = std::unique_ptr<ibv_cq, Destroy<ibv_destroy_cq>>;
using SrqPtr = std::unique_ptr<ibv_srq, Destroy<ibv_destroy_srq>>;
using QpPtr = std::unique_ptr<ibv_qp, Destroy<ibv_destroy_qp>>;
inline int close_xrcd(ibv_xrcd *x) { return ibv_close_xrcd(x); }
using XrcdPtr = std::unique_ptr<ibv_xrcd, Destroy<close_xrcd>>;

inline std::string test_device()
{
	const char *v = getenv("XSRC_TEST_DEVICE");
	return v && *v ? v : "xsrc0";
}

constexpr int kGidIndex = 1;  // the port's first IPv4-mapped RoCE v2 GID

inline CtxPtr open_device(const std::string &name)
{
	int n = 0;
	ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		fail("ibv_get_device_list: " + errno_text(errno));
	ibv_context *ctx = nullptr;
	int err = ENODEV;
	for (int i = 0; i < n; ++i)
		if (name == ibv_get_device_name(list[i])) {
			ctx = ibv_open_device(list[i]);
			err = errno;
			break;
		}
	ibv_free_device_list(list);
	if (!ctx)
		fail("cannot open " + name + ": " + errno_text(err));
	return CtxPtr(ctx);
}

// ibv_open_xrcd with a file (fd -1: a private domain). nullptr with errno set.
inline ibv_xrcd *open_xrcd_raw(ibv_context *ctx, int fd, int oflags)
{
	ibv_xrcd_init_attr a{};
	a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	a.fd = fd;
	a.oflags = oflags;
	return ibv_open_xrcd(ctx, &a);
}

inline XrcdPtr open_xrcd(ibv_context *ctx, int fd, int oflags)
{
	ibv_xrcd *x = open_xrcd_raw(ctx, fd, oflags);
	if (!x)
		fail("ibv_open_xrcd: " + errno_text(errno));
	return XrcdPtr(x);
}

inline PdPtr alloc_pd(ibv_context *ctx)
{
	ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		fail("ibv_alloc_pd: " + errno_text(errno));
	return PdPtr(pd);
}

inline CqPtr create_cq(ibv_context *ctx, int cqe = 256)
{
	ibv_cq *cq = ibv_create_cq(ctx, cqe, nullptr, nullptr, 0);
	if (!cq)
		fail("ibv_create_cq: " + errno_text(errno));
	return CqPtr(cq);
}

inline MrPtr reg_mr(ibv_pd *pd, void *addr, size_t len, int access)
{
	ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);
	if (!mr)
		fail("ibv_reg_mr: " + errno_text(errno));
	return MrPtr(mr);
}

inline SrqPtr create_xrc_srq(ibv_context *ctx, ibv_xrcd *xrcd, ibv_pd *pd, ibv_cq *cq,
			     uint32_t max_wr = 64)
{
	ibv_srq_init_attr_ex a{};
	a.attr.max_wr = max_wr;
	a.attr.max_sge = 1;
	a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
		      IBV_SRQ_INIT_ATTR_PD;
	a.srq_type = IBV_SRQT_XRC;
	a.xrcd = xrcd;
	a.cq = cq;
	a.pd = pd;
	ibv_srq *srq = ibv_create_srq_ex(ctx, &a);
	if (!srq)
		fail("ibv_create_srq_ex(XRC): " + errno_text(errno));
	return SrqPtr(srq);
}

inline uint32_t srq_num(ibv_srq *srq)
{
	uint32_t n = 0;
	if (int err = ibv_get_srq_num(srq, &n))
		fail("ibv_get_srq_num: " + errno_text(err));
	return n;
}

inline void modify(ibv_qp *qp, ibv_qp_attr &a, int mask, const char *what)
{
	if (int err = ibv_modify_qp(qp, &a, mask))
		fail(std::string("ibv_modify_qp(") + what + "): " + errno_text(err));
}

inline void to_init(ibv_qp *qp, unsigned access)
{
	ibv_qp_attr a{};
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = 1;
	a.qp_access_flags = access;
	modify(qp, a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
}

inline ibv_ah_attr loopback_ah(ibv_context *ctx)
{
	ibv_ah_attr ah{};
	ah.is_global = 1;
	ah.port_num = 1;
	ah.grh.sgid_index = kGidIndex;
	ah.grh.hop_limit = 64;
	if (ibv_query_gid(ctx, 1, kGidIndex, &ah.grh.dgid))
		fail("ibv_query_gid: " + errno_text(errno));
	return ah;
}

// The receive side (XRC receive QP) to RTR, talking to send QP `dest`.
inline void recv_to_rtr(ibv_qp *qp, uint32_t dest)
{
	ibv_qp_attr a{};
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 1;  // 10 us: an empty SRQ fails the sender quickly
	a.ah_attr = loopback_ah(qp->context);
	modify(qp, a,
	       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
	       "RTR");
}

// The send side (XRC send QP) to RTR and RTS, talking to receive QP `dest`.
inline void send_to_rts(ibv_qp *qp, uint32_t dest)
{
	ibv_qp_attr a{};
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = 0;
	a.ah_attr = loopback_ah(qp->context);
	modify(qp, a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
	       "RTR");
	a = {};
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 10;  // ~4 ms per try
	a.retry_cnt = 2;
	a.rnr_retry = 2;
	a.sq_psn = 0;
	a.max_rd_atomic = 4;
	modify(qp, a,
	       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
		       IBV_QP_MAX_QP_RD_ATOMIC,
	       "RTS");
}

inline QpPtr create_xrc_recv_qp(ibv_context *ctx, ibv_xrcd *xrcd, unsigned access)
{
	ibv_qp_init_attr_ex a{};
	a.qp_type = IBV_QPT_XRC_RECV;
	a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	a.xrcd = xrcd;
	ibv_qp *qp = ibv_create_qp_ex(ctx, &a);
	if (!qp)
		fail("ibv_create_qp_ex(XRC_RECV): " + errno_text(errno));
	QpPtr owned(qp);
	to_init(qp, access);
	return owned;
}

constexpr unsigned kRemoteAll = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// Polls until `n` completions came or `timeout` passed; returns what came.
inline std::vector<ibv_wc> poll_cq(ibv_cq *cq, size_t n, ms timeout)
{
	std::vector<ibv_wc> out;
	auto deadline = std::chrono::steady_clock::now() + timeout;
	while (out.size() < n) {
		ibv_wc wc[16];
		int got = ibv_poll_cq(cq, static_cast<int>(std::min<size_t>(16, n - out.size())), wc);
		if (got < 0)
			fail("ibv_poll_cq: " + std::to_string(got));
		out.insert(out.end(), wc, wc + got);
		if (got == 0) {
			if (std::chrono::steady_clock::now() >= deadline)
				break;
			std::this_thread::sleep_for(200us);
		}
	}
	return out;
}

// Completions that are there although none should be (after a short settle).
inline size_t stray_completions(ibv_cq *cq, ms settle = 50ms)
{
	return poll_cq(cq, 1024, settle).size();
}

inline void post_srq_recv(ibv_srq *srq, uint64_t wr_id, void *addr, uint32_t len, uint32_t lkey)
{
	ibv_sge sge{reinterpret_cast<uintptr_t>(addr), len, lkey};
	ibv_recv_wr wr{};
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	ibv_recv_wr *bad = nullptr;
	if (int err = ibv_post_srq_recv(srq, &wr, &bad))
		fail("ibv_post_srq_recv: " + errno_text(err));
}

// --- payloads ------------------------------------------------------------------

// A message: seq, the SRQ it was sent to, a magic, then bytes that depend
// on the seq, so that a message in the wrong buffer or order shows.
struct PayloadHeader {
	uint64_t seq;
	uint32_t srqn;
	uint32_t magic;
};
constexpr uint32_t kMagic = 0x58524331;  // "XRC1"

inline void fill_payload(uint8_t *p, size_t len, uint64_t seq, uint32_t srqn)
{
	PayloadHeader h{seq, srqn, kMagic};
	std::memcpy(p, &h, std::min(len, sizeof(h)));
	for (size_t j = sizeof(h); j < len; ++j)
		p[j] = static_cast<uint8_t>(seq * 13 + j);
}

// "" when `p` holds message `seq` for `srqn`, else what is wrong.
inline std::string check_payload(const uint8_t *p, size_t len, uint64_t seq, uint32_t srqn)
{
	PayloadHeader h;
	std::memcpy(&h, p, sizeof(h));
	if (h.magic != kMagic || h.seq != seq || h.srqn != srqn)
		return "header seq=" + std::to_string(h.seq) + " srqn=" + std::to_string(h.srqn) +
		       " magic=" + std::to_string(h.magic) + ", expected seq=" + std::to_string(seq) +
		       " srqn=" + std::to_string(srqn);
	for (size_t j = sizeof(h); j < len; ++j)
		if (p[j] != static_cast<uint8_t>(seq * 13 + j))
			return "byte " + std::to_string(j) + " differs";
	return "";
}

// The pattern of RDMA tests: byte j of a region filled with `seed`.
inline uint8_t pattern(uint64_t seed, size_t j)
{
	return static_cast<uint8_t>(seed * 7 + j * 3 + (j >> 8));
}

inline std::string to_hex(const uint8_t *p, size_t len)
{
	static const char digits[] = "0123456789abcdef";
	std::string s;
	s.reserve(len * 2);
	for (size_t i = 0; i < len; ++i) {
		s += digits[p[i] >> 4];
		s += digits[p[i] & 15];
	}
	return s;
}

inline std::vector<std::string> split(const std::string &s, char sep)
{
	std::vector<std::string> out;
	std::string cur;
	std::istringstream in(s);
	while (std::getline(in, cur, sep))
		if (!cur.empty())
			out.push_back(cur);
	return out;
}

}  // namespace xrc_test
