// The driver ABI discipline on a real command file (kernel-abi/README.md):
// a hand-built GET_CONTEXT as a revision-1 provider sends it gets the r1
// bytes and nothing past them; trailing non-zero driver bytes are refused;
// the device reports the revision it serves and has XSRC_CMD_COPY only from
// revision 2.
//   XSRC_TEST_DEVICE          device (default xsrc0)
//   XSRC_EXPECT_ABI_REVISION  the revision the device serves (default: the
//                             one this test was built against)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "device_test_util.h"
#include "xsrc-abi.h"

namespace {

using namespace xsrc_test;

constexpr unsigned char kCanary = 0xa5;
constexpr size_t kCore = sizeof(ib_uverbs_get_context_resp);
constexpr size_t kR1Driver = offsetof(xsrc_get_context_resp, caller_pid);

uint32_t expected_revision()
{
	return static_cast<uint32_t>(std::stoul(env_or("XSRC_EXPECT_ABI_REVISION",
						       std::to_string(XSRC_DRIVER_ABI_REVISION).c_str())));
}

class CommandFileAbi : public ::testing::Test {
protected:
	void SetUp() override
	{
		std::ifstream in(env_or("SYSFS_PATH", "/sys") + "/class/infiniband/" + test_device() + "/" +
				 XSRC_SYSFS_CMD_DIR_FILE);
		std::string dir;
		ASSERT_TRUE(std::getline(in, dir)) << "no " << test_device() << " in $SYSFS_PATH";
		static unsigned seq;
		std::string path = dir + "/ctx-abi-" + std::to_string(getpid()) + "-" + std::to_string(seq++);
		fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		ASSERT_GE(fd_, 0) << path << ": " << strerror(errno);
		for (int *p : {async_, chan_})
			ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
	}
	void TearDown() override
	{
		for (int fd : {fd_, async_[0], async_[1], chan_[0], chan_[1]})
			if (fd >= 0)
				close(fd);
	}

	xsrc_get_context_req request() const
	{
		xsrc_get_context_req drv{};
		drv.async_fds = {uint32_t(async_[0]), uint32_t(async_[1])};
		drv.num_channel_fds = 1;
		drv.channel_fds[0] = {uint32_t(chan_[0]), uint32_t(chan_[1])};
		return drv;
	}

	// GET_CONTEXT with `extra` driver bytes after the request and `room`
	// bytes of response room at the start of `out`.
	int get_context(std::vector<unsigned char> &out, size_t room, std::vector<std::byte> extra = {})
	{
		ib_uverbs_get_context cmd{};
		cmd.response = ptr(out.data());
		auto bytes = legacy_cmd(IB_USER_VERBS_CMD_GET_CONTEXT, cmd, room, sizeof(xsrc_get_context_req) + extra.size());
		auto drv = request();
		auto at = bytes.begin() + ptrdiff_t(sizeof(ib_uverbs_cmd_hdr) + sizeof(cmd));
		std::memcpy(&*at, &drv, sizeof(drv));
		std::copy(extra.begin(), extra.end(), at + ptrdiff_t(sizeof(drv)));
		return raw_write(fd_, bytes);
	}

	static xsrc_get_context_resp driver_part(const std::vector<unsigned char> &buf)
	{
		xsrc_get_context_resp d{};
		std::memcpy(&d, buf.data() + kCore, sizeof(d));
		return d;
	}

