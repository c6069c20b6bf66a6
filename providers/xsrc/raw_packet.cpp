// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Raw packet QPs: Ethernet frames on the device's netdev (raw_packet.h).
#include "raw_packet.h"

#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>

#include "peer_memory.h"
#include "xsrc.h"

namespace xsrc {
namespace {

constexpr size_t kEthHeader = 14;
constexpr size_t kVlanTag = 4;
constexpr uint16_t kEtherVlan = ETHERTYPE_VLAN;
// Receive buffer: the largest frame a netdev hands a packet socket (GRO may
// merge past the MTU; such a frame is dropped as too long for any receive).
constexpr size_t kRecvBuffer = 65536 + kEthHeader + kVlanTag;

// (field & mask) == (value & mask), over `n` bytes.
bool masked_equal(const void *field, const void *value, const void *mask, size_t n)
{
	auto *f = static_cast<const uint8_t *>(field), *v = static_cast<const uint8_t *>(value),
	     *m = static_cast<const uint8_t *>(mask);
	for (size_t i = 0; i < n; ++i)
		if ((f[i] & m[i]) != (v[i] & m[i]))
			return false;
	return true;
}

template <typename T>
bool masked_equal(const T &field, const T &value, const T &mask)
{
	return masked_equal(&field, &value, &mask, sizeof(T));
}

// A spec is at least its type's struct (a larger one carries zeros the
// device ignores, as the kernel's copy allows), and no larger than this.
constexpr uint16_t kMaxSpecBytes = 256;

// A spec's filter (its value or its mask) as the fields frames are matched on.
FlowMatch::Eth eth_fields(const ibv_flow_eth_filter &f)
{
	FlowMatch::Eth e{};
	std::memcpy(e.dst, f.dst_mac, 6);
	std::memcpy(e.src, f.src_mac, 6);
	e.ether_type = f.ether_type;
	e.vlan_tag = f.vlan_tag;
	return e;
}

FlowMatch::Ipv4 ipv4_fields(const ibv_flow_ipv4_ext_filter &f)
{
	return {f.src_ip, f.dst_ip, f.proto, f.tos, f.ttl, f.flags};
}

FlowMatch::Ipv6 ipv6_fields(const ibv_flow_ipv6_filter &f)
{
	FlowMatch::Ipv6 i{};
	std::memcpy(i.src, f.src_ip, 16);
	std::memcpy(i.dst, f.dst_ip, 16);
	i.flow_label = f.flow_label;
	i.next_hdr = f.next_hdr;
	i.traffic_class = f.traffic_class;
	i.hop_limit = f.hop_limit;
	return i;
}

// The spec at `at` as a `Spec`, or null when its size is too small for one.
template <typename Spec>
const Spec *spec_as(const ibv_flow_spec *at)
{
	return at->hdr.size < sizeof(Spec) ? nullptr : reinterpret_cast<const Spec *>(at);
}

}  // namespace

FrameFields frame_fields(const uint8_t *f, size_t len)
{
	FrameFields p;
	if (len < kEthHeader)
		return p;
	p.eth = f;
	size_t off = 12;
	std::memcpy(&p.ether_type, f + off, 2);
	off += 2;
	if (ntohs(p.ether_type) == kEtherVlan && len >= off + kVlanTag) {
		std::memcpy(&p.vlan_tag, f + off, 2);
		std::memcpy(&p.ether_type, f + off + 2, 2);
		off += kVlanTag;
	}
	p.l3 = f + off;
	p.l3_len = len - off;
	if (ntohs(p.ether_type) == ETHERTYPE_IP && p.l3_len >= 20) {
		size_t ihl = (p.l3[0] & 0x0f) * 4u;
		if (ihl >= 20 && ihl <= p.l3_len) {
			p.ipv4 = true;
			p.l4_proto = p.l3[9];
			p.l4 = p.l3 + ihl;
			p.l4_len = p.l3_len - ihl;
		}
	} else if (ntohs(p.ether_type) == ETHERTYPE_IPV6 && p.l3_len >= 40) {
		p.ipv6 = true;
		p.l4_proto = p.l3[6];
		p.l4 = p.l3 + 40;
		p.l4_len = p.l3_len - 40;
	}
	return p;
}

int FlowMatch::parse(const ibv_flow_attr &attr, FlowMatch &out)
{
	out = {};
	if (attr.comp_mask || attr.flags)
		return EOPNOTSUPP;
	if (attr.type == IBV_FLOW_ATTR_SNIFFER) {
		out.sniffer = true;
		return attr.num_of_specs ? EINVAL : 0;  // a sniffer takes every frame
	}
	if (attr.type != IBV_FLOW_ATTR_NORMAL)
		return EOPNOTSUPP;
	// The specs follow the attribute, each sized by its own header (as
	// libibverbs walks them; attr.size is not filled in by every caller).
	auto *at = reinterpret_cast<const ibv_flow_spec *>(&attr + 1);
	for (uint8_t i = 0; i < attr.num_of_specs; ++i) {
		if (at->hdr.size < sizeof(at->hdr) || at->hdr.size > kMaxSpecBytes)
			return EINVAL;
		switch (at->hdr.type) {
		case IBV_FLOW_SPEC_ETH: {
			auto *s = spec_as<ibv_flow_spec_eth>(at);
			if (!s || out.has_eth)
				return EINVAL;
			out.has_eth = true;
			out.eth_val = eth_fields(s->val);
			out.eth_mask = eth_fields(s->mask);
			break;
		}
		case IBV_FLOW_SPEC_IPV4:
		case IBV_FLOW_SPEC_IPV4_EXT: {
			if (out.has_ipv4 || out.has_ipv6)
				return EINVAL;
			out.has_ipv4 = true;
			if (at->hdr.type == IBV_FLOW_SPEC_IPV4) {
				auto *s = spec_as<ibv_flow_spec_ipv4>(at);
				if (!s)
					return EINVAL;
				out.ipv4_val = {s->val.src_ip, s->val.dst_ip, 0, 0, 0, 0};
				out.ipv4_mask = {s->mask.src_ip, s->mask.dst_ip, 0, 0, 0, 0};
			} else {
				auto *s = spec_as<ibv_flow_spec_ipv4_ext>(at);
				if (!s)
					return EINVAL;
				out.ipv4_val = ipv4_fields(s->val);
				out.ipv4_mask = ipv4_fields(s->mask);
			}
			break;
		}
		case IBV_FLOW_SPEC_IPV6: {
			auto *s = spec_as<ibv_flow_spec_ipv6>(at);
			if (!s || out.has_ipv4 || out.has_ipv6)
				return EINVAL;
			out.has_ipv6 = true;
			out.ipv6_val = ipv6_fields(s->val);
			out.ipv6_mask = ipv6_fields(s->mask);
			break;
		}
		case IBV_FLOW_SPEC_TCP:
		case IBV_FLOW_SPEC_UDP: {
			auto *s = spec_as<ibv_flow_spec_tcp_udp>(at);
			if (!s || out.has_tcp || out.has_udp)
				return EINVAL;
			(at->hdr.type == IBV_FLOW_SPEC_TCP ? out.has_tcp : out.has_udp) = true;
			out.l4_val = {s->val.dst_port, s->val.src_port};
			out.l4_mask = {s->mask.dst_port, s->mask.src_port};
			break;
		}
		default:  // tunnels, MPLS, ESP, actions, inner headers
			return EOPNOTSUPP;
		}
		at = reinterpret_cast<const ibv_flow_spec *>(reinterpret_cast<const uint8_t *>(at) + at->hdr.size);
	}
	return 0;
}

bool FlowMatch::matches(const uint8_t *frame, size_t len) const
{
	if (sniffer)
		return true;
	FrameFields p = frame_fields(frame, len);
	if (!p.eth)
		return false;
	if (has_eth) {
		Eth f{};
		std::memcpy(f.dst, p.eth, 6);
		std::memcpy(f.src, p.eth + 6, 6);
		f.ether_type = p.ether_type;
		f.vlan_tag = p.vlan_tag;
		if (!masked_equal(f.dst, eth_val.dst, eth_mask.dst, 6) ||
		    !masked_equal(f.src, eth_val.src, eth_mask.src, 6) ||
		    !masked_equal(f.ether_type, eth_val.ether_type, eth_mask.ether_type) ||
		    !masked_equal(f.vlan_tag, eth_val.vlan_tag, eth_mask.vlan_tag))
			return false;
	}
	if (has_ipv4) {  // an IPv4 spec matches IPv4 packets only
		if (!p.ipv4)
			return false;
		Ipv4 f{};
		std::memcpy(&f.src, p.l3 + 12, 4);
		std::memcpy(&f.dst, p.l3 + 16, 4);
		f.proto = p.l3[9];
		f.tos = p.l3[1];
		f.ttl = p.l3[8];
		f.flags = static_cast<uint8_t>(p.l3[6] >> 5);
		if (!masked_equal(f.src, ipv4_val.src, ipv4_mask.src) || !masked_equal(f.dst, ipv4_val.dst, ipv4_mask.dst) ||
		    !masked_equal(f.proto, ipv4_val.proto, ipv4_mask.proto) ||
		    !masked_equal(f.tos, ipv4_val.tos, ipv4_mask.tos) || !masked_equal(f.ttl, ipv4_val.ttl, ipv4_mask.ttl) ||
		    !masked_equal(f.flags, ipv4_val.flags, ipv4_mask.flags))
			return false;
	}
	if (has_ipv6) {
		if (!p.ipv6)
			return false;
		Ipv6 f{};
		std::memcpy(f.src, p.l3 + 8, 16);
		std::memcpy(f.dst, p.l3 + 24, 16);
		uint32_t vtc;
		std::memcpy(&vtc, p.l3, 4);
		f.flow_label = htonl(ntohl(vtc) & 0xfffff);
		f.traffic_class = static_cast<uint8_t>(ntohl(vtc) >> 20);
		f.next_hdr = p.l3[6];
		f.hop_limit = p.l3[7];
		if (!masked_equal(f.src, ipv6_val.src, ipv6_mask.src, 16) ||
		    !masked_equal(f.dst, ipv6_val.dst, ipv6_mask.dst, 16) ||
		    !masked_equal(f.flow_label, ipv6_val.flow_label, ipv6_mask.flow_label) ||
		    !masked_equal(f.next_hdr, ipv6_val.next_hdr, ipv6_mask.next_hdr) ||
		    !masked_equal(f.traffic_class, ipv6_val.traffic_class, ipv6_mask.traffic_class) ||
		    !masked_equal(f.hop_limit, ipv6_val.hop_limit, ipv6_mask.hop_limit))
			return false;
	}
	if (has_tcp || has_udp) {  // a TCP or UDP spec names its protocol
		uint8_t want = has_tcp ? IPPROTO_TCP : IPPROTO_UDP;
		if (!p.l4 || p.l4_proto != want || p.l4_len < 4)
			return false;
		Ports f{};
		std::memcpy(&f.src, p.l4, 2);
		std::memcpy(&f.dst, p.l4 + 2, 2);
		if (!masked_equal(f.src, l4_val.src, l4_mask.src) || !masked_equal(f.dst, l4_val.dst, l4_mask.dst))
			return false;
	}
	return true;
}

// --- the port ----------------------------------------------------------------

int RawPort::open(xsrc_context *ctx, RawPort *&out)
{
	ibv_gid_entry gid{};
	if (ibv_query_gid_ex(&ctx->ibv_ctx.context, 1, 0, &gid, 0) || !gid.ndev_ifindex) {
		verbs_err(&ctx->ibv_ctx, "raw packet QP: the device's netdev is not in this network namespace\n");
		return ENODEV;
	}
	int ifindex = static_cast<int>(gid.ndev_ifindex);
	unique_fd fd(socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0));
	if (!fd)
		return errno;
	// Protocol 0: this socket only sends.
	sockaddr_ll addr{};
	addr.sll_family = AF_PACKET;
	addr.sll_ifindex = ifindex;
	if (bind(fd.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)))
		return errno;
	ifreq ifr{};
	if (!if_indextoname(static_cast<unsigned>(ifindex), ifr.ifr_name) || ioctl(fd.get(), SIOCGIFMTU, &ifr))
		return errno;
	out = new (std::nothrow) RawPort(ctx, ifindex, static_cast<uint32_t>(ifr.ifr_mtu), std::move(fd));
	return out ? 0 : ENOMEM;
}

