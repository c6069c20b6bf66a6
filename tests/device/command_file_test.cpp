// command_file: the uverbs write ABI of a real, open context's command file
// (ibv_context::cmd_fd) under malformed and hostile input. Each case asserts
// the exact errno write() returns; the reference is the kernel's
// ib_uverbs_write()/verify_hdr() (drivers/infiniband/core/uverbs_main.c).
// After every case the same context must still work: the daemon keeps serving.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include <random>

#include "device_test_util.h"

using namespace xsrc_test;

namespace {

class CommandFile : public ::testing::Test {
protected:
	// A device of our own: object counts on it are this test's alone.
	static void SetUpTestSuite()
	{
		dev_ = new PrivateDevice("xsrccmd");
		ASSERT_TRUE(dev_->up()) << dev_->output();
		ctx_ = open_device(dev_->name());
		ASSERT_NE(ctx_, nullptr) << "ibv_open_device(" << dev_->name() << "): " << strerror(errno);
		auto st = dev_->status();
		ASSERT_TRUE(st);
		base_objects_ = st->objects;
	}

	static void TearDownTestSuite()
	{
		if (ctx_)
			ibv_close_device(ctx_);
		ctx_ = nullptr;
		delete dev_;
		dev_ = nullptr;
	}

	static std::optional<DeviceStatus> status() { return dev_->status(); }

	void SetUp() override
	{
		ASSERT_NE(ctx_, nullptr);
		fd_ = ctx_->cmd_fd;
	}

	// After every case: the context still answers, and nothing leaked.
	void TearDown() override
	{
		if (!ctx_)
			return;
		ibv_port_attr port{};
		EXPECT_EQ(ibv_query_port(ctx_, 1, &port), 0) << "context broken after this case";
		auto st = status();
		ASSERT_TRUE(st) << "the device disappeared";
		EXPECT_EQ(st->objects, base_objects_) << "this case leaked (or destroyed) objects";
	}

	// A page that is mapped but read-only, and an address that is unmapped.
	static void *read_only_page()
	{
		void *p = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		EXPECT_NE(p, MAP_FAILED);
		return p;
	}
	static void *unmapped_address()
	{
		void *p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		EXPECT_NE(p, MAP_FAILED);
		munmap(p, 4096);
		return p;
	}

	static std::vector<std::byte> query_device_cmd(void *resp, size_t out_bytes)
	{
		ib_uverbs_query_device cmd{};
		cmd.response = ptr(resp);
		return legacy_cmd(IB_USER_VERBS_CMD_QUERY_DEVICE, cmd, out_bytes);
	}

