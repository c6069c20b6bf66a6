// The fixture of the command tests: one device (with an arena of its own)
// and one context whose "caller" is this test process itself, so responses
// land in our memory and fds come from our own fd table, exactly as they
// would from a provider. Helpers issue commands the way libibverbs does.
#pragma once

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_verbs.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <gtest/gtest.h>
#include <span>
#include <string>
#include <vector>

#include "dispatcher.h"
#include "device.h"
#include "log.h"
#include "xsrc-abi.h"
#include "xsrc-qp-state.h"
#include "xsrc-queues.h"

namespace xsrc::test {

struct Pipe {
	int rd = -1, wr = -1;
	Pipe() { EXPECT_EQ(pipe2(&rd, O_CLOEXEC), 0); }
	~Pipe()
	{
		close(rd);
		close(wr);
	}
	Pipe(const Pipe &) = delete;
	Pipe &operator=(const Pipe &) = delete;
	xsrc_fd_pair pair() const { return {uint32_t(rd), uint32_t(wr)}; }
	// Everything readable right now (the read end is switched to non-blocking).
	std::vector<std::byte> drain() const
	{
		fcntl(rd, F_SETFL, O_RDONLY | O_NONBLOCK);
		std::vector<std::byte> out(65536);
		ssize_t n = read(rd, out.data(), out.size());
		out.resize(n > 0 ? size_t(n) : 0);
		return out;
	}
};

// A core response followed by driver data, as one buffer (the kernel structs
// end in flexible arrays, so they cannot be members of a struct).
template <typename Core, typename Drv>
struct Resp {
	alignas(8) unsigned char bytes[sizeof(Core) + sizeof(Drv)] = {};
	Core core() const { Core c; std::memcpy(&c, bytes, sizeof(c)); return c; }
	Drv drv() const { Drv d; std::memcpy(&d, bytes + sizeof(Core), sizeof(d)); return d; }
};

template <typename T>
std::vector<T> records(const std::vector<std::byte> &bytes)
{
	std::vector<T> out(bytes.size() / sizeof(T));
	std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
	return out;
}

// What a test asks of a new QP; everything has a working default.
struct QpSpec {
	uint8_t qp_type = IBV_QPT_RC;
	uint32_t pd = 0, send_cq = 0, recv_cq = 0;
	std::optional<uint32_t> srq;
	uint32_t max_send_wr = 16, max_recv_wr = 16, max_send_sge = 2, max_recv_sge = 2;
	uint32_t max_inline_data = 64;
	uint64_t user_handle = 0xabc0;
};

// The GID of the peer that modify_cmd() connects QPs to.
inline constexpr uint8_t kPeerGid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7};
// Some of the values modify_cmd() sets, for tests to find them again.
inline constexpr uint32_t kModifyRqPsn = 0x111;
inline constexpr uint32_t kModifySqPsn = 0x222;
inline constexpr uint32_t kModifyDestQpn = 0x345;
inline constexpr uint8_t kModifyPathMtu = IBV_MTU_1024;

// A MODIFY_QP to `to` with every attribute set to a valid value; the mask
// decides what is sent.
inline ib_uverbs_modify_qp modify_cmd(uint32_t qp, ibv_qp_state to, uint32_t mask)
{
	ib_uverbs_modify_qp m{};
	m.qp_handle = qp;
	m.attr_mask = mask;
	m.qp_state = uint8_t(to);
	std::memcpy(m.dest.dgid, kPeerGid, 16);
	m.dest.hop_limit = 64;
	m.dest.sgid_index = 0;
	m.dest.is_global = 1;
	m.dest.port_num = 1;
	m.dest.traffic_class = 3;
	m.qkey = 0x11111111;
	m.rq_psn = kModifyRqPsn;
	m.sq_psn = kModifySqPsn;
	m.dest_qp_num = kModifyDestQpn;
	m.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	m.pkey_index = 0;
	m.port_num = 1;
	m.path_mtu = kModifyPathMtu;
	m.max_rd_atomic = 4;
	m.max_dest_rd_atomic = 8;
	m.min_rnr_timer = 12;
	m.timeout = 14;
	m.retry_cnt = 6;
	m.rnr_retry = 7;
	return m;
}

