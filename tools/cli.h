// What the xsrc CLI's translation units share: the run directory layout, and
// the one way a command fails.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/fd.h"
#include "control_protocol.h"

namespace xsrc::cli {

namespace fs = std::filesystem;

inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitNotRunning = 3;  // as `systemctl status` (LSB)

// A failure to report: main() prints "xsrc: <what>" and exits with status().
class CliError : public std::runtime_error {
public:
	explicit CliError(const std::string &what, int status = kExitFailure)
		: std::runtime_error(what), status_(status) {}
	int status() const { return status_; }

private:
	int status_;
};

std::string errno_text(int err);

// xsrcd's run directory (control_protocol.h) as an absolute path.
struct RunDir {
	fs::path dir;

	// `option` is --rundir; empty means $XSRC_RUNDIR, else kDefaultRunDir.
	static RunDir resolve(const std::string &option);

	fs::path socket() const { return dir / kControlSocketName; }
	fs::path sysfs() const { return dir / kSysfsDirName; }
	fs::path fuse_mount() const { return dir / kFuseDirName; }
	fs::path log() const { return dir / kLogFileName; }
	fs::path pid_file() const { return dir / kPidFileName; }
};

// The directory holding the running xsrc executable.
fs::path self_exe_dir();

// RDMAV_DRIVERS for a provider built next to this xsrc (build/lib beside
// build/bin), or empty when the provider is installed.
std::string uninstalled_provider_driver();

// libxsrc-preload.so (tools/preload), which gives librdmacm programs the
// rdma_cm device: the one built next to this xsrc, else the installed one;
// empty when there is neither.
fs::path preload_library();

// LD_PRELOAD with `library` first and only once, the entries of `current`
// (space- or colon-separated, as ld.so takes them) kept in their order.
std::string preload_with(const std::string &library, const std::string &current);

}  // namespace xsrc::cli
