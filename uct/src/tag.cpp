// Software tag matching over the core's internal messages (see tag.h for the protocol).
#include "tag.h"

#include "tag_matcher.h"

#include <xsrc/uct.h>

#include <ucs/debug/log_def.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace xsrc::uct {
namespace {

// --- Wire ---------------------------------------------------------------------------------
struct EagerHdr {
	uint64_t tag;
	uint64_t imm;
};

enum class RtsKind : uint8_t { zcopy = 1, request = 2 };

struct RtsHdr {
	uint64_t tag;
	uint64_t op_id;        // the sender's operation, echoed by the ATS (0 for rndv_request)
	uint64_t remote_addr;  // the sender's buffer
	uint64_t length;
	uint16_t hdr_len;      // user header bytes that follow
	uint16_t rkey_len;     // packed rkey bytes after the user header
	uint8_t kind;          // RtsKind
	uint8_t reserved[3];
};
static_assert(sizeof(RtsHdr) == 40);

struct AtsMsg {
	uint64_t op_id;
	int32_t status;  // ucs_status_t of the receiver's get
	uint32_t reserved;
};

inline constexpr size_t max_eager_iov = 16;
inline constexpr size_t num_tags = 1024;  // outstanding posted receives per iface
inline constexpr size_t max_rkey_len = 64;

// --- State ----------------------------------------------------------------------------------
struct TagState;

// A sender's rendezvous in progress; its address is the handle rndv_zcopy returns.
struct SendOp {
	uint64_t id;
	Ep *ep;
	uct_completion_t *comp;
};

// A receiver's matched RTS: get the data, then tell the sender (ATS).
struct RecvRndv {
	enum class Phase : uint8_t { get_wanted, get_in_flight, ats_wanted };
	uct_completion_t comp;  // must stay first: the get's completion leads back here
	TagState *state;        // null once the iface is gone (the core may still complete the get)
	tag::PostedRecv *recv;  // null once reported to the user
	Ep *src_ep;             // null once that ep failed: no ATS
	uint64_t op_id;
	uct_tag_t stag;
	size_t length;
	uint64_t remote_addr;
	uct_rkey_bundle_t rkey;
	bool rkey_valid;
	Phase phase;
	ucs_status_t status;
};

struct TagState {
	Iface *iface;
	tag::Matcher matcher{num_tags};
	uct_tag_unexp_eager_cb_t eager_cb = nullptr;
	void *eager_arg = nullptr;
	uct_tag_unexp_rndv_cb_t rndv_cb = nullptr;
	void *rndv_arg = nullptr;
	size_t rx_headroom = 0;
	size_t rkey_len = 0;
	uint64_t next_op_id = 1;
	std::unordered_map<uint64_t, SendOp *> send_by_id;
	std::unordered_set<SendOp *> send_ops;
	std::unordered_set<RecvRndv *> rndvs;
	std::deque<RecvRndv *> retry;  // gets and ATSs that met UCS_ERR_NO_RESOURCE
	bool warned_drop = false;
};

TagState *uct_xsrc_tag_state_of(Iface *iface) { return static_cast<TagState *>(iface_tag_state(iface)); }

void uct_xsrc_tag_invoke_completion(uct_completion_t *comp, ucs_status_t status)
{
	if (!comp)
		return;
	uct_completion_update_status(comp, status);
	if (--comp->count == 0)
		comp->func(comp);
}

size_t uct_xsrc_tag_iov_total(const uct_iov_t *iov, size_t iovcnt)
{
	size_t total = 0;
	for (size_t i = 0; i < iovcnt; ++i)
		total += iov[i].length * iov[i].count;
	return total;
}

// Copies `len` bytes of `src` into the (possibly strided) iov.
void uct_xsrc_tag_scatter(const uct_iov_t *iov, size_t iovcnt, const char *src, size_t len)
{
	for (size_t i = 0; i < iovcnt && len; ++i) {
		size_t stride = iov[i].stride ? iov[i].stride : iov[i].length;
		for (unsigned c = 0; c < iov[i].count && len; ++c) {
			size_t n = std::min(len, iov[i].length);
			std::memcpy(static_cast<char *>(iov[i].buffer) + c * stride, src, n);
			src += n;
			len -= n;
		}
	}
}

// Copies the (possibly strided) iov into `dst`; returns the bytes copied.
size_t uct_xsrc_tag_gather(char *dst, const uct_iov_t *iov, size_t iovcnt)
{
	size_t off = 0;
	for (size_t i = 0; i < iovcnt; ++i) {
		size_t stride = iov[i].stride ? iov[i].stride : iov[i].length;
		for (unsigned c = 0; c < iov[i].count; ++c) {
			std::memcpy(dst + off, static_cast<const char *>(iov[i].buffer) + c * stride, iov[i].length);
			off += iov[i].length;
		}
	}
	return off;
}

size_t uct_xsrc_tag_eager_max(Iface *iface) { return iface_internal_max(iface) - sizeof(EagerHdr); }
size_t uct_xsrc_tag_rndv_hdr_max(TagState *s) { return iface_internal_max(s->iface) - sizeof(RtsHdr) - s->rkey_len; }

// --- Unexpected descriptors --------------------------------------------------------------
// An unexpected eager message is copied into a descriptor of its own, laid out as UCT's
// DESC rule wants: [uct_recv_desc_t *][rx_headroom][payload]. The user may keep it
// (UCS_INPROGRESS) and give it back with uct_iface_release_desc(payload - rx_headroom),
// even after the iface is closed. Copying keeps the core's receive buffer (and so the
// sender's credit) free at once.
void uct_xsrc_tag_desc_release(uct_recv_desc_t *, void *desc) { std::free(static_cast<char *>(desc) - sizeof(uct_recv_desc_t *)); }
uct_recv_desc_t desc_releaser{uct_xsrc_tag_desc_release};

char *uct_xsrc_tag_desc_alloc(TagState *s, const void *payload, size_t len)
{
	auto *blk = static_cast<char *>(std::malloc(sizeof(uct_recv_desc_t *) + s->rx_headroom + len));
	if (!blk)
		return nullptr;
	uct_recv_desc_t *rd = &desc_releaser;
	std::memcpy(blk, &rd, sizeof(rd));
	char *data = blk + sizeof(uct_recv_desc_t *) + s->rx_headroom;
	if (len)
		std::memcpy(data, payload, len);
	return data;
}

void uct_xsrc_tag_desc_free(TagState *s, char *data) { std::free(data - s->rx_headroom - sizeof(uct_recv_desc_t *)); }

// --- Sending --------------------------------------------------------------------------------
struct EagerPack {
	EagerHdr hdr;
	const void *data = nullptr;  // short
	size_t length = 0;
	uct_pack_callback_t user_pack = nullptr;  // bcopy
	void *user_arg = nullptr;
	const uct_iov_t *iov = nullptr;  // zcopy
	size_t iovcnt = 0;
};

size_t uct_xsrc_tag_eager_pack(void *dest, void *arg)
{
	auto *p = static_cast<EagerPack *>(arg);
	auto *d = static_cast<char *>(dest);
	std::memcpy(d, &p->hdr, sizeof(p->hdr));
	d += sizeof(p->hdr);
	size_t n;
	if (p->user_pack)
		n = p->user_pack(d, p->user_arg);
	else if (p->iov)
		n = uct_xsrc_tag_gather(d, p->iov, p->iovcnt);
	else {
		if (p->length)
			std::memcpy(d, p->data, p->length);
		n = p->length;
	}
	return sizeof(EagerHdr) + n;
}

struct RtsPack {
	RtsHdr hdr;
	const void *user_hdr;
	const void *rkey;
};

size_t uct_xsrc_tag_rts_pack(void *dest, void *arg)
{
	auto *p = static_cast<RtsPack *>(arg);
	auto *d = static_cast<char *>(dest);
	std::memcpy(d, &p->hdr, sizeof(p->hdr));
	if (p->hdr.hdr_len)
		std::memcpy(d + sizeof(p->hdr), p->user_hdr, p->hdr.hdr_len);
	if (p->hdr.rkey_len)
		std::memcpy(d + sizeof(p->hdr) + p->hdr.hdr_len, p->rkey, p->hdr.rkey_len);
	return sizeof(p->hdr) + p->hdr.hdr_len + p->hdr.rkey_len;
}

size_t uct_xsrc_tag_ats_pack(void *dest, void *arg)
{
	std::memcpy(dest, arg, sizeof(AtsMsg));
	return sizeof(AtsMsg);
}

ucs_status_t uct_xsrc_tag_send_status(ssize_t r) { return r >= 0 ? UCS_OK : static_cast<ucs_status_t>(r); }

// --- Receiver's rendezvous ------------------------------------------------------------------
void uct_xsrc_tag_rndv_free(TagState *s, RecvRndv *rr)
{
	if (rr->rkey_valid)
		xsrc_uct_rkey_release(nullptr, &rr->rkey);
	if (s)
		s->rndvs.erase(rr);
	delete rr;
}

// Sends the ATS; false if it must wait for a send resource.
bool uct_xsrc_tag_rndv_send_ats(TagState *s, RecvRndv *rr)
{
	if (rr->src_ep) {
		AtsMsg m{rr->op_id, static_cast<int32_t>(rr->status), 0};
		ssize_t r = ep_send_internal(rr->src_ep, MsgKind::tag_rndv_ats, uct_xsrc_tag_ats_pack, &m);
		if (r == UCS_ERR_NO_RESOURCE)
			return false;
		// Another error: the ep failed and the sender's operation fails with it.
	}
	uct_xsrc_tag_rndv_free(s, rr);
	return true;
}

// Reports the receive to the user (once) and moves on to the ATS.
void uct_xsrc_tag_rndv_finish(TagState *s, RecvRndv *rr, ucs_status_t status)
{
	rr->status = status;
	if (rr->recv) {
		tag::PostedRecv *recv = rr->recv;
		uct_tag_context_t *ctx = recv->ctx;
		bool forgotten = recv->forgotten;
		rr->recv = nullptr;
		s->matcher.release(recv);  // before the callback: it may repost ctx
		if (!forgotten)
			ctx->completed_cb(ctx, rr->stag, 0, rr->length, nullptr, status);
	}
	if (rr->rkey_valid) {
		xsrc_uct_rkey_release(nullptr, &rr->rkey);
		rr->rkey_valid = false;
	}
	rr->phase = RecvRndv::Phase::ats_wanted;
	if (!uct_xsrc_tag_rndv_send_ats(s, rr))
		s->retry.push_back(rr);
}

void uct_xsrc_tag_rndv_get_done(uct_completion_t *comp)
{
	auto *rr = reinterpret_cast<RecvRndv *>(comp);  // comp is the first member
	if (!rr->state) {  // the iface closed while the get was moving
		uct_xsrc_tag_rndv_free(nullptr, rr);
		return;
	}
	uct_xsrc_tag_rndv_finish(rr->state, rr, comp->status);
}

// Starts the get; false if it must wait for a send resource.
bool uct_xsrc_tag_rndv_start_get(TagState *s, RecvRndv *rr)
{
	if (!rr->src_ep) {
		uct_xsrc_tag_rndv_finish(s, rr, UCS_ERR_CANCELED);
		return true;
	}
	// The posted iov, trimmed to the sender's length.
	uct_iov_t iov[tag::max_recv_iov];
	size_t iovcnt = 0, left = rr->length;
	for (size_t i = 0; i < rr->recv->iovcnt && left; ++i) {
		const uct_iov_t &src = rr->recv->iov[i];
		if (!src.count || !src.length)
			continue;
		iov[iovcnt] = src;
		iov[iovcnt].count = 1;
		iov[iovcnt].stride = 0;
		iov[iovcnt].length = std::min(left, src.length);
		left -= iov[iovcnt].length;
		++iovcnt;
	}
	rr->comp.func = uct_xsrc_tag_rndv_get_done;
	rr->comp.count = 1;
	rr->comp.status = UCS_OK;
	rr->phase = RecvRndv::Phase::get_in_flight;
	ucs_status_t st = uct_ep_get_zcopy(to_uct(rr->src_ep), iov, iovcnt, rr->remote_addr, rr->rkey.rkey, &rr->comp);
	if (st == UCS_INPROGRESS)
		return true;
	if (st == UCS_ERR_NO_RESOURCE) {
		rr->phase = RecvRndv::Phase::get_wanted;
		return false;
	}
	uct_xsrc_tag_rndv_finish(s, rr, st);  // UCS_OK: done at once; or the error
	return true;
}

// --- Internal message handlers --------------------------------------------------------------
ucs_status_t uct_xsrc_tag_on_eager(void *arg, Ep *, void *data, size_t length, unsigned)
{
	auto *s = static_cast<TagState *>(arg);
	if (length < sizeof(EagerHdr)) {
		ucs_warn("xsrc tag: short eager message (%zu bytes) dropped", length);
		return UCS_OK;
	}
	EagerHdr h;
	std::memcpy(&h, data, sizeof(h));
	const char *payload = static_cast<const char *>(data) + sizeof(h);
	size_t len = length - sizeof(h);

	if (tag::PostedRecv *recv = s->matcher.match(h.tag)) {
		uct_tag_context_t *ctx = recv->ctx;
		ucs_status_t status = UCS_OK;
		if (len > recv->length)
			status = UCS_ERR_MESSAGE_TRUNCATED;  // no data is copied
		else
			uct_xsrc_tag_scatter(recv->iov.data(), recv->iovcnt, payload, len);
		s->matcher.release(recv);
		ctx->tag_consumed_cb(ctx);
		ctx->completed_cb(ctx, h.tag, h.imm, len, nullptr, status);
		return UCS_OK;
	}

	if (!s->eager_cb) {
		if (!s->warned_drop)
			ucs_warn("xsrc tag: unexpected eager message, tag 0x%lx, and no eager_cb: dropped",
				 static_cast<unsigned long>(h.tag));
		s->warned_drop = true;
		return UCS_OK;
	}
	void *user_ctx = nullptr;
	char *desc = uct_xsrc_tag_desc_alloc(s, payload, len);
	if (!desc) {  // no memory for a descriptor: hand the data without DESC (user copies)
		s->eager_cb(s->eager_arg, const_cast<char *>(payload), len, UCT_CB_PARAM_FLAG_FIRST, h.tag, h.imm,
			    &user_ctx);
		return UCS_OK;
	}
	ucs_status_t r = s->eager_cb(s->eager_arg, desc, len, UCT_CB_PARAM_FLAG_FIRST | UCT_CB_PARAM_FLAG_DESC,
				     h.tag, h.imm, &user_ctx);
	if (r != UCS_INPROGRESS)
		uct_xsrc_tag_desc_free(s, desc);
	return UCS_OK;
}

ucs_status_t uct_xsrc_tag_on_rts(void *arg, Ep *src_ep, void *data, size_t length, unsigned)
{
	auto *s = static_cast<TagState *>(arg);
	RtsHdr h;
	if (length < sizeof(h)) {
		ucs_warn("xsrc tag: short RTS (%zu bytes) dropped", length);
		return UCS_OK;
	}
	std::memcpy(&h, data, sizeof(h));
	if (sizeof(h) + size_t{h.hdr_len} + h.rkey_len > length || h.rkey_len > max_rkey_len ||
	    (h.kind != static_cast<uint8_t>(RtsKind::zcopy) && h.kind != static_cast<uint8_t>(RtsKind::request))) {
		ucs_warn("xsrc tag: malformed RTS dropped");
		return UCS_OK;
	}
	const char *user_hdr = static_cast<const char *>(data) + sizeof(h);
	const char *rkey_buf = user_hdr + h.hdr_len;
	bool request = h.kind == static_cast<uint8_t>(RtsKind::request);

	tag::PostedRecv *recv = s->matcher.match(h.tag);
	if (!recv) {
		if (!s->rndv_cb) {
			if (!s->warned_drop)
				ucs_warn("xsrc tag: unexpected rendezvous, tag 0x%lx, and no rndv_cb: dropped",
					 static_cast<unsigned long>(h.tag));
			s->warned_drop = true;
			return UCS_OK;
		}
		// No DESC: header and rkey live in the receive buffer for the callback only.
		s->rndv_cb(s->rndv_arg, 0, h.tag, user_hdr, h.hdr_len, request ? 0 : h.remote_addr,
			   request ? 0 : h.length, request ? nullptr : rkey_buf);
		return UCS_OK;
	}

	uct_tag_context_t *ctx = recv->ctx;
	if (request) {  // software rendezvous: the protocol layer completes it
		s->matcher.release(recv);
		ctx->tag_consumed_cb(ctx);
		ctx->rndv_cb(ctx, h.tag, user_hdr, h.hdr_len, UCS_OK, UCT_TAG_RECV_CB_INLINE_DATA);
		return UCS_OK;
	}

	ctx->tag_consumed_cb(ctx);
	auto *rr = new RecvRndv{};
	rr->state = s;
	rr->recv = recv;
	rr->src_ep = src_ep;
	rr->op_id = h.op_id;
	rr->stag = h.tag;
	rr->length = h.length;
	rr->remote_addr = h.remote_addr;
	s->rndvs.insert(rr);
	if (h.length > recv->length) {
		uct_xsrc_tag_rndv_finish(s, rr, UCS_ERR_MESSAGE_TRUNCATED);
		return UCS_OK;
	}
	if (h.length == 0) {
		uct_xsrc_tag_rndv_finish(s, rr, UCS_OK);
		return UCS_OK;
	}
	ucs_status_t st = xsrc_uct_rkey_unpack(nullptr, rkey_buf, &rr->rkey);
	if (st != UCS_OK) {
		uct_xsrc_tag_rndv_finish(s, rr, st);
		return UCS_OK;
	}
	rr->rkey_valid = true;
	if (!uct_xsrc_tag_rndv_start_get(s, rr))
		s->retry.push_back(rr);
	return UCS_OK;
}

ucs_status_t uct_xsrc_tag_on_ats(void *arg, Ep *src_ep, void *data, size_t length, unsigned)
{
	auto *s = static_cast<TagState *>(arg);
	if (length < sizeof(AtsMsg))
		return UCS_OK;
	AtsMsg m;
	std::memcpy(&m, data, sizeof(m));
	auto it = s->send_by_id.find(m.op_id);
	if (it == s->send_by_id.end() || it->second->ep != src_ep)
		return UCS_OK;  // cancelled by the user meanwhile (rndv_cancel), or not ours
	SendOp *op = it->second;
	s->send_by_id.erase(it);
	s->send_ops.erase(op);
	uct_completion_t *comp = op->comp;
	delete op;
	// The peer's word for it: a status, never a positive value.
	ucs_status_t status = m.status > 0 ? UCS_ERR_IO_ERROR : static_cast<ucs_status_t>(m.status);
	uct_xsrc_tag_invoke_completion(comp, status);
	return UCS_OK;
}

ucs_status_t uct_xsrc_tag_rts_send(Ep *ep, uct_tag_t tag, RtsKind kind, uint64_t op_id, uint64_t addr, uint64_t length,
		      const void *header, unsigned header_length, const void *rkey, size_t rkey_len)
{
	RtsPack p{};
	p.hdr.tag = tag;
	p.hdr.op_id = op_id;
	p.hdr.remote_addr = addr;
	p.hdr.length = length;
	p.hdr.hdr_len = static_cast<uint16_t>(header_length);
	p.hdr.rkey_len = static_cast<uint16_t>(rkey_len);
	p.hdr.kind = static_cast<uint8_t>(kind);
	p.user_hdr = header;
	p.rkey = rkey;
	return uct_xsrc_tag_send_status(ep_send_internal(ep, MsgKind::tag_rndv_rts, uct_xsrc_tag_rts_pack, &p));
}

}  // namespace

