// The daemon's debug log: why a command was refused (the dispatcher writes
// one line per refusal), for whoever is looking for a problem. Off unless
// xsrcd runs with --debug (-v) or XSRC_DEBUG=1 in its environment; cheap when
// off: one relaxed load, nothing formatted.
#pragma once

#include <atomic>
#include <string_view>

namespace xsrc {

namespace detail {
inline std::atomic<bool> debug_on{false};
inline thread_local const char *refusal_reason = nullptr;
}  // namespace detail

inline bool debug_enabled() noexcept
{
	return detail::debug_on.load(std::memory_order_relaxed);
}

void set_debug_enabled(bool on) noexcept;

// Refuses the command being dispatched: returns `err` for the handler to
// return and, with debugging on, keeps `why` (which check refused it) for the
// dispatcher's log line. The last reason given before the handler returns wins.
inline int refuse(int err, const char *why) noexcept
{
	if (debug_enabled())
		detail::refusal_reason = why;
	return err;
}

// True when the environment asks for debugging: XSRC_DEBUG set to anything
// but "" or "0".
bool debug_requested_by_environment() noexcept;

// Where debug lines go (without a trailing newline): stderr, which is the
// daemon's log file under `xsrc up`, unless a test captures them.
using LogSink = void (*)(std::string_view line);
// Installs `sink` (nullptr: stderr again); returns the previous one.
LogSink set_log_sink(LogSink sink) noexcept;

// Formats one line and hands it to the sink, when debugging is on.
void debug_log(const char *format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace xsrc
