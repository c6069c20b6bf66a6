// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// A lock word in shared memory that holds its holder's pid (0: free), so
// that a holder which died holding it is found and the lock taken over.
// Used by the atomics locks and the tag tables of TM SRQs.
#pragma once

#include <sched.h>
#include <signal.h>

#include <cerrno>
#include <cstdint>

#include "common/atomic.h"

namespace xsrc {

// Spins between checks whether the holder is still alive.
inline constexpr unsigned kPidLockSpinsPerHolderCheck = 1024;

// Takes `word` for `me` (a pid), taking over from a holder that died.
inline void pid_lock_take(uint32_t &word, uint32_t me) noexcept
{
	auto lock = atomic(word);
	for (unsigned spins = 0;; ++spins) {
		uint32_t holder = 0;
		if (lock.compare_exchange_weak(holder, me, std::memory_order_acquire))
			return;
		if (spins % kPidLockSpinsPerHolderCheck == kPidLockSpinsPerHolderCheck - 1) {
			if (holder && kill(static_cast<pid_t>(holder), 0) != 0 && errno == ESRCH &&
			    lock.compare_exchange_strong(holder, me, std::memory_order_acquire))
				return;
			sched_yield();
		}
	}
}

inline void pid_lock_release(uint32_t &word) noexcept
{
	store_release(word, 0u);
}

}  // namespace xsrc