	static inline PrivateDevice *dev_ = nullptr;
	static inline ibv_context *ctx_ = nullptr;
	static inline int base_objects_ = 0;
	int fd_ = -1;
};

// --- the positive control: the raw encoding used below is right ------------

TEST_F(CommandFile, RawQueryDeviceMatchesIbvQueryDevice)
{
	ib_uverbs_query_device_resp resp{};
	ASSERT_EQ(raw_write(fd_, query_device_cmd(&resp, sizeof(resp))), 0);
	ibv_device_attr attr{};
	ASSERT_EQ(ibv_query_device(ctx_, &attr), 0);
	EXPECT_EQ(resp.node_guid, attr.node_guid);
	EXPECT_EQ(resp.max_cqe, static_cast<uint32_t>(attr.max_cqe));
	EXPECT_EQ(resp.phys_port_cnt, attr.phys_port_cnt);
}

TEST_F(CommandFile, RawAllocAndDeallocPd)
{
	uint32_t h = ~0u;
	ASSERT_EQ(raw_alloc_pd(fd_, &h), 0);
	EXPECT_EQ(status()->objects, base_objects_ + 1);
	EXPECT_EQ(raw_dealloc_pd(fd_, h), 0);
	EXPECT_EQ(raw_dealloc_pd(fd_, h), EINVAL) << "already destroyed";
}

TEST_F(CommandFile, ResponseIsZeroFilledPastTheCoreStruct)
{
	// Room for more than the core response: the rest is zeroed, as the kernel does.
	std::vector<uint8_t> buf(sizeof(ib_uverbs_query_device_resp) + 64, 0xee);
	ASSERT_EQ(raw_write(fd_, query_device_cmd(buf.data(), buf.size())), 0);
	for (size_t i = sizeof(ib_uverbs_query_device_resp); i < buf.size(); ++i)
		ASSERT_EQ(buf[i], 0) << "byte " << i;
}

// --- framing ------------------------------------------------------------------

TEST_F(CommandFile, ShortWritesAreEinval)
{
	uint8_t buf[8] = {0};
	for (size_t len : {1, 4, 7}) {
		EXPECT_EQ(raw_write(fd_, buf, len), EINVAL) << len << "-byte write";
	}
	// A valid QUERY_DEVICE header cut to 4 bytes.
	ib_uverbs_query_device_resp resp{};
	auto cmd = query_device_cmd(&resp, sizeof(resp));
	EXPECT_EQ(raw_write(fd_, cmd.data(), 4), EINVAL);
}

TEST_F(CommandFile, ZeroLengthWriteIsHarmless)
{
	char c = 0;
	errno = 0;
	ssize_t n = write(fd_, &c, 0);
	EXPECT_TRUE(n == 0 || (n < 0 && errno == EINVAL)) << "n=" << n << " errno=" << errno;
}

TEST_F(CommandFile, GarbageIsEinval)
{
	std::mt19937 rng(1234);
	for (size_t len : {8, 16, 24, 64, 100, 4096}) {
		std::vector<uint8_t> buf(len);
		for (auto &b : buf)
			b = static_cast<uint8_t>(rng());
		buf[1] |= 0x01;  // command bits 8..15 set: not a command number, not a flag
		EXPECT_EQ(raw_write(fd_, buf.data(), buf.size()), EINVAL) << len << " bytes of garbage";
	}
	std::vector<uint8_t> ff(64, 0xff);
	EXPECT_EQ(raw_write(fd_, ff.data(), ff.size()), EINVAL);
}

TEST_F(CommandFile, InWordsMismatchIsEinval)
{
	ib_uverbs_query_device_resp resp{};
	auto cmd = query_device_cmd(&resp, sizeof(resp));
	auto *hdr = reinterpret_cast<ib_uverbs_cmd_hdr *>(cmd.data());
	uint16_t right = hdr->in_words;
	for (int delta : {+1, -1, +100}) {
		hdr->in_words = static_cast<uint16_t>(right + delta);
		EXPECT_EQ(raw_write(fd_, cmd), EINVAL) << "in_words " << hdr->in_words
						       << " for a " << cmd.size() << "-byte write";
	}
	hdr->in_words = 0;
	EXPECT_EQ(raw_write(fd_, cmd), EINVAL);
	// Extra bytes after a correct in_words: the write is longer than in_words says.
	hdr->in_words = right;
	cmd.resize(cmd.size() + 8);
	EXPECT_EQ(raw_write(fd_, cmd), EINVAL);
}

TEST_F(CommandFile, OversizedGarbageIsEinval)
{
	std::vector<uint8_t> big(1 << 20, 0x5a);
	EXPECT_EQ(raw_write(fd_, big.data(), big.size()), EINVAL);
	// A plausible header claiming the largest in_words, followed by 1 MiB.
	auto *hdr = reinterpret_cast<ib_uverbs_cmd_hdr *>(big.data());
	hdr->command = IB_USER_VERBS_CMD_QUERY_DEVICE;
	hdr->in_words = 0xffff;
	hdr->out_words = 0;
	EXPECT_EQ(raw_write(fd_, big.data(), big.size()), EINVAL);
}

TEST_F(CommandFile, UnknownCommandsAreEopnotsupp)
{
	ib_uverbs_query_device_resp resp{};
	ib_uverbs_query_device body{};
	body.response = ptr(&resp);
	for (uint32_t num : {0x7eu, 0xffu, 0x40u, 0xefu}) {
		EXPECT_EQ(raw_write(fd_, legacy_cmd(num, body, sizeof(resp))), EOPNOTSUPP)
			<< "command " << std::hex << num;
	}
	// Core commands this device does not implement (the kernel-side poll)
	// are unknown too.
	EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_POLL_CQ, body, sizeof(resp))),
		  EOPNOTSUPP);
	ib_uverbs_ex_query_device ex{};
	for (uint32_t num : {0x7eu, 0xffu}) {
		EXPECT_EQ(raw_write(fd_, ex_cmd(num, ex, ptr(&resp), 8)), EOPNOTSUPP)
			<< "extended command " << std::hex << num;
	}
}