struct CreatedQp {
	uint32_t handle = 0;
	uint32_t qpn = 0;
	ib_uverbs_create_qp_resp core{};
	xsrc_create_qp_resp drv{};
};

class CommandFixture : public ::testing::Test {
protected:
	void SetUp() override
	{
		static std::atomic<unsigned> counter;
		dev.name = "xsrctest0";
		ASSERT_EQ(netdev_read("lo", dev.netdev), 0);
		refresh_device_view(dev);
		std::string path = "/dev/shm/xsrc-unittest-" + std::to_string(getpid()) + "-" +
				   std::to_string(counter++);
		ASSERT_EQ(Arena::create(path, dev.arena), 0);
		ctx.id = 1;
		ctx.device = &dev;
		ctx.owner = getpid();
		ctx.caller = std::make_unique<ProcessCaller>(getpid());
		ASSERT_TRUE(ctx.caller->valid());
		dev.contexts.push_back(&ctx);
		// XSRC_DEBUG=1 build/bin/xsrcd_core_tests: every refusal on stderr.
		set_debug_enabled(debug_requested_by_environment());
	}
	void TearDown() override { destroy_context_objects(ctx); }

	Arena &arena() { return *dev.arena; }

	// A non-extended command: header + core struct + optional driver bytes.
	template <typename Core>
	int run(uint32_t command, const Core &core, std::span<const std::byte> driver = {},
		size_t out_bytes = 0)
	{
		return run_on(ctx, command, core, driver, out_bytes);
	}

	template <typename Core>
	int run_on(Context &c, uint32_t command, const Core &core, std::span<const std::byte> driver = {},
		   size_t out_bytes = 0)
	{
		std::vector<std::byte> buf(sizeof(ib_uverbs_cmd_hdr) + sizeof(Core) + driver.size());
		ib_uverbs_cmd_hdr hdr{command, uint16_t(buf.size() / 4), uint16_t(out_bytes / 4)};
		std::memcpy(buf.data(), &hdr, sizeof(hdr));
		std::memcpy(buf.data() + sizeof(hdr), &core, sizeof(Core));
		if (!driver.empty())
			std::memcpy(buf.data() + sizeof(hdr) + sizeof(Core), driver.data(), driver.size());
		return dispatch_command(c, *c.caller, buf);
	}

	// An extended command; `driver_out` bytes of the response are driver data.
	template <typename Core>
	int run_ex(uint32_t command, const Core &core, void *resp, size_t out_bytes, size_t driver_out = 0)
	{
		std::vector<std::byte> buf(sizeof(ib_uverbs_cmd_hdr) + sizeof(ib_uverbs_ex_cmd_hdr) + sizeof(Core));
		ib_uverbs_cmd_hdr hdr{command | IB_USER_VERBS_CMD_FLAG_EXTENDED, uint16_t(sizeof(Core) / 8),
				      uint16_t(out_bytes / 8)};
		ib_uverbs_ex_cmd_hdr ex{};
		ex.response = reinterpret_cast<uintptr_t>(resp);
		ex.provider_out_words = uint16_t(driver_out / 8);
		std::memcpy(buf.data(), &hdr, sizeof(hdr));
		std::memcpy(buf.data() + sizeof(hdr), &ex, sizeof(ex));
		std::memcpy(buf.data() + sizeof(hdr) + sizeof(ex), &core, sizeof(Core));
		return dispatch_command(ctx, *ctx.caller, buf);
	}

