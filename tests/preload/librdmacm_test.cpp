// Unmodified librdmacm through libxsrc-preload.so, against the cm stand-in
// (cm_standin.h) mounted by this test: librdmacm's open_cdev accepts the
// channel, a GET_EVENT waiting in one thread does not hold up the channel's
// other commands (the reason for the event file), O_NONBLOCK set with fcntl on
// the channel reaches the event file, and closing the channel releases both
// files. Needs root (a FUSE mount) and a device for librdmacm to list (xsrc0:
// run by CTest under the device fixture).
#include <fcntl.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "cm_standin.h"

namespace xsrc {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct Stats {
	int channels = -1, events = -1, waiting = -1, commands = -1;
};

fs::path g_dir;
pid_t g_server = -1;

Stats stats()
{
	Stats s;
	std::ifstream in(g_dir / "stats");
	std::string line;
	std::getline(in, line);
	std::sscanf(line.c_str(), "channels=%d events=%d waiting=%d commands=%d", &s.channels, &s.events,
		    &s.waiting, &s.commands);
	return s;
}

template <typename Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout = 3000ms)
{
	auto deadline = std::chrono::steady_clock::now() + timeout;
	while (!pred()) {
		if (std::chrono::steady_clock::now() > deadline)
			return false;
		std::this_thread::sleep_for(5ms);
	}
	return true;
}

using test::kCmCommandSize;
using test::kCmGetEvent;
using test::kCmNotify;
using test::kCmQuery;
using test::write_cm_command;

// Kills the stand-in: the kernel then fails every waiting request (ENOTCONN),
// so that a failed test does not hang; the tests after it skip.
void abort_standin()
{
	if (g_server <= 0)
		return;
	kill(g_server, SIGKILL);
	waitpid(g_server, nullptr, 0);
	g_server = -1;
	umount2(g_dir.c_str(), MNT_DETACH);
}

class Librdmacm : public ::testing::Test {
protected:
	static void SetUpTestSuite()
	{
		if (geteuid() != 0 || access("/dev/fuse", R_OK | W_OK) != 0)
			return;
		char tmpl[] = "/tmp/xsrc-cm-standin-XXXXXX";
		if (!mkdtemp(tmpl))
			return;
		g_dir = tmpl;
		g_server = fork();
		if (g_server == 0) {
			execl("/proc/self/exe", "librdmacm_test", "--serve", tmpl, static_cast<char *>(nullptr));
			_exit(127);
		}
		if (!wait_until([] { return fs::exists(g_dir / "stats"); }, 5000ms)) {
			kill(g_server, SIGKILL);
			waitpid(g_server, nullptr, 0);
			g_server = -1;
		}
		setenv("XSRC_CM_DIR", g_dir.c_str(), 1);
	}
	static void TearDownTestSuite()
	{
		if (g_server > 0) {
			kill(g_server, SIGTERM);
			waitpid(g_server, nullptr, 0);
		}
		if (!g_dir.empty())
			umount2(g_dir.c_str(), MNT_DETACH);  // only if the stand-in left it mounted
		if (!g_dir.empty())
			rmdir(g_dir.c_str());
	}
	void SetUp() override
	{
		if (g_server <= 0)
			GTEST_SKIP() << "no FUSE mount for the stand-in (needs root and /dev/fuse)";
		ASSERT_TRUE(wait_until([] { return stats().channels == 0 && stats().events == 0; }))
			<< "files of an earlier test are still open";
	}
	void TearDown() override
	{
		if (channel_)
			rdma_destroy_event_channel(channel_);
		if (g_server > 0) {
			EXPECT_TRUE(wait_until([] { Stats s = stats(); return s.channels == 0 && s.events == 0; }))
				<< "closing the channel did not release both of its files";
		}
	}

	rdma_event_channel *create_channel()
	{
		channel_ = rdma_create_event_channel();
		EXPECT_NE(channel_, nullptr) << "rdma_create_event_channel: " << strerror(errno);
		return channel_;
	}

	rdma_event_channel *channel_ = nullptr;
};

TEST_F(Librdmacm, CreatesItsEventChannelOnTheStandin)
{
	rdma_event_channel *ch = create_channel();
	ASSERT_NE(ch, nullptr);
	struct stat st;
	ASSERT_EQ(fstat(ch->fd, &st), 0);
	EXPECT_TRUE(S_ISCHR(st.st_mode));
	EXPECT_EQ(fs::read_symlink("/proc/self/fd/" + std::to_string(ch->fd)), g_dir / "channel");
	EXPECT_TRUE(fcntl(ch->fd, F_GETFD) & FD_CLOEXEC);  // open_cdev asks for O_CLOEXEC
	Stats s = stats();
	EXPECT_EQ(s.channels, 1);
	EXPECT_EQ(s.events, 1);
	EXPECT_TRUE(fs::exists(g_dir / ("event-" + std::to_string(st.st_ino))));
}