	int fd_ = -1;
	int async_[2] = {-1, -1};
	int chan_[2] = {-1, -1};
};

bool all_equal(const std::vector<unsigned char> &buf, size_t from, size_t to, unsigned char v)
{
	return std::all_of(buf.begin() + ptrdiff_t(from), buf.begin() + ptrdiff_t(to),
			   [v](unsigned char b) { return b == v; });
}

// The sysfs abi_version is the generation, whatever revision is served.
TEST_F(CommandFileAbi, SysfsAbiVersionIsTheGeneration)
{
	std::string dir = env_or("SYSFS_PATH", "/sys") + "/class/infiniband_verbs";
	bool found = false;
	for (unsigned i = 0; i < 64 && !found; ++i) {
		std::string base = dir + "/uverbs" + std::to_string(i);
		std::ifstream ibdev(base + "/ibdev");
		std::string name;
		if (!std::getline(ibdev, name) || name != test_device())
			continue;
		found = true;
		std::ifstream abi(base + "/abi_version");
		unsigned version = 0;
		ASSERT_TRUE(abi >> version);
		EXPECT_EQ(version, unsigned(XSRC_DRIVER_ABI_VERSION));
	}
	EXPECT_TRUE(found) << "no uverbs entry for " << test_device();
}

TEST_F(CommandFileAbi, R1RoomGetsR1BytesOnly)
{
	std::vector<unsigned char> buf(kCore + sizeof(xsrc_get_context_resp) + 32, kCanary);
	ASSERT_EQ(get_context(buf, kCore + kR1Driver), 0);
	EXPECT_TRUE(all_equal(buf, kCore + kR1Driver, buf.size(), kCanary)) << "written past the caller's room";
	auto d = driver_part(buf);
	EXPECT_EQ(d.driver_abi, expected_revision());
	EXPECT_NE(d.context_id, 0u);
	EXPECT_GT(d.max_inline_data, 0u);
	EXPECT_EQ(d.channel_pool_free, 1u);
}

TEST_F(CommandFileAbi, FullRoomShowsTheServedRevision)
{
	const size_t room = kCore + sizeof(xsrc_get_context_resp);
	std::vector<unsigned char> buf(room + 16, kCanary);
	ASSERT_EQ(get_context(buf, room), 0);
	EXPECT_TRUE(all_equal(buf, room, buf.size(), kCanary));
	auto d = driver_part(buf);
	EXPECT_EQ(d.driver_abi, expected_revision());
	if (expected_revision() < 2) {
		// As the revision-1 daemon: nothing past channel_pool_free.
		EXPECT_EQ(d.comp_mask & XSRC_GET_CONTEXT_RESP_MASK_CALLER, 0u);
		EXPECT_TRUE(all_equal(buf, kCore + kR1Driver, room, 0));
	}
}

TEST_F(CommandFileAbi, TrailingNonZeroDriverBytesAreEopnotsupp)
{
	std::vector<unsigned char> buf(kCore + sizeof(xsrc_get_context_resp), kCanary);
	std::vector<std::byte> extra(8);
	extra[5] = std::byte{0x40};
	EXPECT_EQ(get_context(buf, buf.size(), extra), EOPNOTSUPP);
	EXPECT_TRUE(all_equal(buf, 0, buf.size(), kCanary));
	// The same with zeros there: a newer caller that uses nothing new.
	EXPECT_EQ(get_context(buf, buf.size(), std::vector<std::byte>(8)), 0);
	EXPECT_EQ(driver_part(buf).driver_abi, expected_revision());
}

TEST_F(CommandFileAbi, CopyExistsFromRevisionTwo)
{
	std::vector<unsigned char> buf(kCore + sizeof(xsrc_get_context_resp), kCanary);
	ASSERT_EQ(get_context(buf, buf.size()), 0);
	xsrc_copy_resp resp{};
	xsrc_copy cmd{};
	cmd.response = ptr(&resp);
	cmd.op = XSRC_COPY_READ;
	cmd.key_kind = XSRC_COPY_RKEY;
	cmd.qp_handle = 12345;  // no such QP
	cmd.length = 8;
	int err = raw_write(fd_, legacy_cmd(XSRC_CMD_COPY, cmd, sizeof(resp)));
	if (expected_revision() < 2) {
		EXPECT_EQ(err, EOPNOTSUPP);
	} else {
		EXPECT_NE(err, EOPNOTSUPP) << "XSRC_CMD_COPY is part of revision 2";
	}
}

}  // namespace
