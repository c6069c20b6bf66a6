// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// CLOCK_MONOTONIC in nanoseconds: the clock of every timer of the device
// (ACK timeouts, RNR waits, ACKs left on a board).
#pragma once

#include <time.h>

#include <cstdint>

namespace xsrc {

inline uint64_t monotonic_ns() noexcept
{
	timespec ts{};
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

// A span of `ns` nanoseconds as a timespec (a ppoll timeout).
inline timespec timespec_of_ns(uint64_t ns) noexcept
{
	return {static_cast<time_t>(ns / 1'000'000'000u), static_cast<long>(ns % 1'000'000'000u)};
}

}  // namespace xsrc
