// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The xsrc provider's objects and the functions its files call in one
// another: xsrc.cpp (device and context lifetime, channel pool), verbs.cpp
// (the ops table, PDs, MRs), cq.cpp, qp.cpp, qp_wr.cpp, srq.cpp, xrc.cpp,
// ah.cpp; the data path behind transport.h.
#pragma once

#include "verbs_private.h"

#include <infiniband/tm_types.h>

#include <ctime>
#include <xsrc-abi.h>

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <atomic>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <system_error>
#include <type_traits>
#include <vector>

#include "buf.h"
#include "peer_shm.h"
#include "common/fd.h"
#include "common/ids.h"
#include "queues.h"
#include "recv_shadow.h"
#include "send_queue.h"
#include "transport.h"
#include "wire/sender.h"
#include "wire_rc.h"

struct pipe_fds {
	xsrc::unique_fd rd;
	xsrc::unique_fd wr;
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
	std::vector<ino_t> pipes;  // each one's pipe: which fds are still ours once the daemon is gone
};

namespace xsrc {
class Progress;
class RawPort;
class DeathWatch;
// Stops and joins the watch thread (device_death.cpp).
struct DeathWatchDeleter {
	void operator()(DeathWatch *watch) const noexcept;
};
}

// The memory of this context that may be written on its behalf: its MRs
// with IBV_ACCESS_LOCAL_WRITE, kept in our own memory (the arena's MR table
// is anyone's to write). A payload that travels in a CQ ring is placed only
// inside one of them.
class xsrc_local_mrs {
public:
	// Throws std::bad_alloc (reg_mr catches it).
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

// This context's on-demand-paging MRs, kept in our own memory (the arena's
// MR table does not say which ibv_pd an lkey belongs to): what
// ibv_advise_mr checks its SGEs against (odp.cpp).
class xsrc_odp_mrs {
public:
	struct mr {
		uint32_t lkey;
		const ibv_pd *pd;
		uint64_t iova, length, addr;
		bool writable;
	};
	// Throws std::bad_alloc (reg_mr catches it).
	void add(const mr &m);
	void remove(uint32_t lkey);
	bool find(uint32_t lkey, mr &out) const;

private:
	mutable std::shared_mutex lock_;
	std::vector<mr> mrs_; // few per context
};

// libibverbs callocs the whole struct: every member after ibv_ctx that has a
// constructor is constructed in place when the context is made and destroyed
// with it (xsrc.cpp: xsrc_context_construct, context_deleter); the scalars
// start zeroed.
struct xsrc_context {
	verbs_context ibv_ctx;
	xsrc_comp_channels channels;
	uint32_t max_inline_data;
	xsrc::Arena arena;           // the device's shared memory
	pid_t pid;                   // ours as the device sees it: owner_pid of our QPs and MRs
	uint64_t context_id;         // the device's id of our command file's context (an imported context shares it)
	bool direct;                 // we may try peers' memory ourselves (same PID namespace)
	bool can_copy;               // the device moves bytes for us (XSRC_CMD_COPY)
	uint32_t driver_abi;         // the revision the device serves
	// r10: the arena header's eager_heads when our CQs may publish their
	// heads lazily (xsrc-queues.h, xsrc_cq_ring); else null.
	const uint32_t *cq_eager_heads;
	xsrc::PeerSet denied;        // peers whose memory process_vm_* refused us (EPERM)
	xsrc_local_mrs local_mrs;    // where CQ-ring payloads may be placed
	xsrc_odp_mrs odp_mrs;        // what ibv_advise_mr may name
	xsrc_shm_maps shm_maps;      // peers' SysV segments attached here (peer_shm.h)
	uint32_t port_mtu_bytes;     // UD messages may not exceed it
	const xsrc_transport *transport; // the engine that carries our QPs' messages
	xsrc_wire_sender wire;       // sockets of the wire engine (wire/sender.h)
	// RC on the wire: the response socket and its thread (wire_rc.h), made
	// with the first RC QP whose path leads to another host.
	std::unique_ptr<xsrc::WireEngine, xsrc::WireEngineDeleter> wire_engine;
	std::atomic<xsrc::WireEngine *> wire_live; // wire_engine once it runs: what poll_cq looks at
	xsrc_mcast_table *mcast;     // r3: the device's multicast groups; null: no multicast
	std::mutex progress_lock;
	std::unique_ptr<xsrc::Progress> progress; // made with the first send queue
	std::mutex qps_lock;
	struct xsrc_qp *qps;         // our QPs (xsrc_qp::ctx_next): what a device death fails
	// Some QP may wait for a peer's receive (xsrc_qp::rnr_rq): poll_cq looks.
	std::atomic<bool> rnr_waiting;
	xsrc::unique_fd async_wr;    // our own write end of the async pipe (DEVICE_FATAL)
	std::atomic<bool> device_dead; // xsrcd died: posts fail with EIO (device_death.cpp)
	std::unique_ptr<xsrc::DeathWatch, xsrc::DeathWatchDeleter> death_watch;
	std::mutex raw_lock;
	std::unique_ptr<xsrc::RawPort> raw;  // made with the first raw packet QP (raw_packet.h)
};

// Completions of a QP reset after they were written: positions below `until`.
struct xsrc_cq_discard {
	const xsrc_cq_ring *ring;
	uint32_t qpn;
	uint64_t until;
};

// A PD, or a parent domain over one (parent_domain.cpp). A parent domain
// has the PD's handle, so every command sees the real PD; the daemon never
// learns of it.
struct xsrc_pd {
	ibv_pd pd;
	xsrc_pd *protection_domain = nullptr;  // a parent domain's PD; null: this is a PD
	// 1 + what holds this one: the parent domains over a PD; the QPs, SRQs
	// and CQs made through a parent domain. Deallocation waits for 1 (EBUSY).
	std::atomic<uint32_t> refcount{1};
};

struct xsrc_td {
	ibv_td td;
	std::atomic<uint32_t> refcount{1};  // 1 + the parent domains holding it
};

struct xsrc_parent_domain {
	xsrc_pd xpd;
	xsrc_td *td = nullptr;
	xsrc_allocator allocator;  // alloc null: none given
};

static_assert(offsetof(xsrc_pd, pd) == 0 && offsetof(xsrc_parent_domain, xpd) == 0 &&
	      offsetof(xsrc_td, td) == 0);

inline xsrc_pd *to_xsrc_pd(ibv_pd *pd)
{
	return reinterpret_cast<xsrc_pd *>(pd);
}

// Null unless `pd` is a parent domain.
inline xsrc_parent_domain *to_xsrc_parent_domain(ibv_pd *pd)
{
	xsrc_pd *xpd = pd ? to_xsrc_pd(pd) : nullptr;
	return xpd && xpd->protection_domain ? reinterpret_cast<xsrc_parent_domain *>(xpd) : nullptr;
}

// Its allocator, or null (the heap).
inline const xsrc_allocator *xsrc_pd_allocator(const xsrc_parent_domain *pd)
{
	return pd && pd->allocator.alloc ? &pd->allocator : nullptr;
}

// An object made through a parent domain holds it; null does nothing.
inline void xsrc_parent_domain_hold(xsrc_parent_domain *pd)
{
	if (pd)
		pd->xpd.refcount.fetch_add(1, std::memory_order_relaxed);
}

inline void xsrc_parent_domain_release(xsrc_parent_domain *pd)
{
	if (pd)
		pd->xpd.refcount.fetch_sub(1, std::memory_order_release);
}

// A lock that objects created under a thread domain go without: the
// application uses them from one thread at a time (ibv_alloc_td(3)). Locks
// the provider's own threads take as well are plain mutexes.
class xsrc_td_lock {
public:
	// Before the object is visible to the application.
	void waive() noexcept { waived_ = true; }
	bool waived() const noexcept { return waived_; }
	void lock()
	{
		if (!waived_)
			mutex_.lock();
	}
	void unlock()
	{
		if (!waived_)
			mutex_.unlock();
	}

private:
	std::mutex mutex_;
	bool waived_ = false;
};

struct xsrc_cq {
	verbs_cq vcq;
	ibv_wc polled; // the completion start_poll/next_poll stepped onto
	ibv_wc_tm_info polled_tm;    // its tag and app_ctx (XSRC_CQE_TM_INFO), else zero
	uint64_t polled_ts;          // its free-running / wall-clock time in ns, if the CQ asked
	uint64_t wc_flags;           // ibv_cq_init_attr_ex::wc_flags (0 for ibv_create_cq)
	xsrc::CqConsumer consumer;   // of the ring (cq.cpp)
	xsrc::CqConsumer old;        // after a resize that moved the ring: drained first; else no ring
	std::vector<xsrc_cq_discard> discards;  // under poll_lock
	xsrc_td_lock poll_lock;      // the ring has a single consumer
	xsrc_parent_domain *parent_domain; // IBV_CQ_INIT_ATTR_MASK_PD, else null
	// Polls so far: a QP that posts twice with no poll between is streaming
	// (requester.cpp defers its small WQEs into batches).
	std::atomic<uint64_t> polls{0};
	// Where the next completion lands, for a poll that looks before it
	// locks (cq.cpp: cq_looks_empty); 0: the lock decides. Under poll_lock.
	std::atomic<uint64_t> peek{0};
	// The receive queue that our QP reply.qpn (one whose receives complete
	// here) last sent a message into: the addresses of its head and of the
	// slot its next receive takes. A message received is often answered; a
	// poll that takes one of that QP's asks for those lines, which the peer
	// wrote last, while the application still works on what it received
	// (cq.cpp: cq_expect_reply). Written by the sender, on a line of its own
	// (the poller's fields above are another thread's). Stale addresses
	// cost nothing: a prefetch never faults.
	struct alignas(64) {
		std::atomic<uint32_t> qpn{0};
		std::atomic<const void *> head{nullptr};
		std::atomic<const void *> slot{nullptr};
	} reply;

