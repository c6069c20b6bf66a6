// The receive side of the wire (wire_receiver.h).
#include "wire_receiver.h"

#include <arpa/inet.h>
#include <endian.h>
#include <linux/filter.h>
#include <linux/if_arp.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/udp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "log.h"
#include "wire/headers.h"

namespace xsrc {
namespace {

namespace w = wire;

// The virtio-net header a packet socket with PACKET_VNET_HDR puts in front
// of each frame (the virtio spec's struct virtio_net_hdr; little-endian).
struct VnetHeader {
	uint8_t flags;
	uint8_t gso_type;
	uint16_t hdr_len;
	uint16_t gso_size;
	uint16_t csum_start;
	uint16_t csum_offset;
};
constexpr uint8_t kGsoNone = 0, kGsoUdpL4 = 5, kGsoEcn = 0x80;  // gso_type (Linux 6.2 for UDP_L4)

// A frame as the packet socket gives it: the virtio-net header, the
// Ethernet header, then the IP packet, up to a whole GSO datagram (64 KiB
// of UDP).
constexpr size_t kVnetBytes = sizeof(VnetHeader);
static_assert(kVnetBytes == 10);
constexpr size_t kMaxFrame = kVnetBytes + ETH_HLEN + w::kIpv6Bytes + 65536;
// A GSO datagram is cut into at most this many packets (the kernel's
// UDP_MAX_SEGMENTS); each gets its own copy of the IP and UDP headers.
constexpr size_t kMaxSegments = 128;
constexpr size_t kMaxSplit = kMaxFrame + kMaxSegments * (w::kIpv6Bytes + w::kUdpBytes);
// The packet socket's receive buffer.
constexpr int kReceiveBufferBytes = 16 << 20;

// How much of a CPU the thread takes under SCHED_FIFO: the wake-ups of
// latency-bound traffic fit in it; bulk traffic outruns it and is taken
// under the normal policy until the budget has half refilled (as the kernel
// leaves softirq work to ksoftirqd under load), so that the thread never
// keeps a CPU from everyone else: other contexts' commands, the processes
// that send (isolation_copy_stall: ibv_create_qp waited up to 34 ms behind
// a receiver that stayed SCHED_FIFO through 256 MiB of WRITEs).
class FifoBudget {
public:
	// Adds what the time since the last refill earns.
	void refill(uint64_t now)
	{
		tokens_ = std::min(kCapNs, tokens_ + (now - at_) / kShare);
		at_ = now;
	}
	bool refilled() const { return tokens_ >= kCapNs / 2; }
	// Whether `busy` ns of work since the wake-up used the budget up.
	bool spent(uint64_t busy) const { return busy >= tokens_; }
	// Takes `busy` off the budget: true when it is used up.
	bool spend(uint64_t busy)
	{
		tokens_ = busy >= tokens_ ? 0 : tokens_ - busy;
		return tokens_ == 0;
	}

private:
	static constexpr uint64_t kCapNs = 2'000'000;  // 2 ms of work in a row at most
	static constexpr uint64_t kShare = 5;          // earned at 1/5 of real time: 20 % of a CPU
	uint64_t tokens_ = kCapNs;
	uint64_t at_ = 0;
};

// Puts `thread` under SCHED_FIFO at `priority`, or the normal policy for 0:
// 0 or an errno.
int apply_policy(pthread_t thread, int priority)
{
	sched_param param{};
	param.sched_priority = priority;
	return pthread_setschedparam(thread, priority ? SCHED_FIFO : SCHED_OTHER, &param);
}

// A classic BPF program for a packet socket whose frames hold `link` bytes
// of link-layer header before the IP header (an Ethernet header: 14, its
// EtherType IPv4 or IPv6; none: 0): accept IPv4 UDP to 4791 (not a
// fragment, any IHL) and IPv6 whose next header is UDP to 4791; drop
// everything else in the kernel.
std::vector<sock_filter> roce_filter(uint32_t link)
{
	std::vector<sock_filter> f;
	if (link) {
		f.push_back(BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 12));              // EtherType
		f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ETH_P_IP, 1, 0));
		f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ETH_P_IPV6, 0, 16));  // else drop
	}
	const sock_filter ip[] = {
		BPF_STMT(BPF_LD | BPF_B | BPF_ABS, link + 0),              // 0: version nibble
		BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xF0),                 // 1
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x40, 0, 7),           // 2: IPv4? else 10
		BPF_STMT(BPF_LD | BPF_B | BPF_ABS, link + 9),              // 3: protocol
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_UDP, 0, 11),   // 4: else drop
		BPF_STMT(BPF_LD | BPF_H | BPF_ABS, link + 6),              // 5: flags, fragment offset
		BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x1FFF, 9, 0),        // 6: a later fragment: drop
		BPF_STMT(BPF_LDX | BPF_B | BPF_MSH, link),                 // 7: X = IHL * 4
		BPF_STMT(BPF_LD | BPF_H | BPF_IND, link + 2),              // 8: UDP destination port
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, w::kRoceV2Port, 5, 6),  // 9: accept / drop
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x60, 0, 5),           // 10: IPv6? else drop
		BPF_STMT(BPF_LD | BPF_B | BPF_ABS, link + 6),              // 11: next header
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_UDP, 0, 3),    // 12: else drop
		BPF_STMT(BPF_LD | BPF_H | BPF_ABS, link + 42),             // 13: UDP destination port
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, w::kRoceV2Port, 0, 1),  // 14
		BPF_STMT(BPF_RET | BPF_K, kMaxFrame),                      // 15: accept
		BPF_STMT(BPF_RET | BPF_K, 0),                              // 16: drop
	};
	f.insert(f.end(), std::begin(ip), std::end(ip));
	return f;
}

