// The command decoder and dispatcher, driven in-process: the "caller" is this
// test process itself (command_fixture.h). Context, PD, MR, channel and CQ
// commands; QPs, SRQs, AHs and events have test files of their own.
#include <sys/mman.h>

#include "command_fixture.h"

namespace xsrc {
namespace {

using test::Pipe;
using test::Resp;

class CommandsTest : public test::CommandFixture {};

TEST_F(CommandsTest, RejectsEverythingBeforeGetContext)
{
	ib_uverbs_alloc_pd_resp resp{};
	ib_uverbs_alloc_pd cmd{};
	cmd.response = reinterpret_cast<uintptr_t>(&resp);
	EXPECT_EQ(run(IB_USER_VERBS_CMD_ALLOC_PD, cmd, {}, sizeof(resp)), EINVAL);
}

TEST_F(CommandsTest, GetContextTakesPipesAndAnswersOnce)
{
	xsrc_get_context_req drv{};
	drv.async_fds = async.pair();
	drv.num_channel_fds = 1;
	drv.channel_fds[0] = chan[0].pair();
	xsrc_get_context_resp dresp{};
	ib_uverbs_get_context_resp resp{};
	ASSERT_EQ(get_context(drv, &dresp, &resp), 0);
	EXPECT_EQ(resp.async_fd, uint32_t(async.rd));
	EXPECT_EQ(resp.num_comp_vectors, 1u);
	EXPECT_EQ(dresp.driver_abi, uint32_t(XSRC_DRIVER_ABI_REVISION));
	EXPECT_EQ(dresp.channel_pool_free, 1u);
	EXPECT_EQ(get_context(drv), EINVAL);  // a context is initialised once

	// The daemon's copy of the async write end reaches our read end.
	ctx.post_async_event(1, IBV_EVENT_PORT_ERR);
	ib_uverbs_async_event_desc ev{};
	ASSERT_EQ(read(async.rd, &ev, sizeof(ev)), ssize_t(sizeof(ev)));
	EXPECT_EQ(ev.element, 1u);
	EXPECT_EQ(ev.event_type, uint32_t(IBV_EVENT_PORT_ERR));
}

// Revision 10: a provider that gives room for cq_head_mode is told its CQs
// may publish their heads lazily; one with less room (revisions 1 to 9)
// trusts heads, and is counted in the arena header while its context
// lives. When the count leaves 0, every CQ ring's head is caught up with
// the consumer's position as its slots show it.
TEST_F(CommandsTest, ContextsThatTrustCqHeadsAreCounted)
{
	xsrc_get_context_req drv{};
	drv.async_fds = async.pair();
	xsrc_get_context_resp dresp{};
	ASSERT_EQ(get_context(drv, &dresp), 0);
	EXPECT_EQ(dresp.cq_head_mode, uint32_t(XSRC_CQ_HEAD_LAZY));
	const auto &header = arena().header();
	EXPECT_EQ(header.eager_heads, 0u);

	// Our CQ, three of its completions taken but the head not published.
	uint32_t cq = 0;
	uint64_t ring_off = 0;
	ASSERT_EQ(create_cq(8, -1, cq, &ring_off), 0);
	auto *ring = &arena().at<xsrc_cq_ring>(ring_off);
	for (uint64_t i = 0; i < 5; ++i) {
		xsrc_cqe c{};
		c.wr_id = i;
		ASSERT_TRUE(cq_push(ring, c));
	}
	CqConsumer consumer(ring, &header.eager_heads);
	xsrc_cqe c;
	for (int i = 0; i < 3; ++i)
		ASSERT_TRUE(consumer.take(c, [](uint64_t, uint32_t) { return true; }));
	consumer.publish();
	ASSERT_EQ(ring->head, 0u);

	// A second context whose provider knows revision 9's response only.
	Context old;
	old.id = 2;
	old.device = &dev;
	old.owner = getpid();
	old.caller = std::make_unique<ProcessCaller>(getpid());
	dev.contexts.push_back(&old);
	Pipe old_async;
	drv.async_fds = old_async.pair();
	std::vector<std::byte> room(sizeof(ib_uverbs_get_context_resp) + offsetof(xsrc_get_context_resp, cq_head_mode));
	ib_uverbs_get_context cmd{};
	cmd.response = reinterpret_cast<uintptr_t>(room.data());
	ASSERT_EQ(run_on(old, IB_USER_VERBS_CMD_GET_CONTEXT, cmd, std::as_bytes(std::span(&drv, 1)), room.size()), 0);
	EXPECT_EQ(header.eager_heads, 1u);
	EXPECT_EQ(ring->head, 3u) << "caught up when the count left 0";
	ASSERT_TRUE(consumer.take(c, [](uint64_t, uint32_t) { return true; }));
	consumer.publish();
	EXPECT_EQ(ring->head, 4u) << "published at every poll while counted";

	destroy_context_objects(old);
	std::erase(dev.contexts, &old);
	EXPECT_EQ(header.eager_heads, 0u) << "its context is gone";
	destroy_context_objects(old);
	EXPECT_EQ(header.eager_heads, 0u) << "counted once";
}

TEST_F(CommandsTest, GetContextValidatesItsFds)
{
	xsrc_get_context_req drv{};
	drv.async_fds = {uint32_t(async.rd), uint32_t(chan[0].wr)};  // ends of two pipes
	EXPECT_EQ(get_context(drv), EINVAL);
	drv.async_fds = {uint32_t(async.wr), uint32_t(async.rd)};    // swapped ends
	EXPECT_EQ(get_context(drv), EINVAL);
	drv.async_fds = {9999, 9998};                                  // not open
	EXPECT_EQ(get_context(drv), EBADF);
	drv.async_fds = async.pair();
	drv.num_channel_fds = XSRC_MAX_CHANNEL_FDS + 1;
	EXPECT_EQ(get_context(drv), EINVAL);
	drv.num_channel_fds = 0;
	drv.comp_mask = 1;
	EXPECT_EQ(get_context(drv), EOPNOTSUPP);
	EXPECT_FALSE(ctx.initialised);
}

TEST_F(CommandsTest, MalformedHeadersGetEinvalOrEopnotsupp)
{
	init_context();
	std::byte tiny[4]{};
	EXPECT_EQ(dispatch_command(ctx, *ctx.caller, tiny), EINVAL);

	ib_uverbs_dealloc_pd cmd{7};
	std::vector<std::byte> buf(sizeof(ib_uverbs_cmd_hdr) + sizeof(cmd));
	ib_uverbs_cmd_hdr hdr{IB_USER_VERBS_CMD_DEALLOC_PD, uint16_t(buf.size() / 4 + 1), 0};
	std::memcpy(buf.data(), &hdr, sizeof(hdr));
	EXPECT_EQ(dispatch_command(ctx, *ctx.caller, buf), EINVAL);  // in_words lies

	hdr = {0x7e, uint16_t(buf.size() / 4), 0};
	std::memcpy(buf.data(), &hdr, sizeof(hdr));
	EXPECT_EQ(dispatch_command(ctx, *ctx.caller, buf), EOPNOTSUPP);  // unknown command

	hdr = {IB_USER_VERBS_CMD_DEALLOC_PD | 0x00100000, uint16_t(buf.size() / 4), 0};
	std::memcpy(buf.data(), &hdr, sizeof(hdr));
	EXPECT_EQ(dispatch_command(ctx, *ctx.caller, buf), EINVAL);  // undefined flag bits

	// Truncated: header says 2 words, the command needs a core struct
	// (ENOSPC, as the kernel answers a request shorter than its struct).
	std::byte hdr_only[8];
	hdr = {IB_USER_VERBS_CMD_REG_MR, 2, 0};
	std::memcpy(hdr_only, &hdr, sizeof(hdr));
	EXPECT_EQ(dispatch_command(ctx, *ctx.caller, hdr_only), ENOSPC);

	// No response expected but out_words given.
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEALLOC_PD, cmd, {}, 8), EINVAL);

