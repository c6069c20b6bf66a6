// libxsrc-preload.so: gives unmodified, dynamically linked librdmacm programs
// the xsrc rdma_cm device.
//
// librdmacm opens /dev/infiniband/rdma_cm, refuses it unless fstat calls it a
// character device, and then speaks the rdma_cm write ABI on it. xsrcd serves
// that ABI on FUSE files, which cannot be character devices (and there is no
// CUSE). Preloaded, this library opens xsrcd's cm channel file for that one
// path, reports it to fstat as a character device, and sends GET_EVENT, which
// blocks, through the channel's second file (its event file): the kernel holds
// a FUSE direct_io file's inode lock for a whole write, so a GET_EVENT waiting
// on the channel file would hold up every other thread's command on it.
// Nothing else of the program's I/O changes: every other call goes straight to
// libc, and no write() allocates.
//
// Where the channels are: $XSRC_CM_DIR, else the directory named by
// $SYSFS_PATH/class/infiniband_ucma/xsrc_cm_dir (SYSFS_PATH: default /sys),
// which xsrcd writes while a device is up. Without one, open() of the path is
// the real open().
//
// It also lets ibv_import_device() take a verbs command fd: fstat calls every
// regular file of xsrcd's FUSE mount a character device (the uverbs node's
// numbers) as the kernel's uverbs files are, when it is the FUSE mount that
// holds the cm directory.
//
// Limits: only what reaches libc through its dynamic symbols is seen here.
// Statically linked programs do not get the device, nor do setuid and setgid
// programs (ld.so ignores an LD_PRELOAD path with a slash in secure-execution
// mode), nor raw system calls. A dup() of the channel fd works; fstat calls
// it a character device with the uverbs node's numbers, and its GET_EVENT
// goes to the channel file.
#undef _FORTIFY_SOURCE  // its inline open() would collide with ours

#include <dlfcn.h>
#include <fcntl.h>
#include <rdma/rdma_user_cm.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "sysfs_view.h"  // kCmClassDir, kCmDirFile, kDevnodeMajor/Minor

#define XSRC_PRELOAD_EXPORT extern "C" __attribute__((visibility("default")))

namespace xsrc::preload {
namespace {

constexpr const char *kCmDevicePath = "/dev/infiniband/rdma_cm";
constexpr const char *kCmDirEnv = "XSRC_CM_DIR";
constexpr const char *kDefaultSysfsPath = "/sys";

// --- the real libc calls, resolved once (and again if asked before the constructor ran) ---

template <typename Fn>
struct RealCall {
	const char *name;
	std::atomic<Fn> fn{nullptr};

	Fn get()
	{
		Fn f = fn.load(std::memory_order_acquire);
		if (!f) {
			f = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
			fn.store(f, std::memory_order_release);
		}
		return f;
	}
};

using OpenFn = int (*)(const char *, int, ...);
using OpenAtFn = int (*)(int, const char *, int, ...);
using Open2Fn = int (*)(const char *, int);
using OpenAt2Fn = int (*)(int, const char *, int);
using FstatFn = int (*)(int, struct stat *);
using Fstat64Fn = int (*)(int, struct stat64 *);
using FxstatFn = int (*)(int, int, struct stat *);
using Fxstat64Fn = int (*)(int, int, struct stat64 *);
using WriteFn = ssize_t (*)(int, const void *, size_t);
using CloseFn = int (*)(int);
using Dup2Fn = int (*)(int, int);
using Dup3Fn = int (*)(int, int, int);

RealCall<OpenFn> real_open{"open"};
RealCall<OpenFn> real_open64{"open64"};
RealCall<OpenAtFn> real_openat{"openat"};
RealCall<OpenAtFn> real_openat64{"openat64"};
RealCall<Open2Fn> real_open_2{"__open_2"};
RealCall<Open2Fn> real_open64_2{"__open64_2"};
RealCall<OpenAt2Fn> real_openat_2{"__openat_2"};
RealCall<OpenAt2Fn> real_openat64_2{"__openat64_2"};
RealCall<FstatFn> real_fstat{"fstat"};
RealCall<Fstat64Fn> real_fstat64{"fstat64"};
RealCall<FxstatFn> real_fxstat{"__fxstat"};
RealCall<Fxstat64Fn> real_fxstat64{"__fxstat64"};
RealCall<WriteFn> real_write{"write"};
RealCall<CloseFn> real_close{"close"};
RealCall<Dup2Fn> real_dup2{"dup2"};
RealCall<Dup3Fn> real_dup3{"dup3"};

__attribute__((constructor)) void resolve_real_calls()
{
	real_open.get(), real_open64.get(), real_openat.get(), real_openat64.get();
	real_open_2.get(), real_open64_2.get(), real_openat_2.get(), real_openat64_2.get();
	real_fstat.get(), real_fstat64.get(), real_fxstat.get(), real_fxstat64.get();
	real_write.get(), real_close.get(), real_dup2.get(), real_dup3.get();
}

// What a wrapper returns when libc lacks the call it wraps.
int no_such_call()
{
	errno = ENOSYS;
	return -1;
}

// Our own system calls: raw, so that they never re-enter the wrappers.
int sys_open(const char *path, int flags, mode_t mode = 0)
{
	return static_cast<int>(syscall(SYS_openat, AT_FDCWD, path, flags, mode));
}

void sys_close(int fd)
{
	int saved = errno;
	syscall(SYS_close, fd);
	errno = saved;
}

// The identity of an open file. statx with AT_STATX_DONT_SYNC: FUSE answers
// from its attribute cache, no round trip to xsrcd (inode numbers never change).
struct FileId {
	uint64_t dev = 0;
	uint64_t ino = 0;
	bool operator==(const FileId &) const = default;
};

bool file_id(int fd, FileId &id)
{
	struct statx stx;
	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_INO, &stx) < 0)
		return false;
	id = {makedev(stx.stx_dev_major, stx.stx_dev_minor), stx.stx_ino};
	return true;
}

