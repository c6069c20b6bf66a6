/* SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB) */
/*
 * The xsrc driver ABI: what the xsrc provider appends to the core uverbs
 * write-ABI commands (<rdma/ib_user_verbs.h>, ABI 6) and what the xsrc device
 * daemon (xsrcd) appends to the responses, plus xsrc's private commands.
 *
 * This plays the role of <rdma/rdma_user_rxe.h> or efa-abi.h: a driver's
 * request struct follows the core struct in the same write(), its response
 * follows the core response at the address the core command names.
 *
 * Rules (see README.md in this directory for the version history):
 *  - fields are only ever appended; a newer field is announced by a comp_mask
 *    bit or by the request/response size;
 *  - every struct is a multiple of 8 bytes, fields are naturally aligned;
 *  - reserved fields must be zero; unknown comp_mask bits -> EOPNOTSUPP.
 */
#ifndef XSRC_ABI_H
#define XSRC_ABI_H

#include <linux/types.h>
#include <rdma/ib_user_verbs.h>

/* The ABI generation. Published as class/infiniband_verbs/uverbsN/abi_version
 * and checked by libibverbs against the provider's
 * match_{min,max}_abi_version. Bumped only by an incompatible change (never
 * so far): growth within a generation is append-only and does not bump it, as
 * with the kernel's drivers, so providers built against older headers keep
 * matching. */
#define XSRC_DRIVER_ABI_VERSION 1
#define XSRC_DRIVER_ABI_MIN_VERSION 1

/* The revision within the generation: which appended fields and private
 * commands exist. Reported by the daemon in xsrc_get_context_resp::driver_abi
 * (revision 1 daemons report 1 there too). See README.md in this directory.
 * Revision 3 added UD multicast: the ATTACH_MCAST / DETACH_MCAST commands and
 * the arena's multicast table (xsrc-queues.h, xsrc_mcast_table).
 * Revision 4 added memory windows: the ALLOC_MW / DEALLOC_MW commands,
 * XSRC_CMD_BIND_MW and XSRC_CMD_INVALIDATE, and the window fields of the
 * arena's MR entry (xsrc_mr_entry::mw_type, bound_qpn).
 * Revision 5 added the CQ ring's big payload slots (xsrc-queues.h,
 * XSRC_CQE_DEFERRED_BIG).
 * Revision 6 added import (ibv_import_device, _pd, _mr):
 * XSRC_CMD_IMPORT_CONTEXT, XSRC_CMD_QUERY_OBJECT and the uverbs ioctls
 * libibverbs sends an imported context (ASYNC_EVENT_ALLOC, CQ_CREATE,
 * QP_CREATE).
 * Revision 7 added tag-matching SRQs (IBV_SRQT_TM through CREATE_XSRQ): the
 * tag table after a TM SRQ's ring (xsrc-queues.h, xsrc_tm_table) and the
 * tag a matched completion carries (XSRC_CQE_TM_INFO).
 * Revision 8 added RC and UC on the wire: XSRC_CMD_WIRE_RESPONSES.
 * Revision 9 checks a device copy into a receive against the receive
 * posted: XSRC_CMD_RECV_SHADOW, struct xsrc_copy_recv.
 * Revision 10 lets a CQ's consumer publish its head lazily: the arena
 * header's eager_heads and xsrc_get_context_resp::cq_head_mode.
 * Revision 11 lets a CQ's consumer arm it so that producers need no fence
 * behind each completion: xsrc_cq_ring::arm_sees_tail (xsrc-queues.h). */
#define XSRC_DRIVER_ABI_REVISION 11

/* The core uverbs ABI xsrcd serves (class/infiniband_verbs/abi_version). */
#define XSRC_UVERBS_ABI_VERSION 6

/* Name of the file in the device's sysfs directory
 * (class/infiniband/<ibdev>/) that holds the absolute path of the directory in
 * which the provider creates its command file. */
#define XSRC_SYSFS_CMD_DIR_FILE "xsrc_cmd_dir"

