// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The shared-memory engine (xsrc_shm_transport), run by the initiator as a
// NIC would: finds the responder's queue in the arena, checks every key
// against the MR table, moves the bytes (peer_memory.cpp: one process_vm_*
// copy, no responder CPU) and writes the responder's completions. The
// responder's side of the protocol — receive consumed, RNR, NAKs and the
// errors they put its QP in — is modelled here.
#include "xsrc.h"

#include <endian.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>

#include "common/iov.h"
#include "peer_memory.h"
#include "tm.h"

namespace {

using xsrc::atomic;
using Result = xsrc_attempt_result;

constexpr uint32_t kGrhBytes = 40;
// The GRH a UD receive carries: IPv6 version, UDP (as RoCE v2 carries it).
constexpr uint32_t kGrhIpVersion6 = 6u << 28;
constexpr uint8_t kGrhNextHdrUdp = 0x11;
constexpr uint8_t kGrhHopLimit = 64;
constexpr uint32_t kUdpHeaderBytes = 8;
// A Q_Key with the high bit set means "use the QP's own" (IBTA 10.2.5).
constexpr uint32_t kQkeyUseQps = 0x80000000u;
// Atomics operate on one aligned 64-bit word.
constexpr uint64_t kAtomicBytes = 8;

// The responder side of a QP-addressed message: which queue it lands on.
struct Responder {
	xsrc_qp_entry *qp = nullptr;
	xsrc_recv_ring *rq = nullptr;      // the QP's RQ or its SRQ
	xsrc::RecvShape rq_shape;          // its shape, read once (its header is anyone's to write)
	xsrc_srq_entry *srq = nullptr;
	uint64_t cq_off = 0;
	xsrc::PdId pd_id;                  // of the receive buffers
	xsrc::PdId rkey_pd_id;             // of MRs its rkeys may name
	uint32_t owner_pid = 0;            // whose memory the bytes land in

