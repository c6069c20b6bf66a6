// The posted-receive list of the shim's software tag matching, in-process (no device).
#include "tag_matcher.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

using xsrc::uct::tag::Matcher;
using xsrc::uct::tag::PostedRecv;
using xsrc::uct::tag::RecvState;

namespace {

uct_iov_t iov_of(void *buf, size_t len)
{
	uct_iov_t iov{};
	iov.buffer = buf;
	iov.length = len;
	iov.count = 1;
	return iov;
}

TEST(TagMatcher, ExactTagMatchesAndFreesNothingUntilRelease)
{
	Matcher m(4);
	char buf[16];
	uct_iov_t iov = iov_of(buf, sizeof(buf));
	uct_tag_context_t ctx{};
	ASSERT_EQ(m.post(&ctx, 0x1234, ~0ull, &iov, 1), UCS_OK);
	EXPECT_EQ(m.posted(), 1u);
	EXPECT_EQ(m.match(0x1235), nullptr);
	PostedRecv *r = m.match(0x1234);
	ASSERT_NE(r, nullptr);
	EXPECT_EQ(r->ctx, &ctx);
	EXPECT_EQ(r->length, sizeof(buf));
	EXPECT_EQ(r->state, RecvState::in_flight);
	EXPECT_EQ(m.posted(), 0u);
	EXPECT_EQ(m.outstanding(), 1u);
	EXPECT_EQ(m.match(0x1234), nullptr) << "a receive matches once";
	EXPECT_FALSE(m.unpost(&ctx)) << "an in-flight receive is not on the posted list";
	EXPECT_EQ(m.find(&ctx), r);
	m.release(r);
	EXPECT_EQ(m.outstanding(), 0u);
	EXPECT_EQ(m.find(&ctx), nullptr);
}

TEST(TagMatcher, MaskSelectsComparedBits)
{
	Matcher m(4);
	uct_tag_context_t ctx{};
	// Only the low 16 bits are compared.
	ASSERT_EQ(m.post(&ctx, 0xAAAA'0000'0000'BEEFull, 0xFFFF, nullptr, 0), UCS_OK);
	EXPECT_EQ(m.match(0x0000'0000'0000'BEEEull), nullptr);
	PostedRecv *r = m.match(0x1234'5678'9ABC'BEEFull);
	ASSERT_NE(r, nullptr);
	EXPECT_EQ(r->ctx, &ctx);
	m.release(r);

	// A zero mask is a wildcard.
	uct_tag_context_t any{};
	ASSERT_EQ(m.post(&any, 7, 0, nullptr, 0), UCS_OK);
	r = m.match(0xDEAD'BEEF'0000'0001ull);
	ASSERT_NE(r, nullptr);
	EXPECT_EQ(r->ctx, &any);
	m.release(r);
}

TEST(TagMatcher, EarliestPostedMatchingReceiveWins)
{
	Matcher m(8);
	std::array<uct_tag_context_t, 4> ctx{};
	ASSERT_EQ(m.post(&ctx[0], 1, ~0ull, nullptr, 0), UCS_OK);  // tag 1 only
	ASSERT_EQ(m.post(&ctx[1], 0, 0, nullptr, 0), UCS_OK);      // wildcard
	ASSERT_EQ(m.post(&ctx[2], 2, ~0ull, nullptr, 0), UCS_OK);  // tag 2 only
	ASSERT_EQ(m.post(&ctx[3], 2, ~0ull, nullptr, 0), UCS_OK);  // tag 2 only, later

	PostedRecv *r = m.match(2);  // the wildcard was posted before both tag-2 receives
	ASSERT_NE(r, nullptr);
	EXPECT_EQ(r->ctx, &ctx[1]);
	m.release(r);
	r = m.match(2);
	ASSERT_NE(r, nullptr);
	EXPECT_EQ(r->ctx, &ctx[2]);
	m.release(r);
	r = m.match(1);
	ASSERT_NE(r, nullptr);
	EXPECT_EQ(r->ctx, &ctx[0]);
	m.release(r);
	r = m.match(2);
	ASSERT_NE(r, nullptr);
	EXPECT_EQ(r->ctx, &ctx[3]);
	m.release(r);
	EXPECT_EQ(m.posted(), 0u);
	EXPECT_EQ(m.outstanding(), 0u);
}

TEST(TagMatcher, UnpostRemovesFromTheMiddleAndKeepsOrder)
{
	Matcher m(8);
	std::array<uct_tag_context_t, 3> ctx{};
	for (auto &c : ctx)
		ASSERT_EQ(m.post(&c, 5, ~0ull, nullptr, 0), UCS_OK);
	EXPECT_TRUE(m.unpost(&ctx[1]));
	EXPECT_FALSE(m.unpost(&ctx[1])) << "a second cancel finds nothing";
	EXPECT_EQ(m.posted(), 2u);
	PostedRecv *r = m.match(5);
	ASSERT_NE(r, nullptr);
	EXPECT_EQ(r->ctx, &ctx[0]);
	m.release(r);
	r = m.match(5);
	ASSERT_NE(r, nullptr);
	EXPECT_EQ(r->ctx, &ctx[2]);
	m.release(r);
	EXPECT_EQ(m.match(5), nullptr);
	// Head and tail removal.
	for (auto &c : ctx)
		ASSERT_EQ(m.post(&c, 6, ~0ull, nullptr, 0), UCS_OK);
	EXPECT_TRUE(m.unpost(&ctx[0]));
	EXPECT_TRUE(m.unpost(&ctx[2]));
	r = m.match(6);
	ASSERT_NE(r, nullptr);
	EXPECT_EQ(r->ctx, &ctx[1]);
	m.release(r);
	EXPECT_EQ(m.outstanding(), 0u);
}

TEST(TagMatcher, CapacityCountsInFlightReceives)
{
	Matcher m(2);
	std::array<uct_tag_context_t, 3> ctx{};
	ASSERT_EQ(m.post(&ctx[0], 1, ~0ull, nullptr, 0), UCS_OK);
	ASSERT_EQ(m.post(&ctx[1], 2, ~0ull, nullptr, 0), UCS_OK);
	EXPECT_EQ(m.post(&ctx[2], 3, ~0ull, nullptr, 0), UCS_ERR_EXCEEDS_LIMIT);
	PostedRecv *r = m.match(1);
	ASSERT_NE(r, nullptr);
	EXPECT_EQ(m.post(&ctx[2], 3, ~0ull, nullptr, 0), UCS_ERR_EXCEEDS_LIMIT)
		<< "a matched receive whose data is still moving keeps its slot";
	m.release(r);
	EXPECT_EQ(m.post(&ctx[2], 3, ~0ull, nullptr, 0), UCS_OK);
}

TEST(TagMatcher, BadPostsAreRefused)
{
	Matcher m(4);
	uct_tag_context_t ctx{};
	std::vector<uct_iov_t> iov(xsrc::uct::tag::max_recv_iov + 1, uct_iov_t{});
	EXPECT_EQ(m.post(nullptr, 1, ~0ull, nullptr, 0), UCS_ERR_INVALID_PARAM);
	EXPECT_EQ(m.post(&ctx, 1, ~0ull, iov.data(), iov.size()), UCS_ERR_INVALID_PARAM);
	EXPECT_EQ(m.post(&ctx, 1, ~0ull, nullptr, 1), UCS_ERR_INVALID_PARAM);
	ASSERT_EQ(m.post(&ctx, 1, ~0ull, nullptr, 0), UCS_OK);
	EXPECT_EQ(m.post(&ctx, 1, ~0ull, nullptr, 0), UCS_ERR_INVALID_PARAM) << "posted twice";
	EXPECT_EQ(m.posted(), 1u);
	// A context never posted (garbage priv) is not found.
	uct_tag_context_t stranger;
	std::memset(&stranger, 0x5a, sizeof(stranger));
	EXPECT_EQ(m.find(&stranger), nullptr);
	EXPECT_FALSE(m.unpost(&stranger));
}

TEST(TagMatcher, IovLengthSumsStridedEntries)
{
	Matcher m(1);
	char a[10], b[40];
	std::array<uct_iov_t, 2> iov{iov_of(a, sizeof(a)), iov_of(b, 8)};
	iov[1].count = 5;
	iov[1].stride = 8;
	uct_tag_context_t ctx{};
	ASSERT_EQ(m.post(&ctx, 1, ~0ull, iov.data(), iov.size()), UCS_OK);
	PostedRecv *r = m.match(1);
	ASSERT_NE(r, nullptr);
	EXPECT_EQ(r->length, 50u);
	EXPECT_EQ(r->iovcnt, 2u);
	m.release(r);
}

TEST(TagMatcher, ForgottenReceiveDoesNotTouchItsContextOnRelease)
{
	Matcher m(1);
	auto *ctx = new uct_tag_context_t{};
	ASSERT_EQ(m.post(ctx, 1, ~0ull, nullptr, 0), UCS_OK);
	PostedRecv *r = m.match(1);
	ASSERT_NE(r, nullptr);
	r->forgotten = true;  // force-cancelled while in flight: the user may free the context
	delete ctx;
	m.release(r);  // under ASan this would catch a write to the freed context
	EXPECT_EQ(m.outstanding(), 0u);
}

}  // namespace
