// The sysfs view libibverbs enumerates when the kernel has no RDMA devices, and
// the /dev/infiniband node it opens. Formats follow the kernel's ib_core sysfs.
#include "sysfs_view.h"

#include <dirent.h>
#include <fcntl.h>
#include <net/if.h>
#include <rdma/rdma_user_cm.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string_view>
#include <utility>

#include "common/fd.h"
#include "xsrc-abi.h"
#include "xsrc-queues.h"

namespace xsrc {
namespace {

namespace fs = std::filesystem;

constexpr unsigned kPort = 1;
static_assert(kCmAbiVersion == RDMA_USER_CM_ABI_VERSION, "the rdma_cm ABI xsrcd announces");
constexpr mode_t kDirMode = 0755;
constexpr mode_t kFileMode = 0444;
// libibverbs reads names into 64-byte buffers (IBV_SYSFS_NAME_MAX).
constexpr size_t kMaxIbdevName = 63;

// mkdir -p; only directories created here get their mode forced past the umask.
int make_dirs(const fs::path &dir)
{
	fs::path cur;
	for (const fs::path &part : dir) {
		cur /= part;
		if (::mkdir(cur.c_str(), kDirMode) == 0) {
			if (::chmod(cur.c_str(), kDirMode) < 0)
				return errno;
			continue;
		}
		if (errno != EEXIST)
			return errno;
		struct stat st;
		if (::stat(cur.c_str(), &st) < 0)
			return errno;
		if (!S_ISDIR(st.st_mode))
			return ENOTDIR;
	}
	return 0;
}

bool same_content(const fs::path &path, std::string_view content)
{
	unique_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
	if (!fd)
		return false;
	std::string have(content.size() + 1, '\0');  // one extra byte catches a longer file
	size_t got = 0;
	while (got < have.size()) {
		ssize_t n = ::read(fd.get(), have.data() + got, have.size() - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += static_cast<size_t>(n);
	}
	fd.reset();
	return got == content.size() && std::string_view(have.data(), got) == content;
}

// Temp file + rename, so a reader sees the old or the new file, never a part.
int write_file(const fs::path &path, std::string_view content)
{
	if (same_content(path, content))
		return 0;
	static std::atomic<unsigned> counter;
	std::string tmp_name = ".";  // appended piecewise: "." + string trips GCC 12 -Wrestrict
	tmp_name.append(path.filename().string()).append(".tmp");
	tmp_name.append(std::to_string(::getpid())).append(".").append(std::to_string(counter++));
	const fs::path tmp = path.parent_path() / tmp_name;
	int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, kFileMode);
	if (fd < 0)
		return errno;
	int err = 0;
	for (size_t done = 0; done < content.size() && !err;) {
		ssize_t n = ::write(fd, content.data() + done, content.size() - done);
		if (n < 0 && errno != EINTR)
			err = errno;
		else if (n > 0)
			done += static_cast<size_t>(n);
	}
	if (!err && ::fchmod(fd, kFileMode) < 0)
		err = errno;
	if (::close(fd) < 0 && !err)
		err = errno;
	if (!err && ::rename(tmp.c_str(), path.c_str()) < 0)
		err = errno;
	if (err)
		::unlink(tmp.c_str());
	return err;
}

int remove_file(const fs::path &path)
{
	return ::unlink(path.c_str()) < 0 && errno != ENOENT ? errno : 0;
}

// Removes numeric entries >= keep_below; a shrunk table must not leave old indices behind.
int remove_indices_from(const fs::path &dir, unsigned keep_below)
{
	DIR *d = ::opendir(dir.c_str());
	if (!d)
		return errno == ENOENT ? 0 : errno;
	int err = 0;
	while (dirent *e = ::readdir(d)) {
		char *end;
		unsigned long i = std::strtoul(e->d_name, &end, 10);
		if (e->d_name[0] < '0' || e->d_name[0] > '9' || *end || i < keep_below)
			continue;
		if (int r = remove_file(dir / e->d_name); r && !err)
			err = r;
	}
	::closedir(d);
	return err;
}

std::string guid_str(uint64_t guid)
{
	char s[24];
	std::snprintf(s, sizeof(s), "%04x:%04x:%04x:%04x\n", unsigned(guid >> 48) & 0xffff,
		      unsigned(guid >> 32) & 0xffff, unsigned(guid >> 16) & 0xffff,
		      unsigned(guid) & 0xffff);
	return s;
}

std::string gid_str(const Gid &g)
{
	std::string s;
	char group[8];
	for (int i = 0; i < 8; ++i) {
		std::snprintf(group, sizeof(group), "%s%02x%02x", i ? ":" : "", g.raw[2 * i],
			      g.raw[2 * i + 1]);
		s += group;
	}
	return s + "\n";
}

// As the kernel prints it: "<Gb/s> Gb/sec (<lanes>X<speed name>)".
std::string rate_str(uint8_t width, uint8_t speed)
{
	int lanes;
	switch (width) {
	case 1: lanes = 1; break;
	case 2: lanes = 4; break;
	case 4: lanes = 8; break;
	case 8: lanes = 12; break;
	case 16: lanes = 2; break;
	default: lanes = 0; break;
	}
	const char *name = "";
	int tenths = 25;  // SDR: 2.5 Gb/s a lane
	switch (speed) {
	case 2: name = " DDR"; tenths = 50; break;
	case 4: name = " QDR"; tenths = 100; break;
	case 8: name = " FDR10"; tenths = 100; break;
	case 16: name = " FDR"; tenths = 140; break;
	case 32: name = " EDR"; tenths = 250; break;
	case 64: name = " HDR"; tenths = 500; break;
	case 128: name = " NDR"; tenths = 1000; break;
	}
	int rate = tenths * lanes;
	char s[48];
	std::snprintf(s, sizeof(s), "%d%s Gb/sec (%dX%s)\n", rate / 10, rate % 10 ? ".5" : "",
		      lanes, name);
	return s;
}

std::string host_name()
{
	char h[256] = {};
	if (::gethostname(h, sizeof(h) - 1) < 0 || !h[0])
		return "localhost";
	return h;
}

bool valid_view(const DeviceView &dev)
{
	const std::string &n = dev.ibdev;
	return !n.empty() && n.size() <= kMaxIbdevName && n != "." && n != ".." &&
	       n.find_first_of("/\n") == std::string::npos &&
	       dev.cmd_dir.find('\n') == std::string::npos &&
	       dev.shm_path.find('\n') == std::string::npos &&
	       dev.port.netdev.size() < IF_NAMESIZE &&
	       dev.port.netdev.find_first_of("/\n") == std::string::npos &&
	       dev.port.gid_tbl_len > 0 && dev.port.gid_tbl_len <= 4096;
}

fs::path ibdev_dir(const std::string &root, const DeviceView &dev)
{
	return fs::path(root) / "class/infiniband" / dev.ibdev;
}

fs::path uverbs_dir(const std::string &root, unsigned index)
{
	return fs::path(root) / "class/infiniband_verbs" / ("uverbs" + std::to_string(index));
}

int write_port(const fs::path &port_dir, const PortView &port)
{
	const std::pair<const char *, std::string> files[] = {
		{"state", port.active ? "4: ACTIVE\n" : "1: DOWN\n"},
		{"phys_state", port.active ? "5: LinkUp\n" : "3: Disabled\n"},
		{"link_layer", "Ethernet\n"},
		{"rate", rate_str(port.active_width, port.active_speed)},
		{"lid", "0x0\n"},
		{"sm_lid", "0x0\n"},
		{"lid_mask_count", "0\n"},
		{"sm_sl", "0\n"},
		{"cap_mask", [&] {
			 char s[16];
			 std::snprintf(s, sizeof(s), "0x%08x\n", port.port_cap_flags);
			 return std::string(s);
		 }()},
	};
	const fs::path gids = port_dir / "gids", types = port_dir / "gid_attrs/types",
		       ndevs = port_dir / "gid_attrs/ndevs", pkeys = port_dir / "pkeys";
	for (const fs::path &d : {gids, types, ndevs, pkeys})
		if (int err = make_dirs(d))
			return err;
	for (const auto &[name, content] : files)
		if (int err = write_file(port_dir / name, content))
			return err;
	if (int err = write_file(pkeys / "0", "0xffff\n"))
		return err;

	// Every index below gid_tbl_len needs gids/I and types/I: libibverbs' sysfs GID
	// query fails with EINVAL when either is missing, and that failure aborts the
	// whole ibv_query_gid_table. An unused entry is a zero GID with type "RoCE v2"
	// (so ibv_query_gid_ex answers ENODATA without a query_port round trip) and no
	// ndevs/I (ndev_ifindex 0); a present ndevs/I must name a netdev that exists.
	const Gid zero{};
	const std::string netdev_line = port.netdev + "\n";
	for (unsigned i = 0; i < port.gid_tbl_len; ++i) {
		bool used = i < port.gids.size() && port.gids[i] != zero;
		const std::string idx = std::to_string(i);
		if (int err = write_file(gids / idx, gid_str(used ? port.gids[i] : zero)))
			return err;
		if (int err = write_file(types / idx, "RoCE v2\n"))
			return err;
		int err = used && !port.netdev.empty() ? write_file(ndevs / idx, netdev_line)
						       : remove_file(ndevs / idx);
		if (err)
			return err;
	}
	for (const fs::path &d : {gids, types, ndevs})
		if (int err = remove_indices_from(d, port.gid_tbl_len))
			return err;
	return 0;
}

// device/net/<netdev>, the one entry there; without a netdev no device/ at all
// (pyverbs takes a listed but empty device/net for a netdev named "").
int write_device_net(const fs::path &device_dir, const std::string &netdev)
{
	const fs::path net = device_dir / "net";
	std::error_code ec;
	if (netdev.empty()) {
		fs::remove_all(device_dir, ec);
		return ec.value();
	}
	if (int err = make_dirs(net / netdev))
		return err;
	std::vector<fs::path> renamed;  // the entries of a netdev the device was bound to before
	for (const fs::directory_entry &e : fs::directory_iterator(net, ec))
		if (e.path().filename() != netdev)
			renamed.push_back(e.path());
	for (const fs::path &old : renamed)
		if (!ec)
			fs::remove_all(old, ec);
	return ec.value();
}

}  // namespace

int sysfs_view_write(const std::string &root, const DeviceView &dev)
{
	if (root.empty() || !valid_view(dev))
		return EINVAL;
	const fs::path verbs_class = fs::path(root) / "class/infiniband_verbs";
	const fs::path ib = ibdev_dir(root, dev), uv = uverbs_dir(root, dev.uverbs_index);
	for (const fs::path &d : {verbs_class, ib, uv})
		if (int err = make_dirs(d))
			return err;
	if (int err = write_file(verbs_class / "abi_version",
				 std::to_string(XSRC_UVERBS_ABI_VERSION) + "\n"))
		return err;

	const std::string guid = guid_str(dev.node_guid);
	const std::pair<const char *, std::string> files[] = {
		{"node_type", "1: CA\n"},
		{"node_guid", guid},
		{"sys_image_guid", guid},
		{"fw_ver", dev.fw_ver + "\n"},
		{"hw_rev", "0\n"},
		{"hca_type", "xsrc\n"},
		{"board_id", "xsrc\n"},
		{"node_desc", host_name() + " " + dev.ibdev + "\n"},
		{XSRC_SYSFS_CMD_DIR_FILE, dev.cmd_dir + "\n"},
	};
	for (const auto &[name, content] : files)
		if (int err = write_file(ib / name, content))
			return err;
	int shm_err = dev.shm_path.empty() ? remove_file(ib / XSRC_SYSFS_SHM_FILE)
					   : write_file(ib / XSRC_SYSFS_SHM_FILE, dev.shm_path + "\n");
	if (shm_err)
		return shm_err;
	if (int err = write_port(ib / "ports" / std::to_string(kPort), dev.port))
		return err;
	if (int err = write_device_net(ib / "device", dev.port.netdev))
		return err;

	// uverbsN/ibdev last: libibverbs skips a uverbsN without it, so the device only
	// becomes visible once everything it reads is in place.
	char devnum[32];
	std::snprintf(devnum, sizeof(devnum), "%u:%u\n", kDevnodeMajor, kDevnodeMinor);
	if (int err = write_file(uv / "abi_version", std::to_string(dev.driver_abi) + "\n"))
		return err;
	if (int err = write_file(uv / "dev", devnum))
		return err;
	return write_file(uv / "ibdev", dev.ibdev + "\n");
}

int sysfs_view_remove(const std::string &root, const DeviceView &dev)
{
	if (root.empty() || !valid_view(dev))
		return EINVAL;
	std::error_code ec;
	const fs::path uv = uverbs_dir(root, dev.uverbs_index);
	// Leave uverbsN alone if it now belongs to another device.
	if (fs::exists(uv / "ibdev", ec) && !same_content(uv / "ibdev", dev.ibdev + "\n")) {
		fs::remove_all(ibdev_dir(root, dev), ec);
		return ec.value();
	}
	// ibdev first, so enumeration stops seeing the device before its files go.
	if (int err = remove_file(uv / "ibdev"))
		return err;
	fs::remove_all(uv, ec);
	if (ec)
		return ec.value();
	fs::remove_all(ibdev_dir(root, dev), ec);
	return ec.value();
}

int sysfs_view_write_cm(const std::string &root, const std::string &cm_dir)
{
	if (root.empty() || !fs::path(cm_dir).is_absolute() || cm_dir.find('\n') != std::string::npos)
		return EINVAL;
	const fs::path cls = fs::path(root) / kCmClassDir;
	if (int err = make_dirs(cls))
		return err;
	if (int err = write_file(cls / "abi_version", std::to_string(kCmAbiVersion) + "\n"))
		return err;
	return write_file(cls / kCmDirFile, cm_dir + "\n");
}

int sysfs_view_remove_cm(const std::string &root)
{
	if (root.empty())
		return EINVAL;
	const fs::path cls = fs::path(root) / kCmClassDir;
	// The preload's file first: a program that opens rdma_cm now gets ENOENT.
	for (const char *name : {kCmDirFile, "abi_version"})
		if (int err = remove_file(cls / name))
			return err;
	return ::rmdir(cls.c_str()) < 0 && errno != ENOENT ? errno : 0;
}

int devnode_create_in(const std::string &dir, unsigned uverbs_index)
{
	const dev_t want = makedev(kDevnodeMajor, kDevnodeMinor);
	const fs::path node = fs::path(dir) / ("uverbs" + std::to_string(uverbs_index));
	if (int err = make_dirs(dir))
		return err;
	struct stat st;
	if (::lstat(node.c_str(), &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev != want)
		return EEXIST;  // a real kernel uverbs node: not ours to replace
	// mknod beside it and rename over: the node never disappears while replaced.
	const fs::path tmp = fs::path(dir) / (".uverbs" + std::to_string(uverbs_index) + ".tmp" +
					      std::to_string(::getpid()));
	::unlink(tmp.c_str());
	if (::mknod(tmp.c_str(), S_IFCHR | 0666, want) < 0)
		return errno;
	int err = 0;
	if (::chmod(tmp.c_str(), 0666) < 0 || ::rename(tmp.c_str(), node.c_str()) < 0)
		err = errno;
	if (err)
		::unlink(tmp.c_str());
	return err;
}

int devnode_remove_in(const std::string &dir, unsigned uverbs_index)
{
	const fs::path node = fs::path(dir) / ("uverbs" + std::to_string(uverbs_index));
	struct stat st;
	if (::lstat(node.c_str(), &st) < 0)
		return errno == ENOENT ? 0 : errno;
	if (!S_ISCHR(st.st_mode) || st.st_rdev != makedev(kDevnodeMajor, kDevnodeMinor))
		return EPERM;
	if (int err = remove_file(node))
		return err;
	::rmdir(dir.c_str());  // fails while other nodes remain, as intended
	return 0;
}

int devnode_create(unsigned uverbs_index)
{
	return devnode_create_in(kDevnodeDir, uverbs_index);
}

int devnode_remove(unsigned uverbs_index)
{
	return devnode_remove_in(kDevnodeDir, uverbs_index);
}

}  // namespace xsrc