/* The device clock: the hca_core_clock of QUERY_DEVICE (ex), in kHz. It is
 * CLOCK_MONOTONIC_RAW in nanoseconds, read by the provider (free-running
 * completion timestamps, ibv_query_rt_values_ex's raw_clock); no layout
 * carries it, so it is the same in every revision. */
#define XSRC_CORE_CLOCK_KHZ 1000000

/* Completion-channel pipes the provider may register at GET_CONTEXT. */
#define XSRC_MAX_CHANNEL_FDS 8

struct xsrc_fd_pair {
	__u32 rd_fd; /* read end, in the caller; handed to the application */
	__u32 wr_fd; /* write end, in the caller; the daemon takes a copy */
};

enum xsrc_get_context_req_mask {
	XSRC_GET_CONTEXT_REQ_MASK_ALL = 0,
};

/* Appended to struct ib_uverbs_get_context (IB_USER_VERBS_CMD_GET_CONTEXT). */
struct xsrc_get_context_req {
	__u32 comp_mask;        /* xsrc_get_context_req_mask; 0 in v1 */
	__u32 num_channel_fds;  /* <= XSRC_MAX_CHANNEL_FDS */
	struct xsrc_fd_pair async_fds; /* rd becomes ibv_context::async_fd */
	struct xsrc_fd_pair channel_fds[XSRC_MAX_CHANNEL_FDS];
};

enum xsrc_get_context_resp_mask {
	/* v2: caller_pid, caller_uid and caps are valid. */
	XSRC_GET_CONTEXT_RESP_MASK_CALLER = 1u << 0,
	XSRC_GET_CONTEXT_RESP_MASK_ALL = XSRC_GET_CONTEXT_RESP_MASK_CALLER,
};

/* xsrc_get_context_resp::caps (v2) */
enum xsrc_device_caps {
	/* The daemon moves bytes on the caller's behalf (XSRC_CMD_COPY) when the
	 * caller may not touch the peer's memory itself: another user, another
	 * PID namespace. */
	XSRC_CAP_COPY = 1u << 0,
};

/* Appended to struct ib_uverbs_get_context_resp. */
struct xsrc_get_context_resp {
	__u32 comp_mask;        /* xsrc_get_context_resp_mask */
	__u32 driver_abi;       /* XSRC_DRIVER_ABI_REVISION the daemon serves */
	__u64 context_id;       /* daemon-wide id of this context */
	__u32 max_inline_data;  /* per-QP inline limit the device honours */
	__u32 channel_pool_free; /* registered channel pipes not yet handed out */
	/* v2 (XSRC_GET_CONTEXT_RESP_MASK_CALLER) */
	__u32 caller_pid;       /* the caller's thread group as the device sees it;
				 * differs from getpid() in another PID namespace */
	__u32 caller_uid;       /* the caller's uid as the device sees it */
	__u32 caps;             /* enum xsrc_device_caps */
	__u32 reserved;         /* 0 */
	/* r10: a caller that gives room for these fields reads a CQ ring's head
	 * as a lower bound (xsrc-queues.h, xsrc_cq_ring); a daemon counts every
	 * other context in the arena header's eager_heads. */
	__u32 cq_head_mode;     /* enum xsrc_cq_head_mode */
	__u32 reserved2;        /* 0 */
};

/* xsrc_get_context_resp::cq_head_mode (r10) */
enum xsrc_cq_head_mode {
	XSRC_CQ_HEAD_EXACT = 0, /* publish the head at every poll (what older daemons mean) */
	XSRC_CQ_HEAD_LAZY = 1,  /* publish it lazily while the arena's eager_heads is 0 */
};

/* Appended to struct ib_uverbs_create_cq_resp / ib_uverbs_ex_create_cq_resp
 * (the request carries no driver data). */
struct xsrc_create_cq_resp {
	__u32 comp_mask;
	__u32 channel_pool_free;
	__aligned_u64 ring_off;   /* struct xsrc_cq_ring in the device arena */
};

