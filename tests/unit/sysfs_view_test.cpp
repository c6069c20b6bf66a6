// sysfs_view.cpp: the files libibverbs reads, checked one by one and read back the
// way libibverbs reads them (its exported ibv_read_sysfs_file, its buffer sizes,
// its parsing); plus the /dev node and an enumeration run of ibv_devices.
#include <arpa/inet.h>
#include <linux/netlink.h>
#include <net/if.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "sysfs_view.h"

// Exported by libibverbs since IBVERBS_1.0 but declared only in its private driver.h.
extern "C" int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

namespace xsrc {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path &p)
{
	std::ifstream in(p, std::ios::binary);
	std::stringstream ss;
	ss << in.rdbuf();
	return ss.str();
}

Gid gid(const char *s)
{
	in6_addr a{};
	EXPECT_EQ(inet_pton(AF_INET6, s, &a), 1);
	Gid g;
	std::copy(std::begin(a.s6_addr), std::end(a.s6_addr), g.raw.begin());
	return g;
}

class SysfsView : public ::testing::Test {
protected:
	void SetUp() override
	{
		char tmpl[] = "/tmp/xsrc-sysfs-XXXXXX";
		ASSERT_NE(mkdtemp(tmpl), nullptr);
		root_ = tmpl;
		dev_.ibdev = "xsrc7";
		dev_.uverbs_index = 7;
		dev_.driver_abi = 1;
		dev_.node_guid = 0x021122fffe334455ull;
		dev_.cmd_dir = "/run/xsrc/fs/xsrc7";
		dev_.shm_path = "/dev/shm/xsrc-xsrc7";
		dev_.port.active = true;
		dev_.port.active_mtu = 5;
		dev_.port.netdev = "lo";
		dev_.port.gids = {gid("fe80::211:22ff:fe33:4455"), gid("::ffff:127.0.0.1"), gid("::1")};
		dev_.port.gid_tbl_len = 4;
	}
	void TearDown() override { fs::remove_all(root_); }

	fs::path ib() const { return root_ / "class/infiniband" / dev_.ibdev; }
	fs::path port() const { return ib() / "ports/1"; }
	fs::path uv() const { return root_ / "class/infiniband_verbs/uverbs7"; }

	// Every regular file under root_, relative path -> content.
	std::map<std::string, std::string> tree() const
	{
		std::map<std::string, std::string> out;
		for (const auto &e : fs::recursive_directory_iterator(root_))
			if (e.is_regular_file())
				out[fs::relative(e.path(), root_).string()] = slurp(e.path());
		return out;
	}

	fs::path root_;
	DeviceView dev_;
};

TEST_F(SysfsView, WritesExactlyTheExpectedFiles)
{
	char host[256] = {};
	gethostname(host, sizeof(host) - 1);
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	const std::string ib = "class/infiniband/xsrc7/", p = ib + "ports/1/";
	const std::map<std::string, std::string> want = {
		{"class/infiniband_verbs/abi_version", "6\n"},
		{"class/infiniband_verbs/uverbs7/ibdev", "xsrc7\n"},
		{"class/infiniband_verbs/uverbs7/dev", "1:3\n"},
		{"class/infiniband_verbs/uverbs7/abi_version", "1\n"},
		{ib + "node_type", "1: CA\n"},
		{ib + "node_guid", "0211:22ff:fe33:4455\n"},
		{ib + "sys_image_guid", "0211:22ff:fe33:4455\n"},
		{ib + "fw_ver", "1.0.0\n"},
		{ib + "hw_rev", "0\n"},
		{ib + "hca_type", "xsrc\n"},
		{ib + "board_id", "xsrc\n"},
		{ib + "node_desc", std::string(host) + " xsrc7\n"},
		{ib + "xsrc_cmd_dir", "/run/xsrc/fs/xsrc7\n"},
		{ib + "xsrc_shm_path", "/dev/shm/xsrc-xsrc7\n"},
		{p + "state", "4: ACTIVE\n"},
		{p + "phys_state", "5: LinkUp\n"},
		{p + "link_layer", "Ethernet\n"},
		{p + "rate", "100 Gb/sec (4X EDR)\n"},
		{p + "lid", "0x0\n"},
		{p + "sm_lid", "0x0\n"},
		{p + "lid_mask_count", "0\n"},
		{p + "sm_sl", "0\n"},
		{p + "cap_mask", "0x04010000\n"},
		{p + "pkeys/0", "0xffff\n"},
		{p + "gids/0", "fe80:0000:0000:0000:0211:22ff:fe33:4455\n"},
		{p + "gids/1", "0000:0000:0000:0000:0000:ffff:7f00:0001\n"},
		{p + "gids/2", "0000:0000:0000:0000:0000:0000:0000:0001\n"},
		{p + "gids/3", "0000:0000:0000:0000:0000:0000:0000:0000\n"},
		{p + "gid_attrs/types/0", "RoCE v2\n"},
		{p + "gid_attrs/types/1", "RoCE v2\n"},
		{p + "gid_attrs/types/2", "RoCE v2\n"},
		{p + "gid_attrs/types/3", "RoCE v2\n"},
		{p + "gid_attrs/ndevs/0", "lo\n"},
		{p + "gid_attrs/ndevs/1", "lo\n"},
		{p + "gid_attrs/ndevs/2", "lo\n"},
	};
	EXPECT_EQ(tree(), want);  // also proves no temp file is left behind
}

