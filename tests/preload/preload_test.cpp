// libxsrc-preload.so without a daemon: this process runs with it preloaded
// (main re-executes itself under LD_PRELOAD) against a fake cm directory in
// which "channel" and "event-<ino>" are plain files, so what the interposer
// sent where can be read back.
#include <dlfcn.h>
#include <fcntl.h>
#include <rdma/rdma_user_cm.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sysfs_view.h"

// glibc's entry points for fortified opens and pre-2.33 fstat; not all declared.
extern "C" int __open_2(const char *, int);
extern "C" int __open64_2(const char *, int);
extern "C" int __openat_2(int, const char *, int);
extern "C" int __openat64_2(int, const char *, int);
extern "C" int __fxstat(int, int, struct stat *);

namespace xsrc {
namespace {

namespace fs = std::filesystem;

constexpr const char *kCmDevice = "/dev/infiniband/rdma_cm";

std::string slurp(const fs::path &p)
{
	std::ifstream in(p, std::ios::binary);
	std::stringstream ss;
	ss << in.rdbuf();
	return ss.str();
}

// An rdma_cm command as librdmacm writes it: header, then `payload` bytes.
std::string command(uint32_t cmd, size_t payload)
{
	rdma_ucm_cmd_hdr hdr{cmd, static_cast<uint16_t>(payload), 0};
	std::string out(reinterpret_cast<const char *>(&hdr), sizeof(hdr));
	for (size_t i = 0; i < payload; ++i)
		out += static_cast<char>('a' + cmd + i % 7);
	return out;
}

ssize_t write_string(int fd, const std::string &s)
{
	return ::write(fd, s.data(), s.size());
}

std::optional<fs::path> fd_target(int fd)
{
	std::error_code ec;
	fs::path p = fs::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
	if (ec)
		return std::nullopt;
	return p;
}

// The fds of this process open on `path`.
std::vector<int> fds_on(const fs::path &path)
{
	std::vector<int> fds;
	for (const auto &e : fs::directory_iterator("/proc/self/fd")) {
		int fd = std::atoi(e.path().filename().c_str());
		if (auto target = fd_target(fd); target && *target == path)
			fds.push_back(fd);
	}
	return fds;
}

bool is_char_device(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 && S_ISCHR(st.st_mode);
}

class Preload : public ::testing::Test {
protected:
	void SetUp() override
	{
		char tmpl[] = "/tmp/xsrc-preload-XXXXXX";
		ASSERT_NE(mkdtemp(tmpl), nullptr);
		root_ = tmpl;
		cm_ = root_ / "cm";
		fs::create_directory(cm_);
		for (const char *name : {"XSRC_CM_DIR", "SYSFS_PATH"})
			if (const char *v = getenv(name))
				saved_env_.emplace_back(name, v);
		setenv("XSRC_CM_DIR", cm_.c_str(), 1);
		setenv("SYSFS_PATH", (root_ / "no-sysfs").c_str(), 1);
	}
	void TearDown() override
	{
		unsetenv("XSRC_CM_DIR");
		unsetenv("SYSFS_PATH");
		for (const auto &[name, value] : saved_env_)
			setenv(name.c_str(), value.c_str(), 1);
		fs::remove_all(root_);
	}

