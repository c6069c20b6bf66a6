// UDP sockets for RoCE v2, one per source GID, and the send of one packet
// with its ICRC (wire/sender.h).
#include "wire/sender.h"

#include <netinet/udp.h>
#include <sys/socket.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "wire/headers.h"

namespace {

namespace w = xsrc::wire;

// UDP GSO unless XSRC_WIRE_GSO=0 (a packet per datagram, as before), and
// only on Linux 6.2 and later. Across a veth the datagram reaches the other
// side's xsrcd whole (same kernel), and a packet socket can tell it the
// segment size in a virtio-net header only since 6.2 (GSO_UDP_L4); an
// older one fails the receive. Through a NIC the kernel cuts it here.
bool gso_wanted()
{
	const char *v = std::getenv("XSRC_WIRE_GSO");
	if (v && std::strcmp(v, "0") == 0)
		return false;
	utsname u{};
	unsigned major = 0, minor = 0;
	if (uname(&u) || std::sscanf(u.release, "%u.%u", &major, &minor) != 2)
		return false;
	return major > 6 || (major == 6 && minor >= 2);
}

// A socket bound to s.sgid's address and `port` (0: any).
int make_socket(xsrc_wire_socket &s, uint32_t ifindex, uint16_t port)
{
	s.ipv4 = w::gid_is_ipv4_mapped(s.sgid);
	int family = s.ipv4 ? AF_INET : AF_INET6;
	s.fd.reset(::socket(family, SOCK_DGRAM | SOCK_CLOEXEC, IPPROTO_UDP));
	if (!s.fd)
		return errno;
	int one = 1;
	// A kernel that knows UDP_SEGMENT takes a per-socket size of 0 (none):
	// the datagrams that want GSO say so in a control message.
	int no_segment = 0;
	s.gso = gso_wanted() && setsockopt(s.fd.get(), IPPROTO_UDP, UDP_SEGMENT, &no_segment, sizeof(no_segment)) == 0;
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
// their length. `ip_id`: an IPv4 header's ID (0 for a datagram of its own,
// the index of a GSO segment).
size_t predict_ip_udp(const xsrc_wire_socket &s, const std::array<uint8_t, 16> &dgid, size_t udp_payload,
		      uint16_t ip_id, uint8_t *ip)
{
	uint16_t udp_len = static_cast<uint16_t>(w::kUdpBytes + udp_payload);
	size_t ip_len;
	if (s.ipv4) {
		w::Ipv4 h;
		h.total_length = static_cast<uint16_t>(w::kIpv4Bytes + udp_len);
		h.id = ip_id;
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

// What one packet puts in its UDP datagram: our headers, the payload, its pad
// and the ICRC.
constexpr size_t udp_payload_of(size_t header_len, size_t payload_len) noexcept
{
	return header_len + payload_len + pad_of(payload_len) + kIcrcBytes;
}

// Lays out one packet for sendmsg: the pad and the ICRC (computed over the
// IP and UDP headers the kernel will write, ours, the payload and the pad)
// into `tail`, the pieces into `iov`. Returns how many iovecs, or 0 when the
// packet has too many pieces. `ip_id` as for predict_ip_udp.
size_t lay_out(const xsrc_wire_socket &s, const std::array<uint8_t, 16> &dgid, std::span<const uint8_t> headers,
	       const iovec *payload, size_t npayload, size_t payload_len, uint8_t *tail, iovec *iov,
	       uint16_t ip_id = 0) noexcept
{
	if (headers.size() > kMaxHeaders || npayload > kMaxPayloadIov)
		return 0;
	size_t pad = pad_of(payload_len);
	std::array<uint8_t, kIpv6Bytes + kUdpBytes + kMaxHeaders> pseudo{};
	size_t ip_udp = predict_ip_udp(s, dgid, udp_payload_of(headers.size(), payload_len), ip_id, pseudo.data());
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

void PacketBatch::lay_out_packet(Packet &p, const iovec *payload, size_t npayload, uint16_t ip_id) noexcept
{
	p.niov = lay_out(socket_, dgid_, {p.headers.data(), p.header_len}, payload, npayload, p.payload_len,
			 p.tail.data(), iov_.data() + p.first_iov, ip_id);
}

int PacketBatch::add(std::span<const uint8_t> headers, const iovec *payload, size_t npayload,
		     size_t payload_len) noexcept
{
	if (headers.size() > kMaxHeaders || npayload > kMaxPayloadIov)
		return EINVAL;
	int err = count_ == kCapacity ? flush() : 0;
	Packet &p = packets_[count_];
	std::memcpy(p.headers.data(), headers.data(), headers.size());
	p.header_len = headers.size();
	p.payload_len = payload_len;
	p.udp_payload = udp_payload_of(headers.size(), payload_len);
	p.first_iov = iov_used_;

	// Joins the last datagram as its next segment when it has that size
	// (or is its shorter last), else starts a datagram of its own.
	Datagram *d = datagrams_ ? &datagram_[datagrams_ - 1] : nullptr;
	bool join = d && socket_.gso.load(std::memory_order_relaxed) && d->open && p.udp_payload <= d->segment &&
		    d->count < kMaxSegments && d->bytes + p.udp_payload <= kMaxGsoBytes &&
		    iov_used_ - packets_[d->first].first_iov + kIovPerPacket <= kMaxIov;
	if (join) {
		lay_out_packet(p, payload, npayload, static_cast<uint16_t>(d->count));
		++d->count;
		d->bytes += p.udp_payload;
		d->open = p.udp_payload == d->segment;
	} else {
		lay_out_packet(p, payload, npayload, 0);
		d = &datagram_[datagrams_++];
		*d = {count_, 1, p.udp_payload, p.udp_payload, true};
	}
	iov_used_ += p.niov;
	++count_;
	return err;
}

// A GSO datagram the kernel refused: its packets again, one datagram each
// (their ICRCs are computed anew, for ID 0).
int PacketBatch::send_apart(const Datagram &d) noexcept
{
	int err = 0;
	sockaddr_in a4{};
	sockaddr_in6 a6{};
	for (size_t i = d.first; i < d.first + d.count; ++i) {
		Packet &p = packets_[i];
		// The payload's iovecs are still where the first lay-out put them.
		std::array<iovec, kMaxPayloadIov> payload;
		size_t npayload = p.niov - 2;
		std::copy_n(iov_.data() + p.first_iov + 1, npayload, payload.data());
		lay_out_packet(p, payload.data(), npayload, 0);
		msghdr msg{};
		destination(socket_, dgid_, a4, a6, msg);
		msg.msg_iov = iov_.data() + p.first_iov;
		msg.msg_iovlen = p.niov;
		if (sendmsg(socket_.fd.get(), &msg, MSG_NOSIGNAL) < 0)
			err = errno;
	}
	return err;
}

int PacketBatch::flush() noexcept
{
	int err = 0, saved = errno;
	for (size_t i = 0; i < datagrams_; ++i) {
		const Datagram &d = datagram_[i];
		const Packet &first = packets_[d.first], &last = packets_[d.first + d.count - 1];
		msghdr &msg = msgs_[i].msg_hdr;
		msg = {};
		destination(socket_, dgid_, to4_, to6_, msg);
		msg.msg_iov = iov_.data() + first.first_iov;
		msg.msg_iovlen = last.first_iov + last.niov - first.first_iov;
		if (d.count > 1) {
			msg.msg_control = control_[i].data();
			msg.msg_controllen = CMSG_SPACE(sizeof(uint16_t));
			cmsghdr *c = CMSG_FIRSTHDR(&msg);
			c->cmsg_level = IPPROTO_UDP;
			c->cmsg_type = UDP_SEGMENT;
			c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
			uint16_t segment = static_cast<uint16_t>(d.segment);
			std::memcpy(CMSG_DATA(c), &segment, sizeof(segment));
		}
	}
	size_t done = 0;
	while (done < datagrams_) {
		int sent = sendmmsg(socket_.fd.get(), msgs_.data() + done, static_cast<unsigned>(datagrams_ - done),
				    MSG_NOSIGNAL);
		if (sent < 0) {
			if (errno == EINTR)
				continue;
			err = errno;
			const Datagram &d = datagram_[done];
			// A kernel or route that cannot segment (no checksum offload
			// for it, IPsec: EINVAL, EIO; no GSO: EOPNOTSUPP) gets these
			// packets and every later one as datagrams of their own.
			// Anything else is the network's loss, as on a wire: RC's
			// timer resends; the rest of the batch still goes.
			if (d.count > 1 && (err == EINVAL || err == EIO || err == EOPNOTSUPP || err == ENOPROTOOPT)) {
				socket_.gso.store(false, std::memory_order_relaxed);
				err = send_apart(d);
			}
			++done;
			continue;
		}
		done += static_cast<size_t>(sent);
	}
	count_ = iov_used_ = datagrams_ = 0;
	errno = saved;
	return err;
}

}  // namespace xsrc::wire
