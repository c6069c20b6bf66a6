// The sysfs view that libibverbs reads when the kernel has no RDMA devices
// ($SYSFS_PATH/class/infiniband{,_verbs}/...), librdmacm's class/infiniband_ucma,
// and the /dev/infiniband node.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "netdev.h"

namespace xsrc {

struct PortView {
	bool active = false;        // netdev up -> "4: ACTIVE", else "1: DOWN"
	int active_mtu = 0;         // enum ibv_mtu
	std::string netdev;         // named by gid_attrs/ndevs/I for valid GIDs
	std::vector<Gid> gids;      // RoCE v2; entries beyond gid_tbl_len are dropped
	unsigned gid_tbl_len = 16;  // query_port must report the same value
	// The "rate" and "cap_mask" files; query_port should answer from the same fields.
	uint8_t active_width = 2;   // IBV_WIDTH_4X
	uint8_t active_speed = 32;  // EDR: 25 Gb/s a lane -> "100 Gb/sec (4X EDR)"
	uint32_t port_cap_flags = 0x04010000;  // IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS
};

struct DeviceView {
	std::string ibdev;          // "xsrc0"
	unsigned uverbs_index = 0;  // class/infiniband_verbs/uverbsN, /dev/infiniband/uverbsN
	unsigned driver_abi = 1;    // uverbsN/abi_version
	uint64_t node_guid = 0;     // host byte order
	std::string cmd_dir;        // written to class/infiniband/<ibdev>/xsrc_cmd_dir
	std::string shm_path;       // the arena; class/infiniband/<ibdev>/xsrc_shm_path (none if empty)
	std::string fw_ver = "1.0.0";
	PortView port;              // port 1; xsrc devices have one port
};

// Creates or refreshes (atomically per file) the view of one device under
// `root` (the future SYSFS_PATH): class/infiniband_verbs/abi_version,
// class/infiniband_verbs/uverbsN/{ibdev,dev,abi_version},
// class/infiniband/<ibdev>/{node_type,node_guid,sys_image_guid,fw_ver,
// hw_rev,hca_type,board_id,node_desc,xsrc_cmd_dir,xsrc_shm_path,ports/1/...},
// and the directory class/infiniband/<ibdev>/device/net/<netdev> (pyverbs and
// others list device/net to find a device's netdev; it follows port.netdev).
// A file whose content is unchanged is not touched: libibverbs takes the mtime of
// class/infiniband/<ibdev> as the device's identity, so only a change of a
// top-level file makes running applications see a new device.
// Returns 0 or an errno.
int sysfs_view_write(const std::string &root, const DeviceView &dev);

// Removes that device's directories; leaves the class directories.
int sysfs_view_remove(const std::string &root, const DeviceView &dev);

// The rdma_cm device: librdmacm reads the ABI from class/misc/rdma_cm/abi_version,
// else class/infiniband_ucma/abi_version (the view cannot replace the real
// /sys/class/misc, so it provides the second); libxsrc-preload.so reads where
// xsrcd serves the cm channels from class/infiniband_ucma/xsrc_cm_dir.
inline constexpr const char *kCmClassDir = "class/infiniband_ucma";
inline constexpr const char *kCmDirFile = "xsrc_cm_dir";
inline constexpr const char *kCmDirName = "rdma_cm";  // <fuse root>/rdma_cm
inline constexpr unsigned kCmAbiVersion = 4;         // RDMA_USER_CM_ABI_VERSION

// Writes class/infiniband_ucma/{abi_version,xsrc_cm_dir} under `root`; `cm_dir`
// must be absolute. Unchanged files are not touched. Returns 0 or an errno.
int sysfs_view_write_cm(const std::string &root, const std::string &cm_dir);
// Removes them and the class directory (while a device is up they stay).
int sysfs_view_remove_cm(const std::string &root);

// The character device libibverbs opens and passes on as cmd_fd: a node with
// the numbers published in uverbsN/dev (1:3, the null device; the provider
// replaces the fd with its command file). Mode 0666.
// An existing entry is replaced, except a character device with other numbers
// (a real kernel uverbs node): EEXIST.
int devnode_create(unsigned uverbs_index);
int devnode_remove(unsigned uverbs_index);  // also removes /dev/infiniband when empty

// The same in another directory (tests, private mount namespaces). devnode_remove_in
// leaves anything but a 1:3 character device alone (EPERM).
inline constexpr const char *kDevnodeDir = "/dev/infiniband";
int devnode_create_in(const std::string &dir, unsigned uverbs_index);
int devnode_remove_in(const std::string &dir, unsigned uverbs_index);

// The device numbers written to uverbsN/dev and used by devnode_create.
inline constexpr unsigned kDevnodeMajor = 1;
inline constexpr unsigned kDevnodeMinor = 3;

}  // namespace xsrc
