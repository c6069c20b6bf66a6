// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The sockets the wire engine (wire_requester.cpp) sends RoCE v2 packets
// from: one UDP socket per source GID of the context, bound to that GID's
// address, so that the kernel's IP header is one we can predict for the
// ICRC (source and destination, ID 0 and DF from an unconnected socket with
// path-MTU discovery on; TOS and TTL are masked).
#pragma once

#include <netinet/in.h>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/fd.h"

struct xsrc_wire_socket {
	std::array<uint8_t, 16> sgid{};
	bool ipv4 = false;
	uint32_t scope_id = 0;        // an IPv6 link-local source's interface
	in6_addr src6{};              // IPv6 source
	in_addr src4{};               // IPv4 source
	uint16_t src_port = 0;        // host order
	xsrc::unique_fd fd;
};

class xsrc_wire_sender {
public:
	// The socket for `sgid` (made on first use; `ifindex` scopes a link-local
	// address). Null with errno set when it cannot be made. The pointer stays
	// valid for the sender's life.
	const xsrc_wire_socket *socket_for(const std::array<uint8_t, 16> &sgid, uint32_t ifindex);

private:
	std::mutex lock_;
	std::vector<std::unique_ptr<xsrc_wire_socket>> sockets_;  // few: one per source GID used
};
