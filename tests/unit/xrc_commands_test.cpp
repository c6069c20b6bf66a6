// XRC in the daemon: domains (private, and shared between contexts through
// a file's inode, with the kernel's O_CREAT / O_EXCL rules), their lifetime
// (EBUSY while used, the last handle destroys), XRC SRQs in the arena, XRC
// send and receive QPs through the state machine, OPEN_QP of a shared
// receive QP from another context, and what teardown releases. Two contexts
// live in this process, each with its own fds, as two processes would.
#include <sys/stat.h>

#include <cstdlib>
#include <memory>

#include "command_fixture.h"

namespace xsrc::test {
namespace {

constexpr uint32_t kNoFd = 0xffffffffu;

constexpr uint32_t kInitMask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
// What an application's RC code sends; the XRC types ignore what they lack.
constexpr uint32_t kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr uint32_t kRtsMask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;

// A second context on the device: another process, as far as the daemon
// can tell (own handles, own async pipe, own fds).
struct Peer {
	Device &dev;
	Context ctx;
	Pipe async;
	Peer(Device &d, uint64_t id) : dev(d)
	{
		ctx.id = id;
		ctx.device = &d;
		ctx.owner = getpid();
		ctx.caller = std::make_unique<ProcessCaller>(getpid());
		dev.contexts.push_back(&ctx);
	}
	~Peer()
	{
		destroy_context_objects(ctx);
		std::erase(dev.contexts, &ctx);
	}
};

class XrcCommandsTest : public test::CommandFixture {
protected:
	void SetUp() override
	{
		CommandFixture::SetUp();
		basic_objects();
		char path[] = "/tmp/xsrc-xrcd-XXXXXX";
		file_fd = mkstemp(path);
		ASSERT_GE(file_fd, 0);
		file_path = path;
	}
	void TearDown() override
	{
		CommandFixture::TearDown();
		close(file_fd);
		unlink(file_path.c_str());
	}

	std::unique_ptr<Peer> make_peer(uint64_t id = 2)
	{
		auto peer = std::make_unique<Peer>(dev, id);
		xsrc_get_context_req drv{};
		drv.async_fds = peer->async.pair();
		Resp<ib_uverbs_get_context_resp, xsrc_get_context_resp> resp;
		ib_uverbs_get_context get{};
		get.response = reinterpret_cast<uintptr_t>(&resp);
		EXPECT_EQ(run_on(peer->ctx, IB_USER_VERBS_CMD_GET_CONTEXT, get, std::as_bytes(std::span(&drv, 1)),
				 sizeof(resp)),
			  0);
		return peer;
	}

	// A new fd on the shared file, as another process would open it.
	int reopen_file()
	{
		int fd = open(file_path.c_str(), O_RDONLY | O_CLOEXEC);
		EXPECT_GE(fd, 0);
		extra_fds.push_back(fd);
		return fd;
	}

	int open_xrcd(Context &c, uint32_t fd, uint32_t oflags, uint32_t &handle)
	{
		ib_uverbs_open_xrcd_resp resp{~0u};
		ib_uverbs_open_xrcd cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.fd = fd;
		cmd.oflags = oflags;
		int err = run_on(c, IB_USER_VERBS_CMD_OPEN_XRCD, cmd, {}, sizeof(resp));
		handle = resp.xrcd_handle;
		return err;
	}

	int close_xrcd(Context &c, uint32_t handle)
	{
		ib_uverbs_close_xrcd cmd{};
		cmd.xrcd_handle = handle;
		return run_on(c, IB_USER_VERBS_CMD_CLOSE_XRCD, cmd);
	}

	// The domain a handle names (0 when it is no XRC domain handle).
	uint32_t xrcd_id(Context &c, uint32_t handle)
	{
		auto it = c.objects.find(handle);
		const Xrcd *x = it == c.objects.end() ? nullptr : std::get_if<Xrcd>(&it->second);
		return x ? x->xrcd_id.value() : 0;
	}

	int create_xsrq(Context &c, uint32_t pd, uint32_t xrcd, uint32_t cq, uint32_t &handle,
			ib_uverbs_create_srq_resp *core = nullptr, xsrc_create_srq_resp *drv = nullptr)
	{
		Resp<ib_uverbs_create_srq_resp, xsrc_create_srq_resp> resp;
		ib_uverbs_create_xsrq cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.user_handle = 0x7357;
		cmd.srq_type = IBV_SRQT_XRC;
		cmd.pd_handle = pd;
		cmd.max_wr = 32;
		cmd.max_sge = 2;
		cmd.xrcd_handle = xrcd;
		cmd.cq_handle = cq;
		int err = run_on(c, IB_USER_VERBS_CMD_CREATE_XSRQ, cmd, {}, sizeof(resp));
		handle = resp.core().srq_handle;
		if (core)
			*core = resp.core();
		if (drv)
			*drv = resp.drv();
		return err;
	}

	int create_qp_on(Context &c, const QpSpec &s, CreatedQp &out)
	{
		Resp<ib_uverbs_create_qp_resp, xsrc_create_qp_resp> resp;
		ib_uverbs_create_qp cmd = create_qp_cmd(s);
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		int err = run_on(c, IB_USER_VERBS_CMD_CREATE_QP, cmd, {}, sizeof(resp));
		out.core = resp.core();
		out.drv = resp.drv();
		out.handle = out.core.qp_handle;
		out.qpn = out.core.qpn;
		return err;
	}

