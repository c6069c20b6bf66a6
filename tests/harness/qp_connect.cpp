// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
#include "harness/qp_connect.h"

#include <cstring>

namespace xsrc::harness {

namespace {

QpStep modify(ibv_qp *qp, ibv_qp_attr &attr, int mask, const char *step)
{
	return QpStep{ibv_modify_qp(qp, &attr, mask), step};
}

}  // namespace

std::string QpStep::text() const
{
	return std::string(step) + ": " + strerror(err) + " (" + std::to_string(err) + ")";
}

ibv_ah_attr grh_ah_attr(const ibv_gid &dgid, const QpConnectAttrs &a)
{
	ibv_ah_attr ah{};
	ah.is_global = 1;
	ah.grh.dgid = dgid;
	ah.grh.sgid_index = a.sgid_index;
	ah.grh.hop_limit = a.hop_limit;
	ah.port_num = a.port;
	return ah;
}

QpStep qp_to_init(ibv_qp *qp, const QpConnectAttrs &a)
{
	ibv_qp_attr attr{};
	attr.qp_state = IBV_QPS_INIT;
	attr.pkey_index = 0;
	attr.port_num = a.port;
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	if (qp->qp_type == IBV_QPT_UD) {
		attr.qkey = a.qkey;
		mask |= IBV_QP_QKEY;
	} else {
		attr.qp_access_flags = a.access;
		mask |= IBV_QP_ACCESS_FLAGS;
	}
	return modify(qp, attr, mask, "INIT");
}

QpStep qp_to_rtr(ibv_qp *qp, const QpRemote &remote, const QpConnectAttrs &a)
{
	ibv_qp_attr attr{};
	attr.qp_state = IBV_QPS_RTR;
	if (qp->qp_type == IBV_QPT_UD)
		return modify(qp, attr, IBV_QP_STATE, "RTR");
	attr.path_mtu = a.path_mtu;
	attr.dest_qp_num = remote.qpn;
	attr.rq_psn = a.rq_psn;
	attr.ah_attr = grh_ah_attr(remote.gid, a);
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (a.responder && qp->qp_type != IBV_QPT_UC && qp->qp_type != IBV_QPT_XRC_SEND) {
		attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
		attr.min_rnr_timer = a.min_rnr_timer;
		mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	}
	return modify(qp, attr, mask, "RTR");
}

QpStep qp_to_rts(ibv_qp *qp, const QpConnectAttrs &a)
{
	ibv_qp_attr attr{};
	attr.qp_state = IBV_QPS_RTS;
	attr.sq_psn = a.sq_psn;
	int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (qp->qp_type != IBV_QPT_UD && qp->qp_type != IBV_QPT_UC) {
		attr.timeout = a.timeout;
		attr.retry_cnt = a.retry_cnt;
		attr.rnr_retry = a.rnr_retry;
		attr.max_rd_atomic = a.max_rd_atomic;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	}
	return modify(qp, attr, mask, "RTS");
}

QpStep qp_connect(ibv_qp *qp, const QpRemote &remote, const QpConnectAttrs &a)
{
	if (QpStep s = qp_to_init(qp, a))
		return s;
	if (QpStep s = qp_to_rtr(qp, remote, a))
		return s;
	return qp_to_rts(qp, a);
}

QpStep qp_to_error(ibv_qp *qp)
{
	ibv_qp_attr attr{};
	attr.qp_state = IBV_QPS_ERR;
	return modify(qp, attr, IBV_QP_STATE, "ERR");
}

ibv_qp_state qp_state(ibv_qp *qp)
{
	ibv_qp_attr attr{};
	ibv_qp_init_attr init{};
	if (ibv_query_qp(qp, &attr, IBV_QP_STATE, &init))
		return IBV_QPS_UNKNOWN;
	return attr.qp_state;
}

}  // namespace xsrc::harness
