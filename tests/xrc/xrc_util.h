// Helpers of the XRC tests: a second process to talk to (the test binary
// re-exec'd, spoken to over the harness link (a socketpair) with bounded waits),
// owning wrappers for verbs objects, and the steps that bring XRC QPs up.
#pragma once

#include <infiniband/verbs.h>
#include <fcntl.h>
#include <poll.h>
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

#include "device_test_util.h"
#include "harness/child.h"
#include "harness/completions.h"
#include "harness/qp_connect.h"

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

// --- the other process -------------------------------------------------------

using xsrc::harness::Link;
using xsrc::harness::Msg;

// The test binary re-exec'd as `--child FD ROLE ARGS...` (see harness/child.h).
class Child : public xsrc::harness::Child {
public:
	Child(const std::string &role, std::vector<std::string> args = {})
		: xsrc::harness::Child(spawn("--child", prepend(role, std::move(args))))
	{
	}

	// A command and its reply.
	Msg call(const Msg &m, ms timeout = 10s)
	{
		link().send(m);
		return link().expect(timeout, "the reply to '" + m.str("cmd") + "'");
	}

	// Waits for a clean exit; false (and killed) if it does not come in time.
	bool wait_exit(ms timeout, int *status = nullptr)
	{
		auto st = wait(timeout);
		if (!st) {
			kill();
			return false;
		}
		if (status)
			*status = *st;
		return WIFEXITED(*st) && WEXITSTATUS(*st) == 0;
	}

private:
	static std::vector<std::string> prepend(const std::string &role, std::vector<std::string> args)
	{
		args.insert(args.begin(), role);
		return args;
	}
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

using xsrc_test::test_device;

constexpr int kGidIndex = 1;  // the port's first IPv4-mapped RoCE v2 GID

inline CtxPtr open_device(const std::string &name)
{
	ibv_context *ctx = xsrc_test::open_device(name);
	if (!ctx)
		fail("cannot open " + name + ": " + errno_text(errno));
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

// The XRC tests' connection attributes: loopback on the test device, a short retry budget.
inline xsrc::harness::QpConnectAttrs xrc_attrs(unsigned access = 0)
{
	xsrc::harness::QpConnectAttrs a;
	a.access = access;
	a.sgid_index = kGidIndex;
	a.hop_limit = 64;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 1;  // 10 us: an empty SRQ fails the sender quickly
	a.timeout = 10;       // ~4 ms per try
	a.retry_cnt = 2;
	a.rnr_retry = 2;
	a.max_rd_atomic = 4;
	return a;
}

inline void check_step(xsrc::harness::QpStep s)
{
	if (s)
		fail("ibv_modify_qp(" + std::string(s.step) + "): " + errno_text(s.err));
}

inline void to_init(ibv_qp *qp, unsigned access)
{
	check_step(xsrc::harness::qp_to_init(qp, xrc_attrs(access)));
}

// QP `dest` on this device's own GID.
inline xsrc::harness::QpRemote loopback(ibv_qp *qp, uint32_t dest)
{
	xsrc::harness::QpRemote r{dest, {}};
	if (ibv_query_gid(qp->context, 1, kGidIndex, &r.gid))
		fail("ibv_query_gid: " + errno_text(errno));
	return r;
}

// The receive side (XRC receive QP) to RTR, talking to send QP `dest`.
inline void recv_to_rtr(ibv_qp *qp, uint32_t dest)
{
	check_step(xsrc::harness::qp_to_rtr(qp, loopback(qp, dest), xrc_attrs()));
}

// The send side (XRC send QP) to RTR and RTS, talking to receive QP `dest`.
inline void send_to_rts(ibv_qp *qp, uint32_t dest)
{
	check_step(xsrc::harness::qp_to_rtr(qp, loopback(qp, dest), xrc_attrs()));
	check_step(xsrc::harness::qp_to_rts(qp, xrc_attrs()));
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

constexpr unsigned kRemoteAll = xsrc::harness::kRemoteAccessAll;

using xsrc::harness::poll_completions;

// Completions that are there although none should be (after a short settle).
inline size_t stray_completions(ibv_cq *cq, ms settle = 50ms)
{
	return poll_completions(cq, 1024, settle).size();
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