	// Extended header whose lengths do not add up, and a reserved field set.
	ib_uverbs_ex_query_device q{};
	std::vector<std::byte> ex(8 + 16 + sizeof(q) + 8);
	ib_uverbs_cmd_hdr xh{IB_USER_VERBS_CMD_QUERY_DEVICE | IB_USER_VERBS_CMD_FLAG_EXTENDED, 1, 0};
	std::memcpy(ex.data(), &xh, sizeof(xh));
	EXPECT_EQ(dispatch_command(ctx, *ctx.caller, ex), EINVAL);
	ib_uverbs_ex_cmd_hdr exh{};
	exh.cmd_hdr_reserved = 1;
	std::memcpy(ex.data() + 8, &exh, sizeof(exh));
	ex.resize(8 + 16 + sizeof(q));
	EXPECT_EQ(dispatch_command(ctx, *ctx.caller, ex), EINVAL);
}

TEST_F(CommandsTest, UnknownDriverDataIsRefused)
{
	init_context();
	ib_uverbs_alloc_pd_resp resp{};
	ib_uverbs_alloc_pd cmd{};
	cmd.response = reinterpret_cast<uintptr_t>(&resp);
	uint64_t junk = 1;
	EXPECT_EQ(run(IB_USER_VERBS_CMD_ALLOC_PD, cmd, std::as_bytes(std::span(&junk, 1)), sizeof(resp)),
		  EOPNOTSUPP);
	junk = 0;  // zeroed trailing bytes are fine: an older/newer caller's padding
	EXPECT_EQ(run(IB_USER_VERBS_CMD_ALLOC_PD, cmd, std::as_bytes(std::span(&junk, 1)), sizeof(resp)), 0);
}

