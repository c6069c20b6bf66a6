// The lock-free operations on the rings of the device arena
// (kernel-abi/xsrc-queues.h): CQ rings (many producers, one consumer) and
// receive rings (one producer, many consumers). The provider's data path
// and the daemon (which delivers what arrives from the wire) share them.
#pragma once

#include <infiniband/verbs.h>
#include <xsrc-queues.h>

#include <sched.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/atomic.h"

namespace xsrc {

// --- CQ ring ---------------------------------------------------------------

inline xsrc_cqe *cq_slot(xsrc_cq_ring *ring, uint64_t pos)
{
	auto *slots = reinterpret_cast<xsrc_cqe *>(ring + 1);
	return &slots[pos & (ring->num_entries - 1)];
}

inline unsigned char *cq_payload(xsrc_cq_ring *ring, uint64_t pos)
{
	auto *slots = reinterpret_cast<unsigned char *>(cq_slot(ring, 0));
	return slots + uint64_t(ring->num_entries) * sizeof(xsrc_cqe) +
	       (pos & (ring->num_entries - 1)) * ring->payload_stride;
}

// A payload that travels with a completion (XSRC_CQE_DEFERRED): gathered
// from these buffers of ours into the slot.
struct CqPayload {
	const struct iovec *iov = nullptr;
	size_t count = 0;
};

inline void gather(unsigned char *dst, CqPayload payload)
{
	for (size_t i = 0; i < payload.count; ++i) {
		std::memcpy(dst, payload.iov[i].iov_base, payload.iov[i].iov_len);
		dst += payload.iov[i].iov_len;
	}
}

// --- big payload slots (revision 5) ------------------------------------------

// The slot index lives in xsrc_cqe::big_slot: no pool may have more.
constexpr uint32_t kMaxCqBigSlots = 256;

inline uint64_t cq_big_pool_off(const xsrc_cq_ring *ring)
{
	return sizeof(xsrc_cq_ring) + uint64_t(ring->num_entries) * (sizeof(xsrc_cqe) + ring->payload_stride);
}

inline uint64_t cq_big_busy_bytes(const xsrc_cq_ring *ring)
{
	return (uint64_t(ring->big_slots) / 64 * sizeof(uint64_t) + 63) / 64 * 64;
}

// The ring's pool as its header describes it: a sane shape (the header is
// in the arena, which any process can write) within `room` bytes of the ring.
inline bool cq_big_pool_sane(const xsrc_cq_ring *ring, uint64_t room)
{
	uint32_t slots = ring->big_slots;
	if (!slots || slots > kMaxCqBigSlots || slots % 64 || !ring->big_stride || ring->big_stride > (1u << 20))
		return false;
	uint64_t end = cq_big_pool_off(ring) + cq_big_busy_bytes(ring) + uint64_t(slots) * ring->big_stride;
	return end <= room;
}

inline uint64_t *cq_big_busy(xsrc_cq_ring *ring)
{
	return reinterpret_cast<uint64_t *>(reinterpret_cast<unsigned char *>(ring) + cq_big_pool_off(ring));
}

inline unsigned char *cq_big_payload(xsrc_cq_ring *ring, uint32_t slot)
{
	return reinterpret_cast<unsigned char *>(cq_big_busy(ring)) + cq_big_busy_bytes(ring) +
	       uint64_t(slot) * ring->big_stride;
}

// Takes a free big slot (its busy bit), starting the search at `hint` so
// that producers spread out. -1 when every slot is taken.
inline int cq_big_claim(xsrc_cq_ring *ring, uint32_t hint)
{
	uint32_t words = ring->big_slots / 64;
	uint64_t *busy = cq_big_busy(ring);
	for (uint32_t n = 0; n < words; ++n) {
		uint32_t w = (hint / 64 + n) % words;
		auto word = atomic(busy[w]);
		uint64_t seen = word.load(std::memory_order_relaxed);
		while (~seen) {
			int bit = __builtin_ctzll(~seen);
			uint64_t mask = uint64_t(1) << bit;
			// Acquire: the consumer's copy out of the slot happened before it freed it.
			seen = word.fetch_or(mask, std::memory_order_acquire);
			if (!(seen & mask))
				return static_cast<int>(w * 64 + bit);
		}
	}
	return -1;
}

inline void cq_big_release(xsrc_cq_ring *ring, uint32_t slot)
{
	atomic(cq_big_busy(ring)[slot / 64]).fetch_and(~(uint64_t(1) << (slot % 64)), std::memory_order_release);
}

// No bound on the retries of a lock-free loop (the provider: the other
// side is a peer process of the device that makes progress).
inline constexpr unsigned kUnboundedTries = ~0u;

// Appends a completion. False when the CQ is full (an overrun), or after
// `max_tries` lost races (the daemon bounds them: a process could forge the
// ring's sequence numbers to keep it looping); a big slot the completion
// carries is then free again.
inline bool cq_push(xsrc_cq_ring *ring, const xsrc_cqe &cqe, CqPayload payload = {},
		    unsigned max_tries = kUnboundedTries)
{
	auto tail = atomic(ring->tail);
	__u64 pos = tail.load(std::memory_order_relaxed);
	for (unsigned tries = 0; tries != max_tries; ++tries) {
		xsrc_cqe *slot = cq_slot(ring, pos);
		uint64_t seq = atomic(slot->seq).load(std::memory_order_acquire);
		int64_t dif = static_cast<int64_t>(seq - pos);
		if (dif == 0) {
			// The application's cqe, not the ring's capacity, is the limit.
			uint64_t head = atomic(ring->head).load(std::memory_order_acquire);
			if (static_cast<int64_t>(pos - head) < 0) {
				pos = tail.load(std::memory_order_relaxed);  // ours is stale
				continue;
			}
			if (pos - head >= ring->cqe)
				break;
			if (tail.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
				std::memcpy(reinterpret_cast<char *>(slot) + sizeof(slot->seq),
					    reinterpret_cast<const char *>(&cqe) + sizeof(cqe.seq),
					    sizeof(cqe) - sizeof(cqe.seq));
				if (payload.count)
					gather(cq_payload(ring, pos), payload);
				atomic(slot->seq).store(pos + 1, std::memory_order_release);
				return true;
			}
		} else if (dif < 0) {
			break;
		} else {
			pos = tail.load(std::memory_order_relaxed);
		}
	}
	if (cqe.flags & XSRC_CQE_DEFERRED_BIG)
		cq_big_release(ring, cqe.big_slot);
	return false;
}

// After cq_push() failed for want of room: true the first time, when the
// overrun is the owner's to hear about (IBV_EVENT_CQ_ERR).
inline bool cq_first_overrun(xsrc_cq_ring *ring)
{
	return atomic(ring->overflow).exchange(1, std::memory_order_acq_rel) == 0;
}

// After cq_push() placed `cqe`: does it fire the CQ's armed event? If so the
// arm is consumed (one event per arming). The fence pairs with the seq_cst
// store that arms the CQ: either we see the arm, or the owner's poll after
// arming sees this completion.
inline bool cq_consume_arm(xsrc_cq_ring *ring, const xsrc_cqe &cqe)
{
	std::atomic_thread_fence(std::memory_order_seq_cst);
	auto armed = atomic(ring->armed);
	uint32_t mode = armed.load(std::memory_order_acquire);
	if (mode == XSRC_CQ_ARMED_NONE)
		return false;
	bool wanted = mode == XSRC_CQ_ARMED_NEXT || (cqe.flags & XSRC_CQE_SOLICITED) ||
		      cqe.status != IBV_WC_SUCCESS;
	return wanted && armed.compare_exchange_strong(mode, XSRC_CQ_ARMED_NONE, std::memory_order_acq_rel);
}

// The ring as its consumer sees it, read once into the consumer's own
// memory: the header shares a cache line with `tail`, which every producer
// writes, so reading the shape from there on every poll would stall on it.
// The shape is the daemon's (it never changes while the ring lives).
struct CqShape {
	xsrc_cqe *slots = nullptr;
	unsigned char *payload = nullptr;  // the payload slots
	uint32_t mask = 0;                 // num_entries - 1
	uint32_t num_entries = 0;
	uint32_t payload_stride = 0;
	uint32_t big_slots = 0;
	uint32_t big_stride = 0;
	uint64_t *big_busy = nullptr;
	unsigned char *big = nullptr;      // big slot 0

