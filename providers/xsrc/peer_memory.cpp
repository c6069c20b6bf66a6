// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The shared-memory engine's access to a peer's memory (peer_memory.h).
#include "peer_memory.h"

#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "xsrc.h"
#include "common/pid_lock.h"

using xsrc::atomic;

// --- the MR table ----------------------------------------------------------

namespace {

const xsrc_mr_entry *live_mr_at(xsrc_mr_entry *mr, uint32_t key)
{
	if (!mr || atomic(mr->key).load(std::memory_order_acquire) != key || key == 0)
		return nullptr;
	return mr;
}

}  // namespace

// A window's key (r4) is an rkey only: as an lkey it names nothing.
const xsrc_mr_entry *xsrc_peer_live_mr(const xsrc::Arena &arena, xsrc::Lkey key)
{
	const xsrc_mr_entry *mr = live_mr_at(arena.mr(key), key.value());
	return mr && mr->mw_type == 0 ? mr : nullptr;
}

const xsrc_mr_entry *xsrc_peer_live_mr(const xsrc::Arena &arena, xsrc::Rkey key)
{
	return live_mr_at(arena.mr(key), key.value());
}

bool xsrc_peer_mr_range(const xsrc_mr_entry *mr, uint32_t owner_pid, xsrc::PdId pd, uint64_t addr,
			uint64_t len, uint32_t access, uint64_t &va)
{
	if (!mr || mr->owner_pid != owner_pid || mr->pd_id != pd.value())
		return false;
	if ((mr->access & access) != access)
		return false;
	if (addr < mr->iova || len > mr->length || addr - mr->iova > mr->length - len)
		return false;
	va = mr->addr + (addr - mr->iova);
	return true;
}

bool xsrc_peer_local_buffers(xsrc_context *ctx, const xsrc_qp *qp, const xsrc_send_wqe &wqe, bool write,
			     xsrc_local_buffers &out)
{
	out.count = 0;
	out.total = 0;
	if (wqe.inline_len || (wqe.flags & IBV_SEND_INLINE)) {
		out.iov[0] = {wqe.inline_data, wqe.inline_len};
		out.count = wqe.inline_len ? 1 : 0;
		out.total = wqe.inline_len;
		return true;
	}
	xsrc::PdId pd(qp->entry->pd_id);
	uint32_t access = write ? IBV_ACCESS_LOCAL_WRITE : 0;
	for (const ibv_sge *sge = wqe.sge_begin(); sge != wqe.sge_end(); ++sge) {
		if (sge->length == 0)
			continue;
		uint64_t va;
		const xsrc_mr_entry *mr = xsrc_peer_live_mr(ctx->arena, xsrc::Lkey(sge->lkey));
		if (!xsrc_peer_mr_range(mr, ctx->pid, pd, sge->addr, sge->length, access, va))
			return false;
		// An ODP MR's pages may be gone: found now, before the responder
		// sees the message, the fault is ours (and we never touch a hole).
		if ((mr->access & IBV_ACCESS_ON_DEMAND) && !xsrc_odp_mapped(va, sge->length))
			return false;
		out.iov[out.count++] = {reinterpret_cast<void *>(va), sge->length};
		out.total += sge->length;
	}
	return true;
}

ibv_wc_status xsrc_peer_recv_buffers(const xsrc::Arena &arena, const xsrc::RecvWqe &rwqe, uint32_t owner_pid,
				     xsrc::PdId pd, uint64_t len, std::array<iovec, XSRC_MAX_RECV_SGE> &iov,
				     size_t &count, bool &on_demand)
{
	uint64_t capacity = 0;
	count = 0;
	on_demand = false;
	for (uint32_t i = 0; i < rwqe.num_sge && capacity < len; ++i) {
		const xsrc_sge &sge = rwqe.sge[i];
		if (sge.length == 0)
			continue;
		uint64_t take = std::min<uint64_t>(sge.length, len - capacity);
		uint64_t va;
		const xsrc_mr_entry *mr = xsrc_peer_live_mr(arena, xsrc::Lkey(sge.lkey));
		if (!xsrc_peer_mr_range(mr, owner_pid, pd, sge.addr, take, IBV_ACCESS_LOCAL_WRITE, va))
			return IBV_WC_LOC_PROT_ERR;
		on_demand |= (mr->access & IBV_ACCESS_ON_DEMAND) != 0;
		iov[count++] = {reinterpret_cast<void *>(va), take};
		capacity += take;
	}
	return capacity < len ? IBV_WC_LOC_LEN_ERR : IBV_WC_SUCCESS;
}