TEST_F(CommandFile, UndefinedFlagBitsAreEinval)
{
	ib_uverbs_query_device_resp resp{};
	auto good = query_device_cmd(&resp, sizeof(resp));
	for (uint32_t bit : {1u << 8, 1u << 16, 1u << 24, 1u << 30}) {
		auto cmd = good;
		reinterpret_cast<ib_uverbs_cmd_hdr *>(cmd.data())->command |= bit;
		EXPECT_EQ(raw_write(fd_, cmd), EINVAL) << "bit " << std::hex << bit;
	}
}

// --- the extended header --------------------------------------------------------

TEST_F(CommandFile, ExtendedHeaderLengths)
{
	ib_uverbs_ex_query_device_resp resp{};
	ib_uverbs_ex_query_device core{};
	// The positive control.
	auto good = ex_cmd(IB_USER_VERBS_EX_CMD_QUERY_DEVICE, core, ptr(&resp), sizeof(resp));
	ASSERT_EQ(raw_write(fd_, good), 0);
	EXPECT_GE(resp.response_length, offsetof(ib_uverbs_ex_query_device_resp, odp_caps));

	// Shorter than the two headers.
	EXPECT_EQ(raw_write(fd_, good.data(), sizeof(ib_uverbs_cmd_hdr) + 8), EINVAL);
	// in_words / provider_in_words disagree with the write's length.
	for (int delta : {+1, -1}) {
		auto cmd = good;
		reinterpret_cast<ib_uverbs_cmd_hdr *>(cmd.data())->in_words += delta;
		EXPECT_EQ(raw_write(fd_, cmd), EINVAL) << "in_words delta " << delta;
	}
	{
		auto cmd = good;
		reinterpret_cast<ib_uverbs_ex_cmd_hdr *>(cmd.data() + sizeof(ib_uverbs_cmd_hdr))
			->provider_in_words = 3;
		EXPECT_EQ(raw_write(fd_, cmd), EINVAL);
	}
	{
		auto cmd = good;
		cmd.resize(cmd.size() + 8);  // 8 bytes no header field accounts for
		EXPECT_EQ(raw_write(fd_, cmd), EINVAL);
	}
}

TEST_F(CommandFile, ExtendedHeaderReservedMustBeZero)
{
	ib_uverbs_ex_query_device_resp resp{};
	ib_uverbs_ex_query_device core{};
	auto cmd = ex_cmd(IB_USER_VERBS_EX_CMD_QUERY_DEVICE, core, ptr(&resp), sizeof(resp));
	reinterpret_cast<ib_uverbs_ex_cmd_hdr *>(cmd.data() + sizeof(ib_uverbs_cmd_hdr))
		->cmd_hdr_reserved = 1;
	EXPECT_EQ(raw_write(fd_, cmd), EINVAL);
}

