// Memory windows (driver ABI r4): ALLOC_MW / DEALLOC_MW, XSRC_CMD_BIND_MW,
// XSRC_CMD_INVALIDATE, the window's entry in the arena's MR table, and
// XSRC_CMD_COPY through a window's rkey. The windows live in the peer
// context of two_contexts_fixture.h; the fixture's own context is the
// remote requester.
#include <map>

#include "two_contexts_fixture.h"

namespace xsrc::test {
namespace {

constexpr uint32_t kRemote = IB_UVERBS_ACCESS_REMOTE_WRITE | IB_UVERBS_ACCESS_REMOTE_READ;

class MwTest : public TwoContexts {
protected:
	void SetUp() override
	{
		TwoContexts::SetUp();
		ib_uverbs_reg_mr_resp r{};
		ASSERT_EQ(reg_mr_on(peer, peer_pd, target, sizeof(target),
				    IB_UVERBS_ACCESS_LOCAL_WRITE | IB_UVERBS_ACCESS_MW_BIND, r),
			  0);
		bind_mr = r.mr_handle;
	}

	int alloc_mw(uint8_t type, uint32_t &handle, uint32_t &rkey, uint32_t pd = ~0u)
	{
		ib_uverbs_alloc_mw_resp resp{};
		ib_uverbs_alloc_mw cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.pd_handle = pd == ~0u ? peer_pd : pd;
		cmd.mw_type = type;
		int err = run_on(peer, IB_USER_VERBS_CMD_ALLOC_MW, cmd, {}, sizeof(resp));
		handle = resp.mw_handle;
		rkey = resp.rkey;
		return err;
	}
	uint32_t window(uint8_t type)
	{
		uint32_t h = 0, k = 0;
		EXPECT_EQ(alloc_mw(type, h, k), 0);
		keys[h] = k;
		return h;
	}
	// Binds `mw` (the peer's) over target[off, off+len) with the next key byte.
	// mr, qp: -1 for the fixture's (XSRC_NO_HANDLE is no MR).
	int bind(uint32_t mw, size_t off, size_t len, uint32_t access, int64_t mr = -1, int64_t qp = -1,
		 uint32_t rkey = 0)
	{
		xsrc_bind_mw b{};
		b.qp_handle = qp < 0 ? peer_qp : uint32_t(qp);
		b.mw_handle = mw;
		b.mr_handle = mr < 0 ? bind_mr : uint32_t(mr);
		b.rkey = rkey ? rkey : ibv_inc_rkey(keys[mw]);
		b.access = access;
		b.addr = reinterpret_cast<uintptr_t>(target) + off;
		b.length = len;
		int err = run_on(peer, XSRC_CMD_BIND_MW, b);
		if (!err)
			keys[mw] = b.rkey;
		return err;
	}
	int invalidate(Context &c, uint32_t kind, uint32_t qp, uint32_t rkey, uint32_t peer_qpn_ = 0)
	{
		xsrc_invalidate inv{};
		inv.kind = kind;
		inv.qp_handle = qp;
		inv.rkey = rkey;
		inv.peer_qpn = peer_qpn_;
		return run_on(c, XSRC_CMD_INVALIDATE, inv);
	}
	const xsrc_mr_entry &entry(uint32_t mw) { return arena().mr_entry(keys[mw] >> 8); }
	// A WRITE through the device with the window's rkey: the copy's status.
	uint32_t write_through(uint32_t mw, size_t off, size_t len = 8)
	{
		unsigned char src[64];
		std::memset(src, 0x5a, sizeof(src));
		xsrc_copy_resp resp{};
		EXPECT_EQ(copy(rkey_op(XSRC_COPY_WRITE, keys[mw], off), src, len, resp), 0);
		return resp.status;
	}