// --- moving bytes ----------------------------------------------------------

xsrc_peer_path xsrc_peer_path_to(const xsrc_context *ctx, uint32_t pid)
{
	if (ctx->direct && !ctx->denied.contains(pid))
		return xsrc_peer_path::direct;
	return ctx->can_copy ? xsrc_peer_path::device : xsrc_peer_path::none;
}

xsrc_peer_path xsrc_peer_refused(xsrc_context *ctx, uint32_t pid)
{
	ctx->denied.add(pid);
	return ctx->can_copy ? xsrc_peer_path::device : xsrc_peer_path::none;
}

namespace {

// What one process_vm_readv/writev call returned, as peer_memory.h says.
int vm_result(ssize_t n, uint64_t total)
{
	if (n < 0 && (errno == ESRCH || errno == EPERM))
		return errno;
	return n >= 0 && static_cast<uint64_t>(n) == total ? 0 : EFAULT;
}

}  // namespace

int xsrc_peer_write(pid_t pid, const iovec *local, size_t nlocal, const iovec *remote, size_t nremote,
		    uint64_t total)
{
	if (total == 0)
		return 0;
	return vm_result(process_vm_writev(pid, local, nlocal, remote, nremote, 0), total);
}

int xsrc_peer_read(pid_t pid, const iovec *local, size_t nlocal, const iovec *remote, size_t nremote,
		   uint64_t total)
{
	if (total == 0)
		return 0;
	return vm_result(process_vm_readv(pid, local, nlocal, remote, nremote, 0), total);
}

#if XSRC_DRIVER_ABI_REVISION >= 2
namespace {

uint32_t copy_op(xsrc_peer_copy::op op)
{
	switch (op) {
	case xsrc_peer_copy::op::read:
		return XSRC_COPY_READ;
	case xsrc_peer_copy::op::fetch_add:
		return XSRC_COPY_FETCH_ADD;
	case xsrc_peer_copy::op::cmp_swap:
		return XSRC_COPY_CMP_SWAP;
	case xsrc_peer_copy::op::write:
		break;
	}
	return XSRC_COPY_WRITE;
}

}  // namespace