/* Appended to ib_uverbs_resize_cq_resp: the ring may have moved. */
struct xsrc_resize_cq_resp {
	__aligned_u64 ring_off;
};

/* Appended to ib_uverbs_alloc_pd_resp. */
struct xsrc_alloc_pd_resp {
	__u32 pd_id;              /* device-wide id, as in the arena tables */
	__u32 reserved;
};

/* Appended to ib_uverbs_create_qp_resp / ib_uverbs_ex_create_qp_resp, and
 * to the ib_uverbs_create_qp_resp of OPEN_QP. The QP's arena entry is
 * qp table[qpn - XSRC_QPN_BASE]. */
struct xsrc_create_qp_resp {
	__u32 comp_mask;
	__u32 reserved;
	__aligned_u64 rq_off;     /* struct xsrc_recv_ring; 0 with an SRQ and for XRC QPs */
};

/* Appended to ib_uverbs_create_srq_resp (CREATE_SRQ and CREATE_XSRQ). The
 * SRQ's arena entry is srq table[srqn - XSRC_SRQN_BASE]. */
struct xsrc_create_srq_resp {
	__u32 comp_mask;
	__u32 reserved;
	__aligned_u64 ring_off;   /* struct xsrc_recv_ring */
};

/*
 * Private commands (hdr.command, never with IB_USER_VERBS_CMD_FLAG_EXTENDED).
 * Numbers sit far above the core command numbers.
 */
enum {
	/* Completion-channel pool: optionally register one more pipe for later
	 * CREATE_COMP_CHANNEL calls, and report how many registered pipes are
	 * not yet handed out. The daemon hands pipes out in registration order
	 * (FIFO), so the provider knows that the last channel_pool_free read
	 * ends it registered are still its own. */
	XSRC_CMD_CHANNEL_POOL = 0xf0,
	/* The data path asks the device to raise an event it detected: a
	 * completion on an armed CQ, a CQ overrun, an SRQ below its limit, a
	 * QP gone to error. Any context of the device may raise it for any
	 * object of the device (the initiator completes work on the target's
	 * queues). No response. */
	XSRC_CMD_RAISE_EVENT = 0xf1,
	/* v2 (XSRC_CAP_COPY): the device moves bytes between the caller and a
	 * peer's registered memory, for a caller that may not reach the peer's
	 * memory itself. The daemon checks the key against its own records
	 * (never the arena's, which any process can write). */
	XSRC_CMD_COPY = 0xf2,
	/* v4: a bind work request reached the head of the caller's send queue:
	 * the device checks it against its own records (window, MR, QP, PDs,
	 * range, rights) and publishes the window's MR table entry. No
	 * response: EINVAL (a check failed) completes the request with
	 * IBV_WC_MW_BIND_ERR. */
	XSRC_CMD_BIND_MW = 0xf3,
	/* v4: invalidate a type 2 window's rkey: LOCAL_INV on the caller's QP,
	 * or the responder's side of a SEND_WITH_INV the caller executes. No
	 * response: EINVAL when the rkey names no window that may be
	 * invalidated there. */
	XSRC_CMD_INVALIDATE = 0xf4,
	/* v6: a second provider context on this command file (ibv_import_device
	 * of a dup of it). The caller names a pipe of its own whose read end the
	 * RDMA_VERBS_IOCTL ASYNC_EVENT_ALLOC that libibverbs sends next hands
	 * out as the imported context's async_fd. The response is what
	 * GET_CONTEXT answered (struct xsrc_get_context_resp). EINVAL before
	 * GET_CONTEXT. */
	XSRC_CMD_IMPORT_CONTEXT = 0xf5,
	/* v6: what an object handle of this context names (ibv_import_pd,
	 * ibv_import_mr): EINVAL when it names no object of that type. */
	XSRC_CMD_QUERY_OBJECT = 0xf6,
	/* v8: RC on the wire. The caller's requester gets the RoCE v2
	 * responses (ACK, NAK, READ response, ATOMIC ACK) that reach this
	 * host for its RC QPs: the daemon takes `fd`, one end of an AF_UNIX
	 * SOCK_SEQPACKET pair the caller made, and sends it each such packet
	 * whose ICRC checked, from its BTH to its pad (no ICRC), without ever
	 * waiting (a response that does not fit is lost, as on a wire). A
	 * second registration replaces the first. No response. */
	XSRC_CMD_WIRE_RESPONSES = 0xf7,
	/* v9: the caller registers the shadow of a receive queue of its own
	 * (a QP's RQ or an SRQ): a table in its private memory, one entry per
	 * ring slot, that it fills as it posts receives. From then on a
	 * XSRC_CMD_COPY into that queue must name the ring position it popped
	 * (struct xsrc_copy_recv) and may only write inside the SGEs the entry
	 * for that position records. A second registration replaces the
	 * first. No response. */
	XSRC_CMD_RECV_SHADOW = 0xf8,
};

