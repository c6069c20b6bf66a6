// What both fuzz targets (fuzz_commands.cpp, fuzz_cm.cpp) share: how a
// broken invariant is reported, and the open-fd count their leak checks use.
#pragma once

#include <dirent.h>
#include <errno.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace xsrc::fuzz {

// A broken invariant: say which, named by the target, and abort (libFuzzer
// keeps the input).
[[noreturn]] inline void finding(const char *what)
{
	fprintf(stderr, "%s: FINDING: %s\n", program_invocation_short_name, what);
	abort();
}

// Open fds of this process (the daemon must close what it opens).
inline size_t open_fd_count()
{
	DIR *dir = opendir("/proc/self/fd");
	if (!dir)
		finding("cannot list /proc/self/fd");
	size_t n = 0;
	while (readdir(dir))
		++n;
	closedir(dir);
	return n;
}

}  // namespace xsrc::fuzz
