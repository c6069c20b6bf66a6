// A device's shared-memory arena (formats: kernel-abi/xsrc-queues.h): the
// file every context of the device maps, its fixed tables, and a page
// allocator for the rings that live after them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/fd.h"
#include "xsrc-queues.h"

namespace xsrc {

// Granularity of ring allocations (and of the table layout).
inline constexpr uint64_t kArenaPage = 4096;

// First-fit allocator over a range of pages. Released ranges sit in a
// quarantine before they can be handed out again, so that a peer still
// holding a stale offset never writes into a newer object. Pure bookkeeping:
// no memory is touched here, which keeps it testable.
class PageAllocator {
public:
	using Clock = std::chrono::steady_clock;
	struct Range {
		uint64_t first = 0;  // page index
		uint64_t count = 0;
	};

	PageAllocator(uint64_t first_page, uint64_t page_count, Clock::duration quarantine);

	// The first free page of a run of `count`, or nothing (out of space).
	std::optional<uint64_t> allocate(uint64_t count, Clock::time_point now);
	// Puts a range into quarantine until now + quarantine.
	void release(Range range, Clock::time_point now);
	// Moves every range whose quarantine ended back to the free map and
	// returns them, adjacent ones merged into one run, in page order (the
	// caller may give their memory back to the system, a system call per
	// run).
	std::vector<Range> expire(Clock::time_point now);

	uint64_t free_pages() const;
	uint64_t quarantined_pages() const;

private:
	void insert_free(Range range);

	std::map<uint64_t, uint64_t> free_;  // first page -> count; coalesced, never adjacent
	struct Quarantined {
		Clock::time_point until;
		Range range;
	};
	std::deque<Quarantined> quarantine_;  // in release order == expiry order
	Clock::duration quarantine_time_;
};

// The mapped arena. Creates the file, lays out the tables, hands out zeroed
// ring memory; the destructor unmaps and unlinks it.
class Arena {
public:
	using Clock = PageAllocator::Clock;
	static constexpr std::chrono::seconds kDefaultQuarantine{2};

	// Creates `path` (replacing a stale file of that name), sized
	// XSRC_ARENA_SIZE (sparse), mode 0666, and maps it. Returns 0 or an errno.
	static int create(const std::string &path, std::unique_ptr<Arena> &out,
			  Clock::duration quarantine = kDefaultQuarantine);
	~Arena();
	Arena(const Arena &) = delete;
	Arena &operator=(const Arena &) = delete;

	const std::string &path() const { return path_; }
	// The header as it is now: any process of the device may have rewritten
	// it. The tables below are where we laid them out, whatever it says.
	const xsrc_arena_header &header() const { return *reinterpret_cast<const xsrc_arena_header *>(base_); }

	xsrc_qp_entry &qp_entry(uint32_t index);    // index < XSRC_QP_TABLE_LEN
	xsrc_mr_entry &mr_entry(uint32_t index);    // index < XSRC_MR_TABLE_LEN
	xsrc_srq_entry &srq_entry(uint32_t index);  // index < XSRC_SRQ_TABLE_LEN
	xsrc_mcast_table &mcast_table();
	xsrc_mcast_group &mcast_group(uint32_t index);  // index < XSRC_MCAST_GROUPS
	uint32_t &atomic_lock(uint32_t index);          // index < XSRC_ATOMIC_LOCKS

	// The object at `off`, which must come from allocate().
	template <typename T>
	T &at(uint64_t off) { return *reinterpret_cast<T *>(base_ + off); }

	// Zeroed, page-aligned memory for a ring: its offset, or 0 when the arena is full.
	uint64_t allocate(uint64_t bytes);
	// Returns an allocation (quarantined first). Unknown offsets are ignored.
	void release(uint64_t off);
	bool allocated(uint64_t off) const { return allocations_.count(off) != 0; }

	uint64_t free_pages() const { return pages_.free_pages(); }
	uint64_t quarantined_pages() const { return pages_.quarantined_pages(); }
	size_t allocation_count() const { return allocations_.size(); }

private:
	Arena(std::string path, unique_fd fd, unsigned char *base, uint64_t first_ring_page,
	      Clock::duration quarantine);
	void zero(uint64_t off, uint64_t bytes);

	std::string path_;
	unique_fd fd_;
	unsigned char *base_;
	PageAllocator pages_;
	std::map<uint64_t, uint64_t> allocations_;  // offset -> pages
};

}  // namespace xsrc
