// xrc_legacy_errors: the documented errors of libibverbs-ext (EINVAL for bad
// arguments and unknown domains, ENOENT for unknown receive QPs and missing
// registrations) and the one-process side of the registration rules, on a
// real device. Also compiles <infiniband/verbs_ext.h> as C++.
#include <infiniband/verbs.h>
#include <infiniband/verbs_ext.h>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/fd.h"

namespace {

std::string device_name()
{
	const char *v = getenv("XSRC_TEST_DEVICE");
	return v && *v ? v : "xsrc0";
}

constexpr uint32_t kTooWide = 0x1000000;      // 25 bits
constexpr uint32_t kNoSuchQpn = 0xfffffe;     // never allocated on a test device

class XrcLegacy : public ::testing::Test {
protected:
	void SetUp() override
	{
		int n = 0;
		ibv_device **list = ibv_get_device_list(&n);
		ASSERT_NE(list, nullptr);
		for (int i = 0; i < n && !ctx_; i++)
			if (device_name() == ibv_get_device_name(list[i]))
				ctx_ = ibv_open_device(list[i]);
		ibv_free_device_list(list);
		ASSERT_NE(ctx_, nullptr) << "cannot open " << device_name();
		pd_ = ibv_alloc_pd(ctx_);
		ASSERT_NE(pd_, nullptr);
		cq_ = ibv_create_cq(ctx_, 16, nullptr, nullptr, 0);
		ASSERT_NE(cq_, nullptr);
		char path[] = "/tmp/xrc_legacy_errors.XXXXXX";
		fd_.reset(mkstemp(path));
		ASSERT_GE(fd_.get(), 0);
		unlink(path);  // the open fd keeps the inode, which names the domain
	}

	void TearDown() override
	{
		fd_.reset();
		if (cq_) {
			EXPECT_EQ(ibv_destroy_cq(cq_), 0);
		}
		if (pd_) {
			EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
		}
		if (ctx_) {
			EXPECT_EQ(ibv_close_device(ctx_), 0);
		}
	}

	ibv_xrc_domain *open_private_domain()
	{
		ibv_xrc_domain *d = ibv_open_xrc_domain(ctx_, -1, O_CREAT);
		EXPECT_NE(d, nullptr) << strerror(errno);
		return d;
	}

