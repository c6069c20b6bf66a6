// The verbs interface base: port and GID, completion channel, CQs, QP creation and the
// RC connection state machine.
#include "verbs_iface.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>

namespace xsrc::uct {

namespace {

// RoCE: the GID table entries looked at for the IPv4-mapped RoCE v2 GID.
constexpr int gid_scan_max = 16;
// RC connection attributes.
constexpr uint8_t rd_atomic_max = 16;   // outstanding RDMA reads and atomics, each way (capped by the device)
constexpr uint8_t min_rnr_timer = 1;    // the shortest RNR NAK delay (0.01 ms)
constexpr uint8_t grh_hop_limit = 64;
constexpr uint8_t ack_timeout = 14;     // 4.096 us * 2^14 ~ 67 ms per attempt
constexpr uint8_t retry_count = 7;      // attempts: a dead peer is reported after about 0.5 s
constexpr uint8_t rnr_retry_forever = 7;  // 7 means "retry forever" to the device

uint8_t uct_xsrc_verbs_qp_rd_atomic(const VerbsIface *vi)
{
	int dev = vi->md->dev_attr.max_qp_rd_atom;
	return static_cast<uint8_t>(rd_atomic_max < dev ? rd_atomic_max : dev);
}

ucs_status_t uct_xsrc_verbs_iface_create_cq(VerbsIface *vi, CqDir, unsigned cqe, ibv_cq **cq)
{
	*cq = ibv_create_cq(vi->md->ctx, static_cast<int>(cqe), nullptr, vi->channel, 0);
	return *cq ? UCS_OK : uct_xsrc_md_errno_status(errno);
}

ucs_status_t uct_xsrc_verbs_iface_arm_cq(VerbsIface *vi, CqDir dir, int solicited_only)
{
	int rc = ibv_req_notify_cq(vi->cq[static_cast<int>(dir)], solicited_only);
	return rc == 0 ? UCS_OK : uct_xsrc_md_errno_status(rc);
}

void uct_xsrc_verbs_iface_event_cq(VerbsIface *vi, CqDir dir) { ++vi->cq_events_unacked[static_cast<int>(dir)]; }

void uct_xsrc_verbs_iface_handle_failure(VerbsIface *, const ibv_wc &) {}

ucs_status_t uct_xsrc_verbs_iface_set_ep_failed(VerbsIface *, uct_ep_h, ucs_status_t) { return UCS_OK; }

ucs_status_t uct_xsrc_verbs_iface_create_qp(VerbsIface *vi, ibv_qp_init_attr *attr, ibv_qp **qp)
{
	*qp = ibv_create_qp(vi->md->pd, attr);
	return *qp ? UCS_OK : uct_xsrc_md_errno_status(errno);
}

ucs_status_t uct_xsrc_verbs_iface_rd_init(VerbsIface *vi)
{
	vi->channel = ibv_create_comp_channel(vi->md->ctx);
	if (!vi->channel)
		return uct_xsrc_md_errno_status(errno);
	int fl = fcntl(vi->channel->fd, F_GETFL);
	if (fl < 0 || fcntl(vi->channel->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		ibv_destroy_comp_channel(vi->channel);
		vi->channel = nullptr;
		return UCS_ERR_IO_ERROR;
	}
	return UCS_OK;
}

void uct_xsrc_verbs_iface_rd_cleanup(VerbsIface *vi)
{
	if (vi->channel)
		ibv_destroy_comp_channel(vi->channel);
	vi->channel = nullptr;
}

}  // namespace

const VerbsIfaceOps uct_xsrc_verbs_iface_default_ops = {
	.create_cq = uct_xsrc_verbs_iface_create_cq,
	.arm_cq = uct_xsrc_verbs_iface_arm_cq,
	.event_cq = uct_xsrc_verbs_iface_event_cq,
	.handle_failure = uct_xsrc_verbs_iface_handle_failure,
	.set_ep_failed = uct_xsrc_verbs_iface_set_ep_failed,
	.create_qp = uct_xsrc_verbs_iface_create_qp,
	.rd_init = uct_xsrc_verbs_iface_rd_init,
	.rd_cleanup = uct_xsrc_verbs_iface_rd_cleanup,
};

ucs_status_t uct_xsrc_verbs_wc_status(ibv_wc_status s)
{
	switch (s) {
	case IBV_WC_SUCCESS: return UCS_OK;
	case IBV_WC_WR_FLUSH_ERR: return UCS_ERR_CANCELED;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR: return UCS_ERR_ENDPOINT_TIMEOUT;
	case IBV_WC_REM_ACCESS_ERR:
	case IBV_WC_LOC_PROT_ERR: return UCS_ERR_INVALID_ADDR;
	case IBV_WC_LOC_LEN_ERR:
	case IBV_WC_REM_INV_REQ_ERR: return UCS_ERR_MESSAGE_TRUNCATED;
	default: return UCS_ERR_IO_ERROR;
	}
}

ucs_status_t uct_xsrc_verbs_iface_init(VerbsIface *vi, const VerbsIfaceOps *ops, Md *md, uct_worker_h worker,
			      const uct_iface_params_t *params, const char *dev_name, unsigned tx_cqe, unsigned rx_cqe)
{
	vi->vops = ops;
	vi->md = md;
	vi->worker = worker;
	vi->params = *params;
	// dev_name: "<ibdev>:<port>" (the port defaults to 1).
	unsigned port = 1;
	if (dev_name) {
		const char *colon = strrchr(dev_name, ':');
		if (colon) {
			char *end = nullptr;
			unsigned long p = strtoul(colon + 1, &end, 10);
			if (*end != '\0' || p == 0 || p > 255 || strncmp(dev_name, md->name, colon - dev_name) != 0 ||
			    md->name[colon - dev_name] != '\0')
				return UCS_ERR_NO_DEVICE;
			port = static_cast<unsigned>(p);
		} else if (strcmp(dev_name, md->name) != 0) {
			return UCS_ERR_NO_DEVICE;
		}
	}
	if (port > md->dev_attr.phys_port_cnt)
		return UCS_ERR_NO_DEVICE;
	vi->port = static_cast<uint8_t>(port);
	if (ibv_query_port(md->ctx, vi->port, &vi->port_attr) != 0)
		return UCS_ERR_NO_DEVICE;
	if (vi->port_attr.state != IBV_PORT_ACTIVE)
		return UCS_ERR_UNREACHABLE;
	// RoCE: the IPv4-mapped RoCE v2 GID when there is one (index 1 on xsrc), else index 0.
	vi->gid_index = 0;
	if (vi->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET) {
		for (int i = 0; i < vi->port_attr.gid_tbl_len && i < gid_scan_max; ++i) {
			ibv_gid g{};
			if (ibv_query_gid(md->ctx, vi->port, i, &g) != 0)
				continue;
			static const uint8_t v4_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
			if (memcmp(g.raw, v4_prefix, 12) == 0) {
				vi->gid_index = i;
				break;
			}
		}
	}
	if (ibv_query_gid(md->ctx, vi->port, vi->gid_index, &vi->gid) != 0)
		return UCS_ERR_NO_DEVICE;
	ucs_status_t st = ops->rd_init(vi);
	if (st != UCS_OK)
		return st;
	st = ops->create_cq(vi, CqDir::tx, tx_cqe, &vi->cq[0]);
	if (st == UCS_OK)
		st = ops->create_cq(vi, CqDir::rx, rx_cqe, &vi->cq[1]);
	if (st != UCS_OK) {
		uct_xsrc_verbs_iface_cleanup(vi);
		return st;
	}
	return UCS_OK;
}

void uct_xsrc_verbs_iface_cleanup(VerbsIface *vi)
{
	for (int d = 0; d < 2; ++d) {
		if (vi->cq[d]) {
			if (vi->cq_events_unacked[d])
				ibv_ack_cq_events(vi->cq[d], vi->cq_events_unacked[d]);
			ibv_destroy_cq(vi->cq[d]);
		}
		vi->cq[d] = nullptr;
		vi->cq_events_unacked[d] = 0;
	}
	if (vi->vops)
		vi->vops->rd_cleanup(vi);
}

unsigned uct_xsrc_verbs_iface_drain_events(VerbsIface *vi)
{
	unsigned n = 0;
	for (;;) {
		ibv_cq *cq = nullptr;
		void *ctx = nullptr;
		if (ibv_get_cq_event(vi->channel, &cq, &ctx) != 0)
			break;
		vi->vops->event_cq(vi, cq == vi->cq[0] ? CqDir::tx : CqDir::rx);
		++n;
	}
	for (int d = 0; d < 2; ++d)
		if (vi->cq_events_unacked[d]) {
			ibv_ack_cq_events(vi->cq[d], vi->cq_events_unacked[d]);
			vi->cq_events_unacked[d] = 0;
		}
	return n;
}

ucs_status_t uct_xsrc_verbs_qp_init(VerbsIface *vi, ibv_qp *qp)
{
	ibv_qp_attr a{};
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = vi->port;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	return rc == 0 ? UCS_OK : uct_xsrc_md_errno_status(rc);
}

ucs_status_t uct_xsrc_verbs_qp_connect(VerbsIface *vi, ibv_qp *qp, uint32_t remote_qpn, const ibv_gid &remote_gid,
			      uint16_t remote_lid, bool to_rts)
{
	ibv_qp_attr a{};
	int rc;
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = vi->port_attr.active_mtu;
	a.dest_qp_num = remote_qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = uct_xsrc_verbs_qp_rd_atomic(vi);
	a.min_rnr_timer = min_rnr_timer;
	a.ah_attr.port_num = vi->port;
	a.ah_attr.dlid = remote_lid;
	if (vi->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET || remote_gid.global.interface_id != 0) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = remote_gid;
		a.ah_attr.grh.sgid_index = static_cast<uint8_t>(vi->gid_index);
		a.ah_attr.grh.hop_limit = grh_hop_limit;
	}
	rc = ibv_modify_qp(qp, &a,
			   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (rc != 0)
		return uct_xsrc_md_errno_status(rc);
	if (!to_rts)
		return UCS_OK;  // an XRC receive QP only receives
	a = {};
	a.qp_state = IBV_QPS_RTS;
	a.timeout = ack_timeout;
	a.retry_cnt = retry_count;
	a.rnr_retry = rnr_retry_forever;  // flow control keeps receives posted; never give up on RNR
	a.sq_psn = 0;
	a.max_rd_atomic = uct_xsrc_verbs_qp_rd_atomic(vi);
	rc = ibv_modify_qp(qp, &a,
			   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				   IBV_QP_MAX_QP_RD_ATOMIC);
	return rc == 0 ? UCS_OK : uct_xsrc_md_errno_status(rc);
}

}  // namespace xsrc::uct
