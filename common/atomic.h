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

// One step of a spin-wait: tells the CPU so (x86 PAUSE), which lets a
// sibling thread run and spares the pipeline a mis-speculated exit.
inline void cpu_relax() noexcept
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#else
	std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

// Asks for the cache line at `p` in a state this CPU may write, without
// waiting for it: a line another process's CPU wrote last costs a cross-core
// round trip; asked for early, that trip overlaps other work, and a load
// followed by a locked write fetches it once instead of twice. No effect on
// what anyone sees (x86 PREFETCHW; elsewhere a plain prefetch).
inline void prefetch_for_write(const void *p) noexcept
{
#if defined(__x86_64__) || defined(__i386__)
	asm volatile("prefetchw %0" : : "m"(*static_cast<const char *>(p)));
#else
	__builtin_prefetch(p, 1);
#endif
}

}  // namespace xsrc