// A program that takes nothing: for a packet socket until its own filter
// is in place, for the port holders for good.
constexpr sock_filter kDropAll[] = {BPF_STMT(BPF_RET | BPF_K, 0)};

int attach(int fd, std::span<const sock_filter> f)
{
	// SO_ATTACH_FILTER copies the program; the cast is the kernel's API.
	sock_fprog prog{static_cast<unsigned short>(f.size()), const_cast<sock_filter *>(f.data())};
	return setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog));
}

// A packet socket bound to netdev `ifindex` that takes RoCE v2 frames only.
// On an Ethernet (or loopback) netdev, a SOCK_RAW socket with the
// virtio-net header, so that a GSO datagram comes up whole with its segment
// size (`vnet`, `link` = 14); elsewhere SOCK_DGRAM, IP header first. 0 or errno.
int packet_socket(int ifindex, unique_fd &out, bool &vnet, uint32_t &link)
{
	for (int type : {SOCK_RAW, SOCK_DGRAM}) {
		// Protocol 0 takes no packet until bind(), after the filter is
		// attached: nothing unfiltered is queued in between.
		unique_fd fd(::socket(AF_PACKET, type | SOCK_CLOEXEC, 0));
		if (!fd)
			return errno;
		sockaddr_ll sll{};
		sll.sll_family = AF_PACKET;
		sll.sll_protocol = htons(ETH_P_ALL);
		sll.sll_ifindex = ifindex;
		socklen_t len = sizeof(sll);
		if (attach(fd.get(), kDropAll) ||
		    bind(fd.get(), reinterpret_cast<sockaddr *>(&sll), sizeof(sll)) ||
		    getsockname(fd.get(), reinterpret_cast<sockaddr *>(&sll), &len))
			return errno;
		bool ethernet = sll.sll_hatype == ARPHRD_ETHER || sll.sll_hatype == ARPHRD_LOOPBACK;
		int one = 1;
		if (type == SOCK_RAW &&
		    (!ethernet || setsockopt(fd.get(), SOL_PACKET, PACKET_VNET_HDR, &one, sizeof(one))))
			continue;
		vnet = type == SOCK_RAW;
		link = vnet ? ETH_HLEN : 0;
		if (attach(fd.get(), roce_filter(link)))
			return errno;
		out = std::move(fd);
		return 0;
	}
	return EINVAL;
}

