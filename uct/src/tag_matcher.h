// The posted-receive list of the shim's software tag matching: a pure data structure (no
// device, no iface), so its rules can be unit-tested in-process.
//
// Rules (those of UCT tag offload, uct.h "UCT_TAG"):
// - a message with tag `stag` matches a posted receive (tag, mask) when
//   ((stag ^ tag) & mask) == 0;
// - among matching receives the earliest posted wins (posting order, like MPI and HW TM);
// - there is no unexpected list: a message that matches nothing is handed to the iface's
//   unexpected callback at once (eager_cb / rndv_cb), exactly as UCT's HW tag offload does,
//   and posting a receive later never matches it (the protocol layer keeps that queue);
// - at most `capacity` receives are outstanding (posted, or matched by a rendezvous whose
//   data is still moving): the next post fails with UCS_ERR_EXCEEDS_LIMIT.
// A receive's slot index lives in its uct_tag_context_t::priv, so cancel is O(1) and a
// context that is not (or no longer) posted is recognised.
#pragma once

#include <uct/api/uct.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace xsrc::uct::tag {

inline constexpr size_t max_recv_iov = 4;

enum class RecvState : uint8_t { free, posted, in_flight };

struct PostedRecv {
	uct_tag_context_t *ctx = nullptr;
	uct_tag_t tag = 0;
	uct_tag_t mask = 0;
	std::array<uct_iov_t, max_recv_iov> iov{};
	size_t iovcnt = 0;
	size_t length = 0;  // total bytes the iov can hold
	RecvState state = RecvState::free;
	bool forgotten = false;  // cancelled with force=1 while in flight: no callbacks
	uint32_t generation = 0;
	uint32_t prev = 0, next = 0;  // posted-list links (index; `none` ends)
};

class Matcher {
public:
	static constexpr uint32_t none = UINT32_MAX;

	explicit Matcher(size_t capacity);

	// UCS_OK, UCS_ERR_EXCEEDS_LIMIT (no slot), UCS_ERR_INVALID_PARAM (iovcnt too large,
	// null ctx, or ctx already posted/in flight).
	ucs_status_t post(uct_tag_context_t *ctx, uct_tag_t tag, uct_tag_t mask, const uct_iov_t *iov,
	                  size_t iovcnt);
	// The earliest posted receive matching `stag`, taken off the posted list and marked
	// in flight (its slot stays taken until release()); nullptr if none matches.
	PostedRecv *match(uct_tag_t stag);
	// The slot of a ctx that is posted or in flight, nullptr otherwise.
	PostedRecv *find(const uct_tag_context_t *ctx);
	// Posted -> removed (slot freed). Returns false if ctx is not on the posted list.
	bool unpost(uct_tag_context_t *ctx);
	// Frees the slot of a matched (in-flight) receive. Call it before the completion
	// callback (copy what the callback needs first): the user may repost the same context
	// from inside the callback.
	void release(PostedRecv *);

	size_t posted() const { return posted_count_; }
	size_t outstanding() const { return outstanding_; }
	size_t capacity() const { return slots_.size(); }

private:
	struct Priv {  // what we keep in uct_tag_context_t::priv
		uint64_t magic;
		uint32_t index;
		uint32_t generation;
	};
	static_assert(sizeof(Priv) <= UCT_TAG_PRIV_LEN);
	static constexpr uint64_t priv_magic = 0x78737263'74616731ull;  // "xsrctag1"

	uint32_t index_of(const PostedRecv *r) const { return static_cast<uint32_t>(r - slots_.data()); }
	void link_tail(uint32_t i);
	void unlink(uint32_t i);
	void free_slot(uint32_t i);

	std::vector<PostedRecv> slots_;
	std::vector<uint32_t> free_;
	uint32_t head_ = none, tail_ = none;
	size_t posted_count_ = 0;
	size_t outstanding_ = 0;
};

}  // namespace xsrc::uct::tag