TEST_F(CommandsTest, ResponsesNeedRoomAndMappedMemory)
{
	init_context();
	ib_uverbs_query_device_resp resp{};
	ib_uverbs_query_device cmd{};
	cmd.response = reinterpret_cast<uintptr_t>(&resp);
	EXPECT_EQ(run(IB_USER_VERBS_CMD_QUERY_DEVICE, cmd, {}, sizeof(resp) - 8), ENOSPC);
	cmd.response = 0x10;  // never mapped
	EXPECT_EQ(run(IB_USER_VERBS_CMD_QUERY_DEVICE, cmd, {}, sizeof(resp)), EFAULT);
	cmd.response = reinterpret_cast<uintptr_t>(&resp);
	ASSERT_EQ(run(IB_USER_VERBS_CMD_QUERY_DEVICE, cmd, {}, sizeof(resp)), 0);
	EXPECT_EQ(resp.phys_port_cnt, 1);
	EXPECT_EQ(resp.atomic_cap, uint32_t(IBV_ATOMIC_HCA));
	EXPECT_TRUE(resp.device_cap_flags & IBV_DEVICE_XRC);
	EXPECT_EQ(resp.max_cqe, DeviceLimits::max_cqe);
}

TEST_F(CommandsTest, ExtendedQueryDeviceFitsTheCallersRoom)
{
	init_context();
	ib_uverbs_ex_query_device_resp resp{};
	ib_uverbs_ex_query_device cmd{};
	ASSERT_EQ(run_ex(IB_USER_VERBS_EX_CMD_QUERY_DEVICE, cmd, &resp, sizeof(resp)), 0);
	EXPECT_EQ(resp.response_length, sizeof(resp));
	EXPECT_EQ(resp.base.max_qp, DeviceLimits::max_qp);

	// An old caller with room for the base response and length fields only.
	std::vector<uint64_t> small(offsetof(ib_uverbs_ex_query_device_resp, odp_caps) / 8 + 1, ~0ull);
	size_t room = offsetof(ib_uverbs_ex_query_device_resp, odp_caps);
	ASSERT_EQ(run_ex(IB_USER_VERBS_EX_CMD_QUERY_DEVICE, cmd, small.data(), room), 0);
	auto *partial = reinterpret_cast<ib_uverbs_ex_query_device_resp *>(small.data());
	EXPECT_EQ(partial->response_length, room);
	EXPECT_EQ(small.back(), ~0ull);  // nothing written past the room given

	cmd.comp_mask = 1;
	EXPECT_EQ(run_ex(IB_USER_VERBS_EX_CMD_QUERY_DEVICE, cmd, &resp, sizeof(resp)), EINVAL);
}

TEST_F(CommandsTest, QueryPortReportsEthernetAndRejectsBadPorts)
{
	init_context();
	ib_uverbs_query_port_resp resp{};
	ib_uverbs_query_port cmd{};
	cmd.response = reinterpret_cast<uintptr_t>(&resp);
	cmd.port_num = 2;
	EXPECT_EQ(run(IB_USER_VERBS_CMD_QUERY_PORT, cmd, {}, sizeof(resp)), EINVAL);
	cmd.port_num = 1;
	ASSERT_EQ(run(IB_USER_VERBS_CMD_QUERY_PORT, cmd, {}, sizeof(resp)), 0);
	EXPECT_EQ(resp.link_layer, IBV_LINK_LAYER_ETHERNET);
	EXPECT_EQ(resp.gid_tbl_len, DeviceLimits::gid_tbl_len);
	EXPECT_EQ(resp.state, dev.netdev.oper_up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN);
}

TEST_F(CommandsTest, PdLifetimeAndWrongHandles)
{
	init_context();
	uint32_t pd = alloc_pd();
	std::vector<char> buf(4096);
	ib_uverbs_reg_mr_resp mr{};
	ASSERT_EQ(reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE, mr), 0);

	ib_uverbs_dealloc_pd dealloc{pd};
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEALLOC_PD, dealloc), EBUSY);  // an MR uses it
	ib_uverbs_dereg_mr dereg{mr.mr_handle};
	ib_uverbs_dereg_mr wrong_type{pd};
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEREG_MR, wrong_type), EINVAL);  // a PD is not an MR
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEREG_MR, dereg), 0);
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEREG_MR, dereg), EINVAL);      // gone
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEALLOC_PD, dealloc), 0);
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEALLOC_PD, dealloc), EINVAL);
	EXPECT_TRUE(ctx.objects.empty());
}

