// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Verbs tag matching (driver ABI r7): the tag table of a TM-SRQ as the
// provider uses it. tm.cpp has the owner's side (ibv_post_srq_ops) and the
// match an initiator makes when it delivers a SEND to a QP on the SRQ
// (shm_responder.cpp); the table's format is in xsrc-queues.h.
#pragma once

#include <infiniband/tm_types.h>
#include <infiniband/verbs.h>

#include <cstdint>

#include "queues.h"

// The tag table of the SRQ whose ring is at `ring_off`, or null when the
// arena has none there that makes sense.
xsrc_tm_table *xsrc_tm_table_of(const xsrc::Arena &arena, uint64_t ring_off) noexcept;

enum class xsrc_tm_outcome {
	matched,     // a tagged buffer took the message: `out` holds it
	unexpected,  // no tag matched: `out` is a receive of the SRQ's ring
	no_receive,  // no tag matched and the ring has no receive: nothing taken
};

// The match of a tagged message (EAGER or RENDEZVOUS TMH) with `tag`, as
// one step under the table's lock: the earliest posted entry that matches
// is taken (it leaves the table), else a receive of `ring` and the
// unexpected count goes up. `me` is our pid as the device knows it,
// `direct` whether we share the device's PID namespace (TmLock).
xsrc_tm_outcome xsrc_tm_match(xsrc_tm_table *table, xsrc_recv_ring *ring, const xsrc::RecvShape &shape, uint64_t tag,
			      uint32_t me, bool direct, xsrc::RecvWqe &out) noexcept;

// After the completion of our SEND of a rendezvous request: the FIN its
// responder sent (qp->tm_fin) into our receive queue (shm_responder.cpp).
struct xsrc_context;
struct xsrc_qp;
void xsrc_tm_deliver_fin(xsrc_context *ctx, xsrc_qp *qp) noexcept;

int xsrc_post_srq_ops(ibv_srq *srq, ibv_ops_wr *wr, ibv_ops_wr **bad_wr) noexcept;