// A UDP socket on port 4791 that takes nothing (a filter that drops every
// datagram): the port is in use, so the kernel answers no ICMP port
// unreachable to a peer whose packets the packet socket takes.
unique_fd port_holder(int family)
{
	unique_fd fd(::socket(family, SOCK_DGRAM | SOCK_CLOEXEC, IPPROTO_UDP));
	if (!fd)
		return fd;
	int one = 1;
	attach(fd.get(), kDropAll);
	setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	// A GSO datagram from this host's side of a veth is dropped whole, not
	// cut into packets first (Linux 5.0; older kernels cut, then drop).
	setsockopt(fd.get(), IPPROTO_UDP, UDP_GRO, &one, sizeof(one));
	int rc;
	if (family == AF_INET) {
		sockaddr_in a{};
		a.sin_family = AF_INET;
		a.sin_port = htons(w::kRoceV2Port);
		rc = bind(fd.get(), reinterpret_cast<sockaddr *>(&a), sizeof(a));
	} else {
		setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
		// RoCE v2 senders may leave the UDP checksum 0; IPv6 forbids it.
		setsockopt(fd.get(), IPPROTO_UDP, UDP_NO_CHECK6_RX, &one, sizeof(one));
		sockaddr_in6 a{};
		a.sin6_family = AF_INET6;
		a.sin6_port = htons(w::kRoceV2Port);
		rc = bind(fd.get(), reinterpret_cast<sockaddr *>(&a), sizeof(a));
	}
	if (rc)  // another device of this host holds it: as good
		fd.reset();
	return fd;
}

}  // namespace

// When the timer's time may come this much later than it said. Each wake-up
// of a ping-pong leaves an ACK due 200 us on, and takes the one before:
// arming a timer for each (ppoll's timeout) reprogrammed the CPU's timer
// twice per packet, which on this VM (nested) cost about as much as the
// rest of the wake-up: without it, ib_send_lat 8 B across the harness went
// from 47 to 32 us one way and xsrcd's CPU from 160 to 100 ticks per 20000
// round trips. So a timer fd stays armed, and is moved only when it would
// fire more than this late.
constexpr uint64_t kTimerSlackNs = 1'000'000;

struct WireReceiver::Impl {
	unique_fd packets;
	unique_fd stop;
	unique_fd timer;
	unique_fd holder4, holder6;
	std::thread thread;
	uint64_t armed_at = 0;  // when `timer` fires (0: disarmed)

	// The timer should run by `due` (0: nothing due): arms the fd unless it
	// fires by due + kTimerSlackNs already.
	void rearm(uint64_t due)
	{
		if (!due || (armed_at && armed_at <= due + kTimerSlackNs))
			return;
		const uint64_t fire = due + kTimerSlackNs / 2;
		itimerspec at{};
		at.it_value = timespec_of_ns(fire);
		if (timerfd_settime(timer.get(), TFD_TIMER_ABSTIME, &at, nullptr) == 0)
			armed_at = fire;
	}
};