	xsrc_cq_ring *ring() const { return consumer.ring(); }  // where completions go
};

// shm_responder.cpp: our QP `qpn` consumed the receive at `pos` of the
// peer's queue `rq`; its receives complete on `cq`.
inline void xsrc_cq_note_reply_path(xsrc_cq *cq, xsrc::Qpn qpn, xsrc_recv_ring *rq, uint64_t pos) noexcept
{
	cq->reply.qpn.store(qpn.value(), std::memory_order_relaxed);
	cq->reply.head.store(&rq->head, std::memory_order_relaxed);
	cq->reply.slot.store(xsrc::recv_slot(rq, pos + 1), std::memory_order_relaxed);
}

struct xsrc_srq {
	verbs_srq vsrq;
	xsrc_recv_ring *ring;
	xsrc::RecvShape ring_shape;  // read once, when made
	xsrc::Srqn srqn;
	uint32_t max_sge;
	xsrc_td_lock post_lock;      // the receive ring has one producer
	xsrc_parent_domain *parent_domain; // made through one, else null
	xsrc_tm_table *tm;           // a tag-matching SRQ's tag table (tm.cpp), else null
	xsrc_rq_shadow shadow;     // the receives posted, privately (r9)
	xsrc_cq *tm_cq;              // where its list operations complete
};

struct xsrc_ah {
	ibv_ah ah;
	ibv_ah_attr attr;
	ibv_gid sgid;                // the GID at attr.grh.sgid_index
	uint32_t sgid_ifindex;       // its netdev (a link-local address's scope), or 0
	const xsrc_transport *engine; // reaches attr.grh.dgid (route.cpp)
	bool multicast;              // attr.grh.dgid is a multicast group (mcast.cpp)
};

struct xsrc_rss;

// shm_responder.cpp: what a batch of WQEs (transport.h) works in.
struct xsrc_batch_scratch;
void xsrc_batch_scratch_free(xsrc_batch_scratch *scratch) noexcept;
struct xsrc_batch_scratch_deleter {
	void operator()(xsrc_batch_scratch *scratch) const noexcept { xsrc_batch_scratch_free(scratch); }
};

struct xsrc_qp {
	verbs_qp vqp;
	xsrc::Qpn qpn;
	xsrc_qp_entry *entry;        // in the arena: state, attributes
	const xsrc_transport *engine = nullptr; // towards the RTR path's GID; null: the context's
	xsrc_recv_ring *rq;          // null with an SRQ
	xsrc::RecvShape rq_shape;    // read once, when made
	xsrc_rq_shadow rq_shadow;  // the receives posted to rq, privately (r9)
	xsrc_cq *send_cq;
	xsrc_cq *recv_cq;
	xsrc_srq *srq;
	xsrc_rss *rss = nullptr;     // a hash QP's table, key and fields (rss.cpp)
	ibv_qp_type type;
	uint32_t max_send_wr, max_send_sge, max_recv_sge, max_inline_data;
	bool sq_sig_all;
	uint32_t wire_psn = 0;       // the next PSN of a UD packet on the wire
	// A rendezvous this QP sent was matched and its data read: the FIN the
	// responder sends back lands after our SEND's own completion (tm.h).
	struct {
		bool pending = false;
		uint32_t from_qpn = 0;
		ibv_tmh tmh{};
	} tm_fin;
	xsrc_wire_qp *wire = nullptr; // RC/UC to another host: PSNs, messages in flight (wire_rc.cpp)