RawPort::~RawPort()
{
	if (!started_)
		return;
	uint64_t one = 1;
	if (write(stop_fd_.get(), &one, sizeof(one)) != sizeof(one)) {
		// An eventfd write of 1 fails only on overflow: the thread was told.
	}
	pthread_join(thread_, nullptr);
}

int RawPort::send(const iovec *iov, size_t count, uint64_t len) noexcept
{
	if (len < kEthHeader)
		return IBV_WC_LOC_LEN_ERR;
	// The EtherType, wherever the gather list puts bytes 12 and 13: a frame
	// with a VLAN tag may be 4 bytes longer, as the netdev takes it.
	uint8_t type[2];
	for (size_t i = 0, at = 0, got = 0; i < count && got < 2; at += iov[i++].iov_len)
		for (size_t b = 0; b < iov[i].iov_len && got < 2; ++b)
			if (at + b >= 12)
				type[got++] = static_cast<const uint8_t *>(iov[i].iov_base)[b];
	bool tagged = (type[0] << 8 | type[1]) == kEtherVlan;
	if (len > mtu_ + kEthHeader + (tagged ? kVlanTag : 0))
		return IBV_WC_LOC_LEN_ERR;
	sockaddr_ll to{};
	to.sll_family = AF_PACKET;
	to.sll_ifindex = ifindex_;
	msghdr msg{};
	msg.msg_name = &to;
	msg.msg_namelen = sizeof(to);
	msg.msg_iov = const_cast<iovec *>(iov);
	msg.msg_iovlen = count;
	if (sendmsg(send_fd_.get(), &msg, 0) >= 0)
		return 0;
	switch (errno) {
	case EFAULT:
		return IBV_WC_LOC_PROT_ERR;
	case ENOBUFS:  // the netdev's queue dropped it, as a wire may
	case ENETDOWN:
		return 0;
	default:
		return IBV_WC_LOC_QP_OP_ERR;
	}
}

