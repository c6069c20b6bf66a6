// `xsrc run`: a private mount namespace in which the device view appears under
// /sys/class, for programs that read /sys/class/infiniband and ignore SYSFS_PATH.
#pragma once

#include "cli.h"

namespace xsrc::cli {

// The class directories of the view that replace (or join) the real ones.
// infiniband_ucma: librdmacm's rdma_cm ABI file, and where libxsrc-preload.so
// finds xsrcd's cm channels.
inline constexpr const char *kViewClasses[] = {"infiniband", "infiniband_verbs", "infiniband_ucma"};

// For a caller that is not root: a user namespace of its own in which it is
// root, so that it may make a mount namespace, and then a nested one in which
// it has its own uid and gid again (and no capability). For root: nothing.
class UserNamespace {
public:
	UserNamespace();
	bool active() const { return active_; }
	void enter_as_root();  // also makes the new mount namespace
	void leave_root();

private:
	uid_t uid_;
	gid_t gid_;
	bool active_;
};

// Moves the calling process into a new mount namespace whose /sys/class is a
// tmpfs holding a bind mount of every real class directory plus the view's
// classes from `view_class_dir` (<rundir>/sysfs/class). The host's namespace
// is untouched. Throws CliError when that cannot be built; /sys/class is then
// the real one again. Any user may call it (see UserNamespace).
void overlay_sys_class(const fs::path &view_class_dir);

}  // namespace xsrc::cli
