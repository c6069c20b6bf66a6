#include "rings.h"

#include <algorithm>

#include "common/ring_ops.h"
#include "common/tm_table.h"
#include "objects.h"

namespace xsrc {
namespace {

constexpr uint32_t kMinCqEntries = 64;
constexpr uint32_t kSlotAlign = 64;

static_assert(sizeof(xsrc_cq_ring) % kSlotAlign == 0, "CQEs follow the ring header 64-byte aligned");
static_assert(sizeof(xsrc_recv_ring) % kSlotAlign == 0, "WQEs follow the ring header 64-byte aligned");
static_assert(sizeof(xsrc_cqe) == 64, "one CQE per cache line");

}  // namespace

uint64_t pow2_at_least(uint64_t v)
{
	uint64_t p = 1;
	while (p < v)
		p <<= 1;
	return p;
}

uint32_t cq_ring_entries(uint32_t cqe)
{
	uint64_t cap = pow2_at_least(uint64_t(DeviceLimits::max_cqe) + 1);
	uint64_t want = std::max<uint64_t>(pow2_at_least(2 * (uint64_t(cqe) + 1)), kMinCqEntries);
	return static_cast<uint32_t>(std::min(want, cap));
}

uint64_t cq_ring_bytes(uint32_t entries, uint32_t big_slots)
{
	uint64_t bytes = sizeof(xsrc_cq_ring) + uint64_t(entries) * (sizeof(xsrc_cqe) + XSRC_CQ_PAYLOAD_STRIDE);
	if (big_slots) {
		uint64_t busy = (uint64_t(big_slots) / 64 * sizeof(__u64) + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
		bytes += busy + uint64_t(big_slots) * XSRC_CQ_BIG_STRIDE;
	}
	return bytes;
}

void cq_ring_init(xsrc_cq_ring &ring, uint32_t entries, uint32_t cqe, pid_t owner, uint32_t big_slots)
{
	ring.num_entries = entries;
	ring.cqe = cqe;
	ring.owner_pid = static_cast<__u32>(owner);
	ring.payload_stride = XSRC_CQ_PAYLOAD_STRIDE;
	ring.big_slots = big_slots;
	ring.big_stride = big_slots ? XSRC_CQ_BIG_STRIDE : 0;
	xsrc_cqe *slots = cq_slots(&ring);
	for (uint32_t i = 0; i < entries; ++i)
		store_release<__u64>(slots[i].seq, i);
	store_release<__u64>(ring.head, 0);
	store_release<__u64>(ring.tail, 0);
	store_release<__u32>(ring.armed, XSRC_CQ_ARMED_NONE);
}

uint64_t cq_ring_pending(xsrc_cq_ring &ring)
{
	return load_acquire(ring.tail) - load_acquire(ring.head);
}

CqShape cq_ring_shape(uint32_t entries, uint32_t cqe)
{
	return {entries, XSRC_CQ_PAYLOAD_STRIDE, cqe};
}

uint32_t recv_ring_entries(uint32_t max_wr)
{
	// Twice what is posted at most: a consumer that claimed a slot and was
	// preempted before releasing it is a whole lap behind the producer.
	return static_cast<uint32_t>(std::max<uint64_t>(pow2_at_least(2 * (uint64_t(max_wr) + 1)), 2));
}

uint32_t recv_ring_stride(uint32_t max_sge)
{
	uint32_t bytes = sizeof(xsrc_recv_wqe) + max_sge * sizeof(xsrc_sge);
	return (bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
}

uint64_t recv_ring_bytes(uint32_t entries, uint32_t stride)
{
	return sizeof(xsrc_recv_ring) + uint64_t(entries) * stride;
}

RecvShape recv_ring_shape(uint32_t max_wr, uint32_t max_sge)
{
	return {recv_ring_entries(max_wr), recv_ring_stride(max_sge)};
}

uint64_t recv_ring_bytes(const RecvShape &shape)
{
	return sizeof(xsrc_recv_ring) + shape.entries * shape.stride;
}

void recv_ring_init(xsrc_recv_ring &ring, const RecvShape &shape, uint32_t max_wr, uint32_t max_sge,
		    pid_t owner)
{
	ring.num_entries = static_cast<__u32>(shape.entries);
	ring.stride = static_cast<__u32>(shape.stride);
	ring.max_wr = max_wr;
	ring.max_sge = max_sge;
	ring.owner_pid = static_cast<__u32>(owner);
	store_release<__u32>(ring.srq_limit, 0);
	recv_ring_reset(ring, shape);
}

void tm_table_init(xsrc_tm_table &table, uint32_t num_tags, uint32_t max_sge)
{
	table.num_tags = num_tags;
	table.max_sge = max_sge;
	table.stride = tm_entry_stride(max_sge);
	table.unexpected = 0;
	table.sw_count = 0;
	table.next_order = 0;
	store_release<__u32>(table.lock, 0);
}

void recv_ring_reset(xsrc_recv_ring &ring, const RecvShape &shape)
{
	store_release<__u64>(ring.tail, 0);
	store_release<__u64>(ring.head, 0);
	for (uint64_t i = 0; i < shape.entries; ++i)
		store_release<__u64>(recv_slot(&ring, shape, i)->seq, i);
}

uint64_t recv_ring_pending(xsrc_recv_ring &ring)
{
	return load_acquire(ring.tail) - load_acquire(ring.head);
}

}  // namespace xsrc
