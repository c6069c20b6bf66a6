// The CQ ring's consumer (common/ring_ops.h, CqConsumer): takes at its own
// position, payloads placed from the ring's shape as it read it once, and
// the head and the emptied big slots told to producers lazily (publish()).
// Producers claim big slots only from what was published, and count free
// entries from the head and, when it says full, from the slots.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <thread>
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
	cq_catch_up_head(r.ring(), cq_shape(r.ring()));
	EXPECT_EQ(r.ring()->head, 3u);
	cq_catch_up_head(r.ring(), cq_shape(r.ring()));
	EXPECT_EQ(r.ring()->head, 3u);

	// A forged slot that claims a consumption beyond the tail is ignored.
	const uint32_t n = r.ring()->num_entries;
	atomic(cq_slot(r.ring(), 7)->seq).store(7 + 2 * uint64_t(n), std::memory_order_relaxed);
	cq_catch_up_head(r.ring(), cq_shape(r.ring()));
	EXPECT_EQ(r.ring()->head, 3u);
	// A head already ahead of the slots stays.
	atomic(r.ring()->head).store(5, std::memory_order_relaxed);
	cq_catch_up_head(r.ring(), cq_shape(r.ring()));
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

// A big slot's payload given to cq_push lands in the slot the completion
// names (written after the slot of the completion is claimed).
TEST(CqRing, ABigPayloadGoesToTheSlotTheCompletionNames)
{
	Ring r(8, 64);
	CqConsumer consumer(r.ring());
	std::vector<unsigned char> big(2000, 0x5a), dst(2000, 0);
	int slot = cq_big_claim(r.ring(), 10);
	ASSERT_GE(slot, 0);
	xsrc_cqe c = cqe_for(3);
	c.flags = XSRC_CQE_DEFERRED_BIG;
	c.big_slot = static_cast<uint8_t>(slot);
	c.byte_len = big.size();
	c.deferred_va = reinterpret_cast<uintptr_t>(dst.data());
	iovec iov[2]{{big.data(), 1000}, {big.data() + 1000, 1000}};
	ASSERT_TRUE(cq_push(r.ring(), c, {iov, 2}));
	EXPECT_EQ(std::memcmp(cq_big_payload(r.ring(), slot), big.data(), big.size()), 0);
	xsrc_cqe out;
	ASSERT_TRUE(consumer.take(out, anywhere));
	EXPECT_EQ(out.status, IBV_WC_SUCCESS);
	EXPECT_EQ(dst, big);
}

// Revision 11 (xsrc-queues.h): arming when the consumer sets arm_sees_tail.
struct ArmedRing : Ring {
	ArmedRing() : Ring(8) { ring()->arm_sees_tail = 1; }
	// A producer between its CAS and its publication, which read `armed`
	// before the consumer armed: the slot of `pos` claimed, not written.
	void claim_unpublished() { ++ring()->tail; }
	void publish(uint64_t pos)
	{
		xsrc_cqe *slot = cq_slot(ring(), pos);
		*slot = cqe_for(pos);
		atomic(slot->seq).store(pos + 1, std::memory_order_release);
	}
};

TEST(CqArm, AProducerAfterTheArmFiresItOnce)
{
	ArmedRing r;
	EXPECT_FALSE(cq_arm(r.ring(), r.ring()->num_entries, XSRC_CQ_ARMED_NEXT, 0)) << "nothing in flight";
	EXPECT_EQ(cq_push_notify(r.ring(), cqe_for(0)), CqPushed::event);
	EXPECT_EQ(r.ring()->armed, uint32_t(XSRC_CQ_ARMED_NONE));
	EXPECT_EQ(cq_push_notify(r.ring(), cqe_for(1)), CqPushed::placed) << "one event per arming";
}

TEST(CqArm, SolicitedOnlyFiresForSolicitedAndErrorCompletions)
{
	ArmedRing r;
	EXPECT_FALSE(cq_arm(r.ring(), r.ring()->num_entries, XSRC_CQ_ARMED_SOLICITED, 0));
	EXPECT_EQ(cq_push_notify(r.ring(), cqe_for(0)), CqPushed::placed);
	xsrc_cqe failed = cqe_for(1);
	failed.status = IBV_WC_REM_ACCESS_ERR;
	EXPECT_EQ(cq_push_notify(r.ring(), failed), CqPushed::event);
	EXPECT_FALSE(cq_arm(r.ring(), r.ring()->num_entries, XSRC_CQ_ARMED_SOLICITED, 0)) << "both published: the poll sees them";
	xsrc_cqe solicited = cqe_for(2);
	solicited.flags = XSRC_CQE_SOLICITED;
	EXPECT_EQ(cq_push_notify(r.ring(), solicited), CqPushed::event);
}

TEST(CqArm, ACompletionPublishedBeforeTheArmIsLeftToThePoll)
{
	ArmedRing r;
	ASSERT_EQ(cq_push_notify(r.ring(), cqe_for(0)), CqPushed::placed);
	EXPECT_FALSE(cq_arm(r.ring(), r.ring()->num_entries, XSRC_CQ_ARMED_NEXT, 0));
	EXPECT_EQ(r.ring()->armed, uint32_t(XSRC_CQ_ARMED_NEXT)) << "still armed for the next one";
}

