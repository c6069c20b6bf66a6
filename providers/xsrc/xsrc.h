// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The xsrc provider's objects, shared by xsrc.cpp (device and context
// lifetime, channel pool) and verbs.cpp (the verbs and the ops table).
#pragma once

#include "verbs_private.h"

#include <xsrc-abi.h>

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <array>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "queues.h"

// Owns one file descriptor.
class unique_fd {
public:
	unique_fd() = default;
	explicit unique_fd(int fd) noexcept : fd_(fd) {}
	unique_fd(unique_fd &&other) noexcept : fd_(other.release()) {}
	unique_fd &operator=(unique_fd &&other) noexcept
	{
		reset(other.release());
		return *this;
	}
	~unique_fd() { reset(); }

	int get() const noexcept { return fd_; }
	int release() noexcept { return std::exchange(fd_, -1); }
	void reset(int fd = -1) noexcept
	{
		if (fd_ >= 0) {
			int saved = errno; // errors are reported after cleanup
			close(fd_);
			errno = saved;
		}
		fd_ = fd;
	}

private:
	int fd_ = -1;
};

struct pipe_fds {
	unique_fd rd;
	unique_fd wr;
};

// Returns 0 or errno.
int xsrc_make_pipe(pipe_fds &pipe);

// Unused completion-channel pipes the provider keeps registered.
constexpr uint32_t XSRC_CHANNEL_POOL_TARGET = 4;
static_assert(XSRC_CHANNEL_POOL_TARGET <= XSRC_MAX_CHANNEL_FDS);

struct xsrc_device {
	verbs_device ibv_dev;
	verbs_sysfs_dev *sysfs_dev;
};

// Read ends of the completion-channel pipes registered with the daemon. It
// hands them out FIFO, so the last `channel_pool_free` entries are still ours;
// the earlier ones belong to the application's comp channels.
struct xsrc_comp_channels {
	std::mutex lock;
	std::vector<int> read_fds; // registration order
};

namespace xsrc {
class Progress;
}

// The memory of this context that may be written on its behalf: its MRs
// with IBV_ACCESS_LOCAL_WRITE, kept in our own memory (the arena's MR table
// is anyone's to write). A payload that travels in a CQ ring is placed only
// inside one of them.
class xsrc_local_mrs {
public:
	void add(uint64_t addr, uint64_t length);
	void remove(uint64_t addr, uint64_t length);
	bool covers(uint64_t addr, uint64_t length) const;

private:
	struct span {
		uint64_t start, end; // [start, end)
	};
	mutable std::shared_mutex lock_;
	std::vector<span> spans_; // few per context
};

struct xsrc_context {
	verbs_context ibv_ctx; // libibverbs callocs the whole struct
	xsrc_comp_channels channels; // so this is constructed in place
	uint64_t context_id;
	uint32_t max_inline_data;
	xsrc::Arena arena;           // the device's shared memory
	pid_t pid;                   // ours as the device sees it: owner_pid of our QPs and MRs
	bool direct;                 // we may try peers' memory ourselves (same PID namespace)
	bool can_copy;               // the device moves bytes for us (XSRC_CMD_COPY)
	xsrc::PeerSet denied;        // peers whose memory process_vm_* refused us (EPERM)
	xsrc_local_mrs local_mrs;    // where CQ-ring payloads may be placed
	uint32_t port_mtu_bytes;     // UD messages may not exceed it
	std::mutex progress_lock;
	std::unique_ptr<xsrc::Progress> progress; // started on first need
};

struct xsrc_cq {
	verbs_cq vcq;
	ibv_wc polled; // the completion start_poll/next_poll stepped onto
	xsrc_cq_ring *ring;
	xsrc_cq_ring *old_ring;      // after a resize that moved the ring: drained first
	std::mutex poll_lock;        // the ring has a single consumer
};

struct xsrc_srq {
	verbs_srq vsrq;
	xsrc_recv_ring *ring;
	uint32_t srqn;
	uint32_t max_sge;
	std::mutex post_lock;        // the receive ring has one producer
};

struct xsrc_ah {
	ibv_ah ah;
	ibv_ah_attr attr;
	ibv_gid sgid;                // the GID at attr.grh.sgid_index
};

