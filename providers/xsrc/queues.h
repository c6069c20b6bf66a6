// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The device arena as the provider sees it, and the lock-free ring
// operations on it: CQ rings (many producers, one consumer) and receive
// rings (one producer, many consumers). Formats: kernel-abi/xsrc-queues.h.
#pragma once

#include <infiniband/verbs.h>
#include <xsrc-qp-state.h>
#include <xsrc-queues.h>

#include <sched.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/atomic.h"
#include "common/ids.h"
#include "common/ring_ops.h"

namespace xsrc {

// The state of a QP table entry (the arena's encoding: xsrc-qp-state.h).
inline ibv_qp_state qp_state_load(const xsrc_qp_entry &e)
{
	return xsrc_qp_state_decode(load_acquire(const_cast<__u32 &>(e.state)));
}

inline void qp_state_store(xsrc_qp_entry &e, ibv_qp_state state)
{
	store_release(e.state, xsrc_qp_state_encode(state));
}

// An MR key is its table index << 8 | a salt (xsrc_mr_entry::key).
constexpr unsigned kMrKeyIndexShift = 8;

// One device's shared-memory arena, mapped into this process. Where its
// tables are is read from its header once, when it is adopted, and checked
// to lie within it: the header is anyone's to write, so read again later it
// could send an access anywhere (or, with a table past the end, fault).
struct Arena {
	unsigned char *base = nullptr;
	size_t size = 0;
	// Where adopt() found the tables (public, as every member here: the
	// context that holds this stays a standard-layout type).
	xsrc_qp_entry *qps_ = nullptr;
	xsrc_mr_entry *mrs_ = nullptr;
	xsrc_srq_entry *srqs_ = nullptr;
	uint32_t *locks_ = nullptr;
	xsrc_mcast_table *mcast_ = nullptr;

	// Takes the mapping of `bytes` at `mapped` whose header is complete:
	// false, nothing taken, when a table does not fit it.
	bool adopt(unsigned char *mapped, size_t bytes)
	{
		const auto &h = *reinterpret_cast<const xsrc_arena_header *>(mapped);
		auto table = [mapped, bytes](uint64_t off, uint64_t len, size_t entry) -> unsigned char * {
			return off >= sizeof(xsrc_arena_header) && off <= bytes && len * entry <= bytes - off ? mapped + off
													       : nullptr;
		};
		unsigned char *qps = table(h.qp_table_off, XSRC_QP_TABLE_LEN, sizeof(xsrc_qp_entry));
		unsigned char *mrs = table(h.mr_table_off, XSRC_MR_TABLE_LEN, sizeof(xsrc_mr_entry));
		unsigned char *srqs = table(h.srq_table_off, XSRC_SRQ_TABLE_LEN, sizeof(xsrc_srq_entry));
		unsigned char *locks = table(h.atomic_locks_off, XSRC_ATOMIC_LOCKS, sizeof(uint32_t));
		if (!qps || !mrs || !srqs || !locks)
			return false;
		base = mapped;
		size = bytes;
		qps_ = reinterpret_cast<xsrc_qp_entry *>(qps);
		mrs_ = reinterpret_cast<xsrc_mr_entry *>(mrs);
		srqs_ = reinterpret_cast<xsrc_srq_entry *>(srqs);
		locks_ = reinterpret_cast<uint32_t *>(locks);
		// The multicast table (r3) is optional: an arena without one (or
		// with one that does not fit) has none.
		constexpr uint64_t mcast_bytes = sizeof(xsrc_mcast_table) + uint64_t(XSRC_MCAST_GROUPS) * sizeof(xsrc_mcast_group);
		mcast_ = reinterpret_cast<xsrc_mcast_table *>(table(h.mcast_table_off, 1, mcast_bytes));
		return true;
	}

	const xsrc_arena_header &header() const
	{
		return *reinterpret_cast<const xsrc_arena_header *>(base);
	}
	template <typename T>
	T *at(uint64_t off) const
	{
		return off && off + sizeof(T) <= size ? reinterpret_cast<T *>(base + off) : nullptr;
	}
	xsrc_qp_entry *qp(Qpn qpn) const
	{
		uint32_t n = qpn.value();
		if (!qps_ || n < XSRC_QPN_BASE || n - XSRC_QPN_BASE >= XSRC_QP_TABLE_LEN)
			return nullptr;
		return qps_ + (n - XSRC_QPN_BASE);
	}
	// An lkey and an rkey name the same table entry.
	xsrc_mr_entry *mr(Lkey key) const { return mr_at(key.value()); }
	xsrc_mr_entry *mr(Rkey key) const { return mr_at(key.value()); }
	xsrc_srq_entry *srq(Srqn srqn) const
	{
		uint32_t n = srqn.value();
		if (!srqs_ || n < XSRC_SRQN_BASE || n - XSRC_SRQN_BASE >= XSRC_SRQ_TABLE_LEN)
			return nullptr;
		return srqs_ + (n - XSRC_SRQN_BASE);
	}
	// The multicast table (driver ABI r3), or null when the arena has none
	// or it does not fit.
	xsrc_mcast_table *mcast_table() const
	{
		return mcast_ && mcast_->num_groups == XSRC_MCAST_GROUPS ? mcast_ : nullptr;
	}
	// The lock word for `hash`; null only before adopt().
	uint32_t *atomic_lock(uint64_t hash) const
	{
		return locks_ ? locks_ + hash % XSRC_ATOMIC_LOCKS : nullptr;
	}

private:
	xsrc_mr_entry *mr_at(uint32_t key) const
	{
		uint32_t index = key >> kMrKeyIndexShift;
		if (!mrs_ || index >= XSRC_MR_TABLE_LEN)
			return nullptr;
		return mrs_ + index;
	}
};

// Pids of peers whose memory we may not reach ourselves (another user):
// learnt once per peer, then their traffic goes through the device. A small
// open-addressed set of atomics, zero-initialised; when it is full a peer is
// simply learnt again (one more failed system call), never lost.
struct PeerSet {
	static constexpr size_t kSlots = 64;
	static constexpr size_t kProbes = 4;  // slots a pid may sit in
	uint32_t slots[kSlots];

	bool contains(uint32_t pid) const
	{
		for (size_t i = 0; i < kProbes; ++i)
			if (atomic(const_cast<uint32_t &>(slots[(pid + i) % kSlots]))
				    .load(std::memory_order_relaxed) == pid)
				return true;
		return false;
	}
	void add(uint32_t pid)
	{
		for (size_t i = 0; i < kProbes; ++i) {
			uint32_t expected = 0;
			if (atomic(slots[(pid + i) % kSlots])
				    .compare_exchange_strong(expected, pid, std::memory_order_relaxed) ||
			    expected == pid)
				return;
		}
	}
};

}  // namespace xsrc
