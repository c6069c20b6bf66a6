// The provider under an allocator that fails: every verb that may allocate
// returns ENOMEM (or NULL with errno ENOMEM) instead of throwing across the
// libibverbs C ABI, posting never allocates at all, and once the allocator
// recovers the same context carries traffic. Real libibverbs, real xsrc0.
//
// The interposer replaces the global operator new/delete of this program;
// the provider, dlopen()ed by libibverbs, binds to them (ENABLE_EXPORTS).
// It fails only on the thread that armed it, so the provider's progress
// thread and gtest's own bookkeeping are not its concern.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "provider_test_util.h"

namespace {

thread_local long alloc_budget = -1;   // allocations left before they fail; -1: never
thread_local unsigned alloc_attempts = 0; // while armed

bool alloc_allowed() noexcept
{
	if (alloc_budget < 0)
		return true;
	++alloc_attempts;
	if (alloc_budget == 0)
		return false;
	--alloc_budget;
	return true;
}

void *alloc_raw(std::size_t n, std::size_t align) noexcept
{
	if (!alloc_allowed())
		return nullptr;
	if (align <= alignof(std::max_align_t))
		return std::malloc(n ? n : 1);
	void *p = nullptr;
	return posix_memalign(&p, align, n ? n : 1) == 0 ? p : nullptr;
}

void *alloc_or_throw(std::size_t n, std::size_t align)
{
	if (void *p = alloc_raw(n, align))
		return p;
	throw std::bad_alloc();
}

// Arms the allocator on this thread: `after` more allocations succeed,
// then every one fails, until destruction.
class FailingAllocator {
public:
	explicit FailingAllocator(long after)
	{
		alloc_attempts = 0;
		alloc_budget = after;
	}
	~FailingAllocator() { alloc_budget = -1; }
	FailingAllocator(const FailingAllocator &) = delete;
	FailingAllocator &operator=(const FailingAllocator &) = delete;
	unsigned attempts() const { return alloc_attempts; }
};

}  // namespace