	// An XRC receive QP as libibverbs asks for one: the domain in pd_handle,
	// no CQs; the caps an application left in its attr are ignored.
	int create_recv_qp(Context &c, uint32_t xrcd, CreatedQp &out, uint64_t user_handle = 0x7a7a)
	{
		QpSpec s;
		s.qp_type = IBV_QPT_XRC_RECV;
		s.pd = xrcd;
		s.send_cq = s.recv_cq = 0;
		s.user_handle = user_handle;
		return create_qp_on(c, s, out);
	}

	int open_qp(Context &c, uint32_t xrcd, uint32_t qpn, uint8_t type, CreatedQp &out,
		    uint64_t user_handle = 0x09e7)
	{
		Resp<ib_uverbs_create_qp_resp, xsrc_create_qp_resp> resp;
		std::memset(resp.bytes, 0xff, sizeof(resp.bytes));
		ib_uverbs_open_qp cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.user_handle = user_handle;
		cmd.pd_handle = xrcd;
		cmd.qpn = qpn;
		cmd.qp_type = type;
		int err = run_on(c, IB_USER_VERBS_CMD_OPEN_QP, cmd, {}, sizeof(resp));
		out.core = resp.core();
		out.drv = resp.drv();
		out.handle = out.core.qp_handle;
		out.qpn = out.core.qpn;
		return err;
	}

	int modify_on(Context &c, const ib_uverbs_modify_qp &cmd) { return run_on(c, IB_USER_VERBS_CMD_MODIFY_QP, cmd); }

	int query_on(Context &c, uint32_t qp, ib_uverbs_query_qp_resp &resp)
	{
		ib_uverbs_query_qp cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.qp_handle = qp;
		return run_on(c, IB_USER_VERBS_CMD_QUERY_QP, cmd, {}, sizeof(resp));
	}

	int destroy_qp_on(Context &c, uint32_t qp, uint32_t *events = nullptr)
	{
		ib_uverbs_destroy_qp_resp resp{~0u};
		ib_uverbs_destroy_qp cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.qp_handle = qp;
		int err = run_on(c, IB_USER_VERBS_CMD_DESTROY_QP, cmd, {}, sizeof(resp));
		if (events)
			*events = resp.events_reported;
		return err;
	}

	int destroy_srq_on(Context &c, uint32_t srq)
	{
		ib_uverbs_destroy_srq_resp resp{};
		ib_uverbs_destroy_srq cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.srq_handle = srq;
		return run_on(c, IB_USER_VERBS_CMD_DESTROY_SRQ, cmd, {}, sizeof(resp));
	}

	ibv_qp_state state_of(uint32_t qpn) { return xsrc_qp_state_decode(qp_entry(qpn).state); }

	~XrcCommandsTest() override
	{
		for (int fd : extra_fds)
			close(fd);
	}

	int file_fd = -1;
	std::string file_path;
	std::vector<int> extra_fds;
};

// --- domains -----------------------------------------------------------------

TEST_F(XrcCommandsTest, PrivateDomainsAreNewEachTime)
{
	uint32_t a, b;
	ASSERT_EQ(open_xrcd(ctx, kNoFd, 0, a), 0);
	ASSERT_EQ(open_xrcd(ctx, kNoFd, O_CREAT, b), 0);  // oflags mean nothing without a file
	EXPECT_NE(a, b);
	EXPECT_GE(xrcd_id(ctx, a), 1u);
	EXPECT_GE(xrcd_id(ctx, b), 1u);
	EXPECT_NE(xrcd_id(ctx, a), xrcd_id(ctx, b));
	EXPECT_EQ(dev.xrcds.size(), 2u);
	EXPECT_TRUE(dev.xrcds_by_inode.empty());

	ASSERT_EQ(close_xrcd(ctx, a), 0);
	EXPECT_EQ(close_xrcd(ctx, a), EINVAL);
	EXPECT_EQ(close_xrcd(ctx, pd0), EINVAL);  // not an XRC domain handle
	ASSERT_EQ(close_xrcd(ctx, b), 0);
	EXPECT_TRUE(dev.xrcds.empty());
}

TEST_F(XrcCommandsTest, OpenValidates)
{
	uint32_t h;
	EXPECT_EQ(open_xrcd(ctx, kNoFd, O_TRUNC, h), EINVAL);            // unknown oflags bit
	EXPECT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_CREAT | O_APPEND, h), EINVAL);
	EXPECT_EQ(open_xrcd(ctx, 987654, O_CREAT, h), EBADF);              // no such fd in the caller
	EXPECT_EQ(open_xrcd(ctx, 0x80000000u, O_CREAT, h), EBADF);
	ib_uverbs_open_xrcd cmd{};
	cmd.fd = kNoFd;
	EXPECT_EQ(run(IB_USER_VERBS_CMD_OPEN_XRCD, cmd, {}, 8), EFAULT);  // no response buffer
	EXPECT_TRUE(dev.xrcds.empty());
	EXPECT_EQ(ctx.objects.size(), 2u);  // pd0 and cq0 only
	// The access mode bits of open(2) are accepted.
	ASSERT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_CREAT | O_RDWR, h), 0);
}