	xsrc::Qpn qpn() const { return xsrc::Qpn(qp->qpn); }
};

// The receive ring at `off` for `r`, with its shape read once: none when
// that shape does not fit the arena.
void responder_use_ring(xsrc_context *ctx, uint64_t off, Responder &r)
{
	r.rq = xsrc_recv_ring_at(ctx->arena, off, r.rq_shape);
}

// The SRQ an XRC message names (XRCETH): live, XRC, and of the receive QP's
// domain — otherwise the responder answers "invalid request".
bool responder_use_xrc_srq(xsrc_context *ctx, xsrc::Srqn srqn, Responder &r)
{
	r.srq = ctx->arena.srq(srqn);
	if (!r.srq || atomic(r.srq->srqn).load(std::memory_order_acquire) != srqn.value() ||
	    r.srq->srq_type != IBV_SRQT_XRC || r.srq->xrcd_id == 0 || r.srq->xrcd_id != r.qp->xrcd_id)
		return false;
	responder_use_ring(ctx, r.srq->ring_off, r);
	r.cq_off = r.srq->cq_off;
	r.pd_id = r.rkey_pd_id = xsrc::PdId(r.srq->pd_id);
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

bool responder_find(xsrc_context *ctx, xsrc::Qpn qpn, Responder &r)
{
	r.qp = ctx->arena.qp(qpn);
	if (!r.qp || r.qp->qpn != qpn.value() || xsrc::qp_state_load(*r.qp) == IBV_QPS_UNKNOWN)
		return false;
	r.pd_id = r.rkey_pd_id = xsrc::PdId(r.qp->pd_id);
	r.owner_pid = r.qp->owner_pid;
	r.cq_off = r.qp->recv_cq_off;
	if (r.qp->srqn) {
		r.srq = ctx->arena.srq(xsrc::Srqn(r.qp->srqn));
		if (!r.srq || atomic(r.srq->srqn).load(std::memory_order_acquire) != r.qp->srqn)
			return false;
		responder_use_ring(ctx, r.srq->ring_off, r);
		r.pd_id = xsrc::PdId(r.srq->pd_id);
	} else {
		responder_use_ring(ctx, r.qp->rq_off, r);
	}
	return true;
}

bool can_receive(ibv_qp_state state)
{
	return state == IBV_QPS_RTR || state == IBV_QPS_RTS || state == IBV_QPS_SQD;
}

void responder_complete(xsrc_context *ctx, const Responder &r, const xsrc_cqe &cqe,
			xsrc::CqPayload payload = {})
{
	if (auto *ring = ctx->arena.at<xsrc_cq_ring>(r.cq_off))
		xsrc_cq_complete(ctx, ring, r.cq_off, cqe, payload);
}

// After a receive WQE was consumed from an SRQ: raise the limit event once.
void responder_check_srq_limit(xsrc_context *ctx, Responder &r)
{
	if (!r.srq)
		return;
	auto limit = atomic(r.rq->srq_limit);
	uint32_t armed = limit.load(std::memory_order_acquire);
	if (armed && xsrc::recv_count(r.rq) < armed &&
	    limit.compare_exchange_strong(armed, 0, std::memory_order_acq_rel))
		xsrc_context_raise_event(ctx, XSRC_EVENT_SRQ_LIMIT, r.srq->srqn);
}

// Flushes the receives of a responder QP gone to error (an SRQ's stay
// posted: it is shared).
void responder_flush_receives(xsrc_context *ctx, Responder &r)
{
	xsrc::RecvWqe rest;
	while (!r.srq && r.rq && xsrc::recv_pop(r.rq, r.rq_shape, rest))
		responder_complete(ctx, r, xsrc_make_cqe(rest.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, r.qpn()));
}

// A responder that NAKs moves its QP to error: true. False when the QP no
// longer receives by then — destroyed (its slot is free, perhaps reused), or
// in error already (its owner died, or moved it there): such a QP answers
// nothing, and its state is not ours to write. The requester retries, then
// completes with IBV_WC_RETRY_EXC_ERR, as on an HCA.
bool responder_enter_error(Responder &r)
{
	auto state = atomic(r.qp->state);
	uint32_t seen = state.load(std::memory_order_acquire);
	while (can_receive(xsrc_qp_state_decode(seen)))
		if (state.compare_exchange_weak(seen, xsrc_qp_state_encode(IBV_QPS_ERR), std::memory_order_acq_rel))
			return true;
	return false;
}

// The responder found a receive it cannot use: its QP goes to error, the
// receive completes in error, and the rest of its RQ is flushed. False when
// the QP no longer receives (responder_enter_error): the receive we took is
// flushed if the QP is in error (nothing else would complete it), and the
// requester hears nothing.
bool responder_error(xsrc_context *ctx, Responder &r, const xsrc::RecvWqe &rwqe, ibv_wc_status status)
{
	if (!responder_enter_error(r)) {
		if (xsrc::qp_state_load(*r.qp) == IBV_QPS_ERR)
			responder_complete(ctx, r, xsrc_make_cqe(rwqe.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, r.qpn()));
		return false;
	}
	responder_complete(ctx, r, xsrc_make_cqe(rwqe.wr_id, status, IBV_WC_RECV, r.qpn()));
	responder_flush_receives(ctx, r);
	return true;
}

// An RC/XRC remote access violation (IBTA class C): the responder NAKs, its
// QP goes to error and its own receives are flushed; the requester gets
// IBV_WC_REM_ACCESS_ERR. (An SRQ's receives stay posted: it is shared.)
Result responder_access_error(xsrc_context *ctx, Responder &r)
{
	if (r.qp->qp_type == IBV_QPT_RC || r.qp->qp_type == IBV_QPT_XRC_RECV) {
		if (!responder_enter_error(r))
			return Result::unreachable();
		responder_flush_receives(ctx, r);
	}
	return Result::failed(IBV_WC_REM_ACCESS_ERR);
}

// A receive must be there for the message: RNR on a reliable QP, else
// dropped. A UD datagram for a queue its owner has posted receives to is
// held a moment first (requester.cpp): a sender that merely outruns a
// receiver that reposts loses nothing then. The requester watches the queue.
Result responder_no_receive(const xsrc_qp *qp, const Responder &r)
{
	if (reliable(qp->type))
		return Result::rnr(r.qp->min_rnr_timer, r.rq);
	if (qp->type == IBV_QPT_UD && r.rq && atomic(r.rq->tail).load(std::memory_order_relaxed) != 0)
		return Result::rnr(0, r.rq);
	return Result::dropped();
}

bool responder_has_receive(const Responder &r)
{
	return r.rq && xsrc::recv_count(r.rq) != 0;
}

// A copy through the device addressed to this responder.
xsrc_peer_copy responder_copy(const xsrc_qp *qp, const Responder &r)
{
	xsrc_peer_copy c;
	c.peer_qpn = r.qpn();
	// The SRQ an XRC message names, for the device's PD check.
	if (qp->type == IBV_QPT_XRC_SEND && r.srq)
		c.peer_srqn = xsrc::Srqn(r.srq->srqn);
	return c;
}

// A SEND's payload into the receive buffers of `rwqe`, through the device:
// one XSRC_CMD_COPY per receive buffer, each checked against its lkey.
// Returns 0 or what xsrc_peer_device_copy() answered.
int responder_deliver_by_device(xsrc_context *ctx, xsrc_qp *qp, const Responder &r, const xsrc::RecvWqe &rwqe,
				const iovec *src, size_t nsrc, uint64_t len)
{
	uint64_t done = 0;
	for (uint32_t i = 0; i < rwqe.num_sge && done < len; ++i) {
		const xsrc_sge &sge = rwqe.sge[i];
		if (sge.length == 0)
			continue;
		uint64_t take = std::min<uint64_t>(sge.length, len - done);
		std::array<iovec, XSRC_MAX_RECV_SGE + 1> piece;
		size_t n = xsrc::iov_slice({src, nsrc}, done, take, piece.data());
		xsrc_peer_copy c = responder_copy(qp, r);
		c.what = xsrc_peer_copy::op::write;
		c.kind = xsrc_peer_copy::key_kind::lkey;
		c.key = sge.lkey;
		c.peer_addr = sge.addr;
		if (rwqe.from_ring)
			c.recv_pos = rwqe.pos;
		if (int err = xsrc_peer_device_copy(ctx, qp, c, piece.data(), n, take))
			return err;
		done += take;
	}
	return 0;
}

// The GRH a UD receive gets in front of the payload.
ibv_grh responder_ud_grh(const xsrc_send_wqe &wqe, uint64_t payload_len)
{
	ibv_grh grh{};
	grh.version_tclass_flow = htobe32(kGrhIpVersion6);
	grh.paylen = htobe16(static_cast<uint16_t>(payload_len + kUdpHeaderBytes));
	grh.next_hdr = kGrhNextHdrUdp;
	grh.hop_limit = kGrhHopLimit;
	if (wqe.ah) {
		grh.sgid = wqe.ah->sgid;
		grh.dgid = wqe.ah->attr.grh.dgid;
	}
	return grh;
}

// A payload for one receive buffer `to` that fits a payload slot of the
// responder's CQ ring: copied there with its completion `c`, which the
// owner's poll places. False (nothing done) when it fits none, or every big
// slot is taken: the caller moves it.
// The ring's shape is read once, and all of it placed by that copy.
bool responder_defer(xsrc_context *ctx, const Responder &r, xsrc_cqe &c, const iovec &to, xsrc::CqPayload payload)
{
	xsrc::CqShape shape;
	xsrc_cq_ring *ring = xsrc_cq_ring_at(ctx->arena, r.cq_off, shape);
	if (!ring)
		return false;
	if (to.iov_len <= shape.payload_stride) {
		c.flags |= XSRC_CQE_DEFERRED;
		c.deferred_va = reinterpret_cast<uint64_t>(to.iov_base);
		xsrc_cq_complete(ctx, ring, shape, r.cq_off, c, payload);
		return true;
	}
#if XSRC_DRIVER_ABI_REVISION >= 5
	// Big slots only for an owner that places them (older providers don't).
	if (!xsrc::load_acquire(ring->big_polled) || !xsrc::cq_big_pool_sane(shape, ctx->arena.size - r.cq_off) || to.iov_len > shape.big_stride)
		return false;
	int slot = xsrc::cq_big_claim(ring, shape, r.qp->qpn);
	if (slot < 0)
		return false;
	c.flags |= XSRC_CQE_DEFERRED_BIG;
	c.deferred_va = reinterpret_cast<uint64_t>(to.iov_base);
	c.big_slot = static_cast<uint8_t>(slot);
	xsrc_cq_complete(ctx, ring, shape, r.cq_off, c, payload);  // the payload goes to the big slot
	return true;
#else
	return false;
#endif
}

// Moves `len` bytes of `src` into the responder's buffers `remote` (those
// of receive `rwqe`, already checked): ourselves, or through the device.
// Returns 0 or an errno (ESRCH, EAGAIN: the responder is unreachable).
int responder_write(xsrc_context *ctx, xsrc_qp *qp, const Responder &r, const xsrc::RecvWqe &rwqe, const iovec *src,
		    size_t nsrc, const iovec *remote, size_t nremote, uint64_t len)
{
	int err = 0;
	xsrc_peer_path path = xsrc_peer_path_to(ctx, r.owner_pid);
	if (path == xsrc_peer_path::direct) {
		err = xsrc_peer_write(static_cast<pid_t>(r.owner_pid), src, nsrc, remote, nremote, len);
		if (err == EPERM)
			path = xsrc_peer_refused(ctx, r.owner_pid);
	}
	if (path == xsrc_peer_path::device)
		err = responder_deliver_by_device(ctx, qp, r, rwqe, src, nsrc, len);
	else if (path == xsrc_peer_path::none)
		err = ESRCH;
	return err;
}

Result responder_deliver_to(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe, Responder &r,
			    const xsrc_local_buffers &local, bool ud, const xsrc::RecvWqe &rwqe,
			    ibv_wc_opcode recv_opcode);

// SEND / SEND_WITH_IMM / RDMA_WRITE_WITH_IMM on the responder's side: a
// receive is consumed and completed; for a SEND the payload moves into its
// buffers. `recv_opcode`: the completion's opcode for a SEND (a TM-SRQ
// reports its untagged and unexpected messages with its own).
Result responder_deliver(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe, Responder &r,
			 const xsrc_local_buffers &local, bool ud, ibv_wc_opcode recv_opcode = IBV_WC_RECV)
{
	xsrc::RecvWqe rwqe;
	if (!r.rq || !xsrc::recv_pop(r.rq, r.rq_shape, rwqe))
		return responder_no_receive(qp, r);
	if (qp->recv_cq)
		xsrc_cq_note_reply_path(qp->recv_cq, qp->qpn, r.rq, rwqe.pos);
	responder_check_srq_limit(ctx, r);
	return responder_deliver_to(ctx, qp, wqe, r, local, ud, rwqe, recv_opcode);
}

// The same into receive `rwqe`, already consumed.
Result responder_deliver_to(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe, Responder &r,
			    const xsrc_local_buffers &local, bool ud, const xsrc::RecvWqe &rwqe,
			    ibv_wc_opcode recv_opcode)
{
	// SEND_WITH_INV: the responder invalidates the rkey (the device checks
	// the window is bound to this QP); refused, it is an invalid request.
	if (wqe.opcode == IBV_WR_SEND_WITH_INV && !xsrc_mw_remote_invalidate(ctx, qp, r.qpn(), wqe.invalidate_rkey)) {
		if (!responder_error(ctx, r, rwqe, IBV_WC_REM_INV_REQ_ERR))
			return Result::unreachable();
		return Result::failed(IBV_WC_REM_INV_REQ_ERR);
	}

	bool is_write_imm = wqe.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	uint64_t len = local.total + (ud ? kGrhBytes : 0);
	xsrc_cqe c = xsrc_make_cqe(rwqe.wr_id, IBV_WC_SUCCESS, is_write_imm ? IBV_WC_RECV_RDMA_WITH_IMM : recv_opcode,
				   r.qpn());
	c.src_qp = qp->qpn.value();
	c.byte_len = static_cast<uint32_t>(is_write_imm ? local.total : len);
	if (wqe.opcode == IBV_WR_SEND_WITH_IMM || is_write_imm) {
		c.imm_data = wqe.imm_data;
		c.wc_flags |= IBV_WC_WITH_IMM;
	} else if (wqe.opcode == IBV_WR_SEND_WITH_INV) {
		c.imm_data = wqe.invalidate_rkey;  // ibv_wc::invalidated_rkey
		c.wc_flags |= IBV_WC_WITH_INV;
	}
	if (wqe.flags & IBV_SEND_SOLICITED)
		c.flags |= XSRC_CQE_SOLICITED;

	if (!is_write_imm) {
		std::array<iovec, XSRC_MAX_RECV_SGE> remote;
		size_t nremote;
		bool on_demand;
		ibv_wc_status st =
			xsrc_peer_recv_buffers(ctx->arena, rwqe, r.owner_pid, r.pd_id, len, remote, nremote, on_demand);
		if (st != IBV_WC_SUCCESS) {
			if (ud) {  // UD has no responder errors towards the sender
				responder_complete(ctx, r, xsrc_make_cqe(rwqe.wr_id, st, IBV_WC_RECV, r.qpn()));
				return Result::dropped();
			}
			if (!responder_error(ctx, r, rwqe, st))
				return Result::unreachable();
			return Result::failed(st == IBV_WC_LOC_LEN_ERR ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_OP_ERR);
		}
		std::array<iovec, XSRC_MAX_RECV_SGE + 1> src;
		size_t nsrc = 0;
		ibv_grh grh{};
		if (ud) {
			grh = responder_ud_grh(wqe, local.total);
			src[nsrc++] = {&grh, kGrhBytes};
			c.wc_flags |= IBV_WC_GRH;
		}
		for (size_t i = 0; i < local.count; ++i)
			src[nsrc++] = local.iov[i];
		// Into one buffer and small enough: the payload rides in the CQ
		// ring and the owner's poll places it — no system call on either side.
		if (!on_demand && nremote == 1 && responder_defer(ctx, r, c, remote[0], {src.data(), nsrc}))
			return Result::done(local.total);
		int err = responder_write(ctx, qp, r, rwqe, src.data(), nsrc, remote.data(), nremote, len);
		if (err) {
			if (ud)
				return Result::dropped();
			if (err == ESRCH || err == EAGAIN)
				return Result::unreachable();
			if (!responder_error(ctx, r, rwqe, IBV_WC_LOC_PROT_ERR))
				return Result::unreachable();
			return Result::failed(IBV_WC_REM_OP_ERR);
		}
	}
	responder_complete(ctx, r, c);
	return Result::done(local.total);
}

// --- tag matching (driver ABI r7) -------------------------------------------

constexpr uint64_t kTmhBytes = sizeof(ibv_tmh);
constexpr uint64_t kRvhBytes = sizeof(ibv_rvh);

// The first `n` bytes of our own payload.
void local_gather(const xsrc_local_buffers &local, void *to, uint64_t n)
{
	auto *out = static_cast<unsigned char *>(to);
	for (size_t i = 0; i < local.count && n; ++i) {
		uint64_t take = std::min<uint64_t>(local.iov[i].iov_len, n);
		std::memcpy(out, local.iov[i].iov_base, take);
		out += take;
		n -= take;
	}
}

uint64_t recv_capacity(const xsrc::RecvWqe &rwqe)
{
	uint64_t bytes = 0;
	for (uint32_t i = 0; i < rwqe.num_sge; ++i)
		bytes += rwqe.sge[i].length;
	return bytes;
}

// A tagged buffer that cannot take what the message brings: the tag is
// gone, its completion carries the error, and the responder QP goes to
// error as for any receive that failed (the SRQ and its tags stay).
Result responder_tm_error(xsrc_context *ctx, Responder &r, const xsrc::RecvWqe &tagged, ibv_wc_status st)
{
	bool answered = responder_enter_error(r);
	// The tag is spent either way: its buffer cannot take the message.
	responder_complete(ctx, r, xsrc_make_cqe(tagged.wr_id, st, IBV_WC_TM_RECV, r.qpn()));
	if (!answered)
		return Result::unreachable();
	bool invalid_request = st == IBV_WC_LOC_LEN_ERR || st == IBV_WC_REM_INV_REQ_ERR;
	return Result::failed(invalid_request ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_OP_ERR);
}

// Bytes [from, from + len) of our payload `src` into the tagged buffer: 0,
// or the status the tagged completion gets; `unreachable` when the
// responder went away.
ibv_wc_status responder_tm_place(xsrc_context *ctx, xsrc_qp *qp, const Responder &r, const xsrc::RecvWqe &tagged,
				 const iovec *src, size_t nsrc, uint64_t from, uint64_t len, bool &unreachable)
{
	std::array<iovec, XSRC_MAX_RECV_SGE> remote;
	size_t nremote;
	bool on_demand;
	ibv_wc_status st =
		xsrc_peer_recv_buffers(ctx->arena, tagged, r.owner_pid, r.pd_id, len, remote, nremote, on_demand);
	if (st != IBV_WC_SUCCESS || len == 0)
		return st;
	std::array<iovec, XSRC_MAX_RECV_SGE + 1> piece;
	size_t n = xsrc::iov_slice({src, nsrc}, from, len, piece.data());
	int err = responder_write(ctx, qp, r, tagged, piece.data(), n, remote.data(), nremote, len);
	unreachable = err == ESRCH || err == EAGAIN;
	return err ? IBV_WC_LOC_PROT_ERR : IBV_WC_SUCCESS;
}

// The RDMA READ a matched rendezvous makes: the responder's QP reads what
// the RVH names from us, its requester, into the tagged buffer. Our QP is
// the read's responder: it must allow REMOTE_READ and the rkey must be
// one of our MRs (or windows) in its PD. Returns the tagged completion's
// status.
ibv_wc_status responder_tm_rndv_read(xsrc_context *ctx, xsrc_qp *qp, const Responder &r,
				     const xsrc::RecvWqe &tagged, const ibv_rvh &rvh, bool &unreachable)
{
	uint64_t addr = be64toh(rvh.va);
	uint32_t len = be32toh(rvh.len);
	if (len == 0)
		return IBV_WC_SUCCESS;
	if (!(qp->entry->access_flags & IBV_ACCESS_REMOTE_READ))
		return IBV_WC_REM_ACCESS_ERR;
	xsrc::Rkey rkey(be32toh(rvh.rkey));
	const xsrc_mr_entry *key = xsrc_peer_live_mr(ctx->arena, rkey);
	uint64_t va;
	if (!xsrc_peer_mr_range(key, static_cast<uint32_t>(ctx->pid), xsrc::PdId(qp->entry->pd_id), addr, len,
				IBV_ACCESS_REMOTE_READ, va) ||
	    (key->bound_qpn && key->bound_qpn != qp->qpn.value()))
		return IBV_WC_REM_ACCESS_ERR;
	if ((key->access & IBV_ACCESS_ON_DEMAND) && !xsrc_odp_mapped(va, len))
		return IBV_WC_REM_ACCESS_ERR;
	iovec src{reinterpret_cast<void *>(va), len};
	return responder_tm_place(ctx, qp, r, tagged, &src, 1, 0, len, unreachable);
}

// A SEND to a QP on a tag-matching SRQ. A message that starts with a TMH of
// opcode EAGER or RNDV is matched against the SRQ's tags: a matched eager
// message's payload (after the TMH) lands in the tagged buffer; a matched
// rendezvous fetches the data the RVH names, reports IBV_WC_TM_MATCH, then
// IBV_WC_TM_DATA_VALID, and sends us the FIN. Unmatched, the whole message
// goes to a receive of the SRQ (IBV_WC_TM_RECV, no flags: software matches
// it); one without such a TMH too (IBV_WC_TM_NO_TAG).
Result responder_deliver_tm(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe, Responder &r,
			    const xsrc_local_buffers &local)
{
	xsrc_tm_table *table = xsrc_tm_table_of(ctx->arena, r.srq->ring_off);
	if (!table)
		return Result::failed(IBV_WC_REM_OP_ERR);  // no table where the format puts it
	ibv_tmh tmh{};
	if (local.total >= kTmhBytes)
		local_gather(local, &tmh, kTmhBytes);
	bool tagged = local.total >= kTmhBytes && (tmh.opcode == IBV_TMH_EAGER || tmh.opcode == IBV_TMH_RNDV);
	if (!tagged)
		return responder_deliver(ctx, qp, wqe, r, local, false, IBV_WC_TM_NO_TAG);
	bool rndv = tmh.opcode == IBV_TMH_RNDV;

	xsrc::RecvWqe tagged_buf;
	switch (xsrc_tm_match(table, r.rq, r.rq_shape, be64toh(tmh.tag), static_cast<uint32_t>(ctx->pid), ctx->direct, tagged_buf)) {
	case xsrc_tm_outcome::no_receive:
		return responder_no_receive(qp, r);
	case xsrc_tm_outcome::unexpected:
		responder_check_srq_limit(ctx, r);
		return responder_deliver_to(ctx, qp, wqe, r, local, false, tagged_buf, IBV_WC_TM_RECV);
	case xsrc_tm_outcome::matched:
		break;
	}

	xsrc_cqe c = xsrc_make_cqe(tagged_buf.wr_id, IBV_WC_SUCCESS, IBV_WC_TM_RECV, r.qpn());
	c.src_qp = qp->qpn.value();
	c.wc_flags = IBV_WC_TM_MATCH;
	c.flags |= XSRC_CQE_TM_INFO;
	c.deferred_va = be64toh(tmh.tag);
	c.vendor_err = be32toh(tmh.app_ctx);
	if (wqe.opcode == IBV_WR_SEND_WITH_IMM) {
		c.imm_data = wqe.imm_data;
		c.wc_flags |= IBV_WC_WITH_IMM;
	} else if (wqe.opcode == IBV_WR_SEND_WITH_INV) {
		// As for a receive of the SRQ: the device invalidates the window.
		if (!xsrc_mw_remote_invalidate(ctx, qp, r.qpn(), wqe.invalidate_rkey))
			return responder_tm_error(ctx, r, tagged_buf, IBV_WC_REM_INV_REQ_ERR);
		c.imm_data = wqe.invalidate_rkey;
		c.wc_flags |= IBV_WC_WITH_INV;
	}
	if (wqe.flags & IBV_SEND_SOLICITED)
		c.flags |= XSRC_CQE_SOLICITED;
	bool unreachable = false;
	ibv_rvh rvh{};
	bool hw_rndv = rndv && local.total >= kTmhBytes + kRvhBytes && local.total <= XSRC_TM_RNDV_HDR_MAX;
	if (hw_rndv) {
		std::array<unsigned char, kTmhBytes + kRvhBytes> hdr;
		local_gather(local, hdr.data(), hdr.size());
		std::memcpy(&rvh, hdr.data() + kTmhBytes, kRvhBytes);
		hw_rndv = be32toh(rvh.len) <= recv_capacity(tagged_buf);
	}
	if (!hw_rndv) {
		// Eager, or a rendezvous the device does not do (its header is
		// malformed or too long, or the data would not fit): what follows
		// the TMH lands in the tagged buffer; for a rendezvous the status
		// IBV_WC_TM_RNDV_INCOMPLETE leaves the transfer to software.
		uint64_t len = local.total - kTmhBytes;
		ibv_wc_status st = responder_tm_place(ctx, qp, r, tagged_buf, local.iov.data(), local.count, kTmhBytes,
						      len, unreachable);
		if (unreachable)
			return Result::unreachable();
		if (st != IBV_WC_SUCCESS)
			return responder_tm_error(ctx, r, tagged_buf, st);
		c.byte_len = static_cast<uint32_t>(len);
		if (rndv)
			c.status = IBV_WC_TM_RNDV_INCOMPLETE;
		else
			c.wc_flags |= IBV_WC_TM_DATA_VALID;
		responder_complete(ctx, r, c);
		return Result::done(local.total);
	}

	// Rendezvous: matched now, the data follows with the read.
	responder_complete(ctx, r, c);
	ibv_wc_status st = responder_tm_rndv_read(ctx, qp, r, tagged_buf, rvh, unreachable);
	if (unreachable)
		return Result::unreachable();
	xsrc_cqe data = xsrc_make_cqe(tagged_buf.wr_id, st, IBV_WC_TM_RECV, r.qpn());
	if (st != IBV_WC_SUCCESS) {
		// The responder's read failed: its QP goes to error. Our SEND was
		// delivered (and acknowledged) before the read began.
		responder_enter_error(r);
		responder_complete(ctx, r, data);
		return Result::done(local.total);
	}
	data.src_qp = qp->qpn.value();
	data.byte_len = be32toh(rvh.len);
	data.wc_flags = IBV_WC_TM_DATA_VALID;
	responder_complete(ctx, r, data);
	qp->tm_fin.pending = true;  // xsrc_tm_deliver_fin, after our own completion
	qp->tm_fin.from_qpn = r.qpn().value();
	qp->tm_fin.tmh = tmh;
	return Result::done(local.total);
}

// The access an RDMA or atomic opcode needs at the responder.
uint32_t remote_access_needed(ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_ATOMIC_WRITE:  // as rxe: a write, done atomically
		return IBV_ACCESS_REMOTE_WRITE;
	case IBV_WR_RDMA_READ:
		return IBV_ACCESS_REMOTE_READ;
	default:
		return IBV_ACCESS_REMOTE_ATOMIC;
	}
}

// One rkey-checked access to the responder's memory at `remote`.
struct RemoteAccess {
	xsrc_context *ctx;
	xsrc_qp *qp;
	const xsrc_send_wqe &wqe;
	Responder &r;
	xsrc_local_buffers &local;
	iovec remote;
	xsrc_peer_path path;
	unsigned char *mapped = nullptr;  // `remote` in a segment attached here (peer_shm.h)

