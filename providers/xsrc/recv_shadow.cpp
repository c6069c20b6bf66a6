// XSRC_CMD_RECV_SHADOW (driver ABI revision 9): see recv_shadow.h.
#include "recv_shadow.h"

#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <new>

#include "xsrc.h"

int xsrc_rq_shadow::attach(xsrc_context *ctx, queue kind, uint32_t handle, uint32_t num_entries,
			     uint32_t max_sge) noexcept
{
#if XSRC_DRIVER_ABI_REVISION >= 9
	if (ctx->driver_abi < 9)
		return 0;  // the device checks copies against our MRs only
	if (!std::has_single_bit(num_entries) || max_sge > XSRC_MAX_RECV_SGE)
		return EPROTO;
	uint32_t stride = static_cast<uint32_t>(sizeof(xsrc_recv_shadow_entry) +
						std::max<uint32_t>(max_sge, 1) * sizeof(xsrc_sge));
	std::unique_ptr<std::byte[]> entries(new (std::nothrow) std::byte[size_t(num_entries) * stride]());
	if (!entries)
		return ENOMEM;
	struct {
		ib_uverbs_cmd_hdr hdr;
		xsrc_recv_shadow body;
	} cmd{};
	xsrc_cmd_header(cmd.hdr, XSRC_CMD_RECV_SHADOW, sizeof(cmd), 0);
	cmd.body.kind = kind == queue::qp ? XSRC_RECV_SHADOW_QP : XSRC_RECV_SHADOW_SRQ;
	cmd.body.handle = handle;
	cmd.body.num_entries = num_entries;
	cmd.body.stride = stride;
	cmd.body.addr = reinterpret_cast<uintptr_t>(entries.get());
	int saved = errno;
	ssize_t n = write(ctx->ibv_ctx.context.cmd_fd, &cmd, sizeof(cmd));
	int err = n == static_cast<ssize_t>(sizeof(cmd)) ? 0 : (n < 0 ? errno : EIO);
	errno = saved;
	if (err)
		return err;
	entries_ = std::move(entries);
	num_entries_ = num_entries;
	stride_ = stride;
	max_sge_ = std::max<uint32_t>(max_sge, 1);
	return 0;
#else
	(void)ctx, (void)kind, (void)handle, (void)num_entries, (void)max_sge;
	return 0;
#endif
}

void xsrc_rq_shadow::record(uint64_t pos, const ibv_recv_wr &wr) noexcept
{
#if XSRC_DRIVER_ABI_REVISION >= 9
	if (!num_entries_)
		return;
	std::byte *at = entries_.get() + (pos & (num_entries_ - 1)) * stride_;
	auto *entry = reinterpret_cast<xsrc_recv_shadow_entry *>(at);
	// Invalid while it changes: a copy checked meanwhile is refused.
	std::atomic_ref(entry->posted).store(0, std::memory_order_relaxed);
	std::atomic_thread_fence(std::memory_order_release);
	uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(wr.num_sge), max_sge_);
	entry->wr_id = wr.wr_id;
	entry->num_sge = n;
	auto *sge = reinterpret_cast<xsrc_sge *>(entry + 1);
	for (uint32_t i = 0; i < n; ++i)
		sge[i] = {wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
	std::atomic_ref(entry->posted).store(pos + 1, std::memory_order_release);
#else
	(void)pos, (void)wr;
#endif
}
