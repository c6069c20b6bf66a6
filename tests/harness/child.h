// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The other process of a two-process test, joined to this one by a Link. It dies with
// its parent (PR_SET_PDEATHSIG) and is killed (SIGKILL, reaped) when the Child is
// destroyed.
//
// spawn() re-executes the test binary as `EXE MODE LINK_FD ARGS...`; the binary's main()
// hands those to child_args(). run() forks without exec and runs a function.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "harness/link.h"

namespace xsrc::harness {

class Child {
public:
	// /proc/self/exe MODE LINK_FD ARGS...; the fds in `inherit` stay open across the exec.
	static Child spawn(const std::string &mode, const std::vector<std::string> &args = {},
			   const std::vector<int> &inherit = {});
	// fork(); the child runs `body` with its end of the link and exits with its result.
	static Child run(const std::function<int(Link &)> &body);

	Child() = default;
	Child(Child &&other) noexcept;
	Child &operator=(Child &&other) noexcept;
	Child(const Child &) = delete;
	Child &operator=(const Child &) = delete;
	~Child() { kill(); }

	Link &link() { return link_; }
	pid_t pid() const { return pid_; }
	bool running() const { return pid_ > 0; }

	// SIGKILL and reap.
	void kill();
	// Reaps the child once it has exited: its wait status, or nullopt when it did not
	// exit within `timeout` (it is then still running).
	std::optional<int> wait(ms timeout);
	// Blocks until the child has exited, leaving it to be reaped by wait().
	void wait_exited() const;

private:
	Child(pid_t pid, Link link) : pid_(pid), link_(std::move(link)) {}

	pid_t pid_ = -1;
	Link link_;
};

// In main(): `EXE MODE LINK_FD ARGS...` as spawn() starts it.
struct ChildArgs {
	Link link;
	std::vector<std::string> args;
};
std::optional<ChildArgs> child_args(int argc, char **argv, std::string_view mode);

// A wait status as a number: the exit code, 128 + the signal, or -1.
int exit_code(int status);

}  // namespace xsrc::harness
