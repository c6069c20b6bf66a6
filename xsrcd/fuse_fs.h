// The FUSE file system that stands in for /dev/infiniband/uverbsN: one
// directory per device; a provider creates a file in it for every context it
// opens and write()s uverbs commands to that file.
#pragma once

#include <sys/types.h>

#include <string>

struct fuse_session;

namespace xsrc {

class CmService;
class Daemon;

class FuseFs {
public:
	// Serves the uverbs command files of `daemon`'s devices and the rdma_cm
	// files of `cm` (a directory rdma_cm beside the device directories).
	FuseFs(Daemon &daemon, CmService &cm, std::string mountpoint);
	~FuseFs();  // unmounts if still mounted
	FuseFs(const FuseFs &) = delete;
	FuseFs &operator=(const FuseFs &) = delete;

	// Mounts (allow_other, default_permissions) and installs SIGTERM/SIGINT
	// handlers that end run(). Returns 0 or an errno.
	int mount();
	// Serves requests on worker threads until a signal or unmount.
	int run();
	void unmount();

private:
	Daemon &daemon_;
	CmService &cm_;
	std::string mountpoint_;
	struct fuse_session *session_ = nullptr;
	bool mounted_ = false;
};

// The device number of the topmost mount at `mountpoint` (0 if none), from
// the mount table: stat() of a FUSE mount waits for its server.
dev_t mount_device(const std::string &mountpoint);

// Detaches a mount left behind by a daemon that died. Returns true if one was.
bool unmount_stale(const std::string &mountpoint);

}  // namespace xsrc
