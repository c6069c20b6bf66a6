// Multicast commands (driver ABI r3): ATTACH_MCAST / DETACH_MCAST as the
// kernel and rxe answer them, the limits, and the arena's multicast table
// the data path reads.
#include "command_fixture.h"

#include <array>

namespace xsrc::test {
namespace {

using GidBytes = std::array<uint8_t, 16>;

constexpr GidBytes kGroupV6 = {0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34};
constexpr GidBytes kGroupV4 = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3};  // ::ffff:239.1.2.3

// The n-th of many distinct IPv6 groups.
GidBytes nth_group(uint32_t n)
{
	GidBytes g = kGroupV6;
	g[12] = uint8_t(n >> 24);
	g[13] = uint8_t(n >> 16);
	g[14] = uint8_t(n >> 8);
	g[15] = uint8_t(n);
	return g;
}

class McastCommandsTest : public CommandFixture {
protected:
	void SetUp() override
	{
		CommandFixture::SetUp();
		basic_objects();
	}

	CreatedQp ud_qp(uint8_t type = IBV_QPT_UD)
	{
		CreatedQp qp;
		QpSpec s = qp_spec(type);
		s.max_recv_wr = 1;  // many QPs: small rings
		EXPECT_EQ(create_qp(s, qp), 0);
		return qp;
	}

	template <typename Cmd>
	static Cmd mcast_cmd(uint32_t qp, const GidBytes &gid, uint16_t lid = 0)
	{
		Cmd cmd{};
		std::memcpy(cmd.gid, gid.data(), gid.size());
		cmd.qp_handle = qp;
		cmd.mlid = lid;
		return cmd;
	}
	int attach(uint32_t qp, const GidBytes &gid, uint16_t lid = 0)
	{
		return run(IB_USER_VERBS_CMD_ATTACH_MCAST, mcast_cmd<ib_uverbs_attach_mcast>(qp, gid, lid));
	}
	int detach(uint32_t qp, const GidBytes &gid, uint16_t lid = 0)
	{
		return run(IB_USER_VERBS_CMD_DETACH_MCAST, mcast_cmd<ib_uverbs_detach_mcast>(qp, gid, lid));
	}

	xsrc_mcast_table &table() { return arena().mcast_table(); }
	xsrc_mcast_group &entry(uint32_t i) { return arena().mcast_group(i); }
	std::vector<uint32_t> members(uint32_t i)
	{
		xsrc_mcast_group &g = entry(i);
		return {g.qpns, g.qpns + g.num_qps};
	}
	static GidBytes gid_of(const xsrc_mcast_group &g)
	{
		GidBytes out;
		std::memcpy(out.data(), g.gid, out.size());
		return out;
	}