TEST_F(SysfsView, ModesDefeatUmask)
{
	mode_t old = umask(077);
	int err = sysfs_view_write(root_, dev_);
	umask(old);
	ASSERT_EQ(err, 0);
	for (const auto &e : fs::recursive_directory_iterator(root_)) {
		struct stat st;
		ASSERT_EQ(lstat(e.path().c_str(), &st), 0);
		if (S_ISDIR(st.st_mode))
			EXPECT_EQ(st.st_mode & 07777, 0755u) << e.path();
		else
			EXPECT_EQ(st.st_mode & 07777, 0444u) << e.path();
	}
}

// Reads a file as libibverbs does: ibv_read_sysfs_file with the caller's buffer size.
int lib_read(const fs::path &dir, const std::string &file, char *buf, size_t size)
{
	return ibv_read_sysfs_file(dir.c_str(), file.c_str(), buf, size);
}

TEST_F(SysfsView, ReadableWithLibibverbsBufferSizesAndParsers)
{
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	char buf[64];
	// init.c: class abi_version into 8 bytes, uverbsN/{ibdev (64), dev, abi_version (32)}.
	ASSERT_GT(lib_read(root_, "class/infiniband_verbs/abi_version", buf, 8), 0);
	EXPECT_EQ(strtol(buf, nullptr, 10), 6);
	ASSERT_GT(lib_read(uv(), "ibdev", buf, 64), 0);
	EXPECT_STREQ(buf, "xsrc7");
	unsigned major, minor;
	ASSERT_GT(lib_read(uv(), "dev", buf, 32), 0);
	ASSERT_EQ(sscanf(buf, "%u:%u", &major, &minor), 2);
	EXPECT_EQ(makedev(major, minor), makedev(kDevnodeMajor, kDevnodeMinor));
	ASSERT_GT(lib_read(ib(), "node_type", buf, 32), 0);
	EXPECT_EQ(strtoul(buf, nullptr, 10), 1u);  // RDMA_NODE_IB_CA

	// device.c ibv_get_device_guid: 24 bytes, four %hx groups.
	unsigned short parts[4];
	ASSERT_GT(lib_read(ib(), "node_guid", buf, 24), 0);
	ASSERT_EQ(sscanf(buf, "%hx:%hx:%hx:%hx", &parts[0], &parts[1], &parts[2], &parts[3]), 4);
	uint64_t guid = 0;
	for (unsigned short part : parts)
		guid = guid << 16 | part;
	EXPECT_EQ(guid, dev_.node_guid);

	// verbs.c ibv_query_pkey: 8 bytes, %hx.
	unsigned short pkey;
	ASSERT_GT(lib_read(port(), "pkeys/0", buf, 8), 0);
	ASSERT_EQ(sscanf(buf, "%hx", &pkey), 1);
	EXPECT_EQ(pkey, 0xffff);

	// cmd_device.c query_sysfs_gid_entry: gids 41 bytes (%hx every 5 chars), types 11
	// bytes, ndevs IF_NAMESIZE and resolvable with if_nametoindex.
	for (unsigned i = 0; i < dev_.port.gid_tbl_len; ++i) {
		const std::string idx = std::to_string(i);
		ASSERT_GT(lib_read(port(), "gids/" + idx, buf, 41), 0) << i;
		Gid g;
		for (int k = 0; k < 8; ++k) {
			unsigned short v;
			ASSERT_EQ(sscanf(buf + k * 5, "%hx", &v), 1);
			g.raw[2 * k] = v >> 8;
			g.raw[2 * k + 1] = v & 0xff;
		}
		EXPECT_EQ(g, i < dev_.port.gids.size() ? dev_.port.gids[i] : Gid{}) << i;
		ASSERT_GT(lib_read(port(), "gid_attrs/types/" + idx, buf, 11), 0) << i;
		EXPECT_STREQ(buf, "RoCE v2");
		int n = lib_read(port(), "gid_attrs/ndevs/" + idx, buf, IF_NAMESIZE);
		if (i < dev_.port.gids.size()) {
			ASSERT_GT(n, 0) << i;
			EXPECT_NE(if_nametoindex(buf), 0u) << buf;
		} else {
			EXPECT_LT(n, 0) << "unused entry " << i << " must have no ndevs file";
		}
	}
	// One past the table: libibverbs' index loops (ibv_find_gid_index) stop on this error.
	EXPECT_LT(lib_read(port(), "gids/4", buf, 41), 0);
}

