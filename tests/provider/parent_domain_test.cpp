// Thread domains and parent domains on xsrc0 through real libibverbs: a
// parent domain stands in for its PD everywhere (QPs, SRQs, CQs, MRs, AHs),
// its allocator is called for the send-queue buffers of the QPs made
// through it (and the WQEs really live there), IBV_ALLOCATOR_USE_DEFAULT
// falls back to the provider's own, a failing allocator fails the create
// and leaves nothing behind, and the errors of ibv_alloc_td(3) and
// ibv_alloc_parent_domain(3). Traffic between two processes runs through
// QPs made on parent domains with thread domains and custom allocators.
#include <gtest/gtest.h>

#include <infiniband/verbs.h>
#include <rdma/ib_user_ioctl_verbs.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "harness/child.h"
#include "harness/link.h"
#include "harness/qp_connect.h"
#include "provider_test_util.h"

namespace {

using namespace provider_test;
using xsrc::harness::Child;
using xsrc::harness::Link;
using xsrc::harness::ms;

constexpr uint64_t kResTypeSq = 1, kResTypeSqStaging = 2;  // xsrc's resource types (man xsrc(7))

// An allocator that records every call; `answer` says what alloc returns.
struct Recorder {
	enum class Answer { memory, use_default, fail } answer = Answer::memory;
	struct Call {
		ibv_pd *pd;
		void *pd_context;
		void *ptr;
		size_t size, alignment;
		uint64_t type;
	};
	std::vector<Call> allocs, frees;
	unsigned char fill = 0;  // what new buffers hold (the man page wants zeros; we check the provider does not care)

	static void *alloc(ibv_pd *pd, void *pd_context, size_t size, size_t alignment, uint64_t type)
	{
		auto *r = static_cast<Recorder *>(pd_context);
		void *p = nullptr;
		if (r->answer == Answer::use_default)
			p = IBV_ALLOCATOR_USE_DEFAULT;
		else if (r->answer == Answer::memory && posix_memalign(&p, alignment, size) == 0)
			std::memset(p, r->fill, size);
		r->allocs.push_back({pd, pd_context, p, size, alignment, type});
		return p;
	}
	static void free(ibv_pd *pd, void *pd_context, void *ptr, uint64_t type)
	{
		auto *r = static_cast<Recorder *>(pd_context);
		r->frees.push_back({pd, pd_context, ptr, 0, 0, type});
		std::free(ptr);
	}
};

ibv_parent_domain_init_attr parent_attr(ibv_pd *pd, ibv_td *td, Recorder *rec)
{
	ibv_parent_domain_init_attr a{};
	a.pd = pd;
	a.td = td;
	if (rec) {
		a.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
		a.alloc = Recorder::alloc;
		a.free = Recorder::free;
		a.pd_context = rec;
	}
	return a;
}

ibv_qp *create_rc_qp(ibv_pd *pd, ibv_cq *cq, bool builder, uint32_t max_wr = 8)
{
	ibv_qp_init_attr base = rc_attr(cq, max_wr, 64);
	ibv_qp_init_attr_ex a{};
	a.send_cq = a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap = base.cap;
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	a.pd = pd;
	if (builder) {
		a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	}
	return ibv_create_qp_ex(pd->context, &a);
}

class ParentDomain : public ::testing::Test {
protected:
	void SetUp() override
	{
		ctx = open_xsrc0();
		ASSERT_NE(ctx, nullptr);
		pd = ibv_alloc_pd(ctx);
		ASSERT_NE(pd, nullptr);
		cq = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
		ASSERT_NE(cq, nullptr);
	}
	void TearDown() override
	{
		for (ibv_qp *qp : qps)
			EXPECT_EQ(ibv_destroy_qp(qp), 0);
		if (mr) {
			EXPECT_EQ(ibv_dereg_mr(mr), 0);
		}
		if (cq) {
			EXPECT_EQ(ibv_destroy_cq(cq), 0);
		}
		if (parent) {
			EXPECT_EQ(ibv_dealloc_pd(parent), 0);
		}
		if (td) {
			EXPECT_EQ(ibv_dealloc_td(td), 0);
		}
		if (pd) {
			EXPECT_EQ(ibv_dealloc_pd(pd), 0) << "the device still counts an object on the PD";
		}
		if (ctx)
			ibv_close_device(ctx);
	}

	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	ibv_cq *cq = nullptr;
	ibv_td *td = nullptr;
	ibv_pd *parent = nullptr;
	ibv_mr *mr = nullptr;
	std::vector<ibv_qp *> qps;
	Recorder rec;  // outlives what TearDown destroys
};

TEST_F(ParentDomain, ThreadDomainRefusesUnknownCompMaskAndIsBusyWhileHeld)
{
	ibv_td_init_attr bad{.comp_mask = 1};
	errno = 0;
	EXPECT_EQ(ibv_alloc_td(ctx, &bad), nullptr);
	EXPECT_EQ(errno, EINVAL);

	ibv_td_init_attr ta{};
	td = ibv_alloc_td(ctx, &ta);
	ASSERT_NE(td, nullptr);
	EXPECT_EQ(td->context, ctx);
	ibv_parent_domain_init_attr a = parent_attr(pd, td, nullptr);
	parent = ibv_alloc_parent_domain(ctx, &a);
	ASSERT_NE(parent, nullptr);
	EXPECT_EQ(ibv_dealloc_td(td), EBUSY);
	EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY) << "a parent domain still uses the PD";
	ASSERT_EQ(ibv_dealloc_pd(parent), 0);
	parent = nullptr;
	EXPECT_EQ(ibv_dealloc_td(td), 0);
	td = nullptr;
}

