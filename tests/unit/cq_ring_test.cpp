// The CQ ring's consumer (common/ring_ops.h, CqConsumer): takes at its own
// position, payloads placed from the ring's shape as it read it once, and
// the head and the emptied big slots told to producers once per poll
// (publish()). Producers count free entries and claim big slots only from
// what was published.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "common/ring_ops.h"
#include "rings.h"

namespace xsrc {
namespace {

struct Ring {
	explicit Ring(uint32_t cqe, uint32_t big_slots = 0)
	{
		const uint32_t entries = cq_ring_entries(cqe);
		bytes = cq_ring_bytes(entries, big_slots);
		mem.reset(static_cast<unsigned char *>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
		std::memset(mem.get(), 0, bytes);
		cq_ring_init(*ring(), entries, cqe, 1, big_slots);
	}
	xsrc_cq_ring *ring() { return reinterpret_cast<xsrc_cq_ring *>(mem.get()); }

	struct Free {
		void operator()(unsigned char *p) const { std::free(p); }
	};
	std::unique_ptr<unsigned char, Free> mem;
	uint64_t bytes = 0;
};

xsrc_cqe cqe_for(uint64_t wr_id)
{
	xsrc_cqe c{};
	c.wr_id = wr_id;
	c.status = IBV_WC_SUCCESS;
	c.opcode = IBV_WC_RECV;
	return c;
}

// A completion whose payload (`payload`, for `dst`) waits in a big slot it
// claims: that slot, -1 when none is free or the CQ is full.
int push_big(xsrc_cq_ring *ring, uint64_t wr_id, const std::vector<unsigned char> &payload,
	     std::vector<unsigned char> &dst)
{
	int slot = cq_big_claim(ring, 0);
	if (slot < 0)
		return -1;
	std::memcpy(cq_big_payload(ring, slot), payload.data(), payload.size());
	xsrc_cqe c = cqe_for(wr_id);
	c.flags = XSRC_CQE_DEFERRED_BIG;
	c.big_slot = slot;
	c.byte_len = payload.size();
	c.deferred_va = reinterpret_cast<uintptr_t>(dst.data());
	return cq_push(ring, c) ? slot : -1;
}

const auto anywhere = [](uint64_t, uint32_t) { return true; };
const auto nowhere = [](uint64_t, uint32_t) { return false; };

TEST(CqRing, TakenEntriesStayCountedUntilTheHeadIsPublished)
{
	Ring r(4);
	CqConsumer consumer(r.ring());
	for (uint64_t i = 0; i < 4; ++i)
		ASSERT_TRUE(cq_push(r.ring(), cqe_for(i)));
	EXPECT_FALSE(cq_push(r.ring(), cqe_for(99))) << "cqe 4 holds 4";

	xsrc_cqe c;
	for (uint64_t i = 0; i < 4; ++i) {
		ASSERT_TRUE(consumer.take(c, anywhere));
		EXPECT_EQ(c.wr_id, i);
	}
	EXPECT_FALSE(consumer.take(c, anywhere));
	// Nothing published yet: the producers still see a full CQ, as an HCA
	// does until its provider writes the consumer index.
	EXPECT_FALSE(cq_push(r.ring(), cqe_for(99)));
	EXPECT_EQ(r.ring()->head, 0u);
	consumer.publish();
	EXPECT_EQ(r.ring()->head, 4u);
	for (uint64_t i = 4; i < 8; ++i)
		ASSERT_TRUE(cq_push(r.ring(), cqe_for(i)));
	for (uint64_t i = 4; i < 8; ++i) {
		ASSERT_TRUE(consumer.take(c, anywhere));
		EXPECT_EQ(c.wr_id, i);
	}
}

TEST(CqRing, ManyLapsKeepOrder)
{
	Ring r(3);
	CqConsumer consumer(r.ring());
	uint64_t next = 0;
	xsrc_cqe c;
	for (uint64_t lap = 0; lap < 1000; ++lap) {
		while (cq_push(r.ring(), cqe_for(next)))
			++next;
		for (uint64_t pos = consumer.pos(); consumer.take(c, anywhere); ++pos)
			ASSERT_EQ(c.wr_id, pos);
		consumer.publish();
	}
	EXPECT_EQ(consumer.pos(), next);
	EXPECT_EQ(next, 3000u);
}

TEST(CqRing, PayloadsArePlacedFromTheShape)
{
	Ring r(8, 64);
	CqConsumer consumer(r.ring());
	std::vector<unsigned char> small(100, 0x11), big(3000, 0x22);
	std::vector<unsigned char> small_dst(100), big_dst(3000);

	xsrc_cqe c = cqe_for(1);
	c.flags = XSRC_CQE_DEFERRED;
	c.byte_len = small.size();
	c.deferred_va = reinterpret_cast<uintptr_t>(small_dst.data());
	iovec iov{small.data(), small.size()};
	ASSERT_TRUE(cq_push(r.ring(), c, {&iov, 1}));

	int slot = push_big(r.ring(), 2, big, big_dst);
	ASSERT_GE(slot, 0);

	xsrc_cqe out;
	ASSERT_TRUE(consumer.take(out, anywhere));
	EXPECT_EQ(out.status, IBV_WC_SUCCESS);
	EXPECT_EQ(small_dst, small);
	ASSERT_TRUE(consumer.take(out, anywhere));
	EXPECT_EQ(out.status, IBV_WC_SUCCESS);
	EXPECT_EQ(out.byte_len, big.size());
	EXPECT_EQ(big_dst, big);
	EXPECT_NE(cq_big_claim(r.ring(), slot), slot) << "emptied, but not yet published";
	consumer.publish();
	EXPECT_EQ(cq_big_claim(r.ring(), slot), slot) << "the emptied big slot is free again";
}

TEST(CqRing, APayloadThatMayNotBePlacedIsAProtectionErrorAndFreesItsSlot)
{
	Ring r(8, 64);
	CqConsumer consumer(r.ring());
	std::vector<unsigned char> dst(64, 0);
	int slot = push_big(r.ring(), 7, std::vector<unsigned char>(64, 0x33), dst);
	ASSERT_GE(slot, 0);

	xsrc_cqe out;
	ASSERT_TRUE(consumer.take(out, nowhere));
	EXPECT_EQ(out.status, IBV_WC_LOC_PROT_ERR);
	EXPECT_EQ(out.byte_len, 0u);
	EXPECT_EQ(dst, std::vector<unsigned char>(64, 0));
	consumer.publish();
	EXPECT_EQ(cq_big_claim(r.ring(), slot), slot);
}

TEST(CqRing, AConsumerStartsAtThePublishedHead)
{
	Ring r(2);
	ASSERT_TRUE(cq_push(r.ring(), cqe_for(0)));
	ASSERT_TRUE(cq_push(r.ring(), cqe_for(1)));
	xsrc_cqe c;
	CqConsumer first(r.ring());
	ASSERT_TRUE(first.take(c, anywhere));
	first.publish();
	EXPECT_EQ(r.ring()->head, 1u);
	CqConsumer next(r.ring());
	EXPECT_EQ(next.pos(), 1u);
	ASSERT_TRUE(next.take(c, anywhere));
	EXPECT_EQ(c.wr_id, 1u);
	next.publish();
	ASSERT_TRUE(cq_push(r.ring(), cqe_for(2)));
	EXPECT_EQ(cq_ring_pending(*r.ring()), 1u);
}

}  // namespace
}  // namespace xsrc
