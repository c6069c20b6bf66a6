// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Memory windows (driver ABI r4): allocation through the device, and the
// work requests that bind and invalidate them. A bind or LOCAL_INV executes
// in send-queue order, as an HCA's would: at its turn the provider asks the
// device (XSRC_CMD_BIND_MW, XSRC_CMD_INVALIDATE), which checks it on its own
// records and publishes the window in the arena's MR table, where every rkey
// check of the data path finds it. The requester completes it.
#include "xsrc.h"

#include <cstring>
#include <new>

#if XSRC_DRIVER_ABI_REVISION >= 4
namespace {

// One private command without a response: 0 or the device's errno.
template <typename T>
int mw_command(xsrc_context *ctx, uint32_t command, const T &body) noexcept
{
	struct {
		ib_uverbs_cmd_hdr hdr;
		T body;
	} cmd{};
	xsrc_cmd_header(cmd.hdr, command, sizeof(cmd), 0);
	cmd.body = body;
	int saved = errno;
	ssize_t n = write(ctx->ibv_ctx.context.cmd_fd, &cmd, sizeof(cmd));
	int err = n == static_cast<ssize_t>(sizeof(cmd)) ? 0 : (n < 0 ? errno : EIO);
	errno = saved;
	return err;
}

verbs_context *mw_vctx(const xsrc_qp *qp)
{
	return &to_xsrc_ctx(qp->vqp.qp.context)->ibv_ctx;
}

}  // namespace

ibv_mw *xsrc_mw_alloc(ibv_pd *pd, enum ibv_mw_type type)
{
	verbs_context *vctx = &to_xsrc_ctx(pd->context)->ibv_ctx;
	if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
		verbs_err(vctx, "alloc_mw: there is no window type %d\n", type);
		errno = EINVAL;
		return nullptr;
	}
	auto *mw = new (std::nothrow) ibv_mw{};
	if (!mw) {
		errno = ENOMEM;
		return nullptr;
	}
	struct ibv_alloc_mw cmd{};
	ib_uverbs_alloc_mw_resp resp{};
	if (int err = ibv_cmd_alloc_mw(pd, type, mw, &cmd, sizeof(cmd), &resp,
				       sizeof(resp))) {
		verbs_err(vctx, "alloc_mw: the device refused a type %d window: %s\n", type, strerror(err));
		delete mw;
		errno = err;
		return nullptr;
	}
	return mw;
}

int xsrc_mw_dealloc(ibv_mw *mw)
{
	if (int err = xsrc_destroy_status(to_xsrc_ctx(mw->context), ibv_cmd_dealloc_mw(mw))) {
		verbs_err(&to_xsrc_ctx(mw->context)->ibv_ctx, "dealloc_mw: the device refused: %s\n", strerror(err));
		return err;
	}
	delete mw;
	return 0;
}

void xsrc_mw_wqe_bind(xsrc_send_wqe &wqe, const ibv_mw *mw, uint32_t rkey, const ibv_mw_bind_info &info)
{
	wqe.opcode = IBV_WR_BIND_MW;
	wqe.rkey = xsrc::Rkey(rkey);
	wqe.mw_handle = mw ? mw->handle : XSRC_NO_HANDLE;
	wqe.mr_handle = info.mr ? info.mr->handle : XSRC_NO_HANDLE;
	wqe.remote_addr = info.addr;
	wqe.bind_length = info.length;
	wqe.mw_access = static_cast<uint32_t>(info.mw_access_flags);
}