	ib_uverbs_query_device_resp query_device()
	{
		ib_uverbs_query_device_resp resp{};
		ib_uverbs_query_device cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		EXPECT_EQ(run(IB_USER_VERBS_CMD_QUERY_DEVICE, cmd, {}, sizeof(resp)), 0);
		return resp;
	}
};

TEST_F(McastCommandsTest, AttachPublishesTheGroupForTheDataPath)
{
	CreatedQp a = ud_qp(), b = ud_qp();
	uint32_t seq_before = entry(0).seq;
	ASSERT_EQ(attach(a.handle, kGroupV6), 0);
	ASSERT_EQ(attach(b.handle, kGroupV6, 0xc001), 0);  // the LID is ignored on RoCE
	EXPECT_EQ(table().num_groups, uint32_t(XSRC_MCAST_GROUPS));
	EXPECT_EQ(table().scan_end, 1u);
	EXPECT_EQ(gid_of(entry(0)), kGroupV6);
	EXPECT_EQ(members(0), (std::vector<uint32_t>{a.qpn, b.qpn}));
	EXPECT_EQ(entry(0).seq % 2, 0u) << "left locked";
	EXPECT_EQ(entry(0).seq, seq_before + 4) << "each change goes through the sequence lock";

	ASSERT_EQ(attach(b.handle, kGroupV4), 0);  // an IPv4 group as RoCE v2 names it
	EXPECT_EQ(table().scan_end, 2u);
	EXPECT_EQ(gid_of(entry(1)), kGroupV4);
	EXPECT_EQ(members(1), std::vector<uint32_t>{b.qpn});
	EXPECT_EQ(dev.mcast_attachments, 3u);
}

TEST_F(McastCommandsTest, AttachingTwiceIsZeroAndChangesNothing)
{
	CreatedQp a = ud_qp();
	ASSERT_EQ(attach(a.handle, kGroupV6), 0);
	uint32_t seq = entry(0).seq;
	EXPECT_EQ(attach(a.handle, kGroupV6), 0);
	EXPECT_EQ(attach(a.handle, kGroupV6, 7), 0);
	EXPECT_EQ(members(0), std::vector<uint32_t>{a.qpn});
	EXPECT_EQ(entry(0).seq, seq);
	EXPECT_EQ(dev.mcast_attachments, 1u);
	ASSERT_EQ(detach(a.handle, kGroupV6), 0);
	EXPECT_EQ(detach(a.handle, kGroupV6), EINVAL) << "one detach undoes it";
}

TEST_F(McastCommandsTest, OnlyUdQpsAndMulticastGidsAttach)
{
	CreatedQp ud = ud_qp(), rc = ud_qp(IBV_QPT_RC), uc = ud_qp(IBV_QPT_UC);
	EXPECT_EQ(attach(rc.handle, kGroupV6), EINVAL);
	EXPECT_EQ(attach(uc.handle, kGroupV6), EINVAL);
	EXPECT_EQ(attach(ud.handle + 100, kGroupV6), EINVAL) << "no such QP handle";
	EXPECT_EQ(attach(cq0, kGroupV6), EINVAL) << "a CQ handle";
	const GidBytes unicast[] = {
		{},                                                        // ::
		{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},    // fe80::1
		{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7},   // ::ffff:10.0.0.7
		{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 240, 0, 0, 1},  // ::ffff:240.0.0.1
		{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 224, 0, 0, 1},        // ::224.0.0.1, not mapped
	};
	for (const GidBytes &g : unicast)
		EXPECT_EQ(attach(ud.handle, g), EINVAL);
	const GidBytes multicast[] = {
		kGroupV4,
		{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 224, 0, 0, 1},  // ::ffff:224.0.0.1
		{0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},     // ff02::1
	};
	for (const GidBytes &g : multicast)
		EXPECT_EQ(attach(ud.handle, g), 0);
	EXPECT_EQ(dev.mcast_groups.size(), 3u);

	auto with_reserved = mcast_cmd<ib_uverbs_attach_mcast>(ud.handle, kGroupV6);
	with_reserved.reserved = 1;
	EXPECT_EQ(run(IB_USER_VERBS_CMD_ATTACH_MCAST, with_reserved), EINVAL);
	const std::byte driver[8] = {std::byte{1}};
	EXPECT_EQ(run(IB_USER_VERBS_CMD_ATTACH_MCAST, mcast_cmd<ib_uverbs_attach_mcast>(ud.handle, kGroupV6), driver),
		  EOPNOTSUPP);
	EXPECT_EQ(dev.mcast_groups.size(), 3u) << "a refused attach changed something";
}

TEST_F(McastCommandsTest, DetachLeavesAndTheLastMemberFreesTheEntry)
{
	CreatedQp a = ud_qp(), b = ud_qp();
	EXPECT_EQ(detach(a.handle, kGroupV6), EINVAL) << "not attached";
	ASSERT_EQ(attach(a.handle, kGroupV6), 0);
	ASSERT_EQ(attach(b.handle, kGroupV6), 0);
	ASSERT_EQ(attach(a.handle, kGroupV4), 0);
	EXPECT_EQ(detach(b.handle, kGroupV4), EINVAL) << "a group of the device, but not of this QP";
	EXPECT_EQ(detach(a.handle + 100, kGroupV6), EINVAL) << "no such QP handle";

	ASSERT_EQ(detach(a.handle, kGroupV6), 0);
	EXPECT_EQ(members(0), std::vector<uint32_t>{b.qpn});
	ASSERT_EQ(detach(b.handle, kGroupV6), 0);
	EXPECT_EQ(entry(0).num_qps, 0u);
	EXPECT_EQ(gid_of(entry(0)), GidBytes{});
	EXPECT_EQ(table().scan_end, 2u) << "entry 1 is still in use";

	// A new group takes the lowest free entry.
	ASSERT_EQ(attach(b.handle, nth_group(5)), 0);
	EXPECT_EQ(gid_of(entry(0)), nth_group(5));
	ASSERT_EQ(detach(a.handle, kGroupV4), 0);
	ASSERT_EQ(detach(b.handle, nth_group(5)), 0);
	EXPECT_EQ(table().scan_end, 0u);
	EXPECT_TRUE(dev.mcast_groups.empty());
	EXPECT_EQ(dev.mcast_attachments, 0u);
}

TEST_F(McastCommandsTest, DestroyingAnAttachedQpIsBusyAsInTheKernel)
{
	CreatedQp a = ud_qp();
	ASSERT_EQ(attach(a.handle, kGroupV6), 0);
	EXPECT_EQ(destroy_qp(a.handle), EBUSY);
	EXPECT_EQ(members(0), std::vector<uint32_t>{a.qpn});
	ASSERT_EQ(detach(a.handle, kGroupV6), 0);
	EXPECT_EQ(destroy_qp(a.handle), 0);
}

TEST_F(McastCommandsTest, ContextTeardownLeavesEveryGroup)
{
	CreatedQp a = ud_qp(), b = ud_qp();
	for (uint32_t i = 0; i < 10; ++i) {
		ASSERT_EQ(attach(a.handle, nth_group(i)), 0);
		ASSERT_EQ(attach(b.handle, nth_group(i)), 0);
	}
	EXPECT_EQ(table().scan_end, 10u);
	destroy_context_objects(ctx);
	EXPECT_TRUE(dev.mcast_groups.empty());
	EXPECT_EQ(dev.mcast_attachments, 0u);
	EXPECT_EQ(table().scan_end, 0u);
	for (uint32_t i = 0; i < 10; ++i) {
		EXPECT_EQ(entry(i).num_qps, 0u);
		EXPECT_EQ(entry(i).seq % 2, 0u);
	}
}

TEST_F(McastCommandsTest, LimitsAreAdvertisedAndEnforced)
{
	using L = DeviceLimits;
	ib_uverbs_query_device_resp attr = query_device();
	EXPECT_EQ(attr.max_mcast_grp, L::max_mcast_grp);
	EXPECT_EQ(attr.max_mcast_qp_attach, L::max_mcast_qp_attach);
	EXPECT_EQ(attr.max_total_mcast_qp_attach, L::max_total_mcast_qp_attach);

	// max_mcast_qp_attach QPs in one group, then ENOMEM.
	std::vector<CreatedQp> qps;
	for (uint32_t i = 0; i <= L::max_mcast_qp_attach; ++i)
		qps.push_back(ud_qp());
	for (uint32_t i = 0; i < L::max_mcast_qp_attach; ++i)
		ASSERT_EQ(attach(qps[i].handle, kGroupV6), 0) << i;
	EXPECT_EQ(attach(qps.back().handle, kGroupV6), ENOMEM);
	EXPECT_EQ(entry(0).num_qps, L::max_mcast_qp_attach);
	for (uint32_t i = 0; i < L::max_mcast_qp_attach; ++i)
		ASSERT_EQ(detach(qps[i].handle, kGroupV6), 0);

	// max_mcast_grp groups on the device, then ENOMEM for a new one.
	for (uint32_t g = 0; g < L::max_mcast_grp; ++g)
		ASSERT_EQ(attach(qps[0].handle, nth_group(g)), 0) << g;
	EXPECT_EQ(attach(qps[1].handle, nth_group(L::max_mcast_grp)), ENOMEM);
	EXPECT_EQ(attach(qps[1].handle, nth_group(0)), 0) << "an existing group still takes members";

	// max_total_mcast_qp_attach memberships over the device, then ENOMEM.
	uint32_t total = L::max_mcast_grp + 1;
	for (size_t q = 1; q < qps.size() && total < L::max_total_mcast_qp_attach; ++q)
		for (uint32_t g = 1; g < L::max_mcast_grp && total < L::max_total_mcast_qp_attach; ++g, ++total)
			ASSERT_EQ(attach(qps[q].handle, nth_group(g)), 0) << q << " " << g;
	ASSERT_EQ(dev.mcast_attachments, L::max_total_mcast_qp_attach);
	EXPECT_EQ(attach(qps.back().handle, nth_group(0)), ENOMEM);
	ASSERT_EQ(detach(qps[0].handle, nth_group(0)), 0);
	EXPECT_EQ(attach(qps.back().handle, nth_group(0)), 0) << "room again after a detach";
}

// A device serving an older revision has no multicast, as that daemon had none.
TEST_F(McastCommandsTest, OlderRevisionsHaveNoMulticast)
{
	CreatedQp a = ud_qp();
	dev.abi_revision = 2;
	EXPECT_EQ(attach(a.handle, kGroupV6), EOPNOTSUPP);
	EXPECT_EQ(detach(a.handle, kGroupV6), EOPNOTSUPP);
	ib_uverbs_query_device_resp attr = query_device();
	EXPECT_EQ(attr.max_mcast_grp, 0u);
	EXPECT_EQ(attr.max_mcast_qp_attach, 0u);
	EXPECT_EQ(attr.max_total_mcast_qp_attach, 0u);
	dev.abi_revision = XSRC_DRIVER_ABI_REVISION;
	EXPECT_EQ(attach(a.handle, kGroupV6), 0);
}

}  // namespace
}  // namespace xsrc::test