	fs::path channel() const { return cm_ / "channel"; }
	fs::path event_file() const
	{
		struct stat st;
		EXPECT_EQ(stat(channel().c_str(), &st), 0);
		return cm_ / ("event-" + std::to_string(st.st_ino));
	}
	// The one fd of this process on the event file, or -1.
	int event_fd() const
	{
		auto fds = fds_on(event_file());
		EXPECT_LE(fds.size(), 1u);
		return fds.empty() ? -1 : fds[0];
	}
	int open_regular(const char *name)
	{
		return open((root_ / name).c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	}

	fs::path root_, cm_;
	std::vector<std::pair<std::string, std::string>> saved_env_;
};

TEST_F(Preload, OpensTheChannelFileAsACharacterDevice)
{
	int fd = open(kCmDevice, O_RDWR | O_CLOEXEC);  // as rdma-core's open_cdev
	ASSERT_GE(fd, 0) << strerror(errno);
	EXPECT_EQ(fd_target(fd), channel());
	struct stat st;
	ASSERT_EQ(fstat(fd, &st), 0);
	EXPECT_TRUE(S_ISCHR(st.st_mode));
	EXPECT_EQ(st.st_mode & 07777, 0666u);
	struct stat by_name;
	ASSERT_EQ(stat(channel().c_str(), &by_name), 0);
	EXPECT_EQ(st.st_ino, by_name.st_ino);  // the rest is the real answer
	EXPECT_TRUE(S_ISREG(by_name.st_mode));  // only the fd is a device
	struct stat64 st64;
	ASSERT_EQ(fstat64(fd, &st64), 0);
	EXPECT_TRUE(S_ISCHR(st64.st_mode));
	struct stat old_abi;
	ASSERT_EQ(__fxstat(1, fd, &old_abi), 0);  // _STAT_VER_LINUX
	EXPECT_TRUE(S_ISCHR(old_abi.st_mode));
	EXPECT_EQ(old_abi.st_rdev, st.st_rdev);

	EXPECT_TRUE(fs::is_regular_file(event_file()));
	int ev = event_fd();
	ASSERT_GE(ev, 0) << "no fd on " << event_file();
	EXPECT_FALSE(is_char_device(ev));
	EXPECT_TRUE(fcntl(ev, F_GETFD) & FD_CLOEXEC);
	EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	EXPECT_EQ(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDWR);
	EXPECT_EQ(close(fd), 0);
}

TEST_F(Preload, KeepsTheCallersCloexecAndNonblock)
{
	int fd = open(kCmDevice, O_RDWR);
	ASSERT_GE(fd, 0);
	EXPECT_FALSE(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	EXPECT_FALSE(fcntl(fd, F_GETFL) & O_NONBLOCK);
	int ev = event_fd();
	ASSERT_GE(ev, 0);
	EXPECT_TRUE(fcntl(ev, F_GETFD) & FD_CLOEXEC);  // ours never leaks into an exec
	close(fd);

	fd = open(kCmDevice, O_RDWR | O_NONBLOCK | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	EXPECT_TRUE(fcntl(fd, F_GETFL) & O_NONBLOCK);
	ev = event_fd();
	ASSERT_GE(ev, 0);
	EXPECT_TRUE(fcntl(ev, F_GETFL) & O_NONBLOCK);
	close(fd);
}

TEST_F(Preload, EveryOpenEntryPointIsRedirected)
{
	int dir = open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ASSERT_GE(dir, 0);
	const std::pair<const char *, int> opened[] = {
		{"open64", open64(kCmDevice, O_RDWR)},
		{"openat", openat(AT_FDCWD, kCmDevice, O_RDWR)},
		{"openat (dirfd)", openat(dir, kCmDevice, O_RDWR)},
		{"openat64", openat64(dir, kCmDevice, O_RDWR)},
		{"__open_2", __open_2(kCmDevice, O_RDWR)},
		{"__open64_2", __open64_2(kCmDevice, O_RDWR)},
		{"__openat_2", __openat_2(dir, kCmDevice, O_RDWR)},
		{"__openat64_2", __openat64_2(dir, kCmDevice, O_RDWR)},
	};
	for (const auto &[name, fd] : opened) {
		EXPECT_GE(fd, 0) << name;
		EXPECT_TRUE(is_char_device(fd)) << name;
		EXPECT_EQ(fd_target(fd), channel()) << name;
	}
	EXPECT_EQ(fds_on(event_file()).size(), std::size(opened));
	for (const auto &[name, fd] : opened)
		close(fd);
	EXPECT_TRUE(fds_on(event_file()).empty());
	close(dir);
}

TEST_F(Preload, GetEventGoesToTheEventFileEverythingElseToTheChannel)
{
	int fd = open(kCmDevice, O_RDWR | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	const std::string create_id = command(RDMA_USER_CM_CMD_CREATE_ID, sizeof(rdma_ucm_create_id));
	const std::string get_event = command(RDMA_USER_CM_CMD_GET_EVENT, sizeof(rdma_ucm_get_event));
	const std::string resolve = command(RDMA_USER_CM_CMD_RESOLVE_IP, sizeof(rdma_ucm_resolve_ip));

	EXPECT_EQ(write_string(fd, create_id), static_cast<ssize_t>(create_id.size()));
	EXPECT_EQ(slurp(channel()), create_id);
	EXPECT_EQ(slurp(event_file()), "");

	EXPECT_EQ(write_string(fd, get_event), static_cast<ssize_t>(get_event.size()));
	EXPECT_EQ(slurp(event_file()), get_event);
	EXPECT_EQ(slurp(channel()), create_id);

	EXPECT_EQ(write_string(fd, resolve), static_cast<ssize_t>(resolve.size()));
	EXPECT_EQ(slurp(channel()), create_id + resolve);
	// Shorter than a header: not a command the interposer looks into.
	EXPECT_EQ(::write(fd, get_event.data(), 4), 4);
	EXPECT_EQ(slurp(channel()), create_id + resolve + get_event.substr(0, 4));
	EXPECT_EQ(slurp(event_file()), get_event);
	close(fd);
}

TEST_F(Preload, MirrorsTheChannelsNonblockOntoTheEventFd)
{
	int fd = open(kCmDevice, O_RDWR | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	int ev = event_fd();
	ASSERT_GE(ev, 0);
	const std::string get_event = command(RDMA_USER_CM_CMD_GET_EVENT, sizeof(rdma_ucm_get_event));
	const std::string create_id = command(RDMA_USER_CM_CMD_CREATE_ID, sizeof(rdma_ucm_create_id));

	// As rdma_cm programs do: fcntl on the channel fd, then poll and GET_EVENT.
	ASSERT_EQ(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
	write_string(fd, create_id);
	EXPECT_FALSE(fcntl(ev, F_GETFL) & O_NONBLOCK) << "mirrored before a GET_EVENT needed it";
	ASSERT_EQ(write_string(fd, get_event), static_cast<ssize_t>(get_event.size()));
	EXPECT_TRUE(fcntl(ev, F_GETFL) & O_NONBLOCK);
	EXPECT_EQ(fcntl(ev, F_GETFL) & O_ACCMODE, O_RDWR);

	ASSERT_EQ(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK), 0);
	ASSERT_EQ(write_string(fd, get_event), static_cast<ssize_t>(get_event.size()));
	EXPECT_FALSE(fcntl(ev, F_GETFL) & O_NONBLOCK);
	EXPECT_EQ(slurp(event_file()), get_event + get_event);
	close(fd);
}

// After fork() parent and child share both open files; what the child
// mirrored, the parent sees (and corrects) on its next GET_EVENT.
TEST_F(Preload, MirroringFollowsTheEventFileAcrossFork)
{
	int fd = open(kCmDevice, O_RDWR | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	int ev = event_fd();
	ASSERT_GE(ev, 0);
	const std::string get_event = command(RDMA_USER_CM_CMD_GET_EVENT, sizeof(rdma_ucm_get_event));
	pid_t child = fork();
	ASSERT_GE(child, 0);
	if (child == 0) {
		bool ok = fcntl(fd, F_SETFL, O_NONBLOCK) == 0 && write_string(fd, get_event) > 0 &&
			  (fcntl(ev, F_GETFL) & O_NONBLOCK);
		_exit(ok ? 0 : 1);
	}
	int status = -1;
	ASSERT_EQ(waitpid(child, &status, 0), child);
	ASSERT_EQ(status, 0) << "the child's GET_EVENT was not mirrored";
	ASSERT_EQ(fcntl(fd, F_SETFL, 0), 0);
	ASSERT_EQ(write_string(fd, get_event), static_cast<ssize_t>(get_event.size()));
	EXPECT_FALSE(fcntl(ev, F_GETFL) & O_NONBLOCK) << "a blocking channel left a non-blocking event file";
	close(fd);
}

TEST_F(Preload, CloseClosesTheEventFdToo)
{
	int a = open(kCmDevice, O_RDWR | O_CLOEXEC);
	int b = open(kCmDevice, O_RDWR | O_CLOEXEC);
	ASSERT_GE(a, 0);
	ASSERT_GE(b, 0);
	ASSERT_EQ(fds_on(event_file()).size(), 2u);
	EXPECT_EQ(close(a), 0);
	EXPECT_EQ(fds_on(event_file()).size(), 1u);
	EXPECT_EQ(fcntl(a, F_GETFD), -1);
	EXPECT_TRUE(is_char_device(b));  // the other channel is untouched
	EXPECT_EQ(close(b), 0);
	EXPECT_TRUE(fds_on(event_file()).empty());
	EXPECT_TRUE(fds_on(channel()).empty());
}

TEST_F(Preload, Dup2OverAChannelForgetsIt)
{
	const std::string get_event = command(RDMA_USER_CM_CMD_GET_EVENT, sizeof(rdma_ucm_get_event));
	for (bool use_dup3 : {false, true}) {
		SCOPED_TRACE(use_dup3 ? "dup3" : "dup2");
		int fd = open(kCmDevice, O_RDWR | O_CLOEXEC);
		ASSERT_GE(fd, 0);
		ASSERT_EQ(dup2(fd, fd), fd);  // a no-op keeps the channel
		EXPECT_TRUE(is_char_device(fd));
		ASSERT_EQ(fds_on(event_file()).size(), 1u);

		int other = open_regular("other");
		ASSERT_GE(other, 0);
		ASSERT_EQ(use_dup3 ? dup3(other, fd, O_CLOEXEC) : dup2(other, fd), fd);
		EXPECT_TRUE(fds_on(event_file()).empty());
		EXPECT_FALSE(is_char_device(fd));
		ASSERT_EQ(write_string(fd, get_event), static_cast<ssize_t>(get_event.size()));
		EXPECT_EQ(slurp(root_ / "other"), get_event);
		close(fd);
		close(other);
	}
	EXPECT_EQ(slurp(event_file()), "");
}

// A channel fd closed where the interposer cannot see it (a raw system call,
// close_range), its number reused for another file: nothing is redirected.
TEST_F(Preload, StaleEntryNeverRedirectsAnotherFile)
{
	int fd = open(kCmDevice, O_RDWR | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(syscall(SYS_close, fd), 0);
	int reg = open_regular("reused");
	ASSERT_EQ(reg, fd) << "the lowest free fd was not reused";
	EXPECT_FALSE(is_char_device(reg));
	const std::string get_event = command(RDMA_USER_CM_CMD_GET_EVENT, sizeof(rdma_ucm_get_event));
	ASSERT_EQ(write_string(reg, get_event), static_cast<ssize_t>(get_event.size()));
	EXPECT_EQ(slurp(root_ / "reused"), get_event);
	EXPECT_EQ(slurp(event_file()), "");
	EXPECT_TRUE(fds_on(event_file()).empty()) << "the stale channel's event fd leaked";
	close(reg);
}

// The event fd closed behind the interposer's back and its number reused:
// GET_EVENT falls back to the channel file, and close() leaves that fd alone.
TEST_F(Preload, EventFdClosedBehindItsBackIsNeverUsed)
{
	int fd = open(kCmDevice, O_RDWR | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	int ev = event_fd();
	ASSERT_GE(ev, 0);
	ASSERT_EQ(syscall(SYS_close, ev), 0);
	int reg = open_regular("reused");
	ASSERT_EQ(reg, ev);
	const std::string get_event = command(RDMA_USER_CM_CMD_GET_EVENT, sizeof(rdma_ucm_get_event));
	ASSERT_EQ(write_string(fd, get_event), static_cast<ssize_t>(get_event.size()));
	EXPECT_EQ(slurp(channel()), get_event);
	EXPECT_EQ(slurp(root_ / "reused"), "");
	EXPECT_EQ(close(fd), 0);
	EXPECT_GE(fcntl(reg, F_GETFD), 0) << "close of the channel closed another file";
	close(reg);
}

// A daemon without event files (or one that refuses this one): the channel
// still works, GET_EVENT included, on the channel file.
TEST_F(Preload, WithoutAnEventFileGetEventGoesToTheChannel)
{
	int pre = open(channel().c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	ASSERT_GE(pre, 0);
	close(pre);
	fs::create_directory(event_file());  // opening it O_RDWR fails: EISDIR
	int fd = open(kCmDevice, O_RDWR | O_CLOEXEC);
	ASSERT_GE(fd, 0) << strerror(errno);
	EXPECT_TRUE(is_char_device(fd));
	const std::string get_event = command(RDMA_USER_CM_CMD_GET_EVENT, sizeof(rdma_ucm_get_event));
	ASSERT_EQ(write_string(fd, get_event), static_cast<ssize_t>(get_event.size()));
	EXPECT_EQ(slurp(channel()), get_event);
	EXPECT_EQ(close(fd), 0);
}

TEST_F(Preload, OtherFilesAreUntouched)
{
	int reg = open_regular("plain");
	ASSERT_GE(reg, 0);
	int p[2];
	ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
	const std::string get_event = command(RDMA_USER_CM_CMD_GET_EVENT, sizeof(rdma_ucm_get_event));
	ASSERT_EQ(write_string(reg, get_event), static_cast<ssize_t>(get_event.size()));
	ASSERT_EQ(write_string(p[1], get_event), static_cast<ssize_t>(get_event.size()));
	char buf[64];
	EXPECT_EQ(read(p[0], buf, sizeof(buf)), static_cast<ssize_t>(get_event.size()));
	EXPECT_EQ(slurp(root_ / "plain"), get_event);
	EXPECT_FALSE(is_char_device(reg));
	EXPECT_FALSE(fs::exists(channel()));  // nothing opened the cm dir
	for (int fd : {reg, p[0], p[1]})
		EXPECT_EQ(close(fd), 0);
	EXPECT_EQ(close(reg), -1);
	EXPECT_EQ(errno, EBADF);
}

// Without an xsrc cm directory the open is the real one (ENOENT on a machine
// without kernel rdma_cm), with its errno.
TEST_F(Preload, WithoutACmDirTheOpenIsTheRealOne)
{
	errno = 0;
	long real = syscall(SYS_openat, AT_FDCWD, kCmDevice, O_RDWR | O_CLOEXEC);
	int real_errno = errno;
	if (real >= 0)
		syscall(SYS_close, real);
	auto expect_real = [&](const char *why) {
		errno = 0;
		int fd = open(kCmDevice, O_RDWR | O_CLOEXEC);
		if (real >= 0) {
			EXPECT_GE(fd, 0) << why;
			EXPECT_NE(fd_target(fd), channel()) << why;
			close(fd);
		} else {
			EXPECT_EQ(fd, -1) << why;
			EXPECT_EQ(errno, real_errno) << why << ": " << strerror(errno);
		}
	};
	unsetenv("XSRC_CM_DIR");  // SYSFS_PATH names a directory without the view
	expect_real("no view");
	setenv("XSRC_CM_DIR", (root_ / "missing").c_str(), 1);
	expect_real("a cm dir that does not exist");
	setenv("XSRC_CM_DIR", "relative/cm", 1);
	expect_real("a relative cm dir");
	EXPECT_FALSE(fs::exists(channel()));
}

// The daemon's writer and the interposer's reader agree on the file.
TEST_F(Preload, FindsTheCmDirThroughTheSysfsView)
{
	unsetenv("XSRC_CM_DIR");
	const fs::path sysfs = root_ / "sysfs/";  // libibverbs accepts a trailing slash too
	ASSERT_EQ(sysfs_view_write_cm(sysfs.string(), cm_.string()), 0);
	setenv("SYSFS_PATH", sysfs.c_str(), 1);
	int fd = open(kCmDevice, O_RDWR | O_CLOEXEC);
	ASSERT_GE(fd, 0) << strerror(errno);
	EXPECT_TRUE(is_char_device(fd));
	EXPECT_EQ(fd_target(fd), channel());
	close(fd);

	ASSERT_EQ(sysfs_view_remove_cm(sysfs.string()), 0);  // the last device went down
	errno = 0;
	EXPECT_EQ(open(kCmDevice, O_RDWR | O_CLOEXEC), -1);
	EXPECT_EQ(errno, ENOENT);
}

bool interposer_loaded()
{
	Dl_info info;
	void *open_fn = dlsym(RTLD_DEFAULT, "open");
	return open_fn && dladdr(open_fn, &info) && info.dli_fname &&
	       std::string(info.dli_fname).ends_with("/libxsrc-preload.so");
}

}  // namespace
}  // namespace xsrc

int main(int argc, char **argv)
{
	if (!xsrc::interposer_loaded()) {
		if (getenv("XSRC_PRELOAD_TEST_REEXEC")) {
			fprintf(stderr, "preload_test: %s is not interposed even under LD_PRELOAD\n",
				XSRC_PRELOAD_LIBRARY);
			return 1;
		}
		setenv("XSRC_PRELOAD_TEST_REEXEC", "1", 1);
		setenv("LD_PRELOAD", XSRC_PRELOAD_LIBRARY, 1);
		std::string asan = getenv("ASAN_OPTIONS") ? getenv("ASAN_OPTIONS") : "";
		setenv("ASAN_OPTIONS", (asan + (asan.empty() ? "" : ":") + "verify_asan_link_order=0").c_str(), 1);
		execv("/proc/self/exe", argv);
		perror("preload_test: execv /proc/self/exe");
		return 1;
	}
	testing::InitGoogleTest(&argc, argv);
	return RUN_ALL_TESTS();
}
