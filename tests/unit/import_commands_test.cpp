// Import (driver ABI r6): XSRC_CMD_IMPORT_CONTEXT, XSRC_CMD_QUERY_OBJECT and
// the one uverbs ioctl served (ASYNC_EVENT_ALLOC), driven in-process as the
// other command tests are (command_fixture.h).
#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/rdma_user_ioctl_cmds.h>

#include <array>

#include "command_fixture.h"

namespace xsrc {
namespace {

using test::Pipe;

class ImportTest : public test::CommandFixture {
protected:
	int import_context(const Pipe &p, xsrc_get_context_resp &resp, size_t room = sizeof(xsrc_get_context_resp))
	{
		xsrc_import_context cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.async_fds = p.pair();
		return run(XSRC_CMD_IMPORT_CONTEXT, cmd, {}, room);
	}

	int query(uint32_t type, uint32_t handle, xsrc_query_object_resp &resp)
	{
		xsrc_query_object cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.type = type;
		cmd.handle = handle;
		return run(XSRC_CMD_QUERY_OBJECT, cmd, {}, sizeof(resp));
	}

	// An RDMA_VERBS_IOCTL as libibverbs lays it out: the header, then the
	// attributes, in our memory (the caller's).
	struct Ioctl {
		alignas(8) std::array<std::byte, sizeof(ib_uverbs_ioctl_hdr) + 4 * sizeof(ib_uverbs_attr)> bytes{};
		ib_uverbs_ioctl_hdr &hdr() { return *reinterpret_cast<ib_uverbs_ioctl_hdr *>(bytes.data()); }
		ib_uverbs_attr *attrs() { return reinterpret_cast<ib_uverbs_attr *>(bytes.data() + sizeof(ib_uverbs_ioctl_hdr)); }
		std::span<const std::byte> header() const { return std::span(bytes).first(sizeof(ib_uverbs_ioctl_hdr)); }
	};
	static Ioctl async_alloc()
	{
		Ioctl io;
		io.hdr().length = sizeof(ib_uverbs_ioctl_hdr) + sizeof(ib_uverbs_attr);
		io.hdr().object_id = UVERBS_OBJECT_ASYNC_EVENT;
		io.hdr().method_id = UVERBS_METHOD_ASYNC_EVENT_ALLOC;
		io.hdr().num_attrs = 1;
		io.attrs()[0].attr_id = UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE;
		return io;
	}
	int ioctl(Ioctl &io)
	{
		return dispatch_ioctl(ctx, *ctx.caller, io.header(), reinterpret_cast<uintptr_t>(io.bytes.data()));
	}
};

TEST_F(ImportTest, ImportContextAnswersAsGetContextAndNeedsOne)
{
	Pipe p;
	xsrc_get_context_resp resp{};
	EXPECT_EQ(import_context(p, resp), EINVAL);  // nothing to import yet
	init_context();
	EXPECT_EQ(import_context(p, resp, sizeof(resp) - 8), ENOSPC);
	ASSERT_EQ(import_context(p, resp), 0);
	EXPECT_EQ(resp.context_id, ctx.id);
	EXPECT_EQ(resp.driver_abi, uint32_t(XSRC_DRIVER_ABI_REVISION));
	EXPECT_EQ(resp.caller_pid, uint32_t(getpid()));
	EXPECT_EQ(resp.channel_pool_free, 2u);  // the context's pool, untouched

	xsrc_import_context cmd{};
	cmd.response = reinterpret_cast<uintptr_t>(&resp);
	cmd.async_fds = {uint32_t(p.wr), uint32_t(p.rd)};  // swapped ends
	EXPECT_EQ(run(XSRC_CMD_IMPORT_CONTEXT, cmd, {}, sizeof(resp)), EINVAL);
	cmd.async_fds = p.pair();
	cmd.reserved = 1;
	EXPECT_EQ(run(XSRC_CMD_IMPORT_CONTEXT, cmd, {}, sizeof(resp)), EINVAL);
	cmd.reserved = 0;
	cmd.comp_mask = 1;
	EXPECT_EQ(run(XSRC_CMD_IMPORT_CONTEXT, cmd, {}, sizeof(resp)), EOPNOTSUPP);
}

TEST_F(ImportTest, QueryObjectNamesPdsAndMrsOfTheContextOnly)
{
	init_context();
	uint32_t pd_id = 0;
	uint32_t pd = alloc_pd(&pd_id);
	std::vector<char> buf(8192);
	ib_uverbs_reg_mr_resp mr{};
	ASSERT_EQ(reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, mr), 0);

