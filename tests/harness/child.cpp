// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
#include "harness/child.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace xsrc::harness {

namespace {

// fork(); the child dies with its parent, and at once if the parent is already gone.
// Throws when there is no child.
pid_t fork_child()
{
	pid_t parent = getpid();
	fflush(nullptr);
	pid_t pid = fork();
	if (pid < 0)
		throw std::runtime_error(std::string("fork: ") + strerror(errno));
	if (pid == 0) {
		// Only async-signal-safe calls here (the parent may have threads).
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(126);
	}
	return pid;
}

}  // namespace

Child::Child(Child &&other) noexcept : pid_(std::exchange(other.pid_, -1)), link_(std::move(other.link_)) {}

Child &Child::operator=(Child &&other) noexcept
{
	if (this != &other) {
		kill();
		pid_ = std::exchange(other.pid_, -1);
		link_ = std::move(other.link_);
	}
	return *this;
}

Child Child::spawn(const std::string &mode, const std::vector<std::string> &args, const std::vector<int> &inherit)
{
	auto [mine, theirs] = Link::pair();
	std::vector<std::string> argv_s{program_invocation_short_name, mode, std::to_string(theirs.fd())};
	argv_s.insert(argv_s.end(), args.begin(), args.end());
	std::vector<char *> argv;
	for (auto &s : argv_s)
		argv.push_back(s.data());
	argv.push_back(nullptr);
	pid_t pid = fork_child();
	if (pid == 0) {
		fcntl(theirs.fd(), F_SETFD, 0);
		for (int fd : inherit)
			fcntl(fd, F_SETFD, 0);
		execv("/proc/self/exe", argv.data());
		_exit(127);
	}
	return Child(pid, std::move(mine));
}

Child Child::run(const std::function<int(Link &)> &body)
{
	auto [mine, theirs] = Link::pair();
	pid_t pid = fork_child();
	if (pid == 0) {
		mine.close();
		_exit(body(theirs));
	}
	return Child(pid, std::move(mine));
}

void Child::kill()
{
	if (pid_ <= 0)
		return;
	::kill(pid_, SIGKILL);
	int status;
	while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
	}
	pid_ = -1;
}

std::optional<int> Child::wait(ms timeout)
{
	if (pid_ <= 0)
		return std::nullopt;
	int status = 0;
	if (timeout.count() < 0) {
		pid_t r;
		while ((r = waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
		}
		if (r != pid_)
			return std::nullopt;
		pid_ = -1;
		return status;
	}
	auto deadline = std::chrono::steady_clock::now() + timeout;
	for (;;) {
		if (waitpid(pid_, &status, WNOHANG) == pid_) {
			pid_ = -1;
			return status;
		}
		if (std::chrono::steady_clock::now() >= deadline)
			return std::nullopt;
		std::this_thread::sleep_for(ms{1});
	}
}

void Child::wait_exited() const
{
	siginfo_t si{};
	waitid(P_PID, static_cast<id_t>(pid_), &si, WEXITED | WNOWAIT);
}

std::optional<ChildArgs> child_args(int argc, char **argv, std::string_view mode)
{
	if (argc < 3 || mode != argv[1])
		return std::nullopt;
	ChildArgs a{Link(xsrc::unique_fd(atoi(argv[2]))), {}};
	for (int i = 3; i < argc; ++i)
		a.args.emplace_back(argv[i]);
	return a;
}

int exit_code(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return -1;
}

}  // namespace xsrc::harness
