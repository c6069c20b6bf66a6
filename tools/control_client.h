// The CLI end of the control socket (control_protocol.h): one request, one reply.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

#include "cli.h"

namespace xsrc::cli {

struct ControlReply {
	std::string text;
	pid_t daemon_pid = 0;  // SO_PEERCRED of the socket: the xsrcd that answered
};

// Sends `request` to the daemon listening on `socket` and returns its reply,
// or std::nullopt when nothing listens there (the daemon is not running).
// Throws CliError when the daemon is there but the exchange fails, e.g. no
// reply within 10 s.
std::optional<ControlReply> control_request(const fs::path &socket, std::string_view request);

// The text after "ok" (and its separating space or newline) of a reply; throws
// CliError with the daemon's text for "error <text>".
std::string expect_ok(const ControlReply &reply);

}  // namespace xsrc::cli
