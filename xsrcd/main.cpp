// xsrcd: the xsrc device daemon. Plays the kernel's part for xsrc devices:
// serves the uverbs command ABI through FUSE, owns every object and id,
// publishes the sysfs view libibverbs discovers devices through.
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/fd.h"
#include "control.h"
#include "control_protocol.h"
#include "daemon.h"
#include "cm.h"
#include "fuse_fs.h"
#include "log.h"
#include "netdev.h"
#include "xsrc-abi.h"

namespace {

pthread_t g_main_thread;

void request_exit()
{
	// The FUSE loop ends when its thread is interrupted by its signal handler.
	pthread_kill(g_main_thread, SIGTERM);
}

[[noreturn]] void usage(int status)
{
	fprintf(status ? stderr : stdout,
		"usage: xsrcd [--rundir DIR] [--abi N] [--ack-delay-us N] [--wire-priority N] [--debug]\n"
		"The xsrc device daemon; normally started by 'xsrc up'.\n"
		"  --abi N       serve driver ABI revision N (1..%d, default %d) to\n"
		"                test providers against an older daemon\n"
		"  --ack-delay-us N  how long an ACK owed to a peer on the wire may\n"
		"                wait for the QP's owner to send it in front of its\n"
		"                next request (default %d; 0: at once); also\n"
		"                XSRC_ACK_DELAY_US in the environment\n"
		"  --wire-priority N  the SCHED_FIFO priority (1..99) of the thread\n"
		"                that takes RoCE v2 off the netdev, as a NIC's\n"
		"                interrupt goes before processes (default %d; 0: the\n"
		"                normal policy); also XSRC_WIRE_PRIORITY\n"
		"  -v, --debug   log every refused command (its name, the errno and\n"
		"                the check that refused it) to stderr, which is\n"
		"                xsrcd.log in the run directory under 'xsrc up';\n"
		"                XSRC_DEBUG=1 in the environment does the same\n",
		XSRC_DRIVER_ABI_REVISION, XSRC_DRIVER_ABI_REVISION,
		static_cast<int>(xsrc::Device::kDefaultAckDelayNs / 1000), xsrc::Daemon::kDefaultWirePriority);
	exit(status);
}

// A decimal number up to `max` (digits only), else false.
bool parse_number(const char *text, unsigned long max, unsigned long &n)
{
	char *end = nullptr;
	errno = 0;
	n = strtoul(text, &end, 10);
	return !errno && *text && !*end && isdigit(static_cast<unsigned char>(text[0])) && n <= max;
}

// --abi N: a revision this daemon can serve, else 0.
uint32_t parse_abi_revision(const std::string &text)
{
	unsigned long n;
	return parse_number(text.c_str(), XSRC_DRIVER_ABI_REVISION, n) ? static_cast<uint32_t>(n) : 0;
}

// --ack-delay-us N: microseconds, at most a second; false if not a number.
bool parse_ack_delay(const char *text, uint64_t &ns)
{
	unsigned long n;
	if (!parse_number(text, 1'000'000, n))
		return false;
	ns = uint64_t(n) * 1000;
	return true;
}

// --wire-priority N: 0 (the normal policy) or a SCHED_FIFO priority; false if not one.
bool parse_wire_priority(const char *text, int &priority)
{
	unsigned long n;
	if (!parse_number(text, static_cast<unsigned long>(sched_get_priority_max(SCHED_FIFO)), n))
		return false;
	priority = static_cast<int>(n);
	return true;
}

// Takes the pid file's lock for the daemon's lifetime: two `xsrc up` at once
// must not start two daemons. Returns the fd, or none if another holds it.
xsrc::unique_fd lock_pidfile(const std::string &pidfile, long &holder)
{
	xsrc::unique_fd fd(open(pidfile.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
	if (!fd)
		return fd;
	if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
		std::ifstream in(pidfile);
		in >> holder;
		return xsrc::unique_fd();
	}
	std::string pid = std::to_string(getpid()) + "\n";
	if (ftruncate(fd.get(), 0) != 0 || pwrite(fd.get(), pid.data(), pid.size(), 0) < 0) {
		// the lock is what matters; the content is informational
	}
	return fd;
}

}  // namespace

int main(int argc, char **argv)
{
	std::string rundir = xsrc::kDefaultRunDir;
	uint32_t abi_revision = XSRC_DRIVER_ABI_REVISION;
	uint64_t ack_delay_ns = xsrc::Device::kDefaultAckDelayNs;
	if (const char *env = getenv("XSRC_ACK_DELAY_US"); env && !parse_ack_delay(env, ack_delay_ns)) {
		fprintf(stderr, "xsrcd: XSRC_ACK_DELAY_US=%s: not a number of microseconds up to 1000000\n", env);
		return 2;
	}
	int wire_priority = xsrc::Daemon::kDefaultWirePriority;
	if (const char *env = getenv("XSRC_WIRE_PRIORITY"); env && !parse_wire_priority(env, wire_priority)) {
		fprintf(stderr, "xsrcd: XSRC_WIRE_PRIORITY=%s: not 0 or a SCHED_FIFO priority up to %d\n", env,
			sched_get_priority_max(SCHED_FIFO));
		return 2;
	}
	bool debug = xsrc::debug_requested_by_environment();
	for (int i = 1; i < argc; ++i) {
		std::string arg = argv[i];
		if (arg == "--rundir" && i + 1 < argc) {
			rundir = argv[++i];
		} else if (arg == "--abi" && i + 1 < argc) {
			abi_revision = parse_abi_revision(argv[++i]);
			if (!abi_revision) {
				fprintf(stderr, "xsrcd: --abi %s: this daemon serves driver ABI revisions 1 to %d\n",
					argv[i], XSRC_DRIVER_ABI_REVISION);
				return 2;
			}
		} else if (arg == "--ack-delay-us" && i + 1 < argc) {
			if (!parse_ack_delay(argv[++i], ack_delay_ns)) {
				fprintf(stderr, "xsrcd: --ack-delay-us %s: not a number of microseconds up to 1000000\n",
					argv[i]);
				return 2;
			}
		} else if (arg == "--wire-priority" && i + 1 < argc) {
			if (!parse_wire_priority(argv[++i], wire_priority)) {
				fprintf(stderr, "xsrcd: --wire-priority %s: not 0 or a SCHED_FIFO priority up to %d\n",
					argv[i], sched_get_priority_max(SCHED_FIFO));
				return 2;
			}
		} else if (arg == "--debug" || arg == "-v") {
			debug = true;
		} else if (arg == "--help" || arg == "-h") {
			usage(0);
		} else {
			usage(2);
		}
	}
	xsrc::set_debug_enabled(debug);
	if (geteuid() != 0) {
		fprintf(stderr, "xsrcd: must run as root\n");
		return 1;
	}
	namespace fs = std::filesystem;
	const std::string sysfs_root = rundir + "/" + xsrc::kSysfsDirName;
	const std::string fuse_root = rundir + "/" + xsrc::kFuseDirName;
	const std::string pidfile = rundir + "/" + xsrc::kPidFileName;
	const std::string socket_path = rundir + "/" + xsrc::kControlSocketName;

	std::error_code ec;
	fs::create_directories(rundir, ec);
	long other = 0;
	xsrc::unique_fd pid_fd = lock_pidfile(pidfile, other);
	if (!pid_fd) {
		fprintf(stderr, "xsrcd: already running (pid %ld)\n", other);
		return 1;
	}
	if (xsrc::unmount_stale(fuse_root))
		fprintf(stderr, "xsrcd: detached a stale mount at %s\n", fuse_root.c_str());
	fs::remove_all(sysfs_root, ec);
	fs::create_directories(sysfs_root, ec);
	fs::create_directories(fuse_root, ec);
	if (ec) {
		fprintf(stderr, "xsrcd: cannot create %s: %s\n", rundir.c_str(), ec.message().c_str());
		return 1;
	}
	chmod(rundir.c_str(), 0755);

	signal(SIGPIPE, SIG_IGN);
	g_main_thread = pthread_self();
	int status = 0;
	{
		xsrc::Daemon daemon(sysfs_root, fuse_root);
		daemon.set_abi_revision(abi_revision);  // validated above
		daemon.set_ack_delay(ack_delay_ns);
		daemon.set_wire_priority(wire_priority);
		xsrc::CmService cm(daemon);
		daemon.set_device_removed_hook([&cm](const std::string &name) { cm.device_removed(name); });
		daemon.set_gsi_hook([&cm](int ifindex, std::span<const uint8_t> packet) { cm.wire_receive(ifindex, packet); });
		xsrc::FuseFs fuse(daemon, cm, fuse_root);
		if (int err = fuse.mount()) {
			fprintf(stderr, "xsrcd: cannot mount the command file system at %s: %s\n",
				fuse_root.c_str(), strerror(err));
			unlink(pidfile.c_str());
			return 1;
		}
		int err = 0;
		auto monitor = xsrc::NetdevMonitor::start(
			[&daemon](int ifindex) { daemon.on_netdev_change(ifindex); }, err);
		if (!monitor)
			fprintf(stderr, "xsrcd: not watching netdevs (%s); port state is fixed\n", strerror(err));
		xsrc::ControlServer control(daemon, socket_path, request_exit);
		control.set_cm(&cm);
		if ((err = control.start())) {
			fprintf(stderr, "xsrcd: cannot listen on %s: %s\n", socket_path.c_str(), strerror(err));
			status = 1;
		} else {
			fprintf(stderr, "xsrcd: serving %s (pid %d, driver ABI %d revision %u)\n", fuse_root.c_str(),
				getpid(), XSRC_DRIVER_ABI_VERSION, abi_revision);
			if (debug)
				fprintf(stderr, "xsrcd: debug log on: every refused command is logged\n");
			fuse.run();
		}
		daemon.remove_all_devices();
		daemon.set_device_removed_hook(nullptr);  // the cm goes first
		daemon.set_gsi_hook(nullptr);             // every receiver is stopped by now
		fuse.unmount();
	}
	fs::remove_all(sysfs_root, ec);
	rmdir(fuse_root.c_str());
	unlink(pidfile.c_str());
	pid_fd.reset();
	fprintf(stderr, "xsrcd: stopped\n");
	return status;
}