	int get_context(xsrc_get_context_req &drv, xsrc_get_context_resp *dresp_out = nullptr,
			ib_uverbs_get_context_resp *resp_out = nullptr)
	{
		Resp<ib_uverbs_get_context_resp, xsrc_get_context_resp> resp;
		ib_uverbs_get_context cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		int err = run(IB_USER_VERBS_CMD_GET_CONTEXT, cmd, std::as_bytes(std::span(&drv, 1)), sizeof(resp));
		if (dresp_out)
			*dresp_out = resp.drv();
		if (resp_out)
			*resp_out = resp.core();
		return err;
	}

	void init_context(size_t channels = 2)
	{
		xsrc_get_context_req drv{};
		drv.async_fds = async.pair();
		drv.num_channel_fds = uint32_t(channels);
		for (size_t i = 0; i < channels; ++i)
			drv.channel_fds[i] = chan[i].pair();
		ASSERT_EQ(get_context(drv), 0);
	}

	uint32_t alloc_pd(uint32_t *pd_id = nullptr)
	{
		Resp<ib_uverbs_alloc_pd_resp, xsrc_alloc_pd_resp> resp;
		ib_uverbs_alloc_pd cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		EXPECT_EQ(run(IB_USER_VERBS_CMD_ALLOC_PD, cmd, {}, sizeof(resp)), 0);
		if (pd_id)
			*pd_id = resp.drv().pd_id;
		return resp.core().pd_handle;
	}

	int reg_mr(uint32_t pd, void *addr, size_t len, uint32_t access, ib_uverbs_reg_mr_resp &resp)
	{
		return reg_mr_on(ctx, pd, addr, len, access, resp);
	}

	int reg_mr_on(Context &c, uint32_t pd, void *addr, size_t len, uint32_t access,
		      ib_uverbs_reg_mr_resp &resp)
	{
		ib_uverbs_reg_mr cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.start = reinterpret_cast<uintptr_t>(addr);
		cmd.length = len;
		cmd.hca_va = cmd.start;
		cmd.pd_handle = pd;
		cmd.access_flags = access;
		return run_on(c, IB_USER_VERBS_CMD_REG_MR, cmd, {}, sizeof(resp));
	}

	int create_channel(int &fd)
	{
		ib_uverbs_create_comp_channel_resp resp{};
		ib_uverbs_create_comp_channel cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		int err = run(IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL, cmd, {}, sizeof(resp));
		fd = int(resp.fd);
		return err;
	}

	int create_cq(uint32_t cqe, int channel, uint32_t &handle, uint64_t *ring_off = nullptr,
		      uint64_t user_handle = 0x1234)
	{
		Resp<ib_uverbs_create_cq_resp, xsrc_create_cq_resp> resp;
		ib_uverbs_create_cq cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.user_handle = user_handle;
		cmd.cqe = cqe;
		cmd.comp_channel = channel;
		int err = run(IB_USER_VERBS_CMD_CREATE_CQ, cmd, {}, sizeof(resp));
		handle = resp.core().cq_handle;
		if (ring_off)
			*ring_off = resp.drv().ring_off;
		return err;
	}

	int destroy_cq(uint32_t cq, ib_uverbs_destroy_cq_resp *out = nullptr)
	{
		ib_uverbs_destroy_cq_resp resp{};
		ib_uverbs_destroy_cq cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.cq_handle = cq;
		int err = run(IB_USER_VERBS_CMD_DESTROY_CQ, cmd, {}, sizeof(resp));
		if (out)
			*out = resp;
		return err;
	}

	int create_srq(uint32_t pd, uint32_t max_wr, uint32_t max_sge, uint32_t &handle,
		       ib_uverbs_create_srq_resp *core = nullptr, xsrc_create_srq_resp *drv = nullptr)
	{
		Resp<ib_uverbs_create_srq_resp, xsrc_create_srq_resp> resp;
		ib_uverbs_create_srq cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.user_handle = 0x5150;
		cmd.pd_handle = pd;
		cmd.max_wr = max_wr;
		cmd.max_sge = max_sge;
		int err = run(IB_USER_VERBS_CMD_CREATE_SRQ, cmd, {}, sizeof(resp));
		handle = resp.core().srq_handle;
		if (core)
			*core = resp.core();
		if (drv)
			*drv = resp.drv();
		return err;
	}