// --- the channels this process opened, by fd ---

// A fixed table, so that write() looks up without locks or allocation; fds
// beyond it are not tracked (an rdma_cm open that would get one fails EMFILE).
constexpr int kMaxTrackedFd = 1 << 16;

struct Channel {
	std::atomic<uint64_t> ino{0};  // the channel file's; 0: this fd is not a channel
	std::atomic<uint64_t> dev{0};
	std::atomic<uint64_t> rdev{0};        // what fstat reports as st_rdev
	std::atomic<int> event_fd{-1};        // -1: GET_EVENT goes to the channel file
	std::atomic<uint64_t> event_ino{0};
	std::atomic<uint64_t> event_dev{0};
};

Channel g_channels[kMaxTrackedFd];

Channel *channel_of(int fd)
{
	if (fd < 0 || fd >= kMaxTrackedFd)
		return nullptr;
	Channel &c = g_channels[fd];
	return c.ino.load(std::memory_order_acquire) ? &c : nullptr;
}

// Published last: ino != 0 makes the entry live.
void track(int fd, const FileId &channel, dev_t rdev, int event_fd, const FileId &event)
{
	Channel &c = g_channels[fd];
	c.dev.store(channel.dev, std::memory_order_relaxed);
	c.rdev.store(rdev, std::memory_order_relaxed);
	c.event_ino.store(event.ino, std::memory_order_relaxed);
	c.event_dev.store(event.dev, std::memory_order_relaxed);
	c.event_fd.store(event_fd, std::memory_order_relaxed);
	c.ino.store(channel.ino, std::memory_order_release);
}

// Our event fd of `c`, if that fd still is the event file we opened (a program
// may have closed it, e.g. in a loop over all fds, and reused the number).
int live_event_fd(Channel &c)
{
	int ev = c.event_fd.load(std::memory_order_acquire);
	FileId id;
	if (ev < 0 || !file_id(ev, id))
		return -1;
	FileId want{c.event_dev.load(std::memory_order_relaxed), c.event_ino.load(std::memory_order_relaxed)};
	return id == want ? ev : -1;
}

// The program closes `fd` or replaces it: drop its entry and close its event fd.
// Before the fd itself goes, so that a concurrent open() that reuses the number
// finds the entry free.
void forget(int fd)
{
	Channel *c = channel_of(fd);
	if (!c)
		return;
	int saved = errno;  // the caller's close() or dup2() sets errno, we do not
	int ev = live_event_fd(*c);
	c->ino.store(0, std::memory_order_release);
	if (c->event_fd.exchange(-1) == ev && ev >= 0)
		sys_close(ev);
	errno = saved;
}

bool is_channel_file(int fd, const Channel &c)
{
	FileId id;
	return file_id(fd, id) && id == FileId{c.dev.load(std::memory_order_relaxed), c.ino.load(std::memory_order_relaxed)};
}

