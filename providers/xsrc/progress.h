// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The progress engine: a thread per context that finishes work which could
// not finish when it was posted (RNR waits, unreachable peers), so that an
// application sleeping in ibv_get_cq_event still sees it complete. Started
// when the context's first send queue is made; scheduling a QP links it
// into an intrusive list (xsrc_qp::progress_link), so it never allocates.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

struct xsrc_context;
struct xsrc_qp;

namespace xsrc {

class Progress {
public:
	explicit Progress(xsrc_context *ctx);  // throws what std::thread throws
	~Progress();  // stops and joins the thread
	Progress(const Progress &) = delete;
	Progress &operator=(const Progress &) = delete;

	void schedule(xsrc_qp *qp, uint64_t at_ns) noexcept;
	void forget(xsrc_qp *qp) noexcept;  // the QP is being destroyed

private:
	void run() noexcept;
	void unlink(xsrc_qp *qp) noexcept;

	xsrc_context *ctx_;
	std::mutex lock_;
	std::condition_variable wake_;
	xsrc_qp *due_ = nullptr;              // QPs to retry, each with its time
	xsrc_qp *busy_ = nullptr;             // being progressed without lock_
	std::condition_variable idle_;
	bool stop_ = false;
	std::thread thread_;
};

}  // namespace xsrc