TEST_F(CommandFile, ExtendedCoreReservedAndCompMask)
{
	ib_uverbs_ex_query_device_resp resp{};
	ib_uverbs_ex_query_device core{};
	core.reserved = 1;
	EXPECT_EQ(raw_write(fd_, ex_cmd(IB_USER_VERBS_EX_CMD_QUERY_DEVICE, core, ptr(&resp), sizeof(resp))),
		  EINVAL);
	core = {};
	core.comp_mask = 1;
	EXPECT_EQ(raw_write(fd_, ex_cmd(IB_USER_VERBS_EX_CMD_QUERY_DEVICE, core, ptr(&resp), sizeof(resp))),
		  EINVAL);
	// A longer core from a "newer" caller: fine while the unknown tail is zero ...
	struct {
		ib_uverbs_ex_query_device known;
		uint64_t future;
	} longer{};
	EXPECT_EQ(raw_write(fd_, ex_cmd(IB_USER_VERBS_EX_CMD_QUERY_DEVICE, longer, ptr(&resp), sizeof(resp))),
		  0);
	// ... and refused once it is not (ib_is_udata_cleared).
	longer.future = 1;
	EXPECT_EQ(raw_write(fd_, ex_cmd(IB_USER_VERBS_EX_CMD_QUERY_DEVICE, longer, ptr(&resp), sizeof(resp))),
		  EOPNOTSUPP);
}

// Kernel parity: verify_hdr() answers ENOSPC when the core request is shorter
// than the command's struct, and EINVAL for an extended command whose response
// pointer and out_words disagree (one zero, the other not).
TEST_F(CommandFile, KernelParity_ShortCoreRequestIsEnospc)
{
	// CREATE_CQ is 32 bytes of core; send only its first 8 (the response pointer).
	ib_uverbs_create_cq_resp resp{};
	uint64_t just_response = ptr(&resp);
	EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_CREATE_CQ, just_response, sizeof(resp))),
		  ENOSPC);
	// Extended: EX_CREATE_CQ with 8 of its 32 core bytes.
	uint64_t user_handle = 0;
	EXPECT_EQ(raw_write(fd_, ex_cmd(IB_USER_VERBS_EX_CMD_CREATE_CQ, user_handle, ptr(&resp), 32)),
		  ENOSPC);
}

TEST_F(CommandFile, KernelParity_ExtendedResponseAndOutWordsMustAgree)
{
	ib_uverbs_ex_query_device core{};
	ib_uverbs_ex_query_device_resp resp{};
	// A NULL response with out_words > 0.
	EXPECT_EQ(raw_write(fd_, ex_cmd(IB_USER_VERBS_EX_CMD_QUERY_DEVICE, core, 0, sizeof(resp))), EINVAL);
	// A response pointer with out_words == 0 and provider_out_words == 0.
	EXPECT_EQ(raw_write(fd_, ex_cmd(IB_USER_VERBS_EX_CMD_QUERY_DEVICE, core, ptr(&resp), 0)), EINVAL);
}

// --- the response buffer -----------------------------------------------------

TEST_F(CommandFile, NullResponseIsEfault)
{
	EXPECT_EQ(raw_write(fd_, query_device_cmd(nullptr, sizeof(ib_uverbs_query_device_resp))), EFAULT);
	ib_uverbs_alloc_pd pd{};
	EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_ALLOC_PD, pd, sizeof(ib_uverbs_alloc_pd_resp))),
		  EFAULT);
	// (TearDown checks that the failed ALLOC_PD left no PD behind.)
}