// --- Module entry points --------------------------------------------------------------------
ucs_status_t uct_xsrc_tag_iface_init(Iface *iface, const uct_iface_params_t *params)
{
	auto s = std::make_unique<TagState>();
	s->iface = iface;
	uint64_t fm = params ? params->field_mask : 0;
	if (fm & UCT_IFACE_PARAM_FIELD_HW_TM_EAGER_CB)
		s->eager_cb = params->eager_cb;
	if (fm & UCT_IFACE_PARAM_FIELD_HW_TM_EAGER_ARG)
		s->eager_arg = params->eager_arg;
	if (fm & UCT_IFACE_PARAM_FIELD_HW_TM_RNDV_CB)
		s->rndv_cb = params->rndv_cb;
	if (fm & UCT_IFACE_PARAM_FIELD_HW_TM_RNDV_ARG)
		s->rndv_arg = params->rndv_arg;
	if (fm & UCT_IFACE_PARAM_FIELD_RX_HEADROOM)
		s->rx_headroom = params->rx_headroom;

	uct_md_attr_t md_attr{};
	ucs_status_t st = xsrc_uct_md_query(iface_md(iface), &md_attr);
	if (st != UCS_OK)
		return st;
	if (md_attr.rkey_packed_size > max_rkey_len)
		return UCS_ERR_UNSUPPORTED;
	s->rkey_len = md_attr.rkey_packed_size;
	if (iface_internal_max(iface) < sizeof(RtsHdr) + s->rkey_len + sizeof(AtsMsg))
		return UCS_ERR_UNSUPPORTED;

	TagState *raw = s.release();
	iface_set_tag_state(iface, raw);
	iface_set_internal_handler(iface, MsgKind::tag_eager, uct_xsrc_tag_on_eager, raw);
	iface_set_internal_handler(iface, MsgKind::tag_rndv_rts, uct_xsrc_tag_on_rts, raw);
	iface_set_internal_handler(iface, MsgKind::tag_rndv_ats, uct_xsrc_tag_on_ats, raw);
	return UCS_OK;
}