// The kernel's rules: a file without a domain needs O_CREAT (EAGAIN), and
// O_EXCL refuses a file that has one (EINVAL); otherwise the file's domain
// is shared.
TEST_F(XrcCommandsTest, CreateAndExclusiveRules)
{
	uint32_t h, first, second, third;
	EXPECT_EQ(open_xrcd(ctx, uint32_t(file_fd), 0, h), EAGAIN);
	EXPECT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_EXCL, h), EAGAIN);
	ASSERT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_CREAT | O_EXCL, first), 0);
	EXPECT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_CREAT | O_EXCL, h), EINVAL);
	EXPECT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_EXCL, h), EINVAL);
	ASSERT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_CREAT, second), 0);
	ASSERT_EQ(open_xrcd(ctx, uint32_t(reopen_file()), 0, third), 0);  // any fd of the file
	EXPECT_NE(first, second);  // every OPEN is a handle of its own
	EXPECT_EQ(xrcd_id(ctx, first), xrcd_id(ctx, second));
	EXPECT_EQ(xrcd_id(ctx, first), xrcd_id(ctx, third));
	ASSERT_EQ(dev.xrcds.size(), 1u);
	EXPECT_EQ(dev.xrcds.begin()->second.handles, 3u);

	// Another file, another domain.
	char other[] = "/tmp/xsrc-xrcd-other-XXXXXX";
	int other_fd = mkstemp(other);
	ASSERT_GE(other_fd, 0);
	uint32_t o;
	EXPECT_EQ(open_xrcd(ctx, uint32_t(other_fd), O_CREAT, o), 0);
	EXPECT_NE(xrcd_id(ctx, o), xrcd_id(ctx, first));
	close(other_fd);
	unlink(other);
}

TEST_F(XrcCommandsTest, SharedByInodeAcrossContexts)
{
	auto peer = make_peer();
	uint32_t mine, theirs;
	ASSERT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_CREAT, mine), 0);
	ASSERT_EQ(open_xrcd(peer->ctx, uint32_t(reopen_file()), 0, theirs), 0);
	EXPECT_EQ(xrcd_id(ctx, mine), xrcd_id(peer->ctx, theirs));
	ASSERT_EQ(dev.xrcds.size(), 1u);
	EXPECT_EQ(dev.xrcds.begin()->second.handles, 2u);

	// The last close destroys the domain: the file needs O_CREAT again.
	ASSERT_EQ(close_xrcd(ctx, mine), 0);
	EXPECT_EQ(dev.xrcds.size(), 1u);
	uint32_t old_id = xrcd_id(peer->ctx, theirs);
	ASSERT_EQ(close_xrcd(peer->ctx, theirs), 0);
	EXPECT_TRUE(dev.xrcds.empty());
	EXPECT_TRUE(dev.xrcds_by_inode.empty());
	uint32_t again;
	EXPECT_EQ(open_xrcd(peer->ctx, uint32_t(file_fd), 0, again), EAGAIN);
	ASSERT_EQ(open_xrcd(peer->ctx, uint32_t(file_fd), O_CREAT, again), 0);
	EXPECT_NE(xrcd_id(peer->ctx, again), old_id);  // ids are not reused at once
}

TEST_F(XrcCommandsTest, CloseIsBusyWhileThisHandleIsUsed)
{
	uint32_t x, other;
	ASSERT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_CREAT, x), 0);
	ASSERT_EQ(open_xrcd(ctx, uint32_t(file_fd), 0, other), 0);
	uint32_t srq;
	ASSERT_EQ(create_xsrq(ctx, pd0, x, cq0, srq), 0);
	EXPECT_EQ(close_xrcd(ctx, x), EBUSY);
	ASSERT_EQ(destroy_srq_on(ctx, srq), 0);

	CreatedQp qp;
	ASSERT_EQ(create_recv_qp(ctx, x, qp), 0);
	EXPECT_EQ(close_xrcd(ctx, x), EBUSY);
	// Another handle on the same domain is not in use.
	ASSERT_EQ(close_xrcd(ctx, other), 0);
	EXPECT_EQ(dev.xrcds.size(), 1u);
	ASSERT_EQ(destroy_qp_on(ctx, qp.handle), 0);
	ASSERT_EQ(close_xrcd(ctx, x), 0);
	EXPECT_TRUE(dev.xrcds.empty());
}

// --- XRC SRQs ----------------------------------------------------------------

