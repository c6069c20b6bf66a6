// Neighbour resolution over rtnetlink: the route toward an address
// (RTM_GETROUTE) names the next hop, the neighbour table (RTM_GETNEIGH) says
// whether its link-layer address is known, and RTM_NEWNEIGH with NTF_USE
// starts resolving it (`ip neigh replace ADDR dev DEV use` does the same).
#include "neigh.h"

#include <linux/neighbour.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <netinet/in.h>

#include <cstring>
#include <vector>

#include "rtnl.h"

namespace xsrc {
namespace {

// One rtnetlink request: a header, its family message, room for attributes.
struct Request {
	nlmsghdr nh;
	union {
		rtmsg rt;
		ndmsg nd;
	};
	alignas(NLMSG_ALIGNTO) unsigned char attrs[64];
};

void put_attr(Request &r, uint16_t type, const void *data, size_t len)
{
	auto *rta = reinterpret_cast<rtattr *>(reinterpret_cast<unsigned char *>(&r) + NLMSG_ALIGN(r.nh.nlmsg_len));
	rta->rta_type = type;
	rta->rta_len = static_cast<unsigned short>(RTA_LENGTH(len));
	std::memcpy(RTA_DATA(rta), data, len);
	r.nh.nlmsg_len = NLMSG_ALIGN(r.nh.nlmsg_len) + RTA_ALIGN(rta->rta_len);
}

// Sends `req` and takes the kernel's first answer to it into `reply` (empty
// for an acknowledgement). 0, or the errno the kernel answered.
int transact(Request &req, std::vector<unsigned char> &reply)
{
	reply.clear();
	return rtnl_exchange(req.nh, [&reply](const nlmsghdr &nh) {
		auto *at = reinterpret_cast<const unsigned char *>(&nh);
		reply.assign(at, at + nh.nlmsg_len);
		return false;
	});
}

// An address as rtnetlink carries it: its family and bytes (an IPv4-mapped
// IPv6 address is the IPv4 one).
struct Address {
	unsigned char family = AF_UNSPEC;
	unsigned char bytes[16] = {};
	size_t size = 0;
};

Address address_of(const sockaddr_storage &a)
{
	Address out;
	if (a.ss_family == AF_INET) {
		out.family = AF_INET;
		out.size = 4;
		std::memcpy(out.bytes, &reinterpret_cast<const sockaddr_in &>(a).sin_addr, 4);
	} else if (a.ss_family == AF_INET6) {
		const in6_addr &v6 = reinterpret_cast<const sockaddr_in6 &>(a).sin6_addr;
		if (IN6_IS_ADDR_V4MAPPED(&v6)) {
			out.family = AF_INET;
			out.size = 4;
			std::memcpy(out.bytes, &v6.s6_addr[12], 4);
		} else {
			out.family = AF_INET6;
			out.size = 16;
			std::memcpy(out.bytes, &v6, 16);
		}
	}
	return out;
}

// The kernel's NUD_VALID (include/net/neighbour.h, not in the uapi): a
// link-layer address to send to.
constexpr uint16_t kNudValid = NUD_PERMANENT | NUD_NOARP | NUD_REACHABLE | NUD_PROBE | NUD_STALE | NUD_DELAY;

// The neighbour to resolve toward `dst` out of `ifindex`: the route's
// gateway, or `dst` itself. Nothing to resolve (`none`) for a route that
// is not unicast (local, broadcast, multicast).
enum class Hop { neighbour, none, failed };
Hop next_hop(int ifindex, Address &addr)
{
	Request req{};
	req.nh.nlmsg_len = NLMSG_LENGTH(sizeof(rtmsg));
	req.nh.nlmsg_type = RTM_GETROUTE;
	req.nh.nlmsg_flags = NLM_F_REQUEST;
	req.rt.rtm_family = addr.family;
	req.rt.rtm_dst_len = static_cast<unsigned char>(addr.size * 8);
	put_attr(req, RTA_DST, addr.bytes, addr.size);
	put_attr(req, RTA_OIF, &ifindex, sizeof(ifindex));
	std::vector<unsigned char> reply;
	if (transact(req, reply) || reply.empty())
		return Hop::failed;
	auto *nh = reinterpret_cast<nlmsghdr *>(reply.data());
	auto *rt = static_cast<rtmsg *>(NLMSG_DATA(nh));
	if (rt->rtm_type != RTN_UNICAST)
		return Hop::none;
	int len = static_cast<int>(RTM_PAYLOAD(nh));
	for (auto *rta = RTM_RTA(rt); RTA_OK(rta, len); rta = RTA_NEXT(rta, len)) {
		if (rta->rta_type == RTA_GATEWAY && RTA_PAYLOAD(rta) == addr.size)
			std::memcpy(addr.bytes, RTA_DATA(rta), addr.size);
	}
	return Hop::neighbour;
}

Request neigh_request(uint16_t type, uint16_t flags, int ifindex, const Address &addr)
{
	Request req{};
	req.nh.nlmsg_len = NLMSG_LENGTH(sizeof(ndmsg));
	req.nh.nlmsg_type = type;
	req.nh.nlmsg_flags = flags;
	req.nd.ndm_family = addr.family;
	req.nd.ndm_ifindex = ifindex;
	put_attr(req, NDA_DST, addr.bytes, addr.size);
	return req;
}

}  // namespace

Neighbour neighbour_of(int ifindex, const sockaddr_storage &dst)
{
	Address addr = address_of(dst);
	if (!addr.size || ifindex <= 0)
		return Neighbour::failed;
	switch (next_hop(ifindex, addr)) {
	case Hop::none:
		return Neighbour::known;
	case Hop::failed:
		return Neighbour::failed;
	case Hop::neighbour:
		break;
	}
	Request get = neigh_request(RTM_GETNEIGH, NLM_F_REQUEST, ifindex, addr);
	std::vector<unsigned char> reply;
	if (transact(get, reply) == 0 && !reply.empty()) {
		auto *nd = static_cast<ndmsg *>(NLMSG_DATA(reinterpret_cast<nlmsghdr *>(reply.data())));
		if (nd->ndm_state & kNudValid)
			return Neighbour::known;
	}
	// As `ip neigh replace ADDR dev DEV use`: with NTF_USE the kernel only
	// starts resolution (the state is not applied).
	Request use = neigh_request(RTM_NEWNEIGH, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE, ifindex,
				    addr);
	use.nd.ndm_state = NUD_PERMANENT;
	use.nd.ndm_flags = NTF_USE;
	if (transact(use, reply))
		return Neighbour::failed;
	return Neighbour::pending;
}

}  // namespace xsrc