// ibv_bind_mw: a type 1 window is bound by a work request on the QP's send
// queue; its rkey's key byte moves on at once (the old rkey is dead once the
// bind executes), as mlx5 and rxe do.
int xsrc_mw_bind(ibv_qp *ibqp, ibv_mw *mw, ibv_mw_bind *bind) noexcept
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	const ibv_mw_bind_info &info = bind->bind_info;
	if (!info.mr && (info.addr || info.length)) {
		verbs_debug(mw_vctx(qp), "bind_mw: QP %u: a range without an MR\n", qp->qpn.value());
		return EINVAL;
	}
	std::lock_guard guard(qp->sq_lock);
	xsrc_send_wqe &wqe = qp->sq.next();
	wqe.clear();
	wqe.wr_id = bind->wr_id;
	wqe.flags = static_cast<unsigned>(bind->send_flags);
	uint32_t rkey = ibv_inc_rkey(mw->rkey);
	xsrc_mw_wqe_bind(wqe, mw, rkey, info);
	if (int err = xsrc_qp_validate_wqe(qp, wqe))
		return err;
	xsrc_requester_post(qp);
	mw->rkey = rkey;
	return 0;
}

xsrc_attempt_result xsrc_mw_execute_local(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe) noexcept
{
	if (wqe.opcode == IBV_WR_BIND_MW) {
		xsrc_bind_mw b{};
		b.qp_handle = qp->vqp.qp.handle;
		b.mw_handle = wqe.mw_handle;
		b.mr_handle = wqe.mr_handle;
		b.rkey = wqe.rkey.value();
		b.access = wqe.mw_access;
		b.addr = wqe.remote_addr;
		b.length = wqe.bind_length;
		if (int err = mw_command(ctx, XSRC_CMD_BIND_MW, b)) {
			verbs_debug(&ctx->ibv_ctx, "bind_mw: QP %u: the device refused the bind of rkey 0x%x: %s\n",
				    qp->qpn.value(), b.rkey, strerror(err));
			return xsrc_attempt_result::failed(IBV_WC_MW_BIND_ERR);
		}
		return xsrc_attempt_result::done(0);
	}
	xsrc_invalidate inv{};
	inv.kind = XSRC_INVALIDATE_LOCAL;
	inv.qp_handle = qp->vqp.qp.handle;
	inv.rkey = wqe.invalidate_rkey;
	if (int err = mw_command(ctx, XSRC_CMD_INVALIDATE, inv)) {
		verbs_debug(&ctx->ibv_ctx, "local_inv: QP %u: the device refused to invalidate rkey 0x%x: %s\n",
			    qp->qpn.value(), inv.rkey, strerror(err));
		return xsrc_attempt_result::failed(IBV_WC_LOC_QP_OP_ERR);
	}
	return xsrc_attempt_result::done(0);
}

bool xsrc_mw_remote_invalidate(xsrc_context *ctx, xsrc_qp *qp, xsrc::Qpn peer, uint32_t rkey) noexcept
{
	xsrc_invalidate inv{};
	inv.kind = XSRC_INVALIDATE_REMOTE;
	inv.qp_handle = qp->vqp.qp.handle;
	inv.rkey = rkey;
	inv.peer_qpn = peer.value();
	if (int err = mw_command(ctx, XSRC_CMD_INVALIDATE, inv)) {
		verbs_debug(&ctx->ibv_ctx, "send_with_inv: QP %u: the device refused to invalidate rkey 0x%x at QP %u: %s\n",
			    qp->qpn.value(), rkey, peer.value(), strerror(err));
		return false;
	}
	return true;
}
#else
// A provider built against an older driver ABI has no windows: the
// libibverbs stubs answer EOPNOTSUPP, and no such work request is accepted.
void xsrc_mw_wqe_bind(xsrc_send_wqe &, const ibv_mw *, uint32_t, const ibv_mw_bind_info &) {}

xsrc_attempt_result xsrc_mw_execute_local(xsrc_context *, xsrc_qp *, const xsrc_send_wqe &) noexcept
{
	return xsrc_attempt_result::failed(IBV_WC_LOC_QP_OP_ERR);
}

bool xsrc_mw_remote_invalidate(xsrc_context *, xsrc_qp *, xsrc::Qpn, uint32_t) noexcept
{
	return false;
}
#endif
