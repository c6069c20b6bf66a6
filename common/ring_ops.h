// The lock-free operations on the rings of the device arena
// (kernel-abi/xsrc-queues.h): CQ rings (many producers, one consumer) and
// receive rings (one producer, many consumers). The provider's data path
// and the daemon (which delivers what arrives from the wire) share them.
#pragma once

#include <infiniband/verbs.h>
#include <xsrc-abi.h>
#include <xsrc-queues.h>

#include <sched.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/atomic.h"

namespace xsrc {

// --- CQ ring ---------------------------------------------------------------

// The ring's first CQE: right behind its header.
inline xsrc_cqe *cq_slots(xsrc_cq_ring *ring)
{
	return reinterpret_cast<xsrc_cqe *>(ring + 1);
}

// What a producer computes a CQ ring's addresses from. The header is in the
// arena, which another process may write at any moment: the daemon places by
// the shape it made the ring with; a provider reads the header once
// (cq_shape), checks that copy (cq_shape_fits) and places by the copy, never
// by the header again.
struct CqShape {
	uint64_t entries = 0;  // a power of two
	uint64_t payload_stride = 0;
	uint64_t cqe = 0;      // the application's
	uint64_t big_slots = 0;  // revision 5: the big pool (0: none)
	uint64_t big_stride = 0;
};

inline CqShape cq_shape(const xsrc_cq_ring *ring)
{
	auto &r = const_cast<xsrc_cq_ring &>(*ring);
	return {atomic(r.num_entries).load(std::memory_order_relaxed),
		atomic(r.payload_stride).load(std::memory_order_relaxed), atomic(r.cqe).load(std::memory_order_relaxed),
		atomic(r.big_slots).load(std::memory_order_relaxed), atomic(r.big_stride).load(std::memory_order_relaxed)};
}

// The entries and payload slots of a ring of `shape` lie within `room` bytes
// from its header on (the big pool is checked apart: cq_big_pool_sane).
inline bool cq_shape_fits(const CqShape &shape, uint64_t room)
{
	const uint64_t n = shape.entries;
	if (!n || (n & (n - 1)) || room < sizeof(xsrc_cq_ring) || shape.payload_stride > room)
		return false;
	return n <= (room - sizeof(xsrc_cq_ring)) / (sizeof(xsrc_cqe) + shape.payload_stride);
}

inline xsrc_cqe *cq_slot(xsrc_cq_ring *ring, const CqShape &shape, uint64_t pos)
{
	return &cq_slots(ring)[pos & (shape.entries - 1)];
}

inline xsrc_cqe *cq_slot(xsrc_cq_ring *ring, uint64_t pos)
{
	return cq_slot(ring, cq_shape(ring), pos);
}

inline unsigned char *cq_payload(xsrc_cq_ring *ring, const CqShape &shape, uint64_t pos)
{
	auto *slots = reinterpret_cast<unsigned char *>(cq_slots(ring));
	return slots + shape.entries * sizeof(xsrc_cqe) + (pos & (shape.entries - 1)) * shape.payload_stride;
}

inline unsigned char *cq_payload(xsrc_cq_ring *ring, uint64_t pos)
{
	return cq_payload(ring, cq_shape(ring), pos);
}

// A payload that travels with a completion (XSRC_CQE_DEFERRED): gathered
// from these buffers of ours into the slot.
struct CqPayload {
	const struct iovec *iov = nullptr;
	size_t count = 0;
};

// Copies `len` bytes to a slot the consumer read last time round. From a
// cache-line boundary on, x86's string move stores whole lines without
// reading them first (ERMSB), where vector stores each fetch the line back
// from the consumer's cache: ib_send_bw 1 KiB 3.0 -> 3.5 M msg/s on this VM.
// Only where both ends start a line: a UD datagram's payload, after its
// 40-byte GRH, lost 18 % with it.
inline void copy_to_slot(unsigned char *dst, const void *src, size_t len)
{
#if defined(__x86_64__)
	if (len >= 512 && (reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % 64 == 0) {
		asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(len) : : "memory");
		return;
	}
#endif
	std::memcpy(dst, src, len);
}

inline void gather(unsigned char *dst, CqPayload payload)
{
	for (size_t i = 0; i < payload.count; ++i) {
		copy_to_slot(dst, payload.iov[i].iov_base, payload.iov[i].iov_len);
		dst += payload.iov[i].iov_len;
	}
}

// --- big payload slots (revision 5) ------------------------------------------

// The slot index lives in xsrc_cqe::big_slot: no pool may have more.
constexpr uint32_t kMaxCqBigSlots = 256;

inline uint64_t cq_big_pool_off(const CqShape &shape)
{
	return sizeof(xsrc_cq_ring) + shape.entries * (sizeof(xsrc_cqe) + shape.payload_stride);
}

inline uint64_t cq_big_busy_bytes(const CqShape &shape)
{
	return (shape.big_slots / 64 * sizeof(uint64_t) + 63) / 64 * 64;
}

// The pool of a ring of `shape` (read from its header, which any process can
// write) is sane and lies within `room` bytes of the ring, as its entries
// and payload slots do.
inline bool cq_big_pool_sane(const CqShape &shape, uint64_t room)
{
	const uint64_t slots = shape.big_slots;
	if (!slots || slots > kMaxCqBigSlots || slots % 64 || !shape.big_stride || shape.big_stride > (1u << 20) ||
	    !cq_shape_fits(shape, room))
		return false;
	uint64_t end = cq_big_pool_off(shape) + cq_big_busy_bytes(shape) + slots * shape.big_stride;
	return end <= room;
}

inline uint64_t *cq_big_busy(xsrc_cq_ring *ring, const CqShape &shape)
{
	return reinterpret_cast<uint64_t *>(reinterpret_cast<unsigned char *>(ring) + cq_big_pool_off(shape));
}

inline unsigned char *cq_big_payload(xsrc_cq_ring *ring, const CqShape &shape, uint32_t slot)
{
	return reinterpret_cast<unsigned char *>(cq_big_busy(ring, shape)) + cq_big_busy_bytes(shape) +
	       uint64_t(slot) * shape.big_stride;
}

inline unsigned char *cq_big_payload(xsrc_cq_ring *ring, uint32_t slot)
{
	return cq_big_payload(ring, cq_shape(ring), slot);
}

// Takes a free big slot (its busy bit) of the ring of `shape`, starting the
// search at `hint` so that producers spread out. -1 when every slot is taken.
inline int cq_big_claim(xsrc_cq_ring *ring, const CqShape &shape, uint32_t hint)
{
	const uint64_t words = shape.big_slots / 64;
	uint64_t *busy = cq_big_busy(ring, shape);
	for (uint32_t n = 0; n < words; ++n) {
		uint64_t w = (hint / 64 + n) % words;
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

inline int cq_big_claim(xsrc_cq_ring *ring, uint32_t hint)
{
	return cq_big_claim(ring, cq_shape(ring), hint);
}

inline void cq_big_release(xsrc_cq_ring *ring, const CqShape &shape, uint32_t slot)
{
	atomic(cq_big_busy(ring, shape)[slot / 64]).fetch_and(~(uint64_t(1) << (slot % 64)), std::memory_order_release);
}

// No bound on the retries of a lock-free loop (the provider: the other
// side is a peer process of the device that makes progress).
inline constexpr unsigned kUnboundedTries = ~0u;

// The consumer publishes its head lazily (CqConsumer::publish): a head that
// says the CQ is full may be stale. The completion `cqe` places before
// `pos` tells the truth: once the consumer took it (its slot is free for the
// next lap), fewer than `cqe` completions are outstanding.
inline bool cq_room_behind_head(xsrc_cq_ring *ring, const CqShape &shape, uint64_t pos)
{
	if (pos < shape.cqe)
		return true;
	uint64_t oldest = pos - shape.cqe;
	uint64_t seq = atomic(cq_slot(ring, shape, oldest)->seq).load(std::memory_order_acquire);
	return static_cast<int64_t>(seq - oldest) >= static_cast<int64_t>(shape.entries);
}

// The arm a completion `cqe` fires, if the CQ is armed for it, is consumed
// (one event per arming): true, and the caller raises the event.
inline bool cq_take_arm(xsrc_cq_ring *ring, const xsrc_cqe &cqe)
{
	auto armed = atomic(ring->armed);
	uint32_t mode = armed.load(std::memory_order_seq_cst);
	if (mode == XSRC_CQ_ARMED_NONE)
		return false;
	bool wanted = mode == XSRC_CQ_ARMED_NEXT || (cqe.flags & XSRC_CQE_SOLICITED) ||
		      cqe.status != IBV_WC_SUCCESS;
	return wanted && armed.compare_exchange_strong(mode, XSRC_CQ_ARMED_NONE, std::memory_order_acq_rel);
}

// After cq_push() placed `cqe`: does it fire the CQ's armed event? If so the
// arm is consumed (one event per arming). The fence pairs with the seq_cst
// store that arms the CQ: either we see the arm, or the owner's poll after
// arming sees this completion.
inline bool cq_consume_arm(xsrc_cq_ring *ring, const xsrc_cqe &cqe)
{
	std::atomic_thread_fence(std::memory_order_seq_cst);
	return cq_take_arm(ring, cqe);
}

// Whether the ring's consumer arms as revision 11 has it (xsrc-queues.h):
// then a producer reads `armed` right after it claims its slot.
inline bool cq_arm_sees_tail([[maybe_unused]] const xsrc_cq_ring *ring)
{
#if XSRC_DRIVER_ABI_REVISION >= 11
	return atomic(const_cast<xsrc_cq_ring *>(ring)->arm_sees_tail).load(std::memory_order_relaxed) != 0;
#else
	return false;
#endif
}

// What cq_push_notify() did.
enum class CqPushed {
	full,    // nothing placed: the CQ is full (an overrun), or the races were lost
	placed,
	event,   // placed, and it fired the CQ's arm: the caller raises the event
};

// Appends a completion to the ring of `shape`, and with `notify` learns
// whether it fires the CQ's arm. Full when the CQ is, or after `max_tries`
// lost races (the daemon bounds them: a process could forge the ring's
// sequence numbers to keep it looping); a big slot the completion carries is
// then free again.
inline CqPushed cq_place(xsrc_cq_ring *ring, const CqShape &shape, const xsrc_cqe &cqe, CqPayload payload,
			 unsigned max_tries, bool notify)
{
	auto tail = atomic(ring->tail);
	__u64 pos = tail.load(std::memory_order_relaxed);
	for (unsigned tries = 0; tries != max_tries; ++tries) {
		xsrc_cqe *slot = cq_slot(ring, shape, pos);
		uint64_t seq = atomic(slot->seq).load(std::memory_order_acquire);
		int64_t dif = static_cast<int64_t>(seq - pos);
		if (dif == 0) {
			// The application's cqe, not the ring's capacity, is the limit.
			uint64_t head = atomic(ring->head).load(std::memory_order_acquire);
			if (static_cast<int64_t>(pos - head) < 0) {
				pos = tail.load(std::memory_order_relaxed);  // ours is stale
				continue;
			}
#if XSRC_DRIVER_ABI_REVISION >= 10
			if (pos - head >= shape.cqe && !cq_room_behind_head(ring, shape, pos))
				break;
#else
			// A provider built against older headers trusts the head,
			// as one of that revision did (the compat tests).
			if (pos - head >= shape.cqe)
				break;
#endif
			// seq_cst: with arm_sees_tail the CAS is the fence between
			// claiming the slot and reading `armed`.
			if (tail.compare_exchange_weak(pos, pos + 1, std::memory_order_seq_cst,
						       std::memory_order_relaxed)) {
				const bool early = notify && cq_arm_sees_tail(ring);
				const bool event = early && cq_take_arm(ring, cqe);
				std::memcpy(reinterpret_cast<char *>(slot) + sizeof(slot->seq),
					    reinterpret_cast<const char *>(&cqe) + sizeof(cqe.seq),
					    sizeof(cqe) - sizeof(cqe.seq));
				// The payload is written after the CAS, not before it: a
				// locked instruction waits for the stores ahead of it, and
				// those to a slot the consumer read last lap each wait for
				// the line to come back from its cache. Here they drain while
				// the producer goes on.
				if (payload.count)
					gather(cqe.flags & XSRC_CQE_DEFERRED_BIG ? cq_big_payload(ring, shape, cqe.big_slot)
										 : cq_payload(ring, shape, pos),
					       payload);
				atomic(slot->seq).store(pos + 1, std::memory_order_release);
				if (notify && !early)
					return cq_consume_arm(ring, cqe) ? CqPushed::event : CqPushed::placed;
				return event ? CqPushed::event : CqPushed::placed;
			}
		} else if (dif < 0) {
			break;
		} else {
			pos = tail.load(std::memory_order_relaxed);
		}
	}
	if (cqe.flags & XSRC_CQE_DEFERRED_BIG)
		cq_big_release(ring, shape, cqe.big_slot);
	return CqPushed::full;
}

// Appends a completion and learns whether it fires the CQ's arm.
inline CqPushed cq_push_notify(xsrc_cq_ring *ring, const xsrc_cqe &cqe, CqPayload payload = {},
			       unsigned max_tries = kUnboundedTries)
{
	return cq_place(ring, cq_shape(ring), cqe, payload, max_tries, true);
}

// The same by a shape read and checked before (the daemon's).
inline CqPushed cq_push_notify(xsrc_cq_ring *ring, const CqShape &shape, const xsrc_cqe &cqe, CqPayload payload,
			       unsigned max_tries)
{
	return cq_place(ring, shape, cqe, payload, max_tries, true);
}

// Appends a completion, as cq_push_notify() but blind to the arm: false
// when nothing was placed.
inline bool cq_push(xsrc_cq_ring *ring, const xsrc_cqe &cqe, CqPayload payload = {},
		    unsigned max_tries = kUnboundedTries)
{
	return cq_place(ring, cq_shape(ring), cqe, payload, max_tries, false) != CqPushed::full;
}

// How long cq_arm() waits for a completion claimed but not yet published
// (a producer between its CAS and its seq store, normally nanoseconds).
inline constexpr unsigned kArmWaitSpins = 4096;

// Arms the CQ for `mode` as a consumer that set arm_sees_tail must
// (revision 11, xsrc-queues.h), the consumer being at position `from` or
// past it. A completion claimed before the arm but not yet published may
// have read `armed` before it: we wait for it a little, so that the poll
// after arming sees it. True when one is still not published after that
// and this call consumed the arm: the caller raises the event.
// `entries` is the ring's size as the caller knows it (a power of two), not
// its num_entries: another process may write that under us.
inline bool cq_arm(xsrc_cq_ring *ring, uint64_t entries, uint32_t mode, uint64_t from)
{
	atomic(ring->armed).store(mode, std::memory_order_seq_cst);
	const uint64_t tail = atomic(ring->tail).load(std::memory_order_seq_cst);
	if (tail - from > entries)
		from = tail - entries;  // a forged tail or position: one lap at most
	xsrc_cqe *slots = cq_slots(ring);
	for (uint64_t pos = from; pos != tail; ++pos) {
		auto seq = atomic(slots[pos & (entries - 1)].seq);
		for (unsigned spins = 0; seq.load(std::memory_order_acquire) == pos; ++spins) {
			if (spins == kArmWaitSpins) {
				uint32_t armed = mode;
				// Else its producer fired the arm, or it was re-armed.
				return atomic(ring->armed).compare_exchange_strong(armed, XSRC_CQ_ARMED_NONE,
										 std::memory_order_acq_rel);
			}
			cpu_relax();
		}
	}
	return false;
}

// The consumer's position as the ring's slots tell it (the consumer frees
// each slot it takes for the next lap, in order): what a head published
// lazily lags behind. Raises `head` to it, never past `tail`; the daemon's
// when the first context that trusts heads arrives (xsrc-queues.h). The
// ring is read by `shape` (checked by the caller).
inline void cq_catch_up_head(xsrc_cq_ring *ring, const CqShape &shape)
{
	const uint64_t n = shape.entries;
	auto head = atomic(ring->head);
	__u64 seen = head.load(std::memory_order_acquire);
	const uint64_t tail = atomic(ring->tail).load(std::memory_order_acquire);
	__u64 taken = seen;
	for (uint64_t i = 0; i < n; ++i) {
		uint64_t seq = atomic(cq_slot(ring, shape, i)->seq).load(std::memory_order_acquire);
		// Free for position seq (seq == i mod n): position seq - n was taken.
		if ((seq - i) % n == 0 && seq >= n && seq - n + 1 > taken && seq - n + 1 <= tail)
			taken = seq - n + 1;
	}
	while (seen < taken && !head.compare_exchange_weak(seen, taken, std::memory_order_acq_rel))
		;
}

// After cq_push() failed for want of room: true the first time, when the
// overrun is the owner's to hear about (IBV_EVENT_CQ_ERR).
inline bool cq_first_overrun(xsrc_cq_ring *ring)
{
	return atomic(ring->overflow).exchange(1, std::memory_order_acq_rel) == 0;
}


// A CQ ring's one consumer, in the consumer's own memory: the ring's shape,
// read once (the header shares a cache line with `tail`, which every
// producer writes; the shape is the daemon's and never changes while the
// ring lives), its position, and what it has yet to tell the producers — how
// far it got, and which big slots it emptied — told at the end of a poll
// (publish()) at most, and lazily where revision 10 allows it: as an HCA's
// provider writes its consumer index now and then, not per completion.
class CqConsumer {
public:
	CqConsumer() = default;

	// Consumes `ring`, of `shape` (its caller checked it fits; big_slots 0
	// when its big pool is not to be used), from its head on. With
	// `eager_heads` (the arena header's count, revision 10) the head is
	// published lazily while that count is 0; without it at every publish().
	CqConsumer(xsrc_cq_ring *ring, const CqShape &shape, const uint32_t *eager_heads = nullptr)
		: ring_(ring), slots_(cq_slots(ring)), payload_(cq_payload(ring, shape, 0)),
		  num_entries_(static_cast<uint32_t>(shape.entries)),
		  payload_stride_(static_cast<uint32_t>(shape.payload_stride)),
		  big_slots_(static_cast<uint32_t>(shape.big_slots)), big_stride_(static_cast<uint32_t>(shape.big_stride)),
		  pos_(atomic(ring->head).load(std::memory_order_acquire)), published_(pos_),
		  eager_heads_(eager_heads), lazy_(std::max<uint32_t>(static_cast<uint32_t>(shape.cqe / 2), 1))
	{
		if (big_slots_) {
			big_busy_ = cq_big_busy(ring, shape);
			big_ = cq_big_payload(ring, shape, 0);
		}
	}

	// The same by the ring's header as it reads now (a ring of our own).
	explicit CqConsumer(xsrc_cq_ring *ring, const uint32_t *eager_heads = nullptr)
		: CqConsumer(ring, cq_shape(ring), eager_heads)
	{
	}

	xsrc_cq_ring *ring() const { return ring_; }
	// The position of the next completion (one past the last taken).
	uint64_t pos() const { return pos_; }
	// The ring's size as read when it was opened.
	uint32_t entries() const { return num_entries_; }
	// The sequence word of the slot the next completion lands in: pos() + 1
	// there says it has (take() would return it).
	const __u64 *next_seq() const { return &slots_[pos_ & (num_entries_ - 1)].seq; }

	// Takes the next completion, if there is one. A payload that travels
	// with it is placed only where may_write(va, len) says this process
	// registered memory for it: the ring is in the arena, which any
	// process can write, so deferred_va is never trusted by itself. A
	// payload that may not be placed turns the completion into
	// IBV_WC_LOC_PROT_ERR.
	template <typename MayWrite>
	bool take(xsrc_cqe &out, MayWrite &&may_write)
	{
		const uint64_t index = pos_ & (num_entries_ - 1);
		xsrc_cqe *slot = &slots_[index];
		if (atomic(slot->seq).load(std::memory_order_acquire) != pos_ + 1)
			return false;
		out = *slot;
		if (out.flags & XSRC_CQE_DEFERRED) {
			if (out.byte_len <= payload_stride_ && may_write(out.deferred_va, out.byte_len)) {
				std::memcpy(reinterpret_cast<void *>(out.deferred_va), payload_ + index * payload_stride_,
					    out.byte_len);
			} else {
				out.status = IBV_WC_LOC_PROT_ERR;
				out.byte_len = 0;
			}
		} else if (out.flags & XSRC_CQE_DEFERRED_BIG) {
			bool known = out.big_slot < big_slots_;
			if (known && out.byte_len <= big_stride_ && may_write(out.deferred_va, out.byte_len)) {
				std::memcpy(reinterpret_cast<void *>(out.deferred_va),
					    big_ + uint64_t(out.big_slot) * big_stride_, out.byte_len);
			} else {
				out.status = IBV_WC_LOC_PROT_ERR;
				out.byte_len = 0;
			}
			if (known) {
				emptied_[out.big_slot / 64] |= uint64_t(1) << (out.big_slot % 64);
				++emptied_count_;
				emptied_bytes_ += out.byte_len;
			}
		}
		// The entry is the producers' again one lap on.
		atomic(slot->seq).store(pos_ + num_entries_, std::memory_order_release);
		++pos_;
		return true;
	}

	// Tells the producers what the takes since the last publish() freed:
	// they count free entries from the head, and claim free big slots.
	// Unless `now`, both go lazily: every line of the ring's header that
	// the consumer writes is a line every producer must fetch back. The
	// head (only with eager_heads, see xsrc-queues.h) once cqe / 2
	// completions were taken; emptied big slots once a quarter of the pool
	// is, or once they held 8 KiB (a producer that finds none free moves
	// the bytes itself; one that cycles through more bytes of slots than
	// that, measured with 4 KiB SENDs, loses more to cache misses than the
	// shared busy word costs).
	void publish(bool now = false)
	{
		constexpr uint64_t kReleaseBytes = 8192;
		if (emptied_count_ && (now || emptied_count_ >= big_slots_ / 4 || emptied_bytes_ >= kReleaseBytes)) {
			for (uint32_t w = 0; w < kMaxCqBigSlots / 64; ++w) {
				if (emptied_[w]) {
					// Release: our copies out of the slots come first.
					atomic(big_busy_[w]).fetch_and(~emptied_[w], std::memory_order_release);
					emptied_[w] = 0;
				}
			}
			emptied_count_ = 0;
			emptied_bytes_ = 0;
		}
		if (pos_ == published_)
			return;
		if (!now && eager_heads_ && pos_ - published_ < lazy_) {
			// Our freed slots, then the count; the daemon raises the
			// count, then reads the slots: one of us sees the other.
			std::atomic_thread_fence(std::memory_order_seq_cst);
			if (atomic(*const_cast<uint32_t *>(eager_heads_)).load(std::memory_order_relaxed) == 0)
				return;
		}
		atomic(ring_->head).store(pos_, std::memory_order_release);
		published_ = pos_;
	}

private:
	xsrc_cq_ring *ring_ = nullptr;
	xsrc_cqe *slots_ = nullptr;
	unsigned char *payload_ = nullptr;  // the payload slots
	uint32_t num_entries_ = 0;
	uint32_t payload_stride_ = 0;
	uint32_t big_slots_ = 0;
	uint32_t big_stride_ = 0;
	uint64_t *big_busy_ = nullptr;
	unsigned char *big_ = nullptr;  // big slot 0
	uint64_t pos_ = 0;
	uint64_t published_ = 0;                     // the head the producers see
	const uint32_t *eager_heads_ = nullptr;      // null: the head goes out at every publish()
	uint32_t lazy_ = 1;                          // else after this many takes
	uint32_t emptied_count_ = 0;                 // big slots in emptied_
	uint64_t emptied_bytes_ = 0;                 // the payload bytes they held
	uint64_t emptied_[kMaxCqBigSlots / 64] = {};  // big slots not yet freed
};

// --- receive ring ----------------------------------------------------------

// What a consumer computes a receive ring's slot addresses from: read once
// by one that does not trust the ring's owner (the daemon), as CqShape.
struct RecvShape {
	uint64_t entries = 0;  // a power of two
	uint64_t stride = 0;
};

inline RecvShape recv_shape(const xsrc_recv_ring *ring)
{
	auto &r = const_cast<xsrc_recv_ring &>(*ring);
	return {atomic(r.num_entries).load(std::memory_order_relaxed), atomic(r.stride).load(std::memory_order_relaxed)};
}

// The slots of a ring of `shape` lie within `room` bytes from its header on.
inline bool recv_shape_fits(const RecvShape &shape, uint64_t room)
{
	const uint64_t n = shape.entries;
	if (!n || (n & (n - 1)) || shape.stride < sizeof(xsrc_recv_wqe) || room < sizeof(xsrc_recv_ring) ||
	    shape.stride > room)
		return false;
	return n <= (room - sizeof(xsrc_recv_ring)) / shape.stride;
}

inline xsrc_recv_wqe *recv_slot(xsrc_recv_ring *ring, const RecvShape &shape, uint64_t pos)
{
	auto *slots = reinterpret_cast<unsigned char *>(ring + 1);
	return reinterpret_cast<xsrc_recv_wqe *>(slots + (pos & (shape.entries - 1)) * shape.stride);
}

inline xsrc_recv_wqe *recv_slot(xsrc_recv_ring *ring, uint64_t pos)
{
	return recv_slot(ring, recv_shape(ring), pos);
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

// Posts a receive to the ring of `shape` (the owner is the only producer).
// False when full, or when its slot cannot hold `num_sge` SGEs. `on_slot(pos)`
// runs once the slot at ring position `pos` is ours, before the receive is
// published (the owner records it privately there).
template <typename OnSlot>
inline bool recv_push(xsrc_recv_ring *ring, const RecvShape &shape, uint64_t wr_id, const xsrc_sge *sge,
		      uint32_t num_sge, OnSlot &&on_slot)
{
	if (sizeof(xsrc_recv_wqe) + uint64_t(num_sge) * sizeof(xsrc_sge) > shape.stride)
		return false;
	uint64_t pos = atomic(ring->tail).load(std::memory_order_relaxed);
	uint64_t head = atomic(ring->head).load(std::memory_order_acquire);
	if (pos - head >= atomic(ring->max_wr).load(std::memory_order_relaxed))
		return false;
	xsrc_recv_wqe *slot = recv_slot(ring, shape, pos);
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
	return recv_push(ring, recv_shape(ring), wr_id, sge, num_sge, [](uint64_t) {});
}

// A receive WQE copied out of a ring.
struct RecvWqe {
	uint64_t wr_id = 0;
	uint32_t num_sge = 0;
	xsrc_sge sge[XSRC_MAX_RECV_SGE];
	bool from_ring = false;  // popped from a receive ring, at ring position `pos`
	uint64_t pos = 0;
};

// Claims the oldest posted receive of the ring of `shape` (any process may
// consume). False if none, or after `max_tries` lost races (as cq_push). A
// slot that claims more SGEs than it holds yields none.
inline bool recv_pop(xsrc_recv_ring *ring, const RecvShape &shape, RecvWqe &out,
		     unsigned max_tries = kUnboundedTries)
{
	const uint64_t room = shape.stride > sizeof(xsrc_recv_wqe)
				      ? (shape.stride - sizeof(xsrc_recv_wqe)) / sizeof(xsrc_sge) : 0;
	const uint64_t max_sge = std::min<uint64_t>(room, XSRC_MAX_RECV_SGE);
	auto head = atomic(ring->head);
	__u64 pos = head.load(std::memory_order_relaxed);
	for (unsigned tries = 0; tries != max_tries; ++tries) {
		xsrc_recv_wqe *slot = recv_slot(ring, shape, pos);
		uint64_t seq = atomic(slot->seq).load(std::memory_order_acquire);
		int64_t dif = static_cast<int64_t>(seq - (pos + 1));
		if (dif == 0) {
			if (head.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
				out.wr_id = slot->wr_id;
				out.from_ring = true;
				out.pos = pos;
				const uint32_t num_sge = slot->num_sge;
				out.num_sge = num_sge <= max_sge ? num_sge : 0;
				std::memcpy(out.sge, recv_sges(slot), out.num_sge * sizeof(xsrc_sge));
				atomic(slot->seq).store(pos + shape.entries, std::memory_order_release);
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

inline bool recv_pop(xsrc_recv_ring *ring, RecvWqe &out, unsigned max_tries = kUnboundedTries)
{
	return recv_pop(ring, recv_shape(ring), out, max_tries);
}

}  // namespace xsrc
