// XSRC_CMD_COPY (driver ABI revision 2): the device moves bytes between the
// caller and a peer's registered memory, for a caller that may not reach the
// peer's memory itself (another user, another PID namespace). Every decision
// is taken on the daemon's own records — the caller's QP handle, the peer QP
// it is connected to, the MR table of the peer's context — never on the
// arena, which any process of the device can write.
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <vector>

#include "command_yield.h"
#include "common/iov.h"
#include "dispatcher_handlers.h"
#include "rings.h"
#include "xsrc-abi.h"

namespace xsrc {
namespace {

// Bytes bounced through the daemon per pair of system calls.
constexpr uint64_t kBounceBytes = 1u << 20;
// How long an atomic waits for the device-wide lock before giving up
// (EAGAIN: the requester retries), so that nobody can stall the daemon.
constexpr auto kAtomicLockWait = std::chrono::milliseconds(100);
// Spins between looks at the holder and the clock while waiting for it.
constexpr unsigned kAtomicLockSpins = 1024;

bool is_atomic(uint32_t op)
{
	return op == XSRC_COPY_FETCH_ADD || op == XSRC_COPY_CMP_SWAP;
}

bool receive_state(ibv_qp_state s)
{
	return s == IBV_QPS_RTR || s == IBV_QPS_RTS || s == IBV_QPS_SQD;
}

// The remote access an RKEY operation needs of the MR and of the peer QP.
uint32_t needed_access(uint32_t op)
{
	switch (op) {
	case XSRC_COPY_WRITE:
		return IB_UVERBS_ACCESS_REMOTE_WRITE;
	case XSRC_COPY_READ:
		return IB_UVERBS_ACCESS_REMOTE_READ;
	default:
		return IB_UVERBS_ACCESS_REMOTE_ATOMIC;
	}
}

// Where the key's bytes are: the owner's process and a virtual address.
struct Target {
	Context *owner = nullptr;
	uint64_t va = 0;
};

// The MR `key` names in `owner` (a context's MR, by the daemon's table).
const Mr *find_mr(Device &dev, Context &owner, uint32_t key)
{
	auto it = dev.mrs_by_index.find(key >> 8);
	if (it == dev.mrs_by_index.end() || it->second->lkey != Lkey(key))  // an rkey is its lkey
		return nullptr;
	for (auto &[handle, obj] : owner.objects)
		if (const Mr *mr = std::get_if<Mr>(&obj); mr == it->second)
			return mr;
	return nullptr;  // another context's MR
}

// The PD's device-wide id; PdId() (0) when there is none.
PdId pd_id_of(Context &ctx, std::optional<PdHandle> pd_handle)
{
	const Pd *pd = pd_handle ? lookup<Pd>(ctx, *pd_handle) : nullptr;
	return pd ? pd->pd_id : PdId();
}

// [peer_addr, +length) inside a key's range that starts at iova (at addr in
// the owner): 0 with `t` filled, else EACCES.
uint32_t resolve_range(Context *owner, uint64_t addr, uint64_t iova, uint64_t length, const xsrc_copy &cmd,
		       Target &t)
{
	if (cmd.peer_addr < iova || cmd.length > length || cmd.peer_addr - iova > length - cmd.length)
		return EACCES;
	t.owner = owner;
	t.va = addr + (cmd.peer_addr - iova);
	return 0;
}

// Resolves the peer side: 0 with `t` filled, or the status (EACCES, ESRCH)
// explaining why the caller may not reach it. `recv_pos`: the ring position
// of the receive an LKEY copy fills (r9), checked against the owner's shadow.
uint32_t resolve_peer(Context &ctx, const Qp &own, const xsrc_copy &cmd, std::optional<uint64_t> recv_pos, Target &t)
{
	Device &dev = *ctx.device;
	if (cmd.peer_qpn < XSRC_QPN_BASE)
		return EACCES;
	ObjectRef ref = dev.qp_slots.find(cmd.peer_qpn - XSRC_QPN_BASE);
	Qp *peer = ref ? lookup<Qp>(*ref.ctx, ref.handle) : nullptr;
	if (!peer)
		return ESRCH;
	// The transports pair up as on the wire.
	uint8_t want = own.qp_type == IBV_QPT_XRC_SEND ? uint8_t(IBV_QPT_XRC_RECV) : own.qp_type;
	if (peer->qp_type != want || !receive_state(qp_current_state(dev, *peer)))
		return EACCES;
	// Connected transports (RC, UC, XRC) reach only the QP they are
	// connected to, and it must be connected back: our own record of both,
	// set by MODIFY_QP, as the data path checks the arena's copy.
	if (own.qp_type != IBV_QPT_UD &&
	    (own.attributes().dest_qp_num != cmd.peer_qpn || peer->attributes().dest_qp_num != own.qpn().value()))
		return EACCES;

	// Whose PD the key must be of, and in which context its MR lives.
	Context *owner = ref.ctx;
	PdId pd_id;
	const RecvShadow *shadow = &peer->recv_shadow;  // of the queue the receive came from
	if (peer->qp_type == IBV_QPT_XRC_RECV) {
		if (cmd.peer_srqn < XSRC_SRQN_BASE)
			return EACCES;
		ObjectRef sref = dev.srq_slots.find(cmd.peer_srqn - XSRC_SRQN_BASE);
		Srq *srq = sref ? lookup<Srq>(*sref.ctx, sref.handle) : nullptr;
		const Xrcd *xrcd = srq && srq->xrcd_handle ? lookup<Xrcd>(*sref.ctx, *srq->xrcd_handle) : nullptr;
		if (!srq || srq->srq_type != IBV_SRQT_XRC || !xrcd || !peer->shared ||
		    xrcd->xrcd_id != peer->shared->xrcd_id)
			return EACCES;
		owner = sref.ctx;
		pd_id = pd_id_of(*owner, srq->pd_handle);
		shadow = &srq->recv_shadow;
	} else if (cmd.peer_srqn) {
		return EACCES;
	} else if (cmd.key_kind == XSRC_COPY_LKEY && peer->srq_handle) {
		// Receive buffers of a QP on an SRQ are the SRQ's.
		const Srq *srq = lookup<Srq>(*owner, *peer->srq_handle);
		pd_id = srq ? pd_id_of(*owner, srq->pd_handle) : PdId();
		shadow = srq ? &srq->recv_shadow : nullptr;
	} else {
		pd_id = pd_id_of(*owner, peer->pd_handle);
	}
	if (pd_id == PdId())
		return EACCES;

	if (cmd.key_kind == XSRC_COPY_RKEY) {
		std::optional<uint64_t> va = remote_key_target(dev, *owner, *peer, pd_id, cmd.key, needed_access(cmd.op),
							       cmd.peer_addr, cmd.length);
		if (!va)
			return EACCES;
		t.owner = owner;
		t.va = *va;
		return 0;
	}
	const Mr *mr = find_mr(dev, *owner, cmd.key);
	if (!mr || pd_id_of(*owner, mr->pd_handle) != pd_id || !(mr->access & IB_UVERBS_ACCESS_LOCAL_WRITE) || !shadow)
		return EACCES;
	// Inside a receive the owner posted, not merely inside its MR: the WQE
	// the caller popped came from the arena, which anyone can forge.
	if (uint32_t status = recv_shadow_check(*owner, *shadow, recv_pos, cmd.key, cmd.peer_addr, cmd.length))
		return status;
	return resolve_range(owner, mr->addr, mr->iova, mr->length, cmd, t);
}

// Reads the caller's iovec array and checks it adds up to `length`.
int caller_iovs(Caller &caller, const xsrc_copy &cmd, std::vector<iovec> &iov)
{
	iov.resize(cmd.num_local);
	if (caller.read_memory(cmd.local_iov, std::as_writable_bytes(std::span(iov))))
		return EFAULT;
	uint64_t total = 0;
	for (const iovec &v : iov) {
		if (v.iov_len > cmd.length - total)
			return refuse(EINVAL, "iovec longer than the length");
		total += v.iov_len;
	}
	return total == cmd.length ? 0 : refuse(EINVAL, "iovec lengths do not add up to the length");
}

// Moves bytes between `bounce` and the caller's buffers `pieces`, in order.
int caller_pieces(Caller &caller, std::span<const iovec> pieces, std::byte *bounce, bool to_caller)
{
	for (const iovec &v : pieces) {
		std::span<std::byte> part(bounce, v.iov_len);
		uint64_t addr = reinterpret_cast<uintptr_t>(v.iov_base);
		if (int err = to_caller ? caller.write_memory(addr, part) : caller.read_memory(addr, part))
			return err;
		bounce += v.iov_len;
	}
	return 0;
}

// The peer's memory, through its context's caller.
int peer_memory(Context &owner, uint64_t va, std::span<std::byte> bytes, bool to_peer)
{
	if (!owner.caller)
		return ESRCH;
	return to_peer ? owner.caller->write_memory(va, bytes) : owner.caller->read_memory(va, bytes);
}

bool owner_alive(Context &owner)
{
	if (!owner.caller)
		return false;
	pollfd p{owner.caller->pidfd(), POLLIN, 0};
	return poll(&p, 1, 0) == 0;  // a pidfd turns readable when the process exits
}

// One failed transfer with the peer: gone, or its memory no longer there.
uint32_t peer_status(Context &owner)
{
	return owner_alive(owner) ? EACCES : ESRCH;
}

// The caller's QP for a copy, able to send; nullptr when it is not.
const Qp *sending_qp(Context &ctx, const xsrc_copy &cmd)
{
	const Qp *own = ctx.device ? lookup<Qp>(ctx, cmd.qp_handle) : nullptr;
	if (!own || own->qp_type == IBV_QPT_XRC_RECV)
		return nullptr;
	ibv_qp_state state = qp_current_state(*ctx.device, *own);
	return state == IBV_QPS_RTS || state == IBV_QPS_SQD ? own : nullptr;
}

// After other commands ran (command_yield()): the rest of the copy, from
// byte `done`, checked again from scratch — the device, our QP, the peer,
// its key and range may have changed or gone since. `t` keeps addressing
// byte 0 of the copy.
uint32_t revalidate(Context &ctx, const xsrc_copy &cmd, std::optional<uint64_t> recv_pos, uint64_t done, Target &t)
{
	const Qp *own = sending_qp(ctx, cmd);
	if (!own)
		return ESRCH;
	xsrc_copy rest = cmd;
	rest.peer_addr += done;
	rest.length -= done;
	if (uint32_t status = resolve_peer(ctx, *own, rest, recv_pos, t))
		return status;
	t.va -= done;
	return owner_alive(*t.owner) ? 0 : ESRCH;
}

// WRITE / READ through a bounce buffer of the daemon's, a piece at a time;
// between pieces other contexts' commands may run.
void move_bytes(Context &ctx, Caller &caller, const xsrc_copy &cmd, std::optional<uint64_t> recv_pos,
		const std::vector<iovec> &iov, Target &t, xsrc_copy_resp &resp)
{
	std::vector<std::byte> bounce(std::min<uint64_t>(cmd.length, kBounceBytes));
	bool write = cmd.op == XSRC_COPY_WRITE;
	for (uint64_t done = 0; done < cmd.length;) {
		if (done) {
			command_yield();
			if ((resp.status = revalidate(ctx, cmd, recv_pos, done, t)))
				return;
		}
		uint64_t len = std::min<uint64_t>(cmd.length - done, bounce.size());
		std::array<iovec, XSRC_COPY_MAX_IOV> mine;
		std::span<const iovec> pieces(mine.data(), iov_slice(iov, done, len, mine.data()));
		std::span<std::byte> buf(bounce.data(), len);
		if (write ? caller_pieces(caller, pieces, buf.data(), false)
			  : peer_memory(*t.owner, t.va + done, buf, false)) {
			resp.status = write ? EFAULT : peer_status(*t.owner);
			return;
		}
		if (write ? peer_memory(*t.owner, t.va + done, buf, true)
			  : caller_pieces(caller, pieces, buf.data(), true)) {
			resp.status = write ? peer_status(*t.owner) : EFAULT;
			return;
		}
		done += len;
		resp.bytes = done;
	}
}

// The arena's lock for the 8 bytes at `va` in `pid` (the hash the
// providers use, peer_memory.cpp), held while we read-modify-write.
class ArenaAtomicLock {
public:
	ArenaAtomicLock(Arena &arena, pid_t pid, uint64_t va)
	{
		uint64_t hash = (uint64_t(uint32_t(pid)) << 40) ^ (va >> 3);
		word_ = &arena.atomic_lock(static_cast<uint32_t>(hash % XSRC_ATOMIC_LOCKS));
		auto lock = atomic(*word_);
		uint32_t me = static_cast<uint32_t>(getpid());
		auto deadline = std::chrono::steady_clock::now() + kAtomicLockWait;
		for (unsigned spins = 0;; ++spins) {
			uint32_t holder = 0;
			if (lock.compare_exchange_weak(holder, me, std::memory_order_acquire)) {
				held_ = true;
				return;
			}
			if (spins % kAtomicLockSpins == kAtomicLockSpins - 1) {
				// A holder that died is taken over, as the providers do.
				if (holder && kill(static_cast<pid_t>(holder), 0) != 0 && errno == ESRCH &&
				    lock.compare_exchange_strong(holder, me, std::memory_order_acquire)) {
					held_ = true;
					return;
				}
				if (std::chrono::steady_clock::now() > deadline)
					return;
				sched_yield();
			}
		}
	}
	~ArenaAtomicLock()
	{
		if (held_)
			store_release<uint32_t>(*word_, 0);
	}
	ArenaAtomicLock(const ArenaAtomicLock &) = delete;
	ArenaAtomicLock &operator=(const ArenaAtomicLock &) = delete;
	bool held() const { return held_; }

private:
	uint32_t *word_ = nullptr;
	bool held_ = false;
};

}  // namespace

int device_atomic(Device &dev, Context &owner, uint64_t va, bool fetch_add, uint64_t compare_add, uint64_t swap,
		  uint64_t &original)
{
	ArenaAtomicLock lock(*dev.arena, owner.owner, va);
	if (!lock.held())
		return EAGAIN;
	if (peer_memory(owner, va, std::as_writable_bytes(std::span(&original, 1)), false))
		return static_cast<int>(peer_status(owner));
	uint64_t value = original;
	if (fetch_add)
		value = original + compare_add;
	else if (original == compare_add)
		value = swap;
	if (value != original && peer_memory(owner, va, std::as_writable_bytes(std::span(&value, 1)), true))
		return static_cast<int>(peer_status(owner));
	return 0;
}

int device_atomic_write(Device &dev, Context &owner, uint64_t va, std::span<const std::byte, 8> value)
{
	ArenaAtomicLock lock(*dev.arena, owner.owner, va);
	if (!lock.held())
		return EAGAIN;
	std::array<std::byte, 8> bytes;
	std::copy(value.begin(), value.end(), bytes.begin());
	if (peer_memory(owner, va, bytes, true))
		return static_cast<int>(peer_status(owner));
	return 0;
}

namespace {

// FETCH_ADD / CMP_SWAP. Returns EAGAIN when the lock stayed busy.
int atomic_op(Context &ctx, Caller &caller, const xsrc_copy &cmd, const std::vector<iovec> &iov,
	      const Target &t, xsrc_copy_resp &resp)
{
	uint64_t original = 0;
	int err = device_atomic(*ctx.device, *t.owner, t.va, cmd.op == XSRC_COPY_FETCH_ADD, cmd.compare_add, cmd.swap,
				original);
	if (err == EAGAIN)
		return refuse(EAGAIN, "the arena's atomic lock is held too long");
	if (err) {
		resp.status = static_cast<uint32_t>(err);
		return 0;
	}
	if (caller_pieces(caller, iov, reinterpret_cast<std::byte *>(&original), true)) {
		resp.status = EFAULT;  // the remote side is done: as a lost response
		return 0;
	}
	resp.bytes = 8;
	return 0;
}

}  // namespace

std::optional<uint64_t> remote_key_target(Device &dev, Context &owner, const Qp &qp, PdId pd, uint32_t rkey,
					  uint32_t need, uint64_t addr, uint64_t length)
{
	// The responder QP must allow the operation too (IBTA class C).
	if ((qp.attributes().access_flags & need) != need)
		return std::nullopt;
	auto in_range = [&](uint64_t base, uint64_t iova, uint64_t key_length) -> std::optional<uint64_t> {
		if (addr < iova || length > key_length || addr - iova > key_length - length)
			return std::nullopt;
		return base + (addr - iova);
	};
	// An rkey may name a bound window (r4) instead: its range, rights, PD
	// and (type 2) the QP it was bound on, as the daemon recorded the bind.
	if (const Mw *mw = mw_find(dev, owner, rkey)) {
		if (pd_id_of(owner, mw->pd_handle) != pd || (mw->access & need) != need ||
		    (mw->type == IBV_MW_TYPE_2 && mw->qpn != qp.qpn()))
			return std::nullopt;
		return in_range(mw->addr, mw->iova, mw->length);
	}
	const Mr *mr = find_mr(dev, owner, rkey);
	if (!mr || pd_id_of(owner, mr->pd_handle) != pd || (mr->access & need) != need)
		return std::nullopt;
	return in_range(mr->addr, mr->iova, mr->length);
}

int cmd_copy(Context &ctx, Caller &caller, const Request &req)
{
	if (abi_revision(ctx) < 2)
		return refuse(EOPNOTSUPP, "command newer than the driver ABI revision served (--abi)");
	auto cmd = load<xsrc_copy>(req.core);
	if (int err = check_comp_mask(cmd.comp_mask, 0))
		return err;
	// r9: the ring position of the receive an LKEY copy fills.
	std::optional<uint64_t> recv_pos;
	if (abi_revision(ctx) < 9) {
		if (int err = check_no_driver_data(req))
			return err;
	} else if (!req.driver.empty()) {
		xsrc_copy_recv recv{};
		if (int err = load_driver_request(req, recv, 0))
			return err;
		if (int err = check_comp_mask(recv.comp_mask, XSRC_COPY_RECV_MASK_POS))
			return err;
		if (recv.reserved || ((recv.comp_mask & XSRC_COPY_RECV_MASK_POS) && cmd.key_kind != XSRC_COPY_LKEY))
			return refuse(EINVAL, "a reserved field, or a receive position for a copy that fills no receive");
		if (recv.comp_mask & XSRC_COPY_RECV_MASK_POS)
			recv_pos = recv.recv_pos;
	}
	if (cmd.op < XSRC_COPY_WRITE || cmd.op > XSRC_COPY_CMP_SWAP ||
	    (cmd.key_kind != XSRC_COPY_RKEY && cmd.key_kind != XSRC_COPY_LKEY) ||
	    cmd.num_local > XSRC_COPY_MAX_IOV || cmd.length > XSRC_MAX_MSG_SIZE)
		return refuse(EINVAL, "bad op, key kind, reserved field, or limit: iovec count or length");
	// A receive buffer only ever takes a payload; atomics are 8 aligned bytes.
	if (cmd.key_kind == XSRC_COPY_LKEY && cmd.op != XSRC_COPY_WRITE)
		return refuse(EINVAL, "a local key for an op that is not a write");
	if (is_atomic(cmd.op) && (cmd.length != 8 || cmd.num_local != 1 || (cmd.peer_addr & 7)))
		return refuse(EINVAL, "atomic not of 8 aligned bytes from one iovec");
	if (req.resp_len < sizeof(xsrc_copy_resp))
		return refuse(ENOSPC, "no room for the response");

	// The caller acts through one of its own QPs, able to send.
	const Qp *own = sending_qp(ctx, cmd);
	if (!own)
		return refuse(EINVAL, "no such QP handle, an XRC receive QP, or a QP not in RTS or SQD");
	// UD moves nothing but payloads into receives.
	if (own->qp_type == IBV_QPT_UD && cmd.key_kind != XSRC_COPY_LKEY)
		return refuse(EINVAL, "a UD QP names a remote key");

	std::vector<iovec> iov;
	xsrc_copy_resp resp{};
	if (int err = caller_iovs(caller, cmd, iov)) {
		if (err != EFAULT)
			return err;
		resp.status = EFAULT;
		return respond(caller, req, as_bytes_of(resp));
	}
	Target t;
	resp.status = resolve_peer(ctx, *own, cmd, recv_pos, t);
	if (!resp.status && cmd.length) {
		if (!owner_alive(*t.owner))
			resp.status = ESRCH;
		else if (is_atomic(cmd.op)) {
			if (int err = atomic_op(ctx, caller, cmd, iov, t, resp))
				return err;
		} else {
			move_bytes(ctx, caller, cmd, recv_pos, iov, t, resp);
		}
	}
	return respond(caller, req, as_bytes_of(resp));
}

}  // namespace xsrc
