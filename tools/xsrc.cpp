// xsrc: bring xsrc devices up and down, print their environment, run programs
// that expect them under /sys/class. Plays the part of `rdma link add`.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cli.h"
#include "control_client.h"
#include "daemon_process.h"
#include "mounts.h"
#include "run_namespace.h"
#include "xsrc-abi.h"
#include "xsrc-queues.h"

namespace xsrc::cli {
namespace {

using namespace std::chrono_literals;

constexpr auto kDaemonTimeout = 10s;
constexpr const char *kDefaultDevice = "xsrc0";
constexpr size_t kMaxDeviceName = 63;  // IB_DEVICE_NAME_MAX - 1
constexpr size_t kMaxNetdevName = 15;  // IFNAMSIZ - 1

constexpr const char *kUsage = R"usage(Usage: xsrc [--rundir DIR] COMMAND [OPTIONS]

Manage xsrc, the user-space software RDMA device.

Commands:
  up [--name NAME] [--netdev IF]  bring device NAME (default xsrc0) up, bound
     [--abi N]                    to netdev IF (default: the first one that is
                                  up and has an IPv4 address); starts xsrcd,
                                  which serves driver ABI revision N (default:
                                  the newest; for compatibility tests)
  down [--name NAME]              remove device NAME; without --name remove
                                  every device and stop xsrcd
  status                          list the devices that are up
  env                             print the environment verbs and rdma_cm
                                  programs need: eval "$(xsrc env)"
  run [--] CMD [ARGS...]          run CMD with the devices also visible under
                                  /sys/class/infiniband (private mount namespace)
                                  and the rdma_cm device (LD_PRELOAD)
  help                            print this help

Options:
  --rundir DIR    xsrcd's run directory (default: $XSRC_RUNDIR, else /run/xsrc)

Environment:
  XSRC_DEBUG=1    passed on to the xsrcd that up starts: it logs each refused
                  command, and why, to xsrcd.log in the run directory
  LD_PRELOAD      kept by env and run, after libxsrc-preload.so (which gives
                  dynamically linked, not setuid, programs /dev/infiniband/rdma_cm)

up and down must be run as root; run works for any user (a user namespace
of its own gives it the mount namespace).
Exit status: 0 success, 1 failure, 2 usage error, 3 xsrcd is not running (status).
)usage";

struct Options {
	std::string command;
	std::string rundir;
	std::string name;                  // empty: not given
	std::string netdev;                // empty: the daemon picks one
	std::string abi;                   // empty: xsrcd's default revision
	std::vector<std::string> program;  // xsrc run
};

const std::set<std::string, std::less<>> kCommands = {"up", "down", "status", "env", "run", "help"};

// Which field an option sets and which commands take it (none listed: all).
struct OptionSpec {
	std::string_view option;
	std::string Options::*field;
	std::vector<std::string_view> commands;
};
const OptionSpec kOptionSpecs[] = {
	{"--rundir", &Options::rundir, {}},
	{"--name", &Options::name, {"up", "down"}},
	{"--netdev", &Options::netdev, {"up"}},
	{"--abi", &Options::abi, {"up"}},
};

CliError usage_error(const std::string &what)
{
	return CliError(what + " (see 'xsrc --help')", kExitUsage);
}

bool option_allowed(const OptionSpec &spec, const std::string &command)
{
	return spec.commands.empty() || std::ranges::find(spec.commands, command) != spec.commands.end();
}

// The value of "--opt=VALUE", or of "--opt VALUE" at args[i]; advances i past it.
std::string take_option_value(const std::vector<std::string> &args, size_t &i, std::string_view option)
{
	const std::string &arg = args[i++];
	std::string value;
	if (arg.size() > option.size())
		value = arg.substr(option.size() + 1);
	else if (i < args.size())
		value = args[i++];
	if (value.empty())  // "down --name=" must not mean "down everything"
		throw usage_error(std::string(option) + " needs a value");
	return value;
}

Options parse_command_line(const std::vector<std::string> &args)
{
	Options opts;
	for (size_t i = 0; i < args.size();) {
		const std::string &arg = args[i];
		if (arg == "-h" || arg == "--help") {
			opts.command = "help";
			return opts;
		}
		if (opts.command == "run" && (arg == "--" || !arg.starts_with("-"))) {
			size_t first = arg == "--" ? i + 1 : i;
			opts.program.assign(args.begin() + static_cast<std::ptrdiff_t>(first), args.end());
			return opts;
		}
		if (!arg.starts_with("-")) {
			if (!opts.command.empty())
				throw usage_error("unexpected argument '" + arg + "'");
			if (!kCommands.contains(arg))
				throw usage_error("unknown command '" + arg + "'");
			opts.command = arg;
			++i;
			continue;
		}
		std::string_view option = std::string_view(arg).substr(0, arg.find('='));
		auto spec = std::ranges::find(kOptionSpecs, option, &OptionSpec::option);
		if (spec == std::end(kOptionSpecs) || !option_allowed(*spec, opts.command))
			throw usage_error("unknown option '" + arg + "'" +
					  (opts.command.empty() ? " before the command" : " for '" + opts.command + "'"));
		opts.*spec->field = take_option_value(args, i, option);
	}
	if (opts.command.empty())
		throw usage_error("no command given");
	return opts;
}

// Names travel space-separated in the control protocol and become file names
// in the sysfs view.
void check_name(const std::string &what, const std::string &name, size_t max_length)
{
	bool valid = !name.empty() && name.size() <= max_length && name != "." && name != ".." &&
		     std::ranges::all_of(name, [](unsigned char c) { return std::isgraph(c) && c != '/'; });
	if (!valid)
		throw usage_error("invalid " + what + " name '" + name + "'");
}

void require_root()
{
	if (geteuid() != 0)
		throw CliError("must be run as root");
}

std::string shell_quote(const std::string &word)
{
	bool plain = !word.empty() && std::ranges::all_of(word, [](unsigned char c) {
		return std::isalnum(c) || std::string_view("/._-+=:,@%").find(c) != std::string_view::npos;
	});
	if (plain)
		return word;
	std::string quoted = "'";
	for (char c : word)
		quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
	return quoted + "'";
}

ControlReply request(const RunDir &run, const std::string &message)
{
	auto reply = control_request(run.socket(), message);
	if (!reply)
		throw CliError("xsrcd is not running");
	return *reply;
}

bool daemon_answers(const RunDir &run)
{
	return control_request(run.socket(), "status").has_value();
}

// The first line of a small file, "" when it cannot be read.
std::string first_line(const fs::path &path)
{
	std::ifstream in(path);
	std::string line;
	std::getline(in, line);
	return line;
}

// The devices' arenas, as the daemon's sysfs view names them (so only its
// own: another daemon's view is elsewhere).
std::vector<fs::path> device_arenas(const RunDir &run)
{
	std::vector<fs::path> arenas;
	std::error_code ec;
	for (const auto &dev : fs::directory_iterator(run.sysfs() / "class" / "infiniband", ec)) {
		fs::path arena = first_line(dev.path() / XSRC_SYSFS_SHM_FILE);
		if (arena.is_absolute() && arena.filename().string().starts_with("xsrc-"))
			arenas.push_back(std::move(arena));
	}
	return arenas;
}

// The devices' arenas and /dev/infiniband nodes a dead daemon left, as its
// sysfs view names them. Peers that still map an arena keep their copy.
void remove_stale_device_files(const RunDir &run)
{
	std::error_code ec;
	for (const fs::path &arena : device_arenas(run))
		if (fs::remove(arena, ec))
			std::cerr << "xsrc: removed the stale arena " << arena.string() << "\n";
	for (const auto &uv : fs::directory_iterator(run.sysfs() / "class" / "infiniband_verbs", ec)) {
		const std::string name = uv.path().filename().string();
		const std::string devnum = first_line(uv.path() / "dev");
		unsigned major = 0, minor = 0;
		if (!name.starts_with("uverbs") || std::sscanf(devnum.c_str(), "%u:%u", &major, &minor) != 2)
			continue;
		// Only a node of the number the view announced: never a real HCA's.
		const fs::path node = fs::path("/dev/infiniband") / name;
		struct stat st;
		if (::lstat(node.c_str(), &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(major, minor) &&
		    ::unlink(node.c_str()) == 0)
			std::cerr << "xsrc: removed the stale device node " << node.string() << "\n";
	}
}

// What a daemon that died uncleanly leaves behind. Returns false when that
// included a FUSE mount (a crash: the caller keeps the log).
bool clean_up_after_daemon(const RunDir &run)
{
	int stale_mounts = detach_fuse_mounts(run.fuse_mount());
	if (stale_mounts)
		std::cerr << "xsrc: xsrcd left its FUSE mount at " << run.fuse_mount().string()
			  << " behind; unmounted it\n";
	remove_stale_device_files(run);
	std::error_code ec;
	fs::remove(run.socket(), ec);
	fs::remove(run.pid_file(), ec);
	fs::remove(run.fuse_mount(), ec);  // only when empty
	fs::remove_all(run.sysfs(), ec);    // a stale view would make `xsrc run` think a device is up
	return stale_mounts == 0;
}

std::string daemon_timeout_message(pid_t pid, const RunDir &run, const std::string &what)
{
	return "xsrcd (pid " + std::to_string(pid) + ") " + what + " within " +
	       std::to_string(kDaemonTimeout.count()) + " s; see " + run.log().string();
}

// Runs a new xsrcd and waits until it answers.
void start_daemon(const RunDir &run, const std::string &abi)
{
	fs::path xsrcd = xsrcd_executable();
	if (access(xsrcd.c_str(), X_OK) != 0)
		throw CliError("cannot run " + xsrcd.string() + ": " + errno_text(errno));
	clean_up_after_daemon(run);
	std::error_code ec;
	fs::create_directories(run.dir, ec);
	if (ec)
		throw CliError("cannot create " + run.dir.string() + ": " + ec.message());

	pid_t pid = start_xsrcd(xsrcd, run, abi);
	bool exited = false;
	bool answered = wait_until(kDaemonTimeout, [&] {
		exited = waitpid(pid, nullptr, WNOHANG) == pid;
		return exited || daemon_answers(run);
	});
	if (exited)
		throw CliError("xsrcd failed to start; see " + run.log().string() + ": " + last_log_line(run.log()));
	if (!answered)
		throw CliError(daemon_timeout_message(pid, run, "did not answer"));
	std::cout << "started xsrcd (pid " << pid << ")\n";
}

// Starts xsrcd unless one answers on the socket, and waits until it does.
// A running xsrcd whose binary was rebuilt or reinstalled since it started
// keeps serving the old code: say so rather than silently reuse it.
void warn_if_daemon_replaced(const RunDir &run)
{
	auto pid = running_xsrcd_from_pid_file(run);
	if (!pid)
		return;
	std::error_code ec;
	std::string exe = fs::read_symlink("/proc/" + std::to_string(*pid) + "/exe", ec).string();
	if (!ec && exe.ends_with(" (deleted)"))
		std::cerr << "xsrc: note: xsrcd (pid " << *pid << ") runs a binary that has since been "
			  << "replaced; 'xsrc down && xsrc up' restarts it\n";
}

// A running xsrcd serves one driver ABI revision to every device: a
// different --abi needs a new daemon.
void check_daemon_abi(const RunDir &run, const std::string &abi)
{
	auto pid = running_xsrcd_from_pid_file(run);
	if (abi.empty() || !pid)
		return;
	std::string arg = xsrcd_abi_argument(*pid);
	unsigned long running = arg.empty() ? XSRC_DRIVER_ABI_REVISION : std::strtoul(arg.c_str(), nullptr, 10);
	unsigned long wanted = std::strtoul(abi.c_str(), nullptr, 10);
	if (running != wanted)
		throw CliError("xsrcd (pid " + std::to_string(*pid) + ") serves driver ABI revision " +
			       std::to_string(running) + ", not " + std::to_string(wanted) +
			       "; 'xsrc down' first, or use another --rundir");
}

void ensure_daemon(const RunDir &run, const std::string &abi)
{
	if (daemon_answers(run)) {
		warn_if_daemon_replaced(run);
		check_daemon_abi(run, abi);
		return;
	}
	if (auto pid = running_xsrcd_from_pid_file(run)) {
		// Started by someone else a moment ago (or hung): give it the same time.
		wait_until(kDaemonTimeout, [&] { return daemon_answers(run) || !process_running(*pid); });
		if (daemon_answers(run)) {
			check_daemon_abi(run, abi);
			return;
		}
		if (process_running(*pid))
			throw CliError(daemon_timeout_message(*pid, run, "did not answer"));
	}
	start_daemon(run, abi);
}

// The netdev=<if> field of `ibdev`'s line in the daemon's status.
std::string device_netdev(const RunDir &run, const std::string &ibdev)
{
	std::istringstream lines(expect_ok(request(run, "status")));
	for (std::string line; std::getline(lines, line);) {
		std::istringstream fields(line);
		std::string field;
		if (!(fields >> field) || field != ibdev)
			continue;
		while (fields >> field)
			if (field.starts_with("netdev="))
				return field.substr(7);
	}
	return {};
}

int command_up(const Options &opts)
{
	require_root();
	if (access("/dev/fuse", F_OK) != 0)
		throw CliError("FUSE is not available (/dev/fuse missing); install fuse3 or load the fuse module");
	std::string ibdev = opts.name.empty() ? kDefaultDevice : opts.name;
	check_name("device", ibdev, kMaxDeviceName);
	if (!opts.netdev.empty())
		check_name("netdev", opts.netdev, kMaxNetdevName);
	if (!opts.abi.empty() && !std::ranges::all_of(opts.abi, [](unsigned char c) { return std::isdigit(c); }))
		throw usage_error("invalid driver ABI revision '" + opts.abi + "'");
	RunDir run = RunDir::resolve(opts.rundir);

	ensure_daemon(run, opts.abi);
	std::string result = expect_ok(request(run, "up " + ibdev + " " + (opts.netdev.empty() ? "-" : opts.netdev)));
	std::string netdev = device_netdev(run, ibdev);
	if (result == "created") {
		std::cout << ibdev << " is up" << (netdev.empty() ? "" : " (netdev " + netdev + ")") << "\n";
	} else if (result == "exists") {
		std::cout << ibdev << " is already up\n";
		if (!opts.netdev.empty() && !netdev.empty() && netdev != opts.netdev)
			std::cerr << "xsrc: note: " << ibdev << " stays bound to " << netdev
				  << "; take it down first to bind it to " << opts.netdev << "\n";
	} else {
		throw CliError("unexpected reply from xsrcd: 'ok " + result + "'");
	}
	return 0;
}

// A daemon that exited and left a device's arena behind did not stop the
// way it should: remove the file, and say what its log ended with (the log
// goes with the run directory).
void report_arenas_left(const std::vector<fs::path> &arenas, const RunDir &run)
{
	bool left = false;
	for (const fs::path &arena : arenas) {
		std::error_code ec;
		if (!fs::exists(fs::symlink_status(arena, ec)))
			continue;
		left = true;
		std::cerr << "xsrc: xsrcd exited but left its arena " << arena.string() << " behind; ";
		if (fs::remove(arena, ec))
			std::cerr << "removed it\n";
		else
			std::cerr << "cannot remove it: " << ec.message() << "\n";
	}
	if (left)
		std::cerr << "xsrc: the end of xsrcd's log (" << run.log().string() << "):\n" << log_tail(run.log()) << "\n";
}

int command_down(const Options &opts)
{
	require_root();
	RunDir run = RunDir::resolve(opts.rundir);
	if (!opts.name.empty()) {
		check_name("device", opts.name, kMaxDeviceName);
		auto reply = control_request(run.socket(), "down " + opts.name);
		if (!reply) {
			std::cout << "xsrcd is not running; " << opts.name << " is not up\n";
			return 0;
		}
		expect_ok(*reply);
		std::cout << opts.name << " is down\n";
		return 0;
	}

	// What the daemon must unlink as it stops, named while its view is up.
	const std::vector<fs::path> arenas = device_arenas(run);
	auto reply = control_request(run.socket(), "shutdown");
	if (!reply) {
		if (auto pid = running_xsrcd_from_pid_file(run))
			throw CliError("xsrcd (pid " + std::to_string(*pid) + ") is running but does not answer on " +
				       run.socket().string() + "; see " + run.log().string());
		std::cout << "xsrcd is not running; nothing to take down\n";
		clean_up_after_daemon(run);
		std::error_code ec;
		fs::remove(run.dir, ec);  // only when empty: a log of a failed start stays
		return 0;
	}
	expect_ok(*reply);
	pid_t pid = reply->daemon_pid;
	if (pid > 0 && !wait_until(kDaemonTimeout, [&] { return !process_running(pid); }))
		throw CliError(daemon_timeout_message(pid, run, "did not exit"));
	report_arenas_left(arenas, run);
	if (clean_up_after_daemon(run)) {
		std::error_code ec;
		fs::remove(run.log(), ec);  // a clean run's log is of no further use
		fs::remove(run.dir, ec);    // only when nothing else is left in it
	}
	std::cout << "xsrcd stopped; every xsrc device is down\n";
	return 0;
}

int command_status(const Options &opts)
{
	RunDir run = RunDir::resolve(opts.rundir);
	auto reply = control_request(run.socket(), "status");
	if (!reply) {
		std::cout << "xsrcd is not running\n";
		return kExitNotRunning;
	}
	std::string devices = expect_ok(*reply);
	if (devices.empty())
		std::cout << "xsrcd is running (pid " << reply->daemon_pid << "); no device is up\n";
	else
		std::cout << devices << (devices.ends_with('\n') ? "" : "\n");
	return 0;
}

int command_env(const Options &opts)
{
	RunDir run = RunDir::resolve(opts.rundir);
	std::cout << "export SYSFS_PATH=" << shell_quote(run.sysfs().string()) << "\n";
	if (std::string driver = uninstalled_provider_driver(); !driver.empty())
		std::cout << "export RDMAV_DRIVERS=" << shell_quote(driver) << "\n";
	// The shell's LD_PRELOAD is kept (after ours), and a second eval adds nothing.
	if (fs::path lib = preload_library(); !lib.empty()) {
		const std::string quoted = shell_quote(lib.string());
		std::cout << "case \" ${LD_PRELOAD-} \" in *[\\ :]" << quoted << "[\\ :]*) ;; *) export LD_PRELOAD="
			  << quoted << "\"${LD_PRELOAD:+ $LD_PRELOAD}\" ;; esac\n";
	}
	return 0;
}

bool device_view_present(const RunDir &run)
{
	std::error_code ec;
	fs::directory_iterator devices(run.sysfs() / "class" / "infiniband", ec);
	return !ec && devices != fs::directory_iterator();
}

int command_run(const Options &opts)
{
	if (opts.program.empty())
		throw usage_error("run needs a command: xsrc run -- CMD [ARGS...]");
	RunDir run = RunDir::resolve(opts.rundir);
	if (!device_view_present(run))
		throw CliError("no xsrc device is up; run 'xsrc up' first");

	try {
		overlay_sys_class(run.sysfs() / "class");
		unsetenv("SYSFS_PATH");  // libibverbs finds the view under /sys itself
	} catch (const CliError &e) {
		std::cerr << "xsrc: cannot show the device under /sys/class (" << e.what()
			  << "); only programs that honour SYSFS_PATH will see it\n";
		setenv("SYSFS_PATH", run.sysfs().c_str(), 1);
	}
	if (std::string driver = uninstalled_provider_driver(); !driver.empty())
		setenv("RDMAV_DRIVERS", driver.c_str(), 1);
	if (fs::path lib = preload_library(); !lib.empty()) {
		const char *current = std::getenv("LD_PRELOAD");
		setenv("LD_PRELOAD", preload_with(lib.string(), current ? current : "").c_str(), 1);
		// An ASan-instrumented CMD refuses to start when a preload comes before its
		// runtime. Ours forwards each call it wraps to the next definition (ASan's),
		// so the check may go, unless the user asked for it.
		std::string asan = std::getenv("ASAN_OPTIONS") ? std::getenv("ASAN_OPTIONS") : "";
		if (asan.find("verify_asan_link_order") == std::string::npos)
			setenv("ASAN_OPTIONS", (asan + (asan.empty() ? "" : ":") + "verify_asan_link_order=0").c_str(), 1);
	}

	// exec in place: CMD's exit status, or its death by a signal, is ours.
	std::vector<char *> argv;
	for (const std::string &arg : opts.program)
		argv.push_back(const_cast<char *>(arg.c_str()));
	argv.push_back(nullptr);
	std::cout.flush();
	execvp(argv[0], argv.data());
	int err = errno;
	std::cerr << "xsrc: cannot run " << opts.program[0] << ": " << errno_text(err) << "\n";
	return err == ENOENT ? 127 : 126;  // as a shell reports it
}

int run_command(const Options &opts)
{
	if (opts.command == "help") {
		std::cout << kUsage;
		return 0;
	}
	if (opts.command == "up")
		return command_up(opts);
	if (opts.command == "down")
		return command_down(opts);
	if (opts.command == "status")
		return command_status(opts);
	if (opts.command == "env")
		return command_env(opts);
	return command_run(opts);
}

}  // namespace
}  // namespace xsrc::cli

int main(int argc, char **argv)
{
	using namespace xsrc::cli;
	try {
		return run_command(parse_command_line(std::vector<std::string>(argv + 1, argv + argc)));
	} catch (const CliError &e) {
		std::cerr << "xsrc: " << e.what() << "\n";
		return e.status();
	} catch (const std::exception &e) {
		std::cerr << "xsrc: " << e.what() << "\n";
		return kExitFailure;
	}
}