	xsrc_parent_domain *parent_domain = nullptr; // made through one: its allocator, its TD
	xsrc_td_lock rq_lock;            // the receive ring has one producer
	std::mutex sq_lock;              // post_send, the progress thread
	xsrc_send_queue sq;              // posted, not yet executed (blocked)
	uint64_t retry_at_ns = 0;        // when the head of sq may be retried
	// The peer receive queue the blocked head waits on (RNR, a held UD
	// datagram), else null: a receive posted there retries it early.
	xsrc_recv_ring *rnr_rq = nullptr;
	bool destroying = false;         // under sq_lock: no early retry may schedule it again
	// sq holds deferred WQEs (none blocked): retry_at_ns is 0 then.
	uint64_t send_cq_polls_seen = UINT64_MAX; // send_cq->polls at the last post
	uint64_t deferred_due_ns = 0;    // when the progress thread runs the deferred WQEs
	bool defer_streaming = false;    // a post ended the last batch; none waited out its deadline since
	uint32_t defer_holdoff = 0;      // posts that may not be deferred (a ping-pong was seen)
	std::unique_ptr<xsrc_batch_scratch, xsrc_batch_scratch_deleter> batch; // under sq_lock (shm_responder.cpp)

	// ibv_wr_* between wr_start and wr_complete (qp_wr.cpp): up to
	// max_send_wr + 1 staged WQEs (one more always fails), then a scratch
	// slot that takes what no one will read.
	xsrc_wqe_slots staged;
	size_t staged_count = 0;
	xsrc_send_wqe *wr_current = nullptr; // what wr_set_* fill
	int staged_error = 0;

