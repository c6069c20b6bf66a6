// Sizing and initialisation of the rings the daemon creates in an arena (CQ
// rings, receive rings of QPs and SRQs), and the atomic accesses the daemon
// makes to shared fields. The data path's side lives in the provider.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "common/atomic.h"
#include "common/ring_ops.h"
#include "xsrc-queues.h"

namespace xsrc {

// Smallest power of two >= v (v >= 1).
uint64_t pow2_at_least(uint64_t v);

// --- CQ rings --------------------------------------------------------------

// Slots for a CQ of `cqe` entries: a power of two >= 2 * (cqe + 1), at least
// 64, but no more than the power of two that holds the device's largest CQ.
uint32_t cq_ring_entries(uint32_t cqe);
// With `big_slots` big payload slots (revision 5; 0 or a multiple of 64).
uint64_t cq_ring_bytes(uint32_t entries, uint32_t big_slots = 0);
// Initialises zeroed memory: slot i's seq = i, head = tail = 0, not armed,
// every big slot free (its pool is not announced until the owner polls it).
void cq_ring_init(xsrc_cq_ring &ring, uint32_t entries, uint32_t cqe, pid_t owner, uint32_t big_slots = 0);
// Completions produced and not yet consumed (as far as the head says).
uint64_t cq_ring_pending(xsrc_cq_ring &ring);
// The arena is writable by every process of the device: the daemon indexes
// a ring by the shape it made it with, never by what the header says now.
CqShape cq_ring_shape(uint32_t entries, uint32_t cqe);

// --- receive rings (QP receive queues, SRQs) --------------------------------

// A power of two >= max_wr + 1, at least 2.
uint32_t recv_ring_entries(uint32_t max_wr);
// sizeof(xsrc_recv_wqe) + max_sge SGEs, rounded up to 64 bytes.
uint32_t recv_ring_stride(uint32_t max_sge);
uint64_t recv_ring_bytes(uint32_t entries, uint32_t stride);
// The ring for max_wr receives of max_sge SGEs (entries and stride as above).
RecvShape recv_ring_shape(uint32_t max_wr, uint32_t max_sge);
uint64_t recv_ring_bytes(const RecvShape &shape);
// Initialises zeroed memory of `shape`: slot i's seq = i, head = tail = 0,
// no SRQ limit.
void recv_ring_init(xsrc_recv_ring &ring, const RecvShape &shape, uint32_t max_wr, uint32_t max_sge,
		    pid_t owner);
// A tag-matching SRQ's tag table (r7) in zeroed memory: every entry free.
void tm_table_init(xsrc_tm_table &table, uint32_t num_tags, uint32_t max_sge);
// Empties a ring of `shape` in place (a QP that goes to RESET loses its
// posted WQEs).
void recv_ring_reset(xsrc_recv_ring &ring, const RecvShape &shape);
// WQEs posted and not yet consumed.
uint64_t recv_ring_pending(xsrc_recv_ring &ring);

}  // namespace xsrc