// A WQE's gather list: a few entries inline (no allocation on the fast
// path), more on the heap.
class xsrc_sge_list {
public:
	void assign(const ibv_sge *first, const ibv_sge *last)
	{
		size_t n = static_cast<size_t>(last - first);
		if (n <= small_.size()) {
			std::copy(first, last, small_.begin());
			big_.clear();
		} else {
			big_.assign(first, last);
		}
		size_ = n;
	}
	size_t size() const { return size_; }
	const ibv_sge *begin() const { return size_ <= small_.size() ? small_.data() : big_.data(); }
	const ibv_sge *end() const { return begin() + size_; }

private:
	std::array<ibv_sge, 4> small_{};
	std::vector<ibv_sge> big_;
	size_t size_ = 0;
};

// A send work request as the device keeps it until it has executed it.
struct xsrc_send_wqe {
	uint64_t wr_id = 0;
	ibv_wr_opcode opcode = IBV_WR_SEND;
	unsigned int flags = 0;          // IBV_SEND_*
	uint32_t imm_data = 0;           // network order
	xsrc_sge_list sge;
	std::vector<unsigned char> inline_data; // IBV_SEND_INLINE: copied at post
	uint64_t remote_addr = 0;
	uint32_t rkey = 0;
	uint64_t compare_add = 0;
	uint64_t swap = 0;
	xsrc_ah *ah = nullptr;           // UD
	uint32_t remote_qpn = 0;
	uint32_t remote_qkey = 0;
	uint32_t remote_srqn = 0;        // XRC
	// Retry state while the responder cannot take it (RNR, unreachable).
	int rnr_retries_left = -1;
	int retries_left = -1;
};

struct xsrc_qp {
	verbs_qp vqp;
	uint32_t qpn;
	xsrc_qp_entry *entry;        // in the arena: state, attributes
	xsrc_recv_ring *rq;          // null with an SRQ
	xsrc_cq *send_cq;
	xsrc_cq *recv_cq;
	xsrc_srq *srq;
	ibv_qp_type type;
	uint32_t max_send_wr, max_send_sge, max_recv_sge, max_inline_data;
	bool sq_sig_all;

	std::mutex rq_lock;              // the receive ring has one producer
	std::mutex sq_lock;              // post_send, the progress thread
	std::deque<xsrc_send_wqe> sq;    // posted, not yet executed (blocked)
	uint64_t retry_at_ns = 0;        // when the head of sq may be retried
	std::vector<xsrc_send_wqe> staged; // ibv_wr_* between wr_start and wr_complete
	int staged_error = 0;
};

// The casts below rely on these.
static_assert(std::is_standard_layout_v<xsrc_device> &&
	      offsetof(xsrc_device, ibv_dev.device) == 0);
static_assert(std::is_standard_layout_v<xsrc_context> &&
	      offsetof(xsrc_context, ibv_ctx) == 0);
static_assert(offsetof(xsrc_cq, vcq) == 0);

inline xsrc_device *to_xsrc_dev(ibv_device *dev)
{
	return reinterpret_cast<xsrc_device *>(dev);
}

// ibv_context is the last member of verbs_context, not the first.
inline xsrc_context *to_xsrc_ctx(ibv_context *ctx)
{
	return reinterpret_cast<xsrc_context *>(
		reinterpret_cast<char *>(ctx) -
		offsetof(xsrc_context, ibv_ctx.context));
}

inline xsrc_cq *to_xsrc_cq(ibv_cq *cq)
{
	return reinterpret_cast<xsrc_cq *>(cq);
}

inline xsrc_cq *to_xsrc_cq(ibv_cq_ex *cq)
{
	return reinterpret_cast<xsrc_cq *>(cq);
}

inline xsrc_qp *to_xsrc_qp(ibv_qp *qp)
{
	return reinterpret_cast<xsrc_qp *>(qp);
}

inline xsrc_qp *to_xsrc_qp(ibv_qp_ex *qp)
{
	return reinterpret_cast<xsrc_qp *>(qp);
}

inline xsrc_srq *to_xsrc_srq(ibv_srq *srq)
{
	return reinterpret_cast<xsrc_srq *>(srq);
}

inline xsrc_ah *to_xsrc_ah(ibv_ah *ah)
{
	return reinterpret_cast<xsrc_ah *>(ah);
}

// A command reported `free_now` unused channel pipes: register more until the
// pool holds XSRC_CHANNEL_POOL_TARGET again. Best effort, never fails.
void xsrc_channel_pool_refill(xsrc_context *ctx, uint32_t free_now);