	// On the context's list (under its qps_lock) from creation until destroyed.
	xsrc_qp *ctx_prev = nullptr, *ctx_next = nullptr;

	// Owned by xsrc::Progress under its lock: no allocation to schedule.
	struct {
		xsrc_qp *next = nullptr;
		uint64_t at_ns = 0;
		bool queued = false;
		bool deferral = false;  // at_ns is a deferred batch's deadline, nothing earlier
	} progress_link;
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
// XSRC_CMD_CHANNEL_POOL without registering: how many pooled pipes are
// unused. Also the cheapest question to ask whether the daemon is there.
int xsrc_channel_pool_query(int cmd_fd, uint32_t &free_count);

// device_death.cpp: when xsrcd dies, as uverbs after a disassociation, each
// context's QPs go to error and flush, IBV_EVENT_DEVICE_FATAL reaches its
// async fd, and posts fail with EIO; CQ event sleepers wake as their channel
// pipes (whose write ends only the daemon held) close.
void xsrc_context_add_qp(xsrc_context *ctx, xsrc_qp *qp) noexcept;
void xsrc_context_remove_qp(xsrc_context *ctx, xsrc_qp *qp) noexcept;
int xsrc_death_watch_start(xsrc_context *ctx) noexcept;  // 0 or errno
void xsrc_device_died(xsrc_context *ctx) noexcept;
// What a destroy verb returns for `err` from its command: EIO when the device
// is gone (0 under RDMAV_ALLOW_DISASSOC_DESTROY: the caller then frees).
int xsrc_destroy_status(xsrc_context *ctx, int err) noexcept;

inline bool xsrc_device_gone(const xsrc_context *ctx) noexcept
{
	return ctx->device_dead.load(std::memory_order_relaxed);
}
extern const verbs_context_ops xsrc_ctx_ops; // verbs.cpp

// cq.cpp
ibv_cq *xsrc_create_cq(ibv_context *ibctx, int cqe, ibv_comp_channel *channel, int comp_vector);
ibv_cq_ex *xsrc_create_cq_ex(ibv_context *ibctx, ibv_cq_init_attr_ex *attr);
int xsrc_destroy_cq(ibv_cq *cq);
int xsrc_resize_cq(ibv_cq *cq, int cqe);
int xsrc_poll_cq(ibv_cq *cq, int num_entries, ibv_wc *wc) noexcept;
int xsrc_req_notify_cq(ibv_cq *cq, int solicited_only);
void xsrc_cq_event(ibv_cq *cq);
void xsrc_cq_clean(xsrc_cq *cq, xsrc::Qpn qpn) noexcept;

// qp.cpp
ibv_qp *xsrc_create_qp(ibv_pd *pd, ibv_qp_init_attr *attr);
ibv_qp *xsrc_create_qp_ex(ibv_context *ibctx, ibv_qp_init_attr_ex *attr);
int xsrc_modify_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask);
int xsrc_query_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr);
int xsrc_destroy_qp(ibv_qp *qp);
int xsrc_post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr) noexcept;
int xsrc_post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) noexcept;

