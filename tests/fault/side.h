// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// One participant of a fault test: a context on xsrc0 with a PD, CQs, an RC
// QP (or XRC: a send QP, and a receive QP with an XRC SRQ for the peer's
// sends) and a registered buffer, and the verbs the workloads post.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "harness/qp_connect.h"

namespace xsrc::fault {

using ms = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Nothing may block longer than this after a fault (issue 16).
inline constexpr ms kBound{2000};

// What the peer needs to reach us.
struct Info {
	uint32_t qpn = 0;
	ibv_gid gid{};
	uint64_t addr = 0;
	uint32_t rkey = 0;
	uint32_t xrc_recv_qpn = 0;  // XRC: the receive QP and SRQ its sends target
	uint32_t srqn = 0;
};

enum class Op : int { send, write, read, fetch_add, cmp_swap, count };
const char *op_name(Op op);

struct Side {
	static constexpr size_t kBufBytes = 4096;
	static constexpr int kRecvs = 16;

	ibv_context *ctx = nullptr;
	ibv_comp_channel *channel = nullptr;  // on the receive CQ, when asked for
	ibv_pd *pd = nullptr;
	ibv_cq *send_cq = nullptr;
	ibv_cq *recv_cq = nullptr;
	ibv_qp *qp = nullptr;          // RC, or the XRC send QP
	ibv_xrcd *xrcd = nullptr;      // XRC only, as the next two
	ibv_srq *srq = nullptr;
	ibv_qp *xrc_recv = nullptr;
	ibv_mr *mr = nullptr;
	rdma_cm_id *cm_id = nullptr;   // its QP is the id's (rdma_create_qp), its context librdmacm's
	std::vector<uint64_t> buf = std::vector<uint64_t>(kBufBytes / 8);

	Side() = default;
	Side(const Side &) = delete;
	Side &operator=(const Side &) = delete;
	~Side() { teardown(); }

	// Opens xsrc0 and makes everything; false with errno and a message on stderr.
	bool open(bool with_channel, bool xrc = false);
	// Makes everything on the context of `id` (librdmacm's: not ours to
	// close), the RC QP through rdma_create_qp; false with a message.
	bool open_on(rdma_cm_id *id);
	Info info() const;
	// RTS towards `peer`; retries fast, so a dead peer is found within a few ms.
	bool connect(const Info &peer);
	int post_recv(uint64_t wr_id);
	int post_op(Op op, const Info &peer, uint64_t wr_id, bool signaled = true);
	// Destroys what exists in reverse order; the first error (0: none).
	int teardown();
};

// Open fds of this process.
int open_fd_count();
// Waits up to `timeout` for an async event; its type, or -1 when none came.
int wait_async_event(ibv_context *ctx, ms timeout);
// Polls one completion of `cq` for up to `timeout`; false when none came.
bool poll_one(ibv_cq *cq, ibv_wc &wc, ms timeout);

}  // namespace xsrc::fault
