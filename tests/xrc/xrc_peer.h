// The child side of the XRC tests (see xrc_peer.cpp).
#pragma once

#include <string>
#include <vector>

#include "xrc_util.h"

namespace xrc_test {

// Runs ROLE over `link`; returns the exit status.
int child_main(const std::string &role, Link &link, const std::vector<std::string> &args);

}  // namespace xrc_test
