// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
#include "harness/arena.h"

#include <fcntl.h>
#include <sys/mman.h>

#include "common/fd.h"
#include "harness/device_stats.h"

namespace xsrc::harness {

MappedArena::MappedArena(const std::string &device, bool writable)
{
	unique_fd fd(open(device_arena_path(device).c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC));
	if (!fd)
		return;
	void *map = mmap(nullptr, XSRC_ARENA_SIZE, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd.get(),
			 0);
	if (map != MAP_FAILED)
		base_ = static_cast<char *>(map);
}

MappedArena::~MappedArena()
{
	if (base_)
		munmap(base_, XSRC_ARENA_SIZE);
}

xsrc_qp_entry &MappedArena::qp_entry(uint32_t qpn) const
{
	return at<xsrc_qp_entry>(header().qp_table_off)[qpn - XSRC_QPN_BASE];
}

bool MappedArena::forge_receive(uint32_t qpn, uint64_t wr_id, const xsrc_sge &sge) const
{
	const xsrc_qp_entry &entry = qp_entry(qpn);
	if (entry.qpn != qpn || !entry.rq_off)
		return false;
	auto *ring = at<xsrc_recv_ring>(entry.rq_off);
	uint64_t pos = __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE);
	auto *slot = reinterpret_cast<xsrc_recv_wqe *>(reinterpret_cast<char *>(ring + 1) +
						       (pos & (ring->num_entries - 1)) * ring->stride);
	slot->wr_id = wr_id;
	slot->num_sge = 1;
	*reinterpret_cast<xsrc_sge *>(slot + 1) = sge;
	__atomic_store_n(&slot->seq, pos + 1, __ATOMIC_RELEASE);
	__atomic_store_n(&ring->tail, pos + 1, __ATOMIC_RELEASE);
	return true;
}

}  // namespace xsrc::harness
