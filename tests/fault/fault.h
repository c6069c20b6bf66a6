// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The fault tests (tests/fault/): run inside private_host.sh, whose xsrcd
// and xsrc0 are their own, so killing the daemon disturbs no other test.
#pragma once

#include <string>

#include "side.h"

namespace xsrc::fault {

std::string env_or(const char *name, const char *fallback);
// `$XSRC ARGS` (output discarded); true when it exited 0.
bool run_xsrc(const std::string &args);
// Waits until xsrc0 lists no context and no object.
bool wait_device_idle(ms timeout);

int daemon_death();
int rounds(int count, unsigned long seed);

}  // namespace xsrc::fault