// srq.cpp
ibv_srq *xsrc_create_srq(ibv_pd *pd, ibv_srq_init_attr *attr);
ibv_srq *xsrc_create_srq_ex(ibv_context *ibctx, ibv_srq_init_attr_ex *attr);
int xsrc_modify_srq(ibv_srq *srq, ibv_srq_attr *attr, int attr_mask);
int xsrc_query_srq(ibv_srq *srq, ibv_srq_attr *attr);
int xsrc_destroy_srq(ibv_srq *srq);
int xsrc_post_srq_recv(ibv_srq *srq, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) noexcept;
int xsrc_get_srq_num(ibv_srq *srq, uint32_t *srq_num);

// parent_domain.cpp: thread domains and parent domains.
ibv_td *xsrc_alloc_td(ibv_context *ibctx, ibv_td_init_attr *attr);
int xsrc_dealloc_td(ibv_td *td);
ibv_pd *xsrc_alloc_parent_domain(ibv_context *ibctx, ibv_parent_domain_init_attr *attr);
int xsrc_dealloc_parent_domain(xsrc_parent_domain *pd);

// xrc.cpp
ibv_xrcd *xsrc_open_xrcd(ibv_context *ibctx, ibv_xrcd_init_attr *attr);
int xsrc_close_xrcd(ibv_xrcd *xrcd);
ibv_qp *xsrc_open_qp(ibv_context *ibctx, ibv_qp_open_attr *attr);

// raw_packet.cpp: raw packet QPs and the flows that steer frames to them.
extern const xsrc_transport xsrc_raw_transport;
// Opens the context's RawPort (its netdev's packet socket) if not yet open.
int xsrc_raw_prepare(xsrc_context *ctx);
bool xsrc_raw_qp_has_flows(xsrc_context *ctx, const xsrc_qp *qp);
void xsrc_raw_receive(xsrc_context *ctx, xsrc_qp *qp, const uint8_t *frame, size_t len) noexcept;
// One frame into the buffers of `rwqe` (its lkeys checked against `pd`),
// then its completion on `cq`.
void xsrc_raw_scatter(xsrc_context *ctx, const xsrc::RecvWqe &rwqe, xsrc::PdId pd, const uint8_t *frame, size_t len,
		      xsrc_cq_ring *cq, xsrc::Qpn qpn) noexcept;

// rss.cpp: receive WQs, indirection tables and hash QPs over raw packet QPs.
constexpr size_t XSRC_RSS_KEY_MAX = 40;  // a Toeplitz key, as NICs take
ibv_wq *xsrc_create_wq(ibv_context *ibctx, ibv_wq_init_attr *attr);
int xsrc_modify_wq(ibv_wq *wq, ibv_wq_attr *attr);
int xsrc_destroy_wq(ibv_wq *wq);
ibv_rwq_ind_table *xsrc_create_rwq_ind_table(ibv_context *ibctx, ibv_rwq_ind_table_init_attr *attr);
int xsrc_destroy_rwq_ind_table(ibv_rwq_ind_table *table);
// Checks a hash QP's RX_HASH / IND_TABLE attributes and turns `attr` into
// the device's QP behind it (raw, no queues). Returns 0 or an errno.
int xsrc_rss_prepare(xsrc_context *ctx, ibv_qp_init_attr_ex &attr, xsrc_rss *&out);
void xsrc_rss_bind(xsrc_rss *rss);     // the QP exists: its table is in use
void xsrc_rss_release(xsrc_rss *rss);  // null: nothing
void xsrc_rss_receive(xsrc_context *ctx, xsrc_qp *qp, const uint8_t *frame, size_t len) noexcept;
ibv_flow *xsrc_create_flow(ibv_qp *qp, ibv_flow_attr *attr);
int xsrc_destroy_flow(ibv_flow *flow);

