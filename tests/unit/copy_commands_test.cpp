// XSRC_CMD_COPY (driver ABI r2) and the caller identity in GET_CONTEXT, on
// two contexts of one device (two_contexts_fixture.h).
#include "two_contexts_fixture.h"

namespace xsrc::test {
namespace {

class CopyTest : public TwoContexts {};

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
	auto *locks = &arena().atomic_lock(0);
	EXPECT_TRUE(std::all_of(locks, locks + XSRC_ATOMIC_LOCKS, [](uint32_t l) { return l == 0; }));
}

// The arena's header is anyone's to write: the daemon takes the atomics lock
// where it laid the locks out, not where the header says they are (here far
// past the arena's end).
TEST_F(CopyTest, AnAtomicTakesTheLockWhereTheDaemonLaidItOut)
{
	auto &header = const_cast<xsrc_arena_header &>(arena().header());
	const uint64_t laid_out = header.atomic_locks_off;
	header.atomic_locks_off = uint64_t(1) << 40;
	uint64_t counter = 5, old = 0;
	std::memcpy(target + 8, &counter, 8);
	xsrc_copy fa = rkey_op(XSRC_COPY_FETCH_ADD, peer_mr, 8);
	fa.compare_add = 1;
	xsrc_copy_resp resp;
	ASSERT_EQ(copy(fa, &old, 8, resp), 0);
	header.atomic_locks_off = laid_out;
	EXPECT_EQ(resp.status, 0u);
	EXPECT_EQ(old, 5u);
	std::memcpy(&counter, target + 8, 8);
	EXPECT_EQ(counter, 6u);
	EXPECT_EQ(&arena().atomic_lock(0), &arena().at<uint32_t>(laid_out));
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

// r9: a copy into a receive is checked against the receive the owner posted,
// by the shadow it keeps in its own memory, not against the arena's ring.
class RecvShadowTest : public CopyTest {
protected:
	static constexpr uint32_t kEntries = 4;
	struct Entry {
		xsrc_recv_shadow_entry head;
		xsrc_sge sge[2];
	};

	int register_shadow(uint32_t kind, uint32_t handle, uint32_t entries = kEntries,
			    uint32_t stride = sizeof(Entry))
	{
		xsrc_recv_shadow cmd{};
		cmd.kind = kind;
		cmd.handle = handle;
		cmd.num_entries = entries;
		cmd.stride = stride;
		cmd.addr = reinterpret_cast<uintptr_t>(shadow);
		return run_on(peer, XSRC_CMD_RECV_SHADOW, cmd);
	}

	// The owner posts a receive of one SGE at ring position `pos`.
	void post(uint64_t pos, uint32_t lkey, size_t offset, uint32_t length)
	{
		Entry &e = shadow[pos % kEntries];
		e.head.num_sge = 1;
		e.sge[0] = {reinterpret_cast<uintptr_t>(target) + offset, length, lkey};
		e.head.posted = pos + 1;
	}

	// An LKEY write of `len` bytes at target + offset; with `pos` it names
	// the receive's ring position as a new provider does.
	int fill(size_t offset, size_t len, std::optional<uint64_t> pos, xsrc_copy_resp &resp, uint32_t key = 0)
	{
		xsrc_copy c = rkey_op(XSRC_COPY_WRITE, key ? key : peer_ro, offset);
		c.key_kind = XSRC_COPY_LKEY;
		iov = {payload, len};
		resp = {~0u, ~0u, ~0ull};
		c.response = reinterpret_cast<uintptr_t>(&resp);
		c.local_iov = reinterpret_cast<uintptr_t>(&iov);
		c.num_local = 1;
		c.length = len;
		xsrc_copy_recv recv{};
		if (pos) {
			recv.comp_mask = XSRC_COPY_RECV_MASK_POS;
			recv.recv_pos = *pos;
		}
		return run(XSRC_CMD_COPY, c, pos ? std::as_bytes(std::span(&recv, 1)) : std::span<const std::byte>{},
			   sizeof(resp));
	}

	Entry shadow[kEntries]{};
	unsigned char payload[256];
};

TEST_F(RecvShadowTest, WithoutAShadowTheMrsDecideAsBefore)
{
	std::memset(payload, 0x5a, sizeof(payload));
	xsrc_copy_resp resp;
	ASSERT_EQ(fill(100, 64, std::nullopt, resp), 0);
	EXPECT_EQ(resp.status, 0u);
	EXPECT_EQ(target[100], 0x5a);
}

TEST_F(RecvShadowTest, ACopyOnlyFillsTheReceivePosted)
{
	std::memset(payload, 0x5a, sizeof(payload));
	ASSERT_EQ(register_shadow(XSRC_RECV_SHADOW_QP, peer_qp), 0);
	xsrc_copy_resp resp;
	// Nothing posted yet: a WQE forged in the arena names any position.
	ASSERT_EQ(fill(0, 64, 0, resp), 0);
	EXPECT_EQ(resp.status, uint32_t(EACCES));
	post(5, peer_ro, 0, 128);
	// No position named (an older sender): refused once a shadow exists.
	ASSERT_EQ(fill(0, 64, std::nullopt, resp), 0);
	EXPECT_EQ(resp.status, uint32_t(EACCES));
	// Outside the SGE, another lkey, another lap of the same slot.
	ASSERT_EQ(fill(100, 64, 5, resp), 0);
	EXPECT_EQ(resp.status, uint32_t(EACCES));
	ASSERT_EQ(fill(0, 64, 5, resp, peer_mr), 0);
	EXPECT_EQ(resp.status, uint32_t(EACCES));
	ASSERT_EQ(fill(0, 64, 5 + kEntries, resp), 0);
	EXPECT_EQ(resp.status, uint32_t(EACCES));
	EXPECT_TRUE(target_is_zero());
	// Inside the receive posted at that position: moved.
	ASSERT_EQ(fill(64, 64, 5, resp), 0);
	EXPECT_EQ(resp.status, 0u);
	EXPECT_EQ(resp.bytes, 64u);
	EXPECT_EQ(target[64], 0x5a);
	EXPECT_EQ(target[127], 0x5a);
	EXPECT_EQ(target[128], 0);
	// Reposted into the slot a lap later: the old position is no longer valid.
	post(5 + kEntries, peer_ro, 1024, 64);
	ASSERT_EQ(fill(64, 64, 5, resp), 0);
	EXPECT_EQ(resp.status, uint32_t(EACCES));
}

TEST_F(RecvShadowTest, MalformedShadowsAndPositionsAreRefused)
{
	EXPECT_EQ(register_shadow(XSRC_RECV_SHADOW_QP, peer_qp, 3), EINVAL);
	EXPECT_EQ(register_shadow(XSRC_RECV_SHADOW_QP, peer_qp, kEntries, 12), EINVAL);
	EXPECT_EQ(register_shadow(XSRC_RECV_SHADOW_QP, peer_qp + 100), EINVAL);
	EXPECT_EQ(register_shadow(XSRC_RECV_SHADOW_SRQ, peer_qp), EINVAL);
	EXPECT_EQ(register_shadow(7, peer_qp), EINVAL);
	// A position for a copy that fills no receive.
	xsrc_copy c = rkey_op(XSRC_COPY_WRITE, peer_mr);
	xsrc_copy_recv recv{XSRC_COPY_RECV_MASK_POS, 0, 1};
	xsrc_copy_resp resp{};
	c.response = reinterpret_cast<uintptr_t>(&resp);
	EXPECT_EQ(run(XSRC_CMD_COPY, c, std::as_bytes(std::span(&recv, 1)), sizeof(resp)), EINVAL);
	recv.comp_mask = 2;
	EXPECT_EQ(run(XSRC_CMD_COPY, c, std::as_bytes(std::span(&recv, 1)), sizeof(resp)), EOPNOTSUPP);
}

TEST_F(RecvShadowTest, ARevisionEightDeviceKnowsNoShadow)
{
	dev.abi_revision = 8;
	EXPECT_EQ(register_shadow(XSRC_RECV_SHADOW_QP, peer_qp), EOPNOTSUPP);
	xsrc_copy_resp resp;
	EXPECT_EQ(fill(0, 8, 0, resp), EOPNOTSUPP);
	EXPECT_TRUE(target_is_zero());
	dev.abi_revision = XSRC_DRIVER_ABI_REVISION;
}

}  // namespace
}  // namespace xsrc::test
