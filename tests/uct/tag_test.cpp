// Tag matching of the UCT shim between two processes on xsrc0, through UCX's public API
// (uct_ep_tag_eager_short/bcopy/zcopy, uct_ep_tag_rndv_zcopy/cancel/request,
// uct_iface_tag_recv_zcopy/cancel). The GoogleTest process is the receiver; the peer is a
// sender driven by commands over the socketpair (except in the dead-peer case, where the
// peer is the receiver that dies).
#include "tag_harness.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

using namespace xsrc_uct_test;

namespace {

// --- What the receiver records ----------------------------------------------------------------
struct UnexpEager {
	std::string data;
	unsigned flags;
	uct_tag_t stag;
	uint64_t imm;
	void *desc;  // non-null if kept (UCS_INPROGRESS)
};

struct UnexpRndv {
	unsigned flags;
	uct_tag_t stag;
	std::string hdr;
	uint64_t addr;
	size_t length;
	std::string rkey;  // empty if rkey_buf was null
};

struct Recorder {
	std::vector<UnexpEager> eager;
	std::vector<UnexpRndv> rndv;
	bool keep_next = false;
	size_t rkey_size = 0;
};

ucs_status_t on_unexp_eager(void *arg, void *data, size_t length, unsigned flags, uct_tag_t stag, uint64_t imm,
			    void **)
{
	auto *r = static_cast<Recorder *>(arg);
	bool keep = r->keep_next && (flags & UCT_CB_PARAM_FLAG_DESC);
	r->keep_next = false;
	r->eager.push_back({std::string(static_cast<char *>(data), length), flags, stag, imm, keep ? data : nullptr});
	return keep ? UCS_INPROGRESS : UCS_OK;
}

ucs_status_t on_unexp_rndv(void *arg, unsigned flags, uint64_t stag, const void *header, unsigned header_length,
			   uint64_t remote_addr, size_t length, const void *rkey_buf)
{
	auto *r = static_cast<Recorder *>(arg);
	UnexpRndv u{flags, stag, std::string(static_cast<const char *>(header), header_length), remote_addr, length, {}};
	if (rkey_buf)
		u.rkey.assign(static_cast<const char *>(rkey_buf), r->rkey_size);
	r->rndv.push_back(u);
	return UCS_OK;
}

uct_iface_params_t tag_params(Recorder *rec)
{
	uct_iface_params_t p{};
	p.field_mask = UCT_IFACE_PARAM_FIELD_HW_TM_EAGER_CB | UCT_IFACE_PARAM_FIELD_HW_TM_EAGER_ARG |
		       UCT_IFACE_PARAM_FIELD_HW_TM_RNDV_CB | UCT_IFACE_PARAM_FIELD_HW_TM_RNDV_ARG;
	p.eager_cb = on_unexp_eager;
	p.eager_arg = rec;
	p.rndv_cb = on_unexp_rndv;
	p.rndv_arg = rec;
	return p;
}

size_t rkey_size(uct_md_h md)
{
	uct_md_attr_t a{};
	return xsrc_uct_md_query(md, &a) == UCS_OK ? a.rkey_packed_size : 0;
}

// The bytes every message carries: a function of the tag, so each side can check.
void fill(char *p, size_t len, uint64_t tag)
{
	for (size_t i = 0; i < len; ++i)
		p[i] = static_cast<char>((tag * 31 + i * 7 + (i >> 8)) & 0xff);
}

bool check_pattern(const char *p, size_t len, uint64_t tag)
{
	for (size_t i = 0; i < len; ++i)
		if (p[i] != static_cast<char>((tag * 31 + i * 7 + (i >> 8)) & 0xff))
			return false;
	return true;
}

// A posted receive and what happened to it.
struct Recv {
	uct_tag_context_t ctx{};  // must stay first
	std::vector<char> buf;
	uct_mem_h memh = nullptr;
	std::vector<char> events;  // 'c' consumed, 'd' completed, 'r' rndv
	uct_tag_t stag = 0;
	uint64_t imm = ~0ull;
	size_t length = 0;
	ucs_status_t status = UCS_INPROGRESS;
	bool inline_data = false;
	std::string hdr;
	unsigned rndv_flags = 0;