TEST_F(CommandFile, UnmappedOrReadOnlyResponseIsEfault)
{
	void *ro = read_only_page();
	void *gone = unmapped_address();
	for (void *where : {ro, gone}) {
		EXPECT_EQ(raw_write(fd_, query_device_cmd(where, sizeof(ib_uverbs_query_device_resp))), EFAULT);
		ib_uverbs_alloc_pd pd{};
		pd.response = ptr(where);
		EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_ALLOC_PD, pd,
						    sizeof(ib_uverbs_alloc_pd_resp))),
			  EFAULT);
		ib_uverbs_create_cq cq{};
		cq.response = ptr(where);
		cq.cqe = 4;
		cq.comp_channel = -1;
		EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_CREATE_CQ, cq,
						    sizeof(ib_uverbs_create_cq_resp))),
			  EFAULT);
		ib_uverbs_create_comp_channel ch{};
		ch.response = ptr(where);
		EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL, ch,
						    sizeof(ib_uverbs_create_comp_channel_resp))),
			  EFAULT);
	}
	// A response that starts mapped and runs into the unmapped page.
	auto *two = static_cast<char *>(mmap(nullptr, 8192, PROT_READ | PROT_WRITE,
					     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
	ASSERT_NE(two, MAP_FAILED);
	munmap(two + 4096, 4096);
	char *straddle = two + 4096 - 16;
	EXPECT_EQ(raw_write(fd_, query_device_cmd(straddle, sizeof(ib_uverbs_query_device_resp))), EFAULT);
	munmap(two, 4096);
	munmap(ro, 4096);
	// A failed CREATE_COMP_CHANNEL must not have used up a pooled channel:
	ibv_comp_channel *channel = ibv_create_comp_channel(ctx_);
	ASSERT_NE(channel, nullptr) << strerror(errno);
	ibv_cq *cq = ibv_create_cq(ctx_, 4, nullptr, channel, 0);
	ASSERT_NE(cq, nullptr) << strerror(errno);
	EXPECT_EQ(ibv_destroy_cq(cq), 0);
	EXPECT_EQ(ibv_destroy_comp_channel(channel), 0);
	// (A destroyed channel may stay counted: see ObjectsTest in objects_test.py.
	// Re-base so TearDown checks only this case's other objects.)
	base_objects_ = status()->objects;
}

TEST_F(CommandFile, OutWordsTooSmallIsEnospc)
{
	ib_uverbs_query_device_resp resp{};
	for (size_t out : {size_t{0}, size_t{4}, sizeof(resp) - 4}) {
		EXPECT_EQ(raw_write(fd_, query_device_cmd(&resp, out)), ENOSPC) << "out bytes " << out;
	}
	ib_uverbs_alloc_pd_resp pd_resp{};
	ib_uverbs_alloc_pd pd{};
	pd.response = ptr(&pd_resp);
	EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_ALLOC_PD, pd, 0)), ENOSPC);
	// Extended: less room than the minimum (up to response_length).
	ib_uverbs_ex_query_device core{};
	ib_uverbs_ex_query_device_resp ex_resp{};
	EXPECT_EQ(raw_write(fd_, ex_cmd(IB_USER_VERBS_EX_CMD_QUERY_DEVICE, core, ptr(&ex_resp), 8)), ENOSPC);
}

TEST_F(CommandFile, NonZeroDriverDataIsEopnotsupp)
{
	ib_uverbs_query_device_resp resp{};
	ib_uverbs_query_device body{};
	body.response = ptr(&resp);
	auto cmd = legacy_cmd(IB_USER_VERBS_CMD_QUERY_DEVICE, body, sizeof(resp), 16);
	EXPECT_EQ(raw_write(fd_, cmd), 0) << "zeroed driver data is fine";
	cmd.back() = std::byte{1};
	EXPECT_EQ(raw_write(fd_, cmd), EOPNOTSUPP);
}

// --- handles --------------------------------------------------------------------

