// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The requester: a QP's send queue in order, whatever engine carries its
// messages (transport.h). Executes a posted WQE at once when nothing is
// blocked ahead of it, else queues it; times RNR and ACK-timeout retries
// (IBTA 9.7.5, 9.7.6); writes the sender's completions; flushes on error.
#include "xsrc.h"

#include "common/clock.h"
#include "tm.h"

#include <time.h>

namespace {

using Result = xsrc_attempt_result;

// rnr_retry 7 means "retry forever" (IBTA 9.7.5.2.8).
constexpr int kRnrRetryForever = 7;

// Local ACK timeout: 4.096 us * 2^timeout. 0 means "wait forever" in the
// spec, which for an unreachable peer we cap at a second per try (as for
// exponents past kAckTimeoutMaxExp).
constexpr uint64_t kAckTimeoutUnitNs = 4096;
constexpr uint8_t kAckTimeoutMaxExp = 20;
constexpr uint64_t kAckTimeoutCapNs = 1000000000ull;
constexpr uint64_t kNsPerUs = 1000;

// Deferred WQEs: at most this many in one batch, and this long before the
// progress thread runs them for a QP that neither posts nor polls; the
// longer deadline once a post ended the QP's last batch (it streams: each
// deadline the thread waits out costs the posting thread a wake-up of the
// progress thread, on its own CPU when the process is pinned to one).
constexpr size_t kBatchMax = xsrc_batch_max;
constexpr uint64_t kDeferNs = 100 * kNsPerUs;
constexpr uint64_t kDeferStreamingNs = 1000 * kNsPerUs;
// After deferred WQEs waited out their deadline, this many posts that could
// be deferred are not (the deadline costs a ping-pong one round trip).
constexpr uint32_t kDeferHoldoffPosts = 4096;
// How long a UD datagram waits for a receive on a queue its owner posts to
// before it is dropped: a receiver that reposts as it polls gets it.
constexpr uint64_t kUdHoldNs = 1000 * kNsPerUs;

ibv_wc_opcode requester_wc_opcode(ibv_wr_opcode op)
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
	case IBV_WR_ATOMIC_WRITE:
		return IBV_WC_ATOMIC_WRITE;
	case IBV_WR_BIND_MW:
		return IBV_WC_BIND_MW;
	case IBV_WR_LOCAL_INV:
		return IBV_WC_LOCAL_INV;
	default:
		return IBV_WC_SEND;
	}
}

// The engine that reaches the WQE's destination: its AH's on UD, the RTR
// path's on a connected QP (route.cpp), else the context's own.
const xsrc_transport *requester_engine(const xsrc_context *ctx, const xsrc_qp *qp, const xsrc_send_wqe &wqe)
{
	if (qp->type == IBV_QPT_UD)
		return wqe.ah ? wqe.ah->engine : ctx->transport;
	return qp->engine ? qp->engine : ctx->transport;
}

// One attempt at `wqe`: a bind or local invalidation is the device's own
// work (mw.cpp), anything else goes to the engine of its destination.
Result requester_execute(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe)
{
	if (wqe.opcode == IBV_WR_BIND_MW || wqe.opcode == IBV_WR_LOCAL_INV)
		return xsrc_mw_execute_local(ctx, qp, wqe);
	return requester_engine(ctx, qp, wqe)->execute(ctx, qp, wqe);
}

// Can `wqe` join a batch (transport.h: execute_batch)? RC RDMA WRITEs and
// atomics carry nothing the responder's CPU sees, so that when they move
// is the device's business, as on an HCA.
bool requester_batchable(const xsrc_context *ctx, const xsrc_qp *qp, const xsrc_send_wqe &wqe)
{
	if (qp->type != IBV_QPT_RC || wqe.retried() || !requester_engine(ctx, qp, wqe)->execute_batch)
		return false;
	switch (wqe.opcode) {
	case IBV_WR_RDMA_WRITE:
		return true;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		return !wqe.atomic_value_inline;
	default:
		return false;
	}
}

bool requester_signaled(const xsrc_qp *qp, const xsrc_send_wqe &wqe)
{
	return qp->sq_sig_all || (wqe.flags & IBV_SEND_SIGNALED);
}

void requester_complete(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe, ibv_wc_status status,
			uint32_t byte_len)
{
	if (status == IBV_WC_SUCCESS && !requester_signaled(qp, wqe))
		return;
	xsrc_cqe c = xsrc_make_cqe(wqe.wr_id, status, requester_wc_opcode(wqe.opcode), qp->qpn);
	c.byte_len = byte_len;
	xsrc_cq_complete(ctx, qp->send_cq->ring(), 0, c);
}