TEST_F(CommandsTest, RegMrChecksTheCallersMappings)
{
	init_context();
	uint32_t pd = alloc_pd();
	long page = sysconf(_SC_PAGESIZE);
	char *area = static_cast<char *>(mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE,
					      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
	ASSERT_NE(area, MAP_FAILED);
	ASSERT_EQ(mprotect(area + page, page, PROT_READ), 0);
	ASSERT_EQ(munmap(area + 2 * page, page), 0);

	ib_uverbs_reg_mr_resp r{};
	EXPECT_EQ(reg_mr(pd, area, page, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, r), 0);
	EXPECT_EQ(r.lkey, r.rkey);
	EXPECT_EQ(reg_mr(pd, area + page, page, 0, r), 0);  // read-only page, read-only MR
	EXPECT_EQ(reg_mr(pd, area + page, page, IBV_ACCESS_LOCAL_WRITE, r), EFAULT);
	EXPECT_EQ(reg_mr(pd, area, 3 * page, 0, r), EFAULT);  // runs into the hole
	EXPECT_EQ(reg_mr(pd, area, 0, 0, r), EINVAL);
	EXPECT_EQ(reg_mr(pd, area, page, IBV_ACCESS_REMOTE_WRITE, r), EINVAL);  // needs local write
	EXPECT_EQ(reg_mr(pd + 100, area, page, 0, r), EINVAL);
	EXPECT_EQ(dev.mrs_by_index.size(), 2u);
	munmap(area, 2 * page);
}

// Completion timestamps are the provider's: the daemon takes the flag.
TEST_F(CommandsTest, ExtendedCreateCqTakesTheTimestampFlag)
{
	init_context(0);
	struct {
		ib_uverbs_ex_create_cq_resp core;
	} resp{};
	ib_uverbs_ex_create_cq cmd{};
	cmd.cqe = 8;
	cmd.comp_channel = -1;
	cmd.flags = IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION | IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN;
	EXPECT_EQ(run_ex(IB_USER_VERBS_EX_CMD_CREATE_CQ, cmd, &resp, sizeof(resp)), 0);
}

TEST_F(CommandsTest, ReregMrRepublishesTheEntryWithItsKeys)
{
	init_context();
	uint32_t pd_id = 0, pd2_id = 0;
	uint32_t pd = alloc_pd(&pd_id);
	uint32_t pd2 = alloc_pd(&pd2_id);
	long page = sysconf(_SC_PAGESIZE);
	char *area = static_cast<char *>(mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE,
					      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
	ASSERT_NE(area, MAP_FAILED);
	ASSERT_EQ(mprotect(area + page, page, PROT_READ), 0);
	ASSERT_EQ(munmap(area + 2 * page, page), 0);
	ib_uverbs_reg_mr_resp mr{};
	ASSERT_EQ(reg_mr(pd, area, page, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, mr), 0);
	const xsrc_mr_entry &e = dev.arena->mr_entry(mr.lkey >> 8);

	ib_uverbs_rereg_mr_resp rr{};
	ib_uverbs_rereg_mr cmd{};
	cmd.response = reinterpret_cast<uintptr_t>(&rr);
	cmd.mr_handle = mr.mr_handle;
	auto rereg = [&](uint32_t flags, void *addr, size_t len, uint32_t access, uint32_t pd_handle) {
		cmd.flags = flags;
		cmd.start = reinterpret_cast<uintptr_t>(addr);
		cmd.hca_va = cmd.start;
		cmd.length = len;
		cmd.access_flags = access;
		cmd.pd_handle = pd_handle;
		return run(IB_USER_VERBS_CMD_REREG_MR, cmd, {}, sizeof(rr));
	};
	// Read-only memory: only without write access.
	EXPECT_EQ(rereg(IBV_REREG_MR_CHANGE_TRANSLATION, area + page, page, 0, 0), EFAULT);
	EXPECT_EQ(rereg(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS, area + page, page, 0, 0), 0);
	EXPECT_EQ(rr.lkey, mr.lkey);
	EXPECT_EQ(rr.rkey, mr.rkey);
	EXPECT_EQ(e.key, mr.lkey);
	EXPECT_EQ(e.addr, reinterpret_cast<uintptr_t>(area + page));
	EXPECT_EQ(e.access, 0u);
	EXPECT_EQ(rereg(IBV_REREG_MR_CHANGE_TRANSLATION, area + page, 2 * page, 0, 0), EFAULT);  // the hole
	EXPECT_EQ(rereg(IBV_REREG_MR_CHANGE_TRANSLATION, area, 0, 0, 0), EINVAL);
	EXPECT_EQ(rereg(0, nullptr, 0, 0, 0), EINVAL);
	EXPECT_EQ(rereg(8, nullptr, 0, 0, 0), EINVAL);
	EXPECT_EQ(rereg(IBV_REREG_MR_CHANGE_ACCESS, nullptr, 0, IBV_ACCESS_REMOTE_WRITE, 0), EINVAL);
	EXPECT_EQ(rereg(IBV_REREG_MR_CHANGE_ACCESS, nullptr, 0, IBV_ACCESS_ON_DEMAND, 0), EOPNOTSUPP);
	EXPECT_EQ(rereg(IBV_REREG_MR_CHANGE_PD, nullptr, 0, 0, pd2 + 100), EINVAL);
	cmd.flags = IBV_REREG_MR_CHANGE_TRANSLATION;  // start and hca_va in different places of a page
	cmd.start = reinterpret_cast<uintptr_t>(area);
	cmd.hca_va = cmd.start + 8;
	cmd.length = page;
	EXPECT_EQ(run(IB_USER_VERBS_CMD_REREG_MR, cmd, {}, sizeof(rr)), EINVAL);
	EXPECT_EQ(e.addr, reinterpret_cast<uintptr_t>(area + page)) << "a refusal changed the entry";

	// The PD moves, and with it what keeps a PD alive.
	EXPECT_EQ(rereg(IBV_REREG_MR_CHANGE_PD, nullptr, 0, 0, pd2), 0);
	EXPECT_EQ(e.pd_id, pd2_id);
	ib_uverbs_dealloc_pd dealloc{pd}, dealloc2{pd2};
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEALLOC_PD, dealloc2), EBUSY);
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEALLOC_PD, dealloc), 0);
	ib_uverbs_dereg_mr dereg{mr.mr_handle};
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEREG_MR, dereg), 0);
	EXPECT_EQ(rereg(IBV_REREG_MR_CHANGE_ACCESS, nullptr, 0, 0, 0), EINVAL);  // no such MR
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DEALLOC_PD, dealloc2), 0);
	munmap(area, 2 * page);
}