TEST_F(CommandFile, WrongHandlesAreEinval)
{
	// Never allocated.
	for (uint32_t h : {0x7fffffffu, 0xffffffffu, 123456u}) {
		EXPECT_EQ(raw_dealloc_pd(fd_, h), EINVAL);
		EXPECT_EQ(raw_dereg_mr(fd_, h), EINVAL);
		EXPECT_EQ(raw_destroy_cq(fd_, h), EINVAL);
	}
	// Handles of the wrong type.
	ibv_pd *pd = ibv_alloc_pd(ctx_);
	ASSERT_NE(pd, nullptr);
	ibv_cq *cq = ibv_create_cq(ctx_, 4, nullptr, nullptr, 0);
	ASSERT_NE(cq, nullptr);
	static char buf[4096];
	ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(mr, nullptr);
	EXPECT_EQ(raw_destroy_cq(fd_, pd->handle), EINVAL) << "PD handle used as a CQ handle";
	EXPECT_EQ(raw_dereg_mr(fd_, cq->handle), EINVAL) << "CQ handle used as an MR handle";
	EXPECT_EQ(raw_dealloc_pd(fd_, mr->handle), EINVAL) << "MR handle used as a PD handle";
	EXPECT_EQ(raw_reg_mr(fd_, cq->handle, buf, sizeof(buf), IB_UVERBS_ACCESS_LOCAL_WRITE), EINVAL)
		<< "CQ handle used as the PD of an MR";
	{
		ib_uverbs_req_notify_cq cmd{};
		cmd.cq_handle = pd->handle;
		EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, cmd, 0)), EINVAL);
		ib_uverbs_resize_cq_resp rr{};
		ib_uverbs_resize_cq rc{};
		rc.response = ptr(&rr);
		rc.cq_handle = mr->handle;
		rc.cqe = 8;
		EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_RESIZE_CQ, rc, sizeof(rr))), EINVAL);
	}
	// A PD in use by an MR cannot go (the kernel says EBUSY too).
	EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
	// Everything still works through libibverbs.
	EXPECT_EQ(ibv_dereg_mr(mr), 0);
	EXPECT_EQ(ibv_destroy_cq(cq), 0);
	uint32_t pd_handle = pd->handle;
	EXPECT_EQ(ibv_dealloc_pd(pd), 0);
	// Already destroyed.
	EXPECT_EQ(raw_dealloc_pd(fd_, pd_handle), EINVAL);
}

TEST_F(CommandFile, DestroyedCqHandleIsEinval)
{
	ibv_cq *cq = ibv_create_cq(ctx_, 4, nullptr, nullptr, 0);
	ASSERT_NE(cq, nullptr);
	uint32_t h = cq->handle;
	ASSERT_EQ(ibv_destroy_cq(cq), 0);
	EXPECT_EQ(raw_destroy_cq(fd_, h), EINVAL);
}

TEST_F(CommandFile, BadCreateCqArguments)
{
	ib_uverbs_create_cq_resp resp{};
	ib_uverbs_create_cq cmd{};
	cmd.response = ptr(&resp);
	cmd.cqe = 4;
	cmd.comp_channel = 9999;  // no such channel in this context
	EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_CREATE_CQ, cmd, sizeof(resp))), EINVAL);
	cmd.comp_channel = ctx_->cmd_fd;  // an fd, but not a channel
	EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_CREATE_CQ, cmd, sizeof(resp))), EINVAL);
	cmd.comp_channel = -2;
	EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_CREATE_CQ, cmd, sizeof(resp))), EINVAL);
	cmd.comp_channel = -1;
	cmd.cqe = 0;
	EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_CREATE_CQ, cmd, sizeof(resp))), EINVAL);
	cmd.cqe = 4;
	cmd.comp_vector = 1000;
	EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_CREATE_CQ, cmd, sizeof(resp))), EINVAL);
	cmd.comp_vector = 0;
	cmd.reserved = 1;
	EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_CREATE_CQ, cmd, sizeof(resp))), EINVAL);
}

TEST_F(CommandFile, CreateCqExWithChannel)
{
	ibv_comp_channel *channel = ibv_create_comp_channel(ctx_);
	ASSERT_NE(channel, nullptr) << strerror(errno);
	ibv_cq_init_attr_ex attr{};
	attr.cqe = 16;
	attr.channel = channel;
	attr.wc_flags = IBV_WC_STANDARD_FLAGS;
	ibv_cq_ex *cq = ibv_create_cq_ex(ctx_, &attr);
	ASSERT_NE(cq, nullptr) << strerror(errno);
	EXPECT_EQ(ibv_req_notify_cq(ibv_cq_ex_to_cq(cq), 0), 0);
	ibv_poll_cq_attr pattr{};
	EXPECT_EQ(ibv_start_poll(cq, &pattr), ENOENT);
	EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
	EXPECT_EQ(ibv_destroy_comp_channel(channel), 0);
	base_objects_ = status()->objects;  // see UnmappedOrReadOnlyResponseIsEfault
}