enum xsrc_event_kind {
	XSRC_EVENT_CQ_COMPLETION = 1, /* object = CQ ring offset */
	XSRC_EVENT_CQ_ERR = 2,        /* object = CQ ring offset */
	XSRC_EVENT_SRQ_LIMIT = 3,     /* object = SRQN */
	XSRC_EVENT_QP_FATAL = 4,      /* object = QPN */
	XSRC_EVENT_QP_LAST_WQE = 5,   /* object = QPN (SRQ QP left in error) */
};

struct xsrc_raise_event {
	__u32 kind;           /* enum xsrc_event_kind */
	__u32 reserved;       /* 0 */
	__aligned_u64 object;
};

#define XSRC_NO_FD 0xffffffffu

struct xsrc_channel_pool {
	__aligned_u64 response;
	__u32 comp_mask;       /* 0 */
	__u32 reserved;        /* 0 */
	struct xsrc_fd_pair fds; /* both XSRC_NO_FD: query only */
};

/* XSRC_CMD_IMPORT_CONTEXT (v6); the response is struct xsrc_get_context_resp. */
struct xsrc_import_context {
	__aligned_u64 response;
	__u32 comp_mask;         /* 0 */
	__u32 reserved;          /* 0 */
	struct xsrc_fd_pair async_fds; /* a pipe of the caller's: rd becomes the async_fd */
};

/* XSRC_CMD_QUERY_OBJECT (v6) */
enum xsrc_object_type {
	XSRC_OBJECT_PD = 1,
	XSRC_OBJECT_MR = 2,
};

struct xsrc_query_object {
	__aligned_u64 response;
	__u32 type;              /* enum xsrc_object_type */
	__u32 handle;
};

struct xsrc_query_object_resp {
	__u32 pd_handle;         /* MR: its PD's handle; PD: the handle asked */
	__u32 pd_id;             /* the PD's device-wide id */
	__u32 lkey;              /* MR only, as the rest */
	__u32 rkey;
	__aligned_u64 addr;      /* where the MR's bytes are in its owner */
	__aligned_u64 iova;
	__aligned_u64 length;
	__u32 access;            /* IB_UVERBS_ACCESS_* */
	__u32 reserved;
};

struct xsrc_channel_pool_resp {
	__u32 channel_pool_free;
	__u32 reserved;
};

/* XSRC_CMD_COPY (v2) */
enum xsrc_copy_op {
	XSRC_COPY_WRITE = 1,     /* caller's local_iov -> peer [peer_addr, +length) */
	XSRC_COPY_READ = 2,      /* peer [peer_addr, +length) -> caller's local_iov */
	XSRC_COPY_FETCH_ADD = 3, /* 8 B at peer_addr += compare_add; old value -> local_iov */
	XSRC_COPY_CMP_SWAP = 4,  /* 8 B at peer_addr: if == compare_add then = swap; old -> local_iov */
};

enum xsrc_copy_key_kind {
	/* An rkey the peer registered with the remote access the op needs. */
	XSRC_COPY_RKEY = 1,
	/* The lkey of a receive buffer the peer posted (SEND, WRITE_WITH_IMM
	 * payloads into a receive): needs IBV_ACCESS_LOCAL_WRITE. */
	XSRC_COPY_LKEY = 2,
};

