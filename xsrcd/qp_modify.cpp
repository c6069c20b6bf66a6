// MODIFY_QP and EX_MODIFY_QP: the QP state machine (qp_state.h) decides
// which attributes a transition takes; here their values are checked, kept
// for QUERY_QP and written to the QP's arena entry before its new state.
#include <cstring>

#include "dispatcher_handlers.h"
#include "ib_fields.h"
#include "qp_state.h"
#include "rings.h"
#include "xsrc-qp-state.h"

namespace xsrc {
namespace {

// IBV_QP_STATE .. IBV_QP_DEST_QPN: what the (non-extended) write ABI carries.
constexpr uint32_t kStandardAttrMask = (1u << 21) - 1;
constexpr uint32_t kRemoteAccess =
	IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
// Applications commonly pass LOCAL_WRITE (and ON_DEMAND, their MRs' flags)
// among a QP's access flags and the kernel accepts them; they mean nothing
// for a QP and are not published.
constexpr uint32_t kQpAccessFlags = kRemoteAccess | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND;

// A path: RoCE addresses by GID, so a GRH is mandatory.
int check_path(const Device &dev, const ib_uverbs_qp_dest &dest)
{
	if (dest.port_num != 1 || !dest.is_global)
		return refuse(EINVAL, "path not on port 1 or not global");
	if (!valid_sgid_index(dev, dest.sgid_index))
		return refuse(EINVAL, "bad source GID index");
	// The flow label is not checked: the kernel takes any value (UCX passes
	// ~0 for "any"); only its 20 bits are kept.
	if (dest.sl > ib::kMaxServiceLevel)
		return refuse(EINVAL, "service level over 15");
	return 0;
}

int check_attribute_values(const Device &dev, const ib_uverbs_modify_qp &cmd)
{
	const uint32_t mask = cmd.attr_mask;
	auto has = [mask](uint32_t bit) { return (mask & bit) != 0; };
	if (has(IBV_QP_PKEY_INDEX) && cmd.pkey_index != 0)
		return refuse(EINVAL, "no such P_Key index");  // one P_Key
	if (has(IBV_QP_PORT) && cmd.port_num != 1)
		return refuse(EINVAL, "no such port");
	if (has(IBV_QP_AV))
		if (int err = check_path(dev, cmd.dest))
			return err;
	if (has(IBV_QP_ALT_PATH))  // no automatic path migration on RoCE (the kernel refuses it too)
		return refuse(EINVAL, "alternate paths are not supported");
	if (has(IBV_QP_PATH_MTU) && (cmd.path_mtu < IBV_MTU_256 || cmd.path_mtu > IBV_MTU_4096))
		return refuse(EINVAL, "bad path MTU");
	if (has(IBV_QP_TIMEOUT) && cmd.timeout > ib::kMaxAckTimeout)
		return refuse(EINVAL, "timeout over 31");
	if (has(IBV_QP_RETRY_CNT) && cmd.retry_cnt > ib::kMaxRetryCount)
		return refuse(EINVAL, "retry_cnt over 7");
	if (has(IBV_QP_RNR_RETRY) && cmd.rnr_retry > ib::kMaxRnrRetry)
		return refuse(EINVAL, "rnr_retry over 7");
	if (has(IBV_QP_MIN_RNR_TIMER) && cmd.min_rnr_timer > ib::kMaxMinRnrTimer)
		return refuse(EINVAL, "min_rnr_timer over 31");
	if (has(IBV_QP_MAX_QP_RD_ATOMIC) && cmd.max_rd_atomic > DeviceLimits::max_qp_rd_atom)
		return refuse(EINVAL, "limit: max_rd_atomic over max_qp_rd_atom");
	if (has(IBV_QP_MAX_DEST_RD_ATOMIC) && cmd.max_dest_rd_atomic > DeviceLimits::max_qp_rd_atom)
		return refuse(EINVAL, "limit: max_dest_rd_atomic over max_qp_rd_atom");
	if (has(IBV_QP_PATH_MIG_STATE) && cmd.path_mig_state > IBV_MIG_ARMED)
		return refuse(EINVAL, "bad path migration state");
	if (has(IBV_QP_DEST_QPN) && cmd.dest_qp_num > ib::kMaxQpn)
		return refuse(EINVAL, "dest_qp_num over 24 bits");
	if (has(IBV_QP_ACCESS_FLAGS) && (cmd.qp_access_flags & ~kQpAccessFlags))
		return refuse(EINVAL, "unknown access flags");
	return 0;
}

void apply_attributes(QpAttributes &a, const ib_uverbs_modify_qp &cmd)
{
	const uint32_t mask = cmd.attr_mask;
	auto has = [mask](uint32_t bit) { return (mask & bit) != 0; };
	if (has(IBV_QP_AV)) {
		a.dest = cmd.dest;
		a.dest.flow_label &= ib::kFlowLabelMask;
	}
	if (has(IBV_QP_QKEY))
		a.qkey = cmd.qkey;
	if (has(IBV_QP_RQ_PSN))
		a.rq_psn = cmd.rq_psn & ib::kPsnMask;  // as the kernel does: masked, not refused
	if (has(IBV_QP_SQ_PSN))
		a.sq_psn = cmd.sq_psn & ib::kPsnMask;
	if (has(IBV_QP_DEST_QPN))
		a.dest_qp_num = cmd.dest_qp_num;
	if (has(IBV_QP_ACCESS_FLAGS))
		a.access_flags = cmd.qp_access_flags;
	if (has(IBV_QP_PKEY_INDEX))
		a.pkey_index = cmd.pkey_index;
	if (has(IBV_QP_PORT))
		a.port_num = cmd.port_num;
	if (has(IBV_QP_PATH_MTU))
		a.path_mtu = cmd.path_mtu;
	if (has(IBV_QP_PATH_MIG_STATE))
		a.path_mig_state = cmd.path_mig_state;
	if (has(IBV_QP_EN_SQD_ASYNC_NOTIFY))
		a.en_sqd_async_notify = cmd.en_sqd_async_notify != 0;
	if (has(IBV_QP_MAX_QP_RD_ATOMIC))
		a.max_rd_atomic = cmd.max_rd_atomic;
	if (has(IBV_QP_MAX_DEST_RD_ATOMIC))
		a.max_dest_rd_atomic = cmd.max_dest_rd_atomic;
	if (has(IBV_QP_MIN_RNR_TIMER))
		a.min_rnr_timer = cmd.min_rnr_timer;
	if (has(IBV_QP_TIMEOUT))
		a.timeout = cmd.timeout;
	if (has(IBV_QP_RETRY_CNT))
		a.retry_cnt = cmd.retry_cnt;
	if (has(IBV_QP_RNR_RETRY))
		a.rnr_retry = cmd.rnr_retry;
}

// The attributes first, then the state (release): a peer that sees the
// state sees the attributes that go with it.
void publish_attributes(xsrc_qp_entry &e, const QpAttributes &a, ibv_qp_state state)
{
	e.port_num = a.port_num;
	e.path_mtu = a.path_mtu;
	e.min_rnr_timer = a.min_rnr_timer;
	e.rnr_retry = a.rnr_retry;
	e.retry_cnt = a.retry_cnt;
	e.timeout = a.timeout;
	e.qkey = a.qkey;
	e.access_flags = a.access_flags & kRemoteAccess;
	e.dest_qpn = a.dest_qp_num;
	e.rq_psn = a.rq_psn;
	e.sq_psn = a.sq_psn;
	e.max_rd_atomic = a.max_rd_atomic;
	e.max_dest_rd_atomic = a.max_dest_rd_atomic;
	std::memcpy(e.dgid, a.dest.dgid, sizeof(e.dgid));
	store_release(e.state, xsrc_qp_state_encode(state));
}

// IBTA: a QP attached to an SRQ reports "last WQE reached" once after
// entering the Error state. Nothing is in flight inside the daemon, so that
// is at once.
void report_last_wqe(Context &ctx, Qp &qp)
{
	if (!qp.srq_handle || qp.last_wqe_reported)
		return;
	qp.last_wqe_reported = true;
	post_qp_event(ctx, qp, IBV_EVENT_QP_LAST_WQE_REACHED);
}

// Attributes an XRC QP does not have are ignored rather than refused, as the
// kernel's uverbs layer drops them from the mask before the state machine
// sees it: applications set up both XRC sides with their RC code. The send
// side has no responder resources, the receive side no requester ones.
uint32_t applicable_mask(uint8_t qp_type, uint32_t mask)
{
	switch (qp_type) {
	case IBV_QPT_XRC_SEND:
		return mask & ~static_cast<uint32_t>(IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	case IBV_QPT_XRC_RECV:
		return mask & ~static_cast<uint32_t>(IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT |
						     IBV_QP_RNR_RETRY);
	default:
		return mask;
	}
}

// Through any handle of a shared XRC receive QP: the attributes and the
// state are the QP's.
int modify_qp(Context &ctx, const ib_uverbs_modify_qp &request)
{
	Qp *qp = lookup<Qp>(ctx, request.qp_handle);
	if (!qp)
		return refuse(EINVAL, "no such QP handle");
	ib_uverbs_modify_qp cmd = request;
	cmd.attr_mask = applicable_mask(qp->qp_type, request.attr_mask);
	Device &dev = *ctx.device;
	const uint32_t mask = cmd.attr_mask;
	ibv_qp_state cur = qp_current_state(dev, *qp);
	// IBTA: a current state the consumer names must be the actual one.
	if ((mask & IBV_QP_CUR_STATE) && cmd.cur_qp_state != cur)
		return refuse(EINVAL, "cur_qp_state is not the QP's state");
	if ((mask & IBV_QP_STATE) && cmd.qp_state > IBV_QPS_ERR)
		return refuse(EINVAL, "unknown qp_state");
	auto next = (mask & IBV_QP_STATE) ? static_cast<ibv_qp_state>(cmd.qp_state) : cur;
	if (!qp_modify_allowed(cur, next, static_cast<ibv_qp_type>(qp->qp_type), mask))
		return refuse(EINVAL, "transition not allowed for the QP type, or wrong attr_mask for it");
	if (int err = check_attribute_values(dev, cmd))
		return err;

	QpAttributes &attr = qp->attributes();
	apply_attributes(attr, cmd);
	xsrc_qp_entry &entry = dev.arena->qp_entry(qp->index);
	publish_attributes(entry, attr, next);
	// The wire's responder starts over from a new receive PSN.
	if ((mask & IBV_QP_RQ_PSN) || next == IBV_QPS_RESET)
		(qp->shared ? qp->shared->wire_responder : qp->wire_responder).reset();
	if (next == IBV_QPS_RESET) {
		// Reset empties the queues; the state is already RESET for peers.
		if (qp->rq_off)
			recv_ring_reset(dev.arena->at<xsrc_recv_ring>(qp->rq_off), qp->rq_shape);
		qp->last_wqe_reported = false;
	}
	if (next == IBV_QPS_ERR)
		report_last_wqe(ctx, *qp);
	// The send queue executes as it is posted: once in SQD it is drained.
	if (cur == IBV_QPS_RTS && next == IBV_QPS_SQD && (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) &&
	    cmd.en_sqd_async_notify)
		post_qp_event(ctx, *qp, IBV_EVENT_SQ_DRAINED);
	return 0;
}

}  // namespace

void qp_enter_error(Context &ctx, Qp &qp)
{
	store_release(ctx.device->arena->qp_entry(qp.index).state, xsrc_qp_state_encode(IBV_QPS_ERR));
}

void qp_report_last_wqe(Context &ctx, Qp &qp)
{
	report_last_wqe(ctx, qp);
}

int cmd_modify_qp(Context &ctx, Caller &, const Request &req)
{
	auto cmd = load<ib_uverbs_modify_qp>(req.core);
	if (cmd.attr_mask & ~kStandardAttrMask)
		return refuse(EOPNOTSUPP, "unknown attr_mask bits");
	if (int err = check_no_driver_data(req))
		return err;
	return modify_qp(ctx, cmd);
}

int cmd_ex_modify_qp(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_ex_modify_qp>(req.core);
	if (cmd.base.attr_mask & ~(kStandardAttrMask | IBV_QP_RATE_LIMIT))
		return refuse(EOPNOTSUPP, "unknown attr_mask bits");
	if (cmd.reserved)
		return refuse(EINVAL, "non-zero reserved field");
	if (int err = check_no_driver_data(req))
		return err;
	// The response is optional; when asked for, it must fit before anything changes.
	bool wants_response = req.response || req.resp_len;
	ib_uverbs_ex_modify_qp_resp resp{};
	if (wants_response && req.core_resp_len < sizeof(resp))
		return refuse(ENOSPC, "no room for the response");
	if (int err = modify_qp(ctx, cmd.base))
		return err;
	if (!wants_response)
		return 0;
	resp.response_length = sizeof(resp);
	return respond(caller, req, as_bytes_of(resp));
}

}  // namespace xsrc
