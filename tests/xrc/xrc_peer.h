// The child side of the XRC tests (see xrc_peer.cpp).
#pragma once

#include <string>
#include <vector>

namespace xrc_test {

// Runs ROLE over the socketpair end FD; returns the exit status.
int child_main(const std::string &role, int fd, const std::vector<std::string> &args);

}  // namespace xrc_test