TEST_F(ParentDomain, AllocRefusesWhatTheManPageForbids)
{
	ibv_parent_domain_init_attr a = parent_attr(nullptr, nullptr, nullptr);
	errno = 0;
	EXPECT_EQ(ibv_alloc_parent_domain(ctx, &a), nullptr) << "no PD";
	EXPECT_EQ(errno, EINVAL);

	a = parent_attr(pd, nullptr, nullptr);
	a.comp_mask = 1u << 7;
	errno = 0;
	EXPECT_EQ(ibv_alloc_parent_domain(ctx, &a), nullptr) << "unknown comp_mask bit";
	EXPECT_EQ(errno, EINVAL);

	a = parent_attr(pd, nullptr, &rec);
	a.free = nullptr;
	errno = 0;
	EXPECT_EQ(ibv_alloc_parent_domain(ctx, &a), nullptr) << "ALLOCATORS without free";
	EXPECT_EQ(errno, EINVAL);

	// Objects of another context.
	ibv_context *other = open_xsrc0();
	ASSERT_NE(other, nullptr);
	ibv_td_init_attr ta{};
	ibv_td *other_td = ibv_alloc_td(other, &ta);
	ibv_pd *other_pd = ibv_alloc_pd(other);
	ASSERT_TRUE(other_td && other_pd);
	a = parent_attr(pd, other_td, nullptr);
	errno = 0;
	EXPECT_EQ(ibv_alloc_parent_domain(ctx, &a), nullptr) << "a TD of another context";
	EXPECT_EQ(errno, EINVAL);
	a = parent_attr(other_pd, nullptr, nullptr);
	errno = 0;
	EXPECT_EQ(ibv_alloc_parent_domain(ctx, &a), nullptr) << "a PD of another context";
	EXPECT_EQ(errno, EINVAL);
	EXPECT_EQ(ibv_dealloc_td(other_td), 0) << "refusals took no reference";
	EXPECT_EQ(ibv_dealloc_pd(other_pd), 0);
	ibv_close_device(other);

	// A parent domain over a parent domain.
	a = parent_attr(pd, nullptr, nullptr);
	parent = ibv_alloc_parent_domain(ctx, &a);
	ASSERT_NE(parent, nullptr);
	EXPECT_EQ(parent->context, ctx);
	EXPECT_EQ(parent->handle, pd->handle);
	ibv_parent_domain_init_attr nested = parent_attr(parent, nullptr, nullptr);
	errno = 0;
	EXPECT_EQ(ibv_alloc_parent_domain(ctx, &nested), nullptr);
	EXPECT_EQ(errno, EINVAL);
}

