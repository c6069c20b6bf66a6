// XSRC_CMD_COPY (driver ABI r2) and the caller identity in GET_CONTEXT. Two
// contexts of one device, both "owned" by this test process: the fixture's
// (the requester) and a peer's (the responder), each with an RC QP connected
// to the other's. The daemon moves the bytes with process_vm_*, so what it
// writes shows up in our own buffers.
#include <sys/uio.h>

#include "command_fixture.h"

namespace xsrc::test {
namespace {

constexpr uint32_t kAll = IB_UVERBS_ACCESS_LOCAL_WRITE | IB_UVERBS_ACCESS_REMOTE_WRITE |
			  IB_UVERBS_ACCESS_REMOTE_READ | IB_UVERBS_ACCESS_REMOTE_ATOMIC;

class CopyTest : public CommandFixture {
protected:
	void SetUp() override
	{
		CommandFixture::SetUp();
		basic_objects();
		peer.id = 2;
		peer.device = &dev;
		peer.owner = getpid();
		peer.caller = std::make_unique<ProcessCaller>(getpid());
		dev.contexts.push_back(&peer);
		xsrc_get_context_req drv{};
		drv.async_fds = peer_async.pair();
		Resp<ib_uverbs_get_context_resp, xsrc_get_context_resp> gresp;
		ib_uverbs_get_context get{};
		get.response = reinterpret_cast<uintptr_t>(&gresp);
		ASSERT_EQ(run_on(peer, IB_USER_VERBS_CMD_GET_CONTEXT, get, std::as_bytes(std::span(&drv, 1)),
				 sizeof(gresp)),
			  0);

		Resp<ib_uverbs_alloc_pd_resp, xsrc_alloc_pd_resp> pd;
		ib_uverbs_alloc_pd apd{};
		apd.response = reinterpret_cast<uintptr_t>(&pd);
		ASSERT_EQ(run_on(peer, IB_USER_VERBS_CMD_ALLOC_PD, apd, {}, sizeof(pd)), 0);
		peer_pd = pd.core().pd_handle;
		peer_pd_id = pd.drv().pd_id;
		Resp<ib_uverbs_create_cq_resp, xsrc_create_cq_resp> cq;
		ib_uverbs_create_cq ccq{};
		ccq.response = reinterpret_cast<uintptr_t>(&cq);
		ccq.cqe = 16;
		ccq.comp_channel = -1;
		ASSERT_EQ(run_on(peer, IB_USER_VERBS_CMD_CREATE_CQ, ccq, {}, sizeof(cq)), 0);
		QpSpec ps = qp_spec();
		ps.pd = peer_pd;
		ps.send_cq = ps.recv_cq = cq.core().cq_handle;
		Resp<ib_uverbs_create_qp_resp, xsrc_create_qp_resp> pq;
		ib_uverbs_create_qp cqp = create_qp_cmd(ps);
		cqp.response = reinterpret_cast<uintptr_t>(&pq);
		ASSERT_EQ(run_on(peer, IB_USER_VERBS_CMD_CREATE_QP, cqp, {}, sizeof(pq)), 0);
		peer_qp = pq.core().qp_handle;
		peer_qpn = pq.core().qpn;
		ASSERT_EQ(create_qp(qp_spec(), own), 0);
		ASSERT_EQ(create_qp(qp_spec(), stranger), 0);  // never connected

		connect(ctx, own.handle, peer_qpn, kAll);
		connect(peer, peer_qp, own.qpn, kAll);
		connect(ctx, stranger.handle, peer_qpn, kAll);  // one-sided: the peer is not connected back

		std::memset(target, 0, sizeof(target));
		peer_mr = reg_on(peer, peer_pd, target, sizeof(target), kAll);
		peer_ro = reg_on(peer, peer_pd, target, sizeof(target), IB_UVERBS_ACCESS_LOCAL_WRITE);
		peer_noloc = reg_on(peer, peer_pd, target, sizeof(target), 0);
	}
	void TearDown() override
	{
		destroy_context_objects(peer);
		CommandFixture::TearDown();
	}