void uct_xsrc_tag_iface_cleanup(Iface *iface)
{
	TagState *s = uct_xsrc_tag_state_of(iface);
	if (!s)
		return;
	iface_set_internal_handler(iface, MsgKind::tag_eager, nullptr, nullptr);
	iface_set_internal_handler(iface, MsgKind::tag_rndv_rts, nullptr, nullptr);
	iface_set_internal_handler(iface, MsgKind::tag_rndv_ats, nullptr, nullptr);
	for (SendOp *op : s->send_ops)
		delete op;
	for (RecvRndv *rr : std::vector<RecvRndv *>(s->rndvs.begin(), s->rndvs.end())) {
		if (rr->phase == RecvRndv::Phase::get_in_flight) {
			rr->state = nullptr;  // the core may still complete the get: it frees itself then
			rr->recv = nullptr;
			rr->src_ep = nullptr;
		} else {
			uct_xsrc_tag_rndv_free(s, rr);
		}
	}
	iface_set_tag_state(iface, nullptr);
	delete s;
}

void uct_xsrc_tag_iface_query(Iface *iface, uct_iface_attr_t *attr)
{
	TagState *s = uct_xsrc_tag_state_of(iface);
	if (!s)
		return;
	size_t emax = uct_xsrc_tag_eager_max(iface);
	size_t get_max = attr->cap.get.max_zcopy ? attr->cap.get.max_zcopy : (size_t{1} << 30);
	size_t get_iov = attr->cap.get.max_iov ? attr->cap.get.max_iov : 1;

	attr->cap.flags |= UCT_IFACE_FLAG_TAG_EAGER_SHORT | UCT_IFACE_FLAG_TAG_EAGER_BCOPY |
			   UCT_IFACE_FLAG_TAG_EAGER_ZCOPY | UCT_IFACE_FLAG_TAG_RNDV_ZCOPY;
	attr->cap.tag.recv.min_recv = 0;
	attr->cap.tag.recv.max_zcopy = get_max;
	attr->cap.tag.recv.max_iov = std::min(tag::max_recv_iov, get_iov);
	attr->cap.tag.recv.max_outstanding = s->matcher.capacity();
	attr->cap.tag.eager.max_short = emax;
	attr->cap.tag.eager.max_bcopy = emax;
	attr->cap.tag.eager.max_zcopy = emax;
	attr->cap.tag.eager.max_iov = max_eager_iov;
	attr->cap.tag.rndv.max_zcopy = get_max;
	attr->cap.tag.rndv.max_hdr = uct_xsrc_tag_rndv_hdr_max(s);
	attr->cap.tag.rndv.max_iov = 1;
}