TEST_F(ParentDomain, AllocatorGetsEachSendQueueBufferAndFreesItOnDestroy)
{
	ibv_parent_domain_init_attr a = parent_attr(pd, nullptr, &rec);
	parent = ibv_alloc_parent_domain(ctx, &a);
	ASSERT_NE(parent, nullptr);

	ibv_qp *qp = create_rc_qp(parent, cq, true);
	ASSERT_NE(qp, nullptr) << strerror(errno);
	EXPECT_EQ(qp->pd, parent);
	ASSERT_EQ(rec.allocs.size(), 2u) << "the send queue and the ibv_wr_* staging";
	std::vector<uint64_t> types;
	for (const auto &c : rec.allocs) {
		EXPECT_EQ(c.pd, parent);
		EXPECT_EQ(c.pd_context, &rec);
		EXPECT_NE(c.ptr, nullptr);
		EXPECT_GT(c.size, 8 * 64u) << "room for 8 WQEs with 64 inline bytes each";
		EXPECT_GE(c.alignment, sizeof(void *));
		EXPECT_EQ(c.alignment & (c.alignment - 1), 0u) << "a power of two";
		EXPECT_EQ(c.type >> 32, uint64_t(RDMA_DRIVER_UNKNOWN));
		types.push_back(c.type);
	}
	std::sort(types.begin(), types.end());
	EXPECT_EQ(types, (std::vector<uint64_t>{kResTypeSq, kResTypeSqStaging}));
	EXPECT_TRUE(rec.frees.empty());

	EXPECT_EQ(ibv_dealloc_pd(parent), EBUSY) << "a QP made through it holds it";
	ASSERT_EQ(ibv_destroy_qp(qp), 0);
	ASSERT_EQ(rec.frees.size(), 2u);
	for (const auto &f : rec.frees) {
		auto it = std::find_if(rec.allocs.begin(), rec.allocs.end(),
				       [&](const Recorder::Call &c) { return c.ptr == f.ptr; });
		ASSERT_NE(it, rec.allocs.end()) << "freed what was allocated";
		EXPECT_EQ(f.type, it->type);
		EXPECT_EQ(f.pd, parent);
		EXPECT_EQ(f.pd_context, &rec);
	}
	// A QP on the plain PD does not call it.
	ibv_qp *plain = create_rc_qp(pd, cq, true);
	ASSERT_NE(plain, nullptr);
	qps.push_back(plain);
	EXPECT_EQ(rec.allocs.size(), 2u);
}

TEST_F(ParentDomain, WorkRequestsAreBuiltInTheAllocatorsMemory)
{
	rec.fill = 0xa5;  // not zeros: the provider initialises what it uses
	ibv_parent_domain_init_attr a = parent_attr(pd, nullptr, &rec);
	parent = ibv_alloc_parent_domain(ctx, &a);
	ASSERT_NE(parent, nullptr);
	ibv_qp *sender = create_rc_qp(parent, cq, false);
	ibv_qp *receiver = create_rc_qp(pd, cq, false);
	ASSERT_TRUE(sender && receiver);
	qps = {sender, receiver};
	ASSERT_EQ(rec.allocs.size(), 1u);
	ASSERT_EQ(rc_connect(sender, receiver->qp_num), 0);
	ASSERT_EQ(rc_connect(receiver, sender->qp_num), 0);

	static char buf[2][64];
	mr = ibv_reg_mr(parent, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);  // through the parent domain
	ASSERT_NE(mr, nullptr) << strerror(errno);
	EXPECT_EQ(mr->pd, parent);
	ibv_sge rsge{reinterpret_cast<uintptr_t>(buf[1]), 64, mr->lkey};
	ibv_recv_wr rwr{.wr_id = 1, .next = nullptr, .sg_list = &rsge, .num_sge = 1}, *bad_r;
	ASSERT_EQ(ibv_post_recv(receiver, &rwr, &bad_r), 0);
	std::strcpy(buf[0], "through a parent domain");
	ibv_sge sge{reinterpret_cast<uintptr_t>(buf[0]), 64, mr->lkey};
	constexpr uint64_t kWrId = 0x5eedf00dcafe1234;
	ibv_send_wr wr{};
	wr.wr_id = kWrId;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	ibv_send_wr *bad;
	ASSERT_EQ(ibv_post_send(sender, &wr, &bad), 0);
	auto wcs = poll_n(cq, 2);
	ASSERT_EQ(wcs.size(), 2u);
	for (const ibv_wc &wc : wcs)
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
	EXPECT_STREQ(buf[1], "through a parent domain");

	// The WQE was built in the allocator's buffer: its wr_id is there.
	const auto *p = static_cast<const unsigned char *>(rec.allocs[0].ptr);
	const auto *end = p + rec.allocs[0].size;
	bool found = false;
	for (const unsigned char *q = p; q + sizeof(kWrId) <= end && !found; q += sizeof(uint64_t))
		found = std::memcmp(q, &kWrId, sizeof(kWrId)) == 0;
	EXPECT_TRUE(found) << "the posted WQE is not in the parent domain's buffer";
}

