// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The shared-memory engine's access to a peer's memory: the MR table checks
// (keys, PDs, ranges, access), the byte moves (process_vm_* ourselves, or
// XSRC_CMD_COPY through the device) and the device-wide atomics lock.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "queues.h"

struct xsrc_context;
struct xsrc_qp;
struct xsrc_send_wqe;

// --- the MR table ----------------------------------------------------------

// The MR table entry `key` names, if it is live.
const xsrc_mr_entry *xsrc_peer_live_mr(const xsrc::Arena &arena, xsrc::Lkey key);
const xsrc_mr_entry *xsrc_peer_live_mr(const xsrc::Arena &arena, xsrc::Rkey key);

// Translates [addr, addr+len) of the MR's address space into the owner's
// virtual addresses, checking the owner, PD, range and access.
bool xsrc_peer_mr_range(const xsrc_mr_entry *mr, uint32_t owner_pid, xsrc::PdId pd, uint64_t addr,
			uint64_t len, uint32_t access, uint64_t &va);

// The local side of a WQE as iovecs in our own memory.
struct xsrc_local_buffers {
	std::array<iovec, XSRC_MAX_RECV_SGE> iov;
	size_t count = 0;
	uint64_t total = 0;
};

// Fills `out` (whatever it held). False when an lkey does not allow it, or names pages of an ODP MR that
// are not mapped (IBV_WC_LOC_PROT_ERR).
bool xsrc_peer_local_buffers(xsrc_context *ctx, const xsrc_qp *qp, const xsrc_send_wqe &wqe, bool write,
			     xsrc_local_buffers &out);

// The buffers of receive `rwqe` of `owner_pid` for `len` bytes, each SGE's
// lkey checked against the MR table for `pd` and LOCAL_WRITE; or the status
// explaining why they cannot take them (IBV_WC_LOC_PROT_ERR, _LOC_LEN_ERR).
// `on_demand`: some are in an ODP MR (whose pages may be unmapped: only
// process_vm_* may touch them, never the owner's poll).
ibv_wc_status xsrc_peer_recv_buffers(const xsrc::Arena &arena, const xsrc::RecvWqe &rwqe, uint32_t owner_pid,
				     xsrc::PdId pd, uint64_t len, std::array<iovec, XSRC_MAX_RECV_SGE> &iov,
				     size_t &count, bool &on_demand);

// --- moving bytes ----------------------------------------------------------

// How the bytes reach a peer's memory: ourselves (the fast path: same PID
// namespace and allowed to), through the device (XSRC_CMD_COPY), or not at
// all (an r1 device and a peer we may not touch: the peer is unreachable).
enum class xsrc_peer_path { direct, device, none };

xsrc_peer_path xsrc_peer_path_to(const xsrc_context *ctx, uint32_t pid);
// A direct attempt was refused (EPERM): remember the peer, go on the slow path.
xsrc_peer_path xsrc_peer_refused(xsrc_context *ctx, uint32_t pid);

// Copies local iovecs into the peer's memory, or from it. Returns 0, or
// ESRCH when the peer's process is gone (its QP is unreachable, not in
// error), EPERM when we may not touch it (another user), or EFAULT.
int xsrc_peer_write(pid_t pid, const iovec *local, size_t nlocal, const iovec *remote, size_t nremote,
		    uint64_t total);
int xsrc_peer_read(pid_t pid, const iovec *local, size_t nlocal, const iovec *remote, size_t nremote,
		   uint64_t total);

// One XSRC_CMD_COPY: the device moves the bytes, checking the key on its
// own records.
struct xsrc_peer_copy {
	enum class op { write, read, fetch_add, cmp_swap };
	enum class key_kind { rkey, lkey };
	op what = op::write;
	key_kind kind = key_kind::rkey;
	uint32_t key = 0;
	xsrc::Qpn peer_qpn;
	xsrc::Srqn peer_srqn;
	uint64_t peer_addr = 0;
	uint64_t compare_add = 0;
	uint64_t swap = 0;
	// An lkey copy into a receive popped from a ring: its ring position,
	// which the device checks against the owner's record (r9).
	std::optional<uint64_t> recv_pos;
};

// Returns 0, a status of xsrc_copy_resp (EACCES, ESRCH, EFAULT), or EAGAIN
// when the command itself failed (the device was busy or refused, or this
// is an r1 build): the peer counts as unreachable.
int xsrc_peer_device_copy(xsrc_context *ctx, xsrc_qp *qp, const xsrc_peer_copy &copy, const iovec *local,
			  size_t nlocal, uint64_t length) noexcept;

// The device-wide lock that makes atomics atomic with respect to each other
// (IBV_ATOMIC_HCA). A holder that died is detected and its lock taken over.
class xsrc_peer_atomic_lock {
public:
	xsrc_peer_atomic_lock(const xsrc::Arena &arena, uint32_t pid, uint64_t va, uint32_t me);
	~xsrc_peer_atomic_lock();
	xsrc_peer_atomic_lock(const xsrc_peer_atomic_lock &) = delete;
	xsrc_peer_atomic_lock &operator=(const xsrc_peer_atomic_lock &) = delete;

private:
	uint32_t *word_;
	uint32_t me_;
};

// The same lock words for several of a peer's 8-byte words at once (a batch
// of atomics): each word's lock taken once, in address order, so that two
// batches never wait on each other in a cycle (a single lock holder waits on
// nothing). Up to kMax words.
class xsrc_peer_atomic_locks {
public:
	static constexpr size_t kMax = 64;
	xsrc_peer_atomic_locks(const xsrc::Arena &arena, uint32_t pid, const uint64_t *va, size_t n, uint32_t me);
	~xsrc_peer_atomic_locks();
	xsrc_peer_atomic_locks(const xsrc_peer_atomic_locks &) = delete;
	xsrc_peer_atomic_locks &operator=(const xsrc_peer_atomic_locks &) = delete;

private:
	std::array<uint32_t *, kMax> words_;
	size_t count_ = 0;
};
