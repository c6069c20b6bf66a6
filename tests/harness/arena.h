// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// A device's arena seen as any process that opens its file may see it (the
// isolation tests' attacker, tests that read the device's tables): mapped
// whole, its tables by offset, and a receive forged into a QP's ring.
#pragma once

#include <cstdint>
#include <string>

#include <xsrc-queues.h>

namespace xsrc::harness {

class MappedArena {
public:
	// The arena of `device` (its xsrc_shm_path), read-write unless
	// `writable` is false; ok() tells whether the mapping was made.
	explicit MappedArena(const std::string &device, bool writable = true);
	~MappedArena();
	MappedArena(const MappedArena &) = delete;
	MappedArena &operator=(const MappedArena &) = delete;

	bool ok() const { return base_ != nullptr; }
	const xsrc_arena_header &header() const { return *reinterpret_cast<const xsrc_arena_header *>(base_); }
	template <typename T>
	T *at(uint64_t off) const
	{
		return reinterpret_cast<T *>(base_ + off);
	}
	// The QP table's entry of `qpn`.
	xsrc_qp_entry &qp_entry(uint32_t qpn) const;
	// The MR table.
	xsrc_mr_entry *mr_table() const { return at<xsrc_mr_entry>(header().mr_table_off); }

	// Writes a receive WQE (`wr_id`, one SGE) at the tail of QP `qpn`'s
	// own receive ring and publishes it, as a post would, but in the arena
	// only: nothing reaches the owner's private record of its receives.
	// False when the QP has no receive ring of its own.
	bool forge_receive(uint32_t qpn, uint64_t wr_id, const xsrc_sge &sge) const;

private:
	char *base_ = nullptr;
};

}  // namespace xsrc::harness