// --- context-level commands ------------------------------------------------------

TEST_F(CommandFile, SecondGetContextIsEinval)
{
	ib_uverbs_get_context_resp resp{};
	ib_uverbs_get_context cmd{};
	cmd.response = ptr(&resp);
	EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_GET_CONTEXT, cmd, sizeof(resp), 88)), EINVAL);
	EXPECT_EQ(raw_write(fd_, legacy_cmd(IB_USER_VERBS_CMD_GET_CONTEXT, cmd, sizeof(resp))), EINVAL);
}

TEST_F(CommandFile, IoctlIsEnotty)
{
	char arg[64] = {};
	errno = 0;
	EXPECT_EQ(ioctl(fd_, _IOWR(0x1b, 1, char[24]), arg), -1);  // RDMA_VERBS_IOCTL
	EXPECT_EQ(errno, ENOTTY);
	errno = 0;
	EXPECT_EQ(ioctl(fd_, TCGETS, arg), -1);  // (FIONREAD would be answered by the VFS)
	EXPECT_EQ(errno, ENOTTY);
}

TEST_F(CommandFile, ReadAndSeekFail)
{
	char buf[64];
	errno = 0;
	EXPECT_EQ(read(fd_, buf, sizeof(buf)), -1);
	EXPECT_NE(errno, 0);
	errno = 0;
	EXPECT_EQ(lseek(fd_, 0, SEEK_SET), -1);
	EXPECT_EQ(errno, ESPIPE);
}

TEST_F(CommandFile, CommandsBeforeGetContextAreEinval)
{
	// A command file of our own (same directory the provider uses), before GET_CONTEXT.
	std::string dir = run("cat \"$SYSFS_PATH/class/infiniband/" + dev_->name() + "/xsrc_cmd_dir\"");
	while (!dir.empty() && dir.back() == '\n')
		dir.pop_back();
	ASSERT_FALSE(dir.empty());
	std::string path = dir + "/ctx-test-" + std::to_string(getpid());
	int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	ASSERT_GE(fd, 0) << path << ": " << strerror(errno);
	EXPECT_EQ(raw_write(fd, query_device_cmd(nullptr, 0)), EINVAL);
	uint32_t h;
	EXPECT_EQ(raw_alloc_pd(fd, &h), EINVAL);
	// GET_CONTEXT without the xsrc driver data (a generic caller) is refused.
	ib_uverbs_get_context_resp resp{};
	ib_uverbs_get_context cmd{};
	cmd.response = ptr(&resp);
	EXPECT_EQ(raw_write(fd, legacy_cmd(IB_USER_VERBS_CMD_GET_CONTEXT, cmd, sizeof(resp))), EINVAL);
	auto during = status();
	close(fd);
	ASSERT_TRUE(during);
	EXPECT_TRUE(wait_until(std::chrono::seconds(5), [&] {
		auto st = status();
		return st && st->contexts == during->contexts - 1;
	})) << "closing an uninitialised command file did not release its context";
}

TEST_F(CommandFile, ContextStillWorksAfterEverything)
{
	ibv_device_attr attr{};
	ASSERT_EQ(ibv_query_device(ctx_, &attr), 0);
	EXPECT_GT(attr.max_cqe, 0);
	ibv_pd *pd = ibv_alloc_pd(ctx_);
	ASSERT_NE(pd, nullptr) << strerror(errno);
	static char buf[8192];
	ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	ASSERT_NE(mr, nullptr) << strerror(errno);
	EXPECT_EQ(ibv_dereg_mr(mr), 0);
	EXPECT_EQ(ibv_dealloc_pd(pd), 0);
	// And a fresh context opens as well.
	ibv_context *other = open_device(dev_->name());
	ASSERT_NE(other, nullptr) << strerror(errno);
	EXPECT_EQ(ibv_close_device(other), 0);
}

}  // namespace