unsigned uct_xsrc_tag_iface_progress(Iface *iface)
{
	TagState *s = uct_xsrc_tag_state_of(iface);
	if (!s || s->retry.empty())
		return 0;
	unsigned done = 0;
	for (size_t n = s->retry.size(); n > 0; --n) {
		RecvRndv *rr = s->retry.front();
		s->retry.pop_front();
		bool ok = rr->phase == RecvRndv::Phase::get_wanted ? uct_xsrc_tag_rndv_start_get(s, rr) : uct_xsrc_tag_rndv_send_ats(s, rr);
		if (ok)
			++done;
		else
			s->retry.push_back(rr);
	}
	return done;
}

void uct_xsrc_tag_ep_failed(Iface *iface, Ep *ep, ucs_status_t status)
{
	TagState *s = uct_xsrc_tag_state_of(iface);
	if (!s)
		return;
	// The sender's rendezvous operations on this ep complete with the ep's error.
	std::vector<SendOp *> failed;
	for (SendOp *op : s->send_ops)
		if (op->ep == ep)
			failed.push_back(op);
	for (SendOp *op : failed) {
		s->send_by_id.erase(op->id);
		s->send_ops.erase(op);
		uct_completion_t *comp = op->comp;
		delete op;
		uct_xsrc_tag_invoke_completion(comp, status);
	}
	// The receiver's: no ATS can go back; a get not yet started fails now, one in flight
	// is completed (with an error) by the core.
	std::vector<RecvRndv *> waiting;
	for (RecvRndv *rr : s->rndvs) {
		if (rr->src_ep != ep)
			continue;
		rr->src_ep = nullptr;
		if (rr->phase == RecvRndv::Phase::get_wanted)
			waiting.push_back(rr);
	}
	for (RecvRndv *rr : waiting) {
		s->retry.erase(std::remove(s->retry.begin(), s->retry.end(), rr), s->retry.end());
		uct_xsrc_tag_rndv_finish(s, rr, status);  // src_ep is null: frees rr
	}
	// ATSs still waiting for a resource go nowhere now.
	std::vector<RecvRndv *> orphans;
	for (RecvRndv *rr : s->retry)
		if (!rr->src_ep && rr->phase == RecvRndv::Phase::ats_wanted)
			orphans.push_back(rr);
	for (RecvRndv *rr : orphans) {
		s->retry.erase(std::remove(s->retry.begin(), s->retry.end(), rr), s->retry.end());
		uct_xsrc_tag_rndv_free(s, rr);
	}
}

