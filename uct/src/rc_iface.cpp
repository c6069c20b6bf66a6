// The RC/XRC interface: open, close, query and addresses, its op slots and bounce buffers,
// and the internal contract (internal.h) the tag and cm modules use. Receive pools and flow
// control are in rc_iface_rx.cpp, completions and progress in rc_iface_progress.cpp.
#include "rc_iface.h"

#include "modules.h"
#include "rc_iface_config.h"
#include "ucx_module.h"

#include <xsrc/uct.h>

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

namespace xsrc::uct {

// --- The internal contract ------------------------------------------------------------------
Iface *to_iface(uct_iface_h h) { return iface_of(h); }
Ep *to_ep(uct_ep_h h) { return ep_of(h); }
Iface *ep_iface(Ep *ep) { return ep->iface; }
uct_iface_h to_uct(Iface *i) { return &i->base.super; }
uct_ep_h to_uct(Ep *ep) { return &ep->super; }
void iface_set_internal_handler(Iface *i, MsgKind k, InternalHandler cb, void *arg)
{
	auto idx = static_cast<unsigned>(k);
	if (idx == 0 || idx >= msg_kind_count)
		return;
	i->internal[idx] = {cb, arg};
}
size_t iface_internal_max(Iface *i) { return i->cfg.seg_size - sizeof(WireHdr); }
void *iface_tag_state(Iface *i) { return i->tag_state; }
void iface_set_tag_state(Iface *i, void *s) { i->tag_state = s; }
void *iface_cm_state(Iface *i) { return i->cm_state; }
void iface_set_cm_state(Iface *i, void *s) { i->cm_state = s; }
const uct_iface_params_t &iface_params(Iface *i) { return i->params; }
uct_md_h iface_md(Iface *i) { return md_handle(i->md); }
uct_worker_h iface_worker(Iface *i) { return i->worker; }
void *ep_cm_state(Ep *ep) { return ep->cm_state; }
ucs_status_t iface_watch_fd(Iface *i, int fd, bool on)
{
	if (fd < 0 || !i->epfd)
		return UCS_ERR_INVALID_PARAM;
	epoll_event ev{};
	ev.events = EPOLLIN;
	ev.data.fd = fd;
	int rc = on ? epoll_ctl(i->epfd.get(), EPOLL_CTL_ADD, fd, &ev) : epoll_ctl(i->epfd.get(), EPOLL_CTL_DEL, fd, nullptr);
	if (rc == 0 || (on && errno == EEXIST) || (!on && errno == ENOENT))
		return UCS_OK;
	return UCS_ERR_IO_ERROR;
}
void ep_set_cm_state(Ep *ep, void *s) { ep->cm_state = s; }

ssize_t ep_send_internal(Ep *ep, MsgKind kind, uct_pack_callback_t pack, void *arg)
{
	if (kind == MsgKind::user_am || static_cast<unsigned>(kind) >= msg_kind_count)
		return UCS_ERR_INVALID_PARAM;
	ssize_t packed = 0;
	ucs_status_t st = uct_xsrc_rc_ep_send_msg(ep, kind, 0, pack, arg, &packed);
	return st == UCS_OK ? packed : static_cast<ssize_t>(st);
}

// --- Op slots and bounce buffers ----------------------------------------------------------------
TxOp *uct_xsrc_rc_iface_op_get(Iface *i, OpKind kind, Ep *ep)
{
	if (i->free_ops.empty())
		return nullptr;
	unsigned idx = i->free_ops.back();
	i->free_ops.pop_back();
	TxOp &op = i->ops[idx];
	uint32_t gen = op.gen;
	op = TxOp{};
	op.gen = gen;
	op.busy = true;
	op.kind = kind;
	op.ep = ep;
	return &op;
}

void uct_xsrc_rc_iface_op_put(Iface *i, TxOp *op)
{
	if (op->buf >= 0)
		uct_xsrc_rc_iface_buf_put(i, op->buf);
	op->buf = -1;
	op->busy = false;
	++op->gen;
	i->free_ops.push_back(static_cast<unsigned>(op - i->ops.data()));
}

uint64_t uct_xsrc_rc_iface_op_wr_id(Iface *i, const TxOp *op)
{
	return (static_cast<uint64_t>(op->gen) << 32) | static_cast<uint64_t>(op - i->ops.data());
}

int uct_xsrc_rc_iface_buf_get(Iface *i)
{
	if (i->free_bufs.empty())
		return -1;
	int b = static_cast<int>(i->free_bufs.back());
	i->free_bufs.pop_back();
	return b;
}

void uct_xsrc_rc_iface_buf_put(Iface *i, int b) { i->free_bufs.push_back(static_cast<unsigned>(b)); }
char *uct_xsrc_rc_iface_buf_addr(Iface *i, int b) { return i->tx_mem.data() + static_cast<size_t>(b) * i->cfg.seg_size; }

void uct_xsrc_rc_iface_comp_done(uct_completion_t *comp, ucs_status_t status)
{
	if (!comp)
		return;
	if (status != UCS_OK)
		comp->status = status;
	if (--comp->count == 0)
		comp->func(comp);
}

namespace {

// Active-message header bytes (am_zcopy's header, cap.am.max_hdr).
constexpr size_t am_max_hdr = 128;
// Registered buffers are best sent in pieces of this alignment and size (cap.*.opt_zcopy_align, align_mtu).
constexpr size_t zcopy_align = 8;
constexpr size_t align_mtu = 4096;

ucs_status_t uct_xsrc_rc_iface_am_stub(void *, void *, size_t, unsigned) { return UCS_OK; }

void uct_xsrc_rc_iface_close(uct_iface_h h);

ucs_status_t uct_xsrc_rc_iface_query(uct_iface_h h, uct_iface_attr_t *attr);

struct DevAddr {
	uint8_t gid[16];
	uint16_t lid;
} __attribute__((packed));

ucs_status_t uct_xsrc_rc_iface_get_device_address(uct_iface_h h, uct_device_addr_t *addr)
{
	Iface *i = iface_of(h);
	if (!addr)
		return UCS_ERR_INVALID_PARAM;
	DevAddr d{};
	memcpy(d.gid, i->gid.raw, 16);
	d.lid = i->port_attr.lid;
	memcpy(addr, &d, sizeof(d));
	return UCS_OK;
}

ucs_status_t uct_xsrc_rc_iface_get_address(uct_iface_h h, uct_iface_addr_t *addr) { return uct_xsrc_rc_iface_conn_get_address(iface_of(h), addr); }

// Same link layer: on RoCE any GID is routable (same host for xsrc); on IB the subnet
// prefix must match.
int uct_xsrc_rc_iface_is_reachable(uct_iface_h h, const uct_device_addr_t *dev_addr, const uct_iface_addr_t *iface_addr)
{
	Iface *i = iface_of(h);
	if (!dev_addr || (iface_addr && !uct_xsrc_rc_iface_conn_addr_valid(iface_addr)))
		return 0;
	DevAddr d;
	memcpy(&d, dev_addr, sizeof(d));
	if (i->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET)
		return 1;
	return memcmp(d.gid, i->gid.raw, 8) == 0 && d.lid != 0;
}

}  // namespace

size_t uct_xsrc_rc_iface_dev_addr_len() { return sizeof(DevAddr); }
ucs_status_t uct_xsrc_rc_iface_dev_addr_unpack(const uct_device_addr_t *a, ibv_gid *gid, uint16_t *lid)
{
	DevAddr d;
	memcpy(&d, a, sizeof(d));
	memcpy(gid->raw, d.gid, 16);
	*lid = d.lid;
	return UCS_OK;
}


const uct_iface_ops_t uct_xsrc_rc_iface_tl_ops = {
	.ep_put_short = uct_xsrc_rc_ep_put_short,
	.ep_put_bcopy = uct_xsrc_rc_ep_put_bcopy,
	.ep_put_zcopy = uct_xsrc_rc_ep_put_zcopy,
	.ep_get_short = uct_xsrc_rc_ep_get_short,
	.ep_get_bcopy = uct_xsrc_rc_ep_get_bcopy,
	.ep_get_zcopy = uct_xsrc_rc_ep_get_zcopy,
	.ep_am_short = uct_xsrc_rc_ep_am_short,
	.ep_am_short_iov = uct_xsrc_rc_ep_am_short_iov,
	.ep_am_bcopy = uct_xsrc_rc_ep_am_bcopy,
	.ep_am_zcopy = uct_xsrc_rc_ep_am_zcopy,
	.ep_atomic_cswap64 = uct_xsrc_rc_ep_atomic_cswap64,
	.ep_atomic_cswap32 = uct_xsrc_rc_ep_atomic_cswap32,
	.ep_atomic32_post = uct_xsrc_rc_ep_atomic32_post,
	.ep_atomic64_post = uct_xsrc_rc_ep_atomic64_post,
	.ep_atomic32_fetch = uct_xsrc_rc_ep_atomic32_fetch,
	.ep_atomic64_fetch = uct_xsrc_rc_ep_atomic64_fetch,
	.ep_tag_eager_short = uct_xsrc_tag_ep_eager_short,
	.ep_tag_eager_bcopy = uct_xsrc_tag_ep_eager_bcopy,
	.ep_tag_eager_zcopy = uct_xsrc_tag_ep_eager_zcopy,
	.ep_tag_rndv_zcopy = uct_xsrc_tag_ep_rndv_zcopy,
	.ep_tag_rndv_cancel = uct_xsrc_tag_ep_rndv_cancel,
	.ep_tag_rndv_request = uct_xsrc_tag_ep_rndv_request,
	.iface_tag_recv_zcopy = uct_xsrc_tag_iface_recv_zcopy,
	.iface_tag_recv_cancel = uct_xsrc_tag_iface_recv_cancel,
	.ep_pending_add = uct_xsrc_rc_ep_pending_add,
	.ep_pending_purge = uct_xsrc_rc_ep_pending_purge,
	.ep_flush = uct_xsrc_rc_ep_flush,
	.ep_fence = uct_xsrc_rc_ep_fence,
	.ep_check = uct_xsrc_rc_ep_check,
	.ep_create = uct_xsrc_rc_ep_create,
	.ep_connect = uct_xsrc_cm_ep_connect,
	.ep_disconnect = uct_xsrc_cm_ep_disconnect,
	.cm_ep_conn_notify = uct_xsrc_cm_ep_conn_notify,
	.ep_destroy = uct_xsrc_rc_ep_destroy,
	.ep_get_address = uct_xsrc_rc_ep_get_address,
	.ep_connect_to_ep = uct_xsrc_rc_ep_connect_to_ep,
	.iface_accept = uct_xsrc_cm_iface_accept,
	.iface_reject = uct_xsrc_cm_iface_reject,
	.iface_flush = uct_xsrc_rc_iface_flush,
	.iface_fence = uct_xsrc_rc_iface_fence,
	.iface_progress_enable = uct_xsrc_rc_iface_progress_enable,
	.iface_progress_disable = uct_xsrc_rc_iface_progress_disable,
	.iface_progress = uct_xsrc_rc_iface_progress,
	.iface_event_fd_get = uct_xsrc_rc_iface_event_fd_get,
	.iface_event_arm = uct_xsrc_rc_iface_event_arm,
	.iface_close = uct_xsrc_rc_iface_close,
	.iface_query = uct_xsrc_rc_iface_query,
	.iface_get_device_address = uct_xsrc_rc_iface_get_device_address,
	.iface_get_address = uct_xsrc_rc_iface_get_address,
	.iface_is_reachable = uct_xsrc_rc_iface_is_reachable,
};


namespace {

const UcxIfaceInternalOps uct_xsrc_rc_iface_internal_ops = {
	.iface_estimate_perf = uct_base_iface_estimate_perf,
	.iface_vfs_refresh = [](uct_iface_h) {},
	.ep_query = [](uct_ep_h, uct_ep_attr_t *) { return UCS_ERR_UNSUPPORTED; },
	.ep_invalidate = [](uct_ep_h, unsigned) { return UCS_ERR_UNSUPPORTED; },
};

void uct_xsrc_rc_iface_close(uct_iface_h h)
{
	Iface *i = iface_of(h);
	uct_xsrc_tag_iface_cleanup(i);
	uct_xsrc_cm_iface_cleanup(i);
	if (i->progress_registered)
		uct_worker_progress_unregister_safe(i->worker, &i->base.prog.id);
	i->progress_registered = false;
	while (!i->eps.empty())
		uct_xsrc_rc_ep_destroy(to_uct(i->eps.back()));
	delete i;
}

ucs_status_t uct_xsrc_rc_iface_query(uct_iface_h h, uct_iface_attr_t *attr)
{
	Iface *i = iface_of(h);
	if (!attr)
		return UCS_ERR_INVALID_PARAM;
	memset(attr, 0, sizeof(*attr));
	size_t seg = i->cfg.seg_size;
	size_t payload = seg - sizeof(WireHdr);
	size_t max_short = std::min(i->cfg.max_short, payload);
	unsigned sge = i->max_sge;

	attr->cap.put.max_short = max_short;
	attr->cap.put.max_bcopy = seg;
	attr->cap.put.min_zcopy = 0;
	attr->cap.put.max_zcopy = i->max_msg;
	attr->cap.put.opt_zcopy_align = zcopy_align;
	attr->cap.put.align_mtu = align_mtu;
	attr->cap.put.max_iov = sge;

	attr->cap.get.max_short = max_short;
	attr->cap.get.max_bcopy = seg;
	attr->cap.get.min_zcopy = 0;
	attr->cap.get.max_zcopy = i->max_msg;
	attr->cap.get.opt_zcopy_align = zcopy_align;
	attr->cap.get.align_mtu = align_mtu;
	attr->cap.get.max_iov = sge;

	attr->cap.am.max_short = max_short;
	attr->cap.am.max_bcopy = payload;
	attr->cap.am.min_zcopy = 0;
	attr->cap.am.max_zcopy = payload;
	attr->cap.am.opt_zcopy_align = zcopy_align;
	attr->cap.am.align_mtu = align_mtu;
	attr->cap.am.max_hdr = std::min(am_max_hdr, payload);
	attr->cap.am.max_iov = sge > 1 ? sge - 1 : 1;

	const uint64_t post_ops = UCS_BIT(UCT_ATOMIC_OP_ADD) | UCS_BIT(UCT_ATOMIC_OP_AND) | UCS_BIT(UCT_ATOMIC_OP_OR) |
				  UCS_BIT(UCT_ATOMIC_OP_XOR);
	const uint64_t fetch_ops = post_ops | UCS_BIT(UCT_ATOMIC_OP_SWAP) | UCS_BIT(UCT_ATOMIC_OP_CSWAP);
	bool atomics = i->md->dev_attr.atomic_cap != IBV_ATOMIC_NONE;
	if (atomics) {
		attr->cap.atomic32.op_flags = attr->cap.atomic64.op_flags = post_ops;
		attr->cap.atomic32.fop_flags = attr->cap.atomic64.fop_flags = fetch_ops;
	}

	attr->cap.flags = UCT_IFACE_FLAG_AM_SHORT | UCT_IFACE_FLAG_AM_BCOPY | UCT_IFACE_FLAG_AM_ZCOPY |
			  UCT_IFACE_FLAG_PUT_SHORT | UCT_IFACE_FLAG_PUT_BCOPY | UCT_IFACE_FLAG_PUT_ZCOPY |
			  UCT_IFACE_FLAG_GET_SHORT | UCT_IFACE_FLAG_GET_BCOPY | UCT_IFACE_FLAG_GET_ZCOPY |
			  UCT_IFACE_FLAG_PENDING | UCT_IFACE_FLAG_CONNECT_TO_EP | UCT_IFACE_FLAG_CONNECT_TO_IFACE |
			  UCT_IFACE_FLAG_CB_SYNC |
			  UCT_IFACE_FLAG_EVENT_SEND_COMP | UCT_IFACE_FLAG_EVENT_RECV | UCT_IFACE_FLAG_EVENT_FD |
			  UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE | UCT_IFACE_FLAG_EP_CHECK;
	if (atomics)
		attr->cap.flags |= UCT_IFACE_FLAG_ATOMIC_CPU | UCT_IFACE_FLAG_ATOMIC_DEVICE;
	attr->cap.event_flags = UCT_IFACE_FLAG_EVENT_SEND_COMP | UCT_IFACE_FLAG_EVENT_RECV | UCT_IFACE_FLAG_EVENT_FD;

	attr->device_addr_len = sizeof(DevAddr);
	attr->iface_addr_len = uct_xsrc_rc_iface_addr_len();
	attr->ep_addr_len = uct_xsrc_rc_ep_addr_len();
	attr->max_conn_priv = 0;
	// Measured on xsrc0 (README, bench/uct_bench): a send ~1 us, a process_vm_writev ~2.5 us.
	attr->overhead = 0.5e-6;
	attr->bandwidth.dedicated = 0;
	attr->bandwidth.shared = 5e9;
	attr->latency = ucs_linear_func_make(1.5e-6, 0);
	attr->priority = 0;
	attr->max_num_eps = i->cfg.max_eps;
	attr->dev_num_paths = 1;
	uct_xsrc_tag_iface_query(i, attr);  // after cap.get: the tag limits follow get_zcopy's
	uct_xsrc_cm_iface_query(i, attr);   // max_conn_priv, listen_sockaddr, CONNECT_TO_SOCKADDR
	return UCS_OK;
}


// The UCX base part of a fresh iface.
void uct_xsrc_rc_iface_init_base(Iface *i, Md *md, uct_worker_h worker, const uct_iface_params_t *params)
{
	uint64_t fm = params->field_mask;
	i->base.super.ops = uct_xsrc_rc_iface_tl_ops;
	i->base.internal_ops = &uct_xsrc_rc_iface_internal_ops;
	i->base.md = md_handle(md);  // libuct (uct_iface_mem_alloc) sees a UCX md
	i->base.worker = worker;
	for (auto &h : i->base.am)
		h = {uct_xsrc_rc_iface_am_stub, nullptr, UCT_CB_FLAG_ASYNC};
	if (fm & UCT_IFACE_PARAM_FIELD_ERR_HANDLER)
		i->base.err_handler = params->err_handler;
	if (fm & UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG)
		i->base.err_handler_arg = params->err_handler_arg;
	if (fm & UCT_IFACE_PARAM_FIELD_ERR_HANDLER_FLAGS)
		i->base.err_handler_flags = params->err_handler_flags;
	i->base.prog.id = UCS_CALLBACKQ_ID_NULL;
	i->base.config.max_num_eps = i->cfg.max_eps;
}

// Operation slots with their registered atomic words, and the bounce buffers.
ucs_status_t uct_xsrc_rc_iface_init_tx(Iface *i)
{
	const IfaceConfig &cfg = i->cfg;
	unsigned tx_slots = cfg.tx_ops;
	i->ops.resize(tx_slots);
	for (unsigned k = tx_slots; k-- > 0;)
		i->free_ops.push_back(k);
	size_t words_len = static_cast<size_t>(tx_slots) * sizeof(uint64_t);
	i->atomic_words.reset(static_cast<uint64_t *>(
		aligned_alloc(credit_slot_size, (words_len + credit_slot_size - 1) / credit_slot_size * credit_slot_size)));
	i->tx_mem = Mapping(static_cast<size_t>(cfg.tx_bufs) * cfg.seg_size);
	if (!i->atomic_words || !i->tx_mem)
		return UCS_ERR_NO_MEMORY;
	memset(i->atomic_words.get(), 0, words_len);
	i->atomic_mr.reset(ibv_reg_mr(i->md->pd, i->atomic_words.get(), words_len, IBV_ACCESS_LOCAL_WRITE));
	if (i->atomic_mr)
		i->tx_mr.reset(ibv_reg_mr(i->md->pd, i->tx_mem.data(), i->tx_mem.size(), IBV_ACCESS_LOCAL_WRITE));
	if (!i->atomic_mr || !i->tx_mr)
		return uct_xsrc_md_errno_status(errno);
	for (unsigned k = cfg.tx_bufs; k-- > 0;)
		i->free_bufs.push_back(k);
	return UCS_OK;
}

// XRC: every ep's receive chunk and credit slot, registered once (reserved, not committed:
// chunks are touched as eps come), the XRC domain and the shared receive queue.
ucs_status_t uct_xsrc_rc_iface_init_xrc(Iface *i)
{
	const IfaceConfig &cfg = i->cfg;
	Md *md = i->md;
	size_t srq_mem_len = static_cast<size_t>(cfg.max_eps) * uct_xsrc_rc_iface_srq_chunk_len(i);
	if (srq_mem_len > cfg.xrc_rx_mem_max)
		return UCS_ERR_EXCEEDS_LIMIT;
	i->srq_mem = Mapping(srq_mem_len, MAP_NORESERVE);
	i->credit_mem = Mapping(static_cast<size_t>(cfg.max_eps) * credit_slot_size);
	if (!i->srq_mem || !i->credit_mem)
		return UCS_ERR_NO_MEMORY;
	i->srq_mr.reset(ibv_reg_mr(md->pd, i->srq_mem.data(), i->srq_mem.size(), IBV_ACCESS_LOCAL_WRITE));
	if (i->srq_mr)
		i->credit_mr.reset(ibv_reg_mr(md->pd, i->credit_mem.data(), i->credit_mem.size(),
					      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
	if (!i->srq_mr || !i->credit_mr)
		return uct_xsrc_md_errno_status(errno);
	for (unsigned k = cfg.max_eps; k-- > 0;)
		i->free_credit_slots.push_back(k);
	ibv_xrcd_init_attr xa{};
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	xa.fd = -1;
	xa.oflags = O_CREAT;
	i->xrcd.reset(ibv_open_xrcd(md->ctx, &xa));
	if (!i->xrcd)
		return uct_xsrc_md_errno_status(errno);
	ibv_srq_init_attr_ex sa{};
	sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
	sa.srq_type = IBV_SRQT_XRC;
	sa.pd = md->pd;
	sa.xrcd = i->xrcd.get();
	sa.cq = i->cq[1];
	sa.attr.max_wr = cfg.rx_queue_len * cfg.max_eps;
	sa.attr.max_sge = 1;
	i->srq.reset(ibv_create_srq_ex(md->ctx, &sa));
	return i->srq ? UCS_OK : uct_xsrc_md_errno_status(errno);
}

// The device name asked for in params (null: the md's first port), or UCS_ERR_NO_DEVICE /
// UCS_ERR_INVALID_PARAM when the params are not for this transport.
ucs_status_t uct_xsrc_rc_iface_dev_name(const uct_iface_params_t *params, const char **dev_name)
{
	*dev_name = nullptr;
	if (!(params->field_mask & UCT_IFACE_PARAM_FIELD_OPEN_MODE))
		return UCS_OK;
	if (params->open_mode & UCT_IFACE_OPEN_MODE_DEVICE) {
		if (params->mode.device.tl_name && strcmp(params->mode.device.tl_name, XSRC_UCT_TL_NAME) != 0)
			return UCS_ERR_NO_DEVICE;
		*dev_name = params->mode.device.dev_name;
		return UCS_OK;
	}
	// Sockaddr modes: the cm module (cm.cpp) serves them on the md's first port.
	if (params->open_mode & (UCT_IFACE_OPEN_MODE_SOCKADDR_SERVER | UCT_IFACE_OPEN_MODE_SOCKADDR_CLIENT))
		return UCS_OK;
	return UCS_ERR_INVALID_PARAM;
}

}  // namespace

// Everything the iface owns goes in the members' destructors (see Iface); these first: the XRC
// QPs (which say bye through the connection socket), the socket, and the SRQ before the
// chunks it receives into.
Iface::~Iface()
{
	uct_xsrc_rc_xrc_iface_cleanup(this);
	uct_xsrc_rc_iface_conn_close(this);
	srq.reset();
	for (RxPool *chunk : srq_chunks)
		uct_xsrc_rc_rx_pool_free(chunk);  // a descriptor still held by the user dies with the iface
}

ucs_status_t uct_xsrc_rc_iface_open(Md *md, uct_worker_h worker, const uct_iface_params_t *params, const IfaceConfig &cfg,
				    uct_iface_h *iface_p)
{
	if (!md || !params || !iface_p)
		return UCS_ERR_INVALID_PARAM;
	const char *dev_name;
	ucs_status_t st = uct_xsrc_rc_iface_dev_name(params, &dev_name);
	if (st != UCS_OK)
		return st;
	// Completions of destroyed eps' work may still sit in a CQ: twice the live maximum.
	unsigned tx_cqe = 2 * cfg.tx_ops + cfg.cq_slack;
	unsigned rx_cqe = 2 * cfg.rx_queue_len * cfg.max_eps + cfg.cq_slack;
	unsigned max_cqe = static_cast<unsigned>(md->dev_attr.max_cqe);
	if (max_cqe && (tx_cqe > max_cqe || rx_cqe > max_cqe))
		return UCS_ERR_EXCEEDS_LIMIT;
	std::unique_ptr<Iface> i(new (std::nothrow) Iface());
	if (!i)
		return UCS_ERR_NO_MEMORY;
	if (static_cast<void *>(&i->base) != static_cast<void *>(i.get()))
		return UCS_ERR_UNSUPPORTED;  // libuct reads our iface as a uct_base_iface_t: it must start the object
	i->cfg = cfg;
	i->rops = &uct_xsrc_rc_iface_default_ops;
	st = uct_xsrc_verbs_iface_init(i.get(), &uct_xsrc_rc_iface_verbs_ops, md, worker, params, dev_name, tx_cqe, rx_cqe);
	if (st != UCS_OK)
		return st;
	uct_xsrc_rc_iface_init_base(i.get(), md, worker, params);
	i->max_sge = std::max(1, std::min(md->dev_attr.max_sge, static_cast<int>(cfg.max_sge)));
	if (md->dev_attr.max_mr_size)
		i->max_msg = std::min<size_t>(i->max_msg, md->dev_attr.max_mr_size);
	st = uct_xsrc_rc_iface_init_tx(i.get());
	if (st == UCS_OK && cfg.xrc)
		st = uct_xsrc_rc_iface_init_xrc(i.get());
	if (st == UCS_OK) {
		i->epfd.reset(epoll_create1(EPOLL_CLOEXEC));
		if (!i->epfd || iface_watch_fd(i.get(), i->channel->fd, true) != UCS_OK)
			st = UCS_ERR_IO_ERROR;
	}
	if (st == UCS_OK)
		st = uct_xsrc_rc_iface_conn_open(i.get());
	if (st == UCS_OK) {
		st = uct_xsrc_tag_iface_init(i.get(), params);
		if (st == UCS_OK)
			st = uct_xsrc_cm_iface_init(i.get(), params);
		if (st != UCS_OK)
			uct_xsrc_tag_iface_cleanup(i.get());
	}
	if (st != UCS_OK)
		return st;
	*iface_p = to_uct(i.release());
	return UCS_OK;
}

}  // namespace xsrc::uct

using namespace xsrc::uct;

extern "C" ucs_status_t xsrc_uct_iface_open(uct_md_h md, uct_worker_h worker, const uct_iface_params_t *params,
					    const uct_iface_config_t *config, uct_iface_h *iface_p)
{
	IfaceConfig cfg;
	unsigned transport;
	ucs_status_t st = uct_xsrc_iface_config_parse(config, &cfg, &transport);
	if (st != UCS_OK)
		return st;
	Md *xmd = to_md(md);
	if (!xmd)
		return UCS_ERR_INVALID_PARAM;  // no md, or not one of ours
	// XRC where the device offers it (the default), RC otherwise or when asked.
	bool has_xrc = xmd->dev_attr.device_cap_flags & IBV_DEVICE_XRC;
	if (transport == XSRC_UCT_TRANSPORT_XRC && !has_xrc)
		return UCS_ERR_UNSUPPORTED;
	cfg.xrc = transport == XSRC_UCT_TRANSPORT_XRC || (transport == XSRC_UCT_TRANSPORT_AUTO && has_xrc);
	if (const char *env = getenv("XSRC_UCT_TRANSPORT")) {  // test and debugging override of AUTO
		if (transport == XSRC_UCT_TRANSPORT_AUTO && strcmp(env, "rc") == 0)
			cfg.xrc = false;
	}
	return uct_xsrc_rc_iface_open(xmd, worker, params, cfg, iface_p);
}

extern "C" unsigned xsrc_uct_iface_transport(uct_iface_h h)
{
	if (!h || h->ops.iface_close != uct_xsrc_rc_iface_tl_ops.iface_close)
		return 0;
	return iface_of(h)->cfg.xrc ? XSRC_UCT_TRANSPORT_XRC : XSRC_UCT_TRANSPORT_RC;
}
