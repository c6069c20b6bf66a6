// RoCE v2 from the wire into a device: a packet socket on the device's
// netdev sees every IPv4 and IPv6 UDP datagram to port 4791 with its real
// IP header (the ICRC covers it: a UDP socket would not show it), on a
// thread of its own. The ICRC is checked here; what passes goes to the
// daemon's delivery (wire_deliver.cpp), under the daemon's lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace xsrc {

// What became of a packet that reached a device.
enum class WireOutcome { delivered, dropped };

struct WireCounters {
	std::atomic<uint64_t> received{0};   // RoCE v2 packets to this host
	std::atomic<uint64_t> bad_icrc{0};   // dropped: the ICRC did not check
	std::atomic<uint64_t> delivered{0};  // into a receive of a QP
	std::atomic<uint64_t> dropped{0};    // no such QP, Q_Key, receive, opcode
	std::atomic<uint64_t> gso{0};        // GSO datagrams cut into their packets
};

class WireReceiver {
public:
	// Called with the IP packet (IP header .. ICRC) of each packet whose ICRC checked.
	using Deliver = std::function<WireOutcome(std::span<const uint8_t> ip_packet)>;
	// Called after each batch of packets taken in at once, before their
	// buffers are reused (the deliverer may hold on to them until then).
	using BatchEnd = std::function<void()>;
	// Called after each batch and once the time it returned came (a
	// CLOCK_MONOTONIC time in ns; 0: none), within a millisecond after it
	// when no packet comes first: runs what is due by then.
	using Timer = std::function<uint64_t()>;
	// Opens the sockets on netdev `ifindex` and starts the thread, under
	// SCHED_FIFO at `priority` (1..99; 0: the normal policy). Returns null
	// with `err` set when a socket cannot be made (no CAP_NET_RAW).
	static std::unique_ptr<WireReceiver> start(int ifindex, Deliver deliver, int &err, BatchEnd batch_end = {},
						   Timer timer = {}, int priority = 0);
	~WireReceiver();  // stops and joins the thread
	WireReceiver(const WireReceiver &) = delete;
	WireReceiver &operator=(const WireReceiver &) = delete;

	const WireCounters &counters() const { return counters_; }
	// The SCHED_FIFO priority the thread got: 0 when it asked for none or
	// was refused one (no CAP_SYS_NICE, no real-time budget in its cgroup).
	int priority() const { return priority_.load(std::memory_order_relaxed); }

private:
	WireReceiver() = default;
	// Puts the thread under SCHED_FIFO at `priority` if it may.
	void take_priority(int priority);
	// From the thread: SCHED_FIFO at priority() again, or the normal
	// policy for a while. False if the kernel refused.
	bool set_policy(bool fifo);
	// One frame off the packet socket (virtio-net header, IP packet): a
	// packet to handle(), or a GSO datagram to split_gso().
	void take(std::span<const uint8_t> frame, uint8_t *split);
	// A GSO datagram: its packets (wire::split_gso, into `split`) handled in order.
	void split_gso(std::span<const uint8_t> ip_packet, size_t segment, uint8_t *split);
	// One packet off the socket: counted, its ICRC checked (unless the
	// caller did), delivered.
	void handle(std::span<const uint8_t> ip_packet, bool icrc_checked = false);
	struct Impl;
	std::unique_ptr<Impl> impl_;
	Deliver deliver_;
	BatchEnd batch_end_;
	Timer timer_;
	bool vnet_ = false;  // frames start with a virtio-net header
	uint32_t link_ = 0;  // then this many bytes of link-layer header
	WireCounters counters_;
	std::atomic<int> priority_{0};
};

}  // namespace xsrc
