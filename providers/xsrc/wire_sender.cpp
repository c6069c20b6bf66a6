// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// UDP sockets for RoCE v2, one per source GID (wire_sender.h).
#include "wire_sender.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "wire/headers.h"

namespace {

int make_socket(xsrc_wire_socket &s, uint32_t ifindex)
{
	s.ipv4 = xsrc::wire::gid_is_ipv4_mapped(s.sgid);
	int family = s.ipv4 ? AF_INET : AF_INET6;
	s.fd.reset(::socket(family, SOCK_DGRAM | SOCK_CLOEXEC, IPPROTO_UDP));
	if (!s.fd)
		return errno;
	int one = 1;
	// Path-MTU discovery on: DF set, and (unconnected) the IPv4 ID is 0.
	if (s.ipv4) {
		int pmtu = IP_PMTUDISC_DO;
		if (setsockopt(s.fd.get(), IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu)))
			return errno;
		sockaddr_in a{};
		a.sin_family = AF_INET;
		a.sin_addr = s.src4 = xsrc::wire::gid_ipv4(s.sgid);
		if (bind(s.fd.get(), reinterpret_cast<sockaddr *>(&a), sizeof(a)))
			return errno;
		socklen_t len = sizeof(a);
		if (getsockname(s.fd.get(), reinterpret_cast<sockaddr *>(&a), &len))
			return errno;
		s.src_port = ntohs(a.sin_port);
		return 0;
	}
	int pmtu = IPV6_PMTUDISC_DO;
	if (setsockopt(s.fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) ||
	    setsockopt(s.fd.get(), IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu, sizeof(pmtu)))
		return errno;
	sockaddr_in6 a{};
	a.sin6_family = AF_INET6;
	std::memcpy(&a.sin6_addr, s.sgid.data(), sizeof(a.sin6_addr));
	s.src6 = a.sin6_addr;
	if (IN6_IS_ADDR_LINKLOCAL(&a.sin6_addr))
		a.sin6_scope_id = s.scope_id = ifindex;
	if (bind(s.fd.get(), reinterpret_cast<sockaddr *>(&a), sizeof(a)))
		return errno;
	socklen_t len = sizeof(a);
	if (getsockname(s.fd.get(), reinterpret_cast<sockaddr *>(&a), &len))
		return errno;
	s.src_port = ntohs(a.sin6_port);
	return 0;
}

}  // namespace

const xsrc_wire_socket *xsrc_wire_sender::socket_for(const std::array<uint8_t, 16> &sgid, uint32_t ifindex)
{
	std::lock_guard guard(lock_);
	for (const auto &s : sockets_)
		if (s->sgid == sgid)
			return s.get();
	auto s = std::unique_ptr<xsrc_wire_socket>(new (std::nothrow) xsrc_wire_socket);
	if (!s) {
		errno = ENOMEM;
		return nullptr;
	}
	s->sgid = sgid;
	if (int err = make_socket(*s, ifindex)) {
		errno = err;
		return nullptr;
	}
	try {
		sockets_.push_back(std::move(s));
	} catch (const std::bad_alloc &) {
		errno = ENOMEM;
		return nullptr;
	}
	return sockets_.back().get();
}
