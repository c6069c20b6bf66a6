// The device arena: the page allocator (first fit, coalescing, quarantine)
// with a clock of our own, and the mapped file (layout, zeroed allocations,
// removal).
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <gtest/gtest.h>
#include <string>

#include "arena.h"

namespace xsrc {
namespace {

using Clock = PageAllocator::Clock;
using std::chrono::milliseconds;

TEST(PageAllocator, FirstFitSplitsAndCoalesces)
{
	const Clock::time_point t0{};
	PageAllocator pages(10, 100, milliseconds(0));
	EXPECT_EQ(pages.allocate(10, t0), 10u);
	EXPECT_EQ(pages.allocate(20, t0), 20u);
	EXPECT_EQ(pages.allocate(10, t0), 40u);
	EXPECT_EQ(pages.free_pages(), 60u);
	pages.release({20, 20}, t0);
	pages.expire(t0);
	EXPECT_EQ(pages.allocate(5, t0), 20u);   // first fit: the hole comes first
	EXPECT_EQ(pages.allocate(20, t0), 50u);  // does not fit the 15 left in it
	pages.release({10, 10}, t0);
	pages.release({20, 5}, t0);
	pages.expire(t0);
	EXPECT_EQ(pages.allocate(30, t0), 10u);  // 10..39 coalesced again
	EXPECT_FALSE(pages.allocate(1000, t0));
	EXPECT_FALSE(pages.allocate(0, t0));
}

TEST(PageAllocator, QuarantineDelaysReuse)
{
	const Clock::time_point t0{};
	PageAllocator pages(0, 8, milliseconds(2000));
	ASSERT_EQ(pages.allocate(4, t0), 0u);
	ASSERT_EQ(pages.allocate(4, t0), 4u);
	pages.release({0, 4}, t0);
	EXPECT_EQ(pages.quarantined_pages(), 4u);
	EXPECT_EQ(pages.free_pages(), 0u);
	EXPECT_FALSE(pages.allocate(1, t0 + milliseconds(1999)));  // a stale offset may still be in use
	auto back = pages.expire(t0 + milliseconds(2000));
	ASSERT_EQ(back.size(), 1u);
	EXPECT_EQ(back[0].first, 0u);
	EXPECT_EQ(back[0].count, 4u);
	EXPECT_EQ(pages.quarantined_pages(), 0u);
	EXPECT_EQ(pages.allocate(4, t0 + milliseconds(2000)), 0u);

	// Released later, expires later.
	pages.release({4, 4}, t0 + milliseconds(3000));
	pages.release({0, 4}, t0 + milliseconds(4000));
	EXPECT_EQ(pages.expire(t0 + milliseconds(5000)).size(), 1u);
	EXPECT_EQ(pages.allocate(4, t0 + milliseconds(5000)), 4u);
	EXPECT_EQ(pages.expire(t0 + milliseconds(6000)).size(), 1u);
}

TEST(PageAllocator, ExpiryMergesAdjacentRanges)
{
	const Clock::time_point t0{};
	PageAllocator pages(0, 32, milliseconds(10));
	for (int i = 0; i < 6; ++i)
		ASSERT_EQ(pages.allocate(2, t0), uint64_t(2 * i));
	// Released out of order; 0..5 side by side, 8..9 apart.
	pages.release({2, 2}, t0);
	pages.release({8, 2}, t0);
	pages.release({0, 2}, t0);
	pages.release({4, 2}, t0);
	auto runs = pages.expire(t0 + milliseconds(10));
	ASSERT_EQ(runs.size(), 2u);
	EXPECT_EQ(runs[0].first, 0u);
	EXPECT_EQ(runs[0].count, 6u);
	EXPECT_EQ(runs[1].first, 8u);
	EXPECT_EQ(runs[1].count, 2u);
	EXPECT_EQ(pages.allocate(6, t0 + milliseconds(10)), 0u);
	EXPECT_TRUE(pages.expire(t0 + milliseconds(20)).empty());
}

class ArenaTest : public ::testing::Test {
protected:
	void SetUp() override { path_ = "/dev/shm/xsrc-arenatest-" + std::to_string(getpid()); }
	void TearDown() override { ::unlink(path_.c_str()); }
	std::string path_;
};

TEST_F(ArenaTest, FileHeaderAndTables)
{
	std::unique_ptr<Arena> arena;
	ASSERT_EQ(Arena::create(path_, arena), 0);
	struct stat st;
	ASSERT_EQ(stat(path_.c_str(), &st), 0);
	EXPECT_EQ(st.st_mode & 0777, 0666u);
	EXPECT_EQ(uint64_t(st.st_size), XSRC_ARENA_SIZE);
	EXPECT_LT(uint64_t(st.st_blocks) * 512, 16u << 20);  // sparse

	const xsrc_arena_header &h = arena->header();
	EXPECT_EQ(h.magic, XSRC_ARENA_MAGIC);
	EXPECT_EQ(h.version, uint32_t(XSRC_ARENA_VERSION));
	EXPECT_EQ(h.size, XSRC_ARENA_SIZE);
	const uint64_t offs[] = {h.qp_table_off, h.mr_table_off, h.srq_table_off, h.atomic_locks_off,
				 h.mcast_table_off};
	for (uint64_t off : offs)
		EXPECT_EQ(off % kArenaPage, 0u);
	EXPECT_GE(h.qp_table_off, sizeof(xsrc_arena_header));
	EXPECT_GE(h.mr_table_off, h.qp_table_off + XSRC_QP_TABLE_LEN * sizeof(xsrc_qp_entry));
	EXPECT_GE(h.srq_table_off, h.mr_table_off + XSRC_MR_TABLE_LEN * sizeof(xsrc_mr_entry));
	EXPECT_GE(h.atomic_locks_off, h.srq_table_off + XSRC_SRQ_TABLE_LEN * sizeof(xsrc_srq_entry));
	EXPECT_GE(h.mcast_table_off, h.atomic_locks_off + XSRC_ATOMIC_LOCKS * 4);
	EXPECT_EQ(arena->mcast_table().num_groups, uint32_t(XSRC_MCAST_GROUPS));
	EXPECT_EQ(arena->mcast_table().scan_end, 0u);
	EXPECT_EQ(reinterpret_cast<const unsigned char *>(&arena->mcast_group(1)) -
			  reinterpret_cast<const unsigned char *>(&h),
		  ptrdiff_t(h.mcast_table_off + sizeof(xsrc_mcast_table) + sizeof(xsrc_mcast_group)));
	EXPECT_EQ(reinterpret_cast<const unsigned char *>(&arena->qp_entry(1)) -
			  reinterpret_cast<const unsigned char *>(&h),
		  ptrdiff_t(h.qp_table_off + sizeof(xsrc_qp_entry)));

	// Rings come after every table.
	uint64_t off = arena->allocate(1);
	EXPECT_GE(off, h.mcast_table_off + sizeof(xsrc_mcast_table) + XSRC_MCAST_GROUPS * sizeof(xsrc_mcast_group));
	EXPECT_EQ(off % kArenaPage, 0u);

	arena.reset();
	EXPECT_NE(access(path_.c_str(), F_OK), 0);  // removed with the device
}

TEST_F(ArenaTest, AllocationsAreZeroedAndQuarantined)
{
	std::unique_ptr<Arena> arena;
	ASSERT_EQ(Arena::create(path_, arena, milliseconds(0)), 0);
	uint64_t before = arena->free_pages();
	uint64_t a = arena->allocate(3 * kArenaPage + 1);
	ASSERT_NE(a, 0u);
	EXPECT_EQ(arena->free_pages(), before - 4);
	std::memset(&arena->at<unsigned char>(a), 0xab, 4 * kArenaPage);
	arena->release(a);
	arena->release(a);  // twice: ignored
	uint64_t b = arena->allocate(4 * kArenaPage);
	EXPECT_EQ(b, a);  // no quarantine in this arena: first fit reuses it
	auto *bytes = &arena->at<unsigned char>(b);
	for (uint64_t i = 0; i < 4 * kArenaPage; ++i)
		ASSERT_EQ(bytes[i], 0) << i;
	EXPECT_EQ(arena->allocate(0), 0u);
	EXPECT_EQ(arena->allocate(XSRC_ARENA_SIZE), 0u);

	std::unique_ptr<Arena> slow;
	std::string path2 = path_ + "-q";
	ASSERT_EQ(Arena::create(path2, slow), 0);  // the default quarantine
	uint64_t c = slow->allocate(kArenaPage);
	slow->release(c);
	EXPECT_EQ(slow->quarantined_pages(), 1u);
	EXPECT_NE(slow->allocate(kArenaPage), c);
}

TEST_F(ArenaTest, ReplacesAStaleFile)
{
	FILE *f = fopen(path_.c_str(), "w");
	ASSERT_NE(f, nullptr);
	fputs("stale", f);
	fclose(f);
	std::unique_ptr<Arena> arena;
	ASSERT_EQ(Arena::create(path_, arena), 0);
	EXPECT_EQ(arena->header().magic, XSRC_ARENA_MAGIC);
}

}  // namespace
}  // namespace xsrc