// --- Ops ----------------------------------------------------------------------------------
ucs_status_t uct_xsrc_tag_ep_eager_short(uct_ep_h tl_ep, uct_tag_t tag, const void *data, size_t length)
{
	Ep *ep = to_ep(tl_ep);
	if (length > uct_xsrc_tag_eager_max(ep_iface(ep)) || (length && !data))
		return UCS_ERR_INVALID_PARAM;
	EagerPack p{};
	p.hdr = {tag, 0};
	p.data = data;
	p.length = length;
	return uct_xsrc_tag_send_status(ep_send_internal(ep, MsgKind::tag_eager, uct_xsrc_tag_eager_pack, &p));
}

ssize_t uct_xsrc_tag_ep_eager_bcopy(uct_ep_h tl_ep, uct_tag_t tag, uint64_t imm, uct_pack_callback_t pack_cb, void *arg,
			   unsigned)
{
	if (!pack_cb)
		return UCS_ERR_INVALID_PARAM;
	Ep *ep = to_ep(tl_ep);
	EagerPack p{};
	p.hdr = {tag, imm};
	p.user_pack = pack_cb;
	p.user_arg = arg;
	ssize_t r = ep_send_internal(ep, MsgKind::tag_eager, uct_xsrc_tag_eager_pack, &p);
	return r < 0 ? r : r - static_cast<ssize_t>(sizeof(EagerHdr));
}

