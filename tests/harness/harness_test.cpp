// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The harness on its own (no device): messages, the link's frames, values and time
// limits, and both kinds of child process.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "harness/child.h"

using namespace std::chrono_literals;
using xsrc::harness::Child;
using xsrc::harness::Link;
using xsrc::harness::Msg;

namespace {

TEST(HarnessMsg, EncodesAndDecodesEveryKind)
{
	enum class Colour { red = 3 };
	Msg m("cmd1");
	m.set("n", 42u).set("neg", -7).set("flag", true).set("colour", Colour::red).set("text", "a b");
	Msg back = Msg::decode(m.encode());
	EXPECT_EQ(back.str("cmd"), "cmd1");
	EXPECT_EQ(back.u64("n"), 42u);
	EXPECT_EQ(back.i64("neg"), -7);
	EXPECT_EQ(back.u64("flag"), 1u);
	EXPECT_EQ(back.u64("colour"), 3u);
	EXPECT_EQ(back.str("text"), "a b");
	EXPECT_EQ(back.u64("absent", 9), 9u);
	EXPECT_FALSE(back.has("absent"));
	EXPECT_THROW(back.str("absent"), std::runtime_error);
}

TEST(HarnessLink, CarriesFramesValuesAndMessages)
{
	auto [a, b] = Link::pair();
	ASSERT_TRUE(a.send_frame("hello"));
	ASSERT_TRUE(a.send_value(uint64_t{0x1234}));
	a.send(Msg("ping").set("k", 5));
	std::string frame;
	ASSERT_TRUE(b.recv_frame(&frame, 1s));
	EXPECT_EQ(frame, "hello");
	uint64_t v = 0;
	ASSERT_TRUE(b.recv_value(&v, 1s));
	EXPECT_EQ(v, 0x1234u);
	Msg m = b.expect(1s, "the ping");
	EXPECT_EQ(m.str("cmd"), "ping");
	EXPECT_EQ(m.u64("k"), 5u);
}

TEST(HarnessLink, WaitsAreBoundedAndAGoneEndIsSeen)
{
	auto [a, b] = Link::pair();
	std::string frame;
	auto t0 = std::chrono::steady_clock::now();
	EXPECT_FALSE(b.recv_frame(&frame, 50ms));
	EXPECT_GE(std::chrono::steady_clock::now() - t0, 50ms);
	EXPECT_FALSE(b.recv(20ms).has_value());
	EXPECT_THROW(b.expect(20ms, "nothing"), std::runtime_error);
	a.send(Msg().set("error", "it broke"));
	EXPECT_THROW(b.expect(1s, "a reply"), std::runtime_error) << "an error reply is a failure";
	a.close();
	EXPECT_TRUE(b.readable(1s)) << "EOF is readable";
	EXPECT_FALSE(b.recv_frame(&frame, 1s));
	EXPECT_FALSE(b.send_frame("to nobody")) << "no SIGPIPE, a false";
}

TEST(HarnessChild, RunReturnsTheBodysExitCode)
{
	Child c = Child::run([](Link &link) {
		uint32_t x = 0;
		return link.recv_value(&x, 5s) ? static_cast<int>(x) : 99;
	});
	ASSERT_TRUE(c.running());
	ASSERT_TRUE(c.link().send_value(uint32_t{7}));
	auto status = c.wait(5s);
	ASSERT_TRUE(status.has_value());
	EXPECT_EQ(xsrc::harness::exit_code(*status), 7);
	EXPECT_FALSE(c.running());
}

TEST(HarnessChild, WaitTimesOutAndKillReaps)
{
	Child c = Child::run([](Link &) {
		pause();
		return 0;
	});
	EXPECT_FALSE(c.wait(30ms).has_value()) << "still running";
	pid_t pid = c.pid();
	c.kill();
	EXPECT_FALSE(c.running());
	EXPECT_EQ(::kill(pid, 0), -1) << "reaped";
}

TEST(HarnessChild, ExitedIsSeenWithoutReaping)
{
	Child c = Child::run([](Link &) { return 3; });
	c.wait_exited();
	EXPECT_TRUE(c.running()) << "not reaped yet";
	auto status = c.wait(1s);
	ASSERT_TRUE(status.has_value());
	EXPECT_EQ(xsrc::harness::exit_code(*status), 3);
}

TEST(HarnessChild, SpawnReexecsTheBinaryWithItsLinkAndArguments)
{
	Child c = Child::spawn("--echo", {"one", "two"});
	Msg m = c.link().expect(10s, "the echo");
	EXPECT_EQ(m.str("args"), "one,two,");
	auto status = c.wait(10s);
	ASSERT_TRUE(status.has_value());
	EXPECT_EQ(xsrc::harness::exit_code(*status), 0);
}

TEST(HarnessChild, DestructionKillsTheChild)
{
	pid_t pid;
	{
		Child c = Child::run([](Link &) {
			pause();
			return 0;
		});
		pid = c.pid();
	}
	EXPECT_EQ(::kill(pid, 0), -1);
}

}  // namespace

int main(int argc, char **argv)
{
	if (auto echo = xsrc::harness::child_args(argc, argv, "--echo")) {
		std::string joined;
		for (const auto &a : echo->args)
			joined += a + ",";
		echo->link.send(Msg().set("args", joined));
		return 0;
	}
	::testing::InitGoogleTest(&argc, argv);
	return RUN_ALL_TESTS();
}
