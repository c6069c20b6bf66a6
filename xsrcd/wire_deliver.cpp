// Delivery of RoCE v2 UD packets (wire_deliver.h). Every decision is taken
// on the daemon's own records (the QP's type, state, Q_Key, receive ring and
// CQ; each SGE's MR in the owner's context), never on the arena's copies,
// which any process of the device can write; the bytes land in the owner's
// memory by process_vm_writev, the completion in its CQ ring.
#include "wire_deliver.h"

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <cstring>
#include <optional>

#include "common/ring_ops.h"
#include "dispatcher_handlers.h"
#include "wire/headers.h"

namespace xsrc {
namespace {

namespace w = wire;

struct UdPacket {
	std::span<const uint8_t> ip_header;
	std::array<uint8_t, 16> dgid{};
	w::Bth bth;
	w::Deth deth;
	std::optional<w::ImmDt> imm;
	std::span<const uint8_t> payload;
};

// The parts of a UD SEND packet, or nothing for anything else.
std::optional<UdPacket> parse_ud(std::span<const uint8_t> p)
{
	UdPacket u;
	size_t ip_len;
	if (p[0] >> 4 == 4) {
		auto ip = w::decode_ipv4(p.first<w::kIpv4Bytes>());
		// Fragments are not reassembled: RoCE never sends any.
		if (!ip || ip->protocol != w::kIpProtoUdp || (ip->flags_fragment & 0x3FFF))
			return std::nullopt;
		u.dgid[10] = u.dgid[11] = 0xFF;
		std::memcpy(u.dgid.data() + 12, &ip->dst, 4);
		ip_len = w::kIpv4Bytes;
	} else {
		auto ip = w::decode_ipv6(p.first<w::kIpv6Bytes>());
		if (!ip || ip->next_header != w::kIpProtoUdp)
			return std::nullopt;
		std::memcpy(u.dgid.data(), &ip->dst, 16);
		ip_len = w::kIpv6Bytes;
	}
	u.ip_header = p.first(ip_len);
	if (p.size() < ip_len + w::kUdpBytes + w::kBthBytes + w::kIcrcBytes)
		return std::nullopt;
	w::Udp udp = w::decode_udp(p.subspan(ip_len).first<w::kUdpBytes>());
	if (udp.dst_port != w::kRoceV2Port || udp.length != p.size() - ip_len)
		return std::nullopt;
	auto body = p.subspan(ip_len + w::kUdpBytes);
	u.bth = w::decode_bth(body.first<w::kBthBytes>());
	if (u.bth.tver != 0 || (u.bth.opcode != w::opcode::kUdSendOnly && u.bth.opcode != w::opcode::kUdSendOnlyImm))
		return std::nullopt;
	size_t headers = w::header_bytes(u.bth.opcode);
	if (body.size() < headers + u.bth.pad + w::kIcrcBytes)
		return std::nullopt;
	u.deth = w::decode_deth(body.subspan(w::kBthBytes).first<w::kDethBytes>());
	if (u.bth.opcode == w::opcode::kUdSendOnlyImm)
		u.imm = w::decode_immdt(body.subspan(w::kBthBytes + w::kDethBytes).first<w::kImmDtBytes>());
	u.payload = body.subspan(headers, body.size() - headers - u.bth.pad - w::kIcrcBytes);
	return u;
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

// The arena is writable by every process of the device: the geometry in a
// ring's header must fit the allocation the daemon made for it before the
// daemon indexes slots with it.
bool recv_ring_fits(const Arena &arena, uint64_t off, const xsrc_recv_ring &r)
{
	uint64_t n = r.num_entries;
	return n && (n & (n - 1)) == 0 && r.stride >= sizeof(xsrc_recv_wqe) &&
	       sizeof(r) + n * r.stride <= arena.allocation_bytes(off);
}

bool cq_ring_fits(const Arena &arena, uint64_t off, const xsrc_cq_ring &r)
{
	uint64_t n = r.num_entries;
	return n && (n & (n - 1)) == 0 &&
	       sizeof(r) + n * (sizeof(xsrc_cqe) + uint64_t(r.payload_stride)) <= arena.allocation_bytes(off);
}

// Appends `cqe` to the CQ and wakes its channel if armed for it (as the
// provider's xsrc_cq_complete does, with the daemon's own event calls).
void complete(Device &dev, Context &owner, Cq &cq, const xsrc_cqe &cqe)
{
	auto *ring = &dev.arena->at<xsrc_cq_ring>(cq.ring_off);
	if (!cq_ring_fits(*dev.arena, cq.ring_off, *ring))
		return;  // a forged ring: its owner gets nothing more from us
	if (!cq_push(ring, cqe, {}, kRingTries)) {
		if (cq_first_overrun(ring))
			post_cq_event(owner, cq, IBV_EVENT_CQ_ERR);
		return;
	}
	if (cq_consume_arm(ring, cqe))
		post_completion_event(owner, cq);
}

// After a receive was taken from an SRQ: its limit event, once per arming.
void check_srq_limit(Context &owner, Srq &srq, xsrc_recv_ring *ring)
{
	auto limit = atomic(ring->srq_limit);
	uint32_t armed = limit.load(std::memory_order_acquire);
	if (armed && recv_count(ring) < armed && limit.compare_exchange_strong(armed, 0, std::memory_order_acq_rel))
		post_srq_event(owner, srq, IBV_EVENT_SRQ_LIMIT_REACHED);
}

}  // namespace

WireOutcome wire_deliver(Device &dev, std::span<const uint8_t> ip_packet)
{
	std::optional<UdPacket> u = parse_ud(ip_packet);
	if (!u || !device_has_gid(dev, u->dgid) || u->bth.dest_qpn < XSRC_QPN_BASE)
		return WireOutcome::dropped;
	ObjectRef ref = dev.qp_slots.find(u->bth.dest_qpn - XSRC_QPN_BASE);
	Qp *qp = ref ? lookup<Qp>(*ref.ctx, ref.handle) : nullptr;
	// A UD datagram nobody can take is dropped silently (IBTA 10.2.5: a
	// Q_Key violation too).
	if (!qp || qp->qp_type != IBV_QPT_UD || !receive_state(qp_current_state(dev, *qp)) ||
	    qp->attributes().qkey != u->deth.qkey)
		return WireOutcome::dropped;
	Context &owner = *ref.ctx;
	Cq *cq = qp->recv_cq_handle ? lookup<Cq>(owner, *qp->recv_cq_handle) : nullptr;
	Srq *srq = qp->srq_handle ? lookup<Srq>(owner, *qp->srq_handle) : nullptr;
	uint64_t ring_off = srq ? srq->ring_off : qp->rq_off;
	if (!cq || !ring_off || (qp->srq_handle && !srq))
		return WireOutcome::dropped;
	auto *ring = &dev.arena->at<xsrc_recv_ring>(ring_off);
	RecvWqe rwqe;
	if (!recv_ring_fits(*dev.arena, ring_off, *ring) || !recv_pop(ring, rwqe, kRingTries))
		return WireOutcome::dropped;  // no receive posted: UD loses it
	if (srq)
		check_srq_limit(owner, *srq, ring);

	xsrc_cqe c{};
	c.wr_id = rwqe.wr_id;
	c.opcode = IBV_WC_RECV;
	c.qp_num = u->bth.dest_qpn;
	PdId pd = pd_id_of(owner, srq ? std::optional<PdHandle>(srq->pd_handle) : qp->pd_handle);
	std::array<uint8_t, w::kGrhBytes> grh = w::grh_from_ip(u->ip_header);
	uint64_t len = w::kGrhBytes + u->payload.size();
	std::array<iovec, XSRC_MAX_RECV_SGE> remote;
	size_t nremote;
	ibv_wc_status st = scatter(dev, owner, pd, rwqe, len, remote, nremote);
	if (st == IBV_WC_SUCCESS) {
		iovec local[2] = {{grh.data(), grh.size()},
				  {const_cast<uint8_t *>(u->payload.data()), u->payload.size()}};
		ssize_t n = process_vm_writev(owner.owner, local, 2, remote.data(), nremote, 0);
		if (n != static_cast<ssize_t>(len))
			st = IBV_WC_LOC_PROT_ERR;
	}
	c.status = st;
	if (st == IBV_WC_SUCCESS) {
		c.byte_len = static_cast<uint32_t>(len);
		c.src_qp = u->deth.src_qpn;
		c.wc_flags = IBV_WC_GRH;
		if (u->imm) {
			c.imm_data = u->imm->raw;
			c.wc_flags |= IBV_WC_WITH_IMM;
		}
		if (u->bth.solicited)
			c.flags |= XSRC_CQE_SOLICITED;
	}
	complete(dev, owner, *cq, c);
	return WireOutcome::delivered;
}

}  // namespace xsrc
