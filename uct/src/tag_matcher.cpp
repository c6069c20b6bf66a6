#include "tag_matcher.h"

#include <cstring>

namespace xsrc::uct::tag {

Matcher::Matcher(size_t capacity) : slots_(capacity)
{
	free_.reserve(capacity);
	for (size_t i = capacity; i-- > 0;)  // pop_back hands out slot 0 first
		free_.push_back(static_cast<uint32_t>(i));
}

ucs_status_t Matcher::post(uct_tag_context_t *ctx, uct_tag_t tag, uct_tag_t mask, const uct_iov_t *iov,
                           size_t iovcnt)
{
	if (!ctx || iovcnt > max_recv_iov || (iovcnt && !iov))
		return UCS_ERR_INVALID_PARAM;
	if (find(ctx))
		return UCS_ERR_INVALID_PARAM;  // the same context twice would corrupt the list
	if (free_.empty())
		return UCS_ERR_EXCEEDS_LIMIT;

	uint32_t i = free_.back();
	free_.pop_back();
	PostedRecv &r = slots_[i];
	r.ctx = ctx;
	r.tag = tag;
	r.mask = mask;
	r.iovcnt = iovcnt;
	r.length = 0;
	for (size_t k = 0; k < iovcnt; ++k) {
		r.iov[k] = iov[k];
		r.length += iov[k].length * iov[k].count;  // UCX: an entry is `count` elements
	}
	r.state = RecvState::posted;
	r.forgotten = false;
	++r.generation;
	Priv p{priv_magic, i, r.generation};
	std::memcpy(ctx->priv, &p, sizeof(p));
	link_tail(i);
	++posted_count_;
	++outstanding_;
	return UCS_OK;
}

PostedRecv *Matcher::match(uct_tag_t stag)
{
	for (uint32_t i = head_; i != none; i = slots_[i].next) {
		PostedRecv &r = slots_[i];
		if (((stag ^ r.tag) & r.mask) == 0) {
			unlink(i);
			--posted_count_;
			r.state = RecvState::in_flight;
			return &r;
		}
	}
	return nullptr;
}

PostedRecv *Matcher::find(const uct_tag_context_t *ctx)
{
	Priv p;
	std::memcpy(&p, ctx->priv, sizeof(p));
	if (p.magic != priv_magic || p.index >= slots_.size())
		return nullptr;
	PostedRecv &r = slots_[p.index];
	if (r.state == RecvState::free || r.ctx != ctx || r.generation != p.generation)
		return nullptr;
	return &r;
}

bool Matcher::unpost(uct_tag_context_t *ctx)
{
	PostedRecv *r = find(ctx);
	if (!r || r->state != RecvState::posted)
		return false;
	uint32_t i = index_of(r);
	unlink(i);
	--posted_count_;
	free_slot(i);
	return true;
}

void Matcher::release(PostedRecv *r)
{
	if (r->state != RecvState::in_flight)
		return;
	free_slot(index_of(r));
}

void Matcher::link_tail(uint32_t i)
{
	slots_[i].prev = tail_;
	slots_[i].next = none;
	if (tail_ != none)
		slots_[tail_].next = i;
	else
		head_ = i;
	tail_ = i;
}

void Matcher::unlink(uint32_t i)
{
	PostedRecv &r = slots_[i];
	if (r.prev != none)
		slots_[r.prev].next = r.next;
	else
		head_ = r.next;
	if (r.next != none)
		slots_[r.next].prev = r.prev;
	else
		tail_ = r.prev;
	r.prev = r.next = none;
}

void Matcher::free_slot(uint32_t i)
{
	PostedRecv &r = slots_[i];
	// Invalidate the context's priv so a stale cancel is recognised (unless the user gave
	// the context up with a forced cancel: it may be gone).
	if (!r.forgotten) {
		Priv dead{};
		std::memcpy(r.ctx->priv, &dead, sizeof(dead));
	}
	r.ctx = nullptr;
	r.state = RecvState::free;
	r.forgotten = false;
	--outstanding_;
	free_.push_back(i);
}

}  // namespace xsrc::uct::tag