#define XSRC_COPY_MAX_IOV 32

struct xsrc_copy {
	__aligned_u64 response;  /* struct xsrc_copy_resp */
	__u32 comp_mask;         /* 0 */
	__u32 op;                /* enum xsrc_copy_op */
	__u32 key_kind;          /* enum xsrc_copy_key_kind */
	__u32 key;               /* the peer's rkey or lkey */
	__u32 qp_handle;         /* the caller's QP the access is made through */
	__u32 peer_qpn;          /* the peer QP (or XRC SRQ's QP) it reaches;
				  * the key's PD must be that QP's (or SRQ's) PD */
	__aligned_u64 peer_addr;
	__aligned_u64 length;    /* bytes; 8 for the atomics */
	__aligned_u64 local_iov; /* struct iovec[num_local] in the caller */
	__u32 num_local;         /* <= XSRC_COPY_MAX_IOV */
	__u32 peer_srqn;         /* XRC targets: the SRQ the message names
				  * (its PD is the one checked); else 0 */
	__aligned_u64 compare_add;
	__aligned_u64 swap;
};

struct xsrc_copy_resp {
	__u32 status;  /* 0, or why nothing was moved: EACCES (key, rights, range,
			* PD), ESRCH (peer gone), EFAULT (caller's buffers) */
	__u32 reserved;
	__aligned_u64 bytes; /* bytes moved */
};

/* v9: driver data after struct xsrc_copy, for an XSRC_COPY_LKEY copy into a
 * receive taken from a ring: the ring position (the producer's count, not
 * the slot index) the caller popped it at. */
enum {
	XSRC_COPY_RECV_MASK_POS = 1u << 0,
};

struct xsrc_copy_recv {
	__u32 comp_mask;         /* XSRC_COPY_RECV_MASK_POS */
	__u32 reserved;
	__aligned_u64 recv_pos;
};

/* XSRC_CMD_BIND_MW (v4) */
#define XSRC_NO_HANDLE 0xffffffffu

struct xsrc_bind_mw {
	__u32 comp_mask;         /* 0 */
	__u32 qp_handle;         /* the caller's QP whose send queue carries the bind */
	__u32 mw_handle;
	__u32 mr_handle;         /* XSRC_NO_HANDLE: none (a type 1 window unbound) */
	__u32 rkey;              /* the window's new rkey: its index, the binder's key byte */
	__u32 access;            /* IB_UVERBS_ACCESS_* the window grants */
	__aligned_u64 addr;      /* in the MR's address space (its iova) */
	__aligned_u64 length;    /* 0: a type 1 window is unbound (invalidated) */
};

/* XSRC_CMD_INVALIDATE (v4) */
enum xsrc_invalidate_kind {
	XSRC_INVALIDATE_LOCAL = 1,  /* IBV_WR_LOCAL_INV: a window of the caller's QP's PD */
	XSRC_INVALIDATE_REMOTE = 2, /* SEND_WITH_INV: a window of the peer QP's PD, bound to it */
};

struct xsrc_invalidate {
	__u32 comp_mask;         /* 0 */
	__u32 kind;              /* enum xsrc_invalidate_kind */
	__u32 qp_handle;         /* the caller's QP */
	__u32 rkey;
	__u32 peer_qpn;          /* REMOTE: the responder QP, connected to qp_handle's; else 0 */
	__u32 reserved;          /* 0 */
};

