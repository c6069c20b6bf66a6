// UDP sockets for RoCE v2, one per source GID, and the send of one packet
// with its ICRC (wire/sender.h).
#include "wire/sender.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "wire/headers.h"

namespace {

namespace w = xsrc::wire;

// A socket bound to s.sgid's address and `port` (0: any).
int make_socket(xsrc_wire_socket &s, uint32_t ifindex, uint16_t port)
{
	s.ipv4 = w::gid_is_ipv4_mapped(s.sgid);
	int family = s.ipv4 ? AF_INET : AF_INET6;
	s.fd.reset(::socket(family, SOCK_DGRAM | SOCK_CLOEXEC, IPPROTO_UDP));
	if (!s.fd)
		return errno;
	int one = 1;
	// Send-only sockets: QPs of other processes may send from the same
	// port (a hash collision); nothing is ever received on them.
	if (port && setsockopt(s.fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)))
		return errno;
	// Path-MTU discovery on: DF set, and (unconnected) the IPv4 ID is 0.
	if (s.ipv4) {
		int pmtu = IP_PMTUDISC_DO;
		if (setsockopt(s.fd.get(), IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu)))
			return errno;
		// Multicast leaves from the source address's netdev, never looped
		// back into this host (its members got the datagram from the
		// shared-memory engine already). Not fatal: unicast needs none of it.
		int zero = 0;
		(void)setsockopt(s.fd.get(), IPPROTO_IP, IP_MULTICAST_LOOP, &zero, sizeof(zero));
		sockaddr_in a{};
		a.sin_family = AF_INET;
		a.sin_port = htons(port);
		a.sin_addr = s.src4 = w::gid_ipv4(s.sgid);
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
	// Multicast: never looped back here, and out of the GID's netdev (IPv6
	// names its interface, as link-local does). Not fatal: unicast needs none.
	int zero = 0, mc_if = static_cast<int>(ifindex);
	(void)setsockopt(s.fd.get(), IPPROTO_IPV6, IPV6_MULTICAST_LOOP, &zero, sizeof(zero));
	if (mc_if)
		(void)setsockopt(s.fd.get(), IPPROTO_IPV6, IPV6_MULTICAST_IF, &mc_if, sizeof(mc_if));
	sockaddr_in6 a{};
	a.sin6_family = AF_INET6;
	a.sin6_port = htons(port);
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

// The IP and UDP headers the kernel will put in front of `udp_payload`
// bytes from socket `s` to `dgid`, for the ICRC: written to `ip`, returns
// their length.
size_t predict_ip_udp(const xsrc_wire_socket &s, const std::array<uint8_t, 16> &dgid, size_t udp_payload,
		      uint8_t *ip)
{
	uint16_t udp_len = static_cast<uint16_t>(w::kUdpBytes + udp_payload);
	size_t ip_len;
	if (s.ipv4) {
		w::Ipv4 h;
		h.total_length = static_cast<uint16_t>(w::kIpv4Bytes + udp_len);
		h.src = s.src4;
		h.dst = w::gid_ipv4(dgid);
		w::encode(h, std::span<uint8_t, w::kIpv4Bytes>(ip, w::kIpv4Bytes));
		ip_len = w::kIpv4Bytes;
	} else {
		w::Ipv6 h;
		h.payload_length = udp_len;
		h.src = s.src6;
		std::memcpy(&h.dst, dgid.data(), sizeof(h.dst));
		w::encode(h, std::span<uint8_t, w::kIpv6Bytes>(ip, w::kIpv6Bytes));
		ip_len = w::kIpv6Bytes;
	}
	w::encode(w::Udp{s.src_port, w::kRoceV2Port, udp_len, 0},
		  std::span<uint8_t, w::kUdpBytes>(ip + ip_len, w::kUdpBytes));
	return ip_len + w::kUdpBytes;
}

}  // namespace