	uint32_t bind_mr = 0;
	std::map<uint32_t, uint32_t> keys;  // window handle -> its current rkey
};

TEST_F(MwTest, AllocTakesTypesOneAndTwoOnly)
{
	uint32_t h1, k1, h2, k2, h;
	ASSERT_EQ(alloc_mw(IBV_MW_TYPE_1, h1, k1), 0);
	ASSERT_EQ(alloc_mw(IBV_MW_TYPE_2, h2, k2), 0);
	EXPECT_NE(k1 >> 8, k2 >> 8);
	EXPECT_NE(k1 >> 8, uint32_t(peer_mr) >> 8) << "windows and MRs share the key space";
	EXPECT_EQ(arena().mr_entry(k1 >> 8).key, 0u) << "an unbound window has no entry";
	EXPECT_EQ(alloc_mw(3, h, k1), EINVAL) << "not EOPNOTSUPP: there is no such type";
	EXPECT_EQ(alloc_mw(0, h, k1), EINVAL);
	EXPECT_EQ(alloc_mw(IBV_MW_TYPE_1, h, k1, 9999), EINVAL) << "no such PD";
	ib_uverbs_dealloc_pd dpd{peer_pd};
	EXPECT_EQ(run_on(peer, IB_USER_VERBS_CMD_DEALLOC_PD, dpd), EBUSY) << "windows hold their PD";
	ib_uverbs_dealloc_mw d{h1};
	EXPECT_EQ(run_on(peer, IB_USER_VERBS_CMD_DEALLOC_MW, d), 0);
	EXPECT_EQ(run_on(peer, IB_USER_VERBS_CMD_DEALLOC_MW, d), EINVAL);
	EXPECT_EQ(run_on(ctx, IB_USER_VERBS_CMD_DEALLOC_MW, ib_uverbs_dealloc_mw{h2}), EINVAL)
		<< "another context's handle";
}

TEST_F(MwTest, ARevisionThreeDeviceHasNoWindows)
{
	dev.abi_revision = 3;
	uint32_t h, k;
	EXPECT_EQ(alloc_mw(IBV_MW_TYPE_1, h, k), EOPNOTSUPP);
	ib_uverbs_reg_mr_resp r{};
	EXPECT_EQ(reg_mr_on(peer, peer_pd, target, 64, IB_UVERBS_ACCESS_MW_BIND, r), EOPNOTSUPP);
	EXPECT_EQ(invalidate(peer, XSRC_INVALIDATE_LOCAL, peer_qp, 0x100), EOPNOTSUPP);
	ib_uverbs_query_device_resp q{};
	ib_uverbs_query_device cmd{};
	cmd.response = reinterpret_cast<uintptr_t>(&q);
	ASSERT_EQ(run(IB_USER_VERBS_CMD_QUERY_DEVICE, cmd, {}, sizeof(q)), 0);
	EXPECT_EQ(q.max_mw, 0u);
	EXPECT_FALSE(q.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
	dev.abi_revision = XSRC_DRIVER_ABI_REVISION;
	ASSERT_EQ(run(IB_USER_VERBS_CMD_QUERY_DEVICE, cmd, {}, sizeof(q)), 0);
	EXPECT_EQ(q.max_mw, DeviceLimits::max_mw);
	EXPECT_TRUE(q.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
	EXPECT_TRUE(q.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
}

// The entry the data path checks: the window's range, rights, PD and (type
// 2) QP; a zero-length type 1 bind removes it.
TEST_F(MwTest, BindPublishesTheWindowInTheMrTable)
{
	uint32_t w1 = window(IBV_MW_TYPE_1), w2 = window(IBV_MW_TYPE_2);
	ASSERT_EQ(bind(w1, 512, 1024, kRemote), 0);
	const xsrc_mr_entry &e = entry(w1);
	EXPECT_EQ(e.key, keys[w1]);
	EXPECT_EQ(e.mw_type, 1u);
	EXPECT_EQ(e.bound_qpn, 0u);
	EXPECT_EQ(e.addr, reinterpret_cast<uintptr_t>(target) + 512);
	EXPECT_EQ(e.iova, e.addr);
	EXPECT_EQ(e.length, 1024u);
	EXPECT_EQ(e.access, kRemote);
	EXPECT_EQ(e.pd_id, peer_pd_id);
	EXPECT_EQ(e.owner_pid, uint32_t(getpid()));

	ASSERT_EQ(bind(w2, 0, 64, IB_UVERBS_ACCESS_REMOTE_WRITE | IB_UVERBS_ACCESS_ZERO_BASED), 0);
	EXPECT_EQ(entry(w2).mw_type, 2u);
	EXPECT_EQ(entry(w2).bound_qpn, peer_qpn);
	EXPECT_EQ(entry(w2).iova, 0u) << "zero based";

	uint32_t old = keys[w1];
	ASSERT_EQ(bind(w1, 0, 0, 0, XSRC_NO_HANDLE), 0);
	EXPECT_EQ(arena().mr_entry(old >> 8).key, 0u) << "a zero-length type 1 bind unbinds";
}

// Every refusal is EINVAL (the provider completes it with IBV_WC_MW_BIND_ERR)
// and changes nothing.
TEST_F(MwTest, BindChecksAreTheSpecs)
{
	uint32_t w1 = window(IBV_MW_TYPE_1), w2 = window(IBV_MW_TYPE_2);
	ib_uverbs_reg_mr_resp plain{}, noloc{}, zb{};
	ASSERT_EQ(reg_mr_on(peer, peer_pd, target, 64, kAll, plain), 0);
	ASSERT_EQ(reg_mr_on(peer, peer_pd, target, 64, IB_UVERBS_ACCESS_MW_BIND, noloc), 0);
	ASSERT_EQ(reg_mr_on(peer, peer_pd, target, 64,
			    IB_UVERBS_ACCESS_MW_BIND | IB_UVERBS_ACCESS_LOCAL_WRITE | IB_UVERBS_ACCESS_ZERO_BASED, zb),
		  0);
	Resp<ib_uverbs_alloc_pd_resp, xsrc_alloc_pd_resp> pd2;
	ib_uverbs_alloc_pd apd{};
	apd.response = reinterpret_cast<uintptr_t>(&pd2);
	ASSERT_EQ(run_on(peer, IB_USER_VERBS_CMD_ALLOC_PD, apd, {}, sizeof(pd2)), 0);
	uint32_t other_h, other_k;
	ASSERT_EQ(alloc_mw(IBV_MW_TYPE_1, other_h, other_k, pd2.core().pd_handle), 0);
	keys[other_h] = other_k;

	EXPECT_EQ(bind(w1, 0, 64, IB_UVERBS_ACCESS_REMOTE_WRITE, plain.mr_handle), EINVAL) << "no MW_BIND";
	EXPECT_EQ(bind(w1, 4000, 200, IB_UVERBS_ACCESS_REMOTE_WRITE), EINVAL) << "past the MR";
	EXPECT_EQ(bind(w1, 0, 64, IB_UVERBS_ACCESS_REMOTE_WRITE, noloc.mr_handle), EINVAL) << "C10-74";
	EXPECT_EQ(bind(w1, 0, 64, IB_UVERBS_ACCESS_REMOTE_READ, zb.mr_handle), EINVAL) << "a zero-based MR";
	EXPECT_EQ(bind(w1, 0, 64, IB_UVERBS_ACCESS_REMOTE_READ | IB_UVERBS_ACCESS_ZERO_BASED), EINVAL)
		<< "o10-36.2.2";
	EXPECT_EQ(bind(w1, 0, 64, IB_UVERBS_ACCESS_MW_BIND), EINVAL) << "a right a window cannot grant";
	EXPECT_EQ(bind(other_h, 0, 64, IB_UVERBS_ACCESS_REMOTE_READ), EINVAL) << "the window of another PD";
	EXPECT_EQ(bind(w2, 0, 64, IB_UVERBS_ACCESS_REMOTE_READ, -1, -1, ibv_inc_rkey(keys[w2]) ^ 0x100), EINVAL)
		<< "an rkey of another index";
	EXPECT_EQ(bind(w2, 0, 0, IB_UVERBS_ACCESS_REMOTE_READ), EINVAL) << "o10-37.2.40";
	EXPECT_EQ(bind(w2, 0, 64, IB_UVERBS_ACCESS_REMOTE_READ, XSRC_NO_HANDLE), EINVAL);
	EXPECT_EQ(bind(w2, 0, 64, IB_UVERBS_ACCESS_REMOTE_READ, 9999), EINVAL) << "no such MR";
	EXPECT_EQ(bind(w2, 0, 64, IB_UVERBS_ACCESS_REMOTE_READ, -1, 9999), EINVAL) << "no such QP";
	for (auto [h, k] : keys)
		EXPECT_EQ(arena().mr_entry(k >> 8).key, 0u) << "window " << h;
	ASSERT_EQ(bind(w2, 0, 64, IB_UVERBS_ACCESS_REMOTE_READ), 0);
	EXPECT_EQ(bind(w2, 0, 64, IB_UVERBS_ACCESS_REMOTE_READ), EINVAL) << "o10-37.2.30: bound already";
	xsrc_bind_mw b{};
	b.comp_mask = 1;
	EXPECT_EQ(run_on(peer, XSRC_CMD_BIND_MW, b), EOPNOTSUPP);
}

// XSRC_CMD_COPY (another user's requester) honours windows as the data path
// does: range and rights, the QP a type 2 window was bound on, and nothing
// once it is invalidated.
TEST_F(MwTest, CopyHonoursWindows)
{
	uint32_t w1 = window(IBV_MW_TYPE_1), w2 = window(IBV_MW_TYPE_2);
	ASSERT_EQ(bind(w1, 1024, 512, IB_UVERBS_ACCESS_REMOTE_WRITE), 0);
	EXPECT_EQ(write_through(w1, 1024), 0u);
	EXPECT_EQ(target[1024], 0x5a);
	EXPECT_EQ(write_through(w1, 1024 + 512 - 4), uint32_t(EACCES)) << "past the window";
	EXPECT_EQ(write_through(w1, 0), uint32_t(EACCES)) << "before it";

	// Bound on another QP of the peer: our QP is not connected to it.
	QpSpec ps = qp_spec();
	ps.pd = peer_pd;
	Resp<ib_uverbs_create_qp_resp, xsrc_create_qp_resp> pq;
	ib_uverbs_create_qp cqp = create_qp_cmd(ps);
	for (auto &[h, obj] : peer.objects)
		if (std::holds_alternative<Cq>(obj))
			cqp.send_cq_handle = cqp.recv_cq_handle = h;
	cqp.response = reinterpret_cast<uintptr_t>(&pq);
	ASSERT_EQ(run_on(peer, IB_USER_VERBS_CMD_CREATE_QP, cqp, {}, sizeof(pq)), 0);
	ASSERT_EQ(bind(w2, 0, 64, IB_UVERBS_ACCESS_REMOTE_WRITE, -1, pq.core().qp_handle), 0);
	EXPECT_EQ(write_through(w2, 0), uint32_t(EACCES)) << "type 2B: another QP";
	EXPECT_EQ(invalidate(peer, XSRC_INVALIDATE_LOCAL, peer_qp, keys[w2]), 0);
	ASSERT_EQ(bind(w2, 0, 64, IB_UVERBS_ACCESS_REMOTE_WRITE), 0);
	EXPECT_EQ(write_through(w2, 0), 0u) << "bound on the QP ours is connected to";
	EXPECT_EQ(invalidate(peer, XSRC_INVALIDATE_LOCAL, peer_qp, keys[w2]), 0);
	EXPECT_EQ(write_through(w2, 8), uint32_t(EACCES)) << "invalidated";
}

TEST_F(MwTest, InvalidateLocalAndRemote)
{
	uint32_t w1 = window(IBV_MW_TYPE_1), w2 = window(IBV_MW_TYPE_2);
	ASSERT_EQ(bind(w1, 0, 64, IB_UVERBS_ACCESS_REMOTE_WRITE), 0);
	ASSERT_EQ(bind(w2, 0, 64, IB_UVERBS_ACCESS_REMOTE_WRITE), 0);
	EXPECT_EQ(invalidate(peer, XSRC_INVALIDATE_LOCAL, peer_qp, keys[w1]), EINVAL) << "o10-37.2.26: type 1";
	EXPECT_EQ(invalidate(peer, XSRC_INVALIDATE_LOCAL, peer_qp, peer_mr), EINVAL) << "an MR's rkey";
	EXPECT_EQ(invalidate(peer, XSRC_INVALIDATE_LOCAL, peer_qp, keys[w2] ^ 1), EINVAL) << "a stale key byte";
	EXPECT_EQ(invalidate(ctx, XSRC_INVALIDATE_LOCAL, own.handle, keys[w2]), EINVAL) << "another context's";
	EXPECT_EQ(invalidate(ctx, XSRC_INVALIDATE_REMOTE, stranger.handle, keys[w2], peer_qpn), EINVAL)
		<< "a QP the peer is not connected back to";
	EXPECT_EQ(invalidate(ctx, XSRC_INVALIDATE_REMOTE, own.handle, keys[w2], peer_qpn + 1), EINVAL);
	EXPECT_EQ(invalidate(ctx, 3, own.handle, keys[w2], peer_qpn), EINVAL) << "no such kind";
	EXPECT_EQ(entry(w2).key, keys[w2]) << "still bound after the refusals";
	EXPECT_EQ(invalidate(ctx, XSRC_INVALIDATE_REMOTE, own.handle, keys[w2], peer_qpn), 0);
	EXPECT_EQ(entry(w2).key, 0u);
	EXPECT_EQ(invalidate(ctx, XSRC_INVALIDATE_REMOTE, own.handle, keys[w2], peer_qpn), EINVAL)
		<< "not bound any more";
	ASSERT_EQ(bind(w2, 0, 64, IB_UVERBS_ACCESS_REMOTE_WRITE), 0) << "free to bind again";
	EXPECT_EQ(invalidate(peer, XSRC_INVALIDATE_LOCAL, peer_qp, keys[w2]), 0);
	EXPECT_EQ(entry(w2).key, 0u);
}

// Windows lose their binding with their MR (dereg), and a type 2 window
// with the QP it was bound on: a later QP of that number reaches nothing.
TEST_F(MwTest, DeregAndQpDestroyUnbind)
{
	uint32_t w1 = window(IBV_MW_TYPE_1), w2 = window(IBV_MW_TYPE_2), w3 = window(IBV_MW_TYPE_1);
	ib_uverbs_reg_mr_resp other{};
	ASSERT_EQ(reg_mr_on(peer, peer_pd, target, 64, IB_UVERBS_ACCESS_LOCAL_WRITE | IB_UVERBS_ACCESS_MW_BIND,
			    other),
		  0);
	ASSERT_EQ(bind(w1, 0, 64, IB_UVERBS_ACCESS_REMOTE_WRITE, other.mr_handle), 0);
	ASSERT_EQ(bind(w3, 0, 64, IB_UVERBS_ACCESS_REMOTE_WRITE), 0);
	ASSERT_EQ(bind(w2, 0, 64, IB_UVERBS_ACCESS_REMOTE_WRITE), 0);
	ASSERT_EQ(run_on(peer, IB_USER_VERBS_CMD_DEREG_MR, ib_uverbs_dereg_mr{other.mr_handle}), 0);
	EXPECT_EQ(entry(w1).key, 0u) << "its MR went";
	EXPECT_EQ(entry(w3).key, keys[w3]) << "another MR's window";
	ib_uverbs_destroy_qp_resp resp{};
	ib_uverbs_destroy_qp d{};
	d.response = reinterpret_cast<uintptr_t>(&resp);
	d.qp_handle = peer_qp;
	ASSERT_EQ(run_on(peer, IB_USER_VERBS_CMD_DESTROY_QP, d, {}, sizeof(resp)), 0);
	EXPECT_EQ(entry(w2).key, 0u) << "its QP went";
	EXPECT_EQ(entry(w3).key, keys[w3]) << "a type 1 window belongs to no QP";
}

}  // namespace
}  // namespace xsrc::test