std::unique_ptr<WireReceiver> WireReceiver::start(int ifindex, Deliver deliver, int &err, BatchEnd batch_end,
						   Timer timer, int priority)
{
	std::unique_ptr<WireReceiver> r(new WireReceiver);
	r->deliver_ = std::move(deliver);
	r->batch_end_ = std::move(batch_end);
	r->timer_ = std::move(timer);
	r->impl_ = std::make_unique<Impl>();
	Impl &impl = *r->impl_;
	if (int e = packet_socket(ifindex, impl.packets, r->vnet_, r->link_)) {
		err = e;
		return nullptr;
	}
	// Our own sends are none of ours (the loop below would drop them): the
	// kernel need not clone each one it transmits for us (Linux 4.20;
	// without it the loop still drops them).
	int one = 1;
	(void)setsockopt(impl.packets.get(), SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one));
	// A window of RC packets from each peer arrives at once: room for them
	// (FORCE: past rmem_max, for a daemon with CAP_NET_ADMIN; else the
	// plain request, which the kernel caps).
	int bytes = kReceiveBufferBytes;
	if (setsockopt(impl.packets.get(), SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof(bytes)))
		setsockopt(impl.packets.get(), SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
	impl.stop.reset(eventfd(0, EFD_CLOEXEC));
	impl.timer.reset(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
	if (!impl.stop || !impl.timer) {
		err = errno;
		return nullptr;
	}
	impl.holder4 = port_holder(AF_INET);
	impl.holder6 = port_holder(AF_INET6);
	WireReceiver *self = r.get();
	impl.thread = std::thread([self] {
		Impl &i = *self->impl_;
		// A window of packets is taken in with a few system calls: up to
		// kBatch per recvmmsg, until the socket has no more, before the
		// next poll.
		constexpr size_t kBatch = 32;
		std::vector<uint8_t> bufs(kBatch * kMaxFrame), split(kBatch * kMaxSplit);
		std::array<iovec, kBatch> iov;
		std::array<sockaddr_ll, kBatch> from;
		std::array<mmsghdr, kBatch> msgs;
		pollfd fds[3] = {{i.packets.get(), POLLIN, 0}, {i.stop.get(), POLLIN, 0}, {i.timer.get(), POLLIN, 0}};
		FifoBudget budget;
		bool demoted = false;  // under the normal policy until the budget refills
		for (;;) {
			int ready = ppoll(fds, 3, nullptr, nullptr);
			if (ready < 0 && errno != EINTR)
				return;
			if (ready <= 0)
				continue;
			if (fds[1].revents)
				return;
			if (fds[2].revents) {
				uint64_t expirations;
				if (read(i.timer.get(), &expirations, sizeof(expirations)) < 0) {
					// Not yet expired (moved meanwhile): nothing to clear.
				}
				i.armed_at = 0;
				if (self->timer_)
					i.rearm(self->timer_());
			}
			if (!(fds[0].revents & POLLIN))
				continue;
			uint64_t woke = monotonic_ns();
			budget.refill(woke);
			if (self->priority() && demoted && budget.refilled())
				demoted = !self->set_policy(true);
			// This wake-up's work counts against the budget while under SCHED_FIFO.
			auto fifo = [self, &demoted] { return self->priority() && !demoted; };
			for (;;) {
				for (size_t k = 0; k < kBatch; ++k) {
					iov[k] = {bufs.data() + k * kMaxFrame, kMaxFrame};
					msgs[k] = {};
					msgs[k].msg_hdr.msg_iov = &iov[k];
					msgs[k].msg_hdr.msg_iovlen = 1;
					msgs[k].msg_hdr.msg_name = &from[k];
					msgs[k].msg_hdr.msg_namelen = sizeof(from[k]);
				}
				int n = recvmmsg(i.packets.get(), msgs.data(), kBatch, MSG_DONTWAIT, nullptr);
				for (int k = 0; k < n; ++k) {
					// Only what arrives for this host, to it or to a
					// multicast group (delivery keeps the groups it has
					// members in): not our own sends (OUTGOING) nor their
					// multicast loop-back (LOOPBACK), not frames for other
					// hosts a promiscuous link shows us.
					uint8_t type = from[k].sll_pkttype;
					if (msgs[k].msg_len <= self->vnet_ * kVnetBytes + self->link_ ||
					    (msgs[k].msg_hdr.msg_flags & MSG_TRUNC) ||
					    (type != PACKET_HOST && type != PACKET_MULTICAST))
						continue;
					self->take({bufs.data() + k * kMaxFrame, msgs[k].msg_len},
						   split.data() + k * kMaxSplit);
				}
				if (self->batch_end_)
					self->batch_end_();
				if (n < static_cast<int>(kBatch))
					break;
				if (fifo() && budget.spent(monotonic_ns() - woke))
					demoted = self->set_policy(false);
			}
			if (fifo() && budget.spend(monotonic_ns() - woke))
				demoted = self->set_policy(false);
			if (self->timer_)
				i.rearm(self->timer_());
		}
	});
	r->take_priority(priority);
	return r;
}

WireReceiver::~WireReceiver()
{
	if (impl_ && impl_->thread.joinable()) {
		uint64_t one = 1;
		if (write(impl_->stop.get(), &one, sizeof(one)) < 0) {
			// An eventfd write fails only on overflow: the thread sees it anyway.
		}
		impl_->thread.join();
	}
}

// A packet that wakes this thread is the next step of some QP's message, as
// a NIC's interrupt is: under the normal policy the kernel may leave the
// woken thread waiting behind a process that busy-polls its CQ until that
// one's slice ends. Across the harness (ib_send_lat 8 B, alternating, 8
// runs each) the 99th percentile one-way latency was 415-530 us without
// it, 50-54 us with it; the typical one did not change. Bulk traffic is
// taken under the normal policy (FifoBudget).
void WireReceiver::take_priority(int priority)
{
	if (priority <= 0)
		return;
	if (int e = apply_policy(impl_->thread.native_handle(), priority)) {
		debug_log("wire receiver: SCHED_FIFO %d refused (%s); normal policy\n", priority, strerror(e));
		return;
	}
	priority_.store(priority, std::memory_order_relaxed);
}

bool WireReceiver::set_policy(bool fifo)
{
	return apply_policy(pthread_self(), fifo ? priority() : 0) == 0;
}

void WireReceiver::take(std::span<const uint8_t> frame, uint8_t *split)
{
	VnetHeader vnet{};
	if (vnet_) {
		std::memcpy(&vnet, frame.data(), kVnetBytes);
		frame = frame.subspan(kVnetBytes);
	}
	std::span<const uint8_t> ip_packet = frame.subspan(link_);
	switch (vnet.gso_type & ~kGsoEcn) {
	case kGsoNone:
		handle(ip_packet);
		return;
	case kGsoUdpL4:
		split_gso(ip_packet, le16toh(vnet.gso_size), split);
		return;
	default:  // TCP, or UDP fragmentation: not RoCE
		return;
	}
}

void WireReceiver::split_gso(std::span<const uint8_t> ip_packet, size_t segment, uint8_t *split)
{
	size_t n = w::split_gso(ip_packet, segment, kMaxSegments, split,
				[this](std::span<const uint8_t> packet, bool icrc_ok) { handle(packet, icrc_ok); });
	if (n)
		counters_.gso.fetch_add(1, std::memory_order_relaxed);
}

void WireReceiver::handle(std::span<const uint8_t> ip_packet, bool icrc_checked)
{
	// The IP header's own length: a frame may carry Ethernet padding. Only
	// UDP to 4791 counts (the socket's filter lets nothing else through).
	size_t len = 0, ip_len = 0;
	if (ip_packet.size() >= w::kIpv4Bytes && ip_packet[0] == 0x45 && ip_packet[9] == w::kIpProtoUdp) {
		len = size_t(ip_packet[2]) << 8 | ip_packet[3];
		ip_len = w::kIpv4Bytes;
	} else if (ip_packet.size() >= w::kIpv6Bytes && ip_packet[0] >> 4 == 6 && ip_packet[6] == w::kIpProtoUdp) {
		len = w::kIpv6Bytes + (size_t(ip_packet[4]) << 8 | ip_packet[5]);
		ip_len = w::kIpv6Bytes;
	}
	if (len < ip_len + w::kUdpBytes || len > ip_packet.size() ||
	    w::decode_udp(ip_packet.subspan(ip_len).first<w::kUdpBytes>()).dst_port != w::kRoceV2Port)
		return;
	ip_packet = ip_packet.first(len);
	counters_.received.fetch_add(1, std::memory_order_relaxed);
	if (!icrc_checked && !w::icrc_ok(ip_packet)) {
		counters_.bad_icrc.fetch_add(1, std::memory_order_relaxed);
		return;
	}
	WireOutcome outcome = deliver_ ? deliver_(ip_packet) : WireOutcome::dropped;
	(outcome == WireOutcome::delivered ? counters_.delivered : counters_.dropped)
		.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace xsrc