TEST_F(XrcCommandsTest, XrcSrqInTheArena)
{
	uint32_t x;
	ASSERT_EQ(open_xrcd(ctx, kNoFd, 0, x), 0);
	uint32_t srq;
	ib_uverbs_create_srq_resp core{};
	xsrc_create_srq_resp drv{};
	EXPECT_EQ(create_xsrq(ctx, pd0, pd0, cq0, srq), EINVAL);   // no domain handle
	EXPECT_EQ(create_xsrq(ctx, pd0, x, pd0, srq), EINVAL);     // no CQ handle
	EXPECT_EQ(create_xsrq(ctx, x, x, cq0, srq), EINVAL);       // no PD handle
	EXPECT_EQ(dev.srq_slots.used(), 0u);
	ASSERT_EQ(create_xsrq(ctx, pd0, x, cq0, srq, &core, &drv), 0);
	EXPECT_EQ(core.max_wr, 32u);
	EXPECT_EQ(core.max_sge, 2u);
	ASSERT_GE(core.srqn, uint32_t(XSRC_SRQN_BASE));
	const xsrc_srq_entry &e = srq_entry(core.srqn);
	EXPECT_EQ(e.srqn, core.srqn);
	EXPECT_EQ(e.srq_type, uint32_t(IBV_SRQT_XRC));
	EXPECT_EQ(e.xrcd_id, xrcd_id(ctx, x));
	EXPECT_EQ(e.cq_off, cq0_ring);
	EXPECT_EQ(e.pd_id, pd0_id);
	EXPECT_EQ(e.ring_off, drv.ring_off);
	EXPECT_EQ(e.owner_pid, uint32_t(getpid()));
	EXPECT_EQ(e.owner_context, ctx.id);
	ASSERT_NE(drv.ring_off, 0u);
	EXPECT_EQ(arena().at<xsrc_recv_ring>(drv.ring_off).max_sge, 2u);

	// The CQ and PD are busy while it exists.
	EXPECT_EQ(destroy_cq(cq0), EBUSY);
	ib_uverbs_dealloc_pd dealloc{};
	dealloc.pd_handle = pd0;
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEALLOC_PD, dealloc), EBUSY);

	// A CQ that moves to a larger ring takes the SRQ along.
	Resp<ib_uverbs_resize_cq_resp, xsrc_resize_cq_resp> resized;
	ib_uverbs_resize_cq rc{};
	rc.response = reinterpret_cast<uintptr_t>(&resized);
	rc.cq_handle = cq0;
	rc.cqe = 4096;
	ASSERT_EQ(run(IB_USER_VERBS_CMD_RESIZE_CQ, rc, {}, sizeof(resized)), 0);
	ASSERT_NE(resized.drv().ring_off, cq0_ring);
	EXPECT_EQ(e.cq_off, resized.drv().ring_off);

	// Ordinary QPs cannot receive through an XRC SRQ.
	QpSpec s = qp_spec(IBV_QPT_RC);
	s.srq = srq;
	CreatedQp qp;
	EXPECT_EQ(create_qp(s, qp), EINVAL);

	ASSERT_EQ(destroy_srq(srq), 0);
	EXPECT_EQ(e.srqn, 0u);
	EXPECT_EQ(e.xrcd_id, 0u);
	EXPECT_EQ(e.cq_off, 0u);
	ASSERT_EQ(close_xrcd(ctx, x), 0);
	ASSERT_EQ(destroy_cq(cq0), 0);
}

// --- XRC send QPs ------------------------------------------------------------

TEST_F(XrcCommandsTest, SendQpHasNoReceiveSide)
{
	QpSpec s = qp_spec(IBV_QPT_XRC_SEND);
	s.recv_cq = 999;       // ignored, as the kernel ignores it
	s.srq = 777;           // likewise
	s.max_recv_wr = 64;
	s.max_recv_sge = 99;   // would be refused for a QP with a receive queue
	CreatedQp qp;
	ASSERT_EQ(create_qp(s, qp), 0);
	EXPECT_EQ(qp.core.max_send_wr, 16u);
	EXPECT_EQ(qp.core.max_recv_wr, 0u);
	EXPECT_EQ(qp.core.max_recv_sge, 0u);
	EXPECT_EQ(qp.core.max_inline_data, 64u);
	EXPECT_EQ(qp.drv.rq_off, 0u);
	const xsrc_qp_entry &e = qp_entry(qp.qpn);
	EXPECT_EQ(e.state, xsrc_qp_state_encode(IBV_QPS_RESET));
	EXPECT_EQ(e.qp_type, IBV_QPT_XRC_SEND);
	EXPECT_EQ(e.pd_id, pd0_id);
	EXPECT_EQ(e.send_cq_off, cq0_ring);
	EXPECT_EQ(e.recv_cq_off, 0u);
	EXPECT_EQ(e.rq_off, 0u);
	EXPECT_EQ(e.srqn, 0u);
	EXPECT_EQ(e.xrcd_id, 0u);

	// PD and send CQ are required.
	CreatedQp bad;
	QpSpec no_pd = qp_spec(IBV_QPT_XRC_SEND);
	no_pd.pd = cq0;
	EXPECT_EQ(create_qp(no_pd, bad), EINVAL);
	QpSpec no_cq = qp_spec(IBV_QPT_XRC_SEND);
	no_cq.send_cq = pd0;
	EXPECT_EQ(create_qp(no_cq, bad), EINVAL);

	// RC's masks work: the responder attributes are ignored, the requester
	// ones required.
	ASSERT_EQ(modify_qp(modify_cmd(qp.handle, IBV_QPS_INIT, kInitMask)), 0);
	ASSERT_EQ(modify_qp(modify_cmd(qp.handle, IBV_QPS_RTR, kRtrMask)), 0);
	EXPECT_EQ(state_of(qp.qpn), IBV_QPS_RTR);
	EXPECT_EQ(e.min_rnr_timer, 0u);       // ignored, not applied
	EXPECT_EQ(e.max_dest_rd_atomic, 0u);
	EXPECT_EQ(e.dest_qpn, kModifyDestQpn);
	EXPECT_EQ(modify_qp(modify_cmd(qp.handle, IBV_QPS_RTS, kRtsMask & ~IBV_QP_RETRY_CNT)), EINVAL);
	ASSERT_EQ(modify_qp(modify_cmd(qp.handle, IBV_QPS_RTS, kRtsMask)), 0);
	EXPECT_EQ(state_of(qp.qpn), IBV_QPS_RTS);
	EXPECT_EQ(e.sq_psn, kModifySqPsn);
	EXPECT_EQ(e.retry_cnt, 6u);
	EXPECT_EQ(e.max_rd_atomic, 4u);

	ib_uverbs_query_qp_resp q{};
	ASSERT_EQ(query_qp(qp.handle, q), 0);
	EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
	EXPECT_EQ(q.max_recv_wr, 0u);
	EXPECT_EQ(q.sq_psn, kModifySqPsn);

	// Only the send CQ is held.
	ASSERT_EQ(destroy_qp(qp.handle), 0);
	EXPECT_EQ(e.state, uint32_t(XSRC_QP_STATE_FREE));
	ASSERT_EQ(destroy_cq(cq0), 0);
}

