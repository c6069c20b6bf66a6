#include "log.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace xsrc {
namespace {

void stderr_sink(std::string_view line)
{
	fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
}

std::atomic<LogSink> g_sink{stderr_sink};

}  // namespace

void set_debug_enabled(bool on) noexcept
{
	detail::debug_on.store(on, std::memory_order_relaxed);
}

bool debug_requested_by_environment() noexcept
{
	const char *value = getenv("XSRC_DEBUG");
	return value && *value && strcmp(value, "0") != 0;
}

LogSink set_log_sink(LogSink sink) noexcept
{
	return g_sink.exchange(sink ? sink : stderr_sink);
}

void debug_log(const char *format, ...)
{
	if (!debug_enabled())
		return;
	char line[512];
	va_list ap;
	va_start(ap, format);
	int n = vsnprintf(line, sizeof(line), format, ap);
	va_end(ap);
	if (n < 0)
		return;
	size_t len = static_cast<size_t>(n) < sizeof(line) ? static_cast<size_t>(n) : sizeof(line) - 1;
	g_sink.load()(std::string_view(line, len));
}

}  // namespace xsrc