	int destroy_srq(uint32_t srq, uint32_t *events = nullptr)
	{
		ib_uverbs_destroy_srq_resp resp{};
		ib_uverbs_destroy_srq cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.srq_handle = srq;
		int err = run(IB_USER_VERBS_CMD_DESTROY_SRQ, cmd, {}, sizeof(resp));
		if (events)
			*events = resp.events_reported;
		return err;
	}

	static ib_uverbs_create_qp create_qp_cmd(const QpSpec &s)
	{
		ib_uverbs_create_qp cmd{};
		cmd.user_handle = s.user_handle;
		cmd.pd_handle = s.pd;
		cmd.send_cq_handle = s.send_cq;
		cmd.recv_cq_handle = s.recv_cq;
		cmd.srq_handle = s.srq.value_or(0);
		cmd.is_srq = s.srq.has_value();
		cmd.max_send_wr = s.max_send_wr;
		cmd.max_recv_wr = s.max_recv_wr;
		cmd.max_send_sge = s.max_send_sge;
		cmd.max_recv_sge = s.max_recv_sge;
		cmd.max_inline_data = s.max_inline_data;
		cmd.qp_type = s.qp_type;
		return cmd;
	}

	int create_qp(const QpSpec &s, CreatedQp &out)
	{
		Resp<ib_uverbs_create_qp_resp, xsrc_create_qp_resp> resp;
		ib_uverbs_create_qp cmd = create_qp_cmd(s);
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		int err = run(IB_USER_VERBS_CMD_CREATE_QP, cmd, {}, sizeof(resp));
		out.core = resp.core();
		out.drv = resp.drv();
		out.handle = out.core.qp_handle;
		out.qpn = out.core.qpn;
		return err;
	}

	int modify_qp(const ib_uverbs_modify_qp &cmd) { return run(IB_USER_VERBS_CMD_MODIFY_QP, cmd); }

	int query_qp(uint32_t qp, ib_uverbs_query_qp_resp &resp)
	{
		ib_uverbs_query_qp cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.qp_handle = qp;
		return run(IB_USER_VERBS_CMD_QUERY_QP, cmd, {}, sizeof(resp));
	}

	int destroy_qp(uint32_t qp, uint32_t *events = nullptr)
	{
		ib_uverbs_destroy_qp_resp resp{~0u};
		ib_uverbs_destroy_qp cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.qp_handle = qp;
		int err = run(IB_USER_VERBS_CMD_DESTROY_QP, cmd, {}, sizeof(resp));
		if (events)
			*events = resp.events_reported;
		return err;
	}

	int raise_event(uint32_t kind, uint64_t object, uint32_t reserved = 0)
	{
		xsrc_raise_event cmd{};
		cmd.kind = kind;
		cmd.reserved = reserved;
		cmd.object = object;
		return run(XSRC_CMD_RAISE_EVENT, cmd);
	}

	xsrc_qp_entry &qp_entry(uint32_t qpn) { return arena().qp_entry(qpn - XSRC_QPN_BASE); }
	xsrc_srq_entry &srq_entry(uint32_t srqn) { return arena().srq_entry(srqn - XSRC_SRQN_BASE); }

	// A PD and one CQ (no channel) for QP tests.
	void basic_objects()
	{
		init_context();
		pd0 = alloc_pd(&pd0_id);
		ASSERT_EQ(create_cq(64, -1, cq0, &cq0_ring), 0);
	}
	QpSpec qp_spec(uint8_t type = IBV_QPT_RC) const
	{
		QpSpec s;
		s.qp_type = type;
		s.pd = pd0;
		s.send_cq = s.recv_cq = cq0;
		return s;
	}

	Device dev;
	Context ctx;
	Pipe async, chan[4];
	uint32_t pd0 = 0, pd0_id = 0, cq0 = 0;  // from basic_objects()
	uint64_t cq0_ring = 0;
};

}  // namespace xsrc::test
