// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The device's engine, run by the initiator as a NIC would: validates a send
// WQE, finds the responder's queue in the arena, checks every key against
// the MR table, moves the bytes (one process_vm_* copy, no responder CPU) and
// writes the completions on both sides.
#include "xsrc.h"

#include <endian.h>
#include <sched.h>
#include <signal.h>
#include <sys/uio.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>

namespace {

using xsrc::atomic;

constexpr uint32_t kGrhBytes = 40;

uint32_t qp_state(const xsrc_qp_entry *e)
{
	uint32_t s = atomic(const_cast<xsrc_qp_entry *>(e)->state).load(std::memory_order_acquire);
	return s == XSRC_QP_STATE_FREE ? ~0u : s - 1;  // enum ibv_qp_state
}

void set_qp_error(xsrc_qp_entry *e)
{
	atomic(e->state).store(IBV_QPS_ERR + 1, std::memory_order_release);
}

// The outcome of one attempt at a WQE.
enum class Attempt { done, rnr, unreachable, failed };

struct Result {
	Attempt attempt = Attempt::done;
	ibv_wc_status status = IBV_WC_SUCCESS;
	uint32_t byte_len = 0;
	uint8_t min_rnr_timer = 0;  // the responder's, for an RNR wait
};

Result fail(ibv_wc_status status)
{
	return {Attempt::failed, status, 0, 0};
}

// An MR table entry that `key` names, if it is live.
const xsrc_mr_entry *live_mr(const xsrc::Arena &arena, uint32_t key)
{
	xsrc_mr_entry *mr = arena.mr(key);
	if (!mr || atomic(mr->key).load(std::memory_order_acquire) != key || key == 0)
		return nullptr;
	return mr;
}

// Translates [addr, addr+len) of the MR's address space into the owner's
// virtual addresses, checking the owner, PD, range and access.
bool mr_range(const xsrc_mr_entry *mr, uint32_t owner_pid, uint32_t pd_id, uint64_t addr,
	      uint64_t len, uint32_t access, uint64_t &va)
{
	if (!mr || mr->owner_pid != owner_pid || mr->pd_id != pd_id)
		return false;
	if ((mr->access & access) != access)
		return false;
	if (addr < mr->iova || len > mr->length || addr - mr->iova > mr->length - len)
		return false;
	va = mr->addr + (addr - mr->iova);
	return true;
}

// The local side of a WQE as iovecs in our own memory.
struct LocalBuffers {
	std::array<iovec, XSRC_MAX_RECV_SGE> iov;
	size_t count = 0;
	uint64_t total = 0;
};

bool local_buffers(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe, bool write,
		   LocalBuffers &out)
{
	if (!wqe.inline_data.empty() || (wqe.flags & IBV_SEND_INLINE)) {
		out.iov[0] = {const_cast<unsigned char *>(wqe.inline_data.data()), wqe.inline_data.size()};
		out.count = wqe.inline_data.empty() ? 0 : 1;
		out.total = wqe.inline_data.size();
		return true;
	}
	for (const ibv_sge &sge : wqe.sge) {
		if (sge.length == 0)
			continue;
		uint64_t va;
		uint32_t access = write ? IBV_ACCESS_LOCAL_WRITE : 0;
		if (!mr_range(live_mr(ctx->arena, sge.lkey), ctx->pid, qp->entry->pd_id, sge.addr,
			      sge.length, access, va))
			return false;
		out.iov[out.count++] = {reinterpret_cast<void *>(va), sge.length};
		out.total += sge.length;
	}
	return true;
}

// The responder's receive buffers for `len` bytes, or a status explaining why
// they cannot take them.
ibv_wc_status remote_scatter(const xsrc::Arena &arena, const xsrc::RecvWqe &rwqe, uint32_t owner_pid,
			     uint32_t pd_id, uint64_t len, std::array<iovec, XSRC_MAX_RECV_SGE> &iov,
			     size_t &count)
{
	uint64_t capacity = 0;
	count = 0;
	for (uint32_t i = 0; i < rwqe.num_sge && capacity < len; ++i) {
		const xsrc_sge &sge = rwqe.sge[i];
		if (sge.length == 0)
			continue;
		uint64_t take = std::min<uint64_t>(sge.length, len - capacity);
		uint64_t va;
		if (!mr_range(live_mr(arena, sge.lkey), owner_pid, pd_id, sge.addr, take,
			      IBV_ACCESS_LOCAL_WRITE, va))
			return IBV_WC_LOC_PROT_ERR;
		iov[count++] = {reinterpret_cast<void *>(va), take};
		capacity += take;
	}
	return capacity < len ? IBV_WC_LOC_LEN_ERR : IBV_WC_SUCCESS;
}

// Copies local iovecs into the responder's memory, or from it. Returns 0, or
// ESRCH when the responder's process is gone (its QP is unreachable, not in
// error), EPERM when we may not touch it (another user), or EFAULT.
int write_remote(pid_t pid, const iovec *local, size_t nlocal, const iovec *remote, size_t nremote,
		 uint64_t total)
{
	if (total == 0)
		return 0;
	ssize_t n = process_vm_writev(pid, local, nlocal, remote, nremote, 0);
	if (n < 0 && (errno == ESRCH || errno == EPERM))
		return errno;
	return n >= 0 && static_cast<uint64_t>(n) == total ? 0 : EFAULT;
}

int read_remote(pid_t pid, const iovec *local, size_t nlocal, const iovec *remote, size_t nremote,
		uint64_t total)
{
	if (total == 0)
		return 0;
	ssize_t n = process_vm_readv(pid, local, nlocal, remote, nremote, 0);
	if (n < 0 && (errno == ESRCH || errno == EPERM))
		return errno;
	return n >= 0 && static_cast<uint64_t>(n) == total ? 0 : EFAULT;
}

Result unreachable()
{
	return {Attempt::unreachable, IBV_WC_SUCCESS, 0, 0};
}

// How the bytes reach a peer's memory: ourselves (the fast path: same PID
// namespace and allowed to), through the device (XSRC_CMD_COPY), or not at
// all (an r1 device and a peer we may not touch: the peer is unreachable).
enum class Path { direct, device, none };

Path peer_path(const xsrc_context *ctx, uint32_t pid)
{
	if (ctx->direct && !ctx->denied.contains(pid))
		return Path::direct;
	return ctx->can_copy ? Path::device : Path::none;
}

// A direct attempt was refused (EPERM): remember the peer, go on the slow path.
Path peer_refused(xsrc_context *ctx, uint32_t pid)
{
	ctx->denied.add(pid);
	return ctx->can_copy ? Path::device : Path::none;
}

// What the device answered to one XSRC_CMD_COPY: 0, a status of
// xsrc_copy_resp (EACCES, ESRCH, EFAULT), or EAGAIN when the command itself
// failed (the device was busy or refused): the peer counts as unreachable.
#if XSRC_DRIVER_ABI_REVISION >= 2
constexpr uint32_t kCopyWrite = XSRC_COPY_WRITE, kCopyRead = XSRC_COPY_READ,
		   kCopyFetchAdd = XSRC_COPY_FETCH_ADD, kCopyCmpSwap = XSRC_COPY_CMP_SWAP;
constexpr uint32_t kCopyRkey = XSRC_COPY_RKEY, kCopyLkey = XSRC_COPY_LKEY;
#else
// Never sent (device_copy() refuses): only so that the callers compile.
constexpr uint32_t kCopyWrite = 1, kCopyRead = 2, kCopyFetchAdd = 3, kCopyCmpSwap = 4;
constexpr uint32_t kCopyRkey = 1, kCopyLkey = 2;
#endif

struct CopyRequest {
	uint32_t op = 0;
	uint32_t key_kind = 0;
	uint32_t key = 0;
	uint32_t peer_qpn = 0;
	uint32_t peer_srqn = 0;
	uint64_t peer_addr = 0;
	uint64_t compare_add = 0;
	uint64_t swap = 0;
};

#if XSRC_DRIVER_ABI_REVISION >= 2
int device_copy(xsrc_context *ctx, xsrc_qp *qp, const CopyRequest &r, const iovec *local, size_t nlocal,
		uint64_t length)
{
	// More pieces than the device takes: gather them here first.
	std::vector<unsigned char> gathered;
	iovec one;
	if (nlocal > XSRC_COPY_MAX_IOV) {
		if (r.op != kCopyWrite)
			return EFAULT;
		gathered.resize(length);
		size_t off = 0;
		for (size_t i = 0; i < nlocal; ++i) {
			std::memcpy(gathered.data() + off, local[i].iov_base, local[i].iov_len);
			off += local[i].iov_len;
		}
		one = {gathered.data(), length};
		local = &one;
		nlocal = 1;
	}
	struct {
		ib_uverbs_cmd_hdr hdr;
		xsrc_copy body;
	} cmd{};
	xsrc_copy_resp resp{};
	cmd.hdr.command = XSRC_CMD_COPY;
	cmd.hdr.in_words = sizeof(cmd) / 4;
	cmd.hdr.out_words = sizeof(resp) / 4;
	cmd.body.response = reinterpret_cast<uintptr_t>(&resp);
	cmd.body.op = r.op;
	cmd.body.key_kind = r.key_kind;
	cmd.body.key = r.key;
	cmd.body.qp_handle = qp->vqp.qp.handle;
	cmd.body.peer_qpn = r.peer_qpn;
	cmd.body.peer_srqn = r.peer_srqn;
	cmd.body.peer_addr = r.peer_addr;
	cmd.body.length = length;
	cmd.body.local_iov = reinterpret_cast<uintptr_t>(local);
	cmd.body.num_local = static_cast<uint32_t>(nlocal);
	cmd.body.compare_add = r.compare_add;
	cmd.body.swap = r.swap;
	int saved = errno;
	ssize_t n = write(ctx->ibv_ctx.context.cmd_fd, &cmd, sizeof(cmd));
	errno = saved;
	if (n != static_cast<ssize_t>(sizeof(cmd)))
		return EAGAIN;
	return static_cast<int>(resp.status);
}
#else
int device_copy(xsrc_context *, xsrc_qp *, const CopyRequest &, const iovec *, size_t, uint64_t)
{
	return EAGAIN;  // an r1 build has no such command: the peer is unreachable
}
#endif

// The part of `src` that covers bytes [from, from + len).
size_t iov_slice(const iovec *src, size_t nsrc, uint64_t from, uint64_t len, iovec *out)
{
	size_t n = 0;
	uint64_t pos = 0;
	for (size_t i = 0; i < nsrc; ++i) {
		uint64_t lo = std::max<uint64_t>(pos, from), hi = std::min<uint64_t>(pos + src[i].iov_len, from + len);
		if (lo < hi)
			out[n++] = {static_cast<char *>(src[i].iov_base) + (lo - pos), hi - lo};
		pos += src[i].iov_len;
	}
	return n;
}

// The device-wide lock that makes atomics atomic with respect to each other
// (IBV_ATOMIC_HCA). A holder that died is detected and its lock taken over.
class AtomicLock {
public:
	AtomicLock(const xsrc::Arena &arena, uint32_t pid, uint64_t va, uint32_t me)
		: word_(arena.atomic_lock((uint64_t(pid) << 40) ^ (va >> 3))), me_(me)
	{
		auto lock = atomic(*word_);
		for (unsigned spins = 0;; ++spins) {
			uint32_t holder = 0;
			if (lock.compare_exchange_weak(holder, me_, std::memory_order_acquire))
				return;
			if (spins % 1024 == 1023) {
				if (holder && kill(static_cast<pid_t>(holder), 0) != 0 && errno == ESRCH &&
				    lock.compare_exchange_strong(holder, me_, std::memory_order_acquire))
					return;
				sched_yield();
			}
		}
	}
	~AtomicLock() { atomic(*word_).store(0, std::memory_order_release); }
	AtomicLock(const AtomicLock &) = delete;
	AtomicLock &operator=(const AtomicLock &) = delete;

private:
	uint32_t *word_;
	uint32_t me_;
};

// The responder side of a QP-addressed message: which queue it lands on.
struct Responder {
	xsrc_qp_entry *qp = nullptr;
	xsrc_recv_ring *rq = nullptr;      // the QP's RQ or its SRQ
	xsrc_srq_entry *srq = nullptr;
	uint64_t cq_off = 0;
	uint32_t pd_id = 0;                // of the receive buffers
	uint32_t rkey_pd_id = 0;           // of MRs its rkeys may name
	uint32_t owner_pid = 0;            // whose memory the bytes land in
};

// The SRQ an XRC message names (XRCETH): live, XRC, and of the receive QP's
// domain — otherwise the responder answers "invalid request".
bool use_xrc_srq(xsrc_context *ctx, uint32_t srqn, Responder &r)
{
	r.srq = ctx->arena.srq(srqn);
	if (!r.srq || atomic(r.srq->srqn).load(std::memory_order_acquire) != srqn ||
	    r.srq->srq_type != IBV_SRQT_XRC || r.srq->xrcd_id == 0 || r.srq->xrcd_id != r.qp->xrcd_id)
		return false;
	r.rq = ctx->arena.at<xsrc_recv_ring>(r.srq->ring_off);
	r.cq_off = r.srq->cq_off;
	r.pd_id = r.rkey_pd_id = r.srq->pd_id;
	r.owner_pid = r.srq->owner_pid;
	return r.rq != nullptr;
}

bool reliable(ibv_qp_type type)
{
	return type == IBV_QPT_RC || type == IBV_QPT_XRC_SEND;
}

// The responder QP type a requester of `type` talks to.
uint8_t peer_type(ibv_qp_type type)
{
	return type == IBV_QPT_XRC_SEND ? IBV_QPT_XRC_RECV : type;
}

bool find_responder(xsrc_context *ctx, uint32_t qpn, Responder &r)
{
	r.qp = ctx->arena.qp(qpn);
	if (!r.qp || r.qp->qpn != qpn || atomic(r.qp->state).load(std::memory_order_acquire) == 0)
		return false;
	r.pd_id = r.rkey_pd_id = r.qp->pd_id;
	r.owner_pid = r.qp->owner_pid;
	r.cq_off = r.qp->recv_cq_off;
	if (r.qp->srqn) {
		r.srq = ctx->arena.srq(r.qp->srqn);
		if (!r.srq || atomic(r.srq->srqn).load(std::memory_order_acquire) != r.qp->srqn)
			return false;
		r.rq = ctx->arena.at<xsrc_recv_ring>(r.srq->ring_off);
		r.pd_id = r.srq->pd_id;
	} else {
		r.rq = ctx->arena.at<xsrc_recv_ring>(r.qp->rq_off);
	}
	return true;
}

bool can_receive(uint32_t state)
{
	return state == IBV_QPS_RTR || state == IBV_QPS_RTS || state == IBV_QPS_SQD;
}

xsrc_cqe make_cqe(uint64_t wr_id, ibv_wc_status status, ibv_wc_opcode opcode, uint32_t qpn)
{
	xsrc_cqe c{};
	c.wr_id = wr_id;
	c.status = status;
	c.opcode = opcode;
	c.qp_num = qpn;
	return c;
}

void complete_on(xsrc_context *ctx, uint64_t cq_off, const xsrc_cqe &cqe, xsrc::CqPayload payload = {})
{
	if (auto *ring = ctx->arena.at<xsrc_cq_ring>(cq_off))
		xsrc_cq_complete(ctx, ring, cq_off, cqe, payload);
}

// After a receive WQE was consumed from an SRQ: raise the limit event once.
void check_srq_limit(xsrc_context *ctx, Responder &r)
{
	if (!r.srq)
		return;
	auto limit = atomic(r.rq->srq_limit);
	uint32_t armed = limit.load(std::memory_order_acquire);
	if (armed && xsrc::recv_count(r.rq) < armed &&
	    limit.compare_exchange_strong(armed, 0, std::memory_order_acq_rel))
		xsrc_raise(ctx, XSRC_EVENT_SRQ_LIMIT, r.srq->srqn);
}

// Flushes the receives of a responder QP gone to error (an SRQ's stay
// posted: it is shared).
void flush_responder_receives(xsrc_context *ctx, Responder &r)
{
	xsrc::RecvWqe rest;
	while (!r.srq && r.rq && xsrc::recv_pop(r.rq, rest))
		complete_on(ctx, r.cq_off, make_cqe(rest.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, r.qp->qpn));
}

// The responder found a receive it cannot use: its QP goes to error, the
// receive completes in error, and the rest of its RQ is flushed.
void responder_error(xsrc_context *ctx, Responder &r, const xsrc::RecvWqe &rwqe, ibv_wc_status status)
{
	set_qp_error(r.qp);
	complete_on(ctx, r.cq_off, make_cqe(rwqe.wr_id, status, IBV_WC_RECV, r.qp->qpn));
	flush_responder_receives(ctx, r);
}

// An RC/XRC remote access violation (IBTA class C): the responder NAKs, its
// QP goes to error and its own receives are flushed; the requester gets
// IBV_WC_REM_ACCESS_ERR. (An SRQ's receives stay posted: it is shared.)
Result responder_access_error(xsrc_context *ctx, Responder &r)
{
	if (r.qp->qp_type == IBV_QPT_RC || r.qp->qp_type == IBV_QPT_XRC_RECV) {
		set_qp_error(r.qp);
		flush_responder_receives(ctx, r);
	}
	return fail(IBV_WC_REM_ACCESS_ERR);
}

// The SRQ an XRC message names, for the device's PD check.
uint32_t copy_srqn(const xsrc_qp *qp, const Responder &r)
{
	return qp->type == IBV_QPT_XRC_SEND && r.srq ? r.srq->srqn : 0;
}

// A SEND's payload into the receive buffers of `rwqe`, through the device:
// one XSRC_CMD_COPY per receive buffer, each checked against its lkey.
// Returns 0 or what device_copy() answered.
int deliver_by_device(xsrc_context *ctx, xsrc_qp *qp, const Responder &r, const xsrc::RecvWqe &rwqe,
		      const iovec *src, size_t nsrc, uint64_t len)
{
	uint64_t done = 0;
	for (uint32_t i = 0; i < rwqe.num_sge && done < len; ++i) {
		const xsrc_sge &sge = rwqe.sge[i];
		if (sge.length == 0)
			continue;
		uint64_t take = std::min<uint64_t>(sge.length, len - done);
		std::array<iovec, XSRC_MAX_RECV_SGE + 1> piece;
		size_t n = iov_slice(src, nsrc, done, take, piece.data());
		CopyRequest c;
		c.op = kCopyWrite;
		c.key_kind = kCopyLkey;
		c.key = sge.lkey;
		c.peer_qpn = r.qp->qpn;
		c.peer_srqn = copy_srqn(qp, r);
		c.peer_addr = sge.addr;
		if (int err = device_copy(ctx, qp, c, piece.data(), n, take))
			return err;
		done += take;
	}
	return 0;
}

// SEND / SEND_WITH_IMM / RDMA_WRITE_WITH_IMM on the responder's side: a
// receive is consumed and completed. `write_data` moves the payload once the
// receive buffers (for SEND) are known.
Result deliver(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe, Responder &r,
	       const LocalBuffers &local, bool ud, bool rc)
{
	xsrc::RecvWqe rwqe;
	if (!r.rq || !xsrc::recv_pop(r.rq, rwqe)) {
		if (rc)
			return {Attempt::rnr, IBV_WC_SUCCESS, 0, r.qp->min_rnr_timer};
		return {};  // UC, UD: the message is dropped, the sender never knows
	}
	check_srq_limit(ctx, r);

	bool is_write_imm = wqe.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	uint64_t len = local.total + (ud ? kGrhBytes : 0);
	xsrc_cqe c = make_cqe(rwqe.wr_id, IBV_WC_SUCCESS,
			      is_write_imm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV, r.qp->qpn);
	c.src_qp = qp->qpn;
	c.byte_len = static_cast<uint32_t>(is_write_imm ? local.total : len);
	if (wqe.opcode == IBV_WR_SEND_WITH_IMM || is_write_imm) {
		c.imm_data = wqe.imm_data;
		c.wc_flags |= IBV_WC_WITH_IMM;
	}
	if (wqe.flags & IBV_SEND_SOLICITED)
		c.flags |= XSRC_CQE_SOLICITED;

	if (!is_write_imm) {
		std::array<iovec, XSRC_MAX_RECV_SGE> remote;
		size_t nremote;
		ibv_wc_status st = remote_scatter(ctx->arena, rwqe, r.owner_pid, r.pd_id, len, remote, nremote);
		if (st != IBV_WC_SUCCESS) {
			if (ud) {  // UD has no responder errors towards the sender
				xsrc_cqe e = make_cqe(rwqe.wr_id, st, IBV_WC_RECV, r.qp->qpn);
				complete_on(ctx, r.cq_off, e);
				return {};
			}
			responder_error(ctx, r, rwqe, st);
			return fail(st == IBV_WC_LOC_LEN_ERR ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_OP_ERR);
		}
		std::array<iovec, XSRC_MAX_RECV_SGE + 1> src;
		size_t nsrc = 0;
		ibv_grh grh{};
		if (ud) {
			grh.version_tclass_flow = htobe32(6u << 28);
			grh.paylen = htobe16(static_cast<uint16_t>(local.total + 8));
			grh.next_hdr = 0x11;  // UDP, as RoCE v2 carries it
			grh.hop_limit = 64;
			if (wqe.ah) {
				grh.sgid = wqe.ah->sgid;
				grh.dgid = wqe.ah->attr.grh.dgid;
			}
			src[nsrc++] = {&grh, kGrhBytes};
			c.wc_flags |= IBV_WC_GRH;
		}
		for (size_t i = 0; i < local.count; ++i)
			src[nsrc++] = local.iov[i];
		// Small and into one buffer: the payload rides in the CQ ring and
		// the owner's poll places it — no system call on either side.
		auto *ring = ctx->arena.at<xsrc_cq_ring>(r.cq_off);
		if (!ud && nremote == 1 && len <= (ring ? ring->payload_stride : 0)) {
			c.flags |= XSRC_CQE_DEFERRED;
			c.deferred_va = reinterpret_cast<uint64_t>(remote[0].iov_base);
			complete_on(ctx, r.cq_off, c, {src.data(), nsrc});
			return {Attempt::done, IBV_WC_SUCCESS, static_cast<uint32_t>(local.total), 0};
		}
		int err = 0;
		Path path = peer_path(ctx, r.owner_pid);
		if (path == Path::direct) {
			err = write_remote(r.owner_pid, src.data(), nsrc, remote.data(), nremote, len);
			if (err == EPERM)
				path = peer_refused(ctx, r.owner_pid);
		}
		if (path == Path::device)
			err = deliver_by_device(ctx, qp, r, rwqe, src.data(), nsrc, len);
		else if (path == Path::none)
			err = ESRCH;
		if (err) {
			if (ud)
				return {};
			if (err == ESRCH || err == EAGAIN)
				return unreachable();
			responder_error(ctx, r, rwqe, IBV_WC_LOC_PROT_ERR);
			return fail(IBV_WC_REM_OP_ERR);
		}
	}
	complete_on(ctx, r.cq_off, c);
	return {Attempt::done, IBV_WC_SUCCESS, static_cast<uint32_t>(local.total), 0};
}

// RDMA WRITE / READ / atomics: the responder's memory through an rkey.
Result remote_access(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe, Responder &r)
{
	uint32_t need;
	switch (wqe.opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		need = IBV_ACCESS_REMOTE_WRITE;
		break;
	case IBV_WR_RDMA_READ:
		need = IBV_ACCESS_REMOTE_READ;
		break;
	default:
		need = IBV_ACCESS_REMOTE_ATOMIC;
		break;
	}
	if ((r.qp->access_flags & need) != need)
		return responder_access_error(ctx, r);

	bool is_atomic = need == IBV_ACCESS_REMOTE_ATOMIC;
	bool is_read = need == IBV_ACCESS_REMOTE_READ;
	LocalBuffers local;
	if (!local_buffers(ctx, qp, wqe, is_read || is_atomic, local))
		return fail(IBV_WC_LOC_PROT_ERR);
	if (is_atomic && (local.total != 8 || local.count != 1))
		return fail(IBV_WC_LOC_LEN_ERR);
	if (is_atomic && (wqe.remote_addr & 7))
		return fail(IBV_WC_REM_INV_REQ_ERR);
	if (local.total > XSRC_MAX_MSG_SIZE)
		return fail(IBV_WC_LOC_LEN_ERR);
	// A zero-length RDMA READ or WRITE names no memory: the responder checks neither R_Key
	// nor VA (IBTA C9-88). UCX's rc_verbs flushes with an empty inline write, rkey 0.
	if (local.total == 0 && !is_atomic) {
		if (wqe.opcode != IBV_WR_RDMA_WRITE_WITH_IMM)
			return {Attempt::done, IBV_WC_SUCCESS, 0, 0};
		if (!r.rq || xsrc::recv_count(r.rq) == 0)
			return reliable(qp->type) ? Result{Attempt::rnr, IBV_WC_SUCCESS, 0, r.qp->min_rnr_timer} : Result{};
		return deliver(ctx, qp, wqe, r, local, false, reliable(qp->type));
	}

	uint64_t va;
	if (!mr_range(live_mr(ctx->arena, wqe.rkey), r.owner_pid, r.rkey_pd_id, wqe.remote_addr,
		      local.total, need, va))
		return responder_access_error(ctx, r);
	iovec remote{reinterpret_cast<void *>(va), local.total};
	pid_t peer = static_cast<pid_t>(r.owner_pid);
	Path path = peer_path(ctx, r.owner_pid);
	// The same access through the device, which checks it on its own records.
	CopyRequest copy;
	copy.key_kind = kCopyRkey;
	copy.key = wqe.rkey;
	copy.peer_qpn = r.qp->qpn;
	copy.peer_srqn = copy_srqn(qp, r);
	copy.peer_addr = wqe.remote_addr;
	copy.compare_add = wqe.compare_add;
	copy.swap = wqe.swap;
	auto copy_failed = [&](int err) {
		if (err == ESRCH || err == EAGAIN)
			return unreachable();
		return err == EFAULT ? fail(IBV_WC_LOC_PROT_ERR) : responder_access_error(ctx, r);
	};

	if (is_atomic) {
		uint64_t original;
		iovec orig_iov{&original, 8};
		if (path == Path::direct) {
			AtomicLock lock(ctx->arena, r.owner_pid, va, static_cast<uint32_t>(ctx->pid));
			int err = read_remote(peer, &orig_iov, 1, &remote, 1, 8);
			if (err && err != EPERM)
				return err == ESRCH ? unreachable() : responder_access_error(ctx, r);
			if (!err) {
				uint64_t value = original;
				if (wqe.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
					value = original + wqe.compare_add;
				else if (original == wqe.compare_add)
					value = wqe.swap;
				iovec val_iov{&value, 8};
				if (value != original) {
					if (int werr = write_remote(peer, &val_iov, 1, &remote, 1, 8))
						return werr == ESRCH ? unreachable() : responder_access_error(ctx, r);
				}
				std::memcpy(local.iov[0].iov_base, &original, 8);
				return {Attempt::done, IBV_WC_SUCCESS, 8, 0};
			}
		}
		// Refused (the lock is released by now), or never ours to try.
		if (path == Path::direct)
			path = peer_refused(ctx, r.owner_pid);
		if (path == Path::none)
			return unreachable();
		copy.op = wqe.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ? kCopyFetchAdd : kCopyCmpSwap;
		if (int err = device_copy(ctx, qp, copy, local.iov.data(), 1, 8))
			return copy_failed(err);
		return {Attempt::done, IBV_WC_SUCCESS, 8, 0};
	}
	// The bytes of a READ or WRITE, moved by us or by the device: nothing
	// once they moved, else how the work request ends.
	auto move_bytes = [&](bool read) -> std::optional<Result> {
		if (path == Path::direct) {
			int err = read ? read_remote(peer, local.iov.data(), local.count, &remote, 1, local.total)
				       : write_remote(peer, local.iov.data(), local.count, &remote, 1, local.total);
			if (err == EPERM)
				path = peer_refused(ctx, r.owner_pid);
			else if (err)
				return err == ESRCH ? unreachable() : responder_access_error(ctx, r);
		}
		if (path == Path::none)
			return unreachable();
		if (path == Path::device) {
			copy.op = read ? kCopyRead : kCopyWrite;
			if (int err = device_copy(ctx, qp, copy, local.iov.data(), local.count, local.total))
				return copy_failed(err);
		}
		return std::nullopt;
	};
	if (is_read) {
		if (std::optional<Result> ended = move_bytes(true))
			return *ended;
		return {Attempt::done, IBV_WC_SUCCESS, static_cast<uint32_t>(local.total), 0};
	}
	// RDMA WRITE WITH IMM also consumes a receive: make sure one is there
	// before a byte moves.
	if (wqe.opcode == IBV_WR_RDMA_WRITE_WITH_IMM && (!r.rq || xsrc::recv_count(r.rq) == 0)) {
		if (reliable(qp->type))
			return {Attempt::rnr, IBV_WC_SUCCESS, 0, r.qp->min_rnr_timer};
		return {};
	}
	if (std::optional<Result> ended = move_bytes(false))
		return *ended;
	if (wqe.opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
		return deliver(ctx, qp, wqe, r, local, false, reliable(qp->type));
	return {Attempt::done, IBV_WC_SUCCESS, static_cast<uint32_t>(local.total), 0};
}

Result execute(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe)
{
	bool ud = qp->type == IBV_QPT_UD;
	uint32_t dest = ud ? wqe.remote_qpn : qp->entry->dest_qpn;
	Responder r;
	if (!find_responder(ctx, dest, r) || !can_receive(qp_state(r.qp)) ||
	    r.qp->qp_type != peer_type(qp->type) || (!ud && r.qp->dest_qpn != qp->qpn)) {
		if (!reliable(qp->type))
			return {};  // unacknowledged transports never learn: dropped
		return {Attempt::unreachable, IBV_WC_SUCCESS, 0, 0};
	}
	if (qp->type == IBV_QPT_XRC_SEND && !use_xrc_srq(ctx, wqe.remote_srqn, r))
		return fail(IBV_WC_REM_INV_REQ_ERR);
	// A retry: is anyone still there? A dead owner whose command file lives
	// on (a child holds it) keeps its QP in the table, but nothing answers.
	bool retry = wqe.rnr_retries_left >= 0 || wqe.retries_left >= 0;
	// (Only in our own PID namespace: elsewhere the pid names another
	// process, and the device answers ESRCH for a dead owner instead.)
	if (retry && ctx->direct && kill(static_cast<pid_t>(r.owner_pid), 0) != 0 && errno == ESRCH)
		return unreachable();

	if (wqe.opcode == IBV_WR_SEND || wqe.opcode == IBV_WR_SEND_WITH_IMM) {
		if (ud) {
			uint32_t qkey = (wqe.remote_qkey & 0x80000000u) ? qp->entry->qkey : wqe.remote_qkey;
			if (qkey != r.qp->qkey)
				return {};  // Q_Key violation: silently dropped
		}
		LocalBuffers local;
		if (!local_buffers(ctx, qp, wqe, false, local))
			return fail(IBV_WC_LOC_PROT_ERR);
		if (ud && local.total > ctx->port_mtu_bytes)
			return fail(IBV_WC_LOC_LEN_ERR);
		if (local.total > XSRC_MAX_MSG_SIZE)
			return fail(IBV_WC_LOC_LEN_ERR);
		return deliver(ctx, qp, wqe, r, local, ud, reliable(qp->type));
	}
	return remote_access(ctx, qp, wqe, r);
}

ibv_wc_opcode wc_opcode(ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return IBV_WC_RDMA_WRITE;
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		return IBV_WC_COMP_SWAP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return IBV_WC_FETCH_ADD;
	default:
		return IBV_WC_SEND;
	}
}

void complete_send(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe, ibv_wc_status status,
		   uint32_t byte_len)
{
	bool signaled = qp->sq_sig_all || (wqe.flags & IBV_SEND_SIGNALED);
	if (status == IBV_WC_SUCCESS && !signaled)
		return;
	xsrc_cqe c = make_cqe(wqe.wr_id, status, wc_opcode(wqe.opcode), qp->qpn);
	c.byte_len = byte_len;
	xsrc_cq_complete(ctx, qp->send_cq->ring, 0, c);
}

// IBTA RNR timer encoding (0 = 655.36 ms), in nanoseconds.
uint64_t rnr_delay_ns(uint8_t code)
{
	static constexpr uint32_t us[32] = {655360, 10,   20,   30,   40,   60,    80,    120,
					    160,    240,  320,  480,  640,  960,  1280,  1920,
					    2560,   3840, 5120, 7680, 10240, 15360, 20480, 30720,
					    40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};
	return uint64_t(us[code & 31]) * 1000;
}

// Local ACK timeout: 4.096 us * 2^timeout; 0 means "wait forever" in the
// spec, which for an unreachable peer we cap at a second per try.
uint64_t ack_timeout_ns(uint8_t timeout)
{
	if (timeout == 0 || timeout > 20)
		return 1000000000ull;
	return 4096ull << timeout;
}

// Acts on the outcome of an attempt at the head WQE: completes it, or
// arms its retry. True when it finished (done or failed).
bool settle_head(xsrc_context *ctx, xsrc_qp *qp, Result res, uint64_t now)
{
	xsrc_send_wqe &wqe = qp->sq.front();
	switch (res.attempt) {
	case Attempt::done:
		complete_send(ctx, qp, wqe, IBV_WC_SUCCESS, res.byte_len);
		qp->sq.pop_front();
		return true;
	case Attempt::failed:
		complete_send(ctx, qp, wqe, res.status, 0);
		qp->sq.pop_front();
		set_qp_error(qp->entry);
		xsrc_qp_flush(qp);
		return true;
	case Attempt::rnr:
		if (wqe.rnr_retries_left < 0)
			wqe.rnr_retries_left = qp->entry->rnr_retry;
		if (wqe.rnr_retries_left != 7 && wqe.rnr_retries_left-- == 0) {
			res.status = IBV_WC_RNR_RETRY_EXC_ERR;
			break;
		}
		qp->retry_at_ns = now + rnr_delay_ns(res.min_rnr_timer);
		return false;
	case Attempt::unreachable:
		if (wqe.retries_left < 0)
			wqe.retries_left = qp->entry->retry_cnt;
		if (wqe.retries_left-- == 0) {
			res.status = IBV_WC_RETRY_EXC_ERR;
			break;
		}
		qp->retry_at_ns = now + ack_timeout_ns(qp->entry->timeout);
		return false;
	}
	// Retries ran out.
	complete_send(ctx, qp, wqe, res.status, 0);
	qp->sq.pop_front();
	set_qp_error(qp->entry);
	xsrc_qp_flush(qp);
	return true;
}

// Tries the head WQE. True when it finished (done or failed).
bool attempt_head(xsrc_context *ctx, xsrc_qp *qp, uint64_t now)
{
	return settle_head(ctx, qp, execute(ctx, qp, qp->sq.front()), now);
}

}  // namespace

uint64_t xsrc_now_ns()
{
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

void xsrc_raise(xsrc_context *ctx, uint32_t kind, uint64_t object)
{
	struct {
		ib_uverbs_cmd_hdr hdr;
		xsrc_raise_event body;
	} cmd{};
	cmd.hdr.command = XSRC_CMD_RAISE_EVENT;
	cmd.hdr.in_words = sizeof(cmd) / 4;
	cmd.body.kind = kind;
	cmd.body.object = object;
	int saved = errno;
	if (write(ctx->ibv_ctx.context.cmd_fd, &cmd, sizeof(cmd)) < 0) {
		// The daemon is gone or refused: nothing more a data path can do.
	}
	errno = saved;
}

void xsrc_cq_complete(xsrc_context *ctx, xsrc_cq_ring *ring, uint64_t ring_off, const xsrc_cqe &cqe,
		      xsrc::CqPayload payload)
{
	if (!ring_off)
		ring_off = static_cast<uint64_t>(reinterpret_cast<unsigned char *>(ring) - ctx->arena.base);
	if (!xsrc::cq_push(ring, cqe, payload)) {
		if (atomic(ring->overflow).exchange(1, std::memory_order_acq_rel) == 0)
			xsrc_raise(ctx, XSRC_EVENT_CQ_ERR, ring_off);
		return;
	}
	// Pairs with the seq_cst store in req_notify_cq: either we see the arm,
	// or the application's poll after arming sees this completion.
	std::atomic_thread_fence(std::memory_order_seq_cst);
	auto armed = atomic(ring->armed);
	uint32_t mode = armed.load(std::memory_order_acquire);
	if (mode == XSRC_CQ_ARMED_NONE)
		return;
	bool wanted = mode == XSRC_CQ_ARMED_NEXT || (cqe.flags & XSRC_CQE_SOLICITED) ||
		      cqe.status != IBV_WC_SUCCESS;
	if (wanted && armed.compare_exchange_strong(mode, XSRC_CQ_ARMED_NONE, std::memory_order_acq_rel))
		xsrc_raise(ctx, XSRC_EVENT_CQ_COMPLETION, ring_off);
}

void xsrc_sq_post(xsrc_qp *qp, xsrc_send_wqe &&wqe)
{
	auto *ctx = to_xsrc_ctx(qp->vqp.qp.context);
	if (qp_state(qp->entry) == IBV_QPS_ERR) {
		complete_send(ctx, qp, wqe, IBV_WC_WR_FLUSH_ERR, 0);
		return;
	}
	if (!qp->sq.empty()) {
		qp->sq.push_back(std::move(wqe));  // blocked work ahead of it keeps the order
		return;
	}
	// The fast path: nothing queued, try it now without queueing it.
	Result res = execute(ctx, qp, wqe);
	if (res.attempt == Attempt::done) {
		complete_send(ctx, qp, wqe, IBV_WC_SUCCESS, res.byte_len);
		return;
	}
	qp->sq.push_back(std::move(wqe));
	if (!settle_head(ctx, qp, res, xsrc_now_ns()))
		xsrc_progress_schedule(ctx, qp, qp->retry_at_ns);
	else if (uint64_t next = xsrc_sq_progress(qp))
		xsrc_progress_schedule(ctx, qp, next);
}

uint64_t xsrc_sq_progress(xsrc_qp *qp)
{
	auto *ctx = to_xsrc_ctx(qp->vqp.qp.context);
	uint64_t now = 0;
	while (!qp->sq.empty()) {
		if (qp_state(qp->entry) == IBV_QPS_ERR) {
			xsrc_qp_flush(qp);
			return 0;
		}
		if (qp->retry_at_ns) {
			now = now ? now : xsrc_now_ns();
			if (now < qp->retry_at_ns)
				return qp->retry_at_ns;
			qp->retry_at_ns = 0;
		}
		if (!attempt_head(ctx, qp, now ? now : xsrc_now_ns()))
			return qp->retry_at_ns;
	}
	return 0;
}

void xsrc_qp_flush(xsrc_qp *qp)
{
	auto *ctx = to_xsrc_ctx(qp->vqp.qp.context);
	while (!qp->sq.empty()) {
		complete_send(ctx, qp, qp->sq.front(), IBV_WC_WR_FLUSH_ERR, 0);
		qp->sq.pop_front();
	}
	qp->retry_at_ns = 0;
	if (qp->rq && qp->recv_cq) {
		xsrc::RecvWqe rwqe;
		while (xsrc::recv_pop(qp->rq, rwqe))
			xsrc_cq_complete(ctx, qp->recv_cq->ring, 0,
					 make_cqe(rwqe.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, qp->qpn));
	}
}
