// The debug line of a refused command (xsrcd --debug, XSRC_DEBUG=1): the
// command, the errno and the check; nothing when debugging is off.
#include <string>
#include <string_view>
#include <vector>

#include "command_fixture.h"
#include "log.h"

namespace xsrc::test {
namespace {

std::vector<std::string> g_lines;

void capture(std::string_view line)
{
	g_lines.emplace_back(line);
}

class DispatcherLogTest : public CommandFixture {
protected:
	void SetUp() override
	{
		CommandFixture::SetUp();
		set_debug_enabled(false);
		g_lines.clear();
		previous_ = set_log_sink(capture);
	}
	void TearDown() override
	{
		set_debug_enabled(false);
		set_log_sink(previous_);
		CommandFixture::TearDown();
	}

	int dealloc_pd(uint32_t handle)
	{
		ib_uverbs_dealloc_pd cmd{};
		cmd.pd_handle = handle;
		return run(IB_USER_VERBS_CMD_DEALLOC_PD, cmd);
	}

	LogSink previous_ = nullptr;
};

TEST_F(DispatcherLogTest, RefusedCommandLogsNameErrnoAndCheck)
{
	init_context();
	set_debug_enabled(true);
	EXPECT_EQ(dealloc_pd(77), EINVAL);
	ASSERT_EQ(g_lines.size(), 1u);
	EXPECT_NE(g_lines[0].find("DEALLOC_PD refused: EINVAL (22): no such PD handle"), std::string::npos)
		<< g_lines[0];
	EXPECT_NE(g_lines[0].find("context 1 "), std::string::npos) << g_lines[0];
}

TEST_F(DispatcherLogTest, DecoderChecksAreNamed)
{
	init_context();
	set_debug_enabled(true);
	std::byte tiny[4]{};
	EXPECT_EQ(dispatch_command(ctx, *ctx.caller, tiny), EINVAL);
	std::byte hdr_only[8];
	ib_uverbs_cmd_hdr hdr{IB_USER_VERBS_CMD_REG_MR, 2, 0};
	std::memcpy(hdr_only, &hdr, sizeof(hdr));
	EXPECT_EQ(dispatch_command(ctx, *ctx.caller, hdr_only), ENOSPC);
	ASSERT_EQ(g_lines.size(), 2u);
	EXPECT_NE(g_lines[0].find("(no header) refused: EINVAL (22): shorter than the command header"),
		  std::string::npos) << g_lines[0];
	EXPECT_NE(g_lines[1].find("REG_MR refused: ENOSPC (28): short request"), std::string::npos)
		<< g_lines[1];
}

TEST_F(DispatcherLogTest, ReasonOfOneCommandDoesNotLeakIntoTheNext)
{
	init_context();
	set_debug_enabled(true);
	EXPECT_EQ(dealloc_pd(77), EINVAL);
	raise_event(~0u, 0);  // unknown kind: refused with a reason of its own
	ASSERT_EQ(g_lines.size(), 2u);
	EXPECT_NE(g_lines[1].find("XSRC_RAISE_EVENT refused: EINVAL (22): unknown event kind"),
		  std::string::npos) << g_lines[1];
}

TEST_F(DispatcherLogTest, NothingWhenOffOrAccepted)
{
	init_context();
	EXPECT_EQ(dealloc_pd(77), EINVAL);  // off: refused silently
	set_debug_enabled(true);
	uint32_t pd = alloc_pd();
	EXPECT_EQ(dealloc_pd(pd), 0);  // on, but nothing refused
	EXPECT_TRUE(g_lines.empty()) << g_lines.front();
}

}  // namespace
}  // namespace xsrc::test