// The race the protocol closes: the producer read `armed` before the arm and
// has not published yet. The arm waits, then fires itself.
TEST(CqArm, ACompletionClaimedBeforeTheArmAndNotPublishedFiresIt)
{
	ArmedRing r;
	r.claim_unpublished();
	EXPECT_TRUE(cq_arm(r.ring(), r.ring()->num_entries, XSRC_CQ_ARMED_SOLICITED, 0));
	EXPECT_EQ(r.ring()->armed, uint32_t(XSRC_CQ_ARMED_NONE)) << "the arm was consumed";
	r.publish(0);
	CqConsumer consumer(r.ring());
	xsrc_cqe out;
	EXPECT_TRUE(consumer.take(out, anywhere));
	// Taken positions are not in flight, whatever the position told.
	EXPECT_FALSE(cq_arm(r.ring(), r.ring()->num_entries, XSRC_CQ_ARMED_NEXT, 0));
}

// The ring header is in the arena, which another process may write: a
// forged num_entries and tail make the arm scan no further than the ring
// its caller knows (its consumer's shape, or the daemon's checked copy).
TEST(CqArm, AForgedRingSizeScansOnlyTheRingTheCallerKnows)
{
	ArmedRing r;
	const uint32_t entries = r.ring()->num_entries;
	r.ring()->num_entries = 1u << 30;
	r.ring()->tail = uint64_t(1) << 29;
	EXPECT_FALSE(cq_arm(r.ring(), entries, XSRC_CQ_ARMED_NEXT, 0)) << "no slot of the ring is in flight";
	EXPECT_EQ(r.ring()->armed, uint32_t(XSRC_CQ_ARMED_NEXT));
}

// Published while the arm waits: the poll after arming sees it, no event.
TEST(CqArm, ACompletionPublishedWhileTheArmWaitsIsLeftToThePoll)
{
	ArmedRing r;
	r.claim_unpublished();
	std::atomic<bool> returned{false};
	std::thread producer([&] {
		while (atomic(r.ring()->armed).load() == XSRC_CQ_ARMED_NONE && !returned.load())
			cpu_relax();
		r.publish(0);
	});
	bool fired = cq_arm(r.ring(), r.ring()->num_entries, XSRC_CQ_ARMED_NEXT, 0);
	returned = true;
	producer.join();
	// On a loaded machine the producer may not run within the wait; then
	// the arm fired, which is never wrong.
	if (!fired)
		EXPECT_EQ(r.ring()->armed, uint32_t(XSRC_CQ_ARMED_NEXT));
	else
		EXPECT_EQ(r.ring()->armed, uint32_t(XSRC_CQ_ARMED_NONE));
}

// One completion against one arming, many rounds, each side starting after
// a random spin: the consumer arms, polls, and when that found nothing waits
// for the event; it must come. A 4 KiB payload in a big slot keeps the
// producer a while between claiming its slot and publishing it, the window
// where it may have read `armed` before the arm.
TEST(CqArm, NoEventIsLostBetweenAProducerAndAnArmingConsumer)
{
	for (uint32_t flag : {0u, 1u}) {
		Ring r(8, 64);
		r.ring()->arm_sees_tail = flag;
		r.ring()->big_polled = 1;
		constexpr unsigned kRounds = 20000;
		std::atomic<unsigned> go{0}, done{0};
		std::atomic<uint64_t> events{0};
		std::vector<unsigned char> dst(4096);
		std::thread producer([&] {
			std::vector<unsigned char> payload(4096, 0x77);
			iovec iov{payload.data(), payload.size()};
			std::minstd_rand rng(1);
			for (unsigned round = 1; round <= kRounds; ++round) {
				while (go.load() < round)
					cpu_relax();
				if (go.load() > kRounds)
					return;  // the consumer stopped
				for (unsigned n = rng() % 256; n; --n)
					cpu_relax();
				int slot = cq_big_claim(r.ring(), 0);
				ASSERT_GE(slot, 0);
				xsrc_cqe c = cqe_for(round);
				c.flags = XSRC_CQE_DEFERRED_BIG;
				c.big_slot = static_cast<uint8_t>(slot);
				c.byte_len = payload.size();
				c.deferred_va = reinterpret_cast<uintptr_t>(dst.data());
				CqPushed p = cq_push_notify(r.ring(), c, {&iov, 1});
				ASSERT_NE(p, CqPushed::full);
				if (p == CqPushed::event)
					events.fetch_add(1);
				done.store(round);
			}
		});
		CqConsumer consumer(r.ring());
		std::minstd_rand rng(2);
		unsigned lost = 0, waits = 0;
		xsrc_cqe c;
		for (unsigned round = 1; round <= kRounds && !lost; ++round) {
			go.store(round);
			for (unsigned n = rng() % 256; n; --n)
				cpu_relax();
			uint64_t seen = events.load();
			bool fired = flag ? cq_arm(r.ring(), r.ring()->num_entries, XSRC_CQ_ARMED_NEXT, consumer.pos())
					  : (atomic(r.ring()->armed).store(XSRC_CQ_ARMED_NEXT), false);
			if (!consumer.take(c, anywhere)) {  // the poll after arming found nothing
				++waits;
				auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
				while (!fired && events.load() == seen && std::chrono::steady_clock::now() < deadline)
					cpu_relax();
				if (!fired && events.load() == seen)
					++lost;
				while (!consumer.take(c, anywhere))
					cpu_relax();
			}
			while (done.load() != round)
				cpu_relax();
			atomic(r.ring()->armed).store(XSRC_CQ_ARMED_NONE);
			consumer.publish(true);
		}
		go.store(kRounds + 1);
		producer.join();
		EXPECT_EQ(lost, 0u) << "arm_sees_tail " << flag << ": an arming slept through a completion";
		EXPECT_GT(waits, 0u) << "the consumer never waited: the test tested nothing";
	}
}

}  // namespace
}  // namespace xsrc
