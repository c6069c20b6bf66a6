// The driver ABI discipline of kernel-abi/README.md, driven in-process
// (command_fixture.h): older request layouts, responses cut to the caller's
// room, trailing bytes, comp_mask and reserved fields, and a device that
// serves revision 1 (xsrcd --abi 1).
#include "command_fixture.h"
#include "daemon.h"

namespace xsrc {
namespace {

class AbiCompatTest : public test::CommandFixture {
protected:
	// GET_CONTEXT with `driver` as the driver request and a response buffer
	// of `room` bytes (core + driver) inside `out`, the rest of which the
	// daemon must leave alone.
	int get_context_raw(std::span<const std::byte> driver, size_t room, std::vector<unsigned char> &out)
	{
		ib_uverbs_get_context cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(out.data());
		return run(IB_USER_VERBS_CMD_GET_CONTEXT, cmd, driver, room);
	}

	xsrc_get_context_req valid_request()
	{
		xsrc_get_context_req drv{};
		drv.async_fds = async.pair();
		drv.num_channel_fds = 1;
		drv.channel_fds[0] = chan[0].pair();
		return drv;
	}

	static constexpr size_t kCore = sizeof(ib_uverbs_get_context_resp);
	static constexpr size_t kR1Driver = offsetof(xsrc_get_context_resp, caller_pid);
	static constexpr unsigned char kCanary = 0xa5;
};

bool untouched(const std::vector<unsigned char> &buf, size_t from)
{
	return std::all_of(buf.begin() + ptrdiff_t(from), buf.end(), [](unsigned char b) { return b == 0xa5; });
}

xsrc_get_context_resp driver_part(const std::vector<unsigned char> &buf)
{
	xsrc_get_context_resp d{};
	std::memcpy(&d, buf.data() + sizeof(ib_uverbs_get_context_resp),
		    std::min(sizeof(d), buf.size() - sizeof(ib_uverbs_get_context_resp)));
	return d;
}

// A revision-1 provider gives room for the 24-byte r1 response: it gets
// those bytes and not one more.
TEST_F(AbiCompatTest, R1SizedResponseGetsR1BytesOnly)
{
	std::vector<unsigned char> buf(kCore + sizeof(xsrc_get_context_resp) + 32, kCanary);
	auto drv = valid_request();
	ASSERT_EQ(get_context_raw(std::as_bytes(std::span(&drv, 1)), kCore + kR1Driver, buf), 0);
	EXPECT_TRUE(untouched(buf, kCore + kR1Driver)) << "bytes written past the caller's room";
	auto d = driver_part(buf);
	EXPECT_EQ(d.driver_abi, uint32_t(XSRC_DRIVER_ABI_REVISION));
	EXPECT_EQ(d.context_id, ctx.id);
	EXPECT_EQ(d.max_inline_data, DeviceLimits::max_inline_data);
	EXPECT_EQ(d.channel_pool_free, 1u);
	EXPECT_TRUE(ctx.initialised);
}

// Less room than the core response: nothing is written.
TEST_F(AbiCompatTest, ResponseRoomShorterThanTheCoreStructIsEnospc)
{
	std::vector<unsigned char> buf(kCore + sizeof(xsrc_get_context_resp), kCanary);
	auto drv = valid_request();
	EXPECT_EQ(get_context_raw(std::as_bytes(std::span(&drv, 1)), kCore - 4, buf), ENOSPC);
	EXPECT_TRUE(untouched(buf, 0));
	EXPECT_FALSE(ctx.initialised);
}

// More room than the daemon knows: the rest is zero-filled, nothing past it.
TEST_F(AbiCompatTest, RoomPastTheKnownResponseIsZeroFilled)
{
	const size_t room = kCore + sizeof(xsrc_get_context_resp) + 16;
	std::vector<unsigned char> buf(room + 16, kCanary);
	auto drv = valid_request();
	ASSERT_EQ(get_context_raw(std::as_bytes(std::span(&drv, 1)), room, buf), 0);
	EXPECT_TRUE(std::all_of(buf.begin() + ptrdiff_t(kCore + sizeof(xsrc_get_context_resp)),
				buf.begin() + ptrdiff_t(room), [](unsigned char b) { return b == 0; }));
	EXPECT_TRUE(untouched(buf, room));
}

TEST_F(AbiCompatTest, DriverRequestShorterThanRevisionOneIsEinval)
{
	std::vector<unsigned char> buf(kCore + sizeof(xsrc_get_context_resp), kCanary);
	auto drv = valid_request();
	auto bytes = std::as_bytes(std::span(&drv, 1));
	EXPECT_EQ(get_context_raw(bytes.first(sizeof(drv) - 8), buf.size(), buf), EINVAL);
	EXPECT_EQ(get_context_raw({}, buf.size(), buf), EINVAL);
	EXPECT_TRUE(untouched(buf, 0));
	EXPECT_FALSE(ctx.initialised);
}

// A newer provider's request: zero bytes past what the daemon knows are
// fine, anything else is a field this daemon would ignore -> EOPNOTSUPP.
TEST_F(AbiCompatTest, TrailingDriverBytesMustBeZero)
{
	std::vector<unsigned char> buf(kCore + sizeof(xsrc_get_context_resp), kCanary);
	auto drv = valid_request();
	std::vector<std::byte> longer(sizeof(drv) + 16);
	std::memcpy(longer.data(), &drv, sizeof(drv));
	longer[sizeof(drv) + 9] = std::byte{1};
	EXPECT_EQ(get_context_raw(longer, buf.size(), buf), EOPNOTSUPP);
	EXPECT_TRUE(untouched(buf, 0));
	EXPECT_FALSE(ctx.initialised);

	longer[sizeof(drv) + 9] = std::byte{0};
	EXPECT_EQ(get_context_raw(longer, buf.size(), buf), 0);
	EXPECT_TRUE(ctx.initialised);
}

TEST_F(AbiCompatTest, UnknownRequestCompMaskBitsAreEopnotsupp)
{
	std::vector<unsigned char> buf(kCore + sizeof(xsrc_get_context_resp), kCanary);
	auto drv = valid_request();
	for (uint32_t bit : {1u, 1u << 7, 1u << 31}) {
		drv.comp_mask = bit;
		EXPECT_EQ(get_context_raw(std::as_bytes(std::span(&drv, 1)), buf.size(), buf), EOPNOTSUPP) << bit;
	}
	EXPECT_TRUE(untouched(buf, 0));
}

// xsrcd --abi 1: the daemon answers as the revision-1 daemon did, even to a
// caller with room for more.
TEST_F(AbiCompatTest, DeviceAtRevisionOneWritesTheR1ResponseOnly)
{
	dev.abi_revision = 1;
	std::vector<unsigned char> buf(kCore + sizeof(xsrc_get_context_resp) + 16, kCanary);
	auto drv = valid_request();
	const size_t room = kCore + sizeof(xsrc_get_context_resp);
	ASSERT_EQ(get_context_raw(std::as_bytes(std::span(&drv, 1)), room, buf), 0);
	auto d = driver_part(buf);
	EXPECT_EQ(d.driver_abi, 1u);
	EXPECT_EQ(d.comp_mask & XSRC_GET_CONTEXT_RESP_MASK_CALLER, 0u);
	EXPECT_EQ(d.context_id, ctx.id);
	EXPECT_EQ(d.channel_pool_free, 1u);
	EXPECT_EQ(d.caller_pid, 0u);
	EXPECT_EQ(d.caller_uid, 0u);
	EXPECT_EQ(d.caps, 0u);
	EXPECT_EQ(d.reserved, 0u);
	EXPECT_TRUE(untouched(buf, room));
}

// Private commands: reserved -> EINVAL, unknown comp_mask bits and trailing
// bytes -> EOPNOTSUPP, a short struct -> ENOSPC (the kernel's verify_hdr).
TEST_F(AbiCompatTest, PrivateCommandsFollowTheSameDiscipline)
{
	init_context(0);
	xsrc_channel_pool_resp resp{};
	xsrc_channel_pool cmd{};
	cmd.response = reinterpret_cast<uintptr_t>(&resp);
	cmd.fds = {XSRC_NO_FD, XSRC_NO_FD};
	EXPECT_EQ(run(XSRC_CMD_CHANNEL_POOL, cmd, {}, sizeof(resp)), 0);

	cmd.reserved = 1;
	EXPECT_EQ(run(XSRC_CMD_CHANNEL_POOL, cmd, {}, sizeof(resp)), EINVAL);
	cmd.reserved = 0;
	cmd.comp_mask = 1u << 3;
	EXPECT_EQ(run(XSRC_CMD_CHANNEL_POOL, cmd, {}, sizeof(resp)), EOPNOTSUPP);
	cmd.comp_mask = 0;
	const std::byte trailing[8] = {std::byte{0}, std::byte{2}};
	EXPECT_EQ(run(XSRC_CMD_CHANNEL_POOL, cmd, trailing, sizeof(resp)), EOPNOTSUPP);
	const std::byte zeros[8] = {};
	EXPECT_EQ(run(XSRC_CMD_CHANNEL_POOL, cmd, zeros, sizeof(resp)), 0);

	struct {
		uint64_t response;
		uint32_t comp_mask;
	} short_cmd{cmd.response, 0};
	EXPECT_EQ(run(XSRC_CMD_CHANNEL_POOL, short_cmd, {}, sizeof(resp)), ENOSPC);

	xsrc_raise_event ev{};
	ev.kind = XSRC_EVENT_CQ_COMPLETION;
	ev.reserved = 7;
	EXPECT_EQ(run(XSRC_CMD_RAISE_EVENT, ev), EINVAL);
}

// XSRC_CMD_COPY came with revision 2: a device serving revision 1 does not
// have it, whatever the request.
TEST_F(AbiCompatTest, CopyIsUnknownAtRevisionOne)
{
	init_context(0);
	xsrc_copy_resp resp{};
	xsrc_copy cmd{};
	cmd.response = reinterpret_cast<uintptr_t>(&resp);
	cmd.op = XSRC_COPY_READ;
	cmd.key_kind = XSRC_COPY_RKEY;
	cmd.length = 8;
	dev.abi_revision = 1;
	EXPECT_EQ(run(XSRC_CMD_COPY, cmd, {}, sizeof(resp)), EOPNOTSUPP);
	// At revision 2 the command exists: this one fails on its content (no
	// such QP), not as an unknown command.
	dev.abi_revision = 2;
	EXPECT_NE(run(XSRC_CMD_COPY, cmd, {}, sizeof(resp)), EOPNOTSUPP);
}

TEST(AbiRevision, DaemonServesOnlyRevisionsItKnows)
{
	Daemon daemon("/nonexistent-sysfs", "/nonexistent-fuse");
	EXPECT_EQ(daemon.set_abi_revision(0), EINVAL);
	EXPECT_EQ(daemon.set_abi_revision(XSRC_DRIVER_ABI_REVISION + 1), EINVAL);
	EXPECT_EQ(daemon.set_abi_revision(1), 0);
	EXPECT_EQ(daemon.set_abi_revision(XSRC_DRIVER_ABI_REVISION), 0);
}

}  // namespace
}  // namespace xsrc
