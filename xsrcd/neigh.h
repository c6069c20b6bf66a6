// Neighbour resolution for the connection manager: before rdma_resolve_addr
// reports a route to another host, the kernel's CM knows the link-layer
// address of the next hop toward it (ib_addr's neighbour lookup), and a host
// that never answers ARP or neighbour solicitation is RDMA_CM_EVENT_ADDR_ERROR.
// xsrcd asks the kernel's neighbour table, over rtnetlink, the same question.
#pragma once

#include <sys/socket.h>

namespace xsrc {

enum class Neighbour {
	known,    // the next hop has a link-layer address (or needs none)
	pending,  // not yet: resolution was started (or is under way)
	failed,   // no route out of that netdev, or the kernel refused to look
};

// The next hop toward `dst` out of netdev `ifindex` (the gateway of the
// route, or `dst` itself on the link): known, or pending after starting its
// resolution as a packet to it would (RTM_NEWNEIGH with NTF_USE).
Neighbour neighbour_of(int ifindex, const sockaddr_storage &dst);

}  // namespace xsrc