int RawPort::add_flow(ibv_flow *flow, xsrc_qp *qp, const FlowMatch &match, uint16_t priority)
{
	std::lock_guard guard(lock_);
	if (int err = start_receiving())
		return err;
	flows_.push_back({flow, qp, match, priority});
	return 0;
}

void RawPort::remove_flow(ibv_flow *flow)
{
	std::lock_guard guard(lock_);
	std::erase_if(flows_, [&](const Flow &f) { return f.flow == flow; });
}

bool RawPort::has_flows(const xsrc_qp *qp)
{
	std::lock_guard guard(lock_);
	return std::any_of(flows_.begin(), flows_.end(), [&](const Flow &f) { return f.qp == qp; });
}

int RawPort::start_receiving()
{
	if (started_)
		return 0;
	unique_fd fd(socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, htons(ETH_P_ALL)));
	unique_fd stop(eventfd(0, EFD_CLOEXEC));
	if (!fd || !stop)
		return errno;
	sockaddr_ll addr{};
	addr.sll_family = AF_PACKET;
	addr.sll_protocol = htons(ETH_P_ALL);
	addr.sll_ifindex = ifindex_;
	if (bind(fd.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)))
		return errno;
	recv_fd_ = std::move(fd);
	stop_fd_ = std::move(stop);
	int err = xsrc_start_thread(thread_, thread_main, this);
	if (err)
		return err;
	started_ = true;
	return 0;
}