// The head WQE completed successfully; what its responder sends back
// because of it (a rendezvous's FIN) arrives after its completion.
void requester_done(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe, uint32_t byte_len)
{
	requester_complete(ctx, qp, wqe, IBV_WC_SUCCESS, byte_len);
	if (qp->tm_fin.pending)
		xsrc_tm_deliver_fin(ctx, qp);
}
}  // namespace

// IBTA RNR timer encoding (0 = 655.36 ms), in nanoseconds.
uint64_t xsrc_requester_rnr_delay_ns(uint8_t code) noexcept
{
	static constexpr uint32_t us[32] = {655360, 10,   20,   30,   40,   60,    80,    120,
					    160,    240,  320,  480,  640,  960,  1280,  1920,
					    2560,   3840, 5120, 7680, 10240, 15360, 20480, 30720,
					    40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};
	return uint64_t(us[code % std::size(us)]) * kNsPerUs;
}

uint64_t xsrc_requester_ack_timeout_ns(uint8_t timeout) noexcept
{
	if (timeout == 0 || timeout > kAckTimeoutMaxExp)
		return kAckTimeoutCapNs;
	return kAckTimeoutUnitNs << timeout;
}

void xsrc_requester_complete_later(xsrc_context *ctx, xsrc_qp *qp, uint64_t wr_id, ibv_wr_opcode opcode,
				   bool signaled, ibv_wc_status status, uint32_t byte_len) noexcept
{
	if (status == IBV_WC_SUCCESS && !signaled)
		return;
	xsrc_cqe c = xsrc_make_cqe(wr_id, status, requester_wc_opcode(opcode), qp->qpn);
	c.byte_len = byte_len;
	xsrc_cq_complete(ctx, qp->send_cq->ring(), 0, c);
}

namespace {

// The head WQE ends with `status`: the QP goes to error, the rest is flushed.
// The state changes first, so whoever polls the error completion and then
// queries the QP finds it in ERR, as on an HCA.
void requester_fail_head(xsrc_context *ctx, xsrc_qp *qp, ibv_wc_status status)
{
	xsrc::qp_state_store(*qp->entry, IBV_QPS_ERR);
	requester_complete(ctx, qp, qp->sq.front(), status, 0);
	qp->sq.pop_front();
	xsrc_requester_flush(qp);
}

// The head waits for a receive on `rq` until retry_at_ns: a receive posted
// there retries it early (xsrc_requester_recheck), from poll_cq too.
void requester_watch(xsrc_context *ctx, xsrc_qp *qp, xsrc_recv_ring *rq)
{
	qp->rnr_rq = rq;
	if (rq && !ctx->rnr_waiting.load(std::memory_order_relaxed))
		ctx->rnr_waiting.store(true, std::memory_order_relaxed);
}

// A UD datagram that found its receiver's queue empty: held until its
// deadline, then dropped (a success for the sender, as any drop).
bool requester_hold_datagram(xsrc_context *ctx, xsrc_qp *qp, xsrc_send_wqe &wqe, Result res, uint64_t now)
{
	if (!wqe.rnr_timer_at_ns)
		wqe.rnr_timer_at_ns = now + kUdHoldNs;
	if (now >= wqe.rnr_timer_at_ns) {
		requester_done(ctx, qp, wqe, 0);
		qp->sq.pop_front();
		return true;
	}
	qp->retry_at_ns = wqe.rnr_timer_at_ns;
	requester_watch(ctx, qp, res.empty_rq);
	return false;
}

// Acts on the outcome of an attempt at the head WQE: completes it, or
// arms its retry. True when it finished (done or failed).
bool requester_settle_head(xsrc_context *ctx, xsrc_qp *qp, Result res, uint64_t now = 0)
{
	if (!now && (res.attempt == xsrc_attempt::rnr || res.attempt == xsrc_attempt::unreachable))
		now = xsrc_requester_now_ns();
	xsrc_send_wqe &wqe = qp->sq.front();
	qp->rnr_rq = nullptr;
	switch (res.attempt) {
	case xsrc_attempt::done:
		requester_done(ctx, qp, wqe, res.byte_len);
		qp->sq.pop_front();
		return true;
	case xsrc_attempt::posted:  // the engine completes it
		qp->sq.pop_front();
		return true;
	case xsrc_attempt::failed:
		requester_fail_head(ctx, qp, res.status);
		return true;
	case xsrc_attempt::rnr:
		if (qp->type == IBV_QPT_UD)
			return requester_hold_datagram(ctx, qp, wqe, res, now);
		// An early retry (a receive was posted, someone else took it): the
		// timer runs on, and only its expiry counts a retry.
		if (now < wqe.rnr_timer_at_ns) {
			qp->retry_at_ns = wqe.rnr_timer_at_ns;
			requester_watch(ctx, qp, res.empty_rq);
			return false;
		}
		if (wqe.rnr_retries_left == xsrc_send_wqe::kNotRetried)
			wqe.rnr_retries_left = qp->entry->rnr_retry;
		if (wqe.rnr_retries_left != kRnrRetryForever && wqe.rnr_retries_left-- == 0) {
			requester_fail_head(ctx, qp, IBV_WC_RNR_RETRY_EXC_ERR);
			return true;
		}
		qp->retry_at_ns = wqe.rnr_timer_at_ns = now + xsrc_requester_rnr_delay_ns(res.min_rnr_timer);
		requester_watch(ctx, qp, res.empty_rq);
		return false;
	case xsrc_attempt::unreachable:
		if (wqe.retries_left == xsrc_send_wqe::kNotRetried)
			wqe.retries_left = qp->entry->retry_cnt;
		if (wqe.retries_left-- == 0) {
			requester_fail_head(ctx, qp, IBV_WC_RETRY_EXC_ERR);
			return true;
		}
		qp->retry_at_ns = now + xsrc_requester_ack_timeout_ns(qp->entry->timeout);
		return false;
	}
	return true;
}

// The head WQE and the batchable ones after it, attempted together. True
// when a batch ran (each of its WQEs is settled), false when the head is for
// execute(). `stopped`: the last one settled did not finish (retry armed).
// A run the engine takes none of (a segment mapped here, a peer reached
// through the device) ends deferral for a while: it gains nothing there.
bool requester_run_batch(xsrc_context *ctx, xsrc_qp *qp, bool &stopped, bool &refused)
{
	const xsrc_send_wqe *run[kBatchMax];
	size_t n = 0;
	while (n < kBatchMax && n < qp->sq.size() && requester_batchable(ctx, qp, qp->sq.at(n))) {
		run[n] = &qp->sq.at(n);
		++n;
	}
	if (n < 2)
		return false;
	Result out[kBatchMax];
	size_t done = requester_engine(ctx, qp, *run[0])->execute_batch(ctx, qp, run, n, out);
	if (!done) {
		qp->defer_holdoff = kDeferHoldoffPosts;
		refused = true;
		return false;
	}
	stopped = false;
	for (size_t i = 0; i < done && !stopped; ++i)
		stopped = !requester_settle_head(ctx, qp, out[i]);
	return true;
}

}  // namespace