// Where to send a GET_EVENT written on channel fd `fd`: its event fd, with the
// channel fd's O_NONBLOCK, or -1 (the channel fd itself). Never an fd that is
// not the file this library opened: a stale entry (the channel closed past
// close(), e.g. by close_range or a raw syscall, and the number reused) is dropped.
int event_fd_for_get_event(int fd, Channel &c)
{
	if (!is_channel_file(fd, c)) {
		forget(fd);
		return -1;
	}
	int ev = live_event_fd(c);
	if (ev < 0)
		return -1;
	// The event file's own flags, not a cached copy: after a fork both
	// processes share (and may change) the two open files.
	int flags = fcntl(fd, F_GETFL), event_flags = fcntl(ev, F_GETFL);
	if (flags >= 0 && event_flags >= 0 && (flags ^ event_flags) & O_NONBLOCK)
		fcntl(ev, F_SETFL, (event_flags & ~O_NONBLOCK) | (flags & O_NONBLOCK));
	return ev;
}

// --- open ---

// The cm directory into dir[size], or false when there is none.
bool find_cm_dir(char *dir, size_t size)
{
	if (const char *env = std::getenv(kCmDirEnv); env && *env) {
		if (env[0] != '/' || std::strlen(env) >= size)
			return false;
		std::strcpy(dir, env);
		return true;
	}
	const char *sysfs = std::getenv("SYSFS_PATH");
	if (!sysfs || !*sysfs)
		sysfs = kDefaultSysfsPath;
	char file[PATH_MAX];
	int n = std::snprintf(file, sizeof(file), "%s/%s/%s", sysfs, kCmClassDir, kCmDirFile);
	if (n < 0 || static_cast<size_t>(n) >= sizeof(file))
		return false;
	int fd = sys_open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	size_t got = 0;
	while (got < size) {
		ssize_t r = syscall(SYS_read, fd, dir + got, size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += static_cast<size_t>(r);
	}
	sys_close(fd);
	while (got > 0 && dir[got - 1] == '\n')
		--got;
	if (got == 0 || got >= size || dir[0] != '/' || std::memchr(dir, '\n', got))
		return false;
	dir[got] = '\0';
	return true;
}

// What fstat reports as st_rdev: a real rdma_cm node's numbers, so that a
// librdmacm that learnt them from netlink accepts the channel, else those of
// the view's uverbs nodes (librdmacm accepts any after its sysfs fallback).
dev_t cm_rdev()
{
	struct statx stx;
	if (statx(AT_FDCWD, kCmDevicePath, 0, STATX_TYPE, &stx) == 0 && S_ISCHR(stx.stx_mode))
		return makedev(stx.stx_rdev_major, stx.stx_rdev_minor);
	return makedev(kDevnodeMajor, kDevnodeMinor);
}

bool is_cm_device(const char *path)
{
	return path && std::strcmp(path, kCmDevicePath) == 0;
}

// Opens the xsrc cm channel for an open() of kCmDevicePath with `flags`.
// Returns false when there is no xsrc cm directory (the caller makes the real
// call); else true with the fd, or -1 and errno, in `result`.
bool open_cm_device(int flags, int &result)
{
	char dir[PATH_MAX];
	if (!find_cm_dir(dir, sizeof(dir)))
		return false;
	char path[PATH_MAX + 32];
	std::snprintf(path, sizeof(path), "%s/channel", dir);
	int keep = flags & (O_CLOEXEC | O_NONBLOCK);
	int channel = sys_open(path, O_RDWR | O_CREAT | keep, 0600);
	if (channel < 0)
		return errno != ENOENT && errno != ENOTDIR ? (result = -1, true) : false;

	FileId channel_id;
	if (!file_id(channel, channel_id) || channel >= kMaxTrackedFd) {
		int err = channel >= kMaxTrackedFd ? EMFILE : errno;
		sys_close(channel);
		errno = err;
		result = -1;
		return true;
	}
	forget(channel);  // an entry left by a close this library did not see
	// The event file; without it GET_EVENT still works on the channel file.
	std::snprintf(path, sizeof(path), "%s/event-%llu", dir, static_cast<unsigned long long>(channel_id.ino));
	int event = sys_open(path, O_RDWR | O_CREAT | O_CLOEXEC | (flags & O_NONBLOCK), 0600);
	FileId event_id;
	if (event >= 0 && !file_id(event, event_id)) {
		sys_close(event);
		event = -1;
	}
	track(channel, channel_id, cm_rdev(), event, event_id);
	result = channel;
	return true;
}

bool needs_mode(int flags)
{
	return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE;
}

// --- the verbs command files ---

// ibv_import_device() takes a command fd only if fstat calls it a character
// device whose st_rdev is the device's uverbs node: so is every regular file
// of xsrcd's FUSE mount (the provider's command files; the cm directory is in
// the same mount, which is how it is found). Other files pay one comparison,
// or, on a device with major number 0 seen for the first time in a second, a
// look at the cm directory (the daemon may have mounted anew).
std::atomic<uint64_t> g_mount_dev{0};  // the mount's st_dev, once seen
constexpr decltype(statfs::f_type) kFuseSuperMagic = 0x65735546;  // a FUSE mount, as xsrcd's

constexpr int kNotMountSlots = 8;
struct NotMount {
	std::atomic<uint64_t> dev{0};
	std::atomic<int64_t> until_ns{0};
};
NotMount g_not_mount[kNotMountSlots];

int64_t monotonic_ns()
{
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

bool on_xsrc_mount(uint64_t dev)
{
	if (dev == g_mount_dev.load(std::memory_order_relaxed))
		return true;
	if (major(dev) != 0)  // FUSE mounts have anonymous device numbers
		return false;
	const int64_t now = monotonic_ns();
	NotMount &slot = g_not_mount[dev % kNotMountSlots];
	if (slot.dev.load(std::memory_order_relaxed) == dev && slot.until_ns.load(std::memory_order_relaxed) > now)
		return false;
	char dir[PATH_MAX];
	struct statx stx;
	struct statfs fs;
	if (find_cm_dir(dir, sizeof(dir)) && statfs(dir, &fs) == 0 && fs.f_type == kFuseSuperMagic &&
	    statx(AT_FDCWD, dir, 0, STATX_TYPE, &stx) == 0) {
		uint64_t mount = makedev(stx.stx_dev_major, stx.stx_dev_minor);
		g_mount_dev.store(mount, std::memory_order_relaxed);
		if (mount == dev)
			return true;
	}
	slot.dev.store(dev, std::memory_order_relaxed);
	slot.until_ns.store(now + 1'000'000'000, std::memory_order_relaxed);
	return false;
}

// --- fstat ---

template <typename Stat>
int patch_stat(int fd, int rc, Stat *st)
{
	if (rc != 0)
		return rc;
	Channel *c = channel_of(fd);
	if (c && st->st_ino == c->ino.load(std::memory_order_relaxed) &&
	    st->st_dev == c->dev.load(std::memory_order_relaxed)) {
		st->st_mode = S_IFCHR | 0666;
		st->st_rdev = c->rdev.load(std::memory_order_relaxed);
	} else if (S_ISREG(st->st_mode) && on_xsrc_mount(st->st_dev)) {
		st->st_mode = S_IFCHR | (st->st_mode & 07777);
		st->st_rdev = makedev(kDevnodeMajor, kDevnodeMinor);
	}
	return rc;
}

}  // namespace
}  // namespace xsrc::preload

using namespace xsrc::preload;

// Each open flavour: the cm device path goes to xsrcd's channel, anything else
// is the real call. openat: the path is absolute, so dirfd does not matter.
#define XSRC_OPEN_MODE(flags, mode)                  \
	mode_t mode = 0;                             \
	if (needs_mode(flags)) {                     \
		va_list ap;                          \
		va_start(ap, flags);                 \
		mode = static_cast<mode_t>(va_arg(ap, int)); \
		va_end(ap);                          \
	}

XSRC_PRELOAD_EXPORT int open(const char *path, int flags, ...)
{
	XSRC_OPEN_MODE(flags, mode)
	int fd;
	if (is_cm_device(path) && open_cm_device(flags, fd))
		return fd;
	OpenFn real = real_open.get();
	return real ? real(path, flags, mode) : no_such_call();
}

XSRC_PRELOAD_EXPORT int open64(const char *path, int flags, ...)
{
	XSRC_OPEN_MODE(flags, mode)
	int fd;
	if (is_cm_device(path) && open_cm_device(flags, fd))
		return fd;
	OpenFn real = real_open64.get();
	return real ? real(path, flags, mode) : no_such_call();
}

XSRC_PRELOAD_EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
	XSRC_OPEN_MODE(flags, mode)
	int fd;
	if (is_cm_device(path) && open_cm_device(flags, fd))
		return fd;
	OpenAtFn real = real_openat.get();
	return real ? real(dirfd, path, flags, mode) : no_such_call();
}