	pid_t peer() const { return static_cast<pid_t>(r.owner_pid); }
	// The same access through the device (made only on that path: the
	// others need none of it).
	xsrc_peer_copy device_copy(xsrc_peer_copy::op what) const
	{
		xsrc_peer_copy copy = responder_copy(qp, r);
		copy.what = what;
		copy.kind = xsrc_peer_copy::key_kind::rkey;
		copy.key = wqe.rkey.value();
		copy.peer_addr = wqe.remote_addr;
		copy.compare_add = wqe.compare_add;
		copy.swap = wqe.swap;
		return copy;
	}
	Result copy_failed(int err)
	{
		if (err == ESRCH || err == EAGAIN)
			return Result::unreachable();
		return err == EFAULT ? Result::failed(IBV_WC_LOC_PROT_ERR) : responder_access_error(ctx, r);
	}
	Result atomic_op();
	Result atomic_write(uint64_t value);
	std::optional<Result> move_bytes(bool read);
};

Result RemoteAccess::atomic_op()
{
	if (mapped) {
		// Under the same lock word as the system-call path: atomic with
		// respect to every requester, mapped or not.
		xsrc_peer_atomic_lock lock(ctx->arena, r.owner_pid, reinterpret_cast<uint64_t>(remote.iov_base),
					   static_cast<uint32_t>(ctx->pid));
		auto word = atomic(*reinterpret_cast<uint64_t *>(mapped));
		uint64_t original = word.load(std::memory_order_relaxed);
		if (wqe.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
			word.store(original + wqe.compare_add, std::memory_order_relaxed);
		else if (original == wqe.compare_add)
			word.store(wqe.swap, std::memory_order_relaxed);
		std::memcpy(local.iov[0].iov_base, &original, kAtomicBytes);
		return Result::done(kAtomicBytes);
	}
	if (path == xsrc_peer_path::direct) {
		uint64_t original;
		iovec orig_iov{&original, kAtomicBytes};
		xsrc_peer_atomic_lock lock(ctx->arena, r.owner_pid, reinterpret_cast<uint64_t>(remote.iov_base),
					   static_cast<uint32_t>(ctx->pid));
		int err = xsrc_peer_read(peer(), &orig_iov, 1, &remote, 1, kAtomicBytes);
		if (err && err != EPERM)
			return err == ESRCH ? Result::unreachable() : responder_access_error(ctx, r);
		if (!err) {
			uint64_t value = original;
			if (wqe.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
				value = original + wqe.compare_add;
			else if (original == wqe.compare_add)
				value = wqe.swap;
			iovec val_iov{&value, kAtomicBytes};
			if (value != original) {
				if (int werr = xsrc_peer_write(peer(), &val_iov, 1, &remote, 1, kAtomicBytes))
					return werr == ESRCH ? Result::unreachable() : responder_access_error(ctx, r);
			}
			std::memcpy(local.iov[0].iov_base, &original, kAtomicBytes);
			return Result::done(kAtomicBytes);
		}
		// Refused (the lock is released on return): the slow path.
	}
	if (path == xsrc_peer_path::direct)
		path = xsrc_peer_refused(ctx, r.owner_pid);
	if (path == xsrc_peer_path::none)
		return Result::unreachable();
	xsrc_peer_copy copy = device_copy(wqe.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ? xsrc_peer_copy::op::fetch_add
										  : xsrc_peer_copy::op::cmp_swap);
	if (int err = xsrc_peer_device_copy(ctx, qp, copy, local.iov.data(), 1, kAtomicBytes))
		return copy_failed(err);
	return Result::done(kAtomicBytes);
}

// IBV_WR_ATOMIC_WRITE: the 8 bytes land at once, under the device-wide
// atomics lock, so that no atomic of another requester sees half of them.
Result RemoteAccess::atomic_write(uint64_t value)
{
	iovec val_iov{&value, kAtomicBytes};
	if (mapped) {
		xsrc_peer_atomic_lock lock(ctx->arena, r.owner_pid, reinterpret_cast<uint64_t>(remote.iov_base),
					   static_cast<uint32_t>(ctx->pid));
		atomic(*reinterpret_cast<uint64_t *>(mapped)).store(value, std::memory_order_relaxed);
		return Result::done(kAtomicBytes);
	}
	if (path == xsrc_peer_path::direct) {
		xsrc_peer_atomic_lock lock(ctx->arena, r.owner_pid, reinterpret_cast<uint64_t>(remote.iov_base),
					   static_cast<uint32_t>(ctx->pid));
		int err = xsrc_peer_write(peer(), &val_iov, 1, &remote, 1, kAtomicBytes);
		if (!err)
			return Result::done(kAtomicBytes);
		if (err != EPERM)
			return err == ESRCH ? Result::unreachable() : responder_access_error(ctx, r);
		path = xsrc_peer_refused(ctx, r.owner_pid);
	}
	if (path == xsrc_peer_path::none)
		return Result::unreachable();
	if (int err = xsrc_peer_device_copy(ctx, qp, device_copy(xsrc_peer_copy::op::write), &val_iov, 1,
					    kAtomicBytes))
		return copy_failed(err);
	return Result::done(kAtomicBytes);
}

// The bytes of a READ or WRITE, moved by us or by the device: nothing once
// they moved, else how the work request ends.
std::optional<Result> RemoteAccess::move_bytes(bool read)
{
	if (mapped) {
		unsigned char *at = mapped;
		for (size_t i = 0; i < local.count; ++i) {
			if (read)
				std::memcpy(local.iov[i].iov_base, at, local.iov[i].iov_len);
			else
				std::memcpy(at, local.iov[i].iov_base, local.iov[i].iov_len);
			at += local.iov[i].iov_len;
		}
		return std::nullopt;
	}
	if (path == xsrc_peer_path::direct) {
		int err = read ? xsrc_peer_read(peer(), local.iov.data(), local.count, &remote, 1, local.total)
			       : xsrc_peer_write(peer(), local.iov.data(), local.count, &remote, 1, local.total);
		if (err == EPERM)
			path = xsrc_peer_refused(ctx, r.owner_pid);
		else if (err)
			return err == ESRCH ? Result::unreachable() : responder_access_error(ctx, r);
	}
	if (path == xsrc_peer_path::none)
		return Result::unreachable();
	if (path == xsrc_peer_path::device) {
		xsrc_peer_copy copy = device_copy(read ? xsrc_peer_copy::op::read : xsrc_peer_copy::op::write);
		if (int err = xsrc_peer_device_copy(ctx, qp, copy, local.iov.data(), local.count, local.total))
			return copy_failed(err);
	}
	return std::nullopt;
}

// RDMA WRITE / READ / atomics: the responder's memory through an rkey.
Result responder_remote_access(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe, Responder &r)
{
	uint32_t need = remote_access_needed(wqe.opcode);
	if ((r.qp->access_flags & need) != need)
		return responder_access_error(ctx, r);

	bool is_atomic = need == IBV_ACCESS_REMOTE_ATOMIC;
	bool is_read = need == IBV_ACCESS_REMOTE_READ;
	bool is_atomic_write = wqe.opcode == IBV_WR_ATOMIC_WRITE;
	xsrc_local_buffers local;
	uint64_t atomic_value = wqe.swap;  // ibv_wr_atomic_write's 8 bytes
	if (is_atomic_write && wqe.atomic_value_inline) {
		local.iov[0] = {&atomic_value, kAtomicBytes};
		local.count = 1;
		local.total = kAtomicBytes;
	} else if (!xsrc_peer_local_buffers(ctx, qp, wqe, is_read || is_atomic, local)) {
		return Result::failed(IBV_WC_LOC_PROT_ERR);
	}
	if ((is_atomic || is_atomic_write) && (local.total != kAtomicBytes || local.count != 1))
		return Result::failed(IBV_WC_LOC_LEN_ERR);
	if ((is_atomic || is_atomic_write) && (wqe.remote_addr & (kAtomicBytes - 1)))
		return Result::failed(IBV_WC_REM_INV_REQ_ERR);
	if (local.total > XSRC_MAX_MSG_SIZE)
		return Result::failed(IBV_WC_LOC_LEN_ERR);
	// A zero-length RDMA READ or WRITE names no memory: the responder checks neither R_Key
	// nor VA (IBTA C9-88). UCX's rc_verbs flushes with an empty inline write, rkey 0.
	if (local.total == 0 && !is_atomic) {
		if (wqe.opcode != IBV_WR_RDMA_WRITE_WITH_IMM)
			return Result::done(0);
		if (!responder_has_receive(r))
			return responder_no_receive(qp, r);
		return responder_deliver(ctx, qp, wqe, r, local, false);
	}

	uint64_t va;
	const xsrc_mr_entry *key = xsrc_peer_live_mr(ctx->arena, wqe.rkey);
	if (!xsrc_peer_mr_range(key, r.owner_pid, r.rkey_pd_id, wqe.remote_addr, local.total, need, va))
		return responder_access_error(ctx, r);
	// A type 2 window is reached only through the QP it was bound on (2B).
	if (key->bound_qpn && key->bound_qpn != r.qp->qpn)
		return responder_access_error(ctx, r);
	RemoteAccess access{ctx, qp, wqe, r, local, {reinterpret_cast<void *>(va), local.total},
			    xsrc_peer_path_to(ctx, r.owner_pid)};
	// Checked above on the entry as it is now, as on every operation.
	if (access.path == xsrc_peer_path::direct)
		access.mapped = ctx->shm_maps.find(*key, wqe.rkey.value(), r.owner_pid, va, local.total);

	if (is_atomic)
		return access.atomic_op();
	if (is_atomic_write) {
		std::memcpy(&atomic_value, local.iov[0].iov_base, kAtomicBytes);
		return access.atomic_write(atomic_value);
	}
	if (is_read) {
		if (std::optional<Result> ended = access.move_bytes(true))
			return *ended;
		return Result::done(local.total);
	}
	// RDMA WRITE WITH IMM also consumes a receive: make sure one is there
	// before a byte moves.
	if (wqe.opcode == IBV_WR_RDMA_WRITE_WITH_IMM && !responder_has_receive(r))
		return responder_no_receive(qp, r);
	if (std::optional<Result> ended = access.move_bytes(false))
		return *ended;
	if (wqe.opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
		return responder_deliver(ctx, qp, wqe, r, local, false);
	return Result::done(local.total);
}

// Is the owner of the responder we found dead? (Only in our own PID
// namespace: elsewhere the pid names another process, and the device answers
// ESRCH for a dead owner instead.)
bool responder_owner_dead(const xsrc_context *ctx, const Responder &r)
{
	return ctx->direct && kill(static_cast<pid_t>(r.owner_pid), 0) != 0 && errno == ESRCH;
}

// A responder that went away while we worked on its request (its owner died
// and the device is tearing its objects down) answers nothing: what its
// half-destroyed tables said, a missing MR or a QP no longer ready, is no NAK
// from a live peer. The requester retries, then completes with
// IBV_WC_RETRY_EXC_ERR, as an HCA does when the remote QP is gone.
bool responder_gone(const xsrc_context *ctx, const Responder &r, uint32_t generation)
{
	return atomic(r.qp->generation).load(std::memory_order_acquire) != generation ||
	       xsrc::qp_state_load(*r.qp) == IBV_QPS_UNKNOWN || responder_owner_dead(ctx, r);
}

bool remote_error(const Result &res)
{
	return res.attempt == xsrc_attempt::failed &&
	       (res.status == IBV_WC_REM_ACCESS_ERR || res.status == IBV_WC_REM_INV_REQ_ERR ||
		res.status == IBV_WC_REM_OP_ERR);
}

Result shm_execute_at(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe, Responder &r);

// A UD send to a multicast group (its AH's destination GID): each QP of the
// device attached to the group gets it once, through its own Q_Key check
// and its own receive — one without a posted receive drops its copy, the
// others still get theirs. The sending QP is skipped even when it is a
// member: nothing loops a datagram back to the QP that sent it. The sender's
// completion is a success however many members took it. Other hosts'
// members get it from the wire (xsrc_wire_send_multicast). A multicast
// destination needs the multicast QPN (IBTA 10.5.2.1); any other is dropped.
Result shm_execute_multicast(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe)
{
	xsrc_local_buffers local;
	if (!xsrc_peer_local_buffers(ctx, qp, wqe, false, local))
		return Result::failed(IBV_WC_LOC_PROT_ERR);
	if (local.total > ctx->port_mtu_bytes)
		return Result::failed(IBV_WC_LOC_LEN_ERR);
	if (wqe.remote_qpn.value() != XSRC_MCAST_QPN)
		return Result::dropped();
	uint32_t members[XSRC_MCAST_GROUP_QPS];
	size_t count = xsrc_mcast_members(ctx, wqe.ah->attr.grh.dgid, members);
	uint32_t qkey = (wqe.remote_qkey & kQkeyUseQps) ? qp->entry->qkey : wqe.remote_qkey;
	for (size_t i = 0; i < count; ++i) {
		Responder r;
		if (members[i] == qp->qpn.value() || !responder_find(ctx, xsrc::Qpn(members[i]), r) ||
		    r.qp->qp_type != IBV_QPT_UD || !can_receive(xsrc::qp_state_load(*r.qp)) || r.qp->qkey != qkey)
			continue;  // not for this member: a UD datagram is dropped silently
		responder_deliver(ctx, qp, wqe, r, local, true);
	}
	// Members on other hosts: once, onto the wire (never looped back here).
	xsrc_wire_send_multicast(ctx, qp, wqe);
	return Result::done(local.total);
}

Result shm_execute(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe) noexcept
{
	bool ud = qp->type == IBV_QPT_UD;
	if (ud && wqe.ah && wqe.ah->multicast)
		return shm_execute_multicast(ctx, qp, wqe);
	xsrc::Qpn dest = ud ? wqe.remote_qpn : xsrc::Qpn(qp->entry->dest_qpn);
	Responder r;
	if (!responder_find(ctx, dest, r) || !can_receive(xsrc::qp_state_load(*r.qp)) ||
	    r.qp->qp_type != peer_type(qp->type) || (!ud && r.qp->dest_qpn != qp->qpn.value())) {
		if (!reliable(qp->type))
			return Result::dropped();  // unacknowledged transports never learn
		return Result::unreachable();
	}
	uint32_t generation = atomic(r.qp->generation).load(std::memory_order_acquire);
	Result res = shm_execute_at(ctx, qp, wqe, r);
	if (remote_error(res) && responder_gone(ctx, r, generation))
		return Result::unreachable();
	return res;
}

// One attempt at `wqe` on the responder `r` found for it.
Result shm_execute_at(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe, Responder &r)
{
	bool ud = qp->type == IBV_QPT_UD;
	if (qp->type == IBV_QPT_XRC_SEND && !responder_use_xrc_srq(ctx, wqe.remote_srqn, r))
		return Result::failed(IBV_WC_REM_INV_REQ_ERR);
	// A retry: is anyone still there? A dead owner whose command file lives
	// on (a child holds it) keeps its QP in the table, but nothing answers.
	if (wqe.retried() && responder_owner_dead(ctx, r))
		return Result::unreachable();

	if (wqe.opcode == IBV_WR_SEND || wqe.opcode == IBV_WR_SEND_WITH_IMM || wqe.opcode == IBV_WR_SEND_WITH_INV) {
		if (ud) {
			uint32_t qkey = (wqe.remote_qkey & kQkeyUseQps) ? qp->entry->qkey : wqe.remote_qkey;
			if (qkey != r.qp->qkey)
				return Result::dropped();  // Q_Key violation: silently dropped
		}
		xsrc_local_buffers local;
		if (!xsrc_peer_local_buffers(ctx, qp, wqe, false, local))
			return Result::failed(IBV_WC_LOC_PROT_ERR);
		if (ud && local.total > ctx->port_mtu_bytes)
			return Result::failed(IBV_WC_LOC_LEN_ERR);
		if (local.total > XSRC_MAX_MSG_SIZE)
			return Result::failed(IBV_WC_LOC_LEN_ERR);
		if (r.srq && r.srq->srq_type == IBV_SRQT_TM && !ud)
			return responder_deliver_tm(ctx, qp, wqe, r, local);
		return responder_deliver(ctx, qp, wqe, r, local, ud);
	}
	return responder_remote_access(ctx, qp, wqe, r);
}

// --- batches (transport.h: execute_batch) ----------------------------------

// The most WQEs, local pieces and remote ranges one batch moves in one
// system call.
constexpr size_t kBatchIov = 256;

// One WQE of a batch after the checks execute() makes before a byte moves:
// its local buffers and the responder's VA its rkey names.
struct BatchItem {
	xsrc_local_buffers local;
	uint64_t va = 0;
};

}  // namespace

// A QP's batch items and the iovecs of a batch's one copy: on the heap,
// made at its first batch (about 42 KiB, too much for the stack of an
// application thread that posts).
struct xsrc_batch_scratch {
	std::array<BatchItem, xsrc_batch_max> items;
	std::array<iovec, kBatchIov> local, remote;
};

void xsrc_batch_scratch_free(xsrc_batch_scratch *scratch) noexcept
{
	delete scratch;
}

namespace {

// The checks of responder_remote_access() for one RDMA WRITE or atomic,
// without an effect: true when the batch may carry it; false when it is
// for execute() (an error to report, an empty write, a segment mapped
// here, a window bound elsewhere).
bool batch_check(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe, const Responder &r, BatchItem &item)
{
	uint32_t need = remote_access_needed(wqe.opcode);
	bool is_atomic = need == IBV_ACCESS_REMOTE_ATOMIC;
	if ((r.qp->access_flags & need) != need || !xsrc_peer_local_buffers(ctx, qp, wqe, is_atomic, item.local))
		return false;
	if (is_atomic && (item.local.total != kAtomicBytes || item.local.count != 1 ||
			  (wqe.remote_addr & (kAtomicBytes - 1))))
		return false;
	if (item.local.total == 0 || item.local.total > XSRC_MAX_MSG_SIZE)
		return false;
	const xsrc_mr_entry *key = xsrc_peer_live_mr(ctx->arena, wqe.rkey);
	if (!xsrc_peer_mr_range(key, r.owner_pid, r.rkey_pd_id, wqe.remote_addr, item.local.total, need, item.va))
		return false;
	if (key->bound_qpn && key->bound_qpn != r.qp->qpn)
		return false;
	// Memory mapped here is reached with plain loads and stores by execute().
	return !ctx->shm_maps.find(*key, wqe.rkey.value(), r.owner_pid, item.va, item.local.total);
}

// RDMA WRITEs: one process_vm_writev for all (adjacent remote ranges
// merged). A copy that stops part way completes the WQEs it covered; the
// rest go to execute(), which writes the same bytes again and reports.
size_t batch_write(xsrc_context *ctx, const Responder &r, const xsrc_send_wqe *const *wqes, size_t n,
		   xsrc_batch_scratch &scratch, Result *out)
{
	const BatchItem *items = scratch.items.data();
	std::array<iovec, kBatchIov> &local = scratch.local, &remote = scratch.remote;
	size_t nlocal = 0, nremote = 0, k = 0;
	uint64_t total = 0;
	for (; k < n && wqes[k]->opcode == IBV_WR_RDMA_WRITE; ++k) {
		const BatchItem &it = items[k];
		bool merges = nremote && reinterpret_cast<uint64_t>(remote[nremote - 1].iov_base) +
						 remote[nremote - 1].iov_len == it.va;
		if (nlocal + it.local.count > kBatchIov || (!merges && nremote == kBatchIov))
			break;
		for (size_t i = 0; i < it.local.count; ++i)
			local[nlocal++] = it.local.iov[i];
		if (merges)
			remote[nremote - 1].iov_len += it.local.total;
		else
			remote[nremote++] = {reinterpret_cast<void *>(it.va), it.local.total};
		total += it.local.total;
	}
	ssize_t moved = process_vm_writev(static_cast<pid_t>(r.owner_pid), local.data(), nlocal, remote.data(),
					  nremote, 0);
	if (moved < 0) {
		if (errno == EPERM)
			xsrc_peer_refused(ctx, r.owner_pid);
		return 0;  // nothing moved: execute() takes the head and says why
	}
	size_t done = 0;
	for (uint64_t covered = 0; done < k && covered + items[done].local.total <= static_cast<uint64_t>(moved);
	     ++done) {
		covered += items[done].local.total;
		out[done] = Result::done(items[done].local.total);
	}
	return done;
}

// Reads the peer's distinct words va[0..n) into value[]: one range that
// covers them all when they lie close together (the kernel pins each range
// it is given, which costs more than the bytes between them; nothing but
// the words is used), else one range per word. False when not all of them
// were read; `err` the errno of the last attempt.
bool batch_read_words(pid_t pid, const uint64_t *va, size_t n, uint64_t *value, int &err)
{
	constexpr uint64_t kCoverMax = 8192;
	uint64_t lo = va[0], hi = va[0];
	for (size_t w = 1; w < n; ++w) {
		lo = std::min(lo, va[w]);
		hi = std::max(hi, va[w]);
	}
	err = 0;
	if (n > 1 && hi - lo < kCoverMax) {
		alignas(8) unsigned char cover[kCoverMax];
		uint64_t len = hi + kAtomicBytes - lo;
		iovec local{cover, len}, remote{reinterpret_cast<void *>(lo), len};
		ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
		if (got == static_cast<ssize_t>(len)) {
			for (size_t w = 0; w < n; ++w)
				std::memcpy(&value[w], cover + (va[w] - lo), kAtomicBytes);
			return true;
		}
		// Something between the words is not mapped: word by word.
	}
	std::array<iovec, xsrc_peer_atomic_locks::kMax> local, remote;
	for (size_t w = 0; w < n; ++w) {
		local[w] = {&value[w], kAtomicBytes};
		remote[w] = {reinterpret_cast<void *>(va[w]), kAtomicBytes};
	}
	ssize_t got = process_vm_readv(pid, local.data(), n, remote.data(), n, 0);
	err = got < 0 ? errno : 0;
	return got == static_cast<ssize_t>(n * kAtomicBytes);
}

// Atomics: under the lock words of every word they touch, one read of the
// distinct words, each operation in order on the values read, one write of
// the words that changed (adjacent ones as one range; never a byte beside
// them). A read that fails changes nothing (execute() takes the head); a
// write that fails ends the first WQE as execute() would end it, and the
// rest with it.
size_t batch_atomics(xsrc_context *ctx, const Responder &r, const xsrc_send_wqe *const *wqes, size_t n,
		     BatchItem *items, Result *out)
{
	constexpr size_t kWords = xsrc_peer_atomic_locks::kMax;
	uint64_t va[kWords] = {}, value[kWords], before[kWords], original[xsrc_batch_max];
	size_t word_of[xsrc_batch_max];
	size_t words = 0, k = 0;
	for (; k < n && remote_access_needed(wqes[k]->opcode) == IBV_ACCESS_REMOTE_ATOMIC; ++k) {
		size_t w = 0;
		while (w < words && va[w] != items[k].va)
			++w;
		if (w == words) {
			if (words == kWords)
				break;  // as many words as one batch locks
			va[words++] = items[k].va;
		}
		word_of[k] = w;
	}
	pid_t pid = static_cast<pid_t>(r.owner_pid);
	xsrc_peer_atomic_locks locks(ctx->arena, r.owner_pid, va, words, static_cast<uint32_t>(ctx->pid));
	int err;
	if (!batch_read_words(pid, va, words, value, err)) {
		if (err == EPERM)
			xsrc_peer_refused(ctx, r.owner_pid);
		return 0;
	}
	std::memcpy(before, value, words * sizeof(uint64_t));
	for (size_t i = 0; i < k; ++i) {
		uint64_t &v = value[word_of[i]];
		original[i] = v;
		if (wqes[i]->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
			v += wqes[i]->compare_add;
		else if (v == wqes[i]->compare_add)
			v = wqes[i]->swap;
	}
	std::array<iovec, kWords> local, remote;
	size_t changed = 0, nremote = 0;
	for (size_t w = 0; w < words; ++w) {
		if (value[w] == before[w])
			continue;
		local[changed++] = {&value[w], kAtomicBytes};
		iovec *last = nremote ? &remote[nremote - 1] : nullptr;
		if (last && reinterpret_cast<uint64_t>(last->iov_base) + last->iov_len == va[w])
			last->iov_len += kAtomicBytes;
		else
			remote[nremote++] = {reinterpret_cast<void *>(va[w]), kAtomicBytes};
	}
	if (changed) {
		ssize_t put = process_vm_writev(pid, local.data(), changed, remote.data(), nremote, 0);
		if (put != static_cast<ssize_t>(changed * kAtomicBytes)) {
			int werr = put < 0 ? errno : EFAULT;
			out[0] = werr == ESRCH ? Result::unreachable() : Result::failed(IBV_WC_REM_ACCESS_ERR);
			return 1;
		}
	}
	for (size_t i = 0; i < k; ++i) {
		std::memcpy(items[i].local.iov[0].iov_base, &original[i], kAtomicBytes);
		out[i] = Result::done(kAtomicBytes);
	}
	return k;
}

size_t shm_execute_batch(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe *const *wqes, size_t n,
			 Result *out) noexcept
{
	Responder r;
	if (qp->type != IBV_QPT_RC || !responder_find(ctx, xsrc::Qpn(qp->entry->dest_qpn), r) ||
	    !can_receive(xsrc::qp_state_load(*r.qp)) || r.qp->qp_type != IBV_QPT_RC ||
	    r.qp->dest_qpn != qp->qpn.value() || xsrc_peer_path_to(ctx, r.owner_pid) != xsrc_peer_path::direct)
		return 0;
	uint32_t generation = atomic(r.qp->generation).load(std::memory_order_acquire);
	// The run the checks let through, of one kind: writes or atomics.
	bool atomics = remote_access_needed(wqes[0]->opcode) == IBV_ACCESS_REMOTE_ATOMIC;
	if (!qp->batch) {
		qp->batch.reset(new (std::nothrow) xsrc_batch_scratch);
		if (!qp->batch)
			return 0;  // execute() takes them one by one
	}
	std::array<BatchItem, xsrc_batch_max> &items = qp->batch->items;
	size_t k = 0;
	for (; k < n && k < items.size(); ++k) {
		if ((remote_access_needed(wqes[k]->opcode) == IBV_ACCESS_REMOTE_ATOMIC) != atomics ||
		    !batch_check(ctx, qp, *wqes[k], r, items[k]))
			break;
	}
	if (k == 0)
		return 0;
	size_t done = atomics ? batch_atomics(ctx, r, wqes, k, items.data(), out)
			      : batch_write(ctx, r, wqes, k, *qp->batch, out);
	if (done && remote_error(out[done - 1])) {
		if (responder_gone(ctx, r, generation))
			out[done - 1] = Result::unreachable();
		else
			out[done - 1] = responder_access_error(ctx, r);
	}
	return done;
}

}  // namespace

// The rendezvous's last step: the responder tells us, the requester, that it
// has the data — a SEND of a TMH with opcode FIN into our own receive queue
// (an ordinary IBV_WC_RECV). With no receive posted for it the FIN is lost
// (an HCA would retry it, and fail the responder's QP after its RNR
// retries): software that uses rendezvous keeps receives posted.
void xsrc_tm_deliver_fin(xsrc_context *ctx, xsrc_qp *qp) noexcept
{
	qp->tm_fin.pending = false;
	Responder self;
	xsrc::RecvWqe rwqe;
	if (!responder_find(ctx, qp->qpn, self) || !self.rq || !xsrc::recv_pop(self.rq, self.rq_shape, rwqe))
		return;
	responder_check_srq_limit(ctx, self);
	ibv_tmh fin = qp->tm_fin.tmh;
	fin.opcode = IBV_TMH_FIN;
	std::array<iovec, XSRC_MAX_RECV_SGE> to;
	size_t nto;
	bool on_demand;
	ibv_wc_status st =
		xsrc_peer_recv_buffers(ctx->arena, rwqe, self.owner_pid, self.pd_id, kTmhBytes, to, nto, on_demand);
	iovec from{&fin, kTmhBytes};
	if (st == IBV_WC_SUCCESS && xsrc_peer_write(getpid(), &from, 1, to.data(), nto, kTmhBytes) != 0)
		st = IBV_WC_LOC_PROT_ERR;
	xsrc_cqe c = xsrc_make_cqe(rwqe.wr_id, st, IBV_WC_RECV, qp->qpn);
	if (st == IBV_WC_SUCCESS) {
		c.byte_len = kTmhBytes;
		c.src_qp = qp->tm_fin.from_qpn;
	}
	responder_complete(ctx, self, c);
}

const xsrc_transport xsrc_shm_transport = {
	.name = "shm",
	.execute = shm_execute,
	.execute_batch = shm_execute_batch,
};