TEST_F(CommandsTest, OdpMrsNeedNoMappingAndImplicitOnesCoverEverything)
{
	init_context();
	uint32_t pd = alloc_pd();
	long page = sysconf(_SC_PAGESIZE);
	char *area = static_cast<char *>(mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE,
					      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
	ASSERT_NE(area, MAP_FAILED);
	ASSERT_EQ(munmap(area + page, page), 0);
	constexpr uint32_t kOdpWrite = IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

	ib_uverbs_reg_mr_resp r{};
	EXPECT_EQ(reg_mr(pd, area, 3 * page, kOdpWrite, r), 0);  // over the hole: mapped later, or never
	EXPECT_EQ(reg_mr(pd, area, 3 * page, IBV_ACCESS_LOCAL_WRITE, r), EFAULT);
	EXPECT_EQ(reg_mr(pd, nullptr, SIZE_MAX, kOdpWrite, r), 0);  // implicit
	const xsrc_mr_entry &e = dev.arena->mr_entry(r.lkey >> 8);
	EXPECT_EQ(e.key, r.lkey);
	EXPECT_EQ(e.addr, 0u);
	EXPECT_EQ(e.length, UINT64_MAX);
	EXPECT_TRUE(e.access & IBV_ACCESS_ON_DEMAND);
	EXPECT_EQ(reg_mr(pd, nullptr, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE, r), EFAULT);  // without ODP: not all mapped
	EXPECT_EQ(reg_mr(pd, area + 2 * page, SIZE_MAX, kOdpWrite, r), EINVAL);  // wraps
	EXPECT_EQ(reg_mr(pd, area, 0, kOdpWrite, r), EINVAL);
	EXPECT_EQ(reg_mr(pd, area, page, IBV_ACCESS_ON_DEMAND | IBV_ACCESS_REMOTE_WRITE, r), EINVAL);
	EXPECT_EQ(dev.mrs_by_index.size(), 2u);
	munmap(area, 3 * page);
}

TEST_F(CommandsTest, ExQueryDeviceReportsOdpCaps)
{
	init_context();
	ib_uverbs_ex_query_device cmd{};
	ib_uverbs_ex_query_device_resp resp{};
	ASSERT_EQ(run_ex(IB_USER_VERBS_EX_CMD_QUERY_DEVICE, cmd, &resp, sizeof(resp)), 0);
	EXPECT_EQ(resp.odp_caps.general_caps, uint64_t(IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT));
	constexpr uint32_t kAll = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
				  IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
	EXPECT_EQ(resp.odp_caps.per_transport_caps.rc_odp_caps, kAll);
	EXPECT_EQ(resp.odp_caps.per_transport_caps.ud_odp_caps,
		  uint32_t(IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV));
	EXPECT_EQ(resp.xrc_odp_caps, kAll & ~uint32_t(IBV_ODP_SUPPORT_RECV));
}

TEST_F(CommandsTest, CompletionChannelsComeFromThePoolInOrder)
{
	init_context(2);
	int fd1, fd2, fd3;
	ASSERT_EQ(create_channel(fd1), 0);
	ASSERT_EQ(create_channel(fd2), 0);
	EXPECT_EQ(fd1, chan[0].rd);
	EXPECT_EQ(fd2, chan[1].rd);
	EXPECT_EQ(create_channel(fd3), EMFILE);

	xsrc_channel_pool_resp resp{};
	xsrc_channel_pool add{};
	add.response = reinterpret_cast<uintptr_t>(&resp);
	add.fds = chan[2].pair();
	ASSERT_EQ(run(XSRC_CMD_CHANNEL_POOL, add, {}, sizeof(resp)), 0);
	EXPECT_EQ(resp.channel_pool_free, 1u);
	add.fds = {XSRC_NO_FD, XSRC_NO_FD};
	ASSERT_EQ(run(XSRC_CMD_CHANNEL_POOL, add, {}, sizeof(resp)), 0);
	EXPECT_EQ(resp.channel_pool_free, 1u);
	ASSERT_EQ(create_channel(fd3), 0);
	EXPECT_EQ(fd3, chan[2].rd);
	add.reserved = 1;
	EXPECT_EQ(run(XSRC_CMD_CHANNEL_POOL, add, {}, sizeof(resp)), EINVAL);
}

TEST_F(CommandsTest, CqValidationAndDestroyCounts)
{
	init_context(1);
	uint32_t cq;
	EXPECT_EQ(create_cq(0, -1, cq), EINVAL);
	EXPECT_EQ(create_cq(DeviceLimits::max_cqe + 1, -1, cq), EINVAL);
	EXPECT_EQ(create_cq(16, chan[0].rd, cq), EINVAL);  // not a channel yet
	int ch;
	ASSERT_EQ(create_channel(ch), 0);
	ASSERT_EQ(create_cq(16, ch, cq), 0);

	ib_uverbs_req_notify_cq arm{cq, 0};
	EXPECT_EQ(run(IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, arm), 0);
	auto &ring = arena().at<xsrc_cq_ring>(std::get<Cq>(ctx.objects.at(cq)).ring_off);
	EXPECT_EQ(ring.armed, uint32_t(XSRC_CQ_ARMED_NEXT));
	arm.solicited_only = 1;
	EXPECT_EQ(run(IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, arm), 0);
	EXPECT_EQ(ring.armed, uint32_t(XSRC_CQ_ARMED_SOLICITED));
	// Revision 11 arming reads the slots from the head to the tail: not of a
	// ring whose forged shape reaches past the arena (it would fault).
	const xsrc_cq_ring shape = ring;
	ring.arm_sees_tail = 1;
	ring.num_entries = 0x80000000u;
	ring.head = 1;
	ring.tail = 0x40000000u;
	arm.solicited_only = 0;
	EXPECT_EQ(run(IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, arm), 0);
	EXPECT_EQ(ring.armed, uint32_t(XSRC_CQ_ARMED_NEXT));
	ring.num_entries = shape.num_entries;
	ring.head = shape.head;
	ring.tail = shape.tail;
	EXPECT_EQ(run(IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, arm), 0) << "a sane ring, with the tail in view";
	EXPECT_EQ(ring.armed, uint32_t(XSRC_CQ_ARMED_NEXT));

	ib_uverbs_resize_cq_resp rr{};
	ib_uverbs_resize_cq resize{};
	resize.response = reinterpret_cast<uintptr_t>(&rr);
	resize.cq_handle = cq;
	resize.cqe = 64;
	ASSERT_EQ(run(IB_USER_VERBS_CMD_RESIZE_CQ, resize, {}, sizeof(rr)), 0);
	EXPECT_EQ(rr.cqe, 64u);

	ib_uverbs_destroy_cq_resp dr{~0u, ~0u};
	ib_uverbs_destroy_cq destroy{};
	destroy.response = reinterpret_cast<uintptr_t>(&dr);
	destroy.cq_handle = cq;
	ASSERT_EQ(run(IB_USER_VERBS_CMD_DESTROY_CQ, destroy, {}, sizeof(dr)), 0);
	EXPECT_EQ(dr.comp_events_reported, 0u);
	EXPECT_EQ(dr.async_events_reported, 0u);
	EXPECT_EQ(run(IB_USER_VERBS_CMD_DESTROY_CQ, destroy, {}, sizeof(dr)), EINVAL);
	EXPECT_EQ(run(IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, arm), EINVAL);
}

TEST_F(CommandsTest, ExtendedCreateCqRejectsUnsupportedFlags)
{
	init_context(0);
	struct {
		ib_uverbs_ex_create_cq_resp core;
	} resp{};
	ib_uverbs_ex_create_cq cmd{};
	cmd.cqe = 8;
	cmd.comp_channel = -1;
	cmd.flags = 1u << 5;  // no such flag
	EXPECT_EQ(run_ex(IB_USER_VERBS_EX_CMD_CREATE_CQ, cmd, &resp, sizeof(resp)), EOPNOTSUPP);
	cmd.flags = 0;
	cmd.comp_mask = 4;
	EXPECT_EQ(run_ex(IB_USER_VERBS_EX_CMD_CREATE_CQ, cmd, &resp, sizeof(resp)), EINVAL);
	cmd.comp_mask = 0;
	ASSERT_EQ(run_ex(IB_USER_VERBS_EX_CMD_CREATE_CQ, cmd, &resp, sizeof(resp)), 0);
	EXPECT_EQ(resp.core.base.cqe, 8u);
	EXPECT_EQ(resp.core.response_length, sizeof(resp.core));
}

TEST_F(CommandsTest, DestroyingAContextFreesEverything)
{
	init_context(2);
	uint32_t pd = alloc_pd();
	std::vector<char> buf(64);
	ib_uverbs_reg_mr_resp mr{};
	ASSERT_EQ(reg_mr(pd, buf.data(), buf.size(), 0, mr), 0);
	int ch;
	ASSERT_EQ(create_channel(ch), 0);
	uint32_t cq;
	ASSERT_EQ(create_cq(4, ch, cq), 0);
	EXPECT_EQ(ctx.object_count(), 4u);
	destroy_context_objects(ctx);
	EXPECT_EQ(ctx.object_count(), 0u);
	EXPECT_TRUE(dev.mrs_by_index.empty());
	EXPECT_TRUE(ctx.channel_pool.empty());
}

TEST_F(CommandsTest, PdsGetDeviceWideIds)
{
	init_context();
	uint32_t id1 = 0, id2 = 0;
	uint32_t pd1 = alloc_pd(&id1), pd2 = alloc_pd(&id2);
	EXPECT_NE(id1, 0u);
	EXPECT_NE(id1, id2);
	EXPECT_EQ(std::get<Pd>(ctx.objects.at(pd1)).pd_id, PdId(id1));
	EXPECT_EQ(dev.pd_ids.size(), 2u);
	ib_uverbs_dealloc_pd dealloc{pd2};
	ASSERT_EQ(run(IB_USER_VERBS_CMD_DEALLOC_PD, dealloc), 0);
	EXPECT_EQ(dev.pd_ids.count(PdId(id2)), 0u);
	uint32_t id3 = 0;
	alloc_pd(&id3);
	EXPECT_NE(id3, id2);  // not reused at once
}

TEST_F(CommandsTest, MrTableEntriesFollowRegistration)
{
	init_context();
	uint32_t pd_id = 0;
	uint32_t pd = alloc_pd(&pd_id);
	std::vector<char> buf(8192);
	ib_uverbs_reg_mr_resp mr{};
	uint32_t access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	ASSERT_EQ(reg_mr(pd, buf.data(), buf.size(), access, mr), 0);
	ASSERT_LT(mr.lkey >> 8, uint32_t(XSRC_MR_TABLE_LEN));
	const xsrc_mr_entry &e = arena().mr_entry(mr.lkey >> 8);
	EXPECT_EQ(e.key, mr.lkey);
	EXPECT_EQ(e.pd_id, pd_id);
	EXPECT_EQ(e.access, access);
	EXPECT_EQ(e.owner_pid, uint32_t(getpid()));
	EXPECT_EQ(e.addr, reinterpret_cast<uintptr_t>(buf.data()));
	EXPECT_EQ(e.length, buf.size());
	EXPECT_EQ(e.iova, reinterpret_cast<uintptr_t>(buf.data()));

	ib_uverbs_dereg_mr dereg{mr.mr_handle};
	ASSERT_EQ(run(IB_USER_VERBS_CMD_DEREG_MR, dereg), 0);
	EXPECT_EQ(e.key, 0u);
	EXPECT_EQ(e.addr, 0u);
}

TEST_F(CommandsTest, CqRingsAreLaidOutForTheDataPath)
{
	init_context();
	uint32_t cq;
	uint64_t off = 0;
	ASSERT_EQ(create_cq(100, -1, cq, &off), 0);
	ASSERT_NE(off, 0u);
	EXPECT_EQ(off % 4096, 0u);
	EXPECT_TRUE(arena().allocated(off));
	auto &ring = arena().at<xsrc_cq_ring>(off);
	EXPECT_EQ(ring.num_entries, 256u);  // pow2 >= 2 * (100 + 1)
	EXPECT_EQ(ring.cqe, 100u);
	EXPECT_EQ(ring.owner_pid, uint32_t(getpid()));
	EXPECT_EQ(ring.head, 0u);
	EXPECT_EQ(ring.tail, 0u);
	EXPECT_EQ(ring.armed, uint32_t(XSRC_CQ_ARMED_NONE));
	auto *slots = reinterpret_cast<xsrc_cqe *>(&ring + 1);
	for (uint32_t i = 0; i < ring.num_entries; ++i)
		ASSERT_EQ(slots[i].seq, i);
	EXPECT_EQ(dev.cqs_by_ring.at(off).handle, ObjHandle(cq));

	uint32_t small, big;
	uint64_t small_off = 0, big_off = 0;
	ASSERT_EQ(create_cq(1, -1, small, &small_off), 0);
	EXPECT_EQ(arena().at<xsrc_cq_ring>(small_off).num_entries, 64u);  // at least 64
	ASSERT_EQ(create_cq(DeviceLimits::max_cqe, -1, big, &big_off), 0);
	EXPECT_EQ(arena().at<xsrc_cq_ring>(big_off).num_entries, 65536u);  // capped

	ASSERT_EQ(destroy_cq(cq), 0);
	EXPECT_FALSE(arena().allocated(off));
	EXPECT_EQ(dev.cqs_by_ring.count(off), 0u);
}

// Revision 5: a CQ ring carries a pool of big payload slots past its small
// ones, all free and not yet announced to producers (the owner's provider
// does that); a daemon serving an older revision lays out no pool.
TEST_F(CommandsTest, CqRingsCarryBigPayloadSlotsFromRevisionFive)
{
	init_context();
	uint32_t cq;
	uint64_t off = 0;
	ASSERT_EQ(create_cq(100, -1, cq, &off), 0);
	auto &ring = arena().at<xsrc_cq_ring>(off);
	EXPECT_EQ(ring.big_slots, 128u) << "one per entry asked for, in 64s";
	EXPECT_EQ(ring.big_stride, uint32_t(XSRC_CQ_BIG_STRIDE));
	EXPECT_EQ(ring.big_polled, 0u) << "producers may not use the pool before the owner says it polls it";
	uint64_t pool = sizeof(xsrc_cq_ring) + uint64_t(ring.num_entries) * (sizeof(xsrc_cqe) + ring.payload_stride);
	auto *busy = reinterpret_cast<const uint64_t *>(reinterpret_cast<const unsigned char *>(&ring) + pool);
	for (uint32_t w = 0; w < ring.big_slots / 64; ++w)
		EXPECT_EQ(busy[w], 0u) << "slot word " << w;
	// The last byte of the last slot is inside the allocation.
	uint64_t end = pool + 64 + uint64_t(ring.big_slots) * XSRC_CQ_BIG_STRIDE;
	uint64_t next_off = 0;
	uint32_t next;
	ASSERT_EQ(create_cq(1, -1, next, &next_off), 0);
	EXPECT_EQ(arena().at<xsrc_cq_ring>(next_off).big_slots, 64u) << "at least 64";
	uint32_t large;
	uint64_t large_off = 0;
	ASSERT_EQ(create_cq(4096, -1, large, &large_off), 0);
	EXPECT_EQ(arena().at<xsrc_cq_ring>(large_off).big_slots, uint32_t(XSRC_CQ_BIG_SLOTS)) << "at most";
	EXPECT_TRUE(next_off >= off + end || next_off < off) << "the next ring overlaps the pool";

	dev.abi_revision = 4;
	uint32_t old;
	uint64_t old_off = 0;
	ASSERT_EQ(create_cq(100, -1, old, &old_off), 0);
	EXPECT_EQ(arena().at<xsrc_cq_ring>(old_off).big_slots, 0u);
	EXPECT_EQ(arena().at<xsrc_cq_ring>(old_off).big_stride, 0u);
}

TEST_F(CommandsTest, ResizeCqInPlaceOrToANewRing)
{
	init_context();
	uint32_t cq;
	uint64_t off = 0;
	ASSERT_EQ(create_cq(16, -1, cq, &off), 0);  // 64 slots
	auto &ring = arena().at<xsrc_cq_ring>(off);
	auto resize = [&](uint32_t cqe, uint64_t &new_off) {
		Resp<ib_uverbs_resize_cq_resp, xsrc_resize_cq_resp> resp;
		ib_uverbs_resize_cq cmd{};
		cmd.response = reinterpret_cast<uintptr_t>(&resp);
		cmd.cq_handle = cq;
		cmd.cqe = cqe;
		int err = run(IB_USER_VERBS_CMD_RESIZE_CQ, cmd, {}, sizeof(resp));
		new_off = resp.drv().ring_off;
		if (!err) {
			EXPECT_EQ(resp.core().cqe, cqe);
		}
		return err;
	};
	uint64_t got = 0;
	ASSERT_EQ(resize(63, got), 0);  // still fits 64 slots
	EXPECT_EQ(got, off);
	EXPECT_EQ(ring.cqe, 63u);

	// Ten unpolled completions: shrinking below them is refused.
	ring.tail = 10;
	EXPECT_EQ(resize(9, got), EINVAL);
	ASSERT_EQ(resize(10, got), 0);

	ring.armed = XSRC_CQ_ARMED_NEXT;
	ASSERT_EQ(resize(1000, got), 0);
	ASSERT_NE(got, off);
	auto &moved = arena().at<xsrc_cq_ring>(got);
	EXPECT_EQ(moved.num_entries, 2048u);
	EXPECT_EQ(moved.cqe, 1000u);
	EXPECT_EQ(moved.armed, uint32_t(XSRC_CQ_ARMED_NEXT));  // an armed CQ stays armed
	EXPECT_TRUE(arena().allocated(off));  // the owner still drains the old ring
	EXPECT_EQ(dev.cqs_by_ring.at(off).handle, ObjHandle(cq));
	EXPECT_EQ(dev.cqs_by_ring.at(got).handle, ObjHandle(cq));
	EXPECT_EQ(resize(0, got), EINVAL);
	EXPECT_EQ(resize(DeviceLimits::max_cqe + 1, got), EINVAL);

	ASSERT_EQ(destroy_cq(cq), 0);
	EXPECT_EQ(arena().allocation_count(), 0u);
	EXPECT_TRUE(dev.cqs_by_ring.empty());
}

TEST_F(CommandsTest, ExtendedResponsesPutDriverDataAfterTheCallersCoreRoom)
{
	init_context(0);
	// A newer caller with 8 more bytes of core response room than we fill.
	struct {
		ib_uverbs_ex_create_cq_resp core;
		uint64_t newer_field;
		xsrc_create_cq_resp drv;
	} resp{};
	resp.newer_field = ~0ull;
	ib_uverbs_ex_create_cq cmd{};
	cmd.cqe = 8;
	cmd.comp_channel = -1;
	ASSERT_EQ(run_ex(IB_USER_VERBS_EX_CMD_CREATE_CQ, cmd, &resp, sizeof(resp.core) + 8, sizeof(resp.drv)), 0);
	EXPECT_EQ(resp.newer_field, 0u);  // zero-filled, as the kernel does
	EXPECT_NE(resp.drv.ring_off, 0u);
	EXPECT_EQ(resp.drv.ring_off, std::get<Cq>(ctx.objects.at(resp.core.base.cq_handle)).ring_off);
}

}  // namespace
}  // namespace xsrc
