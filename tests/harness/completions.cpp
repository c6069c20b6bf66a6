// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
#include "harness/completions.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

namespace xsrc::harness {

std::vector<ibv_wc> poll_completions(ibv_cq *cq, size_t n, std::chrono::milliseconds timeout)
{
	std::vector<ibv_wc> out;
	auto deadline = std::chrono::steady_clock::now() + timeout;
	while (out.size() < n) {
		ibv_wc wc[16];
		int got = ibv_poll_cq(cq, static_cast<int>(std::min<size_t>(16, n - out.size())), wc);
		if (got < 0)
			throw std::runtime_error("ibv_poll_cq returned " + std::to_string(got));
		out.insert(out.end(), wc, wc + got);
		if (got == 0) {
			if (std::chrono::steady_clock::now() >= deadline)
				break;
			std::this_thread::sleep_for(std::chrono::microseconds(200));
		}
	}
	return out;
}

}  // namespace xsrc::harness