uint64_t xsrc_requester_now_ns() noexcept
{
	return xsrc::monotonic_ns();
}

void xsrc_requester_post(xsrc_qp *qp) noexcept
{
	auto *ctx = to_xsrc_ctx(qp->vqp.qp.context);
	xsrc_send_wqe &wqe = qp->sq.next();
	if (xsrc::qp_state_load(*qp->entry) == IBV_QPS_ERR) {
		requester_complete(ctx, qp, wqe, IBV_WC_WR_FLUSH_ERR, 0);
		return;
	}
	// Streaming: posted again with no poll of the send CQ since the last post.
	uint64_t polls = qp->send_cq ? qp->send_cq->polls.load(std::memory_order_relaxed) : 0;
	bool streaming = polls == qp->send_cq_polls_seen;
	qp->send_cq_polls_seen = polls;
	// Deferred: the caller leaves room for one more (max_send_wr counts the queue).
	bool defer = streaming && !requester_signaled(qp, wqe) && requester_batchable(ctx, qp, wqe) &&
		     qp->sq.size() + 2 < qp->max_send_wr && qp->sq.size() + 1 < kBatchMax;
	if (defer && qp->defer_holdoff) {
		--qp->defer_holdoff;
		defer = false;
	}
	if (!qp->sq.empty()) {
		qp->sq.push_next();  // blocked or deferred work ahead of it keeps the order
		if (qp->retry_at_ns) {
			xsrc_requester_recheck(qp);
			return;
		}
		if (defer)
			return;
		// Deferred work, and this one ends the batch: all of it now.
		qp->defer_streaming = true;
		if (uint64_t next = xsrc_requester_progress(qp))
			xsrc_progress_schedule(ctx, qp, next);
		return;
	}
	if (defer) {
		qp->sq.push_next();
		// The deadline, which replaces the last batch's: while the posts
		// end each batch the thread stays away.
		qp->deferred_due_ns = xsrc_requester_now_ns() + (qp->defer_streaming ? kDeferStreamingNs : kDeferNs);
		xsrc_progress_defer(ctx, qp, qp->deferred_due_ns);
		return;
	}
	// The fast path: nothing queued, try it now without queueing it.
	Result res = requester_execute(ctx, qp, wqe);
	if (res.attempt == xsrc_attempt::done) {
		requester_done(ctx, qp, wqe, res.byte_len);
		return;
	}
	if (res.attempt == xsrc_attempt::posted)
		return;
	qp->sq.push_next();
	if (!requester_settle_head(ctx, qp, res, xsrc_requester_now_ns()))
		xsrc_progress_schedule(ctx, qp, qp->retry_at_ns);
	else if (uint64_t next = xsrc_requester_progress(qp))
		xsrc_progress_schedule(ctx, qp, next);
}