TEST_F(SysfsView, PortDownAndRates)
{
	dev_.port.active = false;
	dev_.port.active_width = 1;  // 1X
	dev_.port.active_speed = 1;  // SDR
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	EXPECT_EQ(slurp(port() / "state"), "1: DOWN\n");
	EXPECT_EQ(slurp(port() / "phys_state"), "3: Disabled\n");
	EXPECT_EQ(slurp(port() / "rate"), "2.5 Gb/sec (1X)\n");
	dev_.port.active_width = 2;
	dev_.port.active_speed = 16;  // FDR
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	EXPECT_EQ(slurp(port() / "rate"), "56 Gb/sec (4X FDR)\n");
}

TEST_F(SysfsView, RefreshShrinksGidTable)
{
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	dev_.port.gids.resize(1);
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	EXPECT_EQ(slurp(port() / "gids/1"), "0000:0000:0000:0000:0000:0000:0000:0000\n");
	EXPECT_EQ(slurp(port() / "gid_attrs/types/1"), "RoCE v2\n");
	EXPECT_TRUE(fs::exists(port() / "gid_attrs/ndevs/0"));
	EXPECT_FALSE(fs::exists(port() / "gid_attrs/ndevs/1"));
	EXPECT_FALSE(fs::exists(port() / "gid_attrs/ndevs/2"));

	dev_.port.gid_tbl_len = 2;
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	EXPECT_TRUE(fs::exists(port() / "gids/1"));
	EXPECT_FALSE(fs::exists(port() / "gids/2"));
	EXPECT_FALSE(fs::exists(port() / "gids/3"));
	EXPECT_FALSE(fs::exists(port() / "gid_attrs/types/3"));
}

TEST_F(SysfsView, GidsBeyondTableLengthAreDropped)
{
	dev_.port.gid_tbl_len = 2;
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	EXPECT_EQ(slurp(port() / "gids/1"), "0000:0000:0000:0000:0000:ffff:7f00:0001\n");
	EXPECT_FALSE(fs::exists(port() / "gids/2"));
	EXPECT_FALSE(fs::exists(port() / "gid_attrs/ndevs/2"));
}

struct stat stat_of(const fs::path &p)
{
	struct stat st {};
	EXPECT_EQ(stat(p.c_str(), &st), 0) << p;
	return st;
}