/* XSRC_CMD_WIRE_RESPONSES (v8) */
enum {
	/* The caller reads batches: the daemon may put several responses in
	 * one message, each as a __u16 length (little-endian) followed by that
	 * many bytes, XSRC_WIRE_RESPONSE_BATCH_BYTES in all at most. Without
	 * it, one response per message. A daemon that predates the bit refuses
	 * it (EOPNOTSUPP, as any unknown comp_mask bit). */
	XSRC_WIRE_RESPONSES_BATCHED = 1 << 0,
	/* The caller gives the daemon an ACK board (board_fd, board_entries):
	 * the daemon may leave the acknowledgement it owes a request that
	 * reached one of the caller's RC QPs there for a moment, for the
	 * caller to send in front of its next request on that QP, and sends
	 * it itself if the caller has not taken it by then. A daemon that
	 * predates the bit refuses it (EOPNOTSUPP). */
	XSRC_WIRE_RESPONSES_ACK_BOARD = 1 << 1,
};
#define XSRC_WIRE_RESPONSE_BATCH_BYTES 65536

struct xsrc_wire_responses {
	__u32 comp_mask;         /* XSRC_WIRE_RESPONSES_* */
	__u32 fd;                /* the caller's end the daemon sends into */
	/* ACK_BOARD (the command is 8 bytes without them): a memfd sealed
	 * against shrinking (F_SEAL_SHRINK) of board_entries * 8 bytes at
	 * least; board_entries a power of two, at most XSRC_ACK_BOARD_MAX. */
	__u32 board_fd;
	__u32 board_entries;
};

/* An ACK board: one __u64 per entry, entry (QPN % board_entries) for an RC
 * QP, 0 or what the daemon owes for that QP's peer: XSRC_ACK_OWED, the QPN's
 * low 15 bits (XSRC_ACK_TAG), the MSN (bits 24..47) and the PSN (bits 0..23)
 * of an ACK. Both sides change an entry only by atomic compare-and-swap:
 * the caller takes a word of its QP (its tag) and sends that ACK (BTH, AETH
 * syndrome 0x1F) from the QP's UDP source port before its request; the
 * daemon sends it after its delay unless the word changed meanwhile. The
 * daemon trusts nothing else of the board. */
#define XSRC_ACK_BOARD_MAX 65536
#define XSRC_ACK_OWED (1ULL << 63)
#define XSRC_ACK_TAG(qpn) ((__u64)((qpn) & 0x7fff) << 48)
/* The bits that say whose a word is, and what they are for QP `qpn`. */
#define XSRC_ACK_OWNER_MASK (0xffffULL << 48)
#define XSRC_ACK_OWNER(qpn) (XSRC_ACK_OWED | XSRC_ACK_TAG(qpn))
#define XSRC_ACK_WORD(qpn, msn, psn) \
	(XSRC_ACK_OWNER(qpn) | (__u64)((msn) & 0xffffff) << 24 | ((psn) & 0xffffff))
#define XSRC_ACK_MSN(word) ((__u32)((word) >> 24) & 0xffffff)
#define XSRC_ACK_PSN(word) ((__u32)(word) & 0xffffff)

/* XSRC_CMD_RECV_SHADOW (v9) */
enum xsrc_recv_shadow_kind {
	XSRC_RECV_SHADOW_QP = 1,   /* handle: a QP with a receive ring of its own */
	XSRC_RECV_SHADOW_SRQ = 2,  /* handle: a basic or XRC SRQ */
};

struct xsrc_recv_shadow {
	__u32 comp_mask;         /* 0 */
	__u32 kind;              /* enum xsrc_recv_shadow_kind */
	__u32 handle;
	__u32 num_entries;       /* the ring's num_entries */
	__u32 stride;            /* bytes per entry: 8-aligned, at least
				  * sizeof(xsrc_recv_shadow_entry) + 16 */
	__u32 reserved;
	__aligned_u64 addr;      /* entry[0] in the caller's memory */
};

/* One entry of a receive shadow, for the receive posted at ring position
 * `pos` (slot pos % num_entries). The owner writes wr_id, num_sge and the
 * SGEs, then `posted` = pos + 1 (0: never posted). The entry stays valid
 * until the owner posts into the slot again (a lap later). */
struct xsrc_recv_shadow_entry {
	__aligned_u64 posted;
	__aligned_u64 wr_id;
	__u32 num_sge;
	__u32 reserved;
	/* struct xsrc_sge sge[num_sge] follow */
};

#endif /* XSRC_ABI_H */
