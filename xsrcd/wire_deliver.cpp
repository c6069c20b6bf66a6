// A RoCE v2 packet from the wire, its ICRC checked (wire_receiver.cpp),
// delivered into the device as an HCA would (wire_deliver.h). Every decision
// is taken on the daemon's own records (the QP's type, state, Q_Key, PSNs,
// receive ring and CQ; each SGE's MR and each rkey in the owner's context),
// never on the arena's copies, which any process of the device can write;
// the bytes land in the owner's memory by process_vm_writev, completions
// in its CQ ring.
//
// UD: SEND Only (with Immediate) into a posted receive, Q_Key checked, the
// GRH built from the IP header; to a multicast group, into each member QP.
// RC and UC requests: the responder (IBTA 9.7): PSNs, FIRST/MIDDLE/LAST/ONLY
// SEND into one receive, RDMA WRITE through the rkey, immediate data,
// SEND with Invalidate (IETH); RC also READ, atomics and ATOMIC WRITE, the
// READs and atomics kept (max_dest_rd_atomic of them) to answer duplicates;
// RC answers with ACK, RNR NAK, PSN sequence NAK and the error NAKs, and
// re-ACKs duplicates. Answers leave from the QP's UDP source port.
// XRC requests: as RC, into the XRC SRQ the XRCETH names (of the receive
// QP's domain, else NAK invalid request), answered with XRC responses.
// RC and XRC responses (ACK, NAK, READ response, ATOMIC ACK): the requester lives in
// the QP owner's provider; the packet goes to the socket it registered
// (XSRC_CMD_WIRE_RESPONSES).
#include "wire_deliver.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <optional>
#include <vector>

#include "common/clock.h"
#include "common/iov.h"
#include "common/ring_ops.h"
#include "dispatcher_handlers.h"
#include "netdev.h"
#include "rings.h"
#include "wire/headers.h"
#include "wire/sender.h"