TEST_F(ParentDomain, UseDefaultFallsBackAndIsNeverFreedThroughTheCallback)
{
	rec.answer = Recorder::Answer::use_default;
	ibv_parent_domain_init_attr a = parent_attr(pd, nullptr, &rec);
	parent = ibv_alloc_parent_domain(ctx, &a);
	ASSERT_NE(parent, nullptr);
	ibv_qp *qp = create_rc_qp(parent, cq, true);
	ASSERT_NE(qp, nullptr) << strerror(errno);
	EXPECT_EQ(rec.allocs.size(), 2u);
	ASSERT_EQ(ibv_destroy_qp(qp), 0);
	EXPECT_TRUE(rec.frees.empty());
}

TEST_F(ParentDomain, FailingAllocatorFailsTheCreateAndLeavesNothing)
{
	rec.answer = Recorder::Answer::fail;
	ibv_parent_domain_init_attr a = parent_attr(pd, nullptr, &rec);
	parent = ibv_alloc_parent_domain(ctx, &a);
	ASSERT_NE(parent, nullptr);
	errno = 0;
	EXPECT_EQ(create_rc_qp(parent, cq, false), nullptr);
	EXPECT_EQ(errno, ENOMEM);
	EXPECT_EQ(rec.allocs.size(), 1u);
	EXPECT_TRUE(rec.frees.empty()) << "nothing was allocated";
	// The parent domain holds no QP and the device none on the PD (TearDown
	// deallocates both); and the allocator, recovered, serves the next one.
	rec.answer = Recorder::Answer::memory;
	ibv_qp *qp = create_rc_qp(parent, cq, false);
	ASSERT_NE(qp, nullptr);
	qps.push_back(qp);
}

