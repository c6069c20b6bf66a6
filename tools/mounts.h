// The mount table, for cleaning up after a daemon that died with its FUSE
// file system still mounted.
#pragma once

#include <string>
#include <vector>

#include "cli.h"

namespace xsrc::cli {

// File system types of the mounts stacked at `mount_point` (an absolute,
// canonical path), bottom first, from /proc/self/mountinfo.
std::vector<std::string> mount_types_at(const fs::path &mount_point);

// Lazily unmounts every FUSE mount at `mount_point` (accessing a dead one fails
// with ENOTCONN, so it cannot be inspected first). Returns how many it removed;
// throws CliError when umount fails.
int detach_fuse_mounts(const fs::path &mount_point);

}  // namespace xsrc::cli
