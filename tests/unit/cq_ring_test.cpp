// The CQ ring's consumer side (common/ring_ops.h): cq_take() at the
// consumer's own position, the head published once per poll, and the
// payloads placed from the ring's shape as the consumer read it once.
// Producers count free entries from the published head only.
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

const auto anywhere = [](uint64_t, uint32_t) { return true; };
const auto nowhere = [](uint64_t, uint32_t) { return false; };

TEST(CqRing, TakenEntriesStayCountedUntilTheHeadIsPublished)
{
	Ring r(4);
	const CqShape shape = CqShape::of(r.ring());
	for (uint64_t i = 0; i < 4; ++i)
		ASSERT_TRUE(cq_push(r.ring(), cqe_for(i)));
	EXPECT_FALSE(cq_push(r.ring(), cqe_for(99))) << "cqe 4 holds 4";

	uint64_t pos = 0;
	xsrc_cqe c;
	for (uint64_t i = 0; i < 4; ++i) {
		ASSERT_TRUE(cq_take(shape, pos, c, anywhere));
		EXPECT_EQ(c.wr_id, i);
		++pos;
	}
	EXPECT_FALSE(cq_take(shape, pos, c, anywhere));
	// Nothing published yet: the producers still see a full CQ, as an HCA
	// does until its provider writes the consumer index.
	EXPECT_FALSE(cq_push(r.ring(), cqe_for(99)));
	cq_publish_head(r.ring(), pos);
	for (uint64_t i = 4; i < 8; ++i)
		ASSERT_TRUE(cq_push(r.ring(), cqe_for(i)));
	for (uint64_t i = 4; i < 8; ++i) {
		ASSERT_TRUE(cq_take(shape, pos, c, anywhere));
		EXPECT_EQ(c.wr_id, i);
		++pos;
	}
}

TEST(CqRing, ManyLapsKeepOrder)
{
	Ring r(3);
	const CqShape shape = CqShape::of(r.ring());
	uint64_t pos = 0, next = 0;
	xsrc_cqe c;
	for (uint64_t lap = 0; lap < 1000; ++lap) {
		while (cq_push(r.ring(), cqe_for(next)))
			++next;
		while (cq_take(shape, pos, c, anywhere)) {
			ASSERT_EQ(c.wr_id, pos);
			++pos;
		}
		cq_publish_head(r.ring(), pos);
	}
	EXPECT_EQ(pos, next);
	EXPECT_EQ(next, 3000u);
}

TEST(CqRing, PayloadsArePlacedFromTheShape)
{
	Ring r(8, 64);
	const CqShape shape = CqShape::of(r.ring());
	std::vector<unsigned char> small(100, 0x11), big(3000, 0x22);
	std::vector<unsigned char> small_dst(100), big_dst(3000);

	xsrc_cqe c = cqe_for(1);
	c.flags = XSRC_CQE_DEFERRED;
	c.byte_len = small.size();
	c.deferred_va = reinterpret_cast<uintptr_t>(small_dst.data());
	iovec iov{small.data(), small.size()};
	ASSERT_TRUE(cq_push(r.ring(), c, {&iov, 1}));

	int slot = cq_big_claim(r.ring(), 0);
	ASSERT_GE(slot, 0);
	std::memcpy(cq_big_payload(r.ring(), slot), big.data(), big.size());
	c = cqe_for(2);
	c.flags = XSRC_CQE_DEFERRED_BIG;
	c.big_slot = slot;
	c.byte_len = big.size();
	c.deferred_va = reinterpret_cast<uintptr_t>(big_dst.data());
	ASSERT_TRUE(cq_push(r.ring(), c));

	uint64_t pos = 0;
	xsrc_cqe out;
	ASSERT_TRUE(cq_take(shape, pos++, out, anywhere));
	EXPECT_EQ(out.status, IBV_WC_SUCCESS);
	EXPECT_EQ(small_dst, small);
	ASSERT_TRUE(cq_take(shape, pos++, out, anywhere));
	EXPECT_EQ(out.status, IBV_WC_SUCCESS);
	EXPECT_EQ(out.byte_len, big.size());
	EXPECT_EQ(big_dst, big);
	EXPECT_EQ(cq_big_claim(r.ring(), slot), slot) << "the taken big slot is free again";
}

TEST(CqRing, APayloadThatMayNotBePlacedIsAProtectionErrorAndFreesItsSlot)
{
	Ring r(8, 64);
	const CqShape shape = CqShape::of(r.ring());
	std::vector<unsigned char> dst(64, 0);
	int slot = cq_big_claim(r.ring(), 5);
	ASSERT_GE(slot, 0);
	xsrc_cqe c = cqe_for(7);
	c.flags = XSRC_CQE_DEFERRED_BIG;
	c.big_slot = slot;
	c.byte_len = dst.size();
	c.deferred_va = reinterpret_cast<uintptr_t>(dst.data());
	ASSERT_TRUE(cq_push(r.ring(), c));

	xsrc_cqe out;
	ASSERT_TRUE(cq_take(shape, 0, out, nowhere));
	EXPECT_EQ(out.status, IBV_WC_LOC_PROT_ERR);
	EXPECT_EQ(out.byte_len, 0u);
	EXPECT_EQ(dst, std::vector<unsigned char>(64, 0));
	EXPECT_EQ(cq_big_claim(r.ring(), slot), slot);
}

TEST(CqRing, PopPublishesEachCompletion)
{
	Ring r(2);
	ASSERT_TRUE(cq_push(r.ring(), cqe_for(0)));
	ASSERT_TRUE(cq_push(r.ring(), cqe_for(1)));
	xsrc_cqe c;
	ASSERT_TRUE(cq_pop(r.ring(), c, anywhere));
	EXPECT_EQ(r.ring()->head, 1u);
	ASSERT_TRUE(cq_push(r.ring(), cqe_for(2)));
	EXPECT_EQ(cq_ring_pending(*r.ring()), 2u);
}

}  // namespace
}  // namespace xsrc