	explicit Recv(size_t size) : buf(size)
	{
		ctx.tag_consumed_cb = [](uct_tag_context_t *self) { reinterpret_cast<Recv *>(self)->events.push_back('c'); };
		ctx.completed_cb = [](uct_tag_context_t *self, uct_tag_t s_tag, uint64_t s_imm, size_t len, void *data,
				      ucs_status_t st) {
			auto *r = reinterpret_cast<Recv *>(self);
			r->events.push_back('d');
			r->stag = s_tag;
			r->imm = s_imm;
			r->length = len;
			r->inline_data = data != nullptr;
			r->status = st;
		};
		ctx.rndv_cb = [](uct_tag_context_t *self, uct_tag_t s_tag, const void *header, unsigned header_length,
				 ucs_status_t st, unsigned flags) {
			auto *r = reinterpret_cast<Recv *>(self);
			r->events.push_back('r');
			r->stag = s_tag;
			r->hdr.assign(static_cast<const char *>(header), header_length);
			r->status = st;
			r->rndv_flags = flags;
		};
	}
	ucs_status_t post(Side &s, uct_tag_t tag, uct_tag_t mask = ~0ull, bool reg = false)
	{
		if (reg && !memh)
			memh = s.reg(buf.data(), buf.size());
		uct_iov_t iov{};
		iov.buffer = buf.data();
		iov.length = buf.size();
		iov.memh = memh ? memh : UCT_MEM_HANDLE_NULL;
		iov.count = 1;
		return uct_iface_tag_recv_zcopy(s.iface, tag, mask, &iov, 1, &ctx);
	}
	bool done() const { return !events.empty() && (events.back() == 'd' || events.back() == 'r'); }
};

// --- Commands to the sending peer -------------------------------------------------------------
struct Cmd {
	char op;  // S B Z (eager short/bcopy/zcopy), R (rndv_zcopy), W (wait for it), C (rndv_cancel),
	          // Q (rndv_request), X (exit)
	uint64_t tag = 0;
	uint64_t imm = 0;
	uint64_t len = 0;
	uint32_t hdr_len = 0;
	char hdr[200]{};
};

struct Reply {
	int64_t status = 0;  // the op's return (a ucs_status_t, or a bcopy length)
	int64_t extra = 0;   // W: the completion's status; C: completions seen after the cancel
};

Cmd make_cmd(char op, uint64_t tag, uint64_t len = 0, uint64_t imm = 0, std::string_view hdr = {})
{
	Cmd c{};
	c.op = op;
	c.tag = tag;
	c.len = len;
	c.imm = imm;
	c.hdr_len = static_cast<uint32_t>(hdr.size());
	if (!hdr.empty())
		std::memcpy(c.hdr, hdr.data(), std::min(hdr.size(), sizeof(c.hdr)));
	return c;
}

// Sends a command and waits for the reply, progressing the local side meanwhile.
bool ask(Side &s, Link &link, const Cmd &c, Reply *reply)
{
	if (!link.send_value(c))
		return false;
	auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
	while (!link.readable()) {
		if (std::chrono::steady_clock::now() > end)
			return false;
		if (!s.progress())
			usleep(20);
	}
	return link.recv_value(reply, kLinkTimeout);
}

struct PackArg {
	const char *src;
	size_t len;
};

size_t pack_copy(void *dest, void *arg)
{
	auto *a = static_cast<PackArg *>(arg);
	std::memcpy(dest, a->src, a->len);
	return a->len;
}

struct OpComp {
	uct_completion_t comp{};  // must stay first
	int fired = 0;
	ucs_status_t status = UCS_OK;
	OpComp()
	{
		comp.func = [](uct_completion_t *c) {
			auto *o = reinterpret_cast<OpComp *>(c);
			++o->fired;
			o->status = c->status;
		};
		reset();
	}
	void reset()
	{
		comp.count = 1;
		comp.status = UCS_OK;
		fired = 0;
		status = UCS_OK;
	}
};

XSRC_UCT_PEER(sender)
{
	Recorder rec;
	Side side;
	PEER_CHECK_EQ(side.open(tag_params(&rec)), UCS_OK);
	uct_ep_h ep = side.connect(link);
	PEER_CHECK(ep != nullptr);
	std::vector<char> big(4u << 20);
	uct_mem_h memh = side.reg(big.data(), big.size());
	PEER_CHECK(memh != nullptr);
	OpComp op_comp;
	void *op = nullptr;

	for (;;) {
		while (!link.readable())
			if (!side.progress())
				usleep(20);
		Cmd c;
		if (!link.recv_value(&c, kLinkTimeout))
			return 0;  // the test side is gone
		Reply r;
		size_t len = std::min<size_t>(c.len, big.size());
		fill(big.data(), len, c.tag);
		// A header longer than the command's buffer (to test the limit) comes from `big`.
		const char *hdr = c.hdr_len <= sizeof(c.hdr) ? c.hdr : big.data();
		switch (c.op) {
		case 'S':
			r.status = side.retry([&] { return uct_ep_tag_eager_short(ep, c.tag, big.data(), c.len); });
			break;
		case 'B': {
			PackArg a{big.data(), len};
			r.status = side.retry([&] { return uct_ep_tag_eager_bcopy(ep, c.tag, c.imm, pack_copy, &a, 0); });
			break;
		}
		case 'Z': {
			uct_iov_t iov[2]{};
			iov[0] = {big.data(), len / 3, memh, 0, 1};
			iov[1] = {big.data() + len / 3, len - len / 3, memh, 0, 1};
			OpComp zc;
			r.status = side.retry([&] { return uct_ep_tag_eager_zcopy(ep, c.tag, c.imm, iov, 2, 0, &zc.comp); });
			if (r.status == UCS_INPROGRESS)
				PEER_CHECK(side.progress_until([&] { return zc.fired > 0; }));
			break;
		}
		case 'R': {
			uct_iov_t iov{big.data(), len, memh, 0, 1};
			op_comp.reset();
			intptr_t p = side.retry([&] {
				return reinterpret_cast<intptr_t>(
					uct_ep_tag_rndv_zcopy(ep, c.tag, hdr, c.hdr_len, &iov, 1, 0, &op_comp.comp));
			});
			r.status = UCS_PTR_IS_ERR(reinterpret_cast<void *>(p)) ? UCS_PTR_STATUS(reinterpret_cast<void *>(p))
									       : UCS_OK;
			op = UCS_PTR_IS_ERR(reinterpret_cast<void *>(p)) ? nullptr : reinterpret_cast<void *>(p);
			break;
		}
		case 'W':
			side.progress_until([&] { return op_comp.fired > 0; }, 10000);
			r.status = op_comp.fired;
			r.extra = op_comp.status;
			break;
		case 'C':
			r.status = uct_ep_tag_rndv_cancel(ep, op);
			side.progress_for(300);
			r.extra = op_comp.fired;
			break;
		case 'Q':
			r.status = side.retry([&] { return uct_ep_tag_rndv_request(ep, c.tag, hdr, c.hdr_len, 0); });
			break;
		case 'X':
			uct_ep_destroy(ep);
			xsrc_uct_md_mem_dereg(side.md, memh);
			link.send_value(r);
			return 0;
		default:
			PEER_CHECK(!"unknown command");
		}
		PEER_CHECK(link.send_value(r));
	}
}

// The receiving peer that dies in the middle of a rendezvous.
XSRC_UCT_PEER(rndv_victim)
{
	Recorder rec;
	Side side;
	PEER_CHECK_EQ(side.open(tag_params(&rec)), UCS_OK);
	uct_ep_h ep = side.connect(link);
	PEER_CHECK(ep != nullptr);
	PEER_CHECK(side.progress_until([&] { return !rec.rndv.empty(); }));
	link.send_frame("got the RTS");
	_exit(0);  // no ATS, no clean-up: the sender must see its operation fail
}

// --- Fixture ------------------------------------------------------------------------------------
class Tag : public ::testing::Test {
protected:
	void SetUp() override
	{
		ASSERT_EQ(side.open(tag_params(&rec)), UCS_OK);
		rec.rkey_size = rkey_size(side.md);
		ASSERT_TRUE(side.attr.cap.flags & UCT_IFACE_FLAG_TAG_EAGER_SHORT);
		ASSERT_TRUE(side.attr.cap.flags & UCT_IFACE_FLAG_TAG_EAGER_BCOPY);
		ASSERT_TRUE(side.attr.cap.flags & UCT_IFACE_FLAG_TAG_EAGER_ZCOPY);
		ASSERT_TRUE(side.attr.cap.flags & UCT_IFACE_FLAG_TAG_RNDV_ZCOPY);
	}
	void start(const char *scenario)
	{
		peer = std::make_unique<Peer>(scenario);
		ASSERT_TRUE(peer->started());
		ep = side.connect(peer->link);
		ASSERT_NE(ep, nullptr);
	}
	Reply run(const Cmd &c)
	{
		Reply r;
		EXPECT_TRUE(ask(side, peer->link, c, &r)) << "command " << c.op;
		return r;
	}
	void TearDown() override
	{
		if (peer && peer->started() && ep) {
			Reply r;
			ask(side, peer->link, make_cmd('X', 0), &r);
			EXPECT_EQ(peer->wait(), 0) << "the peer's checks";
		}
		if (ep)
			uct_ep_destroy(ep);
	}
	const auto &cap() const { return side.attr.cap.tag; }

