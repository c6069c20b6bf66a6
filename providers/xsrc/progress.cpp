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
	thread_ = std::thread([this] { run(); });
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

void Progress::schedule(xsrc_qp *qp, uint64_t at_ns)
{
	{
		std::lock_guard guard(lock_);
		auto [it, fresh] = due_.emplace(qp, at_ns);
		if (!fresh && it->second <= at_ns)
			return;
		it->second = at_ns;
	}
	wake_.notify_one();
}

void Progress::forget(xsrc_qp *qp)
{
	std::unique_lock guard(lock_);
	due_.erase(qp);
	idle_.wait(guard, [&] { return busy_ != qp; });
}

void Progress::run()
{
	std::unique_lock guard(lock_);
	while (!stop_) {
		uint64_t now = xsrc_now_ns();
		xsrc_qp *next = nullptr;
		uint64_t next_at = UINT64_MAX;
		for (auto &[qp, at] : due_)
			if (at < next_at) {
				next = qp;
				next_at = at;
			}
		if (!next) {
			wake_.wait(guard);
			continue;
		}
		if (next_at > now) {
			wake_.wait_for(guard, std::chrono::nanoseconds(next_at - now));
			continue;
		}
		due_.erase(next);
		busy_ = next;
		guard.unlock();
		uint64_t again;
		{
			std::lock_guard sq(next->sq_lock);
			again = xsrc_sq_progress(next);
		}
		guard.lock();
		busy_ = nullptr;
		idle_.notify_all();
		if (again) {
			auto [it, fresh] = due_.emplace(next, again);
			if (!fresh && again < it->second)
				it->second = again;
		}
	}
}

}  // namespace xsrc

void xsrc_progress_schedule(xsrc_context *ctx, xsrc_qp *qp, uint64_t at_ns)
{
	std::unique_lock guard(ctx->progress_lock);
	if (!ctx->progress)
		ctx->progress = std::make_unique<xsrc::Progress>(ctx);
	xsrc::Progress *p = ctx->progress.get();
	guard.unlock();
	p->schedule(qp, at_ns);
}

void xsrc_progress_forget(xsrc_context *ctx, xsrc_qp *qp)
{
	std::unique_lock guard(ctx->progress_lock);
	xsrc::Progress *p = ctx->progress.get();
	guard.unlock();
	if (p)
		p->forget(qp);
}