const xsrc_wire_socket *xsrc_wire_sender::socket_for(const std::array<uint8_t, 16> &sgid, uint32_t ifindex,
						     uint16_t src_port)
{
	std::lock_guard guard(lock_);
	if (src_port) {
		for (const auto &s : sockets_)
			if (!s->any_port && s->src_port == src_port && s->sgid == sgid)
				return s.get();
		if (port_sockets_ < kMaxPortSockets)
			if (const xsrc_wire_socket *s = find_or_make(sgid, ifindex, src_port))
				return s;
		// The port is taken (or we have enough): any port will do.
	}
	return find_or_make(sgid, ifindex, 0);
}

const xsrc_wire_socket *xsrc_wire_sender::find_or_make(const std::array<uint8_t, 16> &sgid, uint32_t ifindex,
							uint16_t src_port)
{
	if (!src_port)
		for (const auto &s : sockets_)
			if (s->any_port && s->sgid == sgid)
				return s.get();
	auto s = std::unique_ptr<xsrc_wire_socket>(new (std::nothrow) xsrc_wire_socket);
	if (!s) {
		errno = ENOMEM;
		return nullptr;
	}
	s->sgid = sgid;
	s->any_port = src_port == 0;
	if (int err = make_socket(*s, ifindex, src_port)) {
		errno = err;
		return nullptr;
	}
	const xsrc_wire_socket *made = s.get();
	try {
		sockets_.push_back(std::move(s));
	} catch (const std::bad_alloc &) {
		errno = ENOMEM;
		return nullptr;
	}
	if (src_port)
		++port_sockets_;
	return made;
}