XSRC_PRELOAD_EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
	XSRC_OPEN_MODE(flags, mode)
	int fd;
	if (is_cm_device(path) && open_cm_device(flags, fd))
		return fd;
	OpenAtFn real = real_openat64.get();
	return real ? real(dirfd, path, flags, mode) : no_such_call();
}

// The _FORTIFY_SOURCE entry points (flags without O_CREAT known at compile time).
XSRC_PRELOAD_EXPORT int __open_2(const char *path, int flags)
{
	int fd;
	if (is_cm_device(path) && open_cm_device(flags, fd))
		return fd;
	Open2Fn real = real_open_2.get();
	return real ? real(path, flags) : no_such_call();
}

XSRC_PRELOAD_EXPORT int __open64_2(const char *path, int flags)
{
	int fd;
	if (is_cm_device(path) && open_cm_device(flags, fd))
		return fd;
	Open2Fn real = real_open64_2.get();
	return real ? real(path, flags) : no_such_call();
}

XSRC_PRELOAD_EXPORT int __openat_2(int dirfd, const char *path, int flags)
{
	int fd;
	if (is_cm_device(path) && open_cm_device(flags, fd))
		return fd;
	OpenAt2Fn real = real_openat_2.get();
	return real ? real(dirfd, path, flags) : no_such_call();
}