TEST_F(XrcCommandsTest, ExtendedCreateOfBothXrcTypes)
{
	uint32_t x;
	ASSERT_EQ(open_xrcd(ctx, kNoFd, 0, x), 0);
	for (uint8_t type : {IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV}) {
		ib_uverbs_ex_create_qp cmd{};
		cmd.user_handle = 0xe7;
		cmd.pd_handle = type == IBV_QPT_XRC_RECV ? x : pd0;
		cmd.send_cq_handle = type == IBV_QPT_XRC_RECV ? 0 : cq0;
		cmd.max_send_wr = 8;
		cmd.max_send_sge = 1;
		cmd.qp_type = type;
		Resp<ib_uverbs_ex_create_qp_resp, xsrc_create_qp_resp> resp;
		ASSERT_EQ(run_ex(IB_USER_VERBS_EX_CMD_CREATE_QP, cmd, &resp, sizeof(ib_uverbs_ex_create_qp_resp),
				 sizeof(xsrc_create_qp_resp)),
			  0)
			<< int(type);
		EXPECT_EQ(resp.drv().rq_off, 0u);
		EXPECT_EQ(resp.core().base.max_send_wr, type == IBV_QPT_XRC_RECV ? 0u : 8u);
		const xsrc_qp_entry &e = qp_entry(resp.core().base.qpn);
		EXPECT_EQ(e.qp_type, type);
		EXPECT_EQ(e.xrcd_id, type == IBV_QPT_XRC_RECV ? xrcd_id(ctx, x) : 0u);
		ASSERT_EQ(destroy_qp(resp.core().base.qp_handle), 0);
	}
}

// --- XRC receive QPs ---------------------------------------------------------

