#include "run_namespace.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

namespace xsrc::cli {

static constexpr const char *kSysClass = "/sys/class";

static void check(int rc, const std::string &what)
{
	if (rc != 0)
		throw CliError(what + ": " + errno_text(errno));
}

static bool is_view_class(const std::string &name)
{
	return std::ranges::find(kViewClasses, name) != std::end(kViewClasses);
}

// Bind-mounts `source` (a directory or a file) at the same-named new entry in /sys/class.
static void bind_into_sys_class(const fs::path &source, const std::string &name, bool is_directory)
{
	fs::path target = fs::path(kSysClass) / name;
	int rc = is_directory ? mkdir(target.c_str(), 0755)
			      : mknod(target.c_str(), S_IFREG | 0444, 0);
	check(rc, "create " + target.string());
	check(mount(source.c_str(), target.c_str(), nullptr, MS_BIND | MS_REC, nullptr),
	      "bind " + source.string() + " at " + target.string());
}

// Fills the tmpfs now mounted on /sys/class. `real_class` is an fd of the real
// /sys/class underneath it: /proc/self/fd/N/<entry> still reaches the real
// entries, whose ../../devices symlinks stay valid because each class keeps
// its name and depth below /sys.
static void populate_sys_class(int real_class, const std::vector<fs::directory_entry> &real_entries,
			       const fs::path &view_class_dir)
{
	fs::path real = fs::path("/proc/self/fd") / std::to_string(real_class);
	for (const fs::directory_entry &entry : real_entries) {
		std::string name = entry.path().filename();
		std::error_code ec;
		// A host with kernel RDMA has these classes too: ours replace them.
		bool replaced = is_view_class(name) && fs::is_directory(view_class_dir / name, ec);
		if (replaced || entry.is_symlink(ec))
			continue;
		bind_into_sys_class(real / name, name, entry.is_directory(ec));
	}
	for (const char *name : kViewClasses) {
		std::error_code ec;
		if (fs::is_directory(view_class_dir / name, ec))
			bind_into_sys_class(view_class_dir / name, name, true);
	}
}

// Writes `text` to /proc/self/<file> (a user namespace's id maps).
static void write_proc_self(const char *file, const std::string &text)
{
	std::string path = std::string("/proc/self/") + file;
	unique_fd fd(open(path.c_str(), O_WRONLY | O_CLOEXEC));
	check(fd ? 0 : -1, "open " + path);
	ssize_t n = write(fd.get(), text.data(), text.size());
	check(n == static_cast<ssize_t>(text.size()) ? 0 : -1, "write " + path);
}

// A new user namespace in which the caller's ids map to `inner_uid`/`inner_gid`
// (one id each: nothing else of the host is reachable through it).
static void enter_user_namespace(uid_t outer_uid, gid_t outer_gid, uid_t inner_uid, gid_t inner_gid, int more_flags)
{
	check(unshare(CLONE_NEWUSER | more_flags), "unshare(CLONE_NEWUSER)");
	write_proc_self("setgroups", "deny");  // required before an unprivileged gid_map
	write_proc_self("uid_map", std::to_string(inner_uid) + " " + std::to_string(outer_uid) + " 1");
	write_proc_self("gid_map", std::to_string(inner_gid) + " " + std::to_string(outer_gid) + " 1");
}

UserNamespace::UserNamespace() : uid_(geteuid()), gid_(getegid()), active_(uid_ != 0) {}

void UserNamespace::enter_as_root()
{
	// The mount namespace has to be owned by the user namespace for its
	// mounts to be allowed: both are made in one call.
	if (active_)
		enter_user_namespace(uid_, gid_, 0, 0, CLONE_NEWNS);
}

void UserNamespace::leave_root()
{
	// A nested namespace maps the caller's own ids back, so the program sees
	// who it is and holds no capability; the mounts made above stay.
	if (active_)
		enter_user_namespace(0, 0, uid_, gid_, 0);
}

void overlay_sys_class(const fs::path &view_class_dir)
{
	std::error_code ec;
	std::vector<fs::directory_entry> real_entries(fs::directory_iterator(kSysClass, ec), {});
	if (ec)
		throw CliError(std::string("cannot list ") + kSysClass + ": " + ec.message());

	// Not root: the mount namespace belongs to a user namespace of our own in
	// which we are root (unprivileged user namespaces), and the program runs
	// in a nested one with its own ids again.
	UserNamespace userns;
	userns.enter_as_root();
	if (!userns.active())
		check(unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)");
	// Nothing mounted from here on may propagate back to the host.
	check(mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), "make / private");
	// Opened in the new namespace: bind mounts only take sources from the caller's.
	unique_fd real_class(open(kSysClass, O_PATH | O_DIRECTORY | O_CLOEXEC));
	check(real_class ? 0 : -1, std::string("open ") + kSysClass);
	check(mount("xsrc", kSysClass, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755"),
	      std::string("mount tmpfs on ") + kSysClass);
	try {
		populate_sys_class(real_class.get(), real_entries, view_class_dir);
	} catch (const CliError &) {
		umount2(kSysClass, MNT_DETACH);  // also drops the binds made so far
		userns.leave_root();
		throw;
	}
	// Read-only like sysfs; cosmetic, so a failure does not matter.
	mount(nullptr, kSysClass, nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
	      "mode=0755");
	userns.leave_root();
}

}  // namespace xsrc::cli
