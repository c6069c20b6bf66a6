// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// A lock word in shared memory that holds its holder's pid (0: free), so
// that a holder which died holding it is found and the lock taken over.
// Used by the atomics locks and the tag tables of TM SRQs.
//
// The pid is the holder's as the device sees it. Only a waiter in the
// device's PID namespace can test it with kill(): in another namespace that
// pid names nothing (ESRCH) or another process. Such a waiter leaves a dead
// holder's word to xsrcd, which frees the words of a process when its pidfd
// says it exited (Daemon::on_owner_exit).
#pragma once

#include <sched.h>
#include <signal.h>

#include <cerrno>
#include <cstdint>

#include "common/atomic.h"

namespace xsrc {

// Spins between checks whether the holder is still alive.
inline constexpr unsigned kPidLockSpinsPerHolderCheck = 1024;

// Takes `word` for `me` (a pid), taking over from a holder that died when
// `may_take_over` (the caller shares the device's PID namespace).
inline void pid_lock_take(uint32_t &word, uint32_t me, bool may_take_over = true) noexcept
{
	auto lock = atomic(word);
	for (unsigned spins = 0;; ++spins) {
		uint32_t holder = 0;
		if (lock.compare_exchange_weak(holder, me, std::memory_order_acquire))
			return;
		if (spins % kPidLockSpinsPerHolderCheck == kPidLockSpinsPerHolderCheck - 1) {
			if (may_take_over && holder && kill(static_cast<pid_t>(holder), 0) != 0 && errno == ESRCH &&
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