TEST_F(Librdmacm, NonblockingChannelGetsEagainFromTheEventFile)
{
	rdma_event_channel *ch = create_channel();
	ASSERT_NE(ch, nullptr);
	// As rdma_cm programs do before polling the channel.
	ASSERT_EQ(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK), 0);
	auto get = std::async(std::launch::async, [ch] {
		rdma_cm_event *event = nullptr;
		int rc = rdma_get_cm_event(ch, &event);
		return std::make_pair(rc, errno);
	});
	if (get.wait_for(5s) != std::future_status::ready) {
		abort_standin();
		FAIL() << "rdma_get_cm_event blocked on a non-blocking channel";
	}
	auto [rc, err] = get.get();
	EXPECT_EQ(rc, -1);
	EXPECT_EQ(err, EAGAIN);
	EXPECT_EQ(stats().waiting, 0);
}

TEST_F(Librdmacm, WaitingGetEventDoesNotHoldUpTheChannel)
{
	rdma_event_channel *ch = create_channel();
	ASSERT_NE(ch, nullptr);
	// rping's cm thread: blocked in GET_EVENT (raw: the stand-in writes no event back).
	auto waiter = std::async(std::launch::async, [ch] { return write_cm_command(ch->fd, kCmGetEvent); });
	ASSERT_TRUE(wait_until([] { return stats().waiting == 1; })) << "GET_EVENT did not reach the stand-in";
	// Its main thread meanwhile: another command on the same channel fd.
	auto other = std::async(std::launch::async, [ch] { return write_cm_command(ch->fd, kCmQuery); });
	if (other.wait_for(5s) != std::future_status::ready) {
		abort_standin();  // nothing else would release them: both writes fail ENOTCONN
		FAIL() << "a command waited behind the blocked GET_EVENT";
	}
	// The event arrives: the waiting GET_EVENT returns.
	EXPECT_EQ(write_cm_command(ch->fd, kCmNotify), static_cast<ssize_t>(kCmCommandSize));
	ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
	EXPECT_EQ(waiter.get(), static_cast<ssize_t>(kCmCommandSize));
	EXPECT_EQ(other.get(), static_cast<ssize_t>(kCmCommandSize));
	EXPECT_EQ(stats().waiting, 0);
}

// A dup of the channel fd is not tracked: its GET_EVENT goes to the channel
// file itself, which the contract also serves.
TEST_F(Librdmacm, GetEventOnTheChannelFileItselfWorks)
{
	rdma_event_channel *ch = create_channel();
	ASSERT_NE(ch, nullptr);
	int copy = dup(ch->fd);
	ASSERT_GE(copy, 0);
	ASSERT_EQ(write_cm_command(ch->fd, kCmNotify), static_cast<ssize_t>(kCmCommandSize));
	EXPECT_EQ(write_cm_command(copy, kCmGetEvent), static_cast<ssize_t>(kCmCommandSize));
	ASSERT_EQ(fcntl(copy, F_SETFL, O_NONBLOCK), 0);  // shared with ch->fd: one open file
	errno = 0;
	EXPECT_EQ(write_cm_command(copy, kCmGetEvent), -1);
	EXPECT_EQ(errno, EAGAIN);
	close(copy);
}

}  // namespace
}  // namespace xsrc

int main(int argc, char **argv)
{
	if (argc == 3 && std::strcmp(argv[1], "--serve") == 0)
		return xsrc::test::cm_standin_serve(argv[2]);
	if (!getenv("XSRC_PRELOAD_TEST_REEXEC")) {  // run the tests with the interposer preloaded
		setenv("XSRC_PRELOAD_TEST_REEXEC", "1", 1);
		const char *current = getenv("LD_PRELOAD");
		std::string preload = std::string(XSRC_PRELOAD_LIBRARY) + (current && *current ? std::string(" ") + current : "");
		setenv("LD_PRELOAD", preload.c_str(), 1);
		execv("/proc/self/exe", argv);
		perror("librdmacm_test: execv /proc/self/exe");
		return 1;
	}
	testing::InitGoogleTest(&argc, argv);
	return RUN_ALL_TESTS();
}