int xsrc_peer_device_copy(xsrc_context *ctx, xsrc_qp *qp, const xsrc_peer_copy &copy, const iovec *local,
			  size_t nlocal, uint64_t length) noexcept
{
	// More pieces than the device takes: gather them here first (the slow
	// path of a slow path; without memory for it the peer counts as
	// unreachable this time, and the WQE is retried).
	std::unique_ptr<unsigned char[]> gathered;
	iovec one;
	if (nlocal > XSRC_COPY_MAX_IOV) {
		if (copy.what != xsrc_peer_copy::op::write)
			return EFAULT;
		gathered.reset(new (std::nothrow) unsigned char[length]);
		if (!gathered)
			return EAGAIN;
		size_t off = 0;
		for (size_t i = 0; i < nlocal; ++i) {
			std::memcpy(gathered.get() + off, local[i].iov_base, local[i].iov_len);
			off += local[i].iov_len;
		}
		one = {gathered.get(), length};
		local = &one;
		nlocal = 1;
	}
	struct {
		ib_uverbs_cmd_hdr hdr;
		xsrc_copy body;
#if XSRC_DRIVER_ABI_REVISION >= 9
		xsrc_copy_recv recv;  // r9: sent only to a device that knows it
#endif
	} cmd{};
	size_t cmd_bytes = offsetof(decltype(cmd), body) + sizeof(cmd.body);
#if XSRC_DRIVER_ABI_REVISION >= 9
	if (copy.recv_pos && ctx->driver_abi >= 9) {
		cmd.recv.comp_mask = XSRC_COPY_RECV_MASK_POS;
		cmd.recv.recv_pos = *copy.recv_pos;
		cmd_bytes = sizeof(cmd);
	}
#endif
	xsrc_copy_resp resp{};
	xsrc_cmd_header(cmd.hdr, XSRC_CMD_COPY, cmd_bytes, sizeof(resp));
	cmd.body.response = reinterpret_cast<uintptr_t>(&resp);
	cmd.body.op = copy_op(copy.what);
	cmd.body.key_kind = copy.kind == xsrc_peer_copy::key_kind::lkey ? XSRC_COPY_LKEY : XSRC_COPY_RKEY;
	cmd.body.key = copy.key;
	cmd.body.qp_handle = qp->vqp.qp.handle;
	cmd.body.peer_qpn = copy.peer_qpn.value();
	cmd.body.peer_srqn = copy.peer_srqn.value();
	cmd.body.peer_addr = copy.peer_addr;
	cmd.body.length = length;
	cmd.body.local_iov = reinterpret_cast<uintptr_t>(local);
	cmd.body.num_local = static_cast<uint32_t>(nlocal);
	cmd.body.compare_add = copy.compare_add;
	cmd.body.swap = copy.swap;
	int saved = errno;
	ssize_t n = write(ctx->ibv_ctx.context.cmd_fd, &cmd, cmd_bytes);
	errno = saved;
	if (n != static_cast<ssize_t>(cmd_bytes))
		return EAGAIN;
	return static_cast<int>(resp.status);
}
#else
int xsrc_peer_device_copy(xsrc_context *, xsrc_qp *, const xsrc_peer_copy &, const iovec *, size_t,
			  uint64_t) noexcept
{
	return EAGAIN;  // an r1 build has no such command: the peer is unreachable
}
#endif


// --- the atomics lock ------------------------------------------------------

namespace {

// Which lock word guards a peer's 8 bytes at `va`.
uint64_t atomic_lock_hash(uint32_t pid, uint64_t va)
{
	constexpr unsigned kPidShift = 40, kWordShift = 3;  // 8-byte words of one process
	return (uint64_t(pid) << kPidShift) ^ (va >> kWordShift);
}

}  // namespace

xsrc_peer_atomic_lock::xsrc_peer_atomic_lock(const xsrc::Arena &arena, uint32_t pid, uint64_t va, uint32_t me)
	: word_(arena.atomic_lock(atomic_lock_hash(pid, va))), me_(me)
{
	xsrc::pid_lock_take(*word_, me_);
}

xsrc_peer_atomic_lock::~xsrc_peer_atomic_lock()
{
	xsrc::pid_lock_release(*word_);
}

xsrc_peer_atomic_locks::xsrc_peer_atomic_locks(const xsrc::Arena &arena, uint32_t pid, const uint64_t *va,
					       size_t n, uint32_t me)
{
	for (size_t i = 0; i < n && count_ < kMax; ++i)
		words_[count_++] = arena.atomic_lock(atomic_lock_hash(pid, va[i]));
	std::sort(words_.begin(), words_.begin() + count_);
	count_ = static_cast<size_t>(std::unique(words_.begin(), words_.begin() + count_) - words_.begin());
	for (size_t i = 0; i < count_; ++i)
		xsrc::pid_lock_take(*words_[i], me);
}

xsrc_peer_atomic_locks::~xsrc_peer_atomic_locks()
{
	for (size_t i = count_; i-- > 0;)
		xsrc::pid_lock_release(*words_[i]);
}