	xsrc_query_object_resp resp{};
	ASSERT_EQ(query(XSRC_OBJECT_PD, pd, resp), 0);
	EXPECT_EQ(resp.pd_handle, pd);
	EXPECT_EQ(resp.pd_id, pd_id);
	ASSERT_EQ(query(XSRC_OBJECT_MR, mr.mr_handle, resp), 0);
	EXPECT_EQ(resp.pd_handle, pd);
	EXPECT_EQ(resp.lkey, mr.lkey);
	EXPECT_EQ(resp.rkey, mr.rkey);
	EXPECT_EQ(resp.addr, reinterpret_cast<uintptr_t>(buf.data()));
	EXPECT_EQ(resp.iova, reinterpret_cast<uintptr_t>(buf.data()));
	EXPECT_EQ(resp.length, buf.size());
	EXPECT_EQ(resp.access, uint32_t(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));

	EXPECT_EQ(query(XSRC_OBJECT_PD, mr.mr_handle, resp), EINVAL);  // an MR is no PD
	EXPECT_EQ(query(XSRC_OBJECT_MR, pd, resp), EINVAL);            // and the other way round
	EXPECT_EQ(query(XSRC_OBJECT_MR, 9999, resp), EINVAL);
	EXPECT_EQ(query(7, pd, resp), EINVAL);                          // no such type
	xsrc_query_object cmd{};
	cmd.response = reinterpret_cast<uintptr_t>(&resp);
	cmd.type = XSRC_OBJECT_PD;
	cmd.handle = pd;
	EXPECT_EQ(run(XSRC_CMD_QUERY_OBJECT, cmd, {}, sizeof(resp) - 8), ENOSPC);
}

TEST_F(ImportTest, AsyncEventAllocHandsOutTheImportedPipeOnce)
{
	init_context();
	Ioctl io = async_alloc();
	EXPECT_EQ(ioctl(io), ENOTTY);  // no IMPORT_CONTEXT: no ioctl at all
	Pipe p;
	xsrc_get_context_resp resp{};
	ASSERT_EQ(import_context(p, resp), 0);
	ASSERT_EQ(ioctl(io), 0);
	EXPECT_EQ(io.attrs()[0].data, uint64_t(p.rd));  // where the kernel writes a new fd's number
	io = async_alloc();
	EXPECT_EQ(ioctl(io), EMFILE);  // handed out already
}

TEST_F(ImportTest, MalformedIoctlsGetEinvalAndOtherMethodsEnotty)
{
	init_context();
	Pipe p;
	xsrc_get_context_resp resp{};
	ASSERT_EQ(import_context(p, resp), 0);
	Ioctl io = async_alloc();
	io.hdr().length += 1;
	EXPECT_EQ(ioctl(io), EINVAL);  // the length does not match the attributes
	io = async_alloc();
	io.hdr().num_attrs = 4096;
	io.hdr().length = uint16_t(sizeof(ib_uverbs_ioctl_hdr) + 4096 * sizeof(ib_uverbs_attr));
	EXPECT_EQ(ioctl(io), EINVAL);
	io = async_alloc();
	io.hdr().reserved1 = 1;
	EXPECT_EQ(ioctl(io), EINVAL);
	io = async_alloc();
	io.attrs()[0].attr_id = 5;
	EXPECT_EQ(ioctl(io), EINVAL);
	io = async_alloc();
	io.attrs()[0].flags = UVERBS_ATTR_F_VALID_OUTPUT;
	EXPECT_EQ(ioctl(io), EINVAL);
	io = async_alloc();
	io.hdr().num_attrs = 2;
	io.hdr().length += sizeof(ib_uverbs_attr);
	EXPECT_EQ(ioctl(io), EINVAL);
	// Once imported, a method not served is EPROTONOSUPPORT: libibverbs
	// falls back to the write ABI for it alone.
	io = async_alloc();
	io.hdr().object_id = UVERBS_OBJECT_PD;
	io.hdr().method_id = UVERBS_METHOD_PD_DESTROY;
	EXPECT_EQ(ioctl(io), EPROTONOSUPPORT);
	// A header of another size is no RDMA_VERBS_IOCTL.
	EXPECT_EQ(dispatch_ioctl(ctx, *ctx.caller, io.header().first(16), reinterpret_cast<uintptr_t>(io.bytes.data())),
		  ENOTTY);
	// None of these took the pipe.
	io = async_alloc();
	ASSERT_EQ(ioctl(io), 0);
	EXPECT_EQ(io.attrs()[0].data, uint64_t(p.rd));
}

TEST_F(ImportTest, ContextsNeverImportedGetEnottyForEverything)
{
	init_context();
	Ioctl zeroes;  // what tests/device's command_file sends: ENOTTY, not EINVAL
	EXPECT_EQ(ioctl(zeroes), ENOTTY);
	// What libibverbs' probe at open gets: ENOTTY, the write ABI for all.
	for (auto [object, method] : {std::pair<uint16_t, uint16_t>{UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_CONTEXT},
				      std::pair<uint16_t, uint16_t>{UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_CREATE},
				      std::pair<uint16_t, uint16_t>{UVERBS_OBJECT_QP, UVERBS_METHOD_QP_CREATE}}) {
		Ioctl io = async_alloc();
		io.hdr().object_id = object;
		io.hdr().method_id = method;
		EXPECT_EQ(ioctl(io), ENOTTY) << object << " " << method;
	}
}

// CQ_CREATE and QP_CREATE by ioctl, as libibverbs sends them for an
// imported context: the write ABI's handlers run on the attributes.
class ImportedCreateTest : public ImportTest {
protected:
	void SetUp() override
	{
		ImportTest::SetUp();
		init_context();
		xsrc_get_context_resp resp{};
		ASSERT_EQ(import_context(pipe_, resp), 0);
	}
	// Attributes as libibverbs fills them: mandatory, integers inline.
	struct Call {
		alignas(8) std::array<std::byte, sizeof(ib_uverbs_ioctl_hdr) + 20 * sizeof(ib_uverbs_attr)> bytes{};
		unsigned n = 0;
		Call(uint16_t object, uint16_t method)
		{
			hdr().object_id = object;
			hdr().method_id = method;
		}
		ib_uverbs_ioctl_hdr &hdr() { return *reinterpret_cast<ib_uverbs_ioctl_hdr *>(bytes.data()); }
		ib_uverbs_attr &at(unsigned i)
		{
			return reinterpret_cast<ib_uverbs_attr *>(bytes.data() + sizeof(ib_uverbs_ioctl_hdr))[i];
		}
		ib_uverbs_attr &add(uint16_t id, uint64_t data, uint16_t len = 0)
		{
			ib_uverbs_attr &a = at(n++);
			a = {};
			a.attr_id = id;
			a.flags = UVERBS_ATTR_F_MANDATORY;
			a.len = len;
			a.data = data;
			hdr().num_attrs = uint16_t(n);
			hdr().length = uint16_t(sizeof(ib_uverbs_ioctl_hdr) + n * sizeof(ib_uverbs_attr));
			return a;
		}
		ib_uverbs_attr *find(uint16_t id)
		{
			for (unsigned i = 0; i < n; ++i)
				if (at(i).attr_id == id)
					return &at(i);
			return nullptr;
		}
	};
	int ioctl(Call &c)
	{
		return dispatch_ioctl(ctx, *ctx.caller, std::span(c.bytes).first(sizeof(ib_uverbs_ioctl_hdr)),
				      reinterpret_cast<uintptr_t>(c.bytes.data()));
	}
	static uint64_t ptr(const void *p) { return reinterpret_cast<uintptr_t>(p); }

