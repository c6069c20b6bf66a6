// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
#include "progress.h"

#include <pthread.h>
#include <signal.h>

#include <chrono>

#include "xsrc.h"

namespace xsrc {

Progress::Progress(xsrc_context *ctx) : ctx_(ctx)
{
	// The application's signal handlers are not for us.
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	try {
		thread_ = std::thread([this] { run(); });
	} catch (...) {
		pthread_sigmask(SIG_SETMASK, &old, nullptr);
		throw;
	}
	pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

Progress::~Progress()
{
	{
		std::lock_guard guard(lock_);
		stop_ = true;
	}
	wake_.notify_one();
	thread_.join();
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
		return true;
	}
	link = {head, at_ns, true};
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
		if (!progress_link_due(due_, qp, at_ns))
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
			again = xsrc_requester_progress(next);
		}
		guard.lock();
		busy_ = nullptr;
		idle_.notify_all();
		if (again)
			progress_link_due(due_, next, again);
	}
}

}  // namespace xsrc

int xsrc_progress_start(xsrc_context *ctx) noexcept
{
	std::lock_guard guard(ctx->progress_lock);
	if (ctx->progress)
		return 0;
	try {
		ctx->progress = std::make_unique<xsrc::Progress>(ctx);
	} catch (...) {
		int err = xsrc_errno_of_current_exception();
		verbs_err(&ctx->ibv_ctx, "cannot start the progress thread: %s\n", strerror(err));
		return err;
	}
	return 0;
}

void xsrc_progress_schedule(xsrc_context *ctx, xsrc_qp *qp, uint64_t at_ns) noexcept
{
	std::unique_lock guard(ctx->progress_lock);
	xsrc::Progress *p = ctx->progress.get();  // started with the QP's send queue
	guard.unlock();
	if (p)
		p->schedule(qp, at_ns);
}

void xsrc_progress_forget(xsrc_context *ctx, xsrc_qp *qp) noexcept
{
	std::unique_lock guard(ctx->progress_lock);
	xsrc::Progress *p = ctx->progress.get();
	guard.unlock();
	if (p)
		p->forget(qp);
}
