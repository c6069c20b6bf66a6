// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// UD multicast (driver ABI r3): attaching a QP to a group and detaching it
// go to the device, which owns membership; a send to a group reads the
// group's members from the arena's multicast table, without a lock
// (kernel-abi/xsrc-queues.h: a sequence lock per entry), and the
// shared-memory engine delivers to each (shm_responder.cpp).
#include "xsrc.h"

#include <arpa/inet.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace {

// Reads of one entry while the daemon rewrites it, before giving up on it
// (a daemon that died mid-write leaves it odd for ever).
constexpr unsigned kMaxReadAttempts = 1024, kAttemptsPerYield = 16;

const char *mcast_refusal_reason(const ibv_qp *qp, const ibv_gid &gid, int err)
{
	if (err == EINVAL && qp->qp_type != IBV_QPT_UD)
		return "multicast needs a UD QP";
	if (err == EINVAL && !xsrc_is_multicast_gid(gid.raw))
		return "not a multicast GID (ff00::/8 or ::ffff:224.0.0.0/4)";
	if (err == ENOMEM)
		return "a multicast limit of the device (ibv_devinfo -v: max_mcast_*)";
	return strerror(err);
}

void log_mcast_gid(verbs_context *vctx, const char *op, const ibv_qp *qp, const ibv_gid &gid, int err)
{
	char text[INET6_ADDRSTRLEN] = "?";
	inet_ntop(AF_INET6, gid.raw, text, sizeof(text));
	verbs_err(vctx, "%s: QP %u, group %s: %s\n", op, qp->qp_num, text, mcast_refusal_reason(qp, gid, err));
}

}  // namespace

int xsrc_attach_mcast(ibv_qp *qp, const ibv_gid *gid, uint16_t lid)
{
	auto *ctx = to_xsrc_ctx(qp->context);
	if (!ctx->mcast) {
		verbs_err(&ctx->ibv_ctx, "attach_mcast: the device has no multicast (driver ABI revision < 3)\n");
		return EOPNOTSUPP;
	}
	int err = ibv_cmd_attach_mcast(qp, gid, lid);
	if (err)
		log_mcast_gid(&ctx->ibv_ctx, "attach_mcast", qp, *gid, err);
	return err;
}

int xsrc_detach_mcast(ibv_qp *qp, const ibv_gid *gid, uint16_t lid)
{
	auto *ctx = to_xsrc_ctx(qp->context);
	if (!ctx->mcast) {
		verbs_err(&ctx->ibv_ctx, "detach_mcast: the device has no multicast (driver ABI revision < 3)\n");
		return EOPNOTSUPP;
	}
	int err = ibv_cmd_detach_mcast(qp, gid, lid);
	if (err == EINVAL)
		verbs_err(&ctx->ibv_ctx, "detach_mcast: QP %u is not attached to that group\n", qp->qp_num);
	else if (err)
		log_mcast_gid(&ctx->ibv_ctx, "detach_mcast", qp, *gid, err);
	return err;
}

size_t xsrc_mcast_members(const xsrc_context *ctx, const ibv_gid &gid, uint32_t (&out)[XSRC_MCAST_GROUP_QPS]) noexcept
{
	xsrc_mcast_table *table = ctx->mcast;
	if (!table)
		return 0;
	uint32_t end = std::min<uint32_t>(xsrc::load_acquire(table->scan_end), XSRC_MCAST_GROUPS);
	auto *groups = reinterpret_cast<xsrc_mcast_group *>(table + 1);
	for (uint32_t i = 0; i < end; ++i) {
		xsrc_mcast_group &g = groups[i];
		auto seq = xsrc::atomic(g.seq);
		for (unsigned attempt = 0; attempt < kMaxReadAttempts; ++attempt) {
			uint32_t before = seq.load(std::memory_order_acquire);
			if (before & 1) {
				if (attempt % kAttemptsPerYield == kAttemptsPerYield - 1)
					sched_yield();
				continue;
			}
			uint32_t n = std::min<uint32_t>(xsrc::atomic(g.num_qps).load(std::memory_order_relaxed),
							XSRC_MCAST_GROUP_QPS);
			bool match = n && std::memcmp(g.gid, gid.raw, sizeof(g.gid)) == 0;
			if (match)
				std::memcpy(out, g.qpns, n * sizeof(out[0]));
			std::atomic_thread_fence(std::memory_order_acquire);
			if (seq.load(std::memory_order_relaxed) != before)
				continue;  // rewritten while we read it
			if (match)
				return n;
			break;
		}
	}
	return 0;
}