TEST_F(XrcCommandsTest, RecvQpBelongsToTheDomain)
{
	uint32_t x;
	ASSERT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_CREAT, x), 0);
	CreatedQp bad;
	EXPECT_EQ(create_recv_qp(ctx, pd0, bad), EINVAL);  // a PD is no domain
	QpSpec s;
	s.qp_type = IBV_QPT_XRC_RECV;
	s.pd = x;
	s.send_cq = s.recv_cq = 12345;  // no CQs: ignored
	s.max_send_wr = s.max_recv_wr = 100000;  // out of range, but ignored
	CreatedQp qp;
	ASSERT_EQ(create_qp_on(ctx, s, qp), 0);
	EXPECT_EQ(qp.core.max_send_wr, 0u);
	EXPECT_EQ(qp.core.max_recv_wr, 0u);
	EXPECT_EQ(qp.core.max_send_sge, 0u);
	EXPECT_EQ(qp.core.max_recv_sge, 0u);
	EXPECT_EQ(qp.core.max_inline_data, 0u);
	EXPECT_EQ(qp.drv.rq_off, 0u);
	const xsrc_qp_entry &e = qp_entry(qp.qpn);
	EXPECT_EQ(e.qp_type, IBV_QPT_XRC_RECV);
	EXPECT_EQ(e.xrcd_id, xrcd_id(ctx, x));
	EXPECT_EQ(e.pd_id, 0u);
	EXPECT_EQ(e.rq_off, 0u);
	EXPECT_EQ(e.send_cq_off, 0u);
	EXPECT_EQ(e.recv_cq_off, 0u);
	EXPECT_EQ(e.srqn, 0u);
	EXPECT_EQ(e.owner_context, ctx.id);
	// No PD and no CQ was taken.
	EXPECT_EQ(std::get<Pd>(ctx.objects.at(pd0)).use_count, 0u);
	EXPECT_EQ(std::get<Cq>(ctx.objects.at(cq0)).use_count, 0u);

	// RC's masks: the requester attributes are ignored, the responder ones
	// required; RTS needs the ACK timeout and the PSN.
	ASSERT_EQ(modify_qp(modify_cmd(qp.handle, IBV_QPS_INIT, kInitMask)), 0);
	EXPECT_EQ(modify_qp(modify_cmd(qp.handle, IBV_QPS_RTR, kRtrMask & ~IBV_QP_MIN_RNR_TIMER)), EINVAL);
	ASSERT_EQ(modify_qp(modify_cmd(qp.handle, IBV_QPS_RTR, kRtrMask)), 0);
	auto rts = modify_cmd(qp.handle, IBV_QPS_RTS, kRtsMask);
	rts.rnr_retry = 99;  // would be refused where it applies
	ASSERT_EQ(modify_qp(rts), 0);
	EXPECT_EQ(state_of(qp.qpn), IBV_QPS_RTS);
	EXPECT_EQ(e.dest_qpn, kModifyDestQpn);
	EXPECT_EQ(e.rq_psn, kModifyRqPsn);
	EXPECT_EQ(e.min_rnr_timer, 12u);
	EXPECT_EQ(e.max_dest_rd_atomic, 8u);
	EXPECT_EQ(e.access_flags, uint32_t(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
	EXPECT_EQ(e.path_mtu, kModifyPathMtu);
	EXPECT_EQ(e.timeout, 14u);
	EXPECT_EQ(e.retry_cnt, 0u);  // ignored
	EXPECT_EQ(e.rnr_retry, 0u);
	EXPECT_EQ(e.max_rd_atomic, 0u);
	EXPECT_EQ(0, std::memcmp(e.dgid, kPeerGid, 16));

	ib_uverbs_query_qp_resp q{};
	ASSERT_EQ(query_qp(qp.handle, q), 0);
	EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
	EXPECT_EQ(q.dest_qp_num, kModifyDestQpn);
	EXPECT_EQ(q.rq_psn, kModifyRqPsn);
	EXPECT_EQ(q.min_rnr_timer, 12u);
	EXPECT_EQ(q.max_dest_rd_atomic, 8u);
	EXPECT_EQ(q.qp_access_flags, uint32_t(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
	EXPECT_EQ(q.dest.port_num, 1u);
	EXPECT_EQ(q.max_send_wr, 0u);
	EXPECT_EQ(q.max_recv_wr, 0u);

	ASSERT_EQ(destroy_qp(qp.handle), 0);
	EXPECT_EQ(e.state, uint32_t(XSRC_QP_STATE_FREE));
	EXPECT_EQ(e.xrcd_id, 0u);
	EXPECT_EQ(dev.qp_slots.used(), 0u);
}

TEST_F(XrcCommandsTest, OpenQpFromAnotherContext)
{
	auto peer = make_peer();
	uint32_t x, px, private_x;
	ASSERT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_CREAT, x), 0);
	ASSERT_EQ(open_xrcd(peer->ctx, uint32_t(reopen_file()), 0, px), 0);
	ASSERT_EQ(open_xrcd(peer->ctx, kNoFd, 0, private_x), 0);
	CreatedQp tgt, rc;
	ASSERT_EQ(create_recv_qp(ctx, x, tgt), 0);
	ASSERT_EQ(create_qp(qp_spec(IBV_QPT_RC), rc), 0);

	CreatedQp opened;
	EXPECT_EQ(open_qp(peer->ctx, private_x, tgt.qpn, IBV_QPT_XRC_RECV, opened), EINVAL);  // other domain
	EXPECT_EQ(open_qp(peer->ctx, px, tgt.qpn, IBV_QPT_XRC_SEND, opened), EINVAL);         // wrong type
	EXPECT_EQ(open_qp(peer->ctx, px, tgt.qpn, IBV_QPT_RC, opened), EINVAL);
	EXPECT_EQ(open_qp(peer->ctx, px, rc.qpn, IBV_QPT_XRC_RECV, opened), EINVAL);          // not XRC
	EXPECT_EQ(open_qp(peer->ctx, px, tgt.qpn + 1000, IBV_QPT_XRC_RECV, opened), EINVAL);  // no such QP
	EXPECT_EQ(open_qp(peer->ctx, px, 5, IBV_QPT_XRC_RECV, opened), EINVAL);
	EXPECT_EQ(open_qp(peer->ctx, 4242, tgt.qpn, IBV_QPT_XRC_RECV, opened), EINVAL);      // no domain handle
	EXPECT_EQ(peer->ctx.objects.size(), 2u);

	ASSERT_EQ(open_qp(peer->ctx, px, tgt.qpn, IBV_QPT_XRC_RECV, opened), 0);
	EXPECT_EQ(opened.qpn, tgt.qpn);
	EXPECT_EQ(opened.core.max_send_wr, 0u);
	EXPECT_EQ(opened.core.max_recv_wr, 0u);
	EXPECT_EQ(opened.core.max_send_sge, 0u);
	EXPECT_EQ(opened.core.max_recv_sge, 0u);
	EXPECT_EQ(opened.core.max_inline_data, 0u);
	EXPECT_EQ(opened.drv.rq_off, 0u);
	EXPECT_EQ(opened.drv.comp_mask, 0u);
	EXPECT_EQ(dev.qp_slots.used(), 2u);  // the RC QP and the one shared QP

	// Modify through the opened handle: the creator sees the same QP.
	ASSERT_EQ(modify_on(peer->ctx, modify_cmd(opened.handle, IBV_QPS_INIT, kInitMask)), 0);
	ASSERT_EQ(modify_on(peer->ctx, modify_cmd(opened.handle, IBV_QPS_RTR, kRtrMask)), 0);
	ib_uverbs_query_qp_resp q{};
	ASSERT_EQ(query_qp(tgt.handle, q), 0);
	EXPECT_EQ(q.qp_state, IBV_QPS_RTR);
	EXPECT_EQ(q.dest_qp_num, kModifyDestQpn);
	ASSERT_EQ(modify_qp(modify_cmd(tgt.handle, IBV_QPS_RTS, kRtsMask)), 0);
	ASSERT_EQ(query_on(peer->ctx, opened.handle, q), 0);
	EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
	EXPECT_EQ(q.sq_psn, kModifySqPsn);

	// The opened handle uses the peer's domain handle.
	EXPECT_EQ(close_xrcd(peer->ctx, px), EBUSY);
	// Destroying the opened handle drops that handle only.
	ASSERT_EQ(destroy_qp_on(peer->ctx, opened.handle), 0);
	EXPECT_EQ(state_of(tgt.qpn), IBV_QPS_RTS);
	EXPECT_EQ(destroy_qp_on(peer->ctx, opened.handle), EINVAL);
	ASSERT_EQ(close_xrcd(peer->ctx, px), 0);
	ASSERT_EQ(query_qp(tgt.handle, q), 0);

	// The same context may open its own QP too.
	CreatedQp again;
	ASSERT_EQ(open_qp(ctx, x, tgt.qpn, IBV_QPT_XRC_RECV, again), 0);
	EXPECT_NE(again.handle, tgt.handle);
	EXPECT_EQ(again.qpn, tgt.qpn);
}

TEST_F(XrcCommandsTest, RecvQpOutlivesItsCreatorsHandle)
{
	auto peer = make_peer(7);
	uint32_t x, px;
	ASSERT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_CREAT, x), 0);
	ASSERT_EQ(open_xrcd(peer->ctx, uint32_t(reopen_file()), 0, px), 0);
	CreatedQp tgt, opened;
	ASSERT_EQ(create_recv_qp(ctx, x, tgt), 0);
	ASSERT_EQ(modify_qp(modify_cmd(tgt.handle, IBV_QPS_INIT, kInitMask)), 0);
	ASSERT_EQ(open_qp(peer->ctx, px, tgt.qpn, IBV_QPT_XRC_RECV, opened), 0);
	const xsrc_qp_entry &e = qp_entry(tgt.qpn);
	uint32_t generation = e.generation;

	ASSERT_EQ(destroy_qp(tgt.handle), 0);
	EXPECT_EQ(state_of(tgt.qpn), IBV_QPS_INIT);  // alive, same state
	EXPECT_EQ(e.qpn, tgt.qpn);
	EXPECT_EQ(e.generation, generation);
	EXPECT_EQ(e.xrcd_id, xrcd_id(ctx, x));
	EXPECT_EQ(e.owner_context, peer->ctx.id);  // the remaining holder answers for it
	EXPECT_EQ(dev.qp_slots.used(), 1u);
	ASSERT_EQ(close_xrcd(ctx, x), 0);           // the creator's handle is free now
	EXPECT_EQ(dev.xrcds.size(), 1u);            // the peer still holds the domain

	ASSERT_EQ(modify_on(peer->ctx, modify_cmd(opened.handle, IBV_QPS_RTR, kRtrMask)), 0);
	EXPECT_EQ(state_of(tgt.qpn), IBV_QPS_RTR);

	// Still reachable by number.
	CreatedQp second;
	ASSERT_EQ(open_qp(peer->ctx, px, tgt.qpn, IBV_QPT_XRC_RECV, second), 0);
	ASSERT_EQ(destroy_qp_on(peer->ctx, opened.handle), 0);
	EXPECT_EQ(state_of(tgt.qpn), IBV_QPS_RTR);
	ASSERT_EQ(destroy_qp_on(peer->ctx, second.handle), 0);  // the last handle
	EXPECT_EQ(e.state, uint32_t(XSRC_QP_STATE_FREE));
	EXPECT_EQ(dev.qp_slots.used(), 0u);
	EXPECT_EQ(open_qp(peer->ctx, px, tgt.qpn, IBV_QPT_XRC_RECV, second), EINVAL);
	ASSERT_EQ(close_xrcd(peer->ctx, px), 0);
	EXPECT_TRUE(dev.xrcds.empty());
}