TEST_F(ParentDomain, CqExAndSrqThroughAParentDomainWithAThreadDomain)
{
	ibv_td_init_attr ta{};
	td = ibv_alloc_td(ctx, &ta);
	ASSERT_NE(td, nullptr);
	ibv_parent_domain_init_attr a = parent_attr(pd, td, nullptr);
	parent = ibv_alloc_parent_domain(ctx, &a);
	ASSERT_NE(parent, nullptr);

	ibv_cq_init_attr_ex ca{};
	ca.cqe = 16;
	ca.wc_flags = IBV_WC_STANDARD_FLAGS;
	ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
	ca.parent_domain = pd;
	errno = 0;
	EXPECT_EQ(ibv_create_cq_ex(ctx, &ca), nullptr) << "IBV_CQ_INIT_ATTR_MASK_PD with a plain PD";
	EXPECT_EQ(errno, EINVAL);
	ca.parent_domain = parent;
	ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &ca);
	ASSERT_NE(cqx, nullptr) << strerror(errno);

	ibv_srq_init_attr sa{};
	sa.attr.max_wr = 16;
	sa.attr.max_sge = 1;
	ibv_srq *srq = ibv_create_srq(parent, &sa);
	ASSERT_NE(srq, nullptr) << strerror(errno);
	EXPECT_EQ(srq->pd, parent);

	// An RC QP on the parent domain with the SRQ and the extended CQ; a
	// plain QP sends to it.
	ibv_qp_init_attr_ex qa{};
	qa.send_cq = qa.recv_cq = ibv_cq_ex_to_cq(cqx);
	qa.srq = srq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 4;
	qa.cap.max_send_sge = 1;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD;
	qa.pd = parent;
	ibv_qp *receiver = ibv_create_qp_ex(ctx, &qa);
	ibv_qp *sender = create_rc_qp(pd, cq, false);
	ASSERT_TRUE(receiver && sender) << strerror(errno);
	qps = {sender, receiver};
	ASSERT_EQ(rc_connect(sender, receiver->qp_num), 0);
	ASSERT_EQ(rc_connect(receiver, sender->qp_num), 0);
	static char buf[2][32];
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(mr, nullptr);
	ibv_sge rsge{reinterpret_cast<uintptr_t>(buf[1]), 32, mr->lkey};
	ibv_recv_wr rwr{.wr_id = 7, .next = nullptr, .sg_list = &rsge, .num_sge = 1}, *bad_r;
	ASSERT_EQ(ibv_post_srq_recv(srq, &rwr, &bad_r), 0);
	std::strcpy(buf[0], "to an SRQ");
	ibv_sge sge{reinterpret_cast<uintptr_t>(buf[0]), 32, mr->lkey};
	ibv_send_wr wr{};
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	ibv_send_wr *bad;
	ASSERT_EQ(ibv_post_send(sender, &wr, &bad), 0);
	ibv_poll_cq_attr pa{};
	int ret = ENOENT;
	for (int i = 0; i < 100000 && ret == ENOENT; ++i)
		ret = ibv_start_poll(cqx, &pa);
	ASSERT_EQ(ret, 0);
	EXPECT_EQ(cqx->status, IBV_WC_SUCCESS);
	EXPECT_EQ(cqx->wr_id, 7u);
	ibv_end_poll(cqx);
	EXPECT_STREQ(buf[1], "to an SRQ");

	EXPECT_EQ(ibv_dealloc_pd(parent), EBUSY);
	ASSERT_EQ(ibv_destroy_qp(receiver), 0);
	qps = {sender};
	EXPECT_EQ(ibv_dealloc_pd(parent), EBUSY) << "the SRQ and the CQ hold it";
	ASSERT_EQ(ibv_destroy_srq(srq), 0);
	EXPECT_EQ(ibv_dealloc_pd(parent), EBUSY) << "the CQ holds it";
	ASSERT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), 0);
}

// --- two processes ---------------------------------------------------------

constexpr int kMessages = 200;
constexpr size_t kMsgBytes = 256;
constexpr ms kTimeout{10000};

// One side: a QP made on a parent domain with a thread domain and a custom
// allocator. Sends kMessages numbered messages and receives as many.
struct Side {
	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr, *parent = nullptr;
	ibv_td *td = nullptr;
	ibv_cq *cq = nullptr;
	ibv_qp *qp = nullptr;
	ibv_mr *mr = nullptr;
	Recorder rec;
	std::vector<char> buf = std::vector<char>(2 * kMessages * kMsgBytes);

