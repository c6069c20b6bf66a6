// The RC/XRC interface: receive set-up and end-to-end flow control on top of the verbs
// interface base, and the endpoint that goes with it. RC: a QP per ep. XRC (the default where
// the device offers it): one send QP per remote iface shared by the eps to it, a receive QP
// per remote send QP, one shared receive queue (rc_xrc.cpp).
//
// Flow control: every ep has `rx_queue_len` receives posted for its peer, so the peer may
// send that many messages (AM and internal) before it must wait. The receiver grants
// credits back when it has re-posted receives (fc_ctrl): it RDMA-writes its running count of
// re-posted receives into a word the sender registered for it, so a grant costs the sender
// no receive buffer. The sender's credits are granted + rx_queue_len - sent (fc_handler);
// at zero, sends return UCS_ERR_NO_RESOURCE and ep_pending_add queues the request. A
// descriptor a user AM handler keeps (UCS_INPROGRESS) is re-posted, and so granted, only when
// released: a slow receiver throttles its senders and nothing is lost.
#pragma once

#include "owners.h"
#include "verbs_iface.h"

#include "common/fd.h"

#include <array>
#include <compare>
#include <deque>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

namespace xsrc::uct {

// The wire header in front of every send. Its last 8 bytes are overwritten on receipt with
// the uct_recv_desc_t pointer that uct_iface_release_desc() reads just before the payload.
struct WireHdr {
	uint8_t kind;   // MsgKind
	uint8_t am_id;  // user AM id when kind == user_am
	uint16_t flags;
	uint32_t src_ep_id;  // the sender's ep id (logging, and XRC routing)
	uint64_t desc_slot;
};
static_assert(sizeof(WireHdr) == 16);

struct RxPool;
struct RxDesc {
	uct_recv_desc_t release;  // must stay first: uct_recv_desc(data) points here
	RxPool *pool;
	unsigned index;
	bool held;
	uint32_t src_ep_id;       // XRC: the local ep the message came through (for its grant)
};

// The head of every receive area: an ep's credit word, alone on its cache line. XRC: the
// iface's credit area is one such slot per ep.
inline constexpr size_t credit_slot_size = 64;

// RC: one ep's receive buffers and its credit word, registered together.
// XRC: an ep's pool is a credit_slot_size slot of the iface's credit area and holds only its
// credit word; receive buffers are chunks of the iface's shared receive queue (`shared`), one
// chunk of rx_queue_len per ep ever created. Both areas are registered once per iface
// (`borrowed`): an XRC ep costs the device no object of its own.
struct RxPool {
	char *mem = nullptr;   // own_mem's, or the iface's (borrowed)
	size_t mem_len = 0;
	ibv_mr *mr = nullptr;  // own_mr's, or the iface's (borrowed)
	Mapping own_mem;       // RC: the pool's memory and its registration
	MrPtr own_mr;
	std::vector<RxDesc> descs;
	unsigned held = 0;     // descriptors kept by handlers
	bool orphan = false;   // the ep is gone: free when the last held descriptor is released
	bool shared = false;   // an XRC SRQ chunk, owned by the iface
	bool borrowed = false; // memory and MR belong to the iface (XRC): nothing to free
	unsigned slot = 0;     // XRC credit pools: the slot in the iface's credit area
	Iface *iface = nullptr;
	Ep *ep = nullptr;
	uint64_t &credit_word() const { return *reinterpret_cast<uint64_t *>(mem); }
};

enum class EpState : uint8_t { idle, connected, failed };

struct TxOp;

// XRC: a remote iface, as its ep addresses and connection messages name it (the device GID,
// and the pid and number of its connection socket, see rc_iface_conn.cpp).
struct XrcKey {
	std::array<uint8_t, 16> gid{};
	uint32_t pid = 0;
	uint32_t seq = 0;
	auto operator<=>(const XrcKey &) const = default;
};

enum class XrcState : uint8_t { requesting, connected, failed, closing };

// XRC: the one send (INI) QP of an iface towards one remote iface, shared by every ep
// connected to that iface. The remote iface creates the receive (TGT) QP for it on request
// (rc_xrc.cpp). Lives while eps are attached or work is outstanding.
struct XrcIni {
	XrcKey key;
	ibv_gid gid{};
	uint16_t lid = 0;
	ibv_qp *qp = nullptr;
	unsigned sq_avail = 0;         // shared by the attached eps
	XrcState state = XrcState::requesting;
	unsigned eps = 0;              // attached eps
	bool request_unsent = false;   // the socket was full: resend from progress
	uint64_t request_ns = 0;       // when the request was last sent (CLOCK_MONOTONIC)
};

// XRC: a receive (TGT) QP this iface created for one remote send QP; all of them feed the
// iface's shared receive queue. Destroyed when the remote says its send QP is gone, or with
// the iface.
struct XrcTgt {
	XrcKey key;
	uint32_t remote_ini = 0;
	ibv_qp *qp = nullptr;
};

struct Ep {
	uct_ep_t super;  // must stay first
	Iface *iface = nullptr;
	uint32_t id = 0;
	EpState state = EpState::idle;
	ucs_status_t fail_status = UCS_OK;
	bool cancelled = false;
	ibv_qp *qp = nullptr;         // RC only
	XrcIni *ini = nullptr;        // XRC: the shared send QP towards the peer's iface (once connected)
	XrcKey remote;                // XRC: the peer's iface
	uint32_t remote_ep_id = 0;    // XRC: the peer ep's id (in the WireHdr of what it sends us)
	uint32_t remote_srqn = 0;     // XRC: the peer's shared receive queue
	RxPool *rx = nullptr;
	// Sender side of flow control.
	uint64_t sent = 0;            // messages sent to the peer
	uint32_t peer_window = 0;     // the peer's rx_queue_len
	uint64_t remote_credit_addr = 0;
	uint32_t remote_credit_rkey = 0;
	// Receiver side.
	uint64_t reposted = 0;        // receives re-posted after the peer's messages
	uint64_t granted = 0;         // `reposted` as last written to the peer
	bool grant_wanted = false;
	// Ordering and flush.
	unsigned own_sq = 0;                   // RC: the QP's free send work requests
	unsigned *sq = &own_sq;                // RC: &own_sq; XRC: the shared send QP's
	uint64_t next_seq = 1;                 // operations get increasing numbers
	std::deque<uint64_t> inflight;         // numbers of unfinished operations, ascending
	std::deque<std::pair<uint64_t, uct_completion_t *>> flush_waiters;  // (last op covered, comp)
	std::deque<uct_pending_req_t *> pending;
	bool dispatching = false;              // inside pending dispatch: sends may bypass the queue
	bool fence_next = false;
	bool check_inflight = false;
	bool passive = false;     // created for a peer's connect-to-iface request; owned by the iface
	void *cm_state = nullptr;
};

struct RcIfaceOps {
	ucs_status_t (*init_rx)(Iface *, Ep *);             // allocate, register and post an ep's receives
	void (*cleanup_rx)(Iface *, Ep *);
	ucs_status_t (*fc_ctrl)(Iface *, Ep *);             // grant the peer the receives re-posted so far
	unsigned (*fc_handler)(Iface *, Ep *);              // credits available for sending to the peer
};

// The interface's tunables. Their defaults (below) are those of UCX's configuration table
// (UCX_XSRC_*, rc_iface_config.cpp) and of a zero field of xsrc_uct_iface_config_t.
#define XSRC_UCT_DFL_RX_QUEUE_LEN 64
#define XSRC_UCT_DFL_SQ_LEN 128
#define XSRC_UCT_DFL_TX_OPS 1024
#define XSRC_UCT_DFL_TX_BUFS 512
#define XSRC_UCT_DFL_SEG_SIZE 8192
#define XSRC_UCT_DFL_MAX_EPS 64
#define XSRC_UCT_DFL_MAX_SHORT 256
#define XSRC_UCT_DFL_MAX_SGE 8
#define XSRC_UCT_DFL_CQ_SLACK 16
#define XSRC_UCT_DFL_XRC_RX_MEM_MAX (size_t{1} << 36)

// The scatter/gather arrays on the send paths are this long: max_sge cannot exceed it.
inline constexpr unsigned max_sge_limit = 8;

struct IfaceConfig {
	unsigned rx_queue_len = XSRC_UCT_DFL_RX_QUEUE_LEN;  // receives per ep = initial send credits of the peer
	unsigned sq_len = XSRC_UCT_DFL_SQ_LEN;              // send work requests per QP (RC: per ep; XRC: per remote iface)
	unsigned tx_ops = XSRC_UCT_DFL_TX_OPS;              // outstanding operations per iface
	unsigned tx_bufs = XSRC_UCT_DFL_TX_BUFS;            // bounce buffers per iface
	size_t seg_size = XSRC_UCT_DFL_SEG_SIZE;            // bounce/receive buffer size (wire header included)
	unsigned max_eps = XSRC_UCT_DFL_MAX_EPS;
	size_t max_short = XSRC_UCT_DFL_MAX_SHORT;
	unsigned max_sge = XSRC_UCT_DFL_MAX_SGE;            // per work request, at most the device's and max_sge_limit
	unsigned cq_slack = XSRC_UCT_DFL_CQ_SLACK;          // CQ entries beyond twice the live maximum
	size_t xrc_rx_mem_max = XSRC_UCT_DFL_XRC_RX_MEM_MAX; // largest XRC receive area an iface reserves
	bool xrc = false;  // XRC: QPs shared per remote iface, one shared receive queue (rc_xrc.cpp)
};

struct InternalSlot {
	InternalHandler cb = nullptr;
	void *arg = nullptr;
};

// Members that own a resource are declared so that they go in the reverse order of their
// making (a registration before its memory, the SRQ before its XRC domain); ~Iface does what
// must come first (rc_iface.cpp).
struct Iface : VerbsIface {
	Iface() = default;
	Iface(const Iface &) = delete;
	Iface &operator=(const Iface &) = delete;
	~Iface();
	const RcIfaceOps *rops = nullptr;
	IfaceConfig cfg;
	// Operation slots; `atomic_words` (registered) holds each slot's 8-byte atomic result.
	std::vector<TxOp> ops;
	std::vector<unsigned> free_ops;
	std::unique_ptr<uint64_t[], FreeDeleter> atomic_words;
	MrPtr atomic_mr;
	// Bounce buffers.
	Mapping tx_mem;
	MrPtr tx_mr;
	std::vector<unsigned> free_bufs;
	// Endpoints.
	uint32_t next_ep_id = 1;
	std::vector<Ep *> eps;
	std::unordered_map<uint32_t, Ep *> by_qpn;
	unsigned max_sge = 1;
	size_t max_msg = 1u << 30;
	// Completions polled by event_arm, handled by the next progress.
	std::vector<ibv_wc> stash;
	InternalSlot internal[msg_kind_count];
	void *tag_state = nullptr;
	void *cm_state = nullptr;
	bool progress_registered = false;
	xsrc::unique_fd epfd;         // uct_iface_event_fd_get: the completion channel and watched fds
	XrcdPtr xrcd;                 // XRC mode
	Mapping credit_mem;           // XRC: one credit slot per ep, registered once
	MrPtr credit_mr;
	Mapping srq_mem;              // XRC: every chunk's receive buffers, registered once
	MrPtr srq_mr;
	SrqPtr srq;
	std::vector<RxPool *> srq_chunks;
	std::vector<unsigned> free_credit_slots;
	std::vector<XrcIni *> inis;   // XRC: shared send QPs (current, failed and closing ones)
	std::vector<XrcTgt *> tgts;   // XRC: receive QPs created for remote send QPs
	std::map<std::pair<XrcKey, uint32_t>, Ep *> xrc_route;  // (remote iface, remote ep id) -> ep
	uint32_t conn_pid = 0;        // XRC: this iface's key (with its GID)
	uint64_t xrc_reap_ns = 0;     // XRC: when receive QPs of vanished ifaces were last looked for
	std::unordered_map<uint32_t, Ep *> by_id;
	xsrc::unique_fd conn_fd;      // connect-to-iface requests (rc_iface_conn.cpp)
	unsigned conn_tick = 0;       // progress calls; the socket is read on every conn_poll_every-th
	char conn_name[24]{};         // its abstract socket name = the iface address
	unsigned conn_seq = 0;                     // the socket's number (its name: pid and this)
	std::deque<std::vector<char>> conn_deferred;  // connect-to-iface messages read by uct_xsrc_rc_iface_conn_poll
	unsigned progress_depth = 0;
};

// What an operation slot is doing.
enum class OpKind : uint8_t { send, put, get_bcopy, get_short, get_zcopy, atomic_fadd, atomic_cswap, atomic_emul, grant, check };

struct TxOp {
	uint32_t gen = 0;
	bool busy = false;
	uint64_t seq = 0;
	OpKind kind = OpKind::send;
	Ep *ep = nullptr;          // null once its ep is destroyed (XRC: the shared QP still owes the completion)
	XrcIni *ini = nullptr;     // XRC: the shared send QP it was posted on
	uct_completion_t *comp = nullptr;
	int buf = -1;
	// get_bcopy / get_short
	uct_unpack_callback_t unpack = nullptr;
	void *unpack_arg = nullptr;
	void *dst = nullptr;
	size_t length = 0;
	// atomics
	uct_atomic_op_t aop = UCT_ATOMIC_OP_ADD;
	unsigned bits = 64;      // operand size
	unsigned shift = 0;      // 32-bit operand: bit offset inside the aligned 64-bit word
	uint64_t operand = 0, compare = 0, expect = 0;
	uint64_t remote_word = 0;
	uint32_t rkey = 0;
	void *result = nullptr;  // user's result, null for post
};

extern const RcIfaceOps uct_xsrc_rc_iface_default_ops;
extern const uct_iface_ops_t uct_xsrc_rc_iface_tl_ops;

inline Iface *iface_of(uct_iface_h h) { return reinterpret_cast<Iface *>(h); }
inline Ep *ep_of(uct_ep_h h) { return reinterpret_cast<Ep *>(h); }

// rc_iface.cpp: open, close, query, addresses; op slots and bounce buffers.
ucs_status_t uct_xsrc_rc_iface_open(Md *, uct_worker_h, const uct_iface_params_t *, const IfaceConfig &, uct_iface_h *);
// Op slots and bounce buffers; both give null/-1 when exhausted.
TxOp *uct_xsrc_rc_iface_op_get(Iface *, OpKind, Ep *);
void uct_xsrc_rc_iface_op_put(Iface *, TxOp *);
uint64_t uct_xsrc_rc_iface_op_wr_id(Iface *, const TxOp *);
// The 8-byte word of atomic_words that belongs to op: an atomic's result, a grant's value.
inline uint64_t &uct_xsrc_rc_iface_op_word(Iface *i, TxOp *op) { return i->atomic_words[static_cast<size_t>(op - i->ops.data())]; }
int uct_xsrc_rc_iface_buf_get(Iface *);
void uct_xsrc_rc_iface_buf_put(Iface *, int);
char *uct_xsrc_rc_iface_buf_addr(Iface *, int);
// The scatter/gather entry for the first `length` bytes of bounce buffer `buf`.
inline ibv_sge uct_xsrc_rc_iface_buf_sge(Iface *i, int buf, uint32_t length);
void uct_xsrc_rc_iface_comp_done(uct_completion_t *, ucs_status_t);
// The device address (GID and LID), as ep and connection messages carry it.
size_t uct_xsrc_rc_iface_dev_addr_len();
ucs_status_t uct_xsrc_rc_iface_dev_addr_unpack(const uct_device_addr_t *, ibv_gid *gid, uint16_t *lid);

// rc_iface_progress.cpp: completions, progress, events, iface flush and fence.
extern const VerbsIfaceOps uct_xsrc_rc_iface_verbs_ops;
unsigned uct_xsrc_rc_iface_progress(uct_iface_h);
void uct_xsrc_rc_iface_progress_enable(uct_iface_h, unsigned flags);
void uct_xsrc_rc_iface_progress_disable(uct_iface_h, unsigned flags);
ucs_status_t uct_xsrc_rc_iface_flush(uct_iface_h, unsigned flags, uct_completion_t *);
ucs_status_t uct_xsrc_rc_iface_fence(uct_iface_h, unsigned flags);
ucs_status_t uct_xsrc_rc_iface_event_fd_get(uct_iface_h, int *fd_p);
ucs_status_t uct_xsrc_rc_iface_event_arm(uct_iface_h, unsigned events);
// UCT_FLUSH_FLAG_CANCEL: outstanding work completes with UCS_ERR_CANCELED; the ep is unusable after.
void uct_xsrc_rc_ep_cancel(Ep *);
// The ep alone fails (its QP, if shared, is left alone); notify: call the error handler.
void uct_xsrc_rc_ep_fail_one(Ep *, ucs_status_t status, bool notify);

// rc_iface_rx.cpp: receive pools, flow control (uct_xsrc_rc_iface_default_ops), receipt.
size_t uct_xsrc_rc_iface_srq_chunk_len(const Iface *);  // an XRC ep's part of the shared receive area
void uct_xsrc_rc_rx_pool_free(RxPool *);
// A received message.
void uct_xsrc_rc_ep_rx(Iface *, Ep *, RxDesc *, size_t byte_len);
ucs_status_t uct_xsrc_rc_ep_repost(Iface *, Ep *, RxDesc *);  // ep: whose grant it counts for (may be null on XRC)
// The receive buffer of a descriptor (where the WireHdr lands).
char *uct_xsrc_rc_iface_rx_data(Iface *, const RxDesc *);

// rc_ep.cpp, rc_ep_rma.cpp, rc_ep_am.cpp, rc_ep_atomic.cpp: the uct_iface_ops_t entries that act on an ep.
ucs_status_t uct_xsrc_rc_ep_create(const uct_ep_params_t *, uct_ep_h *);
void uct_xsrc_rc_ep_destroy(uct_ep_h);
ucs_status_t uct_xsrc_rc_ep_get_address(uct_ep_h, uct_ep_addr_t *);
ucs_status_t uct_xsrc_rc_ep_connect_to_ep(uct_ep_h, const uct_device_addr_t *, const uct_ep_addr_t *);
ucs_status_t uct_xsrc_rc_ep_put_short(uct_ep_h, const void *, unsigned, uint64_t, uct_rkey_t);
ssize_t uct_xsrc_rc_ep_put_bcopy(uct_ep_h, uct_pack_callback_t, void *, uint64_t, uct_rkey_t);
ucs_status_t uct_xsrc_rc_ep_put_zcopy(uct_ep_h, const uct_iov_t *, size_t, uint64_t, uct_rkey_t, uct_completion_t *);
ucs_status_t uct_xsrc_rc_ep_get_short(uct_ep_h, void *, unsigned, uint64_t, uct_rkey_t);
ucs_status_t uct_xsrc_rc_ep_get_bcopy(uct_ep_h, uct_unpack_callback_t, void *, size_t, uint64_t, uct_rkey_t, uct_completion_t *);
ucs_status_t uct_xsrc_rc_ep_get_zcopy(uct_ep_h, const uct_iov_t *, size_t, uint64_t, uct_rkey_t, uct_completion_t *);
ucs_status_t uct_xsrc_rc_ep_am_short(uct_ep_h, uint8_t, uint64_t, const void *, unsigned);
ucs_status_t uct_xsrc_rc_ep_am_short_iov(uct_ep_h, uint8_t, const uct_iov_t *, size_t);
ssize_t uct_xsrc_rc_ep_am_bcopy(uct_ep_h, uint8_t, uct_pack_callback_t, void *, unsigned);
ucs_status_t uct_xsrc_rc_ep_am_zcopy(uct_ep_h, uint8_t, const void *, unsigned, const uct_iov_t *, size_t, unsigned, uct_completion_t *);
ucs_status_t uct_xsrc_rc_ep_atomic_cswap64(uct_ep_h, uint64_t, uint64_t, uint64_t, uct_rkey_t, uint64_t *, uct_completion_t *);
ucs_status_t uct_xsrc_rc_ep_atomic_cswap32(uct_ep_h, uint32_t, uint32_t, uint64_t, uct_rkey_t, uint32_t *, uct_completion_t *);
ucs_status_t uct_xsrc_rc_ep_atomic32_post(uct_ep_h, unsigned, uint32_t, uint64_t, uct_rkey_t);
ucs_status_t uct_xsrc_rc_ep_atomic64_post(uct_ep_h, unsigned, uint64_t, uint64_t, uct_rkey_t);
ucs_status_t uct_xsrc_rc_ep_atomic32_fetch(uct_ep_h, unsigned, uint32_t, uint32_t *, uint64_t, uct_rkey_t, uct_completion_t *);
ucs_status_t uct_xsrc_rc_ep_atomic64_fetch(uct_ep_h, unsigned, uint64_t, uint64_t *, uint64_t, uct_rkey_t, uct_completion_t *);
ucs_status_t uct_xsrc_rc_ep_pending_add(uct_ep_h, uct_pending_req_t *, unsigned);
void uct_xsrc_rc_ep_pending_purge(uct_ep_h, uct_pending_purge_callback_t, void *);
ucs_status_t uct_xsrc_rc_ep_flush(uct_ep_h, unsigned, uct_completion_t *);
ucs_status_t uct_xsrc_rc_ep_fence(uct_ep_h, unsigned);
ucs_status_t uct_xsrc_rc_ep_check(uct_ep_h, unsigned, uct_completion_t *);
// rc_ep.cpp: posting and completions.
void uct_xsrc_rc_ep_pending_dispatch(Ep *);
// A send completion of the ep's (in order); an atomic that must go round again is re-posted.
void uct_xsrc_rc_ep_tx_done(Iface *, TxOp *, const ibv_wc &);
// Post a send/RDMA work request for `op` on the ep (sq/seq accounting included).
ucs_status_t uct_xsrc_rc_ep_post(Ep *, TxOp *, ibv_send_wr *);
// Posts a work request whose local side is uct_xsrc_rc_iface_op_word(op): an 8-byte RDMA WRITE, or an
// atomic (compare_add, swap). op stays the caller's on failure.
ucs_status_t uct_xsrc_rc_ep_post_word(Ep *, TxOp *, ibv_wr_opcode, uint64_t remote_addr, uint32_t rkey,
			     uint64_t compare_add = 0, uint64_t swap = 0);
// Whether the ep may start an operation now; `credit`: it needs a receive at the peer.
ucs_status_t uct_xsrc_rc_ep_tx_check(Ep *, bool credit);
// uct_xsrc_rc_ep_tx_check, then a bounce buffer (UCS_ERR_NO_RESOURCE when none is free).
ucs_status_t uct_xsrc_rc_ep_tx_reserve(Ep *, bool credit, int *buf);
// Scatter/gather entries from a UCT iov (each entry `count` times, `stride` apart).
ucs_status_t uct_xsrc_rc_ep_iov_to_sge(const uct_iov_t *iov, size_t iovcnt, ibv_sge *sge, unsigned max, unsigned *n,
				       size_t *total);
// Takes an op of `kind` and posts a send or RDMA work request for it (the op goes back on
// failure); buf: its bounce buffer or -1; *op_out: the op, for the caller to complete.
ucs_status_t uct_xsrc_rc_ep_post_rdma(Ep *, OpKind kind, ibv_wr_opcode opcode, ibv_sge *sge, unsigned nsge,
				      uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp, int buf,
				      TxOp **op_out = nullptr);
// rc_ep_atomic.cpp: an emulated atomic's completion (word: the value seen). True when it went
// round again (posted anew); else the result is delivered, or *st says why not.
bool uct_xsrc_rc_ep_atomic_done(Ep *, TxOp *, uint64_t word, ucs_status_t *st);
// Writes `value` into the peer's credit word (a grant, or an ep_check probe); op of `kind`.
ucs_status_t uct_xsrc_rc_ep_write_credit(Ep *, OpKind kind, uint64_t value);
ucs_status_t uct_xsrc_rc_ep_send_msg(Ep *, MsgKind, uint8_t am_id, uct_pack_callback_t pack, void *arg, ssize_t *packed);
size_t uct_xsrc_rc_ep_addr_len();

// rc_iface_conn.cpp: ep_create to an iface address (UCT_IFACE_FLAG_CONNECT_TO_IFACE).
size_t uct_xsrc_rc_iface_addr_len();
ucs_status_t uct_xsrc_rc_iface_conn_open(Iface *);
void uct_xsrc_rc_iface_conn_close(Iface *);
ucs_status_t uct_xsrc_rc_iface_conn_get_address(Iface *, uct_iface_addr_t *);
bool uct_xsrc_rc_iface_conn_addr_valid(const uct_iface_addr_t *);
ucs_status_t uct_xsrc_rc_iface_conn_ep_create(Iface *, const uct_device_addr_t *, const uct_iface_addr_t *, uct_ep_h *);
unsigned uct_xsrc_rc_iface_conn_progress(Iface *);

// rc_iface_conn.cpp: XRC connection messages between ifaces (same socket as connect-to-iface).
enum class XrcMsgType : uint8_t { request = 4, reply = 5, bye = 6 };
struct XrcMsg {
	XrcMsgType type;
	XrcKey from;          // the sender's iface
	uint16_t lid = 0;
	uint32_t ini = 0;     // the send QP concerned
	uint32_t tgt = 0;     // reply: the receive QP created for it
	int32_t status = 0;   // reply: UCS_OK or why not
};
// UCS_OK, UCS_ERR_NO_RESOURCE (the peer's socket is full: try again) or UCS_ERR_UNREACHABLE.
ucs_status_t uct_xsrc_rc_iface_conn_send_xrc(Iface *, const XrcKey &to, const XrcMsg &);
// Reads the socket now: XRC messages are handled, others kept for uct_xsrc_rc_iface_conn_progress.
void uct_xsrc_rc_iface_conn_poll(Iface *);
XrcKey uct_xsrc_rc_iface_conn_self_key(Iface *);
bool uct_xsrc_rc_iface_conn_iface_alive(Iface *, const XrcKey &);  // false once nobody has the iface's socket

// rc_xrc.cpp: the shared XRC QPs.
// Attaches a fresh ep to the send QP towards `remote` (creating and requesting it if needed);
// the ep is connected now if that QP is, else when the peer answers (progress).
ucs_status_t uct_xsrc_rc_xrc_ep_connect(Ep *, const XrcKey &remote, const ibv_gid &gid, uint16_t lid);
void uct_xsrc_rc_xrc_ep_detach(Ep *);                       // ep_destroy: the last ep closes the QP
Ep *uct_xsrc_rc_xrc_route(Iface *, uint32_t tgt_qpn, uint32_t src_ep_id);
void uct_xsrc_rc_xrc_on_msg(Iface *, const XrcMsg &);
void uct_xsrc_rc_xrc_tx_done(Iface *, TxOp *, const ibv_wc &);  // accounting for a completion on a shared QP
void uct_xsrc_rc_xrc_ini_fail(Iface *, XrcIni *, ucs_status_t);
unsigned uct_xsrc_rc_xrc_progress(Iface *);
void uct_xsrc_rc_xrc_iface_cleanup(Iface *);

inline ibv_sge uct_xsrc_rc_iface_buf_sge(Iface *i, int buf, uint32_t length)
{
	return {reinterpret_cast<uintptr_t>(uct_xsrc_rc_iface_buf_addr(i, buf)), length, i->tx_mr->lkey};
}

}  // namespace xsrc::uct