	void connect(Context &c, uint32_t qp, uint32_t dest, uint32_t access)
	{
		ib_uverbs_modify_qp m{};
		m.qp_handle = qp;
		m.qp_state = IBV_QPS_INIT;
		m.attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
		m.port_num = 1;
		m.qp_access_flags = access & ~IB_UVERBS_ACCESS_LOCAL_WRITE;
		ASSERT_EQ(run_on(c, IB_USER_VERBS_CMD_MODIFY_QP, m), 0);
		m = {};
		m.qp_handle = qp;
		m.qp_state = IBV_QPS_RTR;
		m.attr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		m.dest.is_global = 1;
		m.dest.hop_limit = 64;
		m.dest.port_num = 1;
		m.dest.sgid_index = 0;
		m.path_mtu = IBV_MTU_1024;
		m.dest_qp_num = dest;
		m.max_dest_rd_atomic = 1;
		m.min_rnr_timer = 1;
		ASSERT_EQ(run_on(c, IB_USER_VERBS_CMD_MODIFY_QP, m), 0);
		m.qp_state = IBV_QPS_RTS;
		m.attr_mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			      IBV_QP_MAX_QP_RD_ATOMIC;
		m.timeout = 14;
		m.retry_cnt = 7;
		m.rnr_retry = 7;
		m.max_rd_atomic = 1;
		ASSERT_EQ(run_on(c, IB_USER_VERBS_CMD_MODIFY_QP, m), 0);
	}

	uint32_t reg_on(Context &c, uint32_t pd, void *addr, size_t len, uint32_t access)
	{
		ib_uverbs_reg_mr_resp resp{};
		EXPECT_EQ(reg_mr_on(c, pd, addr, len, access, resp), 0);
		return resp.rkey;
	}

	// A COPY as the provider sends it; the command's errno, the status in `resp`.
	int copy(xsrc_copy cmd, void *local, size_t len, xsrc_copy_resp &resp)
	{
		iov = {local, len};
		resp = {~0u, ~0u, ~0ull};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		if (!cmd.local_iov) {
			cmd.local_iov = reinterpret_cast<uintptr_t>(&iov);
			cmd.num_local = 1;
		}
		if (!cmd.length)
			cmd.length = len;
		return run(XSRC_CMD_COPY, cmd, {}, sizeof(resp));
	}

	xsrc_copy rkey_op(uint32_t op, uint32_t key, size_t offset = 0)
	{
		xsrc_copy c{};
		c.op = op;
		c.key_kind = XSRC_COPY_RKEY;
		c.key = key;
		c.qp_handle = own.handle;
		c.peer_qpn = peer_qpn;
		c.peer_addr = reinterpret_cast<uintptr_t>(target) + offset;
		return c;
	}

	bool target_is_zero() const
	{
		return std::all_of(std::begin(target), std::end(target), [](unsigned char b) { return b == 0; });
	}

