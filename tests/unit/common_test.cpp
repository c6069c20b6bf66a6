// The util layer every part of xsrc uses: the fd owner, the QP-state codec
// and the strong id types.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <gtest/gtest.h>
#include <type_traits>
#include <unordered_set>
#include <utility>

#include "common/fd.h"
#include "common/ids.h"
#include "xsrc-qp-state.h"

namespace xsrc {
namespace {

bool is_open(int fd)
{
	return fcntl(fd, F_GETFD) != -1;
}

// Two fds of a fresh pipe, owned by the test until handed to a unique_fd.
struct RawPipe {
	int fds[2] = {-1, -1};
	RawPipe() { EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0); }
};

TEST(UniqueFd, ClosesOnDestruction)
{
	RawPipe p;
	{
		unique_fd fd(p.fds[0]);
		EXPECT_TRUE(fd);
		EXPECT_EQ(fd.get(), p.fds[0]);
	}
	EXPECT_FALSE(is_open(p.fds[0]));
	close(p.fds[1]);
}

TEST(UniqueFd, EmptyOwnsNothing)
{
	unique_fd fd;
	EXPECT_FALSE(fd);
	EXPECT_EQ(fd.get(), -1);
	unique_fd failed(-EBADF);  // as a failed take_fd() returns it
	EXPECT_FALSE(failed);
}

TEST(UniqueFd, MoveHandsOverAndClosesOnce)
{
	RawPipe p;
	unique_fd a(p.fds[0]);
	{
		unique_fd b(std::move(a));
		EXPECT_FALSE(a);
		EXPECT_EQ(b.get(), p.fds[0]);
		a.reset();  // the moved-from owner has nothing to close
		EXPECT_TRUE(is_open(p.fds[0]));
	}
	EXPECT_FALSE(is_open(p.fds[0]));

	// Move assignment closes what the target held, once.
	RawPipe q;
	unique_fd c(q.fds[0]), d(q.fds[1]);
	c = std::move(d);
	EXPECT_FALSE(is_open(q.fds[0]));
	EXPECT_EQ(c.get(), q.fds[1]);
	EXPECT_FALSE(d);
	unique_fd &same = c;
	c = std::move(same);  // self-move keeps the fd
	EXPECT_TRUE(is_open(q.fds[1]));
	close(p.fds[1]);
}

TEST(UniqueFd, ReleaseAndReset)
{
	RawPipe p;
	unique_fd fd(p.fds[0]);
	int raw = fd.release();
	EXPECT_EQ(raw, p.fds[0]);
	EXPECT_FALSE(fd);
	EXPECT_TRUE(is_open(raw));  // released: no longer ours to close

	fd.reset(raw);
	fd.reset(raw);  // the same fd again is not closed
	EXPECT_TRUE(is_open(raw));
	fd.reset(p.fds[1]);
	EXPECT_FALSE(is_open(raw));
	EXPECT_TRUE(is_open(p.fds[1]));
	fd.reset();
	EXPECT_FALSE(is_open(p.fds[1]));
}

TEST(UniqueFd, ClosingKeepsErrno)
{
	RawPipe p;
	{
		unique_fd a(p.fds[0]);
		unique_fd b(p.fds[1]);
		errno = ENOSPC;
		b.reset();
		EXPECT_EQ(errno, ENOSPC);
		errno = EMFILE;
	}
	EXPECT_EQ(errno, EMFILE);
	EXPECT_FALSE(is_open(p.fds[0]));
}

TEST(QpStateCodec, RoundTripsEveryState)
{
	for (ibv_qp_state s : {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD,
			       IBV_QPS_SQE, IBV_QPS_ERR}) {
		EXPECT_NE(xsrc_qp_state_encode(s), uint32_t(XSRC_QP_STATE_FREE)) << s;
		EXPECT_EQ(xsrc_qp_state_decode(xsrc_qp_state_encode(s)), s) << s;
	}
}

TEST(QpStateCodec, FreeSlotIsUnknown)
{
	EXPECT_EQ(xsrc_qp_state_decode(XSRC_QP_STATE_FREE), IBV_QPS_UNKNOWN);
}

TEST(QpStateCodec, CorruptValueIsErr)
{
	uint32_t past_err = xsrc_qp_state_encode(IBV_QPS_ERR) + 1;
	for (uint32_t raw : {past_err, past_err + 100, uint32_t(UINT32_MAX)})
		EXPECT_EQ(xsrc_qp_state_decode(raw), IBV_QPS_ERR) << raw;
}

TEST(StrongId, ComparesByValue)
{
	EXPECT_EQ(Qpn(7), Qpn(7));
	EXPECT_NE(Qpn(7), Qpn(8));
	EXPECT_LT(Qpn(7), Qpn(8));
	EXPECT_GT(Rkey(0x100), Rkey(0xff));
	EXPECT_EQ(Qpn().value(), 0u);
	EXPECT_EQ(PdId(42).value(), 42u);
}

TEST(StrongId, HashesAsItsValue)
{
	EXPECT_EQ(std::hash<Lkey>()(Lkey(0x1234)), std::hash<uint32_t>()(0x1234));
	std::unordered_set<Srqn> set{Srqn(1), Srqn(2), Srqn(1)};
	EXPECT_EQ(set.size(), 2u);
	EXPECT_TRUE(set.count(Srqn(2)));
	EXPECT_FALSE(set.count(Srqn(3)));
}

TEST(StrongId, DistinctKindsDoNotMix)
{
	static_assert(!std::is_convertible_v<Qpn, Rkey>);
	static_assert(!std::is_convertible_v<PdHandle, PdId>);
	static_assert(!std::is_convertible_v<uint32_t, Lkey>);  // explicit construction only
	static_assert(!std::is_convertible_v<Lkey, uint32_t>);
	static_assert(std::is_trivially_copyable_v<XrcdId>);
	SUCCEED();
}

}  // namespace
}  // namespace xsrc