void *RawPort::thread_main(void *self) noexcept
{
	static_cast<RawPort *>(self)->run();
	return nullptr;
}

void RawPort::run() noexcept
{
	std::vector<uint8_t> buf;
	try {
		buf.resize(kRecvBuffer);
	} catch (...) {
		return;
	}
	for (;;) {
		pollfd fds[2] = {{recv_fd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
		if (poll(fds, 2, -1) < 0 && errno != EINTR)
			return;
		if (fds[1].revents)
			return;
		for (;;) {
			ssize_t n = recv(recv_fd_.get(), buf.data(), buf.size(), MSG_TRUNC);
			if (n < 0)
				break;
			if (static_cast<size_t>(n) <= buf.size())
				deliver(buf.data(), static_cast<size_t>(n));
		}
	}
}

// The frame goes to the QPs of the best-priority NORMAL flows that match it
// (a lower number wins) and to every sniffer, each QP once.
void RawPort::deliver(const uint8_t *frame, size_t len) noexcept
{
	std::lock_guard guard(lock_);
	std::array<xsrc_qp *, 64> to;
	size_t count = 0;
	auto add = [&](xsrc_qp *qp) {
		if (count < to.size() && std::find(to.begin(), to.begin() + count, qp) == to.begin() + count)
			to[count++] = qp;
	};
	uint32_t best = UINT32_MAX;
	for (const Flow &f : flows_)
		if (!f.match.sniffer && f.priority < best && f.match.matches(frame, len))
			best = f.priority;
	for (const Flow &f : flows_)
		if (f.match.sniffer || (f.priority == best && f.match.matches(frame, len)))
			add(f.qp);
	for (size_t i = 0; i < count; ++i)
		xsrc_raw_receive(ctx_, to[i], frame, len);
}

}  // namespace xsrc

// --- the QP's side -----------------------------------------------------------

namespace {

using Result = xsrc_attempt_result;

Result raw_execute(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe) noexcept
{
	xsrc_local_buffers local;
	if (!xsrc_peer_local_buffers(ctx, qp, wqe, false, local))
		return Result::failed(IBV_WC_LOC_PROT_ERR);
	int status = ctx->raw->send(local.iov.data(), local.count, local.total);
	return status ? Result::failed(static_cast<ibv_wc_status>(status)) : Result::done(local.total);
}

}  // namespace

const xsrc_transport xsrc_raw_transport = {
	.name = "raw packet",
	.execute = raw_execute,
};

int xsrc_raw_prepare(xsrc_context *ctx)
{
	std::lock_guard guard(ctx->raw_lock);
	if (ctx->raw)
		return 0;
	xsrc::RawPort *port = nullptr;
	if (int err = xsrc::RawPort::open(ctx, port))
		return err;
	ctx->raw.reset(port);
	return 0;
}

bool xsrc_raw_qp_has_flows(xsrc_context *ctx, const xsrc_qp *qp)
{
	return ctx->raw && ctx->raw->has_flows(qp);
}

void xsrc_raw_scatter(xsrc_context *ctx, const xsrc::RecvWqe &rwqe, xsrc::PdId pd, const uint8_t *frame, size_t len,
		      xsrc_cq_ring *cq, xsrc::Qpn qpn) noexcept
{
	std::array<iovec, XSRC_MAX_RECV_SGE> remote;
	size_t n = 0;
	bool on_demand;  // no matter: the copy below is process_vm_writev's
	ibv_wc_status status = xsrc_peer_recv_buffers(ctx->arena, rwqe, ctx->pid, pd, len, remote, n, on_demand);
	if (status == IBV_WC_SUCCESS) {
		// Our own memory, through the kernel: an unmapped page (ODP) is
		// an error completion, never a fault in this thread.
		iovec src = {const_cast<uint8_t *>(frame), len};
		if (xsrc_peer_write(getpid(), &src, 1, remote.data(), n, len))
			status = IBV_WC_LOC_PROT_ERR;
	}
	xsrc_cqe c = xsrc_make_cqe(rwqe.wr_id, status, IBV_WC_RECV, qpn);
	c.byte_len = status == IBV_WC_SUCCESS ? static_cast<uint32_t>(len) : 0;
	xsrc_cq_complete(ctx, cq, 0, c);
}

// A frame a flow of `qp` matched: into its next posted receive (or its
// SRQ's, or for a hash QP one of its WQs'); dropped without one.
void xsrc_raw_receive(xsrc_context *ctx, xsrc_qp *qp, const uint8_t *frame, size_t len) noexcept
{
	if (qp->rss) {  // hash QPs take no state transitions
		xsrc_rss_receive(ctx, qp, frame, len);
		return;
	}
	ibv_qp_state state = xsrc::qp_state_load(*qp->entry);
	if (state != IBV_QPS_RTR && state != IBV_QPS_RTS && state != IBV_QPS_SQD)
		return;
	xsrc_recv_ring *ring = qp->srq ? qp->srq->ring : qp->rq;
	const xsrc::RecvShape &shape = qp->srq ? qp->srq->ring_shape : qp->rq_shape;
	xsrc::RecvWqe rwqe;
	if (!ring || !qp->recv_cq || !xsrc::recv_pop(ring, shape, rwqe))
		return;
	const xsrc_srq_entry *srq = qp->srq ? ctx->arena.srq(qp->srq->srqn) : nullptr;
	xsrc::PdId pd(srq ? srq->pd_id : qp->entry->pd_id);
	xsrc_raw_scatter(ctx, rwqe, pd, frame, len, qp->recv_cq->ring(), qp->qpn);
}

ibv_flow *xsrc_create_flow(ibv_qp *ibqp, ibv_flow_attr *attr)
{
	xsrc_qp *qp = to_xsrc_qp(ibqp);
	xsrc_context *ctx = to_xsrc_ctx(ibqp->context);
	xsrc::FlowMatch match;
	int err = 0;
	if (qp->type != IBV_QPT_RAW_PACKET || !ctx->raw)
		err = EOPNOTSUPP;  // steering to IB QPs is for IB link layers
	else if (attr->port != 1)
		err = EINVAL;
	else
		err = xsrc::FlowMatch::parse(*attr, match);
	if (err) {
		verbs_debug(&ctx->ibv_ctx, "create_flow: QP %u: refused (%s)\n", qp->qpn.value(), strerror(err));
		errno = err;
		return nullptr;
	}
	auto *flow = new (std::nothrow) ibv_flow{};
	if (!flow) {
		errno = ENOMEM;
		return nullptr;
	}
	flow->context = ibqp->context;
	try {
		err = ctx->raw->add_flow(flow, qp, match, attr->priority);
	} catch (const std::bad_alloc &) {
		err = ENOMEM;
	}
	if (err) {
		delete flow;
		errno = err;
		return nullptr;
	}
	return flow;
}

int xsrc_destroy_flow(ibv_flow *flow)
{
	xsrc_context *ctx = to_xsrc_ctx(flow->context);
	ctx->raw->remove_flow(flow);
	delete flow;
	return 0;
}
