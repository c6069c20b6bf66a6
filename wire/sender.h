// The sockets RoCE v2 packets leave from: UDP sockets bound to a source
// GID's address and a QP's source port (wire::udp_source_port; or any
// port), so that the kernel's IP header is one we can predict for the ICRC
// (source and destination, ID 0 and DF from an unconnected socket with
// path-MTU discovery on; TOS and TTL are masked).
// The provider sends requests from them (wire_requester.cpp), the daemon its
// responder's acknowledgements (xsrcd/wire_responder.cpp).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/fd.h"
#include "wire/headers.h"

struct xsrc_wire_socket {
	std::array<uint8_t, 16> sgid{};
	bool ipv4 = false;
	uint32_t scope_id = 0;        // an IPv6 link-local source's interface
	in6_addr src6{};              // IPv6 source
	in_addr src4{};               // IPv4 source
	uint16_t src_port = 0;        // host order
	bool any_port = false;        // bound to a port the kernel chose
	// The kernel cuts a datagram into equal segments for us (UDP GSO,
	// Linux 4.18), unless XSRC_WIRE_GSO=0; cleared for good when a send
	// with it fails for a reason a plain send would not.
	mutable std::atomic<bool> gso{false};
	xsrc::unique_fd fd;
};

class xsrc_wire_sender {
public:
	// The socket for `sgid` and UDP source port `src_port` (0: one the
	// kernel picks), made on first use; `ifindex` scopes a link-local
	// address. A port taken by someone else, or past kMaxPortSockets ports,
	// gives the GID's socket of any port instead. Null with errno set when
	// no socket can be made. The pointer stays valid for the sender's life.
	const xsrc_wire_socket *socket_for(const std::array<uint8_t, 16> &sgid, uint32_t ifindex, uint16_t src_port = 0);

	// Sockets of a chosen port a sender keeps (file descriptors are finite).
	static constexpr size_t kMaxPortSockets = 256;

private:
	const xsrc_wire_socket *find_or_make(const std::array<uint8_t, 16> &sgid, uint32_t ifindex, uint16_t src_port);

	std::mutex lock_;
	// A few per source GID: one of the kernel's port, and one per QP port
	// in use (kMaxPortSockets at most); found by port, then GID. A vector,
	// not a map: the provider's context that holds us is standard-layout.
	std::vector<std::unique_ptr<xsrc_wire_socket>> sockets_;
	size_t port_sockets_ = 0;
};

namespace xsrc::wire {

// Sends one RoCE v2 packet from `s` to UDP 4791 of `dgid`'s address: the
// transport headers `headers` (BTH first), `payload` (up to `npayload`
// iovecs, `payload_len` bytes), the pad the BTH announces and the ICRC,
// computed over the IP and UDP headers the kernel will write. The caller
// sets bth.pad to (4 - payload_len % 4) % 4. `hop_limit` (1..255) is the
// TTL / hop limit of a datagram to a multicast GID (0: the socket's, 1);
// unicast keeps the kernel's. Returns 0 or errno; a datagram the network
// cannot take is the caller's loss, as on a wire.
int send_packet(const xsrc_wire_socket &s, const std::array<uint8_t, 16> &dgid, std::span<const uint8_t> headers,
		const iovec *payload, size_t npayload, size_t payload_len, uint8_t hop_limit = 0) noexcept;

// Most payload iovecs send_packet takes.
inline constexpr size_t kMaxPayloadIov = 32;
// Most transport header bytes (BTH and the largest set of extensions).
inline constexpr size_t kMaxHeaders = 64;

// Packets from one socket to one destination, gathered and sent with one
// sendmmsg: a window of a message's packets costs one system call, not one
// each. add() takes what send_packet takes, copies the headers and the iovec
// array (the payload bytes must stay put until the batch is sent), and sends
// the batch first when it is full; flush() sends what is gathered; the
// destructor flushes. As with send_packet, a datagram the network cannot take
// is lost.
// Where the socket has UDP GSO, a run of packets of one size (the last may be
// shorter: a message's MIDDLE packets and its LAST) leaves as one datagram
// that the kernel cuts into its packets, each with its own IP and UDP
// header: one trip through the stack for the run, and across a veth one
// buffer to the peer's packet socket (xsrcd/wire_receiver.cpp splits it).
// An IPv4 segment's ID is its index in the run (the kernel numbers the
// segments from the datagram's 0), so each packet's ICRC is computed for it.
class PacketBatch {
public:
	static constexpr size_t kCapacity = 64;
	// Segments per GSO datagram (the kernel's UDP_MAX_SEGMENTS since 4.18),
	// and the UDP payload one may carry (an IPv4 datagram's limit).
	static constexpr size_t kMaxSegments = 64;
	static constexpr size_t kMaxGsoBytes = 65535 - kIpv4Bytes - kUdpBytes;

	PacketBatch(const xsrc_wire_socket &s, const std::array<uint8_t, 16> &dgid) noexcept;
	~PacketBatch() { flush(); }
	PacketBatch(const PacketBatch &) = delete;
	PacketBatch &operator=(const PacketBatch &) = delete;

	int add(std::span<const uint8_t> headers, const iovec *payload, size_t npayload, size_t payload_len) noexcept;
	int flush() noexcept;

private:
	static constexpr size_t kIovPerPacket = kMaxPayloadIov + 2;  // headers, payload, pad and ICRC
	static constexpr size_t kMaxIov = 1024;                       // UIO_MAXIOV: per datagram
	struct Packet {
		std::array<uint8_t, kMaxHeaders> headers;
		std::array<uint8_t, 8> tail;  // pad and ICRC
		size_t header_len = 0;
		size_t payload_len = 0;
		size_t udp_payload = 0;  // headers, payload, pad, ICRC
		size_t first_iov = 0;    // its pieces: iov_[first_iov, +niov)
		size_t niov = 0;
	};
	// One sendmmsg entry: packets_[first, +count), cut at `segment` bytes
	// when count > 1; `open` while every packet so far has that size.
	struct Datagram {
		size_t first = 0, count = 0;
		size_t segment = 0, bytes = 0;
		bool open = false;
	};
	int send_apart(const Datagram &d) noexcept;
	void lay_out_packet(Packet &p, const iovec *payload, size_t npayload, uint16_t ip_id) noexcept;

	const xsrc_wire_socket &socket_;
	const std::array<uint8_t, 16> &dgid_;
	sockaddr_in6 to6_{};
	sockaddr_in to4_{};
	size_t count_ = 0, iov_used_ = 0, datagrams_ = 0;
	std::array<Packet, kCapacity> packets_;
	std::array<iovec, kCapacity * kIovPerPacket> iov_;
	std::array<Datagram, kCapacity> datagram_;
	std::array<mmsghdr, kCapacity> msgs_;
	std::array<std::array<uint64_t, 4>, kCapacity> control_;  // a UDP_SEGMENT cmsg each
};

}  // namespace xsrc::wire