void *operator new(std::size_t n) { return alloc_or_throw(n, 0); }
void *operator new[](std::size_t n) { return alloc_or_throw(n, 0); }
void *operator new(std::size_t n, std::align_val_t a) { return alloc_or_throw(n, static_cast<std::size_t>(a)); }
void *operator new[](std::size_t n, std::align_val_t a) { return alloc_or_throw(n, static_cast<std::size_t>(a)); }
void *operator new(std::size_t n, const std::nothrow_t &) noexcept { return alloc_raw(n, 0); }
void *operator new[](std::size_t n, const std::nothrow_t &) noexcept { return alloc_raw(n, 0); }
void *operator new(std::size_t n, std::align_val_t a, const std::nothrow_t &) noexcept
{
	return alloc_raw(n, static_cast<std::size_t>(a));
}
void *operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t &) noexcept
{
	return alloc_raw(n, static_cast<std::size_t>(a));
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete[](void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }
void operator delete[](void *p, std::size_t) noexcept { std::free(p); }
void operator delete(void *p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void *p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void *p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void *p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void *p, const std::nothrow_t &) noexcept { std::free(p); }
void operator delete[](void *p, const std::nothrow_t &) noexcept { std::free(p); }
void operator delete(void *p, std::align_val_t, const std::nothrow_t &) noexcept { std::free(p); }
void operator delete[](void *p, std::align_val_t, const std::nothrow_t &) noexcept { std::free(p); }

namespace {

using namespace provider_test;

constexpr size_t kBufBytes = 8192;
constexpr uint32_t kRecvSlot = 1024;  // receive i lands at i * kRecvSlot
constexpr uint32_t kMaxWr = 16;
constexpr uint32_t kMaxInline = 64;
constexpr long kMaxBudget = 24;  // more than any verb here allocates

// One context on xsrc0 with a PD, a CQ and two RC QPs connected to each
// other, each QP with a registered buffer.
class AllocFail : public ::testing::Test {
protected:
	void SetUp() override
	{
		ctx = open_xsrc0();
		ASSERT_NE(ctx, nullptr) << "xsrc0: " << strerror(errno);
		pd = ibv_alloc_pd(ctx);
		ASSERT_NE(pd, nullptr);
		cq = ibv_create_cq(ctx, 4 * kMaxWr, nullptr, nullptr, 0);
		ASSERT_NE(cq, nullptr);
		for (auto &b : bufs) {
			b.assign(kBufBytes, 0);
			ibv_mr *mr = ibv_reg_mr(pd, b.data(), b.size(),
						IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
			ASSERT_NE(mr, nullptr);
			mrs.push_back(mr);
		}
	}
	void TearDown() override { destroy_all(qps, mrs, std::span(&cq, 1), pd, ctx); }

	// Two QPs connected to each other: qps[0] sends, qps[1] receives.
	void connect_pair(bool builder)
	{
		ibv_qp_init_attr base = rc_attr(cq, kMaxWr, kMaxInline);
		ibv_qp_init_attr_ex ex{};
		ex.send_cq = ex.recv_cq = cq;
		ex.qp_type = IBV_QPT_RC;
		ex.cap = base.cap;
		ex.pd = pd;
		ex.comp_mask = IBV_QP_INIT_ATTR_PD;
		if (builder) {
			ex.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
			ex.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
		}
		for (int i = 0; i < 2; ++i) {
			ibv_qp *qp = ibv_create_qp_ex(ctx, &ex);
			ASSERT_NE(qp, nullptr) << strerror(errno);
			qps.push_back(qp);
		}
		ASSERT_EQ(rc_connect(qps[0], qps[1]->qp_num), 0);
		ASSERT_EQ(rc_connect(qps[1], qps[0]->qp_num), 0);
	}

	void post_receives(int n)
	{
		for (int i = 0; i < n; ++i) {
			ibv_sge sge{reinterpret_cast<uintptr_t>(bufs[1].data()) + uint64_t(i) * kRecvSlot, kRecvSlot, mrs[1]->lkey};
			ibv_recv_wr wr{};
			wr.wr_id = 100 + i;
			wr.sg_list = &sge;
			wr.num_sge = 1;
			ibv_recv_wr *bad = nullptr;
			ASSERT_EQ(ibv_post_recv(qps[1], &wr, &bad), 0);
		}
	}

	// Each successful completion, counted by opcode.
	void expect_completions(size_t sends, size_t recvs)
	{
		auto wcs = poll_n(cq, sends + recvs);
		ASSERT_EQ(wcs.size(), sends + recvs);
		size_t s = 0, r = 0;
		for (const ibv_wc &wc : wcs) {
			EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "wr_id " << wc.wr_id << ": "
							     << ibv_wc_status_str(wc.status);
			(wc.opcode == IBV_WC_RECV ? r : s)++;
		}
		EXPECT_EQ(s, sends);
		EXPECT_EQ(r, recvs);
	}

	// A list of four WRs: inline SENDs, a gathered SEND, an RDMA WRITE.
	std::vector<ibv_send_wr> four_wrs(std::vector<ibv_sge> &sges)
	{
		auto base = reinterpret_cast<uintptr_t>(bufs[0].data());
		sges = {{base, 48, mrs[0]->lkey},
			{base + 64, 100, mrs[0]->lkey},
			{base + 200, 28, mrs[0]->lkey},
			{base + 512, 512, mrs[0]->lkey},
			{base + 1024, 60, mrs[0]->lkey}};
		std::vector<ibv_send_wr> wrs(4);
		for (size_t i = 0; i < wrs.size(); ++i) {
			wrs[i].wr_id = i + 1;
			wrs[i].opcode = IBV_WR_SEND;
			wrs[i].send_flags = IBV_SEND_SIGNALED;
			wrs[i].next = i + 1 < wrs.size() ? &wrs[i + 1] : nullptr;
		}
		wrs[0].send_flags |= IBV_SEND_INLINE;
		wrs[0].sg_list = &sges[0];
		wrs[0].num_sge = 1;
		wrs[1].sg_list = &sges[1];  // two pieces gathered
		wrs[1].num_sge = 2;
		wrs[2].opcode = IBV_WR_RDMA_WRITE;
		wrs[2].sg_list = &sges[3];
		wrs[2].num_sge = 1;
		wrs[2].wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(bufs[1].data()) + 6144;
		wrs[2].wr.rdma.rkey = mrs[1]->rkey;
		wrs[3].send_flags |= IBV_SEND_INLINE;
		wrs[3].sg_list = &sges[4];
		wrs[3].num_sge = 1;
		return wrs;
	}

	// Posts `wrs` on qps[0] while every allocation fails; `attempts` counts
	// the allocations tried meanwhile.
	int post_with_no_memory(std::vector<ibv_send_wr> &wrs, unsigned &attempts)
	{
		ibv_send_wr *bad = nullptr;
		FailingAllocator armed(0);
		int ret = ibv_post_send(qps[0], wrs.data(), &bad);
		attempts = armed.attempts();
		return ret;
	}

	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	ibv_cq *cq = nullptr;
	std::vector<unsigned char> bufs[2];
	std::vector<ibv_mr *> mrs;
	std::vector<ibv_qp *> qps;
};

// Runs `make` with 0, 1, 2 ... allocations allowed until it succeeds: each
// failure is NULL with errno ENOMEM. Returns how many failed.
template <typename Make, typename Destroy>
int fail_until_made(Make make, Destroy destroy)
{
	int failures = 0;
	for (long budget = 0; budget <= kMaxBudget; ++budget) {
		void *obj;
		int err;
		{
			FailingAllocator armed(budget);
			errno = 0;
			obj = make();
			err = errno;
		}
		if (obj) {
			destroy(obj);
			return failures;
		}
		EXPECT_EQ(err, ENOMEM) << "with " << budget << " allocations allowed: " << strerror(err);
		++failures;
	}
	ADD_FAILURE() << "never made with " << kMaxBudget << " allocations allowed";
	return failures;
}

TEST_F(AllocFail, OpenDeviceFailsWithEnomem)
{
	int failures = fail_until_made([] { return static_cast<void *>(open_xsrc0()); },
				       [](void *c) { ibv_close_device(static_cast<ibv_context *>(c)); });
	EXPECT_GE(failures, 1);
}

// The provider's own allocations go through the interposer: with none
// allowed, reg_mr fails; with one, recording the MR as ours fails, and the
// MR the device registered is deregistered again.
TEST_F(AllocFail, RegMrFailsWithEnomem)
{
	ibv_context *fresh = open_xsrc0();
	ASSERT_NE(fresh, nullptr);
	ibv_pd *fresh_pd = ibv_alloc_pd(fresh);
	ASSERT_NE(fresh_pd, nullptr);
	std::vector<unsigned char> buf(kBufBytes);
	int failures = fail_until_made(
		[&] {
			return static_cast<void *>(
				ibv_reg_mr(fresh_pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE));
		},
		[](void *mr) { ibv_dereg_mr(static_cast<ibv_mr *>(mr)); });
	EXPECT_GE(failures, 2);
	EXPECT_EQ(ibv_dealloc_pd(fresh_pd), 0) << "an MR of a failed reg_mr is still registered";
	ibv_close_device(fresh);
}

TEST_F(AllocFail, CreateCqFailsWithEnomem)
{
	int failures = fail_until_made(
		[&] { return static_cast<void *>(ibv_create_cq(ctx, 8, nullptr, nullptr, 0)); },
		[](void *c) { ibv_destroy_cq(static_cast<ibv_cq *>(c)); });
	EXPECT_GE(failures, 1);
	ibv_cq_init_attr_ex attr{};
	attr.cqe = 8;
	attr.wc_flags = IBV_WC_STANDARD_FLAGS;
	failures = fail_until_made(
		[&] { return static_cast<void *>(ibv_create_cq_ex(ctx, &attr)); },
		[](void *c) { ibv_destroy_cq(ibv_cq_ex_to_cq(static_cast<ibv_cq_ex *>(c))); });
	EXPECT_GE(failures, 1);
}

// The QP, its send queue, the ibv_wr_* staging (one buffer each), the progress engine.
TEST_F(AllocFail, CreateQpFailsWithEnomem)
{
	ibv_qp_init_attr attr = rc_attr(cq, kMaxWr, kMaxInline);
	int failures = fail_until_made([&] { return static_cast<void *>(ibv_create_qp(pd, &attr)); },
				       [](void *q) { ibv_destroy_qp(static_cast<ibv_qp *>(q)); });
	EXPECT_GE(failures, 3);
	ibv_qp_init_attr_ex ex{};
	ex.send_cq = ex.recv_cq = cq;
	ex.qp_type = IBV_QPT_RC;
	ex.cap = attr.cap;
	ex.pd = pd;
	ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	ex.send_ops_flags = IBV_QP_EX_WITH_SEND;
	failures = fail_until_made([&] { return static_cast<void *>(ibv_create_qp_ex(ctx, &ex)); },
				   [](void *q) { ibv_destroy_qp(static_cast<ibv_qp *>(q)); });
	EXPECT_GE(failures, 3);
}

TEST_F(AllocFail, CreateSrqAndAhFailWithEnomem)
{
	ibv_srq_init_attr sattr{};
	sattr.attr.max_wr = 8;
	sattr.attr.max_sge = 1;
	EXPECT_GE(fail_until_made([&] { return static_cast<void *>(ibv_create_srq(pd, &sattr)); },
				  [](void *s) { ibv_destroy_srq(static_cast<ibv_srq *>(s)); }),
		  1);
	ibv_ah_attr aattr{};
	aattr.is_global = 1;
	aattr.port_num = kPort;
	aattr.grh.sgid_index = kGidIndex;
	aattr.grh.hop_limit = 1;
	ASSERT_EQ(ibv_query_gid(ctx, kPort, kGidIndex, &aattr.grh.dgid), 0);
	EXPECT_GE(fail_until_made([&] { return static_cast<void *>(ibv_create_ah(pd, &aattr)); },
				  [](void *a) { ibv_destroy_ah(static_cast<ibv_ah *>(a)); }),
		  1);
}

// A list of WRs (inline, gathered, RDMA WRITE) posted with no allocation
// allowed: none is attempted, all complete once the allocator is back.
TEST_F(AllocFail, PostSendNeverAllocates)
{
	connect_pair(false);
	post_receives(3);
	std::vector<ibv_sge> sges;
	std::vector<ibv_send_wr> wrs = four_wrs(sges);
	unsigned attempts = 0;
	int ret = post_with_no_memory(wrs, attempts);
	EXPECT_EQ(ret, 0) << strerror(ret);
	EXPECT_EQ(attempts, 0u) << "post_send allocated";
	expect_completions(4, 3);
	EXPECT_EQ(std::memcmp(bufs[1].data(), bufs[0].data(), 48), 0);
}

// SENDs the responder has no receive for wait in the send queue (RNR,
// retried forever) and in the progress thread's schedule: queueing them
// allocates nothing, and they complete when receives are posted.
TEST_F(AllocFail, BlockedSendsQueueWithoutAllocating)
{
	connect_pair(false);
	for (size_t i = 0; i < kBufBytes; ++i)
		bufs[0][i] = static_cast<unsigned char>(i * 7);
	std::vector<ibv_sge> sges;
	std::vector<ibv_send_wr> wrs = four_wrs(sges);
	wrs[2].opcode = IBV_WR_SEND;  // all four need a receive
	unsigned attempts = 0;
	int ret = post_with_no_memory(wrs, attempts);
	EXPECT_EQ(ret, 0) << strerror(ret);
	EXPECT_EQ(attempts, 0u) << "queueing blocked work allocated";
	ibv_wc wc;
	EXPECT_EQ(ibv_poll_cq(cq, 1, &wc), 0) << "a SEND completed without a receive";
	post_receives(4);
	expect_completions(4, 4);
	EXPECT_EQ(std::memcmp(bufs[1].data(), bufs[0].data(), 48), 0);  // the inline one
	EXPECT_EQ(std::memcmp(bufs[1].data() + kRecvSlot + 100, bufs[0].data() + 200, 28), 0);  // gathered
}

// ibv_wr_start ... ibv_wr_complete, inline and gathered, with no
// allocation allowed.
TEST_F(AllocFail, WrApiNeverAllocates)
{
	connect_pair(true);
	post_receives(2);
	ibv_qp_ex *qpx = ibv_qp_to_qp_ex(qps[0]);
	ASSERT_NE(qpx, nullptr);
	char text[] = "inline through ibv_wr_set_inline_data";
	int ret;
	unsigned attempts;
	{
		FailingAllocator armed(0);
		ibv_wr_start(qpx);
		qpx->wr_id = 1;
		qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(qpx);
		ibv_wr_set_inline_data(qpx, text, sizeof(text));
		qpx->wr_id = 2;
		ibv_wr_send(qpx);
		ibv_wr_set_sge(qpx, mrs[0]->lkey, reinterpret_cast<uintptr_t>(bufs[0].data()), 128);
		qpx->wr_id = 3;
		ibv_wr_rdma_write(qpx, mrs[1]->rkey, reinterpret_cast<uintptr_t>(bufs[1].data()) + 6144);
		ibv_wr_set_sge(qpx, mrs[0]->lkey, reinterpret_cast<uintptr_t>(bufs[0].data()), 64);
		ret = ibv_wr_complete(qpx);
		attempts = armed.attempts();
	}
	EXPECT_EQ(ret, 0) << strerror(ret);
	EXPECT_EQ(attempts, 0u) << "the ibv_wr_* builder allocated";
	expect_completions(3, 2);
	EXPECT_STREQ(reinterpret_cast<const char *>(bufs[1].data()), text);
}

// After all the failures above, on a fresh context: the device and the
// provider carry a SEND with its payload intact.
TEST_F(AllocFail, AfterRecoveryASendArrives)
{
	{
		FailingAllocator armed(0);
		EXPECT_EQ(ibv_create_cq(ctx, 8, nullptr, nullptr, 0), nullptr);
	}
	connect_pair(false);
	post_receives(1);
	std::strcpy(reinterpret_cast<char *>(bufs[0].data()), "after the allocator came back");
	ibv_sge sge{reinterpret_cast<uintptr_t>(bufs[0].data()), 200, mrs[0]->lkey};
	ibv_send_wr wr{};
	wr.wr_id = 9;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	ibv_send_wr *bad = nullptr;
	ASSERT_EQ(ibv_post_send(qps[0], &wr, &bad), 0);
	expect_completions(1, 1);
	EXPECT_STREQ(reinterpret_cast<const char *>(bufs[1].data()), "after the allocator came back");
}

}  // namespace