// The kernel hands an event on a shared QP to every handle on it; each
// handle counts (and DESTROY_QP reports) its own.
TEST_F(XrcCommandsTest, EventsReachEveryHandle)
{
	auto peer = make_peer();
	uint32_t x, px;
	ASSERT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_CREAT, x), 0);
	ASSERT_EQ(open_xrcd(peer->ctx, uint32_t(file_fd), 0, px), 0);
	CreatedQp tgt, opened;
	ASSERT_EQ(create_recv_qp(ctx, x, tgt, 0xc0de), 0);
	ASSERT_EQ(open_qp(peer->ctx, px, tgt.qpn, IBV_QPT_XRC_RECV, opened, 0xfeed), 0);
	ASSERT_EQ(modify_qp(modify_cmd(tgt.handle, IBV_QPS_INIT, kInitMask)), 0);

	ASSERT_EQ(raise_event(XSRC_EVENT_QP_FATAL, tgt.qpn), 0);
	EXPECT_EQ(state_of(tgt.qpn), IBV_QPS_ERR);
	auto mine = test::records<ib_uverbs_async_event_desc>(async.drain());
	auto theirs = test::records<ib_uverbs_async_event_desc>(peer->async.drain());
	ASSERT_EQ(mine.size(), 1u);
	ASSERT_EQ(theirs.size(), 1u);
	EXPECT_EQ(mine[0].element, 0xc0deu);
	EXPECT_EQ(theirs[0].element, 0xfeedu);
	EXPECT_EQ(mine[0].event_type, uint32_t(IBV_EVENT_QP_FATAL));
	EXPECT_EQ(theirs[0].event_type, uint32_t(IBV_EVENT_QP_FATAL));

	// After the creator's handle is gone, the peer alone gets them.
	uint32_t reported = ~0u;
	ASSERT_EQ(destroy_qp(tgt.handle, &reported), 0);
	EXPECT_EQ(reported, 1u);
	ASSERT_EQ(modify_on(peer->ctx, modify_cmd(opened.handle, IBV_QPS_RESET, IBV_QP_STATE)), 0);
	ASSERT_EQ(modify_on(peer->ctx, modify_cmd(opened.handle, IBV_QPS_INIT, kInitMask)), 0);
	ASSERT_EQ(raise_event(XSRC_EVENT_QP_FATAL, tgt.qpn), 0);
	EXPECT_TRUE(async.drain().empty());
	EXPECT_EQ(test::records<ib_uverbs_async_event_desc>(peer->async.drain()).size(), 1u);
	ASSERT_EQ(destroy_qp_on(peer->ctx, opened.handle, &reported), 0);
	EXPECT_EQ(reported, 2u);
}

