// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The progress engine: a thread per context that finishes work which could
// not finish when it was posted (RNR waits, unreachable peers), so that an
// application sleeping in ibv_get_cq_event still sees it complete.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

struct xsrc_context;
struct xsrc_qp;

namespace xsrc {

class Progress {
public:
	explicit Progress(xsrc_context *ctx);
	~Progress();  // stops and joins the thread
	Progress(const Progress &) = delete;
	Progress &operator=(const Progress &) = delete;

	void schedule(xsrc_qp *qp, uint64_t at_ns);
	void forget(xsrc_qp *qp);  // the QP is being destroyed

private:
	void run();

	xsrc_context *ctx_;
	std::mutex lock_;
	std::condition_variable wake_;
	std::map<xsrc_qp *, uint64_t> due_;  // QP -> when to retry it
	xsrc_qp *busy_ = nullptr;             // being progressed without lock_
	std::condition_variable idle_;
	bool stop_ = false;
	std::thread thread_;
};

}  // namespace xsrc