	static CqShape of(xsrc_cq_ring *ring)
	{
		CqShape s;
		s.slots = cq_slot(ring, 0);
		s.payload = cq_payload(ring, 0);
		s.num_entries = ring->num_entries;
		s.mask = s.num_entries - 1;
		s.payload_stride = ring->payload_stride;
		s.big_slots = ring->big_slots;
		s.big_stride = ring->big_stride;
		if (s.big_slots) {
			s.big_busy = cq_big_busy(ring);
			s.big = cq_big_payload(ring, 0);
		}
		return s;
	}
};

// Takes the completion at `pos`, the consumer's own position (it is the
// only consumer), without publishing a new head: the caller does that once
// per poll (cq_publish_head), as an HCA's provider writes its consumer index
// once per poll. A payload that travels with it is placed only where
// may_write(va, len) says this process registered memory for it: the ring
// is in the arena, which any process can write, so deferred_va is never
// trusted by itself. A payload that may not be placed turns the completion
// into IBV_WC_LOC_PROT_ERR.
template <typename MayWrite>
inline bool cq_take(const CqShape &ring, uint64_t pos, xsrc_cqe &out, MayWrite &&may_write)
{
	xsrc_cqe *slot = &ring.slots[pos & ring.mask];
	if (atomic(slot->seq).load(std::memory_order_acquire) != pos + 1)
		return false;
	out = *slot;
	if (out.flags & XSRC_CQE_DEFERRED) {
		if (out.byte_len <= ring.payload_stride && may_write(out.deferred_va, out.byte_len)) {
			std::memcpy(reinterpret_cast<void *>(out.deferred_va),
				    ring.payload + (pos & ring.mask) * ring.payload_stride, out.byte_len);
		} else {
			out.status = IBV_WC_LOC_PROT_ERR;
			out.byte_len = 0;
		}
	} else if (out.flags & XSRC_CQE_DEFERRED_BIG) {
		bool known = out.big_slot < ring.big_slots;
		if (known && out.byte_len <= ring.big_stride && may_write(out.deferred_va, out.byte_len)) {
			std::memcpy(reinterpret_cast<void *>(out.deferred_va),
				    ring.big + uint64_t(out.big_slot) * ring.big_stride, out.byte_len);
		} else {
			out.status = IBV_WC_LOC_PROT_ERR;
			out.byte_len = 0;
		}
		if (known)
			atomic(ring.big_busy[out.big_slot / 64])
				.fetch_and(~(uint64_t(1) << (out.big_slot % 64)), std::memory_order_release);
	}
	// The slot is the producers' again one lap on.
	atomic(slot->seq).store(pos + ring.num_entries, std::memory_order_release);
	return true;
}

// Tells producers how far the consumer got: they count free entries from it.
inline void cq_publish_head(xsrc_cq_ring *ring, uint64_t pos)
{
	atomic(ring->head).store(pos, std::memory_order_release);
}

// cq_take() at the published head, publishing the next one.
template <typename MayWrite>
inline bool cq_pop(xsrc_cq_ring *ring, xsrc_cqe &out, MayWrite &&may_write)
{
	uint64_t pos = atomic(ring->head).load(std::memory_order_relaxed);
	if (!cq_take(CqShape::of(ring), pos, out, may_write))
		return false;
	cq_publish_head(ring, pos + 1);
	return true;
}

// --- receive ring ----------------------------------------------------------

inline xsrc_recv_wqe *recv_slot(xsrc_recv_ring *ring, uint64_t pos)
{
	auto *slots = reinterpret_cast<unsigned char *>(ring + 1);
	return reinterpret_cast<xsrc_recv_wqe *>(slots + (pos & (ring->num_entries - 1)) * ring->stride);
}

inline xsrc_sge *recv_sges(xsrc_recv_wqe *wqe)
{
	return reinterpret_cast<xsrc_sge *>(wqe + 1);
}

inline uint64_t recv_count(xsrc_recv_ring *ring)
{
	return atomic(ring->tail).load(std::memory_order_acquire) -
	       atomic(ring->head).load(std::memory_order_acquire);
}

// Posts a receive (the owner is the only producer). False when full.
// `on_slot(pos)` runs once the slot at ring position `pos` is ours, before
// the receive is published (the owner records it privately there).
template <typename OnSlot>
inline bool recv_push(xsrc_recv_ring *ring, uint64_t wr_id, const xsrc_sge *sge, uint32_t num_sge, OnSlot &&on_slot)
{
	uint64_t pos = atomic(ring->tail).load(std::memory_order_relaxed);
	uint64_t head = atomic(ring->head).load(std::memory_order_acquire);
	if (pos - head >= ring->max_wr)
		return false;
	xsrc_recv_wqe *slot = recv_slot(ring, pos);
	// A consumer that claimed this slot a lap ago may still be copying it
	// out (or was preempted doing so): give it a moment.
	constexpr unsigned kMaxSpins = 4096, kSpinsPerYield = 64;
	for (unsigned spins = 0; atomic(slot->seq).load(std::memory_order_acquire) != pos; ++spins) {
		if (spins == kMaxSpins)
			return false;
		if (spins % kSpinsPerYield == kSpinsPerYield - 1)
			sched_yield();
	}
	on_slot(pos);
	slot->wr_id = wr_id;
	slot->num_sge = num_sge;
	std::memcpy(recv_sges(slot), sge, num_sge * sizeof(xsrc_sge));
	atomic(slot->seq).store(pos + 1, std::memory_order_release);
	atomic(ring->tail).store(pos + 1, std::memory_order_release);
	return true;
}

inline bool recv_push(xsrc_recv_ring *ring, uint64_t wr_id, const xsrc_sge *sge, uint32_t num_sge)
{
	return recv_push(ring, wr_id, sge, num_sge, [](uint64_t) {});
}

// A receive WQE copied out of a ring.
struct RecvWqe {
	uint64_t wr_id = 0;
	uint32_t num_sge = 0;
	xsrc_sge sge[XSRC_MAX_RECV_SGE];
	bool from_ring = false;  // popped from a receive ring, at ring position `pos`
	uint64_t pos = 0;
};

// Claims the oldest posted receive (any process may consume). False if
// none, or after `max_tries` lost races (as cq_push).
inline bool recv_pop(xsrc_recv_ring *ring, RecvWqe &out, unsigned max_tries = kUnboundedTries)
{
	auto head = atomic(ring->head);
	__u64 pos = head.load(std::memory_order_relaxed);
	for (unsigned tries = 0; tries != max_tries; ++tries) {
		xsrc_recv_wqe *slot = recv_slot(ring, pos);
		uint64_t seq = atomic(slot->seq).load(std::memory_order_acquire);
		int64_t dif = static_cast<int64_t>(seq - (pos + 1));
		if (dif == 0) {
			if (head.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
				out.wr_id = slot->wr_id;
				out.from_ring = true;
				out.pos = pos;
				out.num_sge = slot->num_sge <= XSRC_MAX_RECV_SGE ? slot->num_sge : 0;
				std::memcpy(out.sge, recv_sges(slot), out.num_sge * sizeof(xsrc_sge));
				atomic(slot->seq).store(pos + ring->num_entries, std::memory_order_release);
				return true;
			}
		} else if (dif < 0) {
			return false;
		} else {
			pos = head.load(std::memory_order_relaxed);
		}
	}
	return false;
}

}  // namespace xsrc
