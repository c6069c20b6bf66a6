// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The transport interface: what the QP's post path calls, and what an engine
// that carries a QP's messages provides.
//
//   qp.cpp (post_send) -> requester.cpp (order, retries, send completions)
//                      -> xsrc_transport::execute: one attempt at one WQE
//
// Today's engine is the shared-memory one (shm_responder.cpp: the responder
// model on the arena; peer_memory.cpp: moving the bytes). A wire engine
// (RoCE v2) is another xsrc_transport beside it; the requester and the QP
// code do not change.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

struct xsrc_context;
struct xsrc_qp;
struct xsrc_send_wqe;
struct xsrc_recv_ring;

// The most WQEs one execute_batch() is given.
constexpr size_t xsrc_batch_max = 128;

// The outcome of one attempt at a WQE.
// posted: the engine took the message and completes it itself later (RC on
// the wire: when the responder acknowledges it).
enum class xsrc_attempt { done, rnr, unreachable, failed, posted };

struct xsrc_attempt_result {
	xsrc_attempt attempt = xsrc_attempt::done;
	ibv_wc_status status = IBV_WC_SUCCESS;  // of a failed attempt
	uint32_t byte_len = 0;                  // of a done one
	uint8_t min_rnr_timer = 0;              // the responder's, for an RNR wait
	// rnr: the receive queue that had no receive (null: not known), which
	// the requester watches to retry as soon as one is posted. On UD, rnr
	// means "hold the datagram a moment" (requester.cpp), never a NAK.
	xsrc_recv_ring *empty_rq = nullptr;

	static xsrc_attempt_result done(uint64_t byte_len)
	{
		return {xsrc_attempt::done, IBV_WC_SUCCESS, static_cast<uint32_t>(byte_len), 0};
	}
	// Unacknowledged transports: the message is dropped, the sender never knows.
	static xsrc_attempt_result dropped() { return {}; }
	static xsrc_attempt_result failed(ibv_wc_status status) { return {xsrc_attempt::failed, status, 0, 0}; }
	static xsrc_attempt_result rnr(uint8_t min_rnr_timer, xsrc_recv_ring *empty_rq = nullptr)
	{
		return {xsrc_attempt::rnr, IBV_WC_SUCCESS, 0, min_rnr_timer, empty_rq};
	}
	static xsrc_attempt_result unreachable() { return {xsrc_attempt::unreachable, IBV_WC_SUCCESS, 0, 0}; }
	static xsrc_attempt_result posted() { return {xsrc_attempt::posted, IBV_WC_SUCCESS, 0, 0}; }
};

// An engine. execute() makes one attempt at `wqe` (the caller holds the
// QP's sq_lock): it finds the responder, moves the bytes and writes the
// responder's completions; the requester writes the sender's. It neither
// allocates on the fast path nor throws.
struct xsrc_transport {
	const char *name;
	xsrc_attempt_result (*execute)(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe) noexcept;
	// Optional: attempts at the first k of `n` (<= xsrc_batch_max) WQEs of a run at the head of
	// the send queue, in order, with fewer system calls than k execute()s,
	// and as if each had been executed alone. Writes out[0..k) and returns
	// k; only out[k-1] may be other than done. 0: none was attempted (the
	// requester calls execute() for the head).
	size_t (*execute_batch)(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe *const *wqes, size_t n,
				xsrc_attempt_result *out) noexcept = nullptr;
};

extern const xsrc_transport xsrc_shm_transport;  // shm_responder.cpp
// A destination GID that is not this device's (route.cpp): connected QPs.
extern const xsrc_transport xsrc_unrouted_transport;
// RoCE v2 to another host (wire_requester.cpp): UD, and RC and UC (wire_rc.cpp).
extern const xsrc_transport xsrc_wire_transport;
// A UD send to a multicast group leaves for the other hosts' members too:
// one RoCE v2 datagram to the group's IP multicast address, TTL / hop limit
// from the AH. Lost quietly when it cannot leave (as on a wire).
void xsrc_wire_send_multicast(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe) noexcept;

// --- route.cpp: which engine reaches a destination -------------------------

// Is `gid` in the GID table of `port_num`? (Reads the table: a slow path.)
bool xsrc_gid_is_local(ibv_context *ctx, uint8_t port_num, const ibv_gid &gid);
// The engine for messages towards `ah`: the context's own for this port's
// GIDs, multicast GIDs (and for no GRH); the wire for any other GID.
const xsrc_transport *xsrc_route(ibv_context *ctx, const ibv_ah_attr &ah);

// --- requester.cpp: the QP's side, whatever the engine ---------------------

// Posts the WQE built in qp->sq.next() (validated; the caller holds
// sq_lock): executes it now, or queues it behind blocked work. An
// unsignaled RDMA WRITE or atomic of a QP that posts faster than its send
// CQ is polled is deferred instead, into a batch that runs in one go when
// a signaled or other WQE follows, when the batch is full, or after
// kDeferNs at the latest (kDeferStreamingNs once posts ended the last batch;
// the progress thread: xsrc_requester_progress_due).
void xsrc_requester_post(xsrc_qp *qp) noexcept;
// The progress thread's pass: as xsrc_requester_progress(), but deferred
// WQEs wait for their deadline, and a QP whose deferred WQEs reached it
// (the application waited for them without a verbs call: a ping-pong)
// defers nothing for a while.
uint64_t xsrc_requester_progress_due(xsrc_qp *qp) noexcept;
// Executes the deferred WQEs (none blocked) now: before the QP changes state
// or goes away.
void xsrc_requester_run_deferred(xsrc_qp *qp) noexcept;
// Executes the blocked WQEs at the head of qp->sq whose time has come.
// Returns the time of the next retry (0 when the queue drained).
uint64_t xsrc_requester_progress(xsrc_qp *qp) noexcept;
// Completes every queued WQE with IBV_WC_WR_FLUSH_ERR and drains the RQ.
void xsrc_requester_flush(xsrc_qp *qp) noexcept;
// The head of qp->sq waits for a receive on a peer's queue (an RNR wait, a
// held UD datagram) and one is posted there now: retries it at once instead
// of at its timer (the caller holds sq_lock). An early retry that finds no
// receive again costs no RNR retry: only the timer's expiry counts one.
void xsrc_requester_recheck(xsrc_qp *qp) noexcept;
// The same for every QP of the context that waits so (poll_cq calls it: an
// application that polls its send CQ is waiting for those sends).
void xsrc_requester_recheck_all(xsrc_context *ctx) noexcept;
// The monotonic clock retries are timed by.
uint64_t xsrc_requester_now_ns() noexcept;
// The local ACK timeout of a QP's `timeout` attribute, and an RNR NAK's
// wait for its timer code (IBTA tables), in nanoseconds.
uint64_t xsrc_requester_ack_timeout_ns(uint8_t timeout) noexcept;
uint64_t xsrc_requester_rnr_delay_ns(uint8_t code) noexcept;
// A WQE an engine took (xsrc_attempt::posted) finished: its completion,
// when it is signaled or failed.
void xsrc_requester_complete_later(xsrc_context *ctx, xsrc_qp *qp, uint64_t wr_id, ibv_wr_opcode opcode,
				   bool signaled, ibv_wc_status status, uint32_t byte_len) noexcept;