// ah.cpp
ibv_ah *xsrc_create_ah(ibv_pd *pd, ibv_ah_attr *attr);
int xsrc_destroy_ah(ibv_ah *ah);

// mcast.cpp: UD multicast (driver ABI r3). The daemon keeps the groups; a
// sender reads their members from the arena's table.
int xsrc_attach_mcast(ibv_qp *qp, const ibv_gid *gid, uint16_t lid);
// odp.cpp: on-demand paging. advise_mr checks its SGEs name ODP MRs of `pd`
// and, for a synchronous prefetch, faults the pages in.
int xsrc_advise_mr(ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags, ibv_sge *sg_list,
		   uint32_t num_sge);
// Whether every page of our [addr, addr+len) is mapped now (an ODP MR's
// pages may not be): the data path checks before it touches them.
bool xsrc_odp_mapped(uint64_t addr, uint64_t len) noexcept;
int xsrc_detach_mcast(ibv_qp *qp, const ibv_gid *gid, uint16_t lid);
// The members of group `gid` on the device, each once: copied into `out`,
// their number returned (0: no such group, or no multicast).
size_t xsrc_mcast_members(const xsrc_context *ctx, const ibv_gid &gid,
			  uint32_t (&out)[XSRC_MCAST_GROUP_QPS]) noexcept;