	ibv_context *ctx_ = nullptr;
	ibv_pd *pd_ = nullptr;
	ibv_cq *cq_ = nullptr;
	xsrc::unique_fd fd_;
};

// ret == err and errno == err: the int calls' documented convention.
#define EXPECT_ERR(call, err)                    \
	do {                                     \
		errno = 0;                       \
		int ret_ = (call);               \
		EXPECT_EQ(ret_, err) << #call;   \
		EXPECT_EQ(errno, err) << #call;  \
	} while (0)

#define EXPECT_NULL_ERR(call, err)               \
	do {                                     \
		errno = 0;                       \
		EXPECT_EQ((call), nullptr) << #call; \
		EXPECT_EQ(errno, err) << #call;  \
	} while (0)

TEST_F(XrcLegacy, OpenArguments)
{
	EXPECT_NULL_ERR(ibv_open_xrc_domain(nullptr, -1, O_CREAT), EINVAL);
	EXPECT_NULL_ERR(ibv_open_xrc_domain(ctx_, -1, 0), EINVAL);
	EXPECT_NULL_ERR(ibv_open_xrc_domain(ctx_, -1, O_CREAT | O_EXCL), EINVAL);
	// A file with no domain yet, opened without O_CREAT: upstream's EAGAIN.
	EXPECT_NULL_ERR(ibv_open_xrc_domain(ctx_, fd_.get(), 0), EAGAIN);
}

TEST_F(XrcLegacy, SharedFileAndExclusiveCreate)
{
	ibv_xrc_domain *d1 = ibv_open_xrc_domain(ctx_, fd_.get(), O_CREAT);
	ASSERT_NE(d1, nullptr) << strerror(errno);
	EXPECT_EQ(d1->context, ctx_);
	EXPECT_NE(d1->xrcd, nullptr);
	// O_EXCL on a file that has a domain: upstream's EINVAL.
	EXPECT_NULL_ERR(ibv_open_xrc_domain(ctx_, fd_.get(), O_CREAT | O_EXCL), EINVAL);
	ibv_xrc_domain *d2 = ibv_open_xrc_domain(ctx_, fd_.get(), 0);
	ASSERT_NE(d2, nullptr) << strerror(errno);
	EXPECT_NE(d2, d1);
	EXPECT_ERR(ibv_close_xrc_domain(d2), 0);
	EXPECT_ERR(ibv_close_xrc_domain(d1), 0);
}

TEST_F(XrcLegacy, UnknownDomainsAreEinval)
{
	ibv_xrc_domain bogus{ctx_, nullptr};  // looks right, was never opened
	EXPECT_ERR(ibv_close_xrc_domain(nullptr), EINVAL);
	EXPECT_ERR(ibv_close_xrc_domain(&bogus), EINVAL);
	EXPECT_ERR(ibv_reg_xrc_rcv_qp(&bogus, 1), EINVAL);
	EXPECT_ERR(ibv_unreg_xrc_rcv_qp(&bogus, 1), EINVAL);
	ibv_qp_attr attr{};
	EXPECT_ERR(ibv_modify_xrc_rcv_qp(&bogus, 1, &attr, IBV_QP_STATE), EINVAL);
	EXPECT_ERR(ibv_query_xrc_rcv_qp(&bogus, 1, &attr, IBV_QP_STATE, nullptr), EINVAL);
	uint32_t qpn = 0;
	ibv_xrc_qp_init_attr init{};
	init.xrc_domain = &bogus;
	EXPECT_ERR(ibv_create_xrc_rcv_qp(&init, &qpn), EINVAL);
	init.xrc_domain = nullptr;
	EXPECT_ERR(ibv_create_xrc_rcv_qp(&init, &qpn), EINVAL);
	ibv_srq_init_attr srq_attr{};
	srq_attr.attr.max_wr = 4;
	srq_attr.attr.max_sge = 1;
	EXPECT_NULL_ERR(ibv_create_xrc_srq(pd_, &bogus, cq_, &srq_attr), EINVAL);
	EXPECT_NULL_ERR(ibv_create_xrc_srq(pd_, nullptr, cq_, &srq_attr), EINVAL);

	// A closed domain is as unknown as a never-opened one.
	ibv_xrc_domain *d = open_private_domain();
	ASSERT_NE(d, nullptr);
	EXPECT_ERR(ibv_close_xrc_domain(d), 0);
	EXPECT_ERR(ibv_close_xrc_domain(d), EINVAL);
	EXPECT_ERR(ibv_reg_xrc_rcv_qp(d, 1), EINVAL);
}

TEST_F(XrcLegacy, BadArguments)
{
	ibv_xrc_domain *d = open_private_domain();
	ASSERT_NE(d, nullptr);
	ibv_qp_attr attr{};
	ibv_xrc_qp_init_attr init{};
	init.xrc_domain = d;
	EXPECT_ERR(ibv_create_xrc_rcv_qp(nullptr, nullptr), EINVAL);
	EXPECT_ERR(ibv_create_xrc_rcv_qp(&init, nullptr), EINVAL);
	EXPECT_ERR(ibv_reg_xrc_rcv_qp(d, kTooWide), EINVAL);
	EXPECT_ERR(ibv_unreg_xrc_rcv_qp(d, kTooWide), EINVAL);
	EXPECT_ERR(ibv_modify_xrc_rcv_qp(d, kTooWide, &attr, IBV_QP_STATE), EINVAL);
	EXPECT_ERR(ibv_query_xrc_rcv_qp(d, kTooWide, &attr, IBV_QP_STATE, nullptr), EINVAL);
	EXPECT_ERR(ibv_modify_xrc_rcv_qp(d, 1, nullptr, IBV_QP_STATE), EINVAL);
	EXPECT_ERR(ibv_query_xrc_rcv_qp(d, 1, nullptr, IBV_QP_STATE, nullptr), EINVAL);
	ibv_srq_init_attr srq_attr{};
	EXPECT_NULL_ERR(ibv_create_xrc_srq(nullptr, d, cq_, &srq_attr), EINVAL);
	EXPECT_NULL_ERR(ibv_create_xrc_srq(pd_, d, nullptr, &srq_attr), EINVAL);
	EXPECT_NULL_ERR(ibv_create_xrc_srq(pd_, d, cq_, nullptr), EINVAL);
	errno = 0;
	EXPECT_EQ(ibv_xrc_srq_num(nullptr), IBV_XRC_INVALID_SRQ_NUM);
	EXPECT_EQ(errno, EINVAL);
	EXPECT_ERR(ibv_close_xrc_domain(d), 0);
}

TEST_F(XrcLegacy, UnknownReceiveQpIsEnoent)
{
	ibv_xrc_domain *d = open_private_domain();
	ASSERT_NE(d, nullptr);
	ibv_qp_attr attr{};
	attr.qp_state = IBV_QPS_INIT;
	EXPECT_ERR(ibv_reg_xrc_rcv_qp(d, kNoSuchQpn), ENOENT);
	EXPECT_ERR(ibv_unreg_xrc_rcv_qp(d, kNoSuchQpn), ENOENT);
	EXPECT_ERR(ibv_modify_xrc_rcv_qp(d, kNoSuchQpn, &attr, IBV_QP_STATE), ENOENT);
	EXPECT_ERR(ibv_query_xrc_rcv_qp(d, kNoSuchQpn, &attr, IBV_QP_STATE, nullptr), ENOENT);

	// A QP that exists, but is no XRC receive QP of this domain.
	ibv_qp_init_attr rc{};
	rc.send_cq = rc.recv_cq = cq_;
	rc.cap.max_send_wr = rc.cap.max_recv_wr = 1;
	rc.cap.max_send_sge = rc.cap.max_recv_sge = 1;
	rc.qp_type = IBV_QPT_RC;
	ibv_qp *qp = ibv_create_qp(pd_, &rc);
	ASSERT_NE(qp, nullptr) << strerror(errno);
	EXPECT_ERR(ibv_reg_xrc_rcv_qp(d, qp->qp_num), ENOENT);
	EXPECT_ERR(ibv_query_xrc_rcv_qp(d, qp->qp_num, &attr, IBV_QP_STATE, nullptr), ENOENT);
	EXPECT_EQ(ibv_destroy_qp(qp), 0);

	// A receive QP of another domain.
	ibv_xrc_domain *other = open_private_domain();
	ASSERT_NE(other, nullptr);
	ibv_xrc_qp_init_attr init{};
	init.xrc_domain = other;
	uint32_t qpn = 0;
	ASSERT_EQ(ibv_create_xrc_rcv_qp(&init, &qpn), 0) << strerror(errno);
	EXPECT_ERR(ibv_reg_xrc_rcv_qp(d, qpn), ENOENT);
	EXPECT_ERR(ibv_unreg_xrc_rcv_qp(d, qpn), ENOENT);
	EXPECT_ERR(ibv_query_xrc_rcv_qp(d, qpn, &attr, IBV_QP_STATE, nullptr), ENOENT);
	EXPECT_ERR(ibv_close_xrc_domain(other), 0);
	EXPECT_ERR(ibv_close_xrc_domain(d), 0);
}

TEST_F(XrcLegacy, RegistrationLifecycle)
{
	ibv_xrc_domain *d = open_private_domain();
	ASSERT_NE(d, nullptr);
	ibv_xrc_qp_init_attr init{};
	init.xrc_domain = d;
	uint32_t qpn = 0;
	ASSERT_EQ(ibv_create_xrc_rcv_qp(&init, &qpn), 0) << strerror(errno);
	EXPECT_EQ(qpn & ~0xffffffu, 0u);
	EXPECT_ERR(ibv_reg_xrc_rcv_qp(d, qpn), 0);  // creator: already registered

	ibv_qp_attr attr{};
	attr.qp_state = IBV_QPS_INIT;
	attr.port_num = 1;
	EXPECT_ERR(ibv_modify_xrc_rcv_qp(d, qpn, &attr,
					 IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						 IBV_QP_ACCESS_FLAGS),
		   0);
	ibv_xrc_qp_init_attr out{};
	attr = {};
	EXPECT_ERR(ibv_query_xrc_rcv_qp(d, qpn, &attr, IBV_QP_STATE, &out), 0);
	EXPECT_EQ(attr.qp_state, IBV_QPS_INIT);
	EXPECT_EQ(out.qp_type, IBV_QPT_XRC_RECV);
	EXPECT_EQ(out.xrc_domain, d);

	// One registration per process: one unreg ends it, and with it the QP.
	EXPECT_ERR(ibv_unreg_xrc_rcv_qp(d, qpn), 0);
	EXPECT_ERR(ibv_unreg_xrc_rcv_qp(d, qpn), ENOENT);
	EXPECT_ERR(ibv_query_xrc_rcv_qp(d, qpn, &attr, IBV_QP_STATE, nullptr), ENOENT);
	EXPECT_ERR(ibv_reg_xrc_rcv_qp(d, qpn), ENOENT);
	EXPECT_ERR(ibv_close_xrc_domain(d), 0);
}

// Two opens of one file in one process hold separate registrations; closing
// a domain drops the registrations made through it.
TEST_F(XrcLegacy, CloseDropsRegistrations)
{
	ibv_xrc_domain *d1 = ibv_open_xrc_domain(ctx_, fd_.get(), O_CREAT);
	ASSERT_NE(d1, nullptr) << strerror(errno);
	ibv_xrc_domain *d2 = ibv_open_xrc_domain(ctx_, fd_.get(), 0);
	ASSERT_NE(d2, nullptr) << strerror(errno);
	ibv_xrc_qp_init_attr init{};
	init.xrc_domain = d1;
	uint32_t qpn = 0;
	ASSERT_EQ(ibv_create_xrc_rcv_qp(&init, &qpn), 0) << strerror(errno);
	EXPECT_ERR(ibv_reg_xrc_rcv_qp(d2, qpn), 0);

	EXPECT_ERR(ibv_close_xrc_domain(d1), 0);  // drops d1's registration
	ibv_qp_attr attr{};
	EXPECT_ERR(ibv_query_xrc_rcv_qp(d2, qpn, &attr, IBV_QP_STATE, nullptr), 0);
	EXPECT_ERR(ibv_close_xrc_domain(d2), 0);  // the last one: the QP is gone

	ibv_xrc_domain *d3 = ibv_open_xrc_domain(ctx_, fd_.get(), O_CREAT);
	ASSERT_NE(d3, nullptr) << strerror(errno);
	EXPECT_ERR(ibv_query_xrc_rcv_qp(d3, qpn, &attr, IBV_QP_STATE, nullptr), ENOENT);
	EXPECT_ERR(ibv_close_xrc_domain(d3), 0);
}

TEST_F(XrcLegacy, CloseWhileSrqUsesDomainFails)
{
	ibv_xrc_domain *d = open_private_domain();
	ASSERT_NE(d, nullptr);
	ibv_srq_init_attr srq_attr{};
	srq_attr.attr.max_wr = 4;
	srq_attr.attr.max_sge = 1;
	ibv_srq *srq = ibv_create_xrc_srq(pd_, d, cq_, &srq_attr);
	ASSERT_NE(srq, nullptr) << strerror(errno);
	EXPECT_GE(srq_attr.attr.max_wr, 4u);
	uint32_t srqn = ibv_xrc_srq_num(srq);
	EXPECT_NE(srqn, IBV_XRC_INVALID_SRQ_NUM);
	EXPECT_EQ(srqn & ~0xffffffu, 0u);

	errno = 0;
	int ret = ibv_close_xrc_domain(d);
	EXPECT_NE(ret, 0) << "closing a domain an SRQ still uses";
	EXPECT_EQ(errno, ret);
	// Still open and usable.
	ibv_xrc_qp_init_attr init{};
	init.xrc_domain = d;
	uint32_t qpn = 0;
	EXPECT_ERR(ibv_create_xrc_rcv_qp(&init, &qpn), 0);
	EXPECT_EQ(ibv_destroy_srq(srq), 0);
	EXPECT_ERR(ibv_close_xrc_domain(d), 0);
}

TEST_F(XrcLegacy, SendQp)
{
	ibv_xrc_domain *d = open_private_domain();
	ASSERT_NE(d, nullptr);
	ibv_xrc_domain bogus{ctx_, nullptr};
	ibv_xrc_qp_init_attr init{};
	init.send_cq = init.recv_cq = cq_;
	init.cap.max_send_wr = 4;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_wr = 4;  // ignored for an XRC send QP
	init.qp_type = IBV_QPT_XRC;

	EXPECT_NULL_ERR(ibv_create_xrc_qp(nullptr, &init), EINVAL);
	EXPECT_NULL_ERR(ibv_create_xrc_qp(pd_, nullptr), EINVAL);
	init.xrc_domain = &bogus;
	EXPECT_NULL_ERR(ibv_create_xrc_qp(pd_, &init), EINVAL);
	init.qp_type = IBV_QPT_XRC_RECV;
	init.xrc_domain = d;
	EXPECT_NULL_ERR(ibv_create_xrc_qp(pd_, &init), EINVAL);
	init.qp_type = IBV_QPT_XRC;
	init.send_cq = nullptr;
	EXPECT_NULL_ERR(ibv_create_xrc_qp(pd_, &init), EINVAL);
	init.send_cq = cq_;

	ibv_qp *qp = ibv_create_xrc_qp(pd_, &init);
	ASSERT_NE(qp, nullptr) << strerror(errno);
	EXPECT_EQ(qp->qp_type, IBV_QPT_XRC_SEND);
	EXPECT_GE(init.cap.max_send_wr, 4u);

	ibv_send_wr wr{};
	ibv_send_wr *bad = nullptr;
	EXPECT_ERR(ibv_post_xrc_send(qp, &wr, &bad, kTooWide), EINVAL);
	EXPECT_EQ(bad, &wr);
	EXPECT_ERR(ibv_post_xrc_send(nullptr, &wr, &bad, 1), EINVAL);
	EXPECT_EQ(ibv_destroy_qp(qp), 0);

	// Other types pass through to ibv_create_qp().
	init.qp_type = IBV_QPT_RC;
	init.xrc_domain = nullptr;
	qp = ibv_create_xrc_qp(pd_, &init);
	ASSERT_NE(qp, nullptr) << strerror(errno);
	EXPECT_EQ(qp->qp_type, IBV_QPT_RC);
	EXPECT_EQ(ibv_destroy_qp(qp), 0);
	EXPECT_ERR(ibv_close_xrc_domain(d), 0);
}

TEST_F(XrcLegacy, SrcNames)
{
	struct ibv_src_domain *d = ibv_open_src_domain(ctx_, fd_.get(), O_CREAT);
	ASSERT_NE(d, nullptr) << strerror(errno);
	ibv_srq_init_attr srq_attr{};
	srq_attr.attr.max_wr = 4;
	srq_attr.attr.max_sge = 1;
	ibv_srq *srq = ibv_create_src_srq(pd_, d, cq_, &srq_attr);
	ASSERT_NE(srq, nullptr) << strerror(errno);
	EXPECT_NE(ibv_xrc_srq_num(srq), IBV_XRC_INVALID_SRQ_NUM);
	EXPECT_EQ(ibv_destroy_srq(srq), 0);
	EXPECT_ERR(ibv_close_src_domain(d), 0);
	EXPECT_ERR(ibv_close_src_domain(d), EINVAL);
}

}  // namespace
