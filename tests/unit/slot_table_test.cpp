// The device-wide slot tables behind QP and SRQ numbers: round robin, so
// that a number is not reused at once, and full at their size (the vector
// behind them grows as slots are first handed out).
#include <gtest/gtest.h>

#include "objects.h"

namespace xsrc {
namespace {

ObjectRef ref(uint32_t handle)
{
	static Context ctx;
	return {&ctx, ObjHandle(handle)};
}

TEST(SlotTable, RoundRobinUntilFull)
{
	SlotTable slots(4);
	EXPECT_FALSE(slots.find(0));  // nothing handed out yet
	for (uint32_t i = 0; i < 4; ++i)
		EXPECT_EQ(slots.allocate(ref(i)), i);
	EXPECT_EQ(slots.used(), 4u);
	EXPECT_EQ(slots.allocate(ref(9)), std::nullopt);  // full
	EXPECT_EQ(slots.find(2), ref(2));
	EXPECT_FALSE(slots.find(4));

	slots.release(1);
	slots.release(3);
	EXPECT_FALSE(slots.find(1));
	EXPECT_EQ(slots.allocate(ref(5)), 1u);  // the only free slot after the wrap
	EXPECT_EQ(slots.allocate(ref(6)), 3u);  // the next free one, not 1 again
	EXPECT_EQ(slots.used(), 4u);
	EXPECT_EQ(slots.allocate(ref(7)), std::nullopt);
}

TEST(SlotTable, FreedSlotIsNotReusedAtOnce)
{
	SlotTable slots(8);
	EXPECT_EQ(slots.allocate(ref(0)), 0u);
	slots.release(0);
	EXPECT_EQ(slots.allocate(ref(1)), 1u);
	slots.release(1);
	EXPECT_EQ(slots.allocate(ref(2)), 2u);
	slots.release(2);
	slots.release(2);  // twice: harmless
	EXPECT_EQ(slots.used(), 0u);
	for (uint32_t i = 3; i < 8; ++i)
		EXPECT_EQ(slots.allocate(ref(i)), i);
	EXPECT_EQ(slots.allocate(ref(8)), 0u);  // wrapped around to the start
	EXPECT_EQ(slots.used(), 6u);
	slots.rebind(0, ref(42));
	EXPECT_EQ(slots.find(0), ref(42));
	slots.rebind(1, ref(43));  // a free slot stays free
	EXPECT_FALSE(slots.find(1));
}

TEST(SlotTable, EmptyTableIsFull)
{
	SlotTable slots(0);
	EXPECT_EQ(slots.allocate(ref(0)), std::nullopt);
	EXPECT_EQ(slots.used(), 0u);
}

}  // namespace
}  // namespace xsrc
