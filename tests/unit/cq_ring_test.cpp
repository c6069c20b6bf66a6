// The CQ ring's consumer (common/ring_ops.h, CqConsumer): takes at its own
// position, payloads placed from the ring's shape as it read it once, and
// the head and the emptied big slots told to producers lazily (publish()).
// Producers claim big slots only from what was published, and count free
// entries from the head and, when it says full, from the slots.
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

TEST(CqRing, ATakenEntryIsRoomBeforeTheHeadIsPublished)
{
	Ring r(4);
	CqConsumer consumer(r.ring());
	for (uint64_t i = 0; i < 4; ++i)
		ASSERT_TRUE(cq_push(r.ring(), cqe_for(i)));
	EXPECT_FALSE(cq_push(r.ring(), cqe_for(99))) << "cqe 4 holds 4";

	xsrc_cqe c;
	ASSERT_TRUE(consumer.take(c, anywhere));
	EXPECT_EQ(c.wr_id, 0u);
	// The head still says 4 are outstanding; the slot of position 0 says
	// the consumer took it (revision 10): room for exactly one.
	EXPECT_EQ(r.ring()->head, 0u);
	EXPECT_TRUE(cq_push(r.ring(), cqe_for(4)));
	EXPECT_FALSE(cq_push(r.ring(), cqe_for(99))) << "4 outstanding again";
	for (uint64_t i = 1; i < 5; ++i) {
		ASSERT_TRUE(consumer.take(c, anywhere));
		EXPECT_EQ(c.wr_id, i);
	}
	EXPECT_FALSE(consumer.take(c, anywhere));
	consumer.publish();
	EXPECT_EQ(r.ring()->head, 5u) << "without eager_heads the head goes out at every publish";
}

// Revision 10: while no context trusts heads (eager_heads 0) the consumer
// publishes its head once cqe / 2 completions were taken; while one does,
// at every publish. Its producers never see an overrun that is not one.
TEST(CqRing, TheHeadGoesOutLazilyWhileNoContextTrustsIt)
{
	Ring r(8);
	uint32_t eager = 0;
	CqConsumer consumer(r.ring(), &eager);
	xsrc_cqe c;
	for (uint64_t i = 0; i < 8; ++i)
		ASSERT_TRUE(cq_push(r.ring(), cqe_for(i)));
	for (int i = 0; i < 3; ++i) {
		ASSERT_TRUE(consumer.take(c, anywhere));
		consumer.publish();
	}
	EXPECT_EQ(r.ring()->head, 0u) << "3 of cqe 8 taken: not yet published";
	ASSERT_TRUE(consumer.take(c, anywhere));
	consumer.publish();
	EXPECT_EQ(r.ring()->head, 4u) << "cqe / 2 taken: published";
	// A producer that reads the slots fills the CQ to exactly cqe.
	ASSERT_TRUE(consumer.take(c, anywhere));
	consumer.publish();
	EXPECT_EQ(r.ring()->head, 4u);
	for (uint64_t i = 8; i < 13; ++i)
		ASSERT_TRUE(cq_push(r.ring(), cqe_for(i))) << i;
	EXPECT_FALSE(cq_push(r.ring(), cqe_for(99))) << "8 outstanding";

	eager = 1;  // a context of an older provider arrived
	ASSERT_TRUE(consumer.take(c, anywhere));
	consumer.publish();
	EXPECT_EQ(r.ring()->head, 6u) << "published at once while eager_heads is not 0";
	consumer.publish(true);
	EXPECT_EQ(r.ring()->head, 6u);
}

// What the daemon does when the first context that trusts heads arrives:
// each ring's head is raised to the consumer's position as the slots show
// it, never past the tail, never down.
TEST(CqRing, TheDaemonCatchesAHeadUpFromTheSlots)
{
	Ring r(8);
	uint32_t eager = 0;
	CqConsumer consumer(r.ring(), &eager);
	xsrc_cqe c;
	for (uint64_t i = 0; i < 6; ++i)
		ASSERT_TRUE(cq_push(r.ring(), cqe_for(i)));
	for (int i = 0; i < 3; ++i)
		ASSERT_TRUE(consumer.take(c, anywhere));
	consumer.publish();
	ASSERT_EQ(r.ring()->head, 0u);
	cq_catch_up_head(r.ring());
	EXPECT_EQ(r.ring()->head, 3u);
	cq_catch_up_head(r.ring());
	EXPECT_EQ(r.ring()->head, 3u);

	// A forged slot that claims a consumption beyond the tail is ignored.
	const uint32_t n = r.ring()->num_entries;
	atomic(cq_slot(r.ring(), 7)->seq).store(7 + 2 * uint64_t(n), std::memory_order_relaxed);
	cq_catch_up_head(r.ring());
	EXPECT_EQ(r.ring()->head, 3u);
	// A head already ahead of the slots stays.
	atomic(r.ring()->head).store(5, std::memory_order_relaxed);
	cq_catch_up_head(r.ring());
	EXPECT_EQ(r.ring()->head, 5u);
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
	EXPECT_NE(cq_big_claim(r.ring(), slot), slot) << "one of 64 emptied: kept until a quarter is";
	consumer.publish(true);
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
	consumer.publish(true);
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
