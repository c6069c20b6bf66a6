// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Raw packet QPs (IBV_QPT_RAW_PACKET): Ethernet frames on the netdev the
// device is bound to, as a RoCE NIC's raw Ethernet QPs carry them. A send is
// one frame out of a packet socket; frames reach a QP only through flows
// (ibv_create_flow) that match them. Frames any process sends on the netdev
// loop back to matching flows, as a NIC's embedded switch does.
//
// One RawPort per context, made with its first raw packet QP: a send socket
// (never receives) and, while flows exist, a receive socket and a thread
// that delivers what they match into the QPs' posted receives.
#pragma once

#include <pthread.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "common/fd.h"

struct xsrc_context;
struct xsrc_qp;
struct ibv_flow;
struct ibv_flow_attr;
struct iovec;

namespace xsrc {

// Where a frame's headers are (Ethernet, one optional VLAN tag, IPv4 or IPv6,
// TCP or UDP); null pointers for what it lacks.
struct FrameFields {
	const uint8_t *eth = nullptr;
	uint16_t ether_type = 0, vlan_tag = 0;  // network order
	const uint8_t *l3 = nullptr;
	size_t l3_len = 0;
	bool ipv4 = false, ipv6 = false;
	uint8_t l4_proto = 0;
	const uint8_t *l4 = nullptr;
	size_t l4_len = 0;
};
FrameFields frame_fields(const uint8_t *frame, size_t len);

// What one flow matches: the specs of ibv_create_flow, each a value and a
// mask over the frame's fields (a set mask bit must match).
struct FlowMatch {
	struct Eth {
		uint8_t dst[6], src[6];
		uint16_t ether_type, vlan_tag;  // network order
	};
	struct Ipv4 {
		uint32_t src, dst;  // network order
		uint8_t proto, tos, ttl, flags;
	};
	struct Ipv6 {
		uint8_t src[16], dst[16];
		uint32_t flow_label;  // network order
		uint8_t next_hdr, traffic_class, hop_limit;
	};
	struct Ports {
		uint16_t dst, src;  // network order
	};
	bool sniffer = false;  // IBV_FLOW_ATTR_SNIFFER: every frame
	bool has_eth = false, has_ipv4 = false, has_ipv6 = false, has_tcp = false, has_udp = false;
	Eth eth_val{}, eth_mask{};
	Ipv4 ipv4_val{}, ipv4_mask{};
	Ipv6 ipv6_val{}, ipv6_mask{};
	Ports l4_val{}, l4_mask{};

	// Parses the specs that follow `attr`. Returns 0, EINVAL (malformed)
	// or EOPNOTSUPP (a spec, type or flag the device does not have).
	static int parse(const ibv_flow_attr &attr, FlowMatch &out);
	bool matches(const uint8_t *frame, size_t len) const;
};

class RawPort {
public:
	// Opens the send socket on the device's netdev. Returns 0 or an errno.
	static int open(xsrc_context *ctx, RawPort *&out);
	~RawPort();  // stops and joins the receive thread
	RawPort(const RawPort &) = delete;
	RawPort &operator=(const RawPort &) = delete;

	// One frame out of the netdev: 0, or an ibv_wc_status.
	int send(const iovec *iov, size_t count, uint64_t len) noexcept;

	int add_flow(ibv_flow *flow, xsrc_qp *qp, const FlowMatch &match, uint16_t priority);
	void remove_flow(ibv_flow *flow);
	bool has_flows(const xsrc_qp *qp);

private:
	struct Flow {
		ibv_flow *flow;
		xsrc_qp *qp;
		FlowMatch match;
		uint16_t priority;
	};
	RawPort(xsrc_context *ctx, int ifindex, uint32_t mtu, unique_fd send_fd)
		: ctx_(ctx), ifindex_(ifindex), mtu_(mtu), send_fd_(std::move(send_fd))
	{
	}
	int start_receiving();
	static void *thread_main(void *self) noexcept;
	void run() noexcept;
	void deliver(const uint8_t *frame, size_t len) noexcept;

	xsrc_context *ctx_;
	int ifindex_;
	uint32_t mtu_;  // the netdev's: a frame is at most MTU + header (+ a VLAN tag it carries)
	unique_fd send_fd_;
	unique_fd recv_fd_, stop_fd_;
	std::mutex lock_;  // flows_; held while a frame is delivered
	std::vector<Flow> flows_;
	bool started_ = false;
	pthread_t thread_{};
};

}  // namespace xsrc
