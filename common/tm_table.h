// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The tag table of a tag-matching SRQ (driver ABI r7, xsrc-queues.h): where
// it sits after the SRQ's ring, its geometry, and its lock. Shared by the
// daemon, which lays it out, and the provider, which adds tags (the owner)
// and matches messages against them (any initiator).
#pragma once

#include <xsrc-queues.h>

#include <sched.h>
#include <signal.h>

#include <cerrno>
#include <cstdint>

#include "common/atomic.h"
#include "common/pid_lock.h"

namespace xsrc {

constexpr uint32_t kTmAlign = 64;
static_assert(sizeof(xsrc_tm_table) % kTmAlign == 0, "entries follow the header 64-byte aligned");

inline uint32_t tm_entry_stride(uint32_t max_sge)
{
	uint32_t bytes = sizeof(xsrc_tm_entry) + max_sge * sizeof(xsrc_sge);
	return (bytes + kTmAlign - 1) / kTmAlign * kTmAlign;
}

inline uint64_t tm_table_bytes(uint32_t num_tags, uint32_t max_sge)
{
	return sizeof(xsrc_tm_table) + uint64_t(num_tags) * tm_entry_stride(max_sge);
}

// Where the table of the SRQ whose ring is at `ring_off` starts.
inline uint64_t tm_table_offset(uint64_t ring_off, const xsrc_recv_ring &ring)
{
	return ring_off + sizeof(xsrc_recv_ring) + uint64_t(ring.num_entries) * ring.stride;
}

// Whether a table of this geometry fits `room` bytes (an arena may be forged).
inline bool tm_table_sane(const xsrc_tm_table &table, uint64_t room)
{
	return table.num_tags && table.num_tags <= XSRC_TM_MAX_TAGS && table.max_sge &&
	       table.max_sge <= XSRC_MAX_RECV_SGE && table.stride == tm_entry_stride(table.max_sge) &&
	       tm_table_bytes(table.num_tags, table.max_sge) <= room;
}

inline xsrc_tm_entry *tm_entry_at(xsrc_tm_table *table, uint32_t index)
{
	auto *entries = reinterpret_cast<unsigned char *>(table + 1);
	return reinterpret_cast<xsrc_tm_entry *>(entries + uint64_t(index) * table->stride);
}

inline xsrc_sge *tm_entry_sges(xsrc_tm_entry *entry)
{
	return reinterpret_cast<xsrc_sge *>(entry + 1);
}

// The handle ibv_post_srq_ops reports for an entry.
constexpr unsigned kTmHandleGenerationShift = 16;
constexpr uint32_t kTmHandleIndexMask = (1u << kTmHandleGenerationShift) - 1;
static_assert(XSRC_TM_MAX_TAGS <= kTmHandleIndexMask + 1);

inline uint32_t tm_handle(uint32_t index, uint32_t generation)
{
	return generation << kTmHandleGenerationShift | index;
}

// The table's lock: the holder's pid in `lock`. Held only for a scan of the
// table and a few stores, never across a system call; a holder that died
// holding it (its pid is gone) is taken over, by a waiter in the device's
// PID namespace (`direct`) or else by xsrcd (pid_lock.h).
class TmLock {
public:
	TmLock(xsrc_tm_table &table, uint32_t me, bool direct) : word_(table.lock) { pid_lock_take(word_, me, direct); }
	~TmLock() { pid_lock_release(word_); }
	TmLock(const TmLock &) = delete;
	TmLock &operator=(const TmLock &) = delete;

private:
	uint32_t &word_;
};

}  // namespace xsrc
