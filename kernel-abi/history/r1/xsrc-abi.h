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
/*
 * FROZEN: revision 1 of generation 1, verbatim from commit 2c59a6b except for
 * this comment and XSRC_DRIVER_ABI_REVISION below. Never edit it: the r1
 * provider build (xsrc_provider_r1) and the layout tests compile against it
 * to prove that today's daemon still serves revision-1 callers.
 */
#ifndef XSRC_ABI_H
#define XSRC_ABI_H

#include <linux/types.h>
#include <rdma/ib_user_verbs.h>

/* Published as class/infiniband_verbs/uverbsN/abi_version and checked by
 * libibverbs against the provider's match_{min,max}_abi_version. */
#define XSRC_DRIVER_ABI_VERSION 1
#define XSRC_DRIVER_ABI_MIN_VERSION 1

/* Added when the header was frozen (see ../../README.md). */
#define XSRC_DRIVER_ABI_REVISION 1

/* The core uverbs ABI xsrcd serves (class/infiniband_verbs/abi_version). */
#define XSRC_UVERBS_ABI_VERSION 6

/* Name of the file in the device's sysfs directory
 * (class/infiniband/<ibdev>/) that holds the absolute path of the directory in
 * which the provider creates its command file. */
#define XSRC_SYSFS_CMD_DIR_FILE "xsrc_cmd_dir"

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
	XSRC_GET_CONTEXT_RESP_MASK_ALL = 0,
};

/* Appended to struct ib_uverbs_get_context_resp. */
struct xsrc_get_context_resp {
	__u32 comp_mask;        /* xsrc_get_context_resp_mask */
	__u32 driver_abi;       /* XSRC_DRIVER_ABI_VERSION the daemon speaks */
	__u64 context_id;       /* daemon-wide id of this context */
	__u32 max_inline_data;  /* per-QP inline limit the device honours */
	__u32 channel_pool_free; /* registered channel pipes not yet handed out */
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

struct xsrc_channel_pool_resp {
	__u32 channel_pool_free;
	__u32 reserved;
};

#endif /* XSRC_ABI_H */