ucs_status_t uct_xsrc_tag_ep_eager_zcopy(uct_ep_h tl_ep, uct_tag_t tag, uint64_t imm, const uct_iov_t *iov, size_t iovcnt,
				unsigned, uct_completion_t *)
{
	Ep *ep = to_ep(tl_ep);
	if (iovcnt > max_eager_iov || (iovcnt && !iov) || uct_xsrc_tag_iov_total(iov, iovcnt) > uct_xsrc_tag_eager_max(ep_iface(ep)))
		return UCS_ERR_INVALID_PARAM;
	EagerPack p{};
	p.hdr = {tag, imm};
	p.iov = iov;
	p.iovcnt = iovcnt;
	// The data is copied into a send buffer before this returns, so the operation is
	// complete for the caller (UCS_OK) and `comp` is not used.
	return uct_xsrc_tag_send_status(ep_send_internal(ep, MsgKind::tag_eager, uct_xsrc_tag_eager_pack, &p));
}

ucs_status_ptr_t uct_xsrc_tag_ep_rndv_zcopy(uct_ep_h tl_ep, uct_tag_t tag, const void *header, unsigned header_length,
				   const uct_iov_t *iov, size_t iovcnt, unsigned, uct_completion_t *comp)
{
	Ep *ep = to_ep(tl_ep);
	TagState *s = uct_xsrc_tag_state_of(ep_iface(ep));
	if (!s)
		return UCS_STATUS_PTR(UCS_ERR_UNSUPPORTED);
	if (iovcnt > 1 || (iovcnt && !iov) || header_length > uct_xsrc_tag_rndv_hdr_max(s) || (header_length && !header))
		return UCS_STATUS_PTR(UCS_ERR_INVALID_PARAM);
	uint64_t addr = 0, length = 0;
	char rkey[max_rkey_len];
	size_t rkey_len = 0;
	if (iovcnt && iov[0].count && iov[0].length) {
		if (iov[0].count != 1 || iov[0].memh == UCT_MEM_HANDLE_NULL)
			return UCS_STATUS_PTR(UCS_ERR_INVALID_PARAM);  // one registered contiguous buffer
		addr = reinterpret_cast<uintptr_t>(iov[0].buffer);
		length = iov[0].length;
		ucs_status_t st = xsrc_uct_md_mkey_pack(iface_md(ep_iface(ep)), iov[0].memh, rkey);
		if (st != UCS_OK)
			return UCS_STATUS_PTR(st);
		rkey_len = s->rkey_len;
	}
	auto *op = new SendOp{s->next_op_id++, ep, comp};
	ucs_status_t st = uct_xsrc_tag_rts_send(ep, tag, RtsKind::zcopy, op->id, addr, length, header, header_length, rkey, rkey_len);
	if (st != UCS_OK) {
		delete op;
		return UCS_STATUS_PTR(st);
	}
	s->send_ops.insert(op);
	s->send_by_id.emplace(op->id, op);
	return op;
}

