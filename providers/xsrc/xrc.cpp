// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// XRC: domains shared across processes by file, and XRC receive QPs opened
// by QPN from any process of the domain. The send side and the XRC SRQs are
// ordinary QPs and SRQs (qp.cpp, srq.cpp); the engine routes XRC messages by
// the SRQ number each carries (transport.cpp).
#include "xsrc.h"

#include <new>

ibv_xrcd *xsrc_open_xrcd(ibv_context *ibctx, ibv_xrcd_init_attr *attr)
{
	auto *xrcd = new (std::nothrow) verbs_xrcd{};
	if (!xrcd) {
		errno = ENOMEM;
		return nullptr;
	}
	struct ibv_open_xrcd cmd{};
	ib_uverbs_open_xrcd_resp resp{};
	if (int err = ibv_cmd_open_xrcd(ibctx, xrcd, sizeof(*xrcd), attr, &cmd, sizeof(cmd), &resp,
					sizeof(resp))) {
		delete xrcd;
		errno = err;
		return nullptr;
	}
	return &xrcd->xrcd;
}

int xsrc_close_xrcd(ibv_xrcd *ibxrcd)
{
	auto *xrcd = reinterpret_cast<verbs_xrcd *>(ibxrcd);
	if (int err = ibv_cmd_close_xrcd(xrcd))
		return err;
	delete xrcd;
	return 0;
}

ibv_qp *xsrc_open_qp(ibv_context *ibctx, ibv_qp_open_attr *attr)
{
	xsrc_context *ctx = to_xsrc_ctx(ibctx);
	auto *qp = new (std::nothrow) xsrc_qp{};
	if (!qp) {
		errno = ENOMEM;
		return nullptr;
	}
	struct ibv_open_qp cmd{};
	verbs_drv_buf<ib_uverbs_create_qp_resp, xsrc_create_qp_resp> resp;
	if (int err = ibv_cmd_open_qp(ibctx, &qp->vqp, sizeof(qp->vqp), attr, &cmd, sizeof(cmd),
				      resp.core(), resp.size)) {
		delete qp;
		errno = err;
		return nullptr;
	}
	qp->qpn = qp->vqp.qp.qp_num;
	qp->entry = ctx->arena.qp(qp->qpn);
	qp->type = IBV_QPT_XRC_RECV;
	if (!qp->entry || qp->entry->qpn != qp->qpn) {
		ibv_cmd_destroy_qp(&qp->vqp.qp);
		delete qp;
		errno = EPROTO;
		return nullptr;
	}
	return &qp->vqp.qp;
}
