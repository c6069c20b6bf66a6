// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The device's death: xsrcd gone (killed, crashed) while contexts are open.
// uverbs promises a disassociated context IBV_EVENT_DEVICE_FATAL, QPs in
// error with their work flushed, EIO from later posts and destroys, and no
// hang; this file keeps those promises for xsrc.
//
// A watch thread per context waits in epoll for the command file's POLLPRI,
// which it never has: the kernel's FUSE poll waits until the connection
// aborts, which is what the daemon's death does, and then reports POLLERR.
// epoll, not poll: a poll()ing thread holds a reference to the file, and
// the daemon would not see the context's release if the application closed
// cmd_fd under us (a crash-like exit of one process whose child holds it).
#include "xsrc.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>

#include <cstdlib>

#include "queues.h"

namespace xsrc {
namespace {

// The inode behind `fd`, 0 when there is none. From the kernel's cache
// (AT_STATX_DONT_SYNC): a FUSE getattr of a dead daemon's file fails.
ino_t file_inode(int fd)
{
	struct statx stx {};
	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_INO, &stx) < 0 || !(stx.stx_mask & STATX_INO))
		return 0;
	return stx.stx_ino;
}

}  // namespace

class DeathWatch {
public:
	explicit DeathWatch(xsrc_context *ctx) : ctx_(ctx) {}
	~DeathWatch();
	int start() noexcept;

private:
	static void *thread_main(void *self) noexcept;
	void run() noexcept;
	bool daemon_gone() const noexcept;

	xsrc_context *ctx_;
	unique_fd stop_;
	unique_fd epoll_;
	ino_t cmd_ino_ = 0;  // the command file: cmd_fd's number may name another file later
	pthread_t thread_{};
	bool started_ = false;
};

DeathWatch::~DeathWatch()
{
	if (!started_)
		return;
	uint64_t one = 1;
	if (write(stop_.get(), &one, sizeof(one)) != sizeof(one)) {
		// An eventfd takes one write below its limit: cannot fail here.
	}
	pthread_join(thread_, nullptr);
}

int DeathWatch::start() noexcept
{
	stop_.reset(eventfd(0, EFD_CLOEXEC));
	epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
	if (!stop_ || !epoll_)
		return errno;
	const int cmd_fd = ctx_->ibv_ctx.context.cmd_fd;
	if (!(cmd_ino_ = file_inode(cmd_fd)))
		return EBADF;
	epoll_event stop{EPOLLIN, {.u32 = 0}};
	epoll_event cmd{EPOLLPRI, {.u32 = 1}};
	if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, stop_.get(), &stop) < 0 ||
	    epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, cmd_fd, &cmd) < 0)
		return errno;
	int err = xsrc_start_thread(thread_, thread_main, this);
	started_ = err == 0;
	return err;
}

void *DeathWatch::thread_main(void *self) noexcept
{
	static_cast<DeathWatch *>(self)->run();
	return nullptr;
}

// A command the daemon would answer fails with ENOTCONN once it is gone.
// Asked only while cmd_fd still names our command file.
bool DeathWatch::daemon_gone() const noexcept
{
	const int cmd_fd = ctx_->ibv_ctx.context.cmd_fd;
	if (file_inode(cmd_fd) != cmd_ino_)
		return false;
	uint32_t free_count;
	int err = xsrc_channel_pool_query(cmd_fd, free_count);
	return err == ENOTCONN || err == ECONNABORTED;
}

void DeathWatch::run() noexcept
{
	for (;;) {
		epoll_event ev{};
		int n = epoll_wait(epoll_.get(), &ev, 1, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			verbs_err(&ctx_->ibv_ctx, "device watch: epoll_wait failed, not watching: %s\n", strerror(errno));
			return;
		}
		if (n == 0 || ev.data.u32 == 0)
			return;  // stopped
		if (ev.events & (EPOLLERR | EPOLLHUP) && daemon_gone()) {
			xsrc_device_died(ctx_);
			return;
		}
		// The daemon answered after all (or reported POLLPRI, which no xsrcd
		// does): ask again a little later rather than spin.
		pollfd stop = {stop_.get(), POLLIN, 0};
		if (poll(&stop, 1, 100) > 0)
			return;
	}
}

void DeathWatchDeleter::operator()(DeathWatch *watch) const noexcept
{
	delete watch;
}

}  // namespace xsrc

void xsrc_context_add_qp(xsrc_context *ctx, xsrc_qp *qp) noexcept
{
	std::lock_guard guard(ctx->qps_lock);
	qp->ctx_prev = nullptr;
	qp->ctx_next = ctx->qps;
	if (ctx->qps)
		ctx->qps->ctx_prev = qp;
	ctx->qps = qp;
	// Made while the device died: it fails with the rest.
	if (xsrc_device_gone(ctx))
		xsrc::qp_state_store(*qp->entry, IBV_QPS_ERR);
}

void xsrc_context_remove_qp(xsrc_context *ctx, xsrc_qp *qp) noexcept
{
	std::lock_guard guard(ctx->qps_lock);
	if (qp->ctx_prev)
		qp->ctx_prev->ctx_next = qp->ctx_next;
	else if (ctx->qps == qp)
		ctx->qps = qp->ctx_next;
	if (qp->ctx_next)
		qp->ctx_next->ctx_prev = qp->ctx_prev;
	qp->ctx_prev = qp->ctx_next = nullptr;
}

int xsrc_death_watch_start(xsrc_context *ctx) noexcept
{
	std::unique_ptr<xsrc::DeathWatch, xsrc::DeathWatchDeleter> watch(new (std::nothrow) xsrc::DeathWatch(ctx));
	if (!watch)
		return ENOMEM;
	if (int err = watch->start())
		return err;
	ctx->death_watch = std::move(watch);
	return 0;
}

void xsrc_device_died(xsrc_context *ctx) noexcept
{
	if (ctx->device_dead.exchange(true))
		return;
	verbs_err(&ctx->ibv_ctx, "the device is gone (xsrcd died): its QPs go to error, DEVICE_FATAL follows\n");
	{
		std::lock_guard guard(ctx->qps_lock);
		for (xsrc_qp *qp = ctx->qps; qp; qp = qp->ctx_next) {
			// The state first: a poller that sees a flush finds the QP in ERR.
			xsrc::qp_state_store(*qp->entry, IBV_QPS_ERR);
			std::lock_guard sq(qp->sq_lock);
			xsrc_requester_flush(qp);
		}
	}
	// The daemon held the other write end and is gone: ours alone decides
	// whether a full pipe blocks, and it must not.
	ib_uverbs_async_event_desc ev{};
	ev.event_type = IBV_EVENT_DEVICE_FATAL;
	int fd = ctx->async_wr.get();
	if (fd < 0 || fcntl(fd, F_SETFL, O_NONBLOCK) < 0 || write(fd, &ev, sizeof(ev)) != sizeof(ev))
		verbs_err(&ctx->ibv_ctx, "cannot queue IBV_EVENT_DEVICE_FATAL: %s\n",
			  fd < 0 ? "no async pipe" : strerror(errno));
}

int xsrc_destroy_status(xsrc_context *ctx, int err) noexcept
{
	if (!err)
		return 0;
	if (err == ENOTCONN || err == ECONNABORTED || xsrc_device_gone(ctx))
		err = EIO;
	// libibverbs' own rule for a disassociated device (ibv_destroy_qp(3)).
	if (err == EIO && getenv("RDMAV_ALLOW_DISASSOC_DESTROY"))
		return 0;
	return err;
}