void xsrc_free_context(ibv_context *ibctx);  // xsrc.cpp
extern const verbs_context_ops xsrc_ctx_ops; // verbs.cpp

// cq.cpp
ibv_cq *xsrc_create_cq(ibv_context *ibctx, int cqe, ibv_comp_channel *channel, int comp_vector);
ibv_cq_ex *xsrc_create_cq_ex(ibv_context *ibctx, ibv_cq_init_attr_ex *attr);
int xsrc_destroy_cq(ibv_cq *cq);
int xsrc_resize_cq(ibv_cq *cq, int cqe);
int xsrc_poll_cq(ibv_cq *cq, int num_entries, ibv_wc *wc);
int xsrc_req_notify_cq(ibv_cq *cq, int solicited_only);
void xsrc_cq_event(ibv_cq *cq);

// qp.cpp
ibv_qp *xsrc_create_qp(ibv_pd *pd, ibv_qp_init_attr *attr);
ibv_qp *xsrc_create_qp_ex(ibv_context *ibctx, ibv_qp_init_attr_ex *attr);
int xsrc_modify_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask);
int xsrc_query_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr);
int xsrc_destroy_qp(ibv_qp *qp);
int xsrc_post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr);
int xsrc_post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr);

// srq.cpp
ibv_srq *xsrc_create_srq(ibv_pd *pd, ibv_srq_init_attr *attr);
ibv_srq *xsrc_create_srq_ex(ibv_context *ibctx, ibv_srq_init_attr_ex *attr);
int xsrc_modify_srq(ibv_srq *srq, ibv_srq_attr *attr, int attr_mask);
int xsrc_query_srq(ibv_srq *srq, ibv_srq_attr *attr);
int xsrc_destroy_srq(ibv_srq *srq);
int xsrc_post_srq_recv(ibv_srq *srq, ibv_recv_wr *wr, ibv_recv_wr **bad_wr);
int xsrc_get_srq_num(ibv_srq *srq, uint32_t *srq_num);

// xrc.cpp
ibv_xrcd *xsrc_open_xrcd(ibv_context *ibctx, ibv_xrcd_init_attr *attr);
int xsrc_close_xrcd(ibv_xrcd *xrcd);
ibv_qp *xsrc_open_qp(ibv_context *ibctx, ibv_qp_open_attr *attr);

// ah.cpp
ibv_ah *xsrc_create_ah(ibv_pd *pd, ibv_ah_attr *attr);
int xsrc_destroy_ah(ibv_ah *ah);

// Posts one receive (num_sge already checked) to a ring whose single
// producer the caller is. False when the ring is full.
inline bool xsrc_recv_post(xsrc_recv_ring *ring, const ibv_recv_wr *wr)
{
	xsrc_sge sge[XSRC_MAX_RECV_SGE];
	for (int i = 0; i < wr->num_sge; ++i)
		sge[i] = {wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
	return xsrc::recv_push(ring, wr->wr_id, sge, static_cast<uint32_t>(wr->num_sge));
}

// transport.cpp: the device's engine.
// Queues (or executes) one send WQE on a QP whose sq_lock the caller holds.
void xsrc_sq_post(xsrc_qp *qp, xsrc_send_wqe &&wqe);
// Executes the blocked WQEs at the head of qp->sq whose time has come.
// Returns the time of the next retry (0 when the queue drained).
uint64_t xsrc_sq_progress(xsrc_qp *qp);
// Completes every queued WQE with IBV_WC_WR_FLUSH_ERR and drains the RQ.
void xsrc_qp_flush(xsrc_qp *qp);
// A completion for a CQ: pushes it and raises the event / overrun.
void xsrc_cq_complete(xsrc_context *ctx, xsrc_cq_ring *ring, uint64_t ring_off, const xsrc_cqe &cqe,
		      xsrc::CqPayload payload = {});
// XSRC_CMD_RAISE_EVENT through our command file.
void xsrc_raise(xsrc_context *ctx, uint32_t kind, uint64_t object);
uint64_t xsrc_now_ns();

// progress.cpp: wakes the progress thread for a QP with blocked work.
void xsrc_progress_schedule(xsrc_context *ctx, xsrc_qp *qp, uint64_t at_ns);
void xsrc_progress_forget(xsrc_context *ctx, xsrc_qp *qp);