bool same_time(const timespec &a, const timespec &b)
{
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

// libibverbs keys a sysfs device on the mtime of class/infiniband/<ibdev>.
TEST_F(SysfsView, UnchangedRefreshKeepsDeviceIdentity)
{
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	const struct stat dir0 = stat_of(ib()), guid0 = stat_of(ib() / "node_guid");
	const struct stat state0 = stat_of(port() / "state");
	usleep(20 * 1000);

	dev_.port.active = false;  // a port change touches ports/1 only
	dev_.port.gids.pop_back();
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	EXPECT_TRUE(same_time(stat_of(ib()).st_mtim, dir0.st_mtim));
	EXPECT_EQ(stat_of(ib() / "node_guid").st_ino, guid0.st_ino);
	EXPECT_NE(stat_of(port() / "state").st_ino, state0.st_ino);

	dev_.cmd_dir = "/run/xsrc/fs2/xsrc7";  // e.g. a restarted daemon: a new device
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	EXPECT_FALSE(same_time(stat_of(ib()).st_mtim, dir0.st_mtim));
	EXPECT_EQ(slurp(ib() / "xsrc_cmd_dir"), "/run/xsrc/fs2/xsrc7\n");
}

// The arena path is published for the provider; a view without one has no file.
TEST_F(SysfsView, ShmPathFileFollowsTheView)
{
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	char buf[256] = {};
	ASSERT_EQ(ibv_read_sysfs_file(ib().c_str(), "xsrc_shm_path", buf, sizeof(buf)), 19);
	EXPECT_STREQ(buf, "/dev/shm/xsrc-xsrc7");  // libibverbs strips the newline
	dev_.shm_path.clear();
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	EXPECT_FALSE(fs::exists(ib() / "xsrc_shm_path"));
}

// uverbsN/ibdev is written last: a view that failed half way is not enumerated.
TEST_F(SysfsView, FailedWriteLeavesDeviceInvisible)
{
	fs::create_directories(uv() / "dev/blocker");  // rename(2) cannot replace it
	EXPECT_NE(sysfs_view_write(root_, dev_), 0);
	EXPECT_FALSE(fs::exists(uv() / "ibdev"));
	fs::remove_all(root_ / "class");

	fs::create_directories(port() / "gids/2/blocker");
	EXPECT_NE(sysfs_view_write(root_, dev_), 0);
	EXPECT_FALSE(fs::exists(uv() / "ibdev"));
	fs::remove_all(port() / "gids/2");

	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	EXPECT_EQ(slurp(uv() / "ibdev"), "xsrc7\n");
}

TEST_F(SysfsView, RejectsBadViewsWithoutWriting)
{
	DeviceView bad = dev_;
	bad.ibdev = "a/b";
	EXPECT_EQ(sysfs_view_write(root_, bad), EINVAL);
	bad = dev_;
	bad.ibdev = "";
	EXPECT_EQ(sysfs_view_write(root_, bad), EINVAL);
	bad = dev_;
	bad.ibdev = "..";
	EXPECT_EQ(sysfs_view_write(root_, bad), EINVAL);
	bad = dev_;
	bad.port.gid_tbl_len = 0;
	EXPECT_EQ(sysfs_view_write(root_, bad), EINVAL);
	bad = dev_;
	bad.port.netdev = "a-name-longer-than-15";
	EXPECT_EQ(sysfs_view_write(root_, bad), EINVAL);
	bad = dev_;
	bad.cmd_dir = "/x\n/y";
	EXPECT_EQ(sysfs_view_write(root_, bad), EINVAL);
	bad = dev_;
	bad.shm_path = "/dev/shm/x\ny";
	EXPECT_EQ(sysfs_view_write(root_, bad), EINVAL);
	EXPECT_EQ(sysfs_view_write("", dev_), EINVAL);
	EXPECT_TRUE(fs::is_empty(root_));
}

TEST_F(SysfsView, RemoveLeavesClassesAndOtherDevices)
{
	DeviceView other = dev_;
	other.ibdev = "xsrc8";
	other.uverbs_index = 8;
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	ASSERT_EQ(sysfs_view_write(root_, other), 0);
	const size_t per_device = (tree().size() - 1) / 2;  // minus the shared abi_version

	ASSERT_EQ(sysfs_view_remove(root_, dev_), 0);
	EXPECT_FALSE(fs::exists(ib()));
	EXPECT_FALSE(fs::exists(uv()));
	EXPECT_TRUE(fs::exists(root_ / "class/infiniband/xsrc8/ports/1/gids/0"));
	EXPECT_TRUE(fs::exists(root_ / "class/infiniband_verbs/uverbs8/ibdev"));
	EXPECT_EQ(slurp(root_ / "class/infiniband_verbs/abi_version"), "6\n");
	EXPECT_EQ(tree().size(), per_device + 1);

	ASSERT_EQ(sysfs_view_remove(root_, other), 0);
	EXPECT_TRUE(fs::is_directory(root_ / "class/infiniband"));
	EXPECT_TRUE(fs::is_empty(root_ / "class/infiniband"));
	EXPECT_EQ(sysfs_view_remove(root_, other), 0);  // already gone: nothing to do
}

TEST_F(SysfsView, RemoveSparesUverbsDirOfAnotherDevice)
{
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	DeviceView stale = dev_;
	stale.ibdev = "xsrc_old";  // once had uverbs7, now owned by xsrc7
	ASSERT_EQ(sysfs_view_remove(root_, stale), 0);
	EXPECT_EQ(slurp(uv() / "ibdev"), "xsrc7\n");
	EXPECT_TRUE(fs::exists(ib()));
}

// pyverbs (tests/base.py) runs `ls /sys/class/infiniband/<dev>/device/net/` and
// takes the first name as the device's netdev.
TEST_F(SysfsView, DeviceNetNamesTheNetdevAndFollowsIt)
{
	auto listing = [&] {
		std::set<std::string> names;
		for (const auto &e : fs::directory_iterator(ib() / "device/net"))
			names.insert(e.path().filename().string());
		return names;
	};
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	EXPECT_TRUE(fs::is_directory(ib() / "device/net/lo"));
	EXPECT_EQ(listing(), std::set<std::string>{"lo"});
	const struct stat dir0 = stat_of(ib());
	usleep(20 * 1000);

	dev_.port.netdev = "eth9";  // the netdev was renamed, or the device rebound
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	EXPECT_EQ(listing(), std::set<std::string>{"eth9"});
	EXPECT_TRUE(same_time(stat_of(ib()).st_mtim, dir0.st_mtim)) << "a netdev change made a new device";
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	EXPECT_EQ(listing(), std::set<std::string>{"eth9"});

	dev_.port.netdev.clear();  // no netdev: no device/net, not an empty one
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	EXPECT_FALSE(fs::exists(ib() / "device"));
	EXPECT_TRUE(fs::exists(uv() / "ibdev"));
}

// librdmacm's fallback reads class/infiniband_ucma/abi_version into 8 bytes and
// takes strtol of it; the preload reads xsrc_cm_dir.
TEST_F(SysfsView, CmClassFilesWrittenAndRemoved)
{
	const fs::path cls = root_ / kCmClassDir;
	ASSERT_EQ(sysfs_view_write_cm(root_, "/run/xsrc/fs/rdma_cm"), 0);
	char buf[8] = {};
	ASSERT_GT(lib_read(root_, "class/infiniband_ucma/abi_version", buf, sizeof(buf)), 0);
	EXPECT_EQ(std::strtol(buf, nullptr, 10), 4);
	EXPECT_EQ(slurp(cls / "abi_version"), "4\n");
	EXPECT_EQ(slurp(cls / "xsrc_cm_dir"), "/run/xsrc/fs/rdma_cm\n");
	const struct stat file0 = stat_of(cls / "xsrc_cm_dir");
	ASSERT_EQ(sysfs_view_write_cm(root_, "/run/xsrc/fs/rdma_cm"), 0);
	EXPECT_EQ(stat_of(cls / "xsrc_cm_dir").st_ino, file0.st_ino);  // unchanged: untouched
	EXPECT_EQ(stat_of(cls).st_mode & 07777, 0755u);
	EXPECT_EQ(file0.st_mode & 07777, 0444u);

	EXPECT_EQ(sysfs_view_write_cm(root_, "relative/rdma_cm"), EINVAL);
	EXPECT_EQ(sysfs_view_write_cm(root_, "/a\nb"), EINVAL);
	EXPECT_EQ(sysfs_view_write_cm("", "/run/xsrc/fs/rdma_cm"), EINVAL);
	EXPECT_EQ(slurp(cls / "xsrc_cm_dir"), "/run/xsrc/fs/rdma_cm\n");

	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	ASSERT_EQ(sysfs_view_remove_cm(root_), 0);
	EXPECT_FALSE(fs::exists(cls));
	EXPECT_TRUE(fs::exists(uv() / "ibdev"));  // the devices' view is not the cm's
	EXPECT_EQ(sysfs_view_remove_cm(root_), 0);  // already gone: nothing to do
}

class Devnode : public SysfsView {
protected:
	void SetUp() override
	{
		SysfsView::SetUp();
		if (geteuid() != 0)
			GTEST_SKIP() << "mknod needs root";
		dir_ = root_ / "dev/infiniband";
	}
	fs::path dir_;
};

TEST_F(Devnode, CreateReplaceRemove)
{
	mode_t old = umask(077);
	int err = devnode_create_in(dir_, 3);
	umask(old);
	ASSERT_EQ(err, 0);
	struct stat st = stat_of(dir_ / "uverbs3");
	EXPECT_TRUE(S_ISCHR(st.st_mode));
	EXPECT_EQ(st.st_mode & 07777, 0666u);
	EXPECT_EQ(st.st_rdev, makedev(1, 3));
	EXPECT_EQ(stat_of(dir_).st_mode & 07777, 0755u);

	// A leftover regular file is replaced.
	fs::remove(dir_ / "uverbs4");
	std::ofstream(dir_ / "uverbs4") << "junk";
	ASSERT_EQ(devnode_create_in(dir_, 4), 0);
	EXPECT_TRUE(S_ISCHR(stat_of(dir_ / "uverbs4").st_mode));
	ASSERT_EQ(devnode_create_in(dir_, 4), 0);  // idempotent

	// Somebody else's character device is neither replaced nor removed.
	ASSERT_EQ(mknod((dir_ / "uverbs5").c_str(), S_IFCHR | 0600, makedev(1, 5)), 0);
	EXPECT_EQ(devnode_create_in(dir_, 5), EEXIST);
	EXPECT_EQ(devnode_remove_in(dir_, 5), EPERM);
	EXPECT_EQ(stat_of(dir_ / "uverbs5").st_rdev, makedev(1, 5));
	ASSERT_EQ(unlink((dir_ / "uverbs5").c_str()), 0);

	ASSERT_EQ(devnode_remove_in(dir_, 3), 0);
	EXPECT_FALSE(fs::exists(dir_ / "uverbs3"));
	EXPECT_TRUE(fs::exists(dir_));  // uverbs4 still there
	ASSERT_EQ(devnode_remove_in(dir_, 4), 0);
	EXPECT_FALSE(fs::exists(dir_));
	EXPECT_EQ(devnode_remove_in(dir_, 4), 0);
	EXPECT_EQ(fs::directory_iterator(root_ / "dev"), fs::directory_iterator());
}

// libibverbs itself enumerates the view: with no provider for it, IBV_SHOW_WARNINGS
// makes it name every uverbsN it accepted (ibdev, dev, node_type read, devnode found).
class Enumeration : public SysfsView {
protected:
	void SetUp() override
	{
		SysfsView::SetUp();
		if (geteuid() != 0)
			GTEST_SKIP() << "needs root for /dev/infiniband";
		int nl = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_RDMA);
		if (nl >= 0) {
			close(nl);
			GTEST_SKIP() << "kernel RDMA netlink present: libibverbs will not read SYSFS_PATH";
		}
		if (std::system("command -v ibv_devices >/dev/null 2>&1") != 0)
			GTEST_SKIP() << "ibv_devices not installed";
		// An index no real or daemon device is likely to use.
		for (unsigned i = 180; i < 250 && !index_; ++i)
			if (!fs::exists(fs::path(kDevnodeDir) / ("uverbs" + std::to_string(i))))
				index_ = i;
		ASSERT_NE(index_, 0u);
		dev_.ibdev = "xsrct" + std::to_string(getpid());
		dev_.uverbs_index = index_;
	}
	void TearDown() override
	{
		if (index_)
			devnode_remove(index_);
		SysfsView::TearDown();
	}
	std::string run_ibv_devices()
	{
		// Without RDMAV_DRIVERS from the caller's environment (`xsrc env`):
		// libibverbs would find our provider there and match the device.
		std::string cmd =
			"env -u RDMAV_DRIVERS SYSFS_PATH=" + root_.string() + " IBV_SHOW_WARNINGS=1 ibv_devices 2>&1";
		FILE *p = popen(cmd.c_str(), "r");
		std::string out;
		char buf[512];
		while (p && fgets(buf, sizeof(buf), p))
			out += buf;
		if (p)
			pclose(p);
		return out;
	}
	unsigned index_ = 0;
};

TEST_F(Enumeration, LibibverbsAcceptsTheView)
{
	const std::string warning = "no userspace device-specific driver found for " + dev_.ibdev;
	ASSERT_EQ(sysfs_view_write(root_, dev_), 0);
	// Control: without the devnode libibverbs drops the device before matching.
	EXPECT_EQ(run_ibv_devices().find(warning), std::string::npos);
	ASSERT_EQ(devnode_create(index_), 0);
	std::string out = run_ibv_devices();
	EXPECT_NE(out.find(warning), std::string::npos) << out;
	EXPECT_EQ(out.find("Fatal"), std::string::npos) << out;
	ASSERT_EQ(sysfs_view_remove(root_, dev_), 0);
	EXPECT_EQ(run_ibv_devices().find(warning), std::string::npos);
}

}  // namespace
}  // namespace xsrc
