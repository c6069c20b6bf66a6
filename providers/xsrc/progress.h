// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The progress engine: a thread per context that finishes work which could
// not finish when it was posted (RNR waits, unreachable peers), so that an
// application sleeping in ibv_get_cq_event still sees it complete. The
// object is made with the context's first send queue; its thread starts when
// work first blocks (pthread_create: no operator new, no exception), and a
// QP is scheduled by linking it into an intrusive list
// (xsrc_qp::progress_link): scheduling never allocates.
#pragma once

#include <pthread.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>

struct xsrc_context;
struct xsrc_qp;

namespace xsrc {

class Progress {
public:
	explicit Progress(xsrc_context *ctx) noexcept : ctx_(ctx) {}
	~Progress();  // stops and joins the thread, if it started
	Progress(const Progress &) = delete;
	Progress &operator=(const Progress &) = delete;

	void schedule(xsrc_qp *qp, uint64_t at_ns) noexcept;
	void defer(xsrc_qp *qp, uint64_t at_ns) noexcept;
	void forget(xsrc_qp *qp) noexcept;  // the QP is being destroyed

private:
	static void *thread_main(void *self) noexcept;
	void run() noexcept;
	void unlink(xsrc_qp *qp) noexcept;
	bool start_locked() noexcept;

	xsrc_context *ctx_;
	std::mutex lock_;
	std::condition_variable wake_;
	xsrc_qp *due_ = nullptr;              // QPs to retry, each with its time
	xsrc_qp *busy_ = nullptr;             // being progressed without lock_
	std::condition_variable idle_;
	bool stop_ = false;
	bool started_ = false;
	pthread_t thread_{};
};

}  // namespace xsrc