namespace xsrc::wire {
namespace {

// Lays out one packet for sendmsg: the pad and the ICRC (computed over the
// IP and UDP headers the kernel will write, ours, the payload and the pad)
// into `tail`, the pieces into `iov`. Returns how many iovecs, or 0 when the
// packet has too many pieces.
size_t lay_out(const xsrc_wire_socket &s, const std::array<uint8_t, 16> &dgid, std::span<const uint8_t> headers,
	       const iovec *payload, size_t npayload, size_t payload_len, uint8_t *tail, iovec *iov) noexcept
{
	if (headers.size() > kMaxHeaders || npayload > kMaxPayloadIov)
		return 0;
	size_t pad = (4 - payload_len % 4) % 4;
	std::array<uint8_t, kIpv6Bytes + kUdpBytes + kMaxHeaders> pseudo{};
	size_t udp_payload = headers.size() + payload_len + pad + kIcrcBytes;
	size_t ip_udp = predict_ip_udp(s, dgid, udp_payload, pseudo.data());
	std::memcpy(pseudo.data() + ip_udp, headers.data(), headers.size());
	uint32_t crc = *icrc(std::span<const uint8_t>(pseudo.data(), ip_udp + headers.size()));
	for (size_t i = 0; i < npayload; ++i)
		crc = icrc_continue(crc, {static_cast<const uint8_t *>(payload[i].iov_base), payload[i].iov_len});
	std::memset(tail, 0, pad);
	crc = icrc_continue(crc, {tail, pad});
	store_icrc(crc, std::span<uint8_t, kIcrcBytes>(tail + pad, kIcrcBytes));

	size_t n = 0;
	iov[n++] = {const_cast<uint8_t *>(headers.data()), headers.size()};
	for (size_t i = 0; i < npayload; ++i)
		iov[n++] = payload[i];
	iov[n++] = {tail, pad + kIcrcBytes};
	return n;
}

// UDP 4791 of `dgid`'s address, in the socket's family.
void destination(const xsrc_wire_socket &s, const std::array<uint8_t, 16> &dgid, sockaddr_in &a4, sockaddr_in6 &a6,
		 msghdr &msg) noexcept
{
	if (s.ipv4) {
		a4.sin_family = AF_INET;
		a4.sin_port = htons(kRoceV2Port);
		a4.sin_addr = gid_ipv4(dgid);
		msg.msg_name = &a4;
		msg.msg_namelen = sizeof(a4);
	} else {
		a6.sin6_family = AF_INET6;
		a6.sin6_port = htons(kRoceV2Port);
		std::memcpy(&a6.sin6_addr, dgid.data(), sizeof(a6.sin6_addr));
		if (IN6_IS_ADDR_LINKLOCAL(&a6.sin6_addr))
			a6.sin6_scope_id = s.scope_id;
		msg.msg_name = &a6;
		msg.msg_namelen = sizeof(a6);
	}
}

}  // namespace

int send_packet(const xsrc_wire_socket &s, const std::array<uint8_t, 16> &dgid, std::span<const uint8_t> headers,
		const iovec *payload, size_t npayload, size_t payload_len, uint8_t hop_limit) noexcept
{
	std::array<uint8_t, 8> tail;
	std::array<iovec, kMaxPayloadIov + 2> iov;
	size_t n = lay_out(s, dgid, headers, payload, npayload, payload_len, tail.data(), iov.data());
	if (!n)
		return EINVAL;
	sockaddr_in a4{};
	sockaddr_in6 a6{};
	msghdr msg{};
	destination(s, dgid, a4, a6, msg);
	msg.msg_iov = iov.data();
	msg.msg_iovlen = n;
	// A multicast datagram's TTL / hop limit is the address handle's, as
	// rxe puts it (the socket's default would be 1).
	alignas(cmsghdr) std::array<uint8_t, CMSG_SPACE(sizeof(int))> control{};
	if (hop_limit && gid_is_multicast(dgid)) {
		msg.msg_control = control.data();
		msg.msg_controllen = control.size();
		cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = s.ipv4 ? IPPROTO_IP : IPPROTO_IPV6;
		c->cmsg_type = s.ipv4 ? IP_TTL : IPV6_HOPLIMIT;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		int value = hop_limit;
		std::memcpy(CMSG_DATA(c), &value, sizeof(value));
	}
	int saved = errno;
	ssize_t sent = sendmsg(s.fd.get(), &msg, MSG_NOSIGNAL);
	int err = sent < 0 ? errno : 0;
	errno = saved;
	return err;
}

PacketBatch::PacketBatch(const xsrc_wire_socket &s, const std::array<uint8_t, 16> &dgid) noexcept
	: socket_(s), dgid_(dgid)
{
}

int PacketBatch::add(std::span<const uint8_t> headers, const iovec *payload, size_t npayload,
		     size_t payload_len) noexcept
{
	if (headers.size() > kMaxHeaders || npayload > kMaxPayloadIov)
		return EINVAL;
	int err = count_ == kCapacity ? flush() : 0;
	Packet &p = packets_[count_];
	std::memcpy(p.headers.data(), headers.data(), headers.size());
	size_t n = lay_out(socket_, dgid_, {p.headers.data(), headers.size()}, payload, npayload, payload_len,
			   p.tail.data(), p.iov.data());
	msghdr &msg = msgs_[count_].msg_hdr;
	msg = {};
	destination(socket_, dgid_, to4_, to6_, msg);
	msg.msg_iov = p.iov.data();
	msg.msg_iovlen = n;
	++count_;
	return err;
}

int PacketBatch::flush() noexcept
{
	int err = 0, saved = errno;
	size_t done = 0;
	while (done < count_) {
		int sent = sendmmsg(socket_.fd.get(), msgs_.data() + done, static_cast<unsigned>(count_ - done),
				    MSG_NOSIGNAL);
		if (sent < 0) {
			if (errno == EINTR)
				continue;
			// This packet is lost, as on a wire; the rest still go.
			err = errno;
			++done;
			continue;
		}
		done += static_cast<size_t>(sent);
	}
	count_ = 0;
	errno = saved;
	return err;
}

}  // namespace xsrc::wire