	Recorder rec;
	Side side;
	std::unique_ptr<Peer> peer;
	uct_ep_h ep = nullptr;
};

TEST_F(Tag, QueryReportsHonestLimits)
{
	EXPECT_GT(cap().eager.max_short, 0u);
	EXPECT_GE(cap().eager.max_bcopy, cap().eager.max_short);
	EXPECT_GT(cap().eager.max_zcopy, 0u);
	EXPECT_GE(cap().eager.max_iov, 2u);
	EXPECT_GT(cap().rndv.max_zcopy, size_t{1} << 20);
	EXPECT_GT(cap().rndv.max_hdr, 64u);
	EXPECT_EQ(cap().rndv.max_iov, 1u);
	EXPECT_GE(cap().recv.max_iov, 1u);
	EXPECT_GT(cap().recv.max_outstanding, 0u);
}

TEST_F(Tag, EagerExpectedAllSizes)
{
	start("sender");
	size_t ls = cap().eager.max_short, lb = cap().eager.max_bcopy, lz = cap().eager.max_zcopy;
	Recv r1(ls), r2(lb), r3(lz);
	ASSERT_EQ(r1.post(side, 1), UCS_OK);
	ASSERT_EQ(r2.post(side, 2), UCS_OK);
	ASSERT_EQ(r3.post(side, 3, ~0ull, true), UCS_OK);
	EXPECT_EQ(run(make_cmd('S', 1, ls)).status, UCS_OK);
	EXPECT_EQ(run(make_cmd('B', 2, lb, 0xB0B)).status, static_cast<int64_t>(lb));
	EXPECT_EQ(run(make_cmd('Z', 3, lz, 0xC0C)).status, UCS_OK);
	ASSERT_TRUE(side.progress_until([&] { return r1.done() && r2.done() && r3.done(); }));

	Recv *rs[] = {&r1, &r2, &r3};
	size_t lens[] = {ls, lb, lz};
	uint64_t imms[] = {0, 0xB0B, 0xC0C};
	for (int k = 0; k < 3; ++k) {
		SCOPED_TRACE(k);
		EXPECT_EQ(rs[k]->events, (std::vector<char>{'c', 'd'})) << "tag_consumed_cb, then completed_cb";
		EXPECT_EQ(rs[k]->status, UCS_OK);
		EXPECT_EQ(rs[k]->stag, static_cast<uct_tag_t>(k + 1));
		EXPECT_EQ(rs[k]->imm, imms[k]);
		EXPECT_EQ(rs[k]->length, lens[k]);
		EXPECT_FALSE(rs[k]->inline_data) << "the data is in the posted buffer";
		EXPECT_TRUE(check_pattern(rs[k]->buf.data(), lens[k], k + 1));
	}
	EXPECT_TRUE(rec.eager.empty());
	if (r3.memh)
		xsrc_uct_md_mem_dereg(side.md, r3.memh);
}

TEST_F(Tag, EagerUnexpectedAllSizesWithDesc)
{
	start("sender");
	size_t ls = cap().eager.max_short, lb = cap().eager.max_bcopy, lz = cap().eager.max_zcopy;
	EXPECT_EQ(run(make_cmd('S', 11, ls)).status, UCS_OK);
	ASSERT_TRUE(side.progress_until([&] { return rec.eager.size() == 1; }));
	rec.keep_next = true;  // we keep the bcopy's descriptor (UCS_INPROGRESS)
	EXPECT_EQ(run(make_cmd('B', 12, lb, 0xB1)).status, static_cast<int64_t>(lb));
	ASSERT_TRUE(side.progress_until([&] { return rec.eager.size() == 2; }));
	EXPECT_EQ(run(make_cmd('Z', 13, lz, 0xC1)).status, UCS_OK);
	ASSERT_TRUE(side.progress_until([&] { return rec.eager.size() == 3; }));

	size_t lens[] = {ls, lb, lz};
	uint64_t imms[] = {0, 0xB1, 0xC1};
	for (int k = 0; k < 3; ++k) {
		SCOPED_TRACE(k);
		const UnexpEager &u = rec.eager[k];
		EXPECT_EQ(u.flags, unsigned{UCT_CB_PARAM_FLAG_FIRST | UCT_CB_PARAM_FLAG_DESC}) << "one fragment, a descriptor";
		EXPECT_EQ(u.stag, static_cast<uct_tag_t>(11 + k));
		EXPECT_EQ(u.imm, imms[k]);
		ASSERT_EQ(u.data.size(), lens[k]);
		EXPECT_TRUE(check_pattern(u.data.data(), lens[k], 11 + k));
	}
	// The kept descriptor still holds the message after more traffic, and goes back.
	ASSERT_NE(rec.eager[1].desc, nullptr);
	EXPECT_TRUE(check_pattern(static_cast<char *>(rec.eager[1].desc), lb, 12));
	uct_iface_release_desc(rec.eager[1].desc);

	// No unexpected queue in the transport: a receive posted now does not match the past.
	Recv late(ls);
	ASSERT_EQ(late.post(side, 11), UCS_OK);
	side.progress_for(200);
	EXPECT_TRUE(late.events.empty());
	EXPECT_EQ(uct_iface_tag_recv_cancel(side.iface, &late.ctx, 1), UCS_OK);
}

TEST_F(Tag, EagerMaskAndTruncation)
{
	start("sender");
	Recv masked(8), exact(64);
	ASSERT_EQ(masked.post(side, 0xAB00, 0xFF00), UCS_OK);
	ASSERT_EQ(exact.post(side, 5), UCS_OK);
	EXPECT_EQ(run(make_cmd('B', 0xAB42, 64, 9)).status, 64);  // matches `masked`, too long for it
	EXPECT_EQ(run(make_cmd('S', 5, 16)).status, UCS_OK);
	EXPECT_EQ(run(make_cmd('S', 0x1234, 4)).status, UCS_OK);  // matches nothing
	ASSERT_TRUE(side.progress_until([&] { return masked.done() && exact.done() && rec.eager.size() == 1; }));
	EXPECT_EQ(masked.events, (std::vector<char>{'c', 'd'}));
	EXPECT_EQ(masked.status, UCS_ERR_MESSAGE_TRUNCATED);
	EXPECT_EQ(masked.stag, 0xAB42u) << "the sender's tag, not the posted one";
	EXPECT_EQ(exact.status, UCS_OK);
	EXPECT_EQ(exact.length, 16u);
	EXPECT_TRUE(check_pattern(exact.buf.data(), 16, 5));
	EXPECT_EQ(rec.eager[0].stag, 0x1234u);
	// Too long for eager short: refused at the sender.
	EXPECT_EQ(run(make_cmd('S', 6, cap().eager.max_short + 1)).status, UCS_ERR_INVALID_PARAM);
}

TEST_F(Tag, RndvExpected)
{
	start("sender");
	const size_t len = 600000;
	Recv r(1u << 20);
	ASSERT_EQ(r.post(side, 77, ~0ull, true), UCS_OK);
	ASSERT_NE(r.memh, nullptr);
	EXPECT_EQ(run(make_cmd('R', 77, len, 0, "hdr-not-delivered-when-expected")).status, UCS_OK);
	ASSERT_TRUE(side.progress_until([&] { return r.done(); }));
	EXPECT_EQ(r.events, (std::vector<char>{'c', 'd'}));
	EXPECT_EQ(r.status, UCS_OK);
	EXPECT_EQ(r.stag, 77u);
	EXPECT_EQ(r.imm, 0u) << "rendezvous: imm is always 0";
	EXPECT_EQ(r.length, len);
	EXPECT_TRUE(check_pattern(r.buf.data(), len, 77));
	Reply w = run(make_cmd('W', 0));
	EXPECT_EQ(w.status, 1) << "the sender's completion fired once";
	EXPECT_EQ(w.extra, UCS_OK);
	EXPECT_TRUE(rec.rndv.empty());
	xsrc_uct_md_mem_dereg(side.md, r.memh);
}

TEST_F(Tag, RndvExpectedTruncated)
{
	start("sender");
	Recv r(100);
	ASSERT_EQ(r.post(side, 79, ~0ull, true), UCS_OK);
	EXPECT_EQ(run(make_cmd('R', 79, 4096)).status, UCS_OK);
	ASSERT_TRUE(side.progress_until([&] { return r.done(); }));
	EXPECT_EQ(r.status, UCS_ERR_MESSAGE_TRUNCATED);
	Reply w = run(make_cmd('W', 0));
	EXPECT_EQ(w.status, 1);
	EXPECT_EQ(w.extra, UCS_ERR_MESSAGE_TRUNCATED) << "the sender hears that its data was not taken";
	xsrc_uct_md_mem_dereg(side.md, r.memh);
}

TEST_F(Tag, RndvUnexpectedThenSoftwareCompletion)
{
	start("sender");
	const size_t len = 300000;
	const std::string hdr = "rts-header";
	EXPECT_EQ(run(make_cmd('R', 78, len, 0, hdr)).status, UCS_OK);
	ASSERT_TRUE(side.progress_until([&] { return rec.rndv.size() == 1; }));
	const UnexpRndv &u = rec.rndv[0];
	EXPECT_EQ(u.stag, 78u);
	EXPECT_EQ(u.hdr, hdr);
	EXPECT_EQ(u.length, len);
	EXPECT_NE(u.addr, 0u);
	ASSERT_EQ(u.rkey.size(), rec.rkey_size);

	// The protocol layer reads the data itself with the unpacked rkey...
	std::vector<char> buf(len);
	uct_mem_h memh = side.reg(buf.data(), buf.size());
	ASSERT_NE(memh, nullptr);
	uct_rkey_bundle_t rkey{};
	ASSERT_EQ(xsrc_uct_rkey_unpack(nullptr, u.rkey.data(), &rkey), UCS_OK);
	uct_iov_t iov{buf.data(), len, memh, 0, 1};
	OpComp get;
	ucs_status_t st = side.retry([&] { return uct_ep_get_zcopy(ep, &iov, 1, u.addr, rkey.rkey, &get.comp); });
	ASSERT_TRUE(st == UCS_OK || st == UCS_INPROGRESS) << ucs_status_string(st);
	if (st == UCS_INPROGRESS) {
		ASSERT_TRUE(side.progress_until([&] { return get.fired > 0; }));
	}
	EXPECT_EQ(get.status, UCS_OK);
	EXPECT_TRUE(check_pattern(buf.data(), len, 78));
	xsrc_uct_rkey_release(nullptr, &rkey);
	xsrc_uct_md_mem_dereg(side.md, memh);

	// ...and the sender releases its operation with rndv_cancel: no completion.
	Reply c = run(make_cmd('C', 0));
	EXPECT_EQ(c.status, UCS_OK);
	EXPECT_EQ(c.extra, 0) << "a cancelled rendezvous never calls its completion";
	EXPECT_EQ(run(make_cmd('C', 0)).status, UCS_ERR_INVALID_PARAM) << "the handle is gone";
}

TEST_F(Tag, RndvRequestExpectedAndUnexpected)
{
	start("sender");
	Recv r(64);
	ASSERT_EQ(r.post(side, 90), UCS_OK);
	EXPECT_EQ(run(make_cmd('Q', 90, 0, 0, "sw-rndv-header")).status, UCS_OK);
	ASSERT_TRUE(side.progress_until([&] { return r.done(); }));
	EXPECT_EQ(r.events, (std::vector<char>{'c', 'r'})) << "matched by a request: rndv_cb, no completed_cb";
	EXPECT_EQ(r.hdr, "sw-rndv-header");
	EXPECT_EQ(r.status, UCS_OK);
	EXPECT_EQ(r.stag, 90u);
	EXPECT_EQ(r.rndv_flags, unsigned{UCT_TAG_RECV_CB_INLINE_DATA});

	EXPECT_EQ(run(make_cmd('Q', 91, 0, 0, "unexpected-request")).status, UCS_OK);
	ASSERT_TRUE(side.progress_until([&] { return rec.rndv.size() == 1; }));
	EXPECT_EQ(rec.rndv[0].stag, 91u);
	EXPECT_EQ(rec.rndv[0].hdr, "unexpected-request");
	EXPECT_EQ(rec.rndv[0].addr, 0u);
	EXPECT_EQ(rec.rndv[0].length, 0u);
	EXPECT_TRUE(rec.rndv[0].rkey.empty()) << "a request carries no rkey";
	// A header longer than the limit is refused at the sender.
	Cmd big = make_cmd('Q', 92);
	big.hdr_len = static_cast<uint32_t>(cap().rndv.max_hdr + 1);
	EXPECT_EQ(run(big).status, UCS_ERR_INVALID_PARAM);
}

TEST_F(Tag, RecvCancel)
{
	start("sender");
	Recv a(32), b(32);
	ASSERT_EQ(a.post(side, 40), UCS_OK);
	EXPECT_EQ(uct_iface_tag_recv_cancel(side.iface, &a.ctx, 0), UCS_OK);
	EXPECT_EQ(a.events, std::vector<char>{'d'});
	EXPECT_EQ(a.status, UCS_ERR_CANCELED) << "force=0 reports the cancel through completed_cb";
	ASSERT_EQ(b.post(side, 41), UCS_OK);
	EXPECT_EQ(uct_iface_tag_recv_cancel(side.iface, &b.ctx, 1), UCS_OK);
	EXPECT_TRUE(b.events.empty()) << "force=1 reports nothing";
	EXPECT_EQ(uct_iface_tag_recv_cancel(side.iface, &b.ctx, 0), UCS_ERR_NO_ELEM) << "not posted any more";
	// Messages for the cancelled tags are unexpected now.
	EXPECT_EQ(run(make_cmd('S', 40, 8)).status, UCS_OK);
	EXPECT_EQ(run(make_cmd('S', 41, 8)).status, UCS_OK);
	ASSERT_TRUE(side.progress_until([&] { return rec.eager.size() == 2; }));
	EXPECT_EQ(a.events.size(), 1u);
	EXPECT_TRUE(b.events.empty());
	// A cancelled context can be posted again.
	ASSERT_EQ(a.post(side, 42), UCS_OK);
	EXPECT_EQ(run(make_cmd('S', 42, 8)).status, UCS_OK);
	ASSERT_TRUE(side.progress_until([&] { return a.events.size() == 3; }));
	EXPECT_EQ(a.status, UCS_OK);
}

TEST_F(Tag, RecvLimitIsEnforced)
{
	size_t n = cap().recv.max_outstanding;
	std::vector<std::unique_ptr<Recv>> rs;
	for (size_t k = 0; k < n; ++k) {
		rs.push_back(std::make_unique<Recv>(8));
		ASSERT_EQ(rs.back()->post(side, k), UCS_OK) << k;
	}
	Recv extra(8);
	EXPECT_EQ(extra.post(side, n), UCS_ERR_EXCEEDS_LIMIT);
	EXPECT_EQ(uct_iface_tag_recv_cancel(side.iface, &rs[0]->ctx, 1), UCS_OK);
	EXPECT_EQ(extra.post(side, n), UCS_OK) << "a cancel frees a slot";
	// Bad arguments get a status, not a crash.
	Recv bad(8);
	bad.ctx.completed_cb = nullptr;
	EXPECT_EQ(bad.post(side, 1), UCS_ERR_INVALID_PARAM);
	for (auto &r : rs)
		uct_iface_tag_recv_cancel(side.iface, &r->ctx, 1);
	uct_iface_tag_recv_cancel(side.iface, &extra.ctx, 1);
}

TEST_F(Tag, RndvCancelBeforeAnyMatch)
{
	start("sender");
	EXPECT_EQ(run(make_cmd('R', 95, 4096)).status, UCS_OK);
	ASSERT_TRUE(side.progress_until([&] { return rec.rndv.size() == 1; }));  // nobody reads it
	Reply c = run(make_cmd('C', 0));
	EXPECT_EQ(c.status, UCS_OK);
	EXPECT_EQ(c.extra, 0);
}

int err_calls = 0;
ucs_status_t err_status = UCS_OK;

ucs_status_t on_error(void *, uct_ep_h, ucs_status_t status)
{
	++err_calls;
	err_status = status;
	return UCS_OK;
}

TEST(TagDeadPeer, RendezvousFailsWhenTheReceiverDies)
{
	Recorder rec;
	Side side;
	uct_iface_params_t p = tag_params(&rec);
	p.field_mask |= UCT_IFACE_PARAM_FIELD_ERR_HANDLER | UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG |
			UCT_IFACE_PARAM_FIELD_ERR_HANDLER_FLAGS;
	p.err_handler = on_error;
	p.err_handler_arg = nullptr;
	p.err_handler_flags = UCT_CB_FLAG_ASYNC;
	ASSERT_EQ(side.open(p), UCS_OK);
	Peer peer("rndv_victim");
	ASSERT_TRUE(peer.started());
	uct_ep_h ep = side.connect(peer.link);
	ASSERT_NE(ep, nullptr);
	std::vector<char> buf(65536);
	fill(buf.data(), buf.size(), 7);
	uct_mem_h memh = side.reg(buf.data(), buf.size());
	ASSERT_NE(memh, nullptr);
	uct_iov_t iov{buf.data(), buf.size(), memh, 0, 1};
	OpComp comp;
	void *op = uct_ep_tag_rndv_zcopy(ep, 7, "h", 1, &iov, 1, 0, &comp.comp);
	ASSERT_FALSE(UCS_PTR_IS_ERR(op)) << ucs_status_string(UCS_PTR_STATUS(op));
	std::string msg;
	auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
	while (!peer.link.readable() && std::chrono::steady_clock::now() < end)
		side.progress();
	ASSERT_TRUE(peer.link.recv_frame(&msg, kLinkTimeout));
	EXPECT_EQ(peer.wait(), 0);  // it is gone now, without answering
	EXPECT_EQ(comp.fired, 0);
	// ep_check (or any traffic) finds the dead peer; the rendezvous fails with the ep.
	ucs_status_t st = uct_ep_check(ep, 0, nullptr);
	EXPECT_TRUE(st == UCS_OK || st == UCS_INPROGRESS || st == UCS_ERR_NO_RESOURCE) << ucs_status_string(st);
	ASSERT_TRUE(side.progress_until([&] { return comp.fired > 0; }, 15000)) << "the rendezvous never failed";
	EXPECT_EQ(comp.fired, 1);
	EXPECT_NE(comp.status, UCS_OK);
	EXPECT_EQ(err_calls, 1);
	EXPECT_NE(err_status, UCS_OK);
	EXPECT_EQ(uct_ep_tag_rndv_cancel(ep, op), UCS_ERR_INVALID_PARAM) << "the failed op is gone";
	uct_ep_destroy(ep);
	xsrc_uct_md_mem_dereg(side.md, memh);
}

}  // namespace

int main(int argc, char **argv)
{
	return xsrc_uct_test::peer_or_tests_main(argc, argv);
}