namespace xsrc {
namespace {

namespace w = wire;
namespace op = w::op;

// A packet taken apart: its addresses, BTH, headers and payload.
struct Packet {
	std::span<const uint8_t> ip_header;
	std::array<uint8_t, 16> sgid;     // the sender's address as a GID (parse() sets both)
	std::array<uint8_t, 16> dgid;     // ours
	w::Bth bth;
	uint16_t ext = 0;                 // the opcode's extension headers (w::Ext)
	std::span<const uint8_t> body;    // BTH .. end of payload, pad and ICRC
	std::span<const uint8_t> payload; // after the headers, before the pad
	std::span<const uint8_t> transport;  // BTH .. pad: what a requester is given
	// XRC requests: the SRQ the XRCETH names, when it is an XRC SRQ of the
	// receive QP's domain, and the context that owns it (whose memory the
	// message reaches); null otherwise.
	Srq *xrc_srq = nullptr;
	Context *xrc_owner = nullptr;
};

void ipv4_gid(std::array<uint8_t, 16> &gid, const in_addr &a)
{
	gid = {};
	gid[10] = gid[11] = 0xFF;
	std::memcpy(gid.data() + 12, &a, 4);
}

// The parts of a RoCE v2 packet of a defined opcode into `u`, or false.
// (Filled in place: a returned optional<Packet> was built on the stack
// piecewise and copied whole, and its loads waited for those stores, a
// few percent of the receiving thread at 2 GB/s.)
bool parse(std::span<const uint8_t> p, Packet &u)
{
	size_t ip_len;
	if (p.empty())
		return false;
	if (p[0] >> 4 == 4) {
		if (p.size() < w::kIpv4Bytes)
			return false;
		auto ip = w::decode_ipv4(p.first<w::kIpv4Bytes>());
		// Fragments are not reassembled: RoCE never sends any.
		if (!ip || ip->protocol != w::kIpProtoUdp || (ip->flags_fragment & 0x3FFF))
			return false;
		ipv4_gid(u.dgid, ip->dst);
		ipv4_gid(u.sgid, ip->src);
		ip_len = w::kIpv4Bytes;
	} else {
		if (p.size() < w::kIpv6Bytes)
			return false;
		auto ip = w::decode_ipv6(p.first<w::kIpv6Bytes>());
		if (!ip || ip->next_header != w::kIpProtoUdp)
			return false;
		std::memcpy(u.dgid.data(), &ip->dst, 16);
		std::memcpy(u.sgid.data(), &ip->src, 16);
		ip_len = w::kIpv6Bytes;
	}
	u.ip_header = p.first(ip_len);
	if (p.size() < ip_len + w::kUdpBytes + w::kBthBytes + w::kIcrcBytes)
		return false;
	w::Udp udp = w::decode_udp(p.subspan(ip_len).first<w::kUdpBytes>());
	if (udp.dst_port != w::kRoceV2Port || udp.length != p.size() - ip_len)
		return false;
	u.body = p.subspan(ip_len + w::kUdpBytes);
	u.bth = w::decode_bth(u.body.first<w::kBthBytes>());
	const w::OpcodeInfo *info = w::opcode_info(u.bth.opcode);
	if (u.bth.tver != 0 || !info)
		return false;
	u.ext = info->ext;
	size_t headers = w::header_bytes(u.bth.opcode);
	if (u.body.size() < headers + u.bth.pad + w::kIcrcBytes)
		return false;
	u.payload = u.body.subspan(headers, u.body.size() - headers - u.bth.pad - w::kIcrcBytes);
	u.transport = u.body.first(u.body.size() - w::kIcrcBytes);
	if (!(u.ext & w::kExtPayload) && !u.payload.empty())
		return false;
	return true;
}

// Where an extension header starts in the body (after the BTH and the
// headers that precede it in IBTA order), for the ones RC/UC/UD carry.
size_t ext_offset(const Packet &pk, uint16_t which)
{
	size_t off = w::kBthBytes;
	const uint16_t order[] = {w::kExtDeth, w::kExtXrceth, w::kExtReth, w::kExtAtomicEth, w::kExtAeth,
				  w::kExtAtomicAckEth, w::kExtImmDt, w::kExtIeth};
	const size_t sizes[] = {w::kDethBytes, w::kXrcEthBytes, w::kRethBytes, w::kAtomicEthBytes, w::kAethBytes,
				w::kAtomicAckEthBytes, w::kImmDtBytes, w::kIethBytes};
	for (size_t i = 0; i < std::size(order) && order[i] != which; ++i)
		if (pk.ext & order[i])
			off += sizes[i];
	return off;
}

template <size_t N>
std::span<const uint8_t, N> ext_bytes(const Packet &pk, uint16_t which)
{
	return pk.body.subspan(ext_offset(pk, which)).template first<N>();
}

bool receive_state(ibv_qp_state s)
{
	return s == IBV_QPS_RTR || s == IBV_QPS_RTS || s == IBV_QPS_SQD;
}

bool device_has_gid(const Device &dev, const std::array<uint8_t, 16> &gid)
{
	for (const Gid &g : dev.view.port.gids)
		if (g.raw == gid)
			return true;
	return false;
}

PdId pd_id_of(Context &ctx, std::optional<PdHandle> pd_handle)
{
	const Pd *pd = pd_handle ? lookup<Pd>(ctx, *pd_handle) : nullptr;
	return pd ? pd->pd_id : PdId();
}

// The owner's address of [sge.addr, +len) under the SGE's lkey: an MR of
// the owner's context and `pd` with local write. Nothing when it is not one.
std::optional<uint64_t> sge_target(Device &dev, Context &owner, PdId pd, const xsrc_sge &sge, uint64_t len)
{
	auto it = dev.mrs_by_index.find(sge.lkey >> 8);
	if (it == dev.mrs_by_index.end() || it->second->lkey != Lkey(sge.lkey))
		return std::nullopt;
	const Mr *mr = it->second;
	bool owned = false;
	for (auto &[handle, obj] : owner.objects)
		if (std::get_if<Mr>(&obj) == mr) {
			owned = true;
			break;
		}
	if (!owned || pd_id_of(owner, mr->pd_handle) != pd || !(mr->access & IB_UVERBS_ACCESS_LOCAL_WRITE))
		return std::nullopt;
	if (sge.addr < mr->iova || len > mr->length || sge.addr - mr->iova > mr->length - len)
		return std::nullopt;
	return mr->addr + (sge.addr - mr->iova);
}

// The receive's buffers as the owner's iovecs for `len` bytes, or the
// completion status that says why not.
ibv_wc_status scatter(Device &dev, Context &owner, PdId pd, const RecvWqe &rwqe, uint64_t len,
		      std::array<iovec, XSRC_MAX_RECV_SGE> &iov, size_t &count)
{
	uint64_t capacity = 0;
	count = 0;
	for (uint32_t i = 0; i < rwqe.num_sge && capacity < len; ++i) {
		if (rwqe.sge[i].length == 0)
			continue;
		uint64_t take = std::min<uint64_t>(rwqe.sge[i].length, len - capacity);
		std::optional<uint64_t> va = sge_target(dev, owner, pd, rwqe.sge[i], take);
		if (!va)
			return IBV_WC_LOC_PROT_ERR;
		iov[count++] = {reinterpret_cast<void *>(*va), take};
		capacity += take;
	}
	return capacity < len ? IBV_WC_LOC_LEN_ERR : IBV_WC_SUCCESS;
}

// Lost races a ring operation of the daemon retries before it gives up.
constexpr unsigned kRingTries = 1024;

// Appends `cqe` to the CQ and wakes its channel if armed for it (as the
// provider's xsrc_cq_complete does, with the daemon's own event calls).
// The ring is indexed by the shape we made it with: its header is in the
// arena, which anyone may write under us.
void complete(Device &dev, Context &owner, Cq &cq, const xsrc_cqe &cqe, CqPayload payload = {})
{
	auto *ring = &dev.arena->at<xsrc_cq_ring>(cq.ring_off);
	switch (cq_push_notify(ring, cq_ring_shape(cq.ring_entries, cq.cqe), cqe, payload, kRingTries)) {
	case CqPushed::full:
		if (cq_first_overrun(ring))
			post_cq_event(owner, cq, IBV_EVENT_CQ_ERR);
		break;
	case CqPushed::event:
		post_completion_event(owner, cq);
		break;
	case CqPushed::placed:
		break;
	}
}

// Appends `cqe` with `bytes` riding in its payload slot (slot_fits said they
// fit), for the owner's poll to place at `to`, as a same-host SEND's are.
void complete_riding(Device &dev, Context &owner, Cq &cq, xsrc_cqe cqe, const void *to, CqPayload bytes)
{
	cqe.flags |= XSRC_CQE_DEFERRED;
	cqe.deferred_va = reinterpret_cast<uint64_t>(to);
	complete(dev, owner, cq, cqe, bytes);
}

// Whether `len` bytes (at least one) fit a payload slot of the CQ's ring.
bool slot_fits(const Cq &cq, uint64_t len)
{
	return len && len <= cq_ring_shape(cq.ring_entries, cq.cqe).payload_stride;
}

// After a receive was taken from an SRQ: its limit event, once per arming.
void check_srq_limit(Context &owner, Srq &srq, xsrc_recv_ring *ring)
{
	auto limit = atomic(ring->srq_limit);
	uint32_t armed = limit.load(std::memory_order_acquire);
	if (armed && recv_count(ring) < armed && limit.compare_exchange_strong(armed, 0, std::memory_order_acq_rel))
		post_srq_event(owner, srq, IBV_EVENT_SRQ_LIMIT_REACHED);
}

// The receive ring, CQ and PD a QP receives through (its own or its SRQ's).
struct ReceiveSide {
	Cq *cq = nullptr;
	Srq *srq = nullptr;
	xsrc_recv_ring *ring = nullptr;
	RecvShape shape;                     // as we made the ring (its header is anyone's to write)
	RecvShadow *shadow = nullptr;        // the owner's record of the ring's receives
	PdId pd;
};

// An XRC receive QP receives through the SRQ its packet names (pk.xrc_srq,
// of context `owner`), completing on that SRQ's CQ.
std::optional<ReceiveSide> receive_side(Device &dev, Context &owner, Qp &qp, const Packet &pk)
{
	ReceiveSide r;
	if (qp.qp_type == IBV_QPT_XRC_RECV) {
		r.srq = pk.xrc_srq;
		r.cq = r.srq && r.srq->cq_handle ? lookup<Cq>(owner, *r.srq->cq_handle) : nullptr;
	} else {
		r.cq = qp.recv_cq_handle ? lookup<Cq>(owner, *qp.recv_cq_handle) : nullptr;
		r.srq = qp.srq_handle ? lookup<Srq>(owner, *qp.srq_handle) : nullptr;
		if (qp.srq_handle && !r.srq)
			return std::nullopt;
	}
	uint64_t ring_off = r.srq ? r.srq->ring_off : qp.rq_off;
	if (!r.cq || !ring_off)
		return std::nullopt;
	r.ring = &dev.arena->at<xsrc_recv_ring>(ring_off);
	r.shape = r.srq ? r.srq->ring_shape : qp.rq_shape;
	r.shadow = r.srq ? &r.srq->recv_shadow : &qp.recv_shadow;
	r.pd = pd_id_of(owner, r.srq ? std::optional<PdHandle>(r.srq->pd_handle) : qp.pd_handle);
	return r;
}

// Takes the oldest posted receive, as the owner's record of it says: a slot
// that holds none the owner posted (forged in the arena) is passed over.
// False when there is none.
bool take_receive(Context &owner, ReceiveSide &r, RecvWqe &rwqe)
{
	for (unsigned k = 0; k < kRingTries; ++k) {
		if (!recv_pop(r.ring, r.shape, rwqe, kRingTries))
			return false;
		if (r.srq)
			check_srq_limit(owner, *r.srq, r.ring);
		if (recv_shadow_take(owner, *r.shadow, r.shape.entries, rwqe))
			return true;
	}
	return false;
}

// The QP named by a packet's BTH, with the context that owns it.
Qp *packet_qp(Device &dev, const Packet &pk, Context *&owner)
{
	if (pk.bth.dest_qpn < XSRC_QPN_BASE)
		return nullptr;
	ObjectRef ref = dev.qp_slots.find(pk.bth.dest_qpn - XSRC_QPN_BASE);
	Qp *qp = ref ? lookup<Qp>(*ref.ctx, ref.handle) : nullptr;
	owner = ref.ctx;
	return qp;
}

bool is_ud_send(uint8_t opcode)
{
	return opcode == w::opcode::kUdSendOnly || opcode == w::opcode::kUdSendOnlyImm;
}

// A UD datagram into `qp` (owned by `owner`, null: none): its Q_Key
// checked, into the oldest posted receive, the GRH from the IP header.
WireOutcome deliver_ud_to(Device &dev, const Packet &pk, Qp *qp, Context *ownerp)
{
	w::Deth deth = w::decode_deth(ext_bytes<w::kDethBytes>(pk, w::kExtDeth));
	// A UD datagram nobody can take is dropped silently (IBTA 10.2.5: a
	// Q_Key violation too).
	if (!qp || !ownerp || qp->qp_type != IBV_QPT_UD || !receive_state(qp_current_state(dev, *qp)) ||
	    qp->attributes().qkey != deth.qkey)
		return WireOutcome::dropped;
	Context &owner = *ownerp;
	std::optional<ReceiveSide> side = receive_side(dev, owner, *qp, pk);
	RecvWqe rwqe;
	if (!side || !take_receive(owner, *side, rwqe))
		return WireOutcome::dropped;  // no receive posted: UD loses it

	xsrc_cqe c{};
	c.wr_id = rwqe.wr_id;
	c.opcode = IBV_WC_RECV;
	c.qp_num = qp->qpn().value();
	std::array<uint8_t, w::kGrhBytes> grh = w::grh_from_ip(pk.ip_header);
	uint64_t len = w::kGrhBytes + pk.payload.size();
	std::array<iovec, XSRC_MAX_RECV_SGE> remote;
	size_t nremote;
	ibv_wc_status st = scatter(dev, owner, side->pd, rwqe, len, remote, nremote);
	iovec local[2] = {{grh.data(), grh.size()}, {const_cast<uint8_t *>(pk.payload.data()), pk.payload.size()}};
	// Into one buffer and small enough, it rides in the CQ ring's payload
	// slot, as an RC SEND Only does (respond_send).
	const bool ride = st == IBV_WC_SUCCESS && nremote == 1 && slot_fits(*side->cq, len);
	if (st == IBV_WC_SUCCESS && !ride) {
		ssize_t n = process_vm_writev(owner.owner, local, 2, remote.data(), nremote, 0);
		if (n != static_cast<ssize_t>(len))
			st = IBV_WC_LOC_PROT_ERR;
	}
	c.status = st;
	if (st == IBV_WC_SUCCESS) {
		c.byte_len = static_cast<uint32_t>(len);
		c.src_qp = deth.src_qpn;
		c.wc_flags = IBV_WC_GRH;
		if (pk.bth.opcode == w::opcode::kUdSendOnlyImm) {
			c.imm_data = w::decode_immdt(ext_bytes<w::kImmDtBytes>(pk, w::kExtImmDt)).raw;
			c.wc_flags |= IBV_WC_WITH_IMM;
		}
		if (pk.bth.solicited)
			c.flags |= XSRC_CQE_SOLICITED;
	}
	if (ride)
		complete_riding(dev, owner, *side->cq, c, remote[0].iov_base, {local, 2});
	else
		complete(dev, owner, *side->cq, c);
	return WireOutcome::delivered;
}

WireOutcome deliver_ud(Device &dev, const Packet &pk)
{
	if (!is_ud_send(pk.bth.opcode))
		return WireOutcome::dropped;
	Context *owner = nullptr;
	Qp *qp = packet_qp(dev, pk, owner);
	return deliver_ud_to(dev, pk, qp, owner);
}

// A UD datagram to a multicast group with members here: once into each
// member QP (each with its own Q_Key check and receive). Only to the
// multicast QPN (IBTA 10.5.2.1), only UD SENDs; a group without members
// here (one this host left, or never joined) takes nothing.
WireOutcome deliver_multicast(Device &dev, const Packet &pk)
{
	if (static_cast<w::Transport>(pk.bth.opcode & 0xE0) != w::Transport::ud || !is_ud_send(pk.bth.opcode) ||
	    pk.bth.dest_qpn != XSRC_MCAST_QPN)
		return WireOutcome::dropped;
	auto group = dev.mcast_groups.find(pk.dgid);
	if (group == dev.mcast_groups.end())
		return WireOutcome::dropped;
	bool any = false;
	for (Qpn member : group->second.members) {
		if (member.value() < XSRC_QPN_BASE)
			continue;
		ObjectRef ref = dev.qp_slots.find(member.value() - XSRC_QPN_BASE);
		Qp *qp = ref ? lookup<Qp>(*ref.ctx, ref.handle) : nullptr;
		any |= deliver_ud_to(dev, pk, qp, ref.ctx) == WireOutcome::delivered;
	}
	return any ? WireOutcome::delivered : WireOutcome::dropped;
}

// --- the RC / UC responder -------------------------------------------------

// 24-bit PSN arithmetic: how far `psn` is past `base` (IBTA 9.7.5.1.2: the
// half of the PSN space after the expected PSN is "ahead", the other half
// "behind": duplicates).
uint32_t psn_diff(uint32_t psn, uint32_t base)
{
	return (psn - base) & w::kPsnMask;
}

constexpr uint32_t kPsnHalf = 1u << 23;

bool is_send(uint8_t o)
{
	return o <= op::kSendOnlyImm || o == op::kSendLastInv || o == op::kSendOnlyInv;
}

bool is_send_first(uint8_t o)
{
	return o == op::kSendFirst || o == op::kSendOnly || o == op::kSendOnlyImm || o == op::kSendOnlyInv;
}

bool is_send_last(uint8_t o)
{
	return o == op::kSendLast || o == op::kSendLastImm || o == op::kSendOnly || o == op::kSendOnlyImm ||
	       o == op::kSendLastInv || o == op::kSendOnlyInv;
}

bool is_write_first(uint8_t o)
{
	return o == op::kWriteFirst || o == op::kWriteOnly || o == op::kWriteOnlyImm;
}

bool is_write_last(uint8_t o)
{
	return o == op::kWriteLast || o == op::kWriteLastImm || o == op::kWriteOnly || o == op::kWriteOnlyImm;
}

bool is_first(uint8_t o)
{
	return is_send_first(o) || is_write_first(o);
}

// The PD an rkey must be of: the responder QP's, or for XRC the PD of the
// SRQ the packet names (an XRC receive QP has none).
PdId rkey_pd(Context &owner, const Qp &qp, const Packet &pk)
{
	if (qp.qp_type == IBV_QPT_XRC_RECV)
		return pk.xrc_srq ? pd_id_of(owner, pk.xrc_srq->pd_handle) : PdId();
	return pd_id_of(owner, qp.pd_handle);
}

// Responses go back in the transport of the request: RC, or XRC for an
// XRC receive QP (XRC Acknowledge, READ responses, ATOMIC Acknowledge).
uint8_t response_transport(const Qp &qp)
{
	return static_cast<uint8_t>(qp.qp_type == IBV_QPT_XRC_RECV ? w::Transport::xrc : w::Transport::rc);
}

// What the responder makes of one in-order request packet.
enum class Step { ok, rnr, nak_invalid, nak_access, nak_operation };

// The socket a responder QP answers from: our address the request came to,
// the QP's UDP source port.
const xsrc_wire_socket *response_socket(Device &dev, const Packet &pk, const Qp &qp)
{
	if (!dev.wire_out)
		dev.wire_out = std::make_unique<xsrc_wire_sender>();
	return dev.wire_out->socket_for(pk.dgid, static_cast<uint32_t>(dev.netdev.ifindex),
					w::udp_source_port(qp.qpn().value(), qp.attributes().dest_qp_num));
}

// Sends an ACK or NAK (`syndrome`) for `psn` to the QP's peer, from our
// address the request came to.
void send_aeth(Device &dev, const Packet &pk, const Qp &qp, uint8_t syndrome, uint32_t psn, uint32_t msn)
{
	const xsrc_wire_socket *s = response_socket(dev, pk, qp);
	if (!s)
		return;  // our address went away: the requester times out
	auto hdr = w::acknowledge_headers(response_transport(qp), qp.attributes().dest_qp_num, psn, syndrome, msn);
	(void)w::send_packet(*s, pk.sgid, hdr, nullptr, 0, 0);
}

// After the owner let an ACK wait out its delay, this many of its QP's
// next ACKs go out at once before one is left on the board again.
constexpr uint8_t kAtOnceAfterLate = 64;

// The ACK an in-order RC request asked for, left on the owner's ACK board
// (XSRC_WIRE_RESPONSES_ACK_BOARD) rather than sent: a peer that answers at
// once (a ping-pong, a request and its reply) gets it in front of the
// owner's next request on the QP, with it, so neither host's xsrcd wakes
// for an ACK of its own. The daemon sends it after dev.ack_delay_ns unless
// the owner took it (wire_acks_due). False: send it now (no board, a
// delay of 0, another QP's word in the entry, or the owner let the last
// one wait out its delay).
bool owe_ack(Device &dev, Context &owner, const Qp &qp, const Packet &pk, uint32_t psn, uint32_t msn)
{
	AckBoard *board = owner.ack_board.get();
	if (!board || !dev.ack_delay_ns || qp.qp_type != IBV_QPT_RC)
		return false;
	const uint32_t qpn = qp.qpn().value();
	uint8_t &at_once = board->at_once(qpn);
	if (at_once) {
		--at_once;
		return false;
	}
	const xsrc_wire_socket *s = response_socket(dev, pk, qp);
	if (!s)
		return false;
	const uint64_t word = XSRC_ACK_WORD(qpn, msn, psn);
	auto entry = board->word(qpn);
	uint64_t seen = entry.load(std::memory_order_acquire);
	do {
		// Empty, or an earlier ACK of this QP, which ours covers.
		if (seen && (seen & XSRC_ACK_OWNER_MASK) != XSRC_ACK_OWNER(qpn))
			return false;
	} while (!entry.compare_exchange_weak(seen, word, std::memory_order_acq_rel));
	OwedAck owed;
	owed.board = owner.ack_board;
	owed.qpn = qpn;
	owed.word = word;
	owed.deadline_ns = monotonic_ns() + dev.ack_delay_ns;
	owed.socket = s;
	owed.to = pk.sgid;
	owed.headers = w::acknowledge_headers(response_transport(qp), qp.attributes().dest_qp_num, psn,
					      w::aeth::kAck, msn);
	dev.owed_acks.push_back(std::move(owed));
	++dev.acks_left;
	return true;
}

// The owner's iovecs for bytes [from, from + len) of receive `rwqe`.
ibv_wc_status receive_slice(Device &dev, Context &owner, PdId pd, const RecvWqe &rwqe, uint64_t from, uint64_t len,
			    std::array<iovec, XSRC_MAX_RECV_SGE> &out, size_t &n)
{
	std::array<iovec, XSRC_MAX_RECV_SGE> all;
	size_t count;
	if (ibv_wc_status st = scatter(dev, owner, pd, rwqe, from + len, all, count); st != IBV_WC_SUCCESS)
		return st;
	n = iov_slice(std::span(all.data(), count), from, len, out.data());
	return IBV_WC_SUCCESS;
}

// A packet whose payload may wait in dev.wire_pending: a SEND or RDMA
// WRITE FIRST or MIDDLE without AckReq, which completes nothing and asks
// for no acknowledgement (what comes after it in its QP's stream does; so
// does every other packet, and each of those lands the waiting payloads
// first).
bool deferrable(const Packet &pk)
{
	auto transport = static_cast<w::Transport>(pk.bth.opcode & 0xE0);
	uint8_t o = pk.bth.opcode & 0x1F;
	return (transport == w::Transport::rc || transport == w::Transport::uc || transport == w::Transport::xrc) &&
	       !pk.bth.ack_req && (o == op::kSendFirst || o == op::kSendMiddle || o == op::kWriteFirst || o == op::kWriteMiddle);
}

bool write_owner(Context &owner, std::span<const uint8_t> bytes, const iovec *remote, size_t nremote)
{
	if (bytes.empty())
		return true;
	iovec local{const_cast<uint8_t *>(bytes.data()), bytes.size()};
	return process_vm_writev(owner.owner, &local, 1, remote, nremote, 0) == static_cast<ssize_t>(bytes.size());
}

// Places a request's payload in the QP owner's memory: now, or with the
// batch (deferrable packets while dev.wire_pending is open).
bool place(Device &dev, Context &owner, WireResponderState &st, const Packet &pk, const iovec *remote, size_t nremote)
{
	WirePending &p = dev.wire_pending;
	if (!p.open || !deferrable(pk))
		return write_owner(owner, pk.payload, remote, nremote);
	constexpr size_t kMaxIov = 256;  // well under IOV_MAX
	if (p.st && (p.st != &st || p.pid != owner.owner || p.local.size() >= kMaxIov ||
		     p.remote.size() + nremote > kMaxIov))
		wire_flush(dev);
	p.st = &st;
	p.pid = owner.owner;
	p.local.push_back({const_cast<uint8_t *>(pk.payload.data()), pk.payload.size()});
	for (size_t i = 0; i < nremote; ++i) {
		if (!p.remote.empty() && static_cast<uint8_t *>(p.remote.back().iov_base) + p.remote.back().iov_len ==
						 remote[i].iov_base)
			p.remote.back().iov_len += remote[i].iov_len;  // adjacent: one range
		else
			p.remote.push_back(remote[i]);
	}
	return true;
}

xsrc_cqe receive_cqe(const Qp &qp, const RecvWqe &rwqe, ibv_wc_status status)
{
	xsrc_cqe c{};
	c.wr_id = rwqe.wr_id;
	c.status = status;
	c.opcode = IBV_WC_RECV;
	c.qp_num = qp.qpn().value();
	return c;
}

// A receive the responder took ends in error: its completion, the QP to error.
void fail_receive(Device &dev, Context &owner, Qp &qp, ReceiveSide &side, const RecvWqe &rwqe, ibv_wc_status status)
{
	complete(dev, owner, *side.cq, receive_cqe(qp, rwqe, status));
	qp_enter_error(owner, qp);
}

// XRC: a receive held (a message under way, or kept from one that failed)
// is of the SRQ it came from; a packet naming another cannot use it.
bool xrc_receive_mismatch(const Qp &qp, const WireResponderState &st, const Packet &pk)
{
	return qp.qp_type == IBV_QPT_XRC_RECV && st.have_receive && st.receive_srqn != pk.xrc_srq->srqn().value();
}

// Takes a receive for the message `pk` starts; false when none is posted.
bool take_message_receive(Context &owner, const Qp &qp, WireResponderState &st, ReceiveSide &side, const Packet &pk)
{
	if (!take_receive(owner, side, st.receive))
		return false;
	st.have_receive = true;
	st.receive_srqn = qp.qp_type == IBV_QPT_XRC_RECV ? pk.xrc_srq->srqn().value() : 0;
	return true;
}

// One SEND packet, in order.
Step respond_send(Device &dev, Context &owner, Qp &qp, WireResponderState &st, const Packet &pk)
{
	uint8_t o = pk.bth.opcode & 0x1F;
	std::optional<ReceiveSide> side = receive_side(dev, owner, qp, pk);
	if (!side)
		return Step::nak_operation;
	if (xrc_receive_mismatch(qp, st, pk))
		return Step::nak_invalid;
	if (is_send_first(o)) {
		if (st.in_send)
			return Step::nak_invalid;
		if (!st.have_receive && !take_message_receive(owner, qp, st, *side, pk))
			return Step::rnr;
		st.in_send = true;
		st.offset = 0;
	} else if (!st.in_send) {
		return Step::nak_invalid;
	}
	// SEND with Invalidate: the window its IETH names goes before the last
	// bytes land; one that is not a type 2 window bound to this QP makes
	// the request invalid (as the same-host path has it).
	std::optional<uint32_t> invalidated;
	if (pk.ext & w::kExtIeth) {
		invalidated = w::decode_ieth(ext_bytes<w::kIethBytes>(pk, w::kExtIeth)).rkey;
		if (!mw_remote_invalidate(dev, owner, qp.qpn(), rkey_pd(owner, qp, pk), *invalidated)) {
			st.in_send = st.have_receive = false;
			fail_receive(dev, owner, qp, *side, st.receive, IBV_WC_REM_INV_REQ_ERR);
			return Step::nak_invalid;
		}
	}
	std::array<iovec, XSRC_MAX_RECV_SGE> remote;
	size_t n = 0;
	ibv_wc_status status = receive_slice(dev, owner, side->pd, st.receive, st.offset, pk.payload.size(), remote, n);
	// A SEND Only that fits one receive buffer and the CQ ring's payload
	// slot rides in the slot, as a same-host SEND does: the owner's poll
	// places it, with no process_vm_writev of ours.
	const bool ride = status == IBV_WC_SUCCESS && is_send_first(o) && is_send_last(o) && n == 1 &&
			  slot_fits(*side->cq, pk.payload.size());
	if (status == IBV_WC_SUCCESS && !ride && !place(dev, owner, st, pk, remote.data(), n))
		status = IBV_WC_LOC_PROT_ERR;
	if (status != IBV_WC_SUCCESS) {
		st.in_send = st.have_receive = false;
		fail_receive(dev, owner, qp, *side, st.receive, status);
		return status == IBV_WC_LOC_LEN_ERR ? Step::nak_invalid : Step::nak_operation;
	}
	st.offset += pk.payload.size();
	if (!is_send_last(o))
		return Step::ok;
	xsrc_cqe c = receive_cqe(qp, st.receive, IBV_WC_SUCCESS);
	c.byte_len = static_cast<uint32_t>(st.offset);
	if (pk.ext & w::kExtImmDt) {
		c.imm_data = w::decode_immdt(ext_bytes<w::kImmDtBytes>(pk, w::kExtImmDt)).raw;
		c.wc_flags |= IBV_WC_WITH_IMM;
	} else if (invalidated) {
		c.imm_data = *invalidated;  // ibv_wc::invalidated_rkey
		c.wc_flags |= IBV_WC_WITH_INV;
	}
	if (pk.bth.solicited)
		c.flags |= XSRC_CQE_SOLICITED;
	st.in_send = st.have_receive = false;
	st.msn = (st.msn + 1) & w::kPsnMask;
	iovec bytes{const_cast<uint8_t *>(pk.payload.data()), pk.payload.size()};
	if (ride)
		complete_riding(dev, owner, *side->cq, c, remote[0].iov_base, {&bytes, 1});
	else
		complete(dev, owner, *side->cq, c);
	return Step::ok;
}

// One RDMA WRITE packet, in order.
Step respond_write(Device &dev, Context &owner, Qp &qp, WireResponderState &st, const Packet &pk)
{
	uint8_t o = pk.bth.opcode & 0x1F;
	if (is_write_first(o)) {
		if (st.in_write)
			return Step::nak_invalid;
		w::Reth reth = w::decode_reth(ext_bytes<w::kRethBytes>(pk, w::kExtReth));
		st.write_va = 0;
		// A zero-length write checks no key (IBTA 9.7.4.1.5).
		if (reth.dma_length) {
			std::optional<uint64_t> va = remote_key_target(dev, owner, qp, rkey_pd(owner, qp, pk), reth.rkey,
								       IB_UVERBS_ACCESS_REMOTE_WRITE, reth.va,
								       reth.dma_length);
			if (!va)
				return Step::nak_access;
			st.write_va = *va;
		}
		st.in_write = true;
		st.write_left = st.write_length = reth.dma_length;
	} else if (!st.in_write) {
		return Step::nak_invalid;
	}
	if (pk.payload.size() > st.write_left || (is_write_last(o) && pk.payload.size() != st.write_left)) {
		st.in_write = false;
		return Step::nak_invalid;
	}
	// The immediate needs a receive: taken before a byte moves, so that an
	// RNR NAK leaves the packet to be sent again unchanged.
	std::optional<ReceiveSide> side;
	bool imm = pk.ext & w::kExtImmDt;
	if (imm) {
		side = receive_side(dev, owner, qp, pk);
		if (!side)
			return Step::nak_operation;
		if (xrc_receive_mismatch(qp, st, pk))
			return Step::nak_invalid;
		if (!st.have_receive && !take_message_receive(owner, qp, st, *side, pk))
			return Step::rnr;
	}
	iovec remote{reinterpret_cast<void *>(st.write_va), pk.payload.size()};
	if (!place(dev, owner, st, pk, &remote, 1)) {
		st.in_write = false;
		return Step::nak_access;
	}
	st.write_va += pk.payload.size();
	st.write_left -= pk.payload.size();
	if (!is_write_last(o))
		return Step::ok;
	st.in_write = false;
	st.msn = (st.msn + 1) & w::kPsnMask;
	if (imm) {
		xsrc_cqe c = receive_cqe(qp, st.receive, IBV_WC_SUCCESS);
		c.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
		c.byte_len = static_cast<uint32_t>(st.write_length);
		c.imm_data = w::decode_immdt(ext_bytes<w::kImmDtBytes>(pk, w::kExtImmDt)).raw;
		c.wc_flags |= IBV_WC_WITH_IMM;
		if (pk.bth.solicited)
			c.flags |= XSRC_CQE_SOLICITED;
		st.have_receive = false;
		complete(dev, owner, *side->cq, c);
	}
	return Step::ok;
}

constexpr uint32_t kMaxIbMtu = 128u << IBV_MTU_4096;

// The path MTU of a QP, as its requester cuts READ responses: the QP's
// path_mtu, no more than the port's (the largest IB MTU that fits the
// netdev's MTU with the RoCE headers).
uint32_t qp_mtu(const Device &dev, const Qp &qp)
{
	uint32_t port = 128u << ib_mtu_from_netdev_mtu(dev.netdev.mtu);
	uint8_t path = qp.attributes().path_mtu;
	uint32_t mtu = path >= IBV_MTU_256 && path <= IBV_MTU_4096 ? 128u << path : 1024u;
	return std::min(mtu, port);
}

uint32_t read_packets(uint64_t length, uint32_t mtu)
{
	return length ? static_cast<uint32_t>((length + mtu - 1) / mtu) : 1;
}

// READ responses `from` .. the last of a saved READ: a batch of packets'
// bytes read from the responder's memory with one process_vm_readv, and
// sent together (a run of MIDDLE responses as one GSO datagram).
void send_read_responses(Device &dev, const Packet &pk, const Qp &qp, const WireResponderState &st,
			 const WireResponderState::Replay &r, uint32_t from)
{
	const xsrc_wire_socket *s = response_socket(dev, pk, qp);
	if (!s)
		return;
	uint32_t mtu = qp_mtu(dev, qp);
	constexpr size_t kChunk = w::PacketBatch::kCapacity;
	thread_local std::vector<uint8_t> data;
	data.resize(kChunk * kMaxIbMtu);
	w::PacketBatch out(*s, pk.sgid);
	for (uint32_t first = from; first < r.packets; first += kChunk) {
		uint32_t last = static_cast<uint32_t>(std::min<uint64_t>(r.packets, first + kChunk));
		uint64_t start = std::min(r.length, uint64_t(first) * mtu);
		uint64_t bytes = std::min(r.length, uint64_t(last) * mtu) - start;
		iovec local{data.data(), static_cast<size_t>(bytes)}, remote{reinterpret_cast<void *>(r.va + start), local.iov_len};
		if (bytes && process_vm_readv(r.pid, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(bytes))
			return;  // the memory went away: the requester times out
		for (uint32_t k = first; k < last; ++k) {
			uint64_t offset = uint64_t(k) * mtu;
			size_t len = static_cast<size_t>(std::min<uint64_t>(mtu, r.length - std::min(r.length, offset)));
			uint8_t code = r.packets == 1	    ? op::kReadResponseOnly
				       : k == 0		    ? op::kReadResponseFirst
				       : k + 1 == r.packets ? op::kReadResponseLast
							    : op::kReadResponseMiddle;
			std::array<uint8_t, w::kBthBytes + w::kAethBytes> hdr{};
			w::Bth bth;
			bth.opcode = response_transport(qp) | code;
			bth.dest_qpn = qp.attributes().dest_qp_num & w::kQpnMask;
			bth.psn = (r.psn + k) & w::kPsnMask;
			bth.pad = w::pad_of(len);
			w::encode(bth, std::span<uint8_t, w::kBthBytes>(hdr.data(), w::kBthBytes));
			size_t n = w::kBthBytes;
			if (code != op::kReadResponseMiddle) {
				w::encode(w::Aeth{w::aeth::kAck, st.msn & w::kPsnMask},
					  std::span<uint8_t, w::kAethBytes>(hdr.data() + n, w::kAethBytes));
				n += w::kAethBytes;
			}
			iovec payload{data.data() + (offset - start), len};
			(void)out.add({hdr.data(), n}, &payload, len ? 1 : 0, len);
		}
		(void)out.flush();  // before the next chunk's bytes take the buffer
	}
}

void send_atomic_ack(Device &dev, const Packet &pk, const Qp &qp, const WireResponderState &st,
		     const WireResponderState::Replay &r)
{
	const xsrc_wire_socket *s = response_socket(dev, pk, qp);
	if (!s)
		return;
	std::array<uint8_t, w::kBthBytes + w::kAethBytes + w::kAtomicAckEthBytes> hdr{};
	w::Bth bth;
	bth.opcode = response_transport(qp) | op::kAtomicAcknowledge;
	bth.dest_qpn = qp.attributes().dest_qp_num & w::kQpnMask;
	bth.psn = r.psn & w::kPsnMask;
	w::encode(bth, std::span<uint8_t, w::kBthBytes>(hdr.data(), w::kBthBytes));
	w::encode(w::Aeth{w::aeth::kAck, st.msn & w::kPsnMask},
		  std::span<uint8_t, w::kAethBytes>(hdr.data() + w::kBthBytes, w::kAethBytes));
	w::encode(w::AtomicAckEth{r.original}, std::span<uint8_t, w::kAtomicAckEthBytes>(
						    hdr.data() + w::kBthBytes + w::kAethBytes, w::kAtomicAckEthBytes));
	(void)w::send_packet(*s, pk.sgid, hdr, nullptr, 0, 0);
}

// The READ and atomic requests a responder QP keeps for duplicates:
// max_dest_rd_atomic of them (the device's max_qp_rd_atom at most).
size_t replay_slots(const Qp &qp)
{
	return std::min<size_t>(qp.attributes().max_dest_rd_atomic, WireResponderState::kReplaySlots);
}

// A slot for a new request: the oldest goes. The responder cannot see which
// responses its requester has taken in; a requester that honours its
// max_rd_atomic (no more than our max_dest_rd_atomic) never asks again for
// a request that fell out.
WireResponderState::Replay &remember(const Qp &qp, WireResponderState &st)
{
	WireResponderState::Replay &r = st.replay[st.replay_next++ % replay_slots(qp)];
	r = {};
	r.used = true;
	return r;
}

// An RDMA READ request, in order: checked, remembered, answered.
Step respond_read(Device &dev, Context &owner, Qp &qp, WireResponderState &st, const Packet &pk)
{
	w::Reth reth = w::decode_reth(ext_bytes<w::kRethBytes>(pk, w::kExtReth));
	uint64_t va = 0;
	if (reth.dma_length) {
		std::optional<uint64_t> target = remote_key_target(dev, owner, qp, rkey_pd(owner, qp, pk), reth.rkey,
								   IB_UVERBS_ACCESS_REMOTE_READ, reth.va, reth.dma_length);
		if (!target)
			return Step::nak_access;
		va = *target;
	}
	WireResponderState::Replay &r = remember(qp, st);
	r.psn = pk.bth.psn;
	r.pid = owner.owner;
	r.va = va;
	r.length = reth.dma_length;
	r.packets = read_packets(reth.dma_length, qp_mtu(dev, qp));
	st.msn = (st.msn + 1) & w::kPsnMask;
	st.consumed = r.packets;
	st.answered = true;
	send_read_responses(dev, pk, qp, st, r, 0);
	return Step::ok;
}

// A CmpSwap or FetchAdd, in order: executed once, its original remembered.
Step respond_atomic(Device &dev, Context &owner, Qp &qp, WireResponderState &st, const Packet &pk)
{
	w::AtomicEth a = w::decode_atomic_eth(ext_bytes<w::kAtomicEthBytes>(pk, w::kExtAtomicEth));
	if (a.va % 8)
		return Step::nak_invalid;
	std::optional<uint64_t> va = remote_key_target(dev, owner, qp, rkey_pd(owner, qp, pk), a.rkey,
						       IB_UVERBS_ACCESS_REMOTE_ATOMIC, a.va, 8);
	if (!va)
		return Step::nak_access;
	uint64_t original = 0;
	bool fetch_add = (pk.bth.opcode & 0x1F) == op::kFetchAdd;
	int err = device_atomic(dev, owner, *va, fetch_add, fetch_add ? a.swap_add : a.compare, a.swap_add, original);
	if (err == EAGAIN)
		return Step::rnr;  // the lock stayed busy: the requester tries again
	if (err)
		return Step::nak_access;
	WireResponderState::Replay &r = remember(qp, st);
	r.atomic = true;
	r.psn = pk.bth.psn;
	r.packets = 1;
	r.original = original;
	st.msn = (st.msn + 1) & w::kPsnMask;
	st.answered = true;
	send_atomic_ack(dev, pk, qp, st, r);
	return Step::ok;
}

// An ATOMIC WRITE (IBTA 1.5), in order: 8 aligned bytes through an rkey
// with remote write, landing at once under the device's atomics lock. A
// duplicate is re-acknowledged, never written again.
Step respond_atomic_write(Device &dev, Context &owner, Qp &qp, WireResponderState &st, const Packet &pk)
{
	w::Reth reth = w::decode_reth(ext_bytes<w::kRethBytes>(pk, w::kExtReth));
	if (reth.dma_length != 8 || pk.payload.size() != 8 || reth.va % 8)
		return Step::nak_invalid;
	std::optional<uint64_t> va = remote_key_target(dev, owner, qp, rkey_pd(owner, qp, pk), reth.rkey,
						       IB_UVERBS_ACCESS_REMOTE_WRITE, reth.va, 8);
	if (!va)
		return Step::nak_access;
	int err = device_atomic_write(dev, owner, *va, std::as_bytes(pk.payload.first<8>()));
	if (err == EAGAIN)
		return Step::rnr;
	if (err)
		return Step::nak_access;
	st.msn = (st.msn + 1) & w::kPsnMask;
	return Step::ok;
}

Step respond_packet(Device &dev, Context &owner, Qp &qp, WireResponderState &st, const Packet &pk)
{
	uint8_t o = pk.bth.opcode & 0x1F;
	st.consumed = 1;
	st.answered = false;
	// XRC: an XRCETH naming no XRC SRQ of the receive QP's domain.
	if (qp.qp_type == IBV_QPT_XRC_RECV && !pk.xrc_srq)
		return Step::nak_invalid;
	if (is_send(o))
		return respond_send(dev, owner, qp, st, pk);
	if (o <= op::kWriteOnlyImm)
		return respond_write(dev, owner, qp, st, pk);
	if (static_cast<w::Transport>(pk.bth.opcode & 0xE0) == w::Transport::uc)
		return Step::nak_invalid;
	// READ and atomics need a responder resource: max_dest_rd_atomic 0
	// gives none, and a request beyond the responder's resources is invalid.
	bool needs_resource = o == op::kReadRequest || o == op::kCmpSwap || o == op::kFetchAdd;
	if (needs_resource && replay_slots(qp) == 0)
		return Step::nak_invalid;
	if (o == op::kReadRequest)
		return respond_read(dev, owner, qp, st, pk);
	if (o == op::kCmpSwap || o == op::kFetchAdd)
		return respond_atomic(dev, owner, qp, st, pk);
	if (o == op::kAtomicWrite)
		return respond_atomic_write(dev, owner, qp, st, pk);
	return Step::nak_invalid;
}

// A duplicate READ or atomic: answered again from what was remembered.
// False when nothing was (it fell out of the table): the requester's retry
// then times out, as it would against an HCA past max_dest_rd_atomic.
bool replay_duplicate(Device &dev, const Qp &qp, const WireResponderState &st, const Packet &pk)
{
	uint8_t o = pk.bth.opcode & 0x1F;
	for (const WireResponderState::Replay &r : st.replay) {
		if (!r.used || psn_diff(pk.bth.psn, r.psn) >= r.packets)
			continue;
		if (r.atomic && (o == op::kCmpSwap || o == op::kFetchAdd)) {
			send_atomic_ack(dev, pk, qp, st, r);
			return true;
		}
		if (!r.atomic && o == op::kReadRequest) {
			send_read_responses(dev, pk, qp, st, r, psn_diff(pk.bth.psn, r.psn));
			return true;
		}
	}
	return false;
}

uint8_t nak_syndrome(Step s)
{
	switch (s) {
	case Step::nak_invalid:
		return w::aeth::kNakInvalidRequest;
	case Step::nak_access:
		return w::aeth::kNakRemoteAccess;
	default:
		return w::aeth::kNakRemoteOperation;
	}
}

WireOutcome respond_rc(Device &dev, Context &owner, Qp &qp, WireResponderState &st, const Packet &pk)
{
	if (st.write_failed) {
		// A payload placed with its batch did not land (its memory went):
		// a remote access error, as if found when its packet came.
		st.write_failed = false;
		send_aeth(dev, pk, qp, w::aeth::kNakRemoteAccess, pk.bth.psn, st.msn);
		qp_enter_error(owner, qp);
		return WireOutcome::dropped;
	}
	uint32_t d = psn_diff(pk.bth.psn, st.epsn);
	if (d != 0) {
		if (d >= kPsnHalf) {
			uint8_t o = pk.bth.opcode & 0x1F;
			if (o == op::kReadRequest || o == op::kCmpSwap || o == op::kFetchAdd) {
				replay_duplicate(dev, qp, st, pk);
				return WireOutcome::delivered;
			}
			// A duplicate (the requester resent after a lost ACK): what it
			// asked was done; say so again, with where we are. Its ACK
			// timeout may be shorter than our delay: the QP's next ACKs
			// go out at once.
			if (pk.bth.ack_req)
				send_aeth(dev, pk, qp, w::aeth::kAck, (st.epsn - 1) & w::kPsnMask, st.msn);
			if (owner.ack_board)
				owner.ack_board->at_once(qp.qpn().value()) = kAtOnceAfterLate;
			return WireOutcome::delivered;
		}
		// A gap: one NAK per gap, then the requester goes back (go-back-N).
		if (!st.nak_sent) {
			st.nak_sent = true;
			send_aeth(dev, pk, qp, w::aeth::kNakPsnSequence, st.epsn, st.msn);
		}
		return WireOutcome::dropped;
	}
	st.nak_sent = false;
	Step s = respond_packet(dev, owner, qp, st, pk);
	switch (s) {
	case Step::ok:
		st.epsn = (st.epsn + st.consumed) & w::kPsnMask;
		if (pk.bth.ack_req && !st.answered && !owe_ack(dev, owner, qp, pk, pk.bth.psn, st.msn))
			send_aeth(dev, pk, qp, w::aeth::kAck, pk.bth.psn, st.msn);
		return WireOutcome::delivered;
	case Step::rnr:
		send_aeth(dev, pk, qp, static_cast<uint8_t>(w::aeth::kRnrNak | (qp.attributes().min_rnr_timer & 0x1F)),
			  pk.bth.psn, st.msn);
		return WireOutcome::dropped;
	default:
		// Invalid request, remote access and operation errors are fatal to
		// the responder's QP too (IBTA 9.9.3.1.2).
		send_aeth(dev, pk, qp, nak_syndrome(s), pk.bth.psn, st.msn);
		qp_enter_error(owner, qp);
		return WireOutcome::dropped;
	}
}

WireOutcome respond_uc(Device &dev, Context &owner, Qp &qp, WireResponderState &st, const Packet &pk)
{
	uint8_t o = pk.bth.opcode & 0x1F;
	if (st.write_failed) {  // the message under way lost bytes: dropped whole
		st.write_failed = false;
		st.in_send = st.in_write = false;
		st.discarding = true;
	}
	if (pk.bth.psn != st.epsn) {
		// A lost packet: the message under way is dropped (its receive is
		// kept for the next one), and so is all up to the next FIRST/ONLY.
		st.in_send = st.in_write = false;
		st.discarding = true;
	}
	st.epsn = (pk.bth.psn + 1) & w::kPsnMask;
	if (st.discarding) {
		if (!is_first(o))
			return WireOutcome::dropped;
		st.discarding = false;
	}
	Step s = respond_packet(dev, owner, qp, st, pk);
	if (s == Step::ok)
		return WireOutcome::delivered;
	// UC has no NAK: a message that cannot land is dropped whole.
	st.in_send = st.in_write = false;
	st.discarding = true;
	return WireOutcome::dropped;
}

// The XRC SRQ an XRC request's XRCETH names, if it is one of the receive
// QP's domain (else the request is invalid): into pk.xrc_srq and
// pk.xrc_owner, the context that owns it.
void resolve_xrc_srq(Device &dev, const Qp &qp, Packet &pk)
{
	uint32_t srqn = w::decode_xrceth(ext_bytes<w::kXrcEthBytes>(pk, w::kExtXrceth)).srqn;
	if (srqn < XSRC_SRQN_BASE || !qp.shared)
		return;
	ObjectRef ref = dev.srq_slots.find(srqn - XSRC_SRQN_BASE);
	Srq *srq = ref ? lookup<Srq>(*ref.ctx, ref.handle) : nullptr;
	const Xrcd *xrcd = srq && srq->xrcd_handle ? lookup<Xrcd>(*ref.ctx, *srq->xrcd_handle) : nullptr;
	if (!srq || srq->srq_type != IBV_SRQT_XRC || !xrcd || xrcd->xrcd_id != qp.shared->xrcd_id)
		return;
	pk.xrc_srq = srq;
	pk.xrc_owner = ref.ctx;
}

WireOutcome respond(Device &dev, Packet &pk)
{
	Context *owner = nullptr;
	Qp *qp = packet_qp(dev, pk, owner);
	auto transport = static_cast<w::Transport>(pk.bth.opcode & 0xE0);
	uint8_t want = transport == w::Transport::rc	? uint8_t(IBV_QPT_RC)
		       : transport == w::Transport::xrc ? uint8_t(IBV_QPT_XRC_RECV)
							: uint8_t(IBV_QPT_UC);
	if (!qp || qp->qp_type != want || !receive_state(qp_current_state(dev, *qp)))
		return WireOutcome::dropped;
	// A connected QP hears only the GID it is connected to.
	const QpAttributes &a = qp->attributes();
	if (std::memcmp(a.dest.dgid, pk.sgid.data(), pk.sgid.size()) != 0)
		return WireOutcome::dropped;
	// An XRC receive QP is shared by its handles: one responder for all.
	std::shared_ptr<WireResponderState> &slot = qp->shared ? qp->shared->wire_responder : qp->wire_responder;
	if (!slot) {
		slot = std::make_shared<WireResponderState>();
		slot->epsn = a.rq_psn & w::kPsnMask;
	}
	WireResponderState &st = *slot;
	if (transport == w::Transport::uc)
		return respond_uc(dev, *owner, *qp, st, pk);
	if (transport == w::Transport::xrc) {
		// The message reaches the SRQ's owner: its memory, its CQ.
		resolve_xrc_srq(dev, *qp, pk);
		if (pk.xrc_owner)
			owner = pk.xrc_owner;
	}
	return respond_rc(dev, *owner, *qp, st, pk);
}

// --- responses, for the requester in the QP owner's provider ---------------

// One message to `owner`'s response socket. Never blocks the daemon on a
// requester that does not read: what does not fit is lost, and the
// requester's timer recovers.
bool send_to_requester(const Context &owner, std::span<const uint8_t> message)
{
	ssize_t n = send(owner.wire_responses.get(), message.data(), message.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
	return n == static_cast<ssize_t>(message.size());
}

WireOutcome forward_response(Device &dev, const Packet &pk)
{
	Context *owner = nullptr;
	Qp *qp = packet_qp(dev, pk, owner);
	if (!qp || (qp->qp_type != IBV_QPT_RC && qp->qp_type != IBV_QPT_XRC_SEND) || !owner->wire_responses)
		return WireOutcome::dropped;
	ibv_qp_state s = qp_current_state(dev, *qp);
	if (s != IBV_QPS_RTS && s != IBV_QPS_SQD)
		return WireOutcome::dropped;
	if (std::memcmp(qp->attributes().dest.dgid, pk.sgid.data(), pk.sgid.size()) != 0)
		return WireOutcome::dropped;
	if (owner->wire_batched) {
		WirePending &p = dev.wire_pending;
		if (p.responses_to != owner ||
		    p.responses.size() + 2 + pk.transport.size() > XSRC_WIRE_RESPONSE_BATCH_BYTES)
			wire_flush_responses(dev);
		p.responses_to = owner;
		uint16_t len = htole16(static_cast<uint16_t>(pk.transport.size()));
		const auto *l = reinterpret_cast<const uint8_t *>(&len);
		p.responses.insert(p.responses.end(), l, l + sizeof(len));
		p.responses.insert(p.responses.end(), pk.transport.begin(), pk.transport.end());
		return WireOutcome::delivered;
	}
	return send_to_requester(*owner, pk.transport) ? WireOutcome::delivered : WireOutcome::dropped;
}

bool is_response(uint8_t opcode)
{
	uint8_t o = opcode & 0x1F;
	return o >= op::kReadResponseFirst && o <= op::kAtomicAcknowledge;
}

}  // namespace

void wire_flush(Device &dev)
{
	WirePending &p = dev.wire_pending;
	if (!p.st)
		return;
	size_t want = 0;
	for (const iovec &v : p.local)
		want += v.iov_len;
	ssize_t moved = process_vm_writev(p.pid, p.local.data(), p.local.size(), p.remote.data(), p.remote.size(), 0);
	if (moved != static_cast<ssize_t>(want))
		p.st->write_failed = true;
	p.st = nullptr;
	p.local.clear();
	p.remote.clear();
}

std::shared_ptr<AckBoard> AckBoard::map(int fd, uint32_t entries, int &err)
{
	struct stat st{};
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(fd, &st) || !S_ISREG(st.st_mode) ||
	    uint64_t(st.st_size) < uint64_t(entries) * sizeof(uint64_t)) {
		err = EINVAL;
		return nullptr;
	}
	void *p = mmap(nullptr, size_t(entries) * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		err = errno;
		return nullptr;
	}
	try {
		return std::shared_ptr<AckBoard>(new AckBoard(static_cast<uint64_t *>(p), entries));
	} catch (const std::bad_alloc &) {
		munmap(p, size_t(entries) * sizeof(uint64_t));
		err = ENOMEM;
		return nullptr;
	}
}

AckBoard::~AckBoard()
{
	munmap(words_, size_t(entries_) * sizeof(uint64_t));
}

uint64_t wire_acks_due(Device &dev)
{
	if (dev.owed_acks.empty())
		return 0;
	const uint64_t now = monotonic_ns();
	uint64_t next = 0;
	std::erase_if(dev.owed_acks, [&](OwedAck &o) {
		auto entry = o.board->word(o.qpn);
		uint64_t expected = o.word;
		if (entry.load(std::memory_order_acquire) != expected)
			return true;  // taken by the owner, or covered by a later ACK
		if (now < o.deadline_ns) {
			next = next ? std::min(next, o.deadline_ns) : o.deadline_ns;
			return false;
		}
		if (entry.compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) {
			(void)w::send_packet(*o.socket, o.to, o.headers, nullptr, 0, 0);
			o.board->at_once(o.qpn) = kAtOnceAfterLate;
			++dev.acks_late;
		}
		return true;
	});
	return next;
}

void wire_flush_responses(Device &dev)
{
	WirePending &p = dev.wire_pending;
	if (!p.responses_to)
		return;
	(void)send_to_requester(*p.responses_to, p.responses);  // lost whole if it does not fit
	p.responses_to = nullptr;
	p.responses.clear();
}

WireOutcome wire_deliver(Device &dev, std::span<const uint8_t> ip_packet)
{
	Packet pk;
	bool parsed = parse(ip_packet, pk);
	if (!parsed || !deferrable(pk))
		wire_flush(dev);  // what waits lands before anything else happens
	if (parsed && w::gid_is_multicast(pk.dgid))
		return deliver_multicast(dev, pk);
	if (!parsed || !device_has_gid(dev, pk.dgid))
		return WireOutcome::dropped;
	switch (static_cast<w::Transport>(pk.bth.opcode & 0xE0)) {
	case w::Transport::ud:
		return deliver_ud(dev, pk);
	case w::Transport::rc:
	case w::Transport::xrc:
		return is_response(pk.bth.opcode) ? forward_response(dev, pk) : respond(dev, pk);
	case w::Transport::uc:
		return respond(dev, pk);
	default:
		return WireOutcome::dropped;
	}
}

}  // namespace xsrc
