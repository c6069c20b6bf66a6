#include "caller.h"

#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

namespace xsrc {
namespace {

// glibc 2.36's <sys/pidfd.h> lacks C++ linkage guards; call the kernel directly.
int pidfd_open(pid_t pid, unsigned flags)
{
	return static_cast<int>(syscall(SYS_pidfd_open, pid, flags));
}

int pidfd_getfd(int pidfd, int fd, unsigned flags)
{
	return static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, flags));
}

int write_to(pid_t pid, uint64_t addr, std::span<const std::byte> bytes)
{
	if (bytes.empty())
		return 0;
	iovec local{const_cast<std::byte *>(bytes.data()), bytes.size()};
	iovec remote{reinterpret_cast<void *>(addr), bytes.size()};
	return process_vm_writev(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(bytes.size()) ? 0 : EFAULT;
}

int read_from(pid_t pid, uint64_t addr, std::span<std::byte> bytes)
{
	if (bytes.empty())
		return 0;
	iovec local{bytes.data(), bytes.size()};
	iovec remote{reinterpret_cast<void *>(addr), bytes.size()};
	return process_vm_readv(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(bytes.size()) ? 0 : EFAULT;
}

}  // namespace

pid_t tgid_of(pid_t tid)
{
	std::ifstream status("/proc/" + std::to_string(tid) + "/status");
	std::string line;
	while (std::getline(status, line))
		if (line.rfind("Tgid:", 0) == 0)
			return static_cast<pid_t>(std::stol(line.substr(5)));
	return -1;
}

bool has_net_raw(pid_t tid)
{
	struct stat theirs, ours;
	std::string proc = "/proc/" + std::to_string(tid);
	if (stat((proc + "/ns/user").c_str(), &theirs) || stat("/proc/self/ns/user", &ours) ||
	    theirs.st_ino != ours.st_ino || theirs.st_dev != ours.st_dev)
		return false;
	std::ifstream status(proc + "/status");
	std::string line;
	while (std::getline(status, line))
		if (line.rfind("CapEff:", 0) == 0)
			return (std::stoull(line.substr(7), nullptr, 16) >> CAP_NET_RAW) & 1;
	return false;
}

ProcessCaller::ProcessCaller(pid_t tgid) : tgid_(tgid)
{
	if (tgid_ > 0)
		pidfd_.reset(pidfd_open(tgid_, 0));
}

int ProcessCaller::write_memory(uint64_t addr, std::span<const std::byte> bytes)
{
	return write_to(tgid_, addr, bytes);
}

int ProcessCaller::read_memory(uint64_t addr, std::span<std::byte> bytes)
{
	return read_from(tgid_, addr, bytes);
}

int ProcessCaller::take_fd(int fd)
{
	if (!pidfd_)
		return -ESRCH;
	int ours = pidfd_getfd(pidfd_.get(), fd, 0);
	return ours >= 0 ? ours : -errno;
}

int ProcessCaller::check_mapped(uint64_t addr, uint64_t length, bool writable)
{
	if (length == 0 || addr + length < addr)
		return EFAULT;
	FILE *maps = fopen(("/proc/" + std::to_string(tgid_) + "/maps").c_str(), "re");
	if (!maps)
		return EFAULT;
	// Mappings are sorted; walk them and require contiguous coverage.
	uint64_t covered_to = addr, end = addr + length;
	char line[512];
	while (covered_to < end && fgets(line, sizeof(line), maps)) {
		uint64_t lo, hi;
		char perms[5] = {};
		if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %4s", &lo, &hi, perms) != 3)
			continue;
		if (hi <= covered_to)
			continue;
		if (lo > covered_to)
			break;  // a hole
		if (perms[0] != 'r' || (writable && perms[1] != 'w'))
			break;
		covered_to = hi;
	}
	fclose(maps);
	return covered_to >= end ? 0 : EFAULT;
}

// process_vm_readv/writev take any thread's id; fds belong to its thread group.
int ThreadCaller::write_memory(uint64_t addr, std::span<const std::byte> bytes)
{
	return write_to(tid_, addr, bytes);
}

int ThreadCaller::read_memory(uint64_t addr, std::span<std::byte> bytes)
{
	return read_from(tid_, addr, bytes);
}

int ThreadCaller::take_fd(int fd)
{
	ProcessCaller process(tgid_of(tid_));
	return process.valid() ? process.take_fd(fd) : -ESRCH;
}

int ThreadCaller::check_mapped(uint64_t addr, uint64_t length, bool writable)
{
	ProcessCaller process(tgid_of(tid_));
	return process.valid() ? process.check_mapped(addr, length, writable) : EFAULT;
}

}  // namespace xsrc