// Posts one receive (num_sge already checked) to a ring of `shape` whose
// single producer the caller is. False when the ring is full.
// `shadow` records it in our private memory first (recv_shadow.h).
inline bool xsrc_recv_post(xsrc_recv_ring *ring, const xsrc::RecvShape &shape, xsrc_rq_shadow &shadow,
			   const ibv_recv_wr *wr)
{
	xsrc_sge sge[XSRC_MAX_RECV_SGE];
	for (int i = 0; i < wr->num_sge; ++i)
		sge[i] = {wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
	return xsrc::recv_push(ring, shape, wr->wr_id, sge, static_cast<uint32_t>(wr->num_sge),
			       [&](uint64_t pos) { shadow.record(pos, *wr); });
}

// The receive ring at `off` (a QP's or an SRQ's, ours or a peer's), its
// shape read once into `shape`: null when that shape does not fit the arena
// (its header is anyone's to write).
inline xsrc_recv_ring *xsrc_recv_ring_at(const xsrc::Arena &arena, uint64_t off, xsrc::RecvShape &shape)
{
	auto *ring = arena.at<xsrc_recv_ring>(off);
	if (!ring)
		return nullptr;
	shape = xsrc::recv_shape(ring);
	return xsrc::recv_shape_fits(shape, arena.size - off) ? ring : nullptr;
}

// The same for the CQ ring at `off`: its entries and payload slots checked
// (its big pool is checked apart: cq_big_pool_sane).
inline xsrc_cq_ring *xsrc_cq_ring_at(const xsrc::Arena &arena, uint64_t off, xsrc::CqShape &shape)
{
	auto *ring = arena.at<xsrc_cq_ring>(off);
	if (!ring)
		return nullptr;
	shape = xsrc::cq_shape(ring);
	return xsrc::cq_shape_fits(shape, arena.size - off) ? ring : nullptr;
}

// cq.cpp: a completion for a CQ (ring_off 0: computed): pushes it and
// raises the event / overrun. Nothing when the ring's shape, read from its
// header once, does not fit the arena.
void xsrc_cq_complete(xsrc_context *ctx, xsrc_cq_ring *ring, uint64_t ring_off, const xsrc_cqe &cqe,
		      xsrc::CqPayload payload = {}) noexcept;
// The same by a shape read before and checked to fit the arena
// (xsrc_cq_ring_at: the one a big slot was claimed by).
void xsrc_cq_complete(xsrc_context *ctx, xsrc_cq_ring *ring, const xsrc::CqShape &shape, uint64_t ring_off,
		      const xsrc_cqe &cqe, xsrc::CqPayload payload) noexcept;

inline xsrc_cqe xsrc_make_cqe(uint64_t wr_id, ibv_wc_status status, ibv_wc_opcode opcode, xsrc::Qpn qpn)
{
	xsrc_cqe c{};
	c.wr_id = wr_id;
	c.status = status;
	c.opcode = opcode;
	c.qp_num = qpn.value();
	return c;
}

// The header of a private command written to cmd_fd: sizes in the uverbs
// write ABI's 4-byte words.
inline void xsrc_cmd_header(ib_uverbs_cmd_hdr &hdr, uint32_t command, size_t in_bytes, size_t out_bytes)
{
	constexpr size_t kWordBytes = 4;
	hdr.command = command;
	hdr.in_words = static_cast<__u16>(in_bytes / kWordBytes);
	hdr.out_words = static_cast<__u16>(out_bytes / kWordBytes);
}

// A private command with a response: `body` (its `response` set here) after
// the header, `resp` filled by the device. Returns 0 or errno.
template <typename Body, typename Resp>
int xsrc_private_command(int cmd_fd, uint32_t command, Body body, Resp &resp)
{
	struct request {
		ib_uverbs_cmd_hdr hdr;
		Body body;
	} cmd{};
	static_assert(sizeof(request) == sizeof(ib_uverbs_cmd_hdr) + sizeof(Body));
	xsrc_cmd_header(cmd.hdr, command, sizeof(cmd), sizeof(resp));
	cmd.body = body;
	cmd.body.response = reinterpret_cast<uintptr_t>(&resp);
	ssize_t written = write(cmd_fd, &cmd, sizeof(cmd));
	if (written < 0)
		return errno;
	return static_cast<size_t>(written) == sizeof(cmd) ? 0 : EIO;
}

// xsrc.cpp: starts one of the provider's threads with every signal
// blocked (the application's handlers are not for it). Returns 0 or
// pthread_create's error.
int xsrc_start_thread(pthread_t &thread, void *(*main)(void *), void *arg) noexcept;

// xsrc.cpp: XSRC_CMD_RAISE_EVENT through our command file (best effort).
void xsrc_context_raise_event(xsrc_context *ctx, uint32_t kind, uint64_t object) noexcept;

// progress.cpp: the thread that retries blocked work. prepare() before a
// QP may need it (returns 0 or errno); schedule() neither allocates nor
// throws (the thread starts on the first one). defer() sets the deadline of
// the QP's deferred batch, later than an earlier batch's if that is all the
// QP was due for: a QP that keeps posting is not visited.
int xsrc_progress_prepare(xsrc_context *ctx) noexcept;
void xsrc_progress_schedule(xsrc_context *ctx, xsrc_qp *qp, uint64_t at_ns) noexcept;
void xsrc_progress_defer(xsrc_context *ctx, xsrc_qp *qp, uint64_t at_ns) noexcept;
void xsrc_progress_forget(xsrc_context *ctx, xsrc_qp *qp) noexcept;

// mw.cpp: memory windows (driver ABI r4).
ibv_mw *xsrc_mw_alloc(ibv_pd *pd, enum ibv_mw_type type);
int xsrc_mw_dealloc(ibv_mw *mw);
int xsrc_mw_bind(ibv_qp *qp, ibv_mw *mw, ibv_mw_bind *bind) noexcept;
// Fills a bind WQE (IBV_WR_BIND_MW) of `mw` with the new `rkey`.
void xsrc_mw_wqe_bind(xsrc_send_wqe &wqe, const ibv_mw *mw, uint32_t rkey, const ibv_mw_bind_info &info);
// Executes a bind or LOCAL_INV at its turn in the send queue (the device
// checks it): done, or failed with IBV_WC_MW_BIND_ERR / IBV_WC_LOC_QP_OP_ERR.
xsrc_attempt_result xsrc_mw_execute_local(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe) noexcept;
// The responder's side of SEND_WITH_INV: the device invalidates `rkey`, a
// type 2 window bound to the peer QP. False when it refused.
bool xsrc_mw_remote_invalidate(xsrc_context *ctx, xsrc_qp *qp, xsrc::Qpn peer, uint32_t rkey) noexcept;

// qp_wr.cpp: the ibv_qp_ex work-request builder.
void xsrc_qp_wr_set_ops(ibv_qp_ex &q);
// qp.cpp: what a HCA checks when a WQE is posted. Returns 0 or an errno
// (logged at debug level).
int xsrc_qp_validate_wqe(xsrc_qp *qp, const xsrc_send_wqe &wqe);
bool xsrc_qp_opcode_allowed(ibv_qp_type type, ibv_wr_opcode op);
// qp.cpp: allocates what posting to `qp` (its caps set) will need, so that
// posting never does; `builder`: also the ibv_wr_* staging. 0 or errno.
int xsrc_qp_prepare_send(xsrc_context *ctx, xsrc_qp *qp, bool builder);

// verbs.cpp: registers [addr, addr + length) at iova `hca_va` with the
// device and records it as the provider's (reg_mr without the boundary).
ibv_mr *xsrc_mr_register(ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access);
// What the context keeps of its MRs (where a poll may place payloads, which
// MRs are ODP), recorded and forgotten (the MR as libibverbs completed it);
// false: no memory.
struct xsrc_mr_span {
	uint32_t lkey;
	ibv_pd *pd;
	uint64_t addr;
	uint64_t length;
	uint64_t iova;
};
bool xsrc_mr_track(xsrc_context *ctx, const xsrc_mr_span &mr, int access) noexcept;
void xsrc_mr_untrack(xsrc_context *ctx, const ibv_mr &mr, int access) noexcept;

// import.cpp (driver ABI r6): objects of the context an imported context
// shares its command file with (ibv_import_device).
ibv_pd *xsrc_import_pd(ibv_context *ibctx, uint32_t pd_handle);
void xsrc_unimport_pd(ibv_pd *pd);
ibv_mr *xsrc_import_mr(ibv_pd *pd, uint32_t mr_handle);
void xsrc_unimport_mr(ibv_mr *mr);
// An MR the device does not know (a zero-length DM MR): dereg frees it only.
inline constexpr uint32_t XSRC_NO_MR_HANDLE = UINT32_MAX;

// dm.cpp: device memory, host memory of the allocating process.
inline constexpr uint64_t XSRC_MAX_DM_SIZE = 1u << 20;  // per allocation (max_dm_size)
ibv_dm *xsrc_alloc_dm(ibv_context *ibctx, ibv_alloc_dm_attr *attr);
int xsrc_free_dm(ibv_dm *dm);
ibv_dm *xsrc_import_dm(ibv_context *ibctx, uint32_t dm_handle);  // r6
void xsrc_unimport_dm(ibv_dm *dm);
ibv_mr *xsrc_reg_dm_mr(ibv_pd *pd, ibv_dm *dm, uint64_t dm_offset, size_t length, unsigned int access);

// The errno an exception caught at the C boundary stands for.
inline int xsrc_errno_of_current_exception() noexcept
{
	try {
		throw;
	} catch (const std::bad_alloc &) {
		return ENOMEM;
	} catch (const std::system_error &e) {
		const std::error_category &cat = e.code().category();
		bool is_errno = cat == std::generic_category() || cat == std::system_category();
		return is_errno && e.code().value() > 0 ? e.code().value() : EIO;
	} catch (...) {
		return EIO;
	}
}

// The device clock (XSRC_CORE_CLOCK_KHZ): CLOCK_MONOTONIC_RAW in ns.
inline uint64_t xsrc_clock_ns(clockid_t clock) noexcept
{
	timespec ts{};
	clock_gettime(clock, &ts);
	return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}
inline uint64_t xsrc_device_clock_ns() noexcept { return xsrc_clock_ns(CLOCK_MONOTONIC_RAW); }

// Runs the body of an op libibverbs calls: no exception crosses its C ABI.
// One that escapes the body is logged and becomes an errno, returned as
// the op returns errors (an int errno, or NULL with errno set).
template <typename Body>
auto xsrc_boundary(verbs_context *vctx, const char *op, Body &&body) noexcept -> decltype(body())
{
	using R = decltype(body());
	try {
		return body();
	} catch (...) {
		int err = xsrc_errno_of_current_exception();
		verbs_err(vctx, "%s: failed: %s\n", op, strerror(err));
		if constexpr (std::is_pointer_v<R>) {
			errno = err;
			return nullptr;
		} else {
			return err;
		}
	}
}
