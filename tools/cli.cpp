#include "cli.h"

#include <cstdlib>
#include <cstring>
#include <iostream>

namespace xsrc::cli {

// libibverbs loads "<RDMAV_DRIVERS entry>-rdmav34.so" for an absolute entry.
static constexpr const char *kProviderStem = "libxsrc";
static constexpr const char *kProviderSuffix = "-rdmav34.so";
static constexpr const char *kPreloadLibrary = "libxsrc-preload.so";

std::string errno_text(int err)
{
	return std::strerror(err);
}

RunDir RunDir::resolve(const std::string &option)
{
	fs::path dir = option;
	if (dir.empty()) {
		const char *env = std::getenv("XSRC_RUNDIR");
		dir = env && *env ? env : kDefaultRunDir;
	}
	// The daemon, mountinfo and SYSFS_PATH all need the same absolute spelling.
	std::error_code ec;
	fs::path canonical = fs::weakly_canonical(fs::absolute(dir), ec);
	dir = ec ? fs::absolute(dir).lexically_normal() : canonical;
	if (!dir.has_filename() && dir.has_relative_path())
		dir = dir.parent_path();
	return RunDir{dir};
}

fs::path self_exe_dir()
{
	std::error_code ec;
	fs::path exe = fs::read_symlink("/proc/self/exe", ec);
	if (ec)
		throw CliError("cannot read /proc/self/exe: " + ec.message());
	return exe.parent_path();
}

std::string uninstalled_provider_driver()
{
	std::error_code ec;
	fs::path lib = fs::canonical(self_exe_dir() / ".." / "lib", ec);
	if (ec || !fs::exists(lib / (std::string(kProviderStem) + kProviderSuffix), ec))
		return {};
	return (lib / kProviderStem).string();
}

fs::path preload_library()
{
	std::error_code ec;
	fs::path lib = fs::canonical(self_exe_dir() / ".." / "lib", ec);
	fs::path found = !ec && fs::exists(lib / kPreloadLibrary, ec) ? lib / kPreloadLibrary : XSRC_INSTALLED_PRELOAD;
	if (!fs::exists(found, ec))
		return {};
	if (found.string().find_first_of(" :") != std::string::npos) {  // ld.so splits LD_PRELOAD there
		std::cerr << "xsrc: note: " << found.string() << " cannot go into LD_PRELOAD (a space or colon "
			  << "in its path); programs get no rdma_cm device\n";
		return {};
	}
	return found;
}

std::string preload_with(const std::string &library, const std::string &current)
{
	std::string out = library;
	for (size_t pos = 0; pos < current.size();) {
		size_t end = current.find_first_of(" :", pos);
		if (end == std::string::npos)
			end = current.size();
		std::string entry = current.substr(pos, end - pos);
		if (!entry.empty() && entry != library)
			out += " " + entry;
		pos = end + 1;
	}
	return out;
}

}  // namespace xsrc::cli
