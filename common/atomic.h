// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The one atomics helper: every access to a field that kernel-abi/ marks
// "atomic" (arena tables, rings, lock words) goes through these.
#pragma once

#include <atomic>

namespace xsrc {

// An atomic view of a plain field in shared memory (for RMW operations).
template <typename T>
inline std::atomic_ref<T> atomic(T &field) noexcept
{
	return std::atomic_ref<T>(field);
}

template <typename T>
inline T load_acquire(T &field) noexcept
{
	return atomic(field).load(std::memory_order_acquire);
}

template <typename T>
inline void store_release(T &field, T value) noexcept
{
	atomic(field).store(value, std::memory_order_release);
}

}  // namespace xsrc
