// XSRC_CMD_RECV_SHADOW (driver ABI revision 9): a device copy into a receive
// buffer is checked against the receive its owner posted. The receive ring
// lives in the arena, which any process of the device can write, so a WQE
// popped from it proves nothing; the owner also records each receive it
// posts in its private memory (the shadow), which no other user can write,
// and the daemon reads that record back before it writes a byte.
#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include "dispatcher_handlers.h"
#include "xsrc-abi.h"
#include "xsrc-queues.h"

namespace xsrc {
namespace {

// More entries than any receive ring the device makes.
constexpr uint32_t kMaxShadowEntries = 1u << 20;
constexpr uint32_t kMinStride = sizeof(xsrc_recv_shadow_entry) + sizeof(xsrc_sge);
constexpr uint32_t kMaxStride = sizeof(xsrc_recv_shadow_entry) + XSRC_MAX_RECV_SGE * sizeof(xsrc_sge);

// The shadow record of the caller's queue the command names.
RecvShadow *shadow_of(Context &ctx, const xsrc_recv_shadow &cmd)
{
	if (cmd.kind == XSRC_RECV_SHADOW_QP) {
		Qp *qp = lookup<Qp>(ctx, cmd.handle);
		return qp && qp->rq_off ? &qp->recv_shadow : nullptr;
	}
	Srq *srq = lookup<Srq>(ctx, cmd.handle);
	return srq && srq->srq_type != IBV_SRQT_TM ? &srq->recv_shadow : nullptr;
}

}  // namespace

int cmd_recv_shadow(Context &ctx, Caller &, const Request &req)
{
	if (abi_revision(ctx) < 9)
		return refuse(EOPNOTSUPP, "command newer than the driver ABI revision served (--abi)");
	auto cmd = load<xsrc_recv_shadow>(req.core);
	if (int err = check_comp_mask(cmd.comp_mask, 0))
		return err;
	if (int err = check_no_driver_data(req))
		return err;
	if (cmd.reserved || (cmd.kind != XSRC_RECV_SHADOW_QP && cmd.kind != XSRC_RECV_SHADOW_SRQ))
		return refuse(EINVAL, "bad kind or reserved field");
	if (!cmd.addr || !std::has_single_bit(cmd.num_entries) || cmd.num_entries > kMaxShadowEntries ||
	    cmd.stride % 8 || cmd.stride < kMinStride || cmd.stride > kMaxStride)
		return refuse(EINVAL, "bad shadow: no address, entries not a power of two, or a bad stride");
	RecvShadow *shadow = ctx.device ? shadow_of(ctx, cmd) : nullptr;
	if (!shadow)
		return refuse(EINVAL, "no such QP with a receive ring of its own, or no such basic or XRC SRQ");
	*shadow = {cmd.addr, cmd.num_entries, cmd.stride};
	return 0;
}

namespace {

// The receive the owner posted at ring position `pos`, by its shadow, into
// `out` (wr_id, SGEs): 0, or EACCES (not posted there, or reposted since)
// or ESRCH (the owner is gone).
uint32_t read_posted(Context &owner, const RecvShadow &shadow, uint64_t pos, RecvWqe &out)
{
	if (!owner.caller)
		return ESRCH;
	std::array<std::byte, kMaxStride> bytes;
	uint64_t at = shadow.addr + (pos & (shadow.num_entries - 1)) * uint64_t(shadow.stride);
	if (owner.caller->read_memory(at, std::span(bytes.data(), shadow.stride)))
		return EACCES;  // the owner unmapped its own record: nothing is posted
	xsrc_recv_shadow_entry entry;
	std::memcpy(&entry, bytes.data(), sizeof(entry));
	uint32_t room = (shadow.stride - sizeof(entry)) / sizeof(xsrc_sge);
	if (entry.posted != pos + 1 || entry.num_sge > room || entry.num_sge > XSRC_MAX_RECV_SGE)
		return EACCES;
	out.wr_id = entry.wr_id;
	out.num_sge = entry.num_sge;
	std::memcpy(out.sge, bytes.data() + sizeof(entry), entry.num_sge * sizeof(xsrc_sge));
	return 0;
}

}  // namespace

uint32_t recv_shadow_check(Context &owner, const RecvShadow &shadow, std::optional<uint64_t> pos, uint32_t lkey,
			   uint64_t addr, uint64_t length)
{
	if (!shadow.addr)
		return 0;  // an owner that keeps no shadow (older provider): its MRs decide
	if (!pos)
		return EACCES;
	RecvWqe posted;
	if (uint32_t err = read_posted(owner, shadow, *pos, posted))
		return err;
	for (uint32_t i = 0; i < posted.num_sge; ++i) {
		const xsrc_sge &sge = posted.sge[i];
		if (sge.lkey == lkey && addr >= sge.addr && length <= sge.length && addr - sge.addr <= sge.length - length)
			return 0;
	}
	return EACCES;
}

bool recv_shadow_take(Context &owner, RecvShadow &shadow, uint64_t entries, RecvWqe &rwqe)
{
	if (!shadow.addr)
		return true;  // an owner that keeps no shadow (older provider): the ring decides
	if (!rwqe.from_ring || read_posted(owner, shadow, rwqe.pos, rwqe) != 0)
		return false;
	// The record stays as it is until the owner posts into that slot again;
	// a slot rewound to a position we took names a receive that completed,
	// whose buffers may hold something else by now.
	if (shadow.taken.size() != entries)
		shadow.taken.assign(entries, 0);
	uint64_t &last = shadow.taken[rwqe.pos & (entries - 1)];
	if (last == rwqe.pos + 1)
		return false;
	last = rwqe.pos + 1;
	return true;
}

}  // namespace xsrc