ucs_status_t uct_xsrc_tag_ep_rndv_cancel(uct_ep_h tl_ep, void *handle)
{
	Ep *ep = to_ep(tl_ep);
	TagState *s = uct_xsrc_tag_state_of(ep_iface(ep));
	auto *op = static_cast<SendOp *>(handle);
	if (!s || !s->send_ops.count(op) || op->ep != ep)
		return UCS_ERR_INVALID_PARAM;
	// Forget the operation: its completion is not called, and an ATS arriving later for it
	// is ignored. A receiver that already matched the RTS reads the buffer regardless (the
	// protocol layer cancels only after its own software completion, as with HW TM).
	s->send_by_id.erase(op->id);
	s->send_ops.erase(op);
	delete op;
	return UCS_OK;
}

ucs_status_t uct_xsrc_tag_ep_rndv_request(uct_ep_h tl_ep, uct_tag_t tag, const void *header, unsigned header_length, unsigned)
{
	Ep *ep = to_ep(tl_ep);
	TagState *s = uct_xsrc_tag_state_of(ep_iface(ep));
	if (!s)
		return UCS_ERR_UNSUPPORTED;
	if (header_length > uct_xsrc_tag_rndv_hdr_max(s) || (header_length && !header))
		return UCS_ERR_INVALID_PARAM;
	return uct_xsrc_tag_rts_send(ep, tag, RtsKind::request, 0, 0, 0, header, header_length, nullptr, 0);
}

