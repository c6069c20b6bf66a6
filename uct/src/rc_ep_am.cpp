// The RC endpoint's active messages (and the internal messages of internal.h): a send of the
// shim's wire header and the payload, charged against the peer's credits (rc_iface.h).
#include "rc_iface.h"

#include <algorithm>
#include <cstring>

namespace xsrc::uct {

namespace {

// am_zcopy's header: at most this many bytes (cap.am.max_hdr).
constexpr unsigned am_zcopy_max_hdr = 128;

}  // namespace

ucs_status_t uct_xsrc_rc_ep_send_msg(Ep *ep, MsgKind kind, uint8_t am_id, uct_pack_callback_t pack, void *arg, ssize_t *packed)
{
	Iface *i = ep->iface;
	int buf;
	ucs_status_t st = uct_xsrc_rc_ep_tx_reserve(ep, true, &buf);
	if (st != UCS_OK)
		return st;
	char *at = uct_xsrc_rc_iface_buf_addr(i, buf);
	WireHdr hdr{static_cast<uint8_t>(kind), am_id, 0, ep->id, 0};
	memcpy(at, &hdr, sizeof(hdr));
	size_t len = pack(at + sizeof(WireHdr), arg);
	if (len > i->cfg.seg_size - sizeof(WireHdr)) {
		uct_xsrc_rc_iface_buf_put(i, buf);
		return UCS_ERR_EXCEEDS_LIMIT;
	}
	if (i->base.am_tracer && kind == MsgKind::user_am)
		i->base.am_tracer(i->base.am_tracer_arg, UCT_AM_TRACE_TYPE_SEND, am_id, at + sizeof(WireHdr), len, nullptr, 0);
	ibv_sge sge{reinterpret_cast<uintptr_t>(at), static_cast<uint32_t>(sizeof(WireHdr) + len), i->tx_mr->lkey};
	st = uct_xsrc_rc_ep_post_rdma(ep, OpKind::send, IBV_WR_SEND, &sge, 1, 0, 0, nullptr, buf);
	if (st != UCS_OK)
		return st;
	++ep->sent;
	*packed = static_cast<ssize_t>(len);
	return UCS_OK;
}

namespace {

struct ShortArgs {
	uint64_t header;
	const void *payload;
	unsigned length;
};

size_t uct_xsrc_rc_ep_am_pack_short(void *dest, void *arg)
{
	auto *a = static_cast<ShortArgs *>(arg);
	memcpy(dest, &a->header, sizeof(a->header));
	if (a->length)
		memcpy(static_cast<char *>(dest) + sizeof(a->header), a->payload, a->length);
	return sizeof(a->header) + a->length;
}

struct IovArgs {
	const uct_iov_t *iov;
	size_t iovcnt;
};

size_t uct_xsrc_rc_ep_am_pack_iov(void *dest, void *arg)
{
	auto *a = static_cast<IovArgs *>(arg);
	size_t off = 0;
	for (size_t k = 0; k < a->iovcnt; ++k) {
		unsigned count = a->iov[k].count ? a->iov[k].count : 1;
		for (unsigned c = 0; c < count; ++c) {
			memcpy(static_cast<char *>(dest) + off,
			       static_cast<const char *>(a->iov[k].buffer) + c * a->iov[k].stride, a->iov[k].length);
			off += a->iov[k].length;
		}
	}
	return off;
}

size_t uct_xsrc_rc_ep_am_iov_bytes(const uct_iov_t *iov, size_t iovcnt)
{
	size_t t = 0;
	for (size_t k = 0; k < iovcnt; ++k)
		t += iov[k].length * (iov[k].count ? iov[k].count : 1);
	return t;
}

}  // namespace

ucs_status_t uct_xsrc_rc_ep_am_short(uct_ep_h tl_ep, uint8_t id, uint64_t header, const void *payload, unsigned length)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	if (id >= UCT_AM_ID_MAX || (length && !payload) ||
	    sizeof(header) + length > std::min(i->cfg.max_short, i->cfg.seg_size - sizeof(WireHdr)))
		return UCS_ERR_INVALID_PARAM;
	ShortArgs a{header, payload, length};
	ssize_t packed;
	return uct_xsrc_rc_ep_send_msg(ep, MsgKind::user_am, id, uct_xsrc_rc_ep_am_pack_short, &a, &packed);
}

ucs_status_t uct_xsrc_rc_ep_am_short_iov(uct_ep_h tl_ep, uint8_t id, const uct_iov_t *iov, size_t iovcnt)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	if (id >= UCT_AM_ID_MAX || (iovcnt && !iov) ||
	    uct_xsrc_rc_ep_am_iov_bytes(iov, iovcnt) > std::min(i->cfg.max_short, i->cfg.seg_size - sizeof(WireHdr)))
		return UCS_ERR_INVALID_PARAM;
	IovArgs a{iov, iovcnt};
	ssize_t packed;
	return uct_xsrc_rc_ep_send_msg(ep, MsgKind::user_am, id, uct_xsrc_rc_ep_am_pack_iov, &a, &packed);
}

ssize_t uct_xsrc_rc_ep_am_bcopy(uct_ep_h tl_ep, uint8_t id, uct_pack_callback_t pack_cb, void *arg, unsigned)
{
	if (id >= UCT_AM_ID_MAX || !pack_cb)
		return UCS_ERR_INVALID_PARAM;
	ssize_t packed = 0;
	ucs_status_t st = uct_xsrc_rc_ep_send_msg(ep_of(tl_ep), MsgKind::user_am, id, pack_cb, arg, &packed);
	return st == UCS_OK ? packed : static_cast<ssize_t>(st);
}

ucs_status_t uct_xsrc_rc_ep_am_zcopy(uct_ep_h tl_ep, uint8_t id, const void *header, unsigned header_length,
			    const uct_iov_t *iov, size_t iovcnt, unsigned, uct_completion_t *comp)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	if (id >= UCT_AM_ID_MAX || header_length > am_zcopy_max_hdr || (header_length && !header))
		return UCS_ERR_INVALID_PARAM;
	ibv_sge sge[max_sge_limit];
	unsigned n;
	size_t total;
	ucs_status_t st = uct_xsrc_rc_ep_iov_to_sge(iov, iovcnt, sge + 1, i->max_sge - 1, &n, &total);
	if (st != UCS_OK)
		return st;
	if (header_length + total > i->cfg.seg_size - sizeof(WireHdr))
		return UCS_ERR_INVALID_PARAM;
	int buf;
	st = uct_xsrc_rc_ep_tx_reserve(ep, true, &buf);
	if (st != UCS_OK)
		return st;
	char *at = uct_xsrc_rc_iface_buf_addr(i, buf);
	WireHdr hdr{static_cast<uint8_t>(MsgKind::user_am), id, 0, ep->id, 0};
	memcpy(at, &hdr, sizeof(hdr));
	if (header_length)
		memcpy(at + sizeof(hdr), header, header_length);
	sge[0] = {reinterpret_cast<uintptr_t>(at), static_cast<uint32_t>(sizeof(hdr) + header_length), i->tx_mr->lkey};
	st = uct_xsrc_rc_ep_post_rdma(ep, OpKind::send, IBV_WR_SEND, sge, n + 1, 0, 0, comp, buf);
	if (st != UCS_OK)
		return st;
	++ep->sent;
	return UCS_INPROGRESS;
}


}  // namespace xsrc::uct