// --- teardown ----------------------------------------------------------------

TEST_F(XrcCommandsTest, TeardownOfAnOpenerReleasesItsHandles)
{
	auto peer = make_peer();
	uint32_t x, px;
	ASSERT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_CREAT, x), 0);
	ASSERT_EQ(open_xrcd(peer->ctx, uint32_t(file_fd), 0, px), 0);
	CreatedQp tgt, opened;
	ASSERT_EQ(create_recv_qp(ctx, x, tgt), 0);
	ASSERT_EQ(open_qp(peer->ctx, px, tgt.qpn, IBV_QPT_XRC_RECV, opened), 0);
	uint32_t ppd = 0;
	{
		Resp<ib_uverbs_alloc_pd_resp, xsrc_alloc_pd_resp> resp;
		ib_uverbs_alloc_pd cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		ASSERT_EQ(run_on(peer->ctx, IB_USER_VERBS_CMD_ALLOC_PD, cmd, {}, sizeof(resp)), 0);
		ppd = resp.core().pd_handle;
	}
	uint32_t pcq = 0;
	{
		Resp<ib_uverbs_create_cq_resp, xsrc_create_cq_resp> resp;
		ib_uverbs_create_cq cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.cqe = 16;
		cmd.comp_channel = -1;
		ASSERT_EQ(run_on(peer->ctx, IB_USER_VERBS_CMD_CREATE_CQ, cmd, {}, sizeof(resp)), 0);
		pcq = resp.core().cq_handle;
	}
	uint32_t psrq;
	ib_uverbs_create_srq_resp srq_core{};
	ASSERT_EQ(create_xsrq(peer->ctx, ppd, px, pcq, psrq, &srq_core), 0);

	destroy_context_objects(peer->ctx);  // the process died
	EXPECT_TRUE(peer->ctx.objects.empty());
	EXPECT_EQ(srq_entry(srq_core.srqn).srqn, 0u);
	EXPECT_EQ(state_of(tgt.qpn), IBV_QPS_RESET);  // the creator's QP lives on
	EXPECT_EQ(qp_entry(tgt.qpn).qpn, tgt.qpn);
	ASSERT_EQ(dev.xrcds.size(), 1u);
	EXPECT_EQ(dev.xrcds.begin()->second.handles, 1u);
	ASSERT_EQ(destroy_qp(tgt.handle), 0);
	ASSERT_EQ(close_xrcd(ctx, x), 0);
	EXPECT_TRUE(dev.xrcds.empty());
}

TEST_F(XrcCommandsTest, TeardownOfTheCreatorLeavesTheQpToItsHolders)
{
	auto peer = make_peer();
	uint32_t x, px;
	ASSERT_EQ(open_xrcd(ctx, uint32_t(file_fd), O_CREAT, x), 0);
	ASSERT_EQ(open_xrcd(peer->ctx, uint32_t(file_fd), 0, px), 0);
	CreatedQp tgt, opened, send;
	ASSERT_EQ(create_recv_qp(ctx, x, tgt), 0);
	ASSERT_EQ(create_qp(qp_spec(IBV_QPT_XRC_SEND), send), 0);
	uint32_t srq;
	ASSERT_EQ(create_xsrq(ctx, pd0, x, cq0, srq), 0);
	ASSERT_EQ(open_qp(peer->ctx, px, tgt.qpn, IBV_QPT_XRC_RECV, opened), 0);

	destroy_context_objects(ctx);  // the creator died
	EXPECT_TRUE(ctx.objects.empty());
	EXPECT_EQ(qp_entry(send.qpn).state, uint32_t(XSRC_QP_STATE_FREE));
	EXPECT_EQ(dev.srq_slots.used(), 0u);
	EXPECT_EQ(state_of(tgt.qpn), IBV_QPS_RESET);
	EXPECT_EQ(qp_entry(tgt.qpn).owner_context, peer->ctx.id);
	EXPECT_EQ(dev.qp_slots.used(), 1u);
	ASSERT_EQ(dev.xrcds.size(), 1u);
	ASSERT_EQ(modify_on(peer->ctx, modify_cmd(opened.handle, IBV_QPS_INIT, kInitMask)), 0);

	destroy_context_objects(peer->ctx);
	EXPECT_EQ(qp_entry(tgt.qpn).state, uint32_t(XSRC_QP_STATE_FREE));
	EXPECT_EQ(dev.qp_slots.used(), 0u);
	EXPECT_TRUE(dev.xrcds.empty());
	EXPECT_TRUE(dev.xrcds_by_inode.empty());
	EXPECT_EQ(arena().allocation_count(), 0u);
	for (uint32_t n : dev.object_counts)
		EXPECT_EQ(n, 0u);
}

}  // namespace
}  // namespace xsrc::test