ucs_status_t uct_xsrc_tag_iface_recv_zcopy(uct_iface_h tl_iface, uct_tag_t tag, uct_tag_t tag_mask, const uct_iov_t *iov,
				  size_t iovcnt, uct_tag_context_t *ctx)
{
	TagState *s = uct_xsrc_tag_state_of(to_iface(tl_iface));
	if (!s)
		return UCS_ERR_UNSUPPORTED;
	if (!ctx || !ctx->tag_consumed_cb || !ctx->completed_cb || !ctx->rndv_cb)
		return UCS_ERR_INVALID_PARAM;
	for (size_t i = 0; i < iovcnt; ++i)
		if (iov && iov[i].count > 1)
			return UCS_ERR_UNSUPPORTED;  // strided receive buffers: not offered
	return s->matcher.post(ctx, tag, tag_mask, iov, iovcnt);
}

ucs_status_t uct_xsrc_tag_iface_recv_cancel(uct_iface_h tl_iface, uct_tag_context_t *ctx, int force)
{
	TagState *s = uct_xsrc_tag_state_of(to_iface(tl_iface));
	if (!s || !ctx)
		return UCS_ERR_INVALID_PARAM;
	tag::PostedRecv *recv = s->matcher.find(ctx);
	if (!recv)
		return UCS_ERR_NO_ELEM;  // not posted (never, or already completed)
	if (recv->state == tag::RecvState::posted) {
		uct_tag_t tag = recv->tag;
		s->matcher.unpost(ctx);
		if (!force)
			ctx->completed_cb(ctx, tag, 0, 0, nullptr, UCS_ERR_CANCELED);
		return UCS_OK;
	}
	// Matched by a rendezvous whose data is moving: it completes within bounded time. With
	// force=0 the user hears UCS_OK (data received despite the cancel) or the get's error;
	// with force=1 the completion is not reported.
	if (force)
		recv->forgotten = true;
	return UCS_OK;
}

}  // namespace xsrc::uct
