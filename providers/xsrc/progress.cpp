// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
#include "progress.h"

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <new>

#include "xsrc.h"

namespace xsrc {

Progress::~Progress()
{
	{
		std::lock_guard guard(lock_);
		if (!started_)
			return;
		stop_ = true;
	}
	wake_.notify_one();
	pthread_join(thread_, nullptr);
}

void *Progress::thread_main(void *self) noexcept
{
	static_cast<Progress *>(self)->run();
	return nullptr;
}

// Starts the thread (under lock_). False when it cannot start now: the
// work stays scheduled, and the next schedule() tries again.
bool Progress::start_locked() noexcept
{
	if (started_)
		return true;
	int err = xsrc_start_thread(thread_, thread_main, this);
	if (err) {
		verbs_err(&ctx_->ibv_ctx, "cannot start the progress thread: %s\n", strerror(err));
		return false;
	}
	started_ = true;
	return true;
}

// Links `qp` due at `at_ns`, or moves it earlier. False when it already was
// due no later. Under lock_.
static bool progress_link_due(xsrc_qp *&head, xsrc_qp *qp, uint64_t at_ns) noexcept
{
	auto &link = qp->progress_link;
	if (link.queued) {
		if (link.at_ns <= at_ns)
			return false;
		link.at_ns = at_ns;
		link.deferral = false;
		return true;
	}
	link = {head, at_ns, true, false};
	head = qp;
	return true;
}

void Progress::unlink(xsrc_qp *qp) noexcept
{
	if (!qp->progress_link.queued)
		return;
	for (xsrc_qp **p = &due_; *p; p = &(*p)->progress_link.next)
		if (*p == qp) {
			*p = qp->progress_link.next;
			break;
		}
	qp->progress_link = {};
}

void Progress::schedule(xsrc_qp *qp, uint64_t at_ns) noexcept
{
	{
		std::lock_guard guard(lock_);
		bool earlier = progress_link_due(due_, qp, at_ns);
		if (!start_locked() || !earlier)
			return;
	}
	wake_.notify_one();
}

// A deferred batch's deadline replaces the previous batch's (which the
// posts ran: visiting the QP then would only contend for its sq_lock with
// the thread that posts), never a retry's. The thread is woken only for a
// deadline earlier than it had; one that moved later makes it wait on.
void Progress::defer(xsrc_qp *qp, uint64_t at_ns) noexcept
{
	{
		std::lock_guard guard(lock_);
		auto &link = qp->progress_link;
		bool earlier;
		if (link.queued && link.deferral) {
			earlier = at_ns < link.at_ns;
			link.at_ns = at_ns;
		} else {
			bool linked = !link.queued;
			earlier = progress_link_due(due_, qp, at_ns);
			link.deferral = linked;  // not over a retry's time
		}
		if (!start_locked() || !earlier)
			return;
	}
	wake_.notify_one();
}

void Progress::forget(xsrc_qp *qp) noexcept
{
	std::unique_lock guard(lock_);
	// A pass over the QP that is under way relinks it when it ends: wait
	// for it first, then unlink, or the thread would come back to a QP
	// that is gone.
	idle_.wait(guard, [&] { return busy_ != qp; });
	unlink(qp);
}

void Progress::run() noexcept
{
	std::unique_lock guard(lock_);
	while (!stop_) {
		uint64_t now = xsrc_requester_now_ns();
		xsrc_qp *next = nullptr;
		uint64_t next_at = UINT64_MAX;
		for (xsrc_qp *qp = due_; qp; qp = qp->progress_link.next)
			if (qp->progress_link.at_ns < next_at) {
				next = qp;
				next_at = qp->progress_link.at_ns;
			}
		if (!next) {
			wake_.wait(guard);
			continue;
		}
		if (next_at > now) {
			wake_.wait_for(guard, std::chrono::nanoseconds(next_at - now));
			continue;
		}
		unlink(next);
		busy_ = next;
		guard.unlock();
		uint64_t again;
		{
			std::lock_guard sq(next->sq_lock);
			again = xsrc_requester_progress_due(next);
		}
		guard.lock();
		busy_ = nullptr;
		idle_.notify_all();
		if (again)
			progress_link_due(due_, next, again);
	}
}

}  // namespace xsrc

int xsrc_progress_prepare(xsrc_context *ctx) noexcept
{
	std::lock_guard guard(ctx->progress_lock);
	if (ctx->progress)
		return 0;
	ctx->progress.reset(new (std::nothrow) xsrc::Progress(ctx));
	if (!ctx->progress) {
		verbs_err(&ctx->ibv_ctx, "create_qp: no memory for the progress engine\n");
		return ENOMEM;
	}
	return 0;
}

namespace {

// The context's progress engine, made with its first send queue; null
// before. Taken under the context's lock, used without it (it lives as
// long as the context).
xsrc::Progress *progress_of(xsrc_context *ctx) noexcept
{
	std::lock_guard guard(ctx->progress_lock);
	return ctx->progress.get();
}

}  // namespace

void xsrc_progress_schedule(xsrc_context *ctx, xsrc_qp *qp, uint64_t at_ns) noexcept
{
	if (xsrc::Progress *p = progress_of(ctx))
		p->schedule(qp, at_ns);
}

void xsrc_progress_defer(xsrc_context *ctx, xsrc_qp *qp, uint64_t at_ns) noexcept
{
	if (xsrc::Progress *p = progress_of(ctx))
		p->defer(qp, at_ns);
}

void xsrc_progress_forget(xsrc_context *ctx, xsrc_qp *qp) noexcept
{
	if (xsrc::Progress *p = progress_of(ctx))
		p->forget(qp);
}
