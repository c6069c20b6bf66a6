/* SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB) */
/*
 * The one codec for xsrc_qp_entry.state (xsrc-queues.h): the arena stores
 * enum ibv_qp_state + 1, so that a zeroed slot (XSRC_QP_STATE_FREE) is free.
 * Everything that reads or writes the field goes through these.
 */
#ifndef XSRC_QP_STATE_H
#define XSRC_QP_STATE_H

#include <infiniband/verbs.h>
#include <linux/types.h>

#include "xsrc-queues.h"

static inline __u32 xsrc_qp_state_encode(enum ibv_qp_state state)
{
	return (__u32)state + 1;
}

/*
 * IBV_QPS_UNKNOWN for a free slot; a value past IBV_QPS_ERR (an entry that
 * was scribbled on) reads as IBV_QPS_ERR, so it never looks usable.
 */
static inline enum ibv_qp_state xsrc_qp_state_decode(__u32 raw)
{
	if (raw == XSRC_QP_STATE_FREE)
		return IBV_QPS_UNKNOWN;
	if (raw - 1 > (__u32)IBV_QPS_ERR)
		return IBV_QPS_ERR;
	return (enum ibv_qp_state)(raw - 1);
}

#endif /* XSRC_QP_STATE_H */