uint64_t xsrc_requester_progress_due(xsrc_qp *qp) noexcept
{
	if (!qp->sq.empty() && !qp->retry_at_ns) {
		uint64_t due = qp->deferred_due_ns;
		if (xsrc_requester_now_ns() < due)
			return due;  // a batch younger than the deadline: the posts end it
		qp->defer_holdoff = kDeferHoldoffPosts;
		qp->defer_streaming = false;
	}
	return xsrc_requester_progress(qp);
}

void xsrc_requester_run_deferred(xsrc_qp *qp) noexcept
{
	if (qp->sq.empty() || qp->retry_at_ns)
		return;
	if (uint64_t next = xsrc_requester_progress(qp))
		xsrc_progress_schedule(to_xsrc_ctx(qp->vqp.qp.context), qp, next);
}

uint64_t xsrc_requester_progress(xsrc_qp *qp) noexcept
{
	auto *ctx = to_xsrc_ctx(qp->vqp.qp.context);
	uint64_t now = 0;
	bool batching = true;
	while (!qp->sq.empty()) {
		if (xsrc::qp_state_load(*qp->entry) == IBV_QPS_ERR) {
			xsrc_requester_flush(qp);
			return 0;
		}
		if (qp->retry_at_ns) {
			now = now ? now : xsrc_requester_now_ns();
			if (now < qp->retry_at_ns)
				return qp->retry_at_ns;
			qp->retry_at_ns = 0;
		}
		// One refused run is enough: the rest of this pass goes one by one.
		bool stopped = false, refused = false;
		if (batching && requester_run_batch(ctx, qp, stopped, refused)) {
			if (stopped)
				return qp->retry_at_ns;
			continue;
		}
		batching = batching && !refused;
		Result res = requester_execute(ctx, qp, qp->sq.front());
		if (!requester_settle_head(ctx, qp, res, now))
			return qp->retry_at_ns;
	}
	return 0;
}

void xsrc_requester_flush(xsrc_qp *qp) noexcept
{
	auto *ctx = to_xsrc_ctx(qp->vqp.qp.context);
	xsrc_wire_qp_flush(qp, false);  // sent on the wire, not yet acknowledged: first
	while (!qp->sq.empty()) {
		requester_complete(ctx, qp, qp->sq.front(), IBV_WC_WR_FLUSH_ERR, 0);
		qp->sq.pop_front();
	}
	qp->retry_at_ns = 0;
	qp->rnr_rq = nullptr;
	if (qp->rq && qp->recv_cq) {
		xsrc::RecvWqe rwqe;
		while (xsrc::recv_pop(qp->rq, qp->rq_shape, rwqe))
			xsrc_cq_complete(ctx, qp->recv_cq->ring(), 0,
					 xsrc_make_cqe(rwqe.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, qp->qpn));
	}
}

void xsrc_requester_recheck(xsrc_qp *qp) noexcept
{
	if (!qp->retry_at_ns || !qp->rnr_rq || qp->destroying || xsrc::recv_count(qp->rnr_rq) == 0)
		return;
	qp->retry_at_ns = 0;  // the head may go now; its timer stays in the WQE
	if (uint64_t next = xsrc_requester_progress(qp))
		xsrc_progress_schedule(to_xsrc_ctx(qp->vqp.qp.context), qp, next);
}

void xsrc_requester_recheck_all(xsrc_context *ctx) noexcept
{
	// Cleared first: a QP that starts to wait meanwhile sets it again.
	if (!ctx->rnr_waiting.load(std::memory_order_relaxed) || !ctx->rnr_waiting.exchange(false))
		return;
	bool waiting = false;
	std::lock_guard guard(ctx->qps_lock);
	for (xsrc_qp *qp = ctx->qps; qp; qp = qp->ctx_next) {
		std::unique_lock sq(qp->sq_lock, std::try_to_lock);
		if (!sq.owns_lock()) {
			waiting = true;  // busy: look again at the next poll
			continue;
		}
		xsrc_requester_recheck(qp);
		waiting = waiting || (qp->retry_at_ns && qp->rnr_rq);
	}
	if (waiting)
		ctx->rnr_waiting.store(true, std::memory_order_relaxed);
}
