// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// A QP's send queue in the provider's memory: work requests are built in
// place in slots allocated when the QP is created (each with room for
// max_send_sge gather entries and max_inline_data bytes), so that posting
// neither allocates nor throws, as an HCA's provider writes into its ring.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "buf.h"
#include "common/ids.h"

struct xsrc_ah;

// A send work request as the device keeps it until it has executed it.
struct xsrc_send_wqe {
	uint64_t wr_id = 0;
	ibv_wr_opcode opcode = IBV_WR_SEND;
	unsigned int flags = 0;          // IBV_SEND_*
	uint32_t imm_data = 0;           // network order
	uint64_t remote_addr = 0;
	xsrc::Rkey rkey;
	uint64_t compare_add = 0;
	uint64_t swap = 0;
	xsrc_ah *ah = nullptr;           // UD
	xsrc::Qpn remote_qpn;
	uint32_t remote_qkey = 0;
	xsrc::Srqn remote_srqn;          // XRC
	// IBV_WR_BIND_MW: the window, the MR (UINT32_MAX: none), its rights and
	// length; the new rkey is `rkey`, the start `remote_addr`.
	uint32_t mw_handle = 0;
	uint32_t mr_handle = 0;
	uint32_t mw_access = 0;
	uint64_t bind_length = 0;
	uint32_t invalidate_rkey = 0;    // IBV_WR_LOCAL_INV, IBV_WR_SEND_WITH_INV
	// IBV_WR_ATOMIC_WRITE from ibv_wr_atomic_write: the 8 bytes are in
	// `swap`, not in a gather list.
	bool atomic_value_inline = false;
	// The gather list and the inline bytes (IBV_SEND_INLINE: copied at
	// post) as posted; more than the slot holds is refused before use.
	size_t num_sge = 0;
	uint64_t inline_len = 0;
	// Retries left while the responder cannot take it (RNR, unreachable);
	// kNotRetried until the first retry is armed, counting down to 0.
	static constexpr int kNotRetried = -1;
	int rnr_retries_left = kNotRetried;
	int retries_left = kNotRetried;
	// RC: when the timer of its last RNR wait expires (the next attempt
	// after it counts a retry; an earlier one does not). UD: when a held
	// datagram is dropped.
	uint64_t rnr_timer_at_ns = 0;

	// The slot's storage (xsrc_wqe_slots), kept across reuse.
	ibv_sge *sge = nullptr;
	unsigned char *inline_data = nullptr;

	// Forgets the previous request; the storage stays.
	void clear() noexcept
	{
		ibv_sge *s = sge;
		unsigned char *d = inline_data;
		*this = xsrc_send_wqe{};
		sge = s;
		inline_data = d;
	}
	bool retried() const noexcept { return rnr_retries_left >= 0 || retries_left >= 0; }
	const ibv_sge *sge_begin() const noexcept { return sge; }
	const ibv_sge *sge_end() const noexcept { return sge + num_sge; }
};

// The slots live in one buffer and are never destroyed one by one.
static_assert(std::is_trivially_destructible_v<xsrc_send_wqe>);

// Slots of WQEs and their storage, sized once, in one buffer (`allocator`:
// a parent domain's, or null for the heap).
class xsrc_wqe_slots {
public:
	// Returns 0 or ENOMEM.
	int init(size_t count, uint32_t max_sge, uint32_t max_inline, const xsrc_allocator *allocator = nullptr,
		 uint64_t resource_type = XSRC_RES_TYPE_SQ) noexcept;
	const xsrc_buf &buffer() const noexcept { return buf_; }
	size_t count() const noexcept { return count_; }
	uint32_t max_sge() const noexcept { return max_sge_; }
	uint32_t max_inline() const noexcept { return max_inline_; }
	xsrc_send_wqe &operator[](size_t i) noexcept { return wqes_[i]; }

	// Copies a gather list / inline bytes into `wqe` where they fit;
	// wqe.num_sge / inline_len record what was asked, so that a request
	// larger than the QP's caps is still refused.
	void set_sge(xsrc_send_wqe &wqe, const ibv_sge *list, size_t n) const noexcept;
	void set_inline(xsrc_send_wqe &wqe, const ibv_data_buf *bufs, size_t n) const noexcept;
	void set_inline_from_sge(xsrc_send_wqe &wqe, const ibv_sge *list, size_t n) const noexcept;

private:
	size_t count_ = 0;
	uint32_t max_sge_ = 0, max_inline_ = 0;
	xsrc_buf buf_;  // count WQEs, then count * max_sge gather entries, then the inline bytes
	xsrc_send_wqe *wqes_ = nullptr;
};

// Posted WQEs not yet executed (blocked behind an RNR or unreachable peer),
// oldest first, and the free slot the next request is built in: max_wr + 1
// slots, so that slot exists even when the queue is full.
class xsrc_send_queue {
public:
	int init(uint32_t max_wr, uint32_t max_sge, uint32_t max_inline,
		 const xsrc_allocator *allocator = nullptr) noexcept
	{
		head_ = size_ = 0;
		return slots_.init(size_t(max_wr) + 1, max_sge, max_inline, allocator, XSRC_RES_TYPE_SQ);
	}
	bool empty() const noexcept { return size_ == 0; }
	size_t size() const noexcept { return size_; }
	xsrc_send_wqe &front() noexcept { return slots_[head_]; }
	// The i-th queued WQE from the front (i < size()).
	xsrc_send_wqe &at(size_t i) noexcept { return slots_[wrap(head_ + i)]; }
	void pop_front() noexcept
	{
		head_ = wrap(head_ + 1);
		--size_;
	}
	// The slot after the last queued WQE, cleared by the caller.
	xsrc_send_wqe &next() noexcept { return slots_[wrap(head_ + size_)]; }
	// next() joins the queue (the caller checked size() < max_wr).
	void push_next() noexcept { ++size_; }
	void clear() noexcept { head_ = size_ = 0; }
	const xsrc_wqe_slots &slots() const noexcept { return slots_; }

private:
	size_t wrap(size_t i) const noexcept { return i < slots_.count() ? i : i - slots_.count(); }

	xsrc_wqe_slots slots_;
	size_t head_ = 0;
	size_t size_ = 0;
};
