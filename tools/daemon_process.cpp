#include "daemon_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace xsrc::cli {

fs::path xsrcd_executable()
{
	fs::path beside = self_exe_dir() / "xsrcd";
	if (access(beside.c_str(), X_OK) == 0)
		return beside;
	return XSRC_INSTALLED_XSRCD;
}

[[noreturn]] static void report_errno_and_exit(int report)
{
	int err = errno;
	[[maybe_unused]] ssize_t written = write(report, &err, sizeof err);
	_exit(127);
}

// Only async-signal-safe calls after fork(): the child turns into xsrcd or
// reports the errno through `report` (closed by a successful exec).
// The environment xsrcd runs with: ours, less the rdma_cm interposer in
// LD_PRELOAD, which `xsrc env` and `xsrc run` put there for applications (a
// restart from such a shell, or a test's) and which has no business in the
// daemon: it would turn the daemon's own FUSE files into character devices.
static std::vector<std::string> daemon_environment()
{
	std::vector<std::string> env;
	for (char **e = environ; *e; ++e) {
		std::string_view var(*e);
		constexpr std::string_view kPreload = "LD_PRELOAD=";
		if (!var.starts_with(kPreload)) {
			env.emplace_back(var);
			continue;
		}
		std::string kept;
		std::string_view rest = var.substr(kPreload.size());
		while (!rest.empty()) {
			size_t end = rest.find_first_of(" :");
			std::string_view lib = rest.substr(0, end);
			rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
			std::string_view name = lib.substr(lib.rfind('/') + 1);
			if (lib.empty() || name.starts_with("libxsrc-preload"))
				continue;
			kept += (kept.empty() ? "" : " ") + std::string(lib);
		}
		if (!kept.empty())
			env.push_back(std::string(kPreload) + kept);
	}
	return env;
}

[[noreturn]] static void exec_detached(const char *const argv[], char *const envp[], int devnull, int log, int report)
{
	setsid();  // no controlling terminal: the daemon outlives the shell
	dup2(devnull, STDIN_FILENO);
	dup2(log, STDOUT_FILENO);
	dup2(log, STDERR_FILENO);
	for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO})
		fcntl(fd, F_SETFD, 0);  // dup2 onto itself (xsrc ran with 0-2 closed) keeps O_CLOEXEC
	if (chdir("/") != 0)  // do not pin the caller's working directory
		report_errno_and_exit(report);
	umask(022);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, nullptr);
	// Fds inherited from whoever ran xsrc (a test harness's pipes) must not
	// live on in the daemon.
	close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
	execve(argv[0], const_cast<char *const *>(argv), envp);
	report_errno_and_exit(report);
}

pid_t start_xsrcd(const fs::path &xsrcd, const RunDir &run, const std::string &abi)
{
	unique_fd devnull(open("/dev/null", O_RDONLY | O_CLOEXEC));
	if (!devnull)
		throw CliError("cannot open /dev/null: " + errno_text(errno));
	unique_fd log(open(run.log().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
	if (!log)
		throw CliError("cannot open " + run.log().string() + ": " + errno_text(errno));
	int pipe_fds[2];
	if (pipe2(pipe_fds, O_CLOEXEC) != 0)
		throw CliError("pipe: " + errno_text(errno));
	unique_fd report_read(pipe_fds[0]), report_write(pipe_fds[1]);

	const std::string path = xsrcd.string(), rundir = run.dir.string();
	const char *const argv[] = {path.c_str(), "--rundir", rundir.c_str(),
				    abi.empty() ? nullptr : "--abi", abi.c_str(), nullptr};
	// Made before fork(): the child may only make async-signal-safe calls.
	std::vector<std::string> env = daemon_environment();
	std::vector<char *> envp;
	for (std::string &var : env)
		envp.push_back(var.data());
	envp.push_back(nullptr);
	pid_t pid = fork();
	if (pid < 0)
		throw CliError("fork: " + errno_text(errno));
	if (pid == 0)
		exec_detached(argv, envp.data(), devnull.get(), log.get(), report_write.get());

	report_write = unique_fd();
	int exec_errno = 0;
	ssize_t n;
	do
		n = read(report_read.get(), &exec_errno, sizeof exec_errno);
	while (n < 0 && errno == EINTR);
	if (n == sizeof exec_errno) {
		waitpid(pid, nullptr, 0);
		throw CliError("cannot run " + path + ": " + errno_text(exec_errno));
	}
	return pid;
}

// Fields of /proc/<pid>/stat that matter here: "pid (comm) state ...".
struct ProcStat {
	std::string comm;
	char state = '?';
};

static std::optional<ProcStat> read_proc_stat(pid_t pid)
{
	std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
	std::string line;
	if (!std::getline(in, line))
		return std::nullopt;
	size_t open = line.find('('), close = line.rfind(')');  // comm may hold ')'
	if (open == std::string::npos || close == std::string::npos || close + 2 >= line.size())
		return std::nullopt;
	return ProcStat{line.substr(open + 1, close - open - 1), line[close + 2]};
}

bool process_running(pid_t pid)
{
	auto stat = read_proc_stat(pid);
	return stat && stat->state != 'Z' && stat->state != 'X';
}

std::optional<pid_t> running_xsrcd_from_pid_file(const RunDir &run)
{
	std::ifstream in(run.pid_file());
	pid_t pid = 0;
	if (!(in >> pid) || pid <= 0)
		return std::nullopt;
	// A stale pid file may name a recycled pid: only trust an xsrcd.
	auto stat = read_proc_stat(pid);
	if (!stat || stat->comm != "xsrcd" || !process_running(pid))
		return std::nullopt;
	return pid;
}

std::string xsrcd_abi_argument(pid_t pid)
{
	std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
	std::string arg;
	while (std::getline(in, arg, '\0'))
		if (arg == "--abi" && std::getline(in, arg, '\0'))
			return arg;
	return {};
}

bool wait_until(std::chrono::milliseconds timeout, const std::function<bool()> &done)
{
	constexpr auto kPollInterval = std::chrono::milliseconds(50);
	auto deadline = std::chrono::steady_clock::now() + timeout;
	while (!done()) {
		if (std::chrono::steady_clock::now() >= deadline)
			return done();
		std::this_thread::sleep_for(kPollInterval);
	}
	return true;
}

std::string log_tail(const fs::path &log)
{
	std::ifstream in(log, std::ios::binary | std::ios::ate);
	if (!in)
		return "(no log)";
	constexpr std::streamoff kTail = 4096;
	std::streamoff size = in.tellg();
	in.seekg(std::max<std::streamoff>(0, size - kTail));
	std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
	while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r' || tail.back() == ' '))
		tail.pop_back();
	if (tail.empty())
		return "(log is empty)";
	return tail;
}

std::string last_log_line(const fs::path &log)
{
	std::string tail = log_tail(log);
	return tail.substr(tail.rfind('\n') + 1);  // npos + 1 == 0: a single line
}

}  // namespace xsrc::cli
