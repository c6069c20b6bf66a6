// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Bounded waits for completions.
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <cstddef>
#include <vector>

namespace xsrc::harness {

// Up to `n` completions of `cq`, polling until they are there or `timeout` has passed.
// Throws std::runtime_error when ibv_poll_cq fails.
std::vector<ibv_wc> poll_completions(ibv_cq *cq, size_t n, std::chrono::milliseconds timeout);

}  // namespace xsrc::harness