	Call cq_call(uint32_t &cqe_out, xsrc_create_cq_resp &drv_out)
	{
		Call c(UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_CREATE);
		c.add(UVERBS_ATTR_CREATE_CQ_HANDLE, 0);
		c.add(UVERBS_ATTR_CREATE_CQ_RESP_CQE, ptr(&cqe_out), sizeof(cqe_out));
		c.add(UVERBS_ATTR_CREATE_CQ_CQE, 16, 4);
		c.add(UVERBS_ATTR_CREATE_CQ_USER_HANDLE, 0xc0ffee, 8);
		c.add(UVERBS_ATTR_CREATE_CQ_COMP_VECTOR, 0, 4);
		c.add(UVERBS_ATTR_CREATE_CQ_EVENT_FD, uint64_t(pipe_.rd));
		c.add(UVERBS_ATTR_UHW_OUT, ptr(&drv_out), sizeof(drv_out));
		return c;
	}
	Pipe pipe_;
};

TEST_F(ImportedCreateTest, CqCreateWritesHandleCqeAndDriverResponse)
{
	uint32_t cqe = 0;
	xsrc_create_cq_resp drv{};
	Call c = cq_call(cqe, drv);
	ASSERT_EQ(ioctl(c), 0);
	const uint32_t handle = uint32_t(c.find(UVERBS_ATTR_CREATE_CQ_HANDLE)->data);
	EXPECT_EQ(cqe, 16u);
	EXPECT_NE(drv.ring_off, 0u);
	EXPECT_TRUE(c.find(UVERBS_ATTR_CREATE_CQ_RESP_CQE)->flags & UVERBS_ATTR_F_VALID_OUTPUT);
	const Cq *cq = lookup<Cq>(ctx, handle);
	ASSERT_NE(cq, nullptr);
	EXPECT_EQ(cq->user_handle, 0xc0ffeeu);
	EXPECT_EQ(cq->ring_off, drv.ring_off);
}

TEST_F(ImportedCreateTest, CqCreateRefusesWhatTheKernelRefuses)
{
	uint32_t cqe = 0;
	xsrc_create_cq_resp drv{};
	size_t objects = ctx.objects.size();
	Call c = cq_call(cqe, drv);
	c.find(UVERBS_ATTR_CREATE_CQ_CQE)->attr_id = 99;  // a mandatory attribute the method lacks
	EXPECT_EQ(ioctl(c), EPROTONOSUPPORT);
	c.find(99)->flags = 0;                             // optional: ignored, but the CQE is missing
	EXPECT_EQ(ioctl(c), EINVAL);
	c = cq_call(cqe, drv);
	c.find(UVERBS_ATTR_CREATE_CQ_CQE)->len = 2;        // an integer of another width
	EXPECT_EQ(ioctl(c), EINVAL);
	c = cq_call(cqe, drv);
	c.add(UVERBS_ATTR_CREATE_CQ_CQE, 8, 4);            // twice
	EXPECT_EQ(ioctl(c), EINVAL);
	c = cq_call(cqe, drv);
	c.find(UVERBS_ATTR_CREATE_CQ_RESP_CQE)->len = 2;   // no room for the CQE
	EXPECT_EQ(ioctl(c), EINVAL);
	c = cq_call(cqe, drv);
	c.find(UVERBS_ATTR_CREATE_CQ_CQE)->data = 0;       // as the write ABI refuses it
	EXPECT_EQ(ioctl(c), EINVAL);
	// The caller's output memory gone: the CQ is not left behind.
	c = cq_call(cqe, drv);
	c.find(UVERBS_ATTR_CREATE_CQ_RESP_CQE)->data = 8;
	EXPECT_EQ(ioctl(c), EFAULT);
	EXPECT_EQ(ctx.objects.size(), objects);
}

TEST_F(ImportedCreateTest, QpCreateRunsTheWriteAbisChecks)
{
	uint32_t pd = alloc_pd();
	uint32_t cq_handle = 0;
	ASSERT_EQ(create_cq(16, -1, cq_handle), 0);
	ib_uverbs_qp_cap cap{8, 8, 1, 1, 32}, cap_out{};
	uint32_t qpn = 0;
	xsrc_create_qp_resp drv{};
	auto qp_call = [&] {
		Call c(UVERBS_OBJECT_QP, UVERBS_METHOD_QP_CREATE);
		c.add(UVERBS_ATTR_CREATE_QP_PD_HANDLE, pd);
		c.add(UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE, cq_handle);
		c.add(UVERBS_ATTR_CREATE_QP_RECV_CQ_HANDLE, cq_handle);
		c.add(UVERBS_ATTR_CREATE_QP_HANDLE, 0);
		c.add(UVERBS_ATTR_CREATE_QP_TYPE, IBV_QPT_RC, 8);
		c.add(UVERBS_ATTR_CREATE_QP_USER_HANDLE, 0x9b, 8);
		c.add(UVERBS_ATTR_CREATE_QP_CAP, ptr(&cap), sizeof(cap));
		c.add(UVERBS_ATTR_CREATE_QP_EVENT_FD, uint64_t(pipe_.rd));
		c.add(UVERBS_ATTR_CREATE_QP_FLAGS, IB_UVERBS_QP_CREATE_SQ_SIG_ALL, 4);
		c.add(UVERBS_ATTR_CREATE_QP_RESP_CAP, ptr(&cap_out), sizeof(cap_out));
		c.add(UVERBS_ATTR_CREATE_QP_RESP_QP_NUM, ptr(&qpn), sizeof(qpn));
		c.add(UVERBS_ATTR_UHW_OUT, ptr(&drv), sizeof(drv));
		return c;
	};
	Call c = qp_call();
	ASSERT_EQ(ioctl(c), 0);
	const Qp *qp = lookup<Qp>(ctx, uint32_t(c.find(UVERBS_ATTR_CREATE_QP_HANDLE)->data));
	ASSERT_NE(qp, nullptr);
	EXPECT_EQ(qpn, qp->qpn().value());
	EXPECT_TRUE(qp->sq_sig_all);
	EXPECT_GE(cap_out.max_send_wr, 8u);
	EXPECT_GE(cap_out.max_inline_data, 32u);
	EXPECT_NE(drv.rq_off, 0u);

	c = qp_call();
	c.find(UVERBS_ATTR_CREATE_QP_PD_HANDLE)->data = 777;  // no such PD
	EXPECT_EQ(ioctl(c), EINVAL);
	c = qp_call();
	c.find(UVERBS_ATTR_CREATE_QP_PD_HANDLE)->attr_id = UVERBS_ATTR_CREATE_QP_SOURCE_QPN;
	EXPECT_EQ(ioctl(c), EOPNOTSUPP);
	c = qp_call();
	c.find(UVERBS_ATTR_CREATE_QP_CAP)->len = 8;           // capabilities cut short
	EXPECT_EQ(ioctl(c), EINVAL);
	c = qp_call();
	c.add(UVERBS_ATTR_CREATE_QP_XRCD_HANDLE, 0);          // a PD and a domain
	EXPECT_EQ(ioctl(c), EINVAL);
}

TEST_F(ImportTest, OlderRevisionsHaveNoImport)
{
	dev.abi_revision = 5;
	init_context();
	Pipe p;
	xsrc_get_context_resp resp{};
	EXPECT_EQ(import_context(p, resp), EOPNOTSUPP);
	xsrc_query_object_resp q{};
	EXPECT_EQ(query(XSRC_OBJECT_PD, 0, q), EOPNOTSUPP);
	Ioctl io = async_alloc();
	EXPECT_EQ(ioctl(io), ENOTTY);
}

}  // namespace
}  // namespace xsrc
