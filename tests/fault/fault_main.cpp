// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
//   fault_test daemon_death
//   fault_test rounds N [SEED]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "fault.h"
#include "harness/device_stats.h"

namespace xsrc::fault {

std::string env_or(const char *name, const char *fallback)
{
	const char *v = std::getenv(name);
	return v && *v ? v : fallback;
}

bool run_xsrc(const std::string &args)
{
	std::string cmd = env_or("XSRC", "xsrc") + " " + args + " >/dev/null";
	int rc = std::system(cmd.c_str());
	if (rc != 0)
		std::printf("'%s' failed (%d)\n", cmd.c_str(), rc);
	return rc == 0;
}

bool wait_device_idle(ms timeout)
{
	auto until = Clock::now() + timeout;
	for (;;) {
		auto st = harness::device_status("xsrc0");
		if (st && st->contexts == 0 && st->objects == 0)
			return true;
		if (Clock::now() >= until) {
			std::printf("xsrc0: %d contexts, %d objects\n", st ? st->contexts : -1, st ? st->objects : -1);
			return false;
		}
		std::this_thread::sleep_for(ms{20});
	}
}

}  // namespace xsrc::fault

int main(int argc, char **argv)
{
	setvbuf(stdout, nullptr, _IOLBF, 0);
	if (argc >= 2 && std::strcmp(argv[1], "daemon_death") == 0)
		return xsrc::fault::daemon_death();
	if (argc >= 3 && std::strcmp(argv[1], "rounds") == 0) {
		unsigned long seed = argc >= 4 ? std::strtoul(argv[3], nullptr, 0) : std::random_device{}();
		return xsrc::fault::rounds(std::atoi(argv[2]), seed);
	}
	std::fprintf(stderr, "usage: %s daemon_death | rounds N [SEED]\n", argv[0]);
	return 2;
}
