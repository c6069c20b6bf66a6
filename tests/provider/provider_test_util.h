// The provider tests' verbs set-up on xsrc0, in one process: a context with
// a PD, and RC QPs connected to each other over the port's RoCE v2 GID.
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace provider_test {

constexpr uint8_t kPort = 1;
constexpr int kGidIndex = 1;  // the port's first IPv4-mapped RoCE v2 GID

inline ibv_context *open_xsrc0()
{
	int n = 0;
	ibv_device **list = ibv_get_device_list(&n);
	ibv_context *ctx = nullptr;
	for (int i = 0; list && i < n && !ctx; ++i)
		if (std::string(ibv_get_device_name(list[i])) == "xsrc0")
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	return ctx;
}

inline ibv_qp_init_attr rc_attr(ibv_cq *cq, uint32_t max_wr, uint32_t max_inline)
{
	ibv_qp_init_attr a{};
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = max_wr;
	a.cap.max_recv_wr = max_wr;
	a.cap.max_send_sge = 4;
	a.cap.max_recv_sge = 4;
	a.cap.max_inline_data = max_inline;
	return a;
}

// How a connected QP reaches its peer: by default the port's own GID, an
// ACK timeout of 67 ms and 7 retries.
struct Path {
	const ibv_gid *dgid = nullptr;  // null: the port's GID at kGidIndex
	uint8_t timeout = 14;
	uint8_t retry_cnt = 7;
};

// RESET -> INIT -> RTR -> RTS towards `dest` over `how`; RNR retried
// forever, every 10 us. Returns 0 or the first errno.
inline int rc_connect(ibv_qp *qp, uint32_t dest, Path how = {})
{
	ibv_ah_attr path{};
	path.is_global = 1;
	path.port_num = kPort;
	path.grh.sgid_index = kGidIndex;
	path.grh.hop_limit = 1;
	if (how.dgid)
		path.grh.dgid = *how.dgid;
	else if (int err = ibv_query_gid(qp->context, kPort, kGidIndex, &path.grh.dgid))
		return err;
	struct Step {
		ibv_qp_attr attr;
		int mask;
	} steps[] = {
		{{.qp_state = IBV_QPS_INIT,
		  .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
		  .port_num = kPort},
		 IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
		{{.qp_state = IBV_QPS_RTR,
		  .path_mtu = IBV_MTU_1024,
		  .dest_qp_num = dest,
		  .ah_attr = path,
		  .max_dest_rd_atomic = 1,
		  .min_rnr_timer = 1},
		 IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER},
		{{.qp_state = IBV_QPS_RTS,
		  .max_rd_atomic = 1,
		  .timeout = how.timeout,
		  .retry_cnt = how.retry_cnt,
		  .rnr_retry = 7},
		 IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			 IBV_QP_MAX_QP_RD_ATOMIC},
	};
	for (Step &step : steps)
		if (int err = ibv_modify_qp(qp, &step.attr, step.mask))
			return err;
	return 0;
}

// Destroys what a test made on xsrc0: QPs, MRs, CQs, then the PD and the
// context (null entries are skipped).
inline void destroy_all(std::span<ibv_qp *const> qps, std::span<ibv_mr *const> mrs,
			std::span<ibv_cq *const> cqs, ibv_pd *pd, ibv_context *ctx)
{
	for (ibv_qp *qp : qps)
		if (qp)
			ibv_destroy_qp(qp);
	for (ibv_mr *mr : mrs)
		if (mr)
			ibv_dereg_mr(mr);
	for (ibv_cq *cq : cqs)
		if (cq)
			ibv_destroy_cq(cq);
	if (pd)
		ibv_dealloc_pd(pd);
	if (ctx)
		ibv_close_device(ctx);
}

// Polls until `n` completions arrived or 10 s passed.
inline std::vector<ibv_wc> poll_n(ibv_cq *cq, size_t n)
{
	std::vector<ibv_wc> out;
	auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
	while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
		ibv_wc wc;
		if (ibv_poll_cq(cq, 1, &wc) == 1)
			out.push_back(wc);
	}
	return out;
}

}  // namespace provider_test