XSRC_PRELOAD_EXPORT int __openat64_2(int dirfd, const char *path, int flags)
{
	int fd;
	if (is_cm_device(path) && open_cm_device(flags, fd))
		return fd;
	OpenAt2Fn real = real_openat64_2.get();
	return real ? real(dirfd, path, flags) : no_such_call();
}

// fstat of a channel fd: the real answer, as a character device.
XSRC_PRELOAD_EXPORT int fstat(int fd, struct stat *st) noexcept
{
	FstatFn real = real_fstat.get();
	return real ? patch_stat(fd, real(fd, st), st) : no_such_call();
}

XSRC_PRELOAD_EXPORT int fstat64(int fd, struct stat64 *st) noexcept
{
	Fstat64Fn real = real_fstat64.get();
	return real ? patch_stat(fd, real(fd, st), st) : no_such_call();
}

// What programs built against glibc < 2.33 call for fstat.
XSRC_PRELOAD_EXPORT int __fxstat(int ver, int fd, struct stat *st)
{
	FxstatFn real = real_fxstat.get();
	return real ? patch_stat(fd, real(ver, fd, st), st) : no_such_call();
}

XSRC_PRELOAD_EXPORT int __fxstat64(int ver, int fd, struct stat64 *st)
{
	Fxstat64Fn real = real_fxstat64.get();
	return real ? patch_stat(fd, real(ver, fd, st), st) : no_such_call();
}

// A GET_EVENT on a channel fd goes to its event fd; everything else is untouched.
XSRC_PRELOAD_EXPORT ssize_t write(int fd, const void *buf, size_t count)
{
	WriteFn real = real_write.get();
	if (!real)
		return no_such_call();
	Channel *c = channel_of(fd);
	if (!c || count < sizeof(rdma_ucm_cmd_hdr))
		return real(fd, buf, count);
	rdma_ucm_cmd_hdr hdr;
	std::memcpy(&hdr, buf, sizeof(hdr));
	if (hdr.cmd != RDMA_USER_CM_CMD_GET_EVENT)
		return real(fd, buf, count);
	int saved = errno;  // the checks' system calls leave errno as it was
	int ev = event_fd_for_get_event(fd, *c);
	errno = saved;
	return real(ev >= 0 ? ev : fd, buf, count);
}

XSRC_PRELOAD_EXPORT int close(int fd)
{
	forget(fd);
	CloseFn real = real_close.get();
	return real ? real(fd) : no_such_call();
}

// dup2/dup3 over a channel fd replace it: forget it, as close() would.
XSRC_PRELOAD_EXPORT int dup2(int oldfd, int newfd) noexcept
{
	if (oldfd != newfd && fcntl(oldfd, F_GETFD) >= 0)
		forget(newfd);
	Dup2Fn real = real_dup2.get();
	return real ? real(oldfd, newfd) : no_such_call();
}

XSRC_PRELOAD_EXPORT int dup3(int oldfd, int newfd, int flags) noexcept
{
	if (oldfd != newfd && fcntl(oldfd, F_GETFD) >= 0)
		forget(newfd);
	Dup3Fn real = real_dup3.get();
	return real ? real(oldfd, newfd, flags) : no_such_call();
}
