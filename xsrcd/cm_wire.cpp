// The IB CM between hosts: an id whose route leads off this host talks to
// its peer with CM MADs (IBTA 12.6, management class 0x07) on QP1, the GSI
// QP: UD SEND Only packets with BTH dest QP 1 and a DETH with Q_Key
// 0x80010000, in RoCE v2 over UDP 4791. The daemon's receiver hands such
// packets here (is_gsi_packet); we send from our own sockets (wire/sender.h).
// REQ, REP, DREQ and SIDR REQ are resent on a timeout a bounded number of
// times; duplicates are answered from the last MAD sent. An IP address's
// REQ and SIDR REQ carry the IP CM header of the kernel's rdma_cm first in
// their private data (version 0, IP version, source port, both addresses).
#include <endian.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <cstring>

#include "cm_state.h"
#include "log.h"
#include "wire/headers.h"

namespace xsrc {
namespace cm {
namespace {

namespace w = wire;

constexpr size_t kMadBytes = 256;
constexpr size_t kMadHeader = 24;  // the common MAD header; the CM message follows
constexpr uint32_t kGsiQpn = 1;
constexpr uint32_t kGsiQkey = 0x80010000;
constexpr uint8_t kBaseVersion = 1, kCmClass = 0x07, kCmClassVersion = 2, kMethodSend = 0x03;
enum Attr : uint16_t {
	kReq = 0x10,
	kMra = 0x11,
	kRej = 0x12,
	kRep = 0x13,
	kRtu = 0x14,
	kDreq = 0x15,
	kDrep = 0x16,
	kSidrReq = 0x17,
	kSidrRep = 0x18,
};
// Where each message's private data starts, and how much there is (IBTA 12.6).
// A DREQ's or DREP's private data is neither sent nor read.
constexpr size_t kReqPrivateAt = 140, kRepPrivateAt = 36, kRejPrivateAt = 84, kSidrReqPrivateAt = 16,
		 kSidrRepPrivateAt = 96;
// A MAD unanswered this long, and up to a quarter longer at random, is sent
// again, at most kMadSends times in all: a silent peer fails a connect in
// 10 to 12.5 s. The REQ says the same to the peer: a CM response timeout of
// 4.096 us * 2^18 (about 1 s), 9 retries. The random part keeps the resends
// of several connections from going out in the same order every round: on a
// link that loses every other packet, one of them then lost every send.
constexpr auto kMadTimeout = std::chrono::milliseconds(1000);
constexpr unsigned kMadSends = 10;
constexpr uint8_t kCmResponseTimeout = 18, kMaxCmRetries = kMadSends - 1;
constexpr uint8_t kLocalAckTimeout = 17;
constexpr uint16_t kPermissiveLid = 0xFFFF;
// REJ's "message rejected" (IBTA 12.6.7).
constexpr uint8_t kRejectedReq = 0, kRejectedRep = 1, kRejectedOther = 2;

using Mad = std::array<uint8_t, kMadBytes>;

// Fields of the CM message (offsets after the MAD header), big endian. A
// 24-bit field is the top three bytes of its 32-bit word.
void put8(Mad &m, size_t at, uint8_t v) { m[kMadHeader + at] = v; }
void put16(Mad &m, size_t at, uint16_t v)
{
	m[kMadHeader + at] = static_cast<uint8_t>(v >> 8);
	m[kMadHeader + at + 1] = static_cast<uint8_t>(v);
}
void put32(Mad &m, size_t at, uint32_t v)
{
	put16(m, at, static_cast<uint16_t>(v >> 16));
	put16(m, at + 2, static_cast<uint16_t>(v));
}
void put24(Mad &m, size_t at, uint32_t v)
{
	put16(m, at, static_cast<uint16_t>(v >> 8));
	put8(m, at + 2, static_cast<uint8_t>(v));
}
void put64(Mad &m, size_t at, uint64_t v)
{
	put32(m, at, static_cast<uint32_t>(v >> 32));
	put32(m, at + 4, static_cast<uint32_t>(v));
}
void put_bytes(Mad &m, size_t at, std::span<const uint8_t> bytes, size_t room)
{
	std::copy_n(bytes.begin(), std::min(bytes.size(), room), m.begin() + kMadHeader + at);
}
uint8_t get8(const Mad &m, size_t at) { return m[kMadHeader + at]; }
uint16_t get16(const Mad &m, size_t at) { return static_cast<uint16_t>(get8(m, at) << 8 | get8(m, at + 1)); }
uint32_t get32(const Mad &m, size_t at) { return uint32_t(get16(m, at)) << 16 | get16(m, at + 2); }
uint32_t get24(const Mad &m, size_t at) { return get32(m, at) >> 8; }
uint64_t get64(const Mad &m, size_t at) { return uint64_t(get32(m, at)) << 32 | get32(m, at + 4); }
std::vector<uint8_t> get_bytes(const Mad &m, size_t at, size_t n)
{
	auto from = m.begin() + static_cast<std::ptrdiff_t>(kMadHeader + at);
	return {from, from + static_cast<std::ptrdiff_t>(n)};
}

// The common MAD header (IBTA 13.4.3): a CM Send of attribute `attr`.
Mad new_mad(uint16_t attr, uint64_t tid)
{
	Mad m{};
	m[0] = kBaseVersion;
	m[1] = kCmClass;
	m[2] = kCmClassVersion;
	m[3] = kMethodSend;
	for (int i = 0; i < 8; ++i)
		m[8 + i] = static_cast<uint8_t>(tid >> (56 - 8 * i));
	m[16] = static_cast<uint8_t>(attr >> 8);
	m[17] = static_cast<uint8_t>(attr);
	return m;
}
uint16_t mad_attr(const Mad &m) { return static_cast<uint16_t>(m[16] << 8 | m[17]); }
uint64_t mad_tid(const Mad &m)
{
	uint64_t tid = 0;
	for (int i = 0; i < 8; ++i)
		tid = tid << 8 | m[8 + i];
	return tid;
}

uint64_t service_id(uint16_t space, uint16_t port) { return uint64_t(space) << 16 | port; }

// The IP CM header (the kernel's cma_hdr): version, IP version in the high
// nibble, the active side's port, its address, the passive side's address
// (an IPv4 address in the last 4 of 16 bytes).
void put_ip_cm(Mad &m, size_t at, const sockaddr_storage &src, const sockaddr_storage &dst)
{
	const bool v4 = src.ss_family == AF_INET;
	put8(m, at, 0);
	put8(m, at + 1, v4 ? 0x40 : 0x60);
	put16(m, at + 2, port_of(src));
	auto addr = [&](size_t off, const sockaddr_storage &a) {
		if (v4)
			std::memcpy(&m[kMadHeader + off + 12], &reinterpret_cast<const sockaddr_in &>(a).sin_addr, 4);
		else
			std::memcpy(&m[kMadHeader + off], &reinterpret_cast<const sockaddr_in6 &>(a).sin6_addr, 16);
	};
	addr(at + 4, src);
	addr(at + 20, dst);
}

struct IpCm {
	sockaddr_storage src{}, dst{};  // the active side's (with its port), the passive side's
};
std::optional<IpCm> get_ip_cm(const Mad &m, size_t at, uint16_t dst_port)
{
	if (get8(m, at) != 0)
		return std::nullopt;
	IpCm h;
	const uint8_t version = get8(m, at + 1) >> 4;
	auto addr = [&](size_t off, sockaddr_storage &a, uint16_t port) {
		if (version == 4) {
			auto &in = reinterpret_cast<sockaddr_in &>(a);
			in.sin_family = AF_INET;
			std::memcpy(&in.sin_addr, &m[kMadHeader + off + 12], 4);
		} else {
			auto &in6 = reinterpret_cast<sockaddr_in6 &>(a);
			in6.sin6_family = AF_INET6;
			std::memcpy(&in6.sin6_addr, &m[kMadHeader + off], 16);
		}
		set_port(a, port);
	};
	if (version != 4 && version != 6)
		return std::nullopt;
	addr(at + 4, h.src, get16(m, at + 2));
	addr(at + 20, h.dst, dst_port);
	return h;
}

// A CM MAD off the wire, with the addresses it travelled between.
struct Received {
	Gid sgid, dgid;  // the sender's, ours
	Mad mad;
};

Gid mapped(const in_addr &a)
{
	Gid g;
	g.raw[10] = g.raw[11] = 0xFF;
	std::memcpy(g.raw.data() + 12, &a, 4);
	return g;
}

// The offset of the BTH in a RoCE v2 IP packet, or 0.
size_t bth_offset(std::span<const uint8_t> p)
{
	if (p.size() >= w::kIpv4Bytes && p[0] >> 4 == 4)
		return w::kIpv4Bytes + w::kUdpBytes;
	if (p.size() >= w::kIpv6Bytes && p[0] >> 4 == 6)
		return w::kIpv6Bytes + w::kUdpBytes;
	return 0;
}

std::optional<Received> parse(std::span<const uint8_t> p)
{
	const size_t at = bth_offset(p);
	if (!at || p.size() < at + w::kBthBytes + w::kDethBytes + kMadBytes + w::kIcrcBytes)
		return std::nullopt;
	Received r;
	if (p[0] >> 4 == 4) {
		auto ip = w::decode_ipv4(p.first<w::kIpv4Bytes>());
		if (!ip)
			return std::nullopt;
		r.sgid = mapped(ip->src);
		r.dgid = mapped(ip->dst);
	} else {
		auto ip = w::decode_ipv6(p.first<w::kIpv6Bytes>());
		if (!ip)
			return std::nullopt;
		std::memcpy(r.sgid.raw.data(), &ip->src, 16);
		std::memcpy(r.dgid.raw.data(), &ip->dst, 16);
	}
	const w::Bth bth = w::decode_bth(p.subspan(at).first<w::kBthBytes>());
	const w::Deth deth = w::decode_deth(p.subspan(at + w::kBthBytes).first<w::kDethBytes>());
	if (bth.opcode != w::opcode::kUdSendOnly || bth.dest_qpn != kGsiQpn || deth.qkey != kGsiQkey)
		return std::nullopt;
	std::copy_n(p.begin() + static_cast<std::ptrdiff_t>(at + w::kBthBytes + w::kDethBytes), kMadBytes, r.mad.begin());
	const Mad &m = r.mad;
	if (m[0] != kBaseVersion || m[1] != kCmClass || m[2] != kCmClassVersion || m[3] != kMethodSend)
		return std::nullopt;
	return r;
}

std::vector<uint8_t> bytes_of(const Mad &m) { return {m.begin(), m.end()}; }

uint8_t transport_of(uint8_t qp_type)  // the REQ's transport service type
{
	return qp_type == IBV_QPT_UC ? 1 : qp_type == IBV_QPT_XRC_SEND ? 3 : 0;
}

Mad req_mad(const Id &id, uint32_t comm, uint64_t tid, uint64_t sid)
{
	const ConnParams &p = id.mine;
	const Route &r = id.route;
	Mad m = new_mad(kReq, tid);
	put32(m, 0, comm);
	put64(m, 8, sid);
	put64(m, 16, id.local ? id.local->device.node_guid : 0);
	put24(m, 32, p.qp_num);
	put8(m, 35, p.responder_resources);
	put8(m, 39, p.initiator_depth);
	put8(m, 43, static_cast<uint8_t>(kCmResponseTimeout << 3 | transport_of(id.qp_type) << 1 | (p.flow_control & 1)));
	put24(m, 44, id.psn);
	put8(m, 47, static_cast<uint8_t>(kCmResponseTimeout << 3 | (p.retry_count & 7)));
	put16(m, 48, w::kDefaultPkey);
	put8(m, 50, static_cast<uint8_t>(r.mtu << 4 | (p.rnr_retry_count & 7)));
	put8(m, 51, static_cast<uint8_t>(kMaxCmRetries << 4 | (p.srq ? 0x08 : 0) | (id.qp_type == IBV_QPT_XRC_SEND ? 1 : 0)));
	put16(m, 52, kPermissiveLid);
	put16(m, 54, kPermissiveLid);
	put_bytes(m, 56, r.sgid.raw, 16);
	put_bytes(m, 72, r.dgid.raw, 16);
	put8(m, 92, r.tos);
	put8(m, 93, r.hop_limit);
	put8(m, 95, static_cast<uint8_t>(id.ack_timeout.value_or(kLocalAckTimeout) << 3));
	put_ip_cm(m, kReqPrivateAt, id.src, id.dst);
	put_bytes(m, kReqPrivateAt + kIpCmHeader, p.private_data, kReqPrivate - kIpCmHeader);
	return m;
}

// What the REQ's sender offers, as ConnParams (its own view, not swapped).
ConnParams req_params(const Mad &m)
{
	ConnParams p;
	p.qkey = get32(m, 28);
	p.qp_num = get24(m, 32);
	p.responder_resources = get8(m, 35);
	p.initiator_depth = get8(m, 39);
	p.flow_control = get8(m, 43) & 1;
	p.retry_count = get8(m, 47) & 7;
	p.rnr_retry_count = get8(m, 50) & 7;
	p.srq = get8(m, 51) & 0x08;
	p.private_data = get_bytes(m, kReqPrivateAt + kIpCmHeader, kReqPrivate - kIpCmHeader);
	return p;
}

Mad rep_mad(const Id &id, uint32_t comm)
{
	const ConnParams &p = id.mine;
	Mad m = new_mad(kRep, id.wire->tid);
	put32(m, 0, comm);
	put32(m, 4, id.wire->comm_id);
	put24(m, 12, p.qp_num);
	put24(m, 20, id.psn);
	put8(m, 24, p.responder_resources);
	put8(m, 25, p.initiator_depth);
	put8(m, 26, p.flow_control & 1);  // target ACK delay 0, failover accepted
	put8(m, 27, static_cast<uint8_t>((p.rnr_retry_count & 7) << 5 | (p.srq ? 0x10 : 0)));
	put64(m, 28, id.local ? id.local->device.node_guid : 0);
	put_bytes(m, kRepPrivateAt, p.private_data, kRepPrivate);
	return m;
}

ConnParams rep_params(const Mad &m)
{
	ConnParams p;
	p.qkey = get32(m, 8);
	p.qp_num = get24(m, 12);
	p.responder_resources = get8(m, 24);
	p.initiator_depth = get8(m, 25);
	p.flow_control = get8(m, 26) & 1;
	p.rnr_retry_count = get8(m, 27) >> 5;
	p.srq = get8(m, 27) & 0x10;
	p.private_data = get_bytes(m, kRepPrivateAt, kRepPrivate);
	return p;
}

// A message of two communication ids and nothing else of ours (RTU, DREP, REJ's start).
Mad ids_mad(uint16_t attr, uint64_t tid, uint32_t local, uint32_t remote)
{
	Mad m = new_mad(attr, tid);
	put32(m, 0, local);
	put32(m, 4, remote);
	return m;
}

Mad rej_mad(uint64_t tid, uint32_t local, uint32_t remote, uint8_t rejected, uint16_t reason,
	    std::span<const uint8_t> private_data)
{
	Mad m = ids_mad(kRej, tid, local, remote);
	put8(m, 8, static_cast<uint8_t>(rejected << 6));
	put16(m, 10, reason);
	put_bytes(m, kRejPrivateAt, private_data, kRejPrivate);
	return m;
}

Mad sidr_rep_mad(uint64_t tid, uint32_t request, uint8_t status, uint64_t sid, const ConnParams &p)
{
	Mad m = new_mad(kSidrRep, tid);
	put32(m, 0, request);
	put8(m, 4, status);
	put24(m, 8, p.qp_num);
	put64(m, 12, sid);
	put32(m, 20, p.qkey);
	put_bytes(m, kSidrRepPrivateAt, p.private_data, kSidrRepPrivate);
	return m;
}

uint8_t rejected_message(CmState s)
{
	return s == CmState::ReqRcvd ? kRejectedReq : s == CmState::RepRcvd ? kRejectedRep : kRejectedOther;
}

std::optional<unsigned> gid_index_of(const CmDevice &dev, const Gid &gid)
{
	for (unsigned i = 0; i < dev.gids.size(); ++i)
		if (dev.gids[i] == gid)
			return i;
	return std::nullopt;
}

}  // namespace

// --- sending ------------------------------------------------------------------

void State::send_mad(const Gid &sgid, const Gid &dgid, int ifindex, std::span<const uint8_t> mad)
{
	if (!wire_sender_)
		wire_sender_ = std::make_unique<xsrc_wire_sender>();
	const xsrc_wire_socket *s = wire_sender_->socket_for(sgid.raw, static_cast<uint32_t>(ifindex));
	if (!s) {
		debug_log("xsrcd: cm: no socket for a MAD's source address: %s", strerror(errno));
		return;
	}
	std::array<uint8_t, w::kBthBytes + w::kDethBytes> hdr{};
	w::Bth bth;
	bth.opcode = w::opcode::kUdSendOnly;
	bth.dest_qpn = kGsiQpn;
	bth.psn = mad_psn_++ & w::kPsnMask;
	w::encode(bth, std::span<uint8_t, w::kBthBytes>(hdr.data(), w::kBthBytes));
	w::encode(w::Deth{kGsiQkey, kGsiQpn}, std::span<uint8_t, w::kDethBytes>(hdr.data() + w::kBthBytes, w::kDethBytes));
	iovec v{const_cast<uint8_t *>(mad.data()), mad.size()};
	counters.mads_sent++;
	(void)w::send_packet(*s, dgid.raw, hdr, &v, 1, mad.size());
}

void State::wire_send(Id &id, std::vector<uint8_t> mad, bool retry, std::function<void(Id &)> expired)
{
	WirePeer &peer = *id.wire;
	peer.last = std::move(mad);
	peer.sends = 0;
	peer.expired = std::move(expired);
	if (!retry) {
		send_mad(id.route.sgid, peer.gid, peer.ifindex, peer.last);
		return;
	}
	wire_resend(id, kMadTimeout);
}

void State::wire_resend(Id &id, std::chrono::milliseconds timeout)
{
	WirePeer &peer = *id.wire;
	peer.sends++;
	if (peer.sends > 1)
		counters.mads_resent++;
	send_mad(id.route.sgid, peer.gid, peer.ifindex, peer.last);
	timeout += std::chrono::milliseconds(static_cast<int64_t>(rng() % static_cast<uint64_t>(timeout.count() / 4 + 1)));
	arm(id, timeout, [this](Id &self) {
		if (!self.wire)
			return;
		if (self.wire->sends < kMadSends) {
			wire_resend(self, kMadTimeout);
			return;
		}
		if (auto expired = std::move(self.wire->expired))
			expired(self);
	});
}

Id *State::by_comm_id(uint32_t comm, const Gid &from)
{
	auto it = ids.find(comm ^ comm_salt_);
	if (it == ids.end() || !it->second.wire || !(it->second.wire->gid == from))
		return nullptr;
	return &it->second;
}

// --- what this host's ids do ---------------------------------------------------

void State::wire_connect(Id &id)
{
	id.wire = WirePeer{id.route.dgid, id.local->device.netdev.ifindex, 0, rng(), {}, 0, {}};
	id.cm = CmState::ReqSent;
	const uint64_t sid = service_id(port_space(id), port_of(id.dst));
	wire_send(id, bytes_of(req_mad(id, comm_id(id), id.wire->tid, sid)), true, [this](Id &self) {
		if (self.cm != CmState::ReqSent)
			return;
		// The kernel's CM gives up the same way: REJ (timeout) to whoever may hear it.
		send_mad(self.route.sgid, self.wire->gid, self.wire->ifindex,
			 rej_mad(self.wire->tid, comm_id(self), 0, kRejectedOther, kRejTimeout, {}));
		self.cm = CmState::Timewait;
		queue_id_event(self, kEvUnreachable, -ETIMEDOUT);
	});
}

void State::wire_accept(Id &id)
{
	id.cm = CmState::RepSent;
	wire_send(id, bytes_of(rep_mad(id, comm_id(id))), true, [this](Id &self) {
		if (self.cm != CmState::RepSent)
			return;
		send_mad(self.route.sgid, self.wire->gid, self.wire->ifindex,
			 rej_mad(self.wire->tid, comm_id(self), self.wire->comm_id, kRejectedOther, kRejTimeout, {}));
		self.cm = CmState::Timewait;
		queue_id_event(self, kEvUnreachable, -ETIMEDOUT);
	});
}

void State::wire_rtu(Id &id)
{
	// Kept as the last MAD: a REP sent again (our RTU lost) gets it again.
	wire_send(id, bytes_of(ids_mad(kRtu, id.wire->tid, comm_id(id), id.wire->comm_id)), false);
}

void State::wire_reject(Id &id, uint16_t reason, const std::vector<uint8_t> &private_data)
{
	wire_send(id,
		  bytes_of(rej_mad(id.wire->tid, comm_id(id), id.wire->comm_id, rejected_message(id.cm), reason,
				   private_data)),
		  false);
}

void State::wire_disconnect(Id &id)
{
	if (id.cm == CmState::DreqRcvd) {  // DREP, then time wait
		wire_send(id, bytes_of(ids_mad(kDrep, id.wire->tid, comm_id(id), id.wire->comm_id)), false);
		enter_timewait(id);
		return;
	}
	// DREQ, resent until the DREP comes or the retries run out.
	id.cm = CmState::DreqSent;
	id.wire->tid = rng();
	Mad dreq = ids_mad(kDreq, id.wire->tid, comm_id(id), id.wire->comm_id);
	put24(dreq, 8, id.theirs.qp_num);
	wire_send(id, bytes_of(dreq), true, [this](Id &self) {
		if (self.cm != CmState::DreqSent)
			return;
		self.state = IdState::Disconnect;
		ConnParams none;
		queue_id_event(self, kEvDisconnected, -ETIMEDOUT, &none, 0);
		enter_timewait(self);
	});
}

// The id is destroyed: what ib_destroy_cm_id sends for its state, once.
void State::wire_teardown(Id &id)
{
	if (!id.wire)
		return;
	WirePeer &p = *id.wire;
	auto send = [&](const Mad &m) { send_mad(id.route.sgid, p.gid, p.ifindex, m); };
	switch (id.cm) {
	case CmState::ReqSent:
		send(rej_mad(p.tid, comm_id(id), p.comm_id, kRejectedOther, kRejTimeout, {}));
		break;
	case CmState::ReqRcvd:
	case CmState::RepSent:
	case CmState::RepRcvd:
		send(rej_mad(p.tid, comm_id(id), p.comm_id, rejected_message(id.cm), kRejConsumerDefined, {}));
		break;
	case CmState::Established: {
		Mad dreq = ids_mad(kDreq, rng(), comm_id(id), p.comm_id);
		put24(dreq, 8, id.theirs.qp_num);
		send(dreq);
		break;
	}
	case CmState::DreqRcvd:
		send(ids_mad(kDrep, p.tid, comm_id(id), p.comm_id));
		break;
	case CmState::SidrReqRcvd:
		send(sidr_rep_mad(p.tid, p.comm_id, static_cast<uint8_t>(kSidrReject),
				  service_id(port_space(id), port_of(id.src)), ConnParams{}));
		break;
	default:
		break;
	}
	id.cm = CmState::None;
	id.wire.reset();
}

void State::wire_connect_sidr(Id &id)
{
	id.wire = WirePeer{id.route.dgid, id.local->device.netdev.ifindex, 0, rng(), {}, 0, {}};
	id.cm = CmState::SidrReqSent;
	Mad m = new_mad(kSidrReq, id.wire->tid);
	put32(m, 0, comm_id(id));
	put16(m, 4, w::kDefaultPkey);
	put64(m, 8, service_id(port_space(id), port_of(id.dst)));
	put_ip_cm(m, kSidrReqPrivateAt, id.src, id.dst);
	put_bytes(m, kSidrReqPrivateAt + kIpCmHeader, id.mine.private_data, kSidrReqPrivate - kIpCmHeader);
	wire_send(id, bytes_of(m), true, [this](Id &self) {
		if (self.cm != CmState::SidrReqSent)
			return;
		self.cm = CmState::None;
		queue_id_event(self, kEvUnreachable, -ETIMEDOUT);
	});
}

void State::wire_accept_sidr(Id &id, const ConnParams &rep, uint8_t status)
{
	// Kept as the last MAD: a SIDR REQ sent again gets the same answer.
	wire_send(id,
		  bytes_of(sidr_rep_mad(id.wire->tid, id.wire->comm_id, status,
					service_id(port_space(id), port_of(id.src)), rep)),
		  false);
}

// --- what arrives ------------------------------------------------------------

namespace {

// A request for a listener of this host (REQ or SIDR REQ): the new id, or
// nothing when no listener takes it (`reason` then says why).
Id *new_wire_request(State &s, int ifindex, const Received &r, uint16_t space, const IpCm &h, uint32_t &reason)
{
	reason = kRejInvalidServiceId;
	Id *listener = s.find_listener(space, h.dst);
	if (!listener)
		return nullptr;
	const bool ud = space == RDMA_PS_UDP;
	if ((listener->qp_type == IBV_QPT_UD) != ud)
		return nullptr;
	if (!ud && listener->backlog <= 0) {
		reason = kRejConsumerDefined;
		return nullptr;
	}
	const std::vector<CmDevice> devs = s.devices();
	std::optional<Local> here;
	for (const CmDevice &d : devs)
		if (auto index = gid_index_of(d, r.dgid); index && d.netdev.ifindex == ifindex)
			here = Local{d, *index, r.dgid};
	if (!here)
		return nullptr;
	Id &req = s.create_id(listener->channel, 0, listener->ps, listener->qp_type);
	req.state = IdState::Connect;
	req.src = h.dst;
	req.dst = h.src;
	req.tos = listener->tos;
	req.afonly = listener->afonly;
	req.local = here;
	req.route = Route{};
	req.route.sgid = r.dgid;
	req.route.sgid_index = here->gid_index;
	req.route.dgid = r.sgid;
	req.route.mtu = here->device.active_mtu;
	req.route.tos = listener->tos.value_or(0);
	req.route_resolved = true;
	req.remote = true;
	req.psn = static_cast<uint32_t>(s.rng()) & w::kPsnMask;
	req.wire = WirePeer{r.sgid, ifindex, get32(r.mad, 0), mad_tid(r.mad), {}, 0, {}};
	if (!ud)
		listener->backlog--;
	return &req;
}

// Have we seen this request (same sender, same communication id)? Answer
// it again from what we sent, if anything.
bool duplicate_request(State &s, const Received &r)
{
	const uint32_t comm = get32(r.mad, 0);
	for (auto &[h, id] : s.ids) {
		if (id.active || !id.wire || id.wire->comm_id != comm || !(id.wire->gid == r.sgid))
			continue;
		if (!id.wire->last.empty())
			s.send_mad(id.route.sgid, id.wire->gid, id.wire->ifindex, id.wire->last);
		s.counters.mads_duplicate++;
		return true;
	}
	return false;
}

void on_req(State &s, int ifindex, const Received &r)
{
	const Mad &m = r.mad;
	if (duplicate_request(s, r))
		return;
	const uint64_t sid = get64(m, 8);
	const uint16_t space = static_cast<uint16_t>(sid >> 16);
	auto h = get_ip_cm(m, kReqPrivateAt, static_cast<uint16_t>(sid));
	uint32_t reason = kRejInvalidServiceId;
	Id *req = nullptr;
	if (sid >> 32 == 0 && (space == RDMA_PS_TCP || space == RDMA_PS_IPOIB) && h)
		req = new_wire_request(s, ifindex, r, space, *h, reason);
	if (!req) {
		s.send_mad(r.dgid, r.sgid, ifindex,
			   rej_mad(mad_tid(m), 0, get32(m, 0), kRejectedReq, static_cast<uint16_t>(reason), {}));
		return;
	}
	req->route.mtu = std::min<int>(req->route.mtu, get8(m, 50) >> 4);
	req->theirs = req_params(m);
	req->peer_psn = get24(m, 44);
	req->cm = CmState::ReqRcvd;
	Id &listener = *s.find_listener(space, h->dst);
	Event ev;
	ev.id = listener.handle;
	ev.request = req->handle;
	ev.resp.uid = listener.uid;
	ev.resp.id = req->handle;
	ev.resp.event = kEvConnectRequest;
	ConnParams offer = req->theirs;
	std::swap(offer.responder_resources, offer.initiator_depth);
	fill_conn(ev.resp.param.conn, offer, kReqPrivate - kIpCmHeader);
	s.queue(listener.channel, ev);
}

void on_sidr_req(State &s, int ifindex, const Received &r)
{
	const Mad &m = r.mad;
	if (duplicate_request(s, r))
		return;
	const uint64_t sid = get64(m, 8);
	const uint16_t space = static_cast<uint16_t>(sid >> 16);
	auto h = get_ip_cm(m, kSidrReqPrivateAt, static_cast<uint16_t>(sid));
	uint32_t reason = 0;
	Id *req = nullptr;
	if (sid >> 32 == 0 && space == RDMA_PS_UDP && h)
		req = new_wire_request(s, ifindex, r, space, *h, reason);
	if (!req) {
		s.send_mad(r.dgid, r.sgid, ifindex,
			   sidr_rep_mad(mad_tid(m), get32(m, 0), static_cast<uint8_t>(kSidrUnsupported), sid, ConnParams{}));
		return;
	}
	req->cm = CmState::SidrReqRcvd;
	req->theirs.private_data = get_bytes(m, kSidrReqPrivateAt + kIpCmHeader, kSidrReqPrivate - kIpCmHeader);
	Id &listener = *s.find_listener(space, h->dst);
	Event ev;
	ev.id = listener.handle;
	ev.request = req->handle;
	ev.resp.uid = listener.uid;
	ev.resp.id = req->handle;
	ev.resp.event = kEvConnectRequest;
	auto &ud = ev.resp.param.ud;
	std::copy_n(req->theirs.private_data.begin(),
		    std::min(req->theirs.private_data.size(), sizeof(ud.private_data)), ud.private_data);
	ud.private_data_len = kSidrReqPrivate - kIpCmHeader;
	ud.ah_attr = ah_attr_of(req->route);
	s.queue(listener.channel, ev);
}

void on_sidr_rep(State &s, const Received &r)
{
	const Mad &m = r.mad;
	Id *id = s.by_comm_id(get32(m, 0), r.sgid);
	if (!id || id->cm != CmState::SidrReqSent)
		return;
	detach_peer(*id, CmState::None);
	ConnParams rep;
	rep.qp_num = get24(m, 8);
	rep.qkey = get32(m, 20);
	rep.private_data = get_bytes(m, kSidrRepPrivateAt, kSidrRepPrivate);
	const uint8_t status = get8(m, 4);
	if (status != 0) {
		s.queue_id_event(*id, kEvUnreachable, status, &rep, kSidrRepPrivate);
		return;
	}
	s.queue_sidr_established(*id, rep);
}

void on_rep(State &s, int ifindex, const Received &r)
{
	const Mad &m = r.mad;
	Id *id = s.by_comm_id(get32(m, 4), r.sgid);
	if (!id) {  // no such request (any more): the replier stops waiting for an RTU
		s.send_mad(r.dgid, r.sgid, ifindex,
			   rej_mad(mad_tid(m), 0, get32(m, 0), kRejectedRep, kRejInvalidCommId, {}));
		return;
	}
	if (!id->active)
		return;
	if (id->cm == CmState::Established) {  // our RTU was lost: it again
		if (!id->wire->last.empty())
			s.send_mad(id->route.sgid, id->wire->gid, id->wire->ifindex, id->wire->last);
		s.counters.mads_duplicate++;
		return;
	}
	if (id->cm != CmState::ReqSent)
		return;
	id->wire->comm_id = get32(m, 0);
	id->wire->last.clear();
	id->timer = 0;
	id->theirs = rep_params(m);
	id->peer_psn = get24(m, 20);
	id->cm = CmState::RepRcvd;
	ConnParams rep = id->theirs;
	std::swap(rep.responder_resources, rep.initiator_depth);
	s.queue_id_event(*id, kEvConnectResponse, 0, &rep, kRepPrivate);
}

void on_rtu(State &s, const Received &r)
{
	Id *id = s.by_comm_id(get32(r.mad, 4), r.sgid);
	if (!id || id->active || id->cm != CmState::RepSent)
		return;
	id->cm = CmState::Established;
	id->timer = 0;
	id->wire->last.clear();
	s.queue_id_event(*id, kEvEstablished, 0);
}

void on_rej(State &s, const Received &r)
{
	const Mad &m = r.mad;
	Id *id = s.by_comm_id(get32(m, 4), r.sgid);
	if (!id)
		return;
	switch (id->cm) {
	case CmState::ReqSent:
	case CmState::ReqRcvd:
	case CmState::RepSent:
	case CmState::RepRcvd:
		break;
	default:
		return;
	}
	detach_peer(*id, CmState::Timewait);
	id->wire->last.clear();
	ConnParams rej;
	rej.private_data = get_bytes(m, kRejPrivateAt, kRejPrivate);
	s.queue_id_event(*id, kEvRejected, get16(m, 10), &rej, kRejPrivate);
}

void on_mra(State &s, const Received &r)
{
	const Mad &m = r.mad;
	Id *id = s.by_comm_id(get32(m, 4), r.sgid);
	if (!id || (id->cm != CmState::ReqSent && id->cm != CmState::RepSent) || id->wire->last.empty())
		return;
	// The peer needs longer: wait its service timeout (4.096 us * 2^t), then retry afresh.
	const unsigned t = std::min(get8(m, 9) >> 3, 24);
	auto ms = std::max(kMadTimeout, std::chrono::milliseconds((4096ull << t) / 1000000 + 1));
	id->wire->sends = 0;
	s.arm(*id, ms, [&s](Id &self) {
		if (self.wire)
			s.wire_resend(self, kMadTimeout);
	});
}

void on_dreq(State &s, int ifindex, const Received &r)
{
	const Mad &m = r.mad;
	Id *id = s.by_comm_id(get32(m, 4), r.sgid);
	if (!id) {  // no such connection (any more): the DREP all the same
		s.send_mad(r.dgid, r.sgid, ifindex, ids_mad(kDrep, mad_tid(m), get32(m, 4), get32(m, 0)));
		return;
	}
	id->wire->tid = mad_tid(m);
	ConnParams none;
	switch (id->cm) {
	case CmState::Established:
	case CmState::RepSent:
	case CmState::RepRcvd:
		id->cm = CmState::DreqRcvd;
		id->timer = 0;
		id->wire->last.clear();
		id->state = IdState::Disconnect;
		s.queue_id_event(*id, kEvDisconnected, 0, &none, 0);
		break;
	case CmState::DreqSent:  // both sent a DREQ: each DREP ends the other's
		s.send_mad(id->route.sgid, id->wire->gid, id->wire->ifindex,
			   ids_mad(kDrep, id->wire->tid, s.comm_id(*id), id->wire->comm_id));
		id->state = IdState::Disconnect;
		s.queue_id_event(*id, kEvDisconnected, 0, &none, 0);
		s.enter_timewait(*id);
		break;
	case CmState::Timewait:  // our DREP was lost
		s.send_mad(id->route.sgid, id->wire->gid, id->wire->ifindex,
			   ids_mad(kDrep, id->wire->tid, s.comm_id(*id), id->wire->comm_id));
		s.counters.mads_duplicate++;
		break;
	default:
		break;
	}
}

void on_drep(State &s, const Received &r)
{
	Id *id = s.by_comm_id(get32(r.mad, 4), r.sgid);
	if (!id || id->cm != CmState::DreqSent)
		return;
	if (!id->channel) {  // destroyed while its DREQ was out (State::destroy_id)
		s.ids.erase(id->handle);
		return;
	}
	id->wire->last.clear();
	id->state = IdState::Disconnect;
	ConnParams none;
	s.queue_id_event(*id, kEvDisconnected, 0, &none, 0);
	s.enter_timewait(*id);
}

}  // namespace

void State::wire_receive(int ifindex, std::span<const uint8_t> ip_packet)
{
	auto r = parse(ip_packet);
	if (!r) {
		counters.mads_bad++;
		return;
	}
	counters.mads_received++;
	switch (mad_attr(r->mad)) {
	case kReq:
		on_req(*this, ifindex, *r);
		break;
	case kMra:
		on_mra(*this, *r);
		break;
	case kRej:
		on_rej(*this, *r);
		break;
	case kRep:
		on_rep(*this, ifindex, *r);
		break;
	case kRtu:
		on_rtu(*this, *r);
		break;
	case kDreq:
		on_dreq(*this, ifindex, *r);
		break;
	case kDrep:
		on_drep(*this, *r);
		break;
	case kSidrReq:
		on_sidr_req(*this, ifindex, *r);
		break;
	case kSidrRep:
		on_sidr_rep(*this, *r);
		break;
	default:
		counters.mads_bad++;
		break;
	}
}

}  // namespace cm

bool is_gsi_packet(std::span<const uint8_t> ip_packet)
{
	const size_t at = cm::bth_offset(ip_packet);
	if (!at || ip_packet.size() < at + wire::kBthBytes)
		return false;
	const wire::Bth bth = wire::decode_bth(ip_packet.subspan(at).first<wire::kBthBytes>());
	return bth.opcode == wire::opcode::kUdSendOnly && bth.dest_qpn == cm::kGsiQpn;
}

}  // namespace xsrc
