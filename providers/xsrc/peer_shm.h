// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// A same-user peer's MR over SysV shared memory (what perftest
// --use_hugepages and MPI huge-page pools register: shmget + shmat) is
// attached here once; RDMA WRITE, READ and atomics on it then become plain
// stores, loads and (under the device-wide atomics lock) read-modify-writes,
// with no system call. Only memory that is shareable already is attached:
// a peer's private memory is never converted under it.
//
// The key is checked on the MR table before every use, as for any access,
// and the mapping is found again for the entry as it is now (owner, key,
// range): a deregistered MR or an invalidated key is unreachable at once,
// also through a segment attached earlier. XSRC_SHM_MAPS=0 turns it off.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include <xsrc-queues.h>

class xsrc_shm_maps {
public:
	xsrc_shm_maps();
	~xsrc_shm_maps();
	xsrc_shm_maps(const xsrc_shm_maps &) = delete;
	xsrc_shm_maps &operator=(const xsrc_shm_maps &) = delete;

	// Where [va, va + len) of `mr` (a live entry of key `key`, owned by
	// `pid`, the range inside it) is in our address space, or null: not
	// SysV shared memory of our user in our IPC namespace, or turned off.
	unsigned char *find(const xsrc_mr_entry &mr, uint32_t key, uint32_t pid, uint64_t va, uint64_t len);

private:
	// What we learnt about one MR (or window) entry as it was: its SysV
	// segment attached here (`local` is our address of `addr`), or not
	// shared memory (`local` null).
	struct Known {
		uint32_t pid = 0;
		uint32_t key = 0;
		uint64_t addr = 0;
		uint64_t length = 0;
		unsigned char *local = nullptr;
	};
	// One segment attached here (never detached before the context goes).
	struct Attached {
		int shmid = -1;
		void *base = nullptr;
		uint64_t size = 0;
	};
	static constexpr size_t kKnown = 64;
	static constexpr size_t kAttached = 32;

	Known resolve(const xsrc_mr_entry &mr, uint32_t key, uint32_t pid);
	void *attach(int shmid, uint64_t &size);

	std::mutex lock_;
	bool enabled_ = false;
	ino_t ipc_ns_ = 0;  // our IPC namespace: shmids mean something only in it
	std::array<Known, kKnown> known_;
	size_t known_count_ = 0;
	size_t known_next_ = 0;  // the next to replace once full
	std::array<Attached, kAttached> attached_;
	size_t attached_count_ = 0;
};
