// The RC endpoint's RMA: put and get, short and bcopy through the iface's bounce buffers,
// zcopy straight from or into the caller's registered memory.
#include "rc_iface.h"

#include <algorithm>
#include <cstring>

namespace xsrc::uct {

ucs_status_t uct_xsrc_rc_ep_put_short(uct_ep_h tl_ep, const void *buffer, unsigned length, uint64_t remote_addr,
			     uct_rkey_t rkey)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	if (length > std::min(i->cfg.max_short, i->cfg.seg_size) || (length && !buffer))
		return UCS_ERR_INVALID_PARAM;
	int buf;
	ucs_status_t st = uct_xsrc_rc_ep_tx_reserve(ep, false, &buf);
	if (st != UCS_OK)
		return st;
	memcpy(uct_xsrc_rc_iface_buf_addr(i, buf), buffer, length);
	ibv_sge sge = uct_xsrc_rc_iface_buf_sge(i, buf, length);
	st = uct_xsrc_rc_ep_post_rdma(ep, OpKind::put, IBV_WR_RDMA_WRITE, &sge, 1, remote_addr, rkey, nullptr, buf);
	return st;
}

ssize_t uct_xsrc_rc_ep_put_bcopy(uct_ep_h tl_ep, uct_pack_callback_t pack_cb, void *arg, uint64_t remote_addr, uct_rkey_t rkey)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	int buf;
	ucs_status_t st = uct_xsrc_rc_ep_tx_reserve(ep, false, &buf);
	if (st != UCS_OK)
		return st;
	size_t len = pack_cb(uct_xsrc_rc_iface_buf_addr(i, buf), arg);
	if (len > i->cfg.seg_size) {
		uct_xsrc_rc_iface_buf_put(i, buf);
		return UCS_ERR_EXCEEDS_LIMIT;
	}
	ibv_sge sge = uct_xsrc_rc_iface_buf_sge(i, buf, static_cast<uint32_t>(len));
	st = uct_xsrc_rc_ep_post_rdma(ep, OpKind::put, IBV_WR_RDMA_WRITE, &sge, 1, remote_addr, rkey, nullptr, buf);
	return st == UCS_OK ? static_cast<ssize_t>(len) : static_cast<ssize_t>(st);
}

namespace {

// Zero-copy RDMA from or into the caller's registered iov.
ucs_status_t uct_xsrc_rc_ep_rdma_zcopy(uct_ep_h tl_ep, OpKind kind, ibv_wr_opcode opcode, const uct_iov_t *iov, size_t iovcnt,
			uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	ibv_sge sge[max_sge_limit];
	unsigned n;
	size_t total;
	ucs_status_t st = uct_xsrc_rc_ep_iov_to_sge(iov, iovcnt, sge, i->max_sge, &n, &total);
	if (st != UCS_OK)
		return st;
	if (total > i->max_msg)
		return UCS_ERR_INVALID_PARAM;
	st = uct_xsrc_rc_ep_tx_check(ep, false);
	if (st != UCS_OK)
		return st;
	st = uct_xsrc_rc_ep_post_rdma(ep, kind, opcode, sge, n, remote_addr, rkey, comp, -1);
	return st == UCS_OK ? UCS_INPROGRESS : st;
}

// An RDMA READ of `length` bytes into a bounce buffer; *op finishes the copy out.
ucs_status_t uct_xsrc_rc_ep_read_to_bounce(Ep *ep, OpKind kind, size_t length, uint64_t remote_addr, uct_rkey_t rkey,
			    uct_completion_t *comp, TxOp **op)
{
	Iface *i = ep->iface;
	int buf;
	ucs_status_t st = uct_xsrc_rc_ep_tx_reserve(ep, false, &buf);
	if (st != UCS_OK)
		return st;
	ibv_sge sge = uct_xsrc_rc_iface_buf_sge(i, buf, static_cast<uint32_t>(length));
	return uct_xsrc_rc_ep_post_rdma(ep, kind, IBV_WR_RDMA_READ, &sge, 1, remote_addr, rkey, comp, buf, op);
}

}  // namespace

ucs_status_t uct_xsrc_rc_ep_put_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov, size_t iovcnt, uint64_t remote_addr,
			     uct_rkey_t rkey, uct_completion_t *comp)
{
	return uct_xsrc_rc_ep_rdma_zcopy(tl_ep, OpKind::put, IBV_WR_RDMA_WRITE, iov, iovcnt, remote_addr, rkey, comp);
}

ucs_status_t uct_xsrc_rc_ep_get_short(uct_ep_h tl_ep, void *buffer, unsigned length, uint64_t remote_addr, uct_rkey_t rkey)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	if (length > std::min(i->cfg.max_short, i->cfg.seg_size) || (length && !buffer))
		return UCS_ERR_INVALID_PARAM;
	TxOp *op = nullptr;
	ucs_status_t st = uct_xsrc_rc_ep_read_to_bounce(ep, OpKind::get_short, length, remote_addr, rkey, nullptr, &op);
	if (st != UCS_OK)
		return st;
	op->dst = buffer;
	op->length = length;
	return UCS_INPROGRESS;  // the data is in `buffer` once the ep is flushed
}

ucs_status_t uct_xsrc_rc_ep_get_bcopy(uct_ep_h tl_ep, uct_unpack_callback_t unpack_cb, void *arg, size_t length,
			     uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	if (length > i->cfg.seg_size || !unpack_cb)
		return UCS_ERR_INVALID_PARAM;
	TxOp *op = nullptr;
	ucs_status_t st = uct_xsrc_rc_ep_read_to_bounce(ep, OpKind::get_bcopy, length, remote_addr, rkey, comp, &op);
	if (st != UCS_OK)
		return st;
	op->unpack = unpack_cb;
	op->unpack_arg = arg;
	op->length = length;
	return UCS_INPROGRESS;
}

ucs_status_t uct_xsrc_rc_ep_get_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov, size_t iovcnt, uint64_t remote_addr,
			     uct_rkey_t rkey, uct_completion_t *comp)
{
	return uct_xsrc_rc_ep_rdma_zcopy(tl_ep, OpKind::get_zcopy, IBV_WR_RDMA_READ, iov, iovcnt, remote_addr, rkey, comp);
}


}  // namespace xsrc::uct
