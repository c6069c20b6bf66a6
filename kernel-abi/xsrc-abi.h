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

/* Published as class/infiniband_verbs/uverbsN/abi_version and checked by
 * libibverbs against the provider's match_{min,max}_abi_version. */
#define XSRC_DRIVER_ABI_VERSION 1
#define XSRC_DRIVER_ABI_MIN_VERSION 1

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

/* Appended to struct ib_uverbs_create_cq / ib_uverbs_ex_create_cq: nothing
 * yet, but the response carries driver data. */
struct xsrc_create_cq_resp {
	__u32 comp_mask;
	__u32 channel_pool_free;
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
