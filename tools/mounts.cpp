#include "mounts.h"

#include <sys/mount.h>

#include <cerrno>
#include <fstream>
#include <sstream>

namespace xsrc::cli {

// mountinfo escapes space, tab, newline and backslash as \ooo.
static std::string unescape_mountinfo(const std::string &field)
{
	std::string out;
	for (size_t i = 0; i < field.size(); ++i) {
		bool octal = field[i] == '\\' && i + 3 < field.size() &&
			     field.find_first_not_of("01234567", i + 1) >= i + 4;
		if (octal) {
			out += static_cast<char>(std::stoi(field.substr(i + 1, 3), nullptr, 8));
			i += 3;
		} else {
			out += field[i];
		}
	}
	return out;
}

std::vector<std::string> mount_types_at(const fs::path &mount_point)
{
	// Line: id parent major:minor root mount_point options [optional...] - type source super_options
	std::ifstream in("/proc/self/mountinfo");
	std::vector<std::string> types;
	for (std::string line; std::getline(in, line);) {
		std::istringstream fields(line);
		std::string id, parent, devno, root, point, field;
		fields >> id >> parent >> devno >> root >> point;
		if (unescape_mountinfo(point) != mount_point.native())
			continue;
		while (fields >> field && field != "-") {
		}
		if (fields >> field)
			types.push_back(field);
	}
	return types;
}

int detach_fuse_mounts(const fs::path &mount_point)
{
	for (int detached = 0;; ++detached) {
		auto types = mount_types_at(mount_point);
		// umount2 removes the top of the stack: stop at anything that is not FUSE.
		if (types.empty() || !types.back().starts_with("fuse"))
			return detached;
		if (umount2(mount_point.c_str(), MNT_DETACH) != 0) {
			// Listed but not reachable at that path (hidden under another
			// mount, e.g. in a container's namespace): not ours to clean.
			if (errno == ENOENT || errno == EINVAL)
				return detached;
			throw CliError("cannot unmount " + mount_point.string() + ": " + errno_text(errno));
		}
	}
}

}  // namespace xsrc::cli
