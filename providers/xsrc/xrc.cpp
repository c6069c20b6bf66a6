// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// XRC: domains shared across processes by file, and XRC receive QPs opened
// by QPN from any process of the domain. The send side and the XRC SRQs are
// ordinary QPs and SRQs (qp.cpp, srq.cpp); the engine routes XRC messages by
// the SRQ number each carries (shm_responder.cpp).
#include "xsrc.h"

#include <new>

namespace {

ibv_qp *xrc_open_qp(ibv_context *ibctx, ibv_qp_open_attr *attr)
{
	xsrc_context *ctx = to_xsrc_ctx(ibctx);
	auto *qp = new (std::nothrow) xsrc_qp{};
	if (!qp) {
		verbs_err(&ctx->ibv_ctx, "open_qp: no memory for the QP\n");
		errno = ENOMEM;
		return nullptr;
	}
	struct ibv_open_qp cmd{};
	verbs_drv_buf<ib_uverbs_create_qp_resp, xsrc_create_qp_resp> resp;
	if (int err = ibv_cmd_open_qp(ibctx, &qp->vqp, sizeof(qp->vqp), attr, &cmd, sizeof(cmd),
				      resp.core(), resp.size)) {
		verbs_err(&ctx->ibv_ctx, "open_qp: the device refused QP %u of type %d: %s\n", attr->qp_num,
			  attr->qp_type, strerror(err));
		delete qp;
		errno = err;
		return nullptr;
	}
	qp->qpn = xsrc::Qpn(qp->vqp.qp.qp_num);
	qp->entry = ctx->arena.qp(qp->qpn);
	qp->type = IBV_QPT_XRC_RECV;
	int err = 0;
	if (!qp->entry || qp->entry->qpn != qp->qpn.value()) {
		verbs_err(&ctx->ibv_ctx, "open_qp: QP %u: the device answered no QP table entry\n", qp->qpn.value());
		err = EPROTO;
	} else {
		err = xsrc_qp_prepare_send(ctx, qp, false);
	}
	if (err) {
		ibv_cmd_destroy_qp(&qp->vqp.qp);
		delete qp;
		errno = err;
		return nullptr;
	}
	xsrc_context_add_qp(ctx, qp);
	return &qp->vqp.qp;
}

}  // namespace

ibv_xrcd *xsrc_open_xrcd(ibv_context *ibctx, ibv_xrcd_init_attr *attr)
{
	verbs_context *vctx = &to_xsrc_ctx(ibctx)->ibv_ctx;
	auto *xrcd = new (std::nothrow) verbs_xrcd{};
	if (!xrcd) {
		verbs_err(vctx, "open_xrcd: no memory for the XRCD\n");
		errno = ENOMEM;
		return nullptr;
	}
	struct ibv_open_xrcd cmd{};
	ib_uverbs_open_xrcd_resp resp{};
	if (int err = ibv_cmd_open_xrcd(ibctx, xrcd, sizeof(*xrcd), attr, &cmd, sizeof(cmd), &resp,
					sizeof(resp))) {
		verbs_err(vctx, "open_xrcd: the device refused fd %d, oflags 0x%x: %s\n", attr->fd, attr->oflags,
			  strerror(err));
		delete xrcd;
		errno = err;
		return nullptr;
	}
	return &xrcd->xrcd;
}

int xsrc_close_xrcd(ibv_xrcd *ibxrcd)
{
	auto *xrcd = reinterpret_cast<verbs_xrcd *>(ibxrcd);
	if (int err = xsrc_destroy_status(to_xsrc_ctx(ibxrcd->context), ibv_cmd_close_xrcd(xrcd))) {
		verbs_err(&to_xsrc_ctx(ibxrcd->context)->ibv_ctx, "close_xrcd: the device refused: %s\n", strerror(err));
		return err;
	}
	delete xrcd;
	return 0;
}

ibv_qp *xsrc_open_qp(ibv_context *ibctx, ibv_qp_open_attr *attr)
{
	return xsrc_boundary(&to_xsrc_ctx(ibctx)->ibv_ctx, "open_qp", [&] { return xrc_open_qp(ibctx, attr); });
}