	Context peer;
	Pipe peer_async;
	uint32_t peer_pd = 0, peer_pd_id = 0, peer_qp = 0, peer_qpn = 0;
	uint32_t peer_mr = 0, peer_ro = 0, peer_noloc = 0;
	CreatedQp own, stranger;
	alignas(8) unsigned char target[4096];
	iovec iov{};
};

TEST_F(CopyTest, GetContextReportsTheCallerAndTheCopyCap)
{
	Context fresh;
	fresh.id = 3;
	fresh.device = &dev;
	fresh.owner = getpid();
	fresh.caller = std::make_unique<ProcessCaller>(getpid());
	Pipe a;
	xsrc_get_context_req drv{};
	drv.async_fds = a.pair();
	Resp<ib_uverbs_get_context_resp, xsrc_get_context_resp> resp;
	ib_uverbs_get_context get{};
	get.response = reinterpret_cast<uintptr_t>(&resp);
	ASSERT_EQ(run_on(fresh, IB_USER_VERBS_CMD_GET_CONTEXT, get, std::as_bytes(std::span(&drv, 1)), sizeof(resp)),
		  0);
	xsrc_get_context_resp d = resp.drv();
	EXPECT_EQ(d.driver_abi, uint32_t(XSRC_DRIVER_ABI_REVISION));
	EXPECT_TRUE(d.comp_mask & XSRC_GET_CONTEXT_RESP_MASK_CALLER);
	EXPECT_EQ(d.caller_pid, uint32_t(getpid()));
	EXPECT_EQ(d.caller_uid, fresh.uid);
	EXPECT_TRUE(d.caps & XSRC_CAP_COPY);
	EXPECT_EQ(d.reserved, 0u);
	destroy_context_objects(fresh);
}

TEST_F(CopyTest, WriteReadAndAtomicsMoveTheBytes)
{
	xsrc_copy_resp resp;
	unsigned char src[300];
	for (size_t i = 0; i < sizeof(src); ++i)
		src[i] = static_cast<unsigned char>(i * 7 + 1);
	// Two local pieces gathered into one remote range.
	iovec two[2] = {{src, 100}, {src + 100, 200}};
	xsrc_copy w = rkey_op(XSRC_COPY_WRITE, peer_mr, 16);
	w.local_iov = reinterpret_cast<uintptr_t>(two);
	w.num_local = 2;
	w.length = 300;
	ASSERT_EQ(copy(w, nullptr, 0, resp), 0);
	EXPECT_EQ(resp.status, 0u);
	EXPECT_EQ(resp.bytes, 300u);
	EXPECT_EQ(std::memcmp(target + 16, src, 300), 0);
	EXPECT_EQ(target[15], 0);
	EXPECT_EQ(target[316], 0);

	unsigned char back[300] = {};
	ASSERT_EQ(copy(rkey_op(XSRC_COPY_READ, peer_mr, 16), back, sizeof(back), resp), 0);
	EXPECT_EQ(resp.status, 0u);
	EXPECT_EQ(std::memcmp(back, src, 300), 0);

	uint64_t counter = 40, old = 0;
	std::memcpy(target + 1024, &counter, 8);
	xsrc_copy fa = rkey_op(XSRC_COPY_FETCH_ADD, peer_mr, 1024);
	fa.compare_add = 2;
	ASSERT_EQ(copy(fa, &old, 8, resp), 0);
	EXPECT_EQ(resp.status, 0u);
	EXPECT_EQ(old, 40u);
	std::memcpy(&counter, target + 1024, 8);
	EXPECT_EQ(counter, 42u);
	xsrc_copy cs = rkey_op(XSRC_COPY_CMP_SWAP, peer_mr, 1024);
	cs.compare_add = 41;  // no match: nothing changes
	cs.swap = 7;
	ASSERT_EQ(copy(cs, &old, 8, resp), 0);
	EXPECT_EQ(old, 42u);
	std::memcpy(&counter, target + 1024, 8);
	EXPECT_EQ(counter, 42u);
	cs.compare_add = 42;
	ASSERT_EQ(copy(cs, &old, 8, resp), 0);
	std::memcpy(&counter, target + 1024, 8);
	EXPECT_EQ(counter, 7u);
	// The device-wide lock is free again.
	auto *locks = &arena().at<uint32_t>(arena().header().atomic_locks_off);
	EXPECT_TRUE(std::all_of(locks, locks + XSRC_ATOMIC_LOCKS, [](uint32_t l) { return l == 0; }));
}

TEST_F(CopyTest, ReceiveBufferThroughItsLkeyNeedsLocalWrite)
{
	xsrc_copy_resp resp;
	char payload[64];
	std::memset(payload, 0x3c, sizeof(payload));
	xsrc_copy c = rkey_op(XSRC_COPY_WRITE, peer_ro);
	c.key_kind = XSRC_COPY_LKEY;
	ASSERT_EQ(copy(c, payload, sizeof(payload), resp), 0);
	EXPECT_EQ(resp.status, 0u);
	EXPECT_EQ(target[63], 0x3c);
	std::memset(target, 0, sizeof(target));
	c.key = peer_noloc;
	ASSERT_EQ(copy(c, payload, sizeof(payload), resp), 0);
	EXPECT_EQ(resp.status, uint32_t(EACCES));
	EXPECT_TRUE(target_is_zero());
	// A receive buffer is only ever written.
	c.key = peer_ro;
	c.op = XSRC_COPY_READ;
	EXPECT_EQ(copy(c, payload, sizeof(payload), resp), EINVAL);
}

TEST_F(CopyTest, KeysRightsAndRangesAreTheDaemonsToCheck)
{
	xsrc_copy_resp resp;
	char payload[64];
	std::memset(payload, 0x77, sizeof(payload));
	auto refused = [&](xsrc_copy c, const char *what) {
		ASSERT_EQ(copy(c, payload, sizeof(payload), resp), 0) << what;
		EXPECT_EQ(resp.status, uint32_t(EACCES)) << what;
		EXPECT_EQ(resp.bytes, 0u) << what;
		EXPECT_TRUE(target_is_zero()) << what;
	};
	refused(rkey_op(XSRC_COPY_WRITE, peer_ro), "an MR without remote write");
	refused(rkey_op(XSRC_COPY_WRITE, peer_mr + 1), "a key with the wrong salt");
	refused(rkey_op(XSRC_COPY_WRITE, (XSRC_MR_TABLE_LEN - 3) << 8), "a key nobody registered");
	refused(rkey_op(XSRC_COPY_WRITE, peer_mr, sizeof(target) - 8), "past the end of the MR");
	refused(rkey_op(XSRC_COPY_WRITE, peer_mr, size_t(-16)), "before the start of the MR");

	// An MR of the requester's own context (another PD) is not the peer's.
	ib_uverbs_reg_mr_resp mr{};
	ASSERT_EQ(reg_mr(pd0, target, sizeof(target), kAll, mr), 0);
	refused(rkey_op(XSRC_COPY_WRITE, mr.rkey), "an MR of another context's PD");

	// A forged arena entry granting everything: the daemon does not look.
	uint32_t index = XSRC_MR_TABLE_LEN - 2, key = index << 8 | 0x42;
	xsrc_mr_entry &e = arena().mr_entry(index);
	e.pd_id = peer_pd_id;
	e.access = kAll;
	e.owner_pid = uint32_t(getpid());
	e.addr = e.iova = reinterpret_cast<uintptr_t>(target);
	e.length = sizeof(target);
	e.key = key;
	refused(rkey_op(XSRC_COPY_WRITE, key), "a forged arena MR entry");
	e = xsrc_mr_entry{};

	// Through a QP the peer is not connected back to.
	xsrc_copy c = rkey_op(XSRC_COPY_WRITE, peer_mr);
	c.qp_handle = stranger.handle;
	refused(c, "a QP the peer is not connected to");
	c = rkey_op(XSRC_COPY_WRITE, peer_mr);
	c.peer_qpn = stranger.qpn;
	refused(c, "a peer QP ours is not connected to");
	c = rkey_op(XSRC_COPY_WRITE, peer_mr);
	c.peer_srqn = XSRC_SRQN_BASE;
	refused(c, "an SRQ number for a non-XRC peer");
}

TEST_F(CopyTest, MalformedRequestsAreRefused)
{
	xsrc_copy_resp resp;
	char buf[16] = {};
	xsrc_copy c = rkey_op(XSRC_COPY_WRITE, peer_mr);
	c.qp_handle = peer_qp + 100;
	EXPECT_EQ(copy(c, buf, 8, resp), EINVAL) << "not a QP of the caller's context";
	c = rkey_op(XSRC_COPY_WRITE, peer_mr);
	c.comp_mask = 1;
	EXPECT_EQ(copy(c, buf, 8, resp), EOPNOTSUPP);
	c = rkey_op(9, peer_mr);
	EXPECT_EQ(copy(c, buf, 8, resp), EINVAL);
	c = rkey_op(XSRC_COPY_WRITE, peer_mr);
	c.key_kind = 0;
	EXPECT_EQ(copy(c, buf, 8, resp), EINVAL);
	c = rkey_op(XSRC_COPY_WRITE, peer_mr);
	c.length = 12;  // the iovecs say 8
	EXPECT_EQ(copy(c, buf, 8, resp), EINVAL);
	c = rkey_op(XSRC_COPY_WRITE, peer_mr);
	c.num_local = XSRC_COPY_MAX_IOV + 1;
	c.local_iov = reinterpret_cast<uintptr_t>(&iov);
	EXPECT_EQ(copy(c, buf, 8, resp), EINVAL);
	c = rkey_op(XSRC_COPY_FETCH_ADD, peer_mr, 4);  // misaligned
	EXPECT_EQ(copy(c, buf, 8, resp), EINVAL);
	c = rkey_op(XSRC_COPY_FETCH_ADD, peer_mr);
	EXPECT_EQ(copy(c, buf, 16, resp), EINVAL);
	// The caller's buffers must be its own mapped memory.
	c = rkey_op(XSRC_COPY_WRITE, peer_mr);
	c.local_iov = 8;
	c.num_local = 1;
	c.length = 8;
	ASSERT_EQ(copy(c, buf, 8, resp), 0);
	EXPECT_EQ(resp.status, uint32_t(EFAULT));
	ASSERT_EQ(copy(rkey_op(XSRC_COPY_WRITE, peer_mr), reinterpret_cast<void *>(8), 8, resp), 0);
	EXPECT_EQ(resp.status, uint32_t(EFAULT));
	EXPECT_TRUE(target_is_zero());
}

TEST_F(CopyTest, ARevisionOneDeviceHasNoCopy)
{
	dev.abi_revision = 1;
	xsrc_copy_resp resp;
	char buf[8] = {};
	EXPECT_EQ(copy(rkey_op(XSRC_COPY_WRITE, peer_mr), buf, 8, resp), EOPNOTSUPP);
	EXPECT_TRUE(target_is_zero());
	dev.abi_revision = XSRC_DRIVER_ABI_REVISION;
}

}  // namespace
}  // namespace xsrc::test