	// 0, or the line that failed.
	int open()
	{
		ctx = open_xsrc0();
		if (!ctx || !(pd = ibv_alloc_pd(ctx)))
			return __LINE__;
		ibv_td_init_attr ta{};
		if (!(td = ibv_alloc_td(ctx, &ta)))
			return __LINE__;
		ibv_parent_domain_init_attr a = parent_attr(pd, td, &rec);
		if (!(parent = ibv_alloc_parent_domain(ctx, &a)))
			return __LINE__;
		if (!(cq = ibv_create_cq(ctx, 4 * kMessages, nullptr, nullptr, 0)))
			return __LINE__;
		ibv_qp_init_attr qa = rc_attr(cq, kMessages, 0);
		qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
		if (!(qp = ibv_create_qp(parent, &qa)) || rec.allocs.size() != 1)
			return __LINE__;
		if (!(mr = ibv_reg_mr(parent, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE)))
			return __LINE__;
		return 0;
	}
	// To RTS, every receive posted.
	int connect(uint32_t remote_qpn)
	{
		xsrc::harness::QpRemote remote{remote_qpn, {}};
		if (ibv_query_gid(ctx, kPort, kGidIndex, &remote.gid))
			return __LINE__;
		if (xsrc::harness::qp_connect(qp, remote))
			return __LINE__;
		for (int i = 0; i < kMessages; ++i) {
			ibv_sge s{reinterpret_cast<uintptr_t>(&buf[(kMessages + i) * kMsgBytes]), kMsgBytes, mr->lkey};
			ibv_recv_wr r{.wr_id = uint64_t(i), .next = nullptr, .sg_list = &s, .num_sge = 1}, *bad;
			if (ibv_post_recv(qp, &r, &bad))
				return __LINE__;
		}
		return 0;
	}
	// Sends, then checks every receive; 0 or the line that failed.
	int exchange(char tag)
	{
		for (int i = 0; i < kMessages; ++i) {
			char *m = &buf[i * kMsgBytes];
			std::memset(m, tag, kMsgBytes);
			std::memcpy(m, &i, sizeof(i));
			ibv_sge s{reinterpret_cast<uintptr_t>(m), kMsgBytes, mr->lkey};
			ibv_send_wr w{};
			w.wr_id = uint64_t(i);
			w.sg_list = &s;
			w.num_sge = 1;
			w.opcode = IBV_WR_SEND;
			w.send_flags = IBV_SEND_SIGNALED;
			ibv_send_wr *bad;
			if (ibv_post_send(qp, &w, &bad))
				return __LINE__;
		}
		auto wcs = poll_n(cq, 2 * kMessages);
		if (wcs.size() != 2 * kMessages)
			return __LINE__;
		char peer_tag = tag == 'p' ? 'c' : 'p';
		for (const ibv_wc &wc : wcs) {
			if (wc.status != IBV_WC_SUCCESS)
				return __LINE__;
			if (wc.opcode != IBV_WC_RECV)
				continue;
			const char *m = &buf[(kMessages + wc.wr_id) * kMsgBytes];
			int n;
			std::memcpy(&n, m, sizeof(n));
			if (uint64_t(n) != wc.wr_id || wc.byte_len != kMsgBytes || m[kMsgBytes - 1] != peer_tag)
				return __LINE__;
		}
		return 0;
	}
	// Destroys everything; 0, or the line that failed (the free callback must have run).
	int close()
	{
		if (ibv_destroy_qp(qp) || rec.frees.size() != 1 || rec.frees[0].ptr != rec.allocs[0].ptr)
			return __LINE__;
		if (ibv_dereg_mr(mr) || ibv_destroy_cq(cq) || ibv_dealloc_pd(parent) || ibv_dealloc_td(td) ||
		    ibv_dealloc_pd(pd))
			return __LINE__;
		ibv_close_device(ctx);
		return 0;
	}
};

TEST(ParentDomainTraffic, TwoProcessesEachThroughAParentDomainWithAThreadDomain)
{
	Child child = Child::run([](Link &link) {
		Side s;
		if (int line = s.open())
			return line % 250 + 1;
		uint32_t peer = 0;
		if (!link.send_value(s.qp->qp_num) || !link.recv_value(&peer, kTimeout))
			return 2;
		if (int line = s.connect(peer))
			return line % 250 + 1;
		if (!link.send_value(1))
			return 3;
		int go;
		if (!link.recv_value(&go, kTimeout))
			return 4;
		if (int line = s.exchange('c'))
			return line % 250 + 1;
		return s.close() ? 5 : 0;
	});
	Side s;
	ASSERT_EQ(s.open(), 0);
	uint32_t peer = 0;
	ASSERT_TRUE(child.link().recv_value(&peer, kTimeout));
	ASSERT_TRUE(child.link().send_value(s.qp->qp_num));
	ASSERT_EQ(s.connect(peer), 0);
	int ready;
	ASSERT_TRUE(child.link().recv_value(&ready, kTimeout));
	ASSERT_TRUE(child.link().send_value(1));
	EXPECT_EQ(s.exchange('p'), 0);
	auto status = child.wait(kTimeout);
	ASSERT_TRUE(status.has_value());
	EXPECT_EQ(xsrc::harness::exit_code(*status), 0);
	EXPECT_EQ(s.close(), 0);
}

}  // namespace
