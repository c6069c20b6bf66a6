// Finding, starting and watching the xsrcd process.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "cli.h"

namespace xsrc::cli {

// xsrcd next to this xsrc (a build tree), else the installed one.
fs::path xsrcd_executable();

// Runs `xsrcd --rundir <dir> [--abi <abi>]` in a session of its own, stdin
// from /dev/null, stdout and stderr appended to the log. Returns its pid (our
// child until we exit); throws CliError when it cannot be executed.
pid_t start_xsrcd(const fs::path &xsrcd, const RunDir &run, const std::string &abi = {});

// The --abi argument a running xsrcd was started with; empty when none.
std::string xsrcd_abi_argument(pid_t pid);

// True while `pid` exists and has not exited (a zombie counts as exited).
bool process_running(pid_t pid);

// The pid in the pid file when that process is a running xsrcd.
std::optional<pid_t> running_xsrcd_from_pid_file(const RunDir &run);

// Polls `done` until it returns true or `timeout` passes; returns its last answer.
bool wait_until(std::chrono::milliseconds timeout, const std::function<bool()> &done);

// The last 4 KiB of the log, trailing blank space trimmed; "(no log)" or
// "(log is empty)" when there is nothing to show.
std::string log_tail(const fs::path &log);

// The last non-empty line of the log, for a one-line error report.
std::string last_log_line(const fs::path &log);

}  // namespace xsrc::cli
