// The process on the other side of a command: where responses are written,
// where completion-channel and async-event fds come from, whose mappings a
// memory registration must cover. An interface, so the command dispatcher can
// be unit-tested and fuzzed without FUSE or a second process.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/fd.h"

namespace xsrc {

class Caller {
public:
	virtual ~Caller() = default;
	// Copies `bytes` to `addr` in the caller. Returns 0 or an errno (EFAULT).
	virtual int write_memory(uint64_t addr, std::span<const std::byte> bytes) = 0;
	// Fills `bytes` from `addr` in the caller. Returns 0 or an errno (EFAULT).
	virtual int read_memory(uint64_t addr, std::span<std::byte> bytes) = 0;
	// Duplicates the caller's fd `fd` into the daemon. Returns the new fd
	// (owned by the daemon) or -errno (EBADF when the caller has no such fd).
	virtual int take_fd(int fd) = 0;
	// Returns 0 when [addr, addr+length) is mapped in the caller, readable and,
	// if `writable`, writable; EFAULT otherwise.
	virtual int check_mapped(uint64_t addr, uint64_t length, bool writable) = 0;
	virtual pid_t pid() const = 0;   // thread-group id of the caller
};

// The real thing: a process identified by a pidfd (immune to pid reuse).
class ProcessCaller final : public Caller {
public:
	// Opens a pidfd for thread group `tgid`; check valid() afterwards.
	explicit ProcessCaller(pid_t tgid);
	ProcessCaller(const ProcessCaller &) = delete;
	ProcessCaller &operator=(const ProcessCaller &) = delete;

	bool valid() const { return static_cast<bool>(pidfd_); }
	int write_memory(uint64_t addr, std::span<const std::byte> bytes) override;
	int read_memory(uint64_t addr, std::span<std::byte> bytes) override;
	int take_fd(int fd) override;
	int check_mapped(uint64_t addr, uint64_t length, bool writable) override;
	pid_t pid() const override { return tgid_; }
	int pidfd() const { return pidfd_.get(); }  // readable once the process has exited

private:
	pid_t tgid_;
	unique_fd pidfd_;
};

// A thread blocked in a write() to one of the daemon's files (it stays
// blocked, so its id stays its own, until the write is answered): its memory,
// and its process's fds. No system call until one is needed.
class ThreadCaller final : public Caller {
public:
	explicit ThreadCaller(pid_t tid) : tid_(tid) {}
	int write_memory(uint64_t addr, std::span<const std::byte> bytes) override;
	int read_memory(uint64_t addr, std::span<std::byte> bytes) override;
	int take_fd(int fd) override;
	int check_mapped(uint64_t addr, uint64_t length, bool writable) override;
	pid_t pid() const override { return tid_; }

private:
	pid_t tid_;
};

// Thread-group id of a thread, from /proc; -1 if it is gone.
pid_t tgid_of(pid_t tid);

// Does thread `tid` hold CAP_NET_RAW in the daemon's user namespace (the
// kernel's capable(), which a capability inside a user namespace of its own
// does not satisfy)? False when it is gone.
bool has_net_raw(pid_t tid);

}  // namespace xsrc
