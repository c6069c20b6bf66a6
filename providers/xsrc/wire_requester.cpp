// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The wire engine (xsrc_wire_transport): messages to a GID of another host
// leave as RoCE v2 packets over UDP to port 4791 of the GID's address
// (IPv4-mapped GID: IPv4, else IPv6), sent from this process (wire/sender.h).
// UD: one SEND Only (with Immediate) packet per message, no larger than the
// port's MTU; to a multicast GID, one datagram to the IP group (the
// shared-memory engine delivered to this host's members: shm_responder.cpp). RC, UC and XRC: wire_rc.cpp. The receiving host's xsrcd
// checks the ICRC and delivers (xsrcd/wire_receiver.cpp, wire_deliver.cpp).
#include "xsrc.h"

#include <infiniband/verbs.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "peer_memory.h"
#include "wire/headers.h"
#include "wire/sender.h"

namespace w = xsrc::wire;

namespace {

using Result = xsrc_attempt_result;

// A Q_Key with the high bit set means "use the QP's own" (IBTA 10.2.5).
constexpr uint32_t kQkeyUseQps = 0x80000000u;
constexpr size_t kMaxTransportHeaders = w::kBthBytes + w::kDethBytes + w::kImmDtBytes;

Result wire_send_ud(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe)
{
	xsrc_local_buffers local;
	if (!xsrc_peer_local_buffers(ctx, qp, wqe, false, local))
		return Result::failed(IBV_WC_LOC_PROT_ERR);
	// One packet per message: the port's MTU bounds a datagram, as on an HCA.
	if (local.total > ctx->port_mtu_bytes)
		return Result::failed(IBV_WC_LOC_LEN_ERR);
	if (wqe.opcode != IBV_WR_SEND && wqe.opcode != IBV_WR_SEND_WITH_IMM)
		return Result::failed(IBV_WC_LOC_QP_OP_ERR);

	std::array<uint8_t, 16> sgid, dgid;
	std::memcpy(sgid.data(), wqe.ah->sgid.raw, sgid.size());
	std::memcpy(dgid.data(), wqe.ah->attr.grh.dgid.raw, dgid.size());
	// Both ends of one family: an IPv4 source reaches only IPv4 peers.
	if (w::gid_is_ipv4_mapped(sgid) != w::gid_is_ipv4_mapped(dgid))
		return Result::dropped();
	// The source port from our QP alone: a UD QP has no one peer.
	const xsrc_wire_socket *s = ctx->wire.socket_for(sgid, wqe.ah->sgid_ifindex, w::udp_source_port(qp->qpn.value(), 0));
	if (!s)
		return Result::dropped();  // no such address (any more): nothing leaves

	bool imm = wqe.opcode == IBV_WR_SEND_WITH_IMM;
	uint8_t pad = w::pad_of(local.total);
	std::array<uint8_t, kMaxTransportHeaders> hdr{};
	w::Bth bth;
	bth.opcode = imm ? w::opcode::kUdSendOnlyImm : w::opcode::kUdSendOnly;
	bth.solicited = wqe.flags & IBV_SEND_SOLICITED;
	bth.pad = pad;
	bth.dest_qpn = wqe.remote_qpn.value();
	bth.psn = qp->wire_psn++ & w::kPsnMask;
	w::encode(bth, std::span<uint8_t, w::kBthBytes>(hdr.data(), w::kBthBytes));
	uint32_t qkey = (wqe.remote_qkey & kQkeyUseQps) ? qp->entry->qkey : wqe.remote_qkey;
	w::encode(w::Deth{qkey, qp->qpn.value()}, std::span<uint8_t, w::kDethBytes>(hdr.data() + w::kBthBytes, w::kDethBytes));
	size_t hdr_len = w::kBthBytes + w::kDethBytes;
	if (imm) {
		w::encode(w::ImmDt{wqe.imm_data}, std::span<uint8_t, w::kImmDtBytes>(hdr.data() + hdr_len, w::kImmDtBytes));
		hdr_len += w::kImmDtBytes;
	}

	// A datagram the network cannot take is lost, as on a wire: the sender
	// of an unreliable message never learns.
	(void)w::send_packet(*s, dgid, {hdr.data(), hdr_len}, local.iov.data(), local.count, local.total,
			     wqe.ah->attr.grh.hop_limit);
	return Result::done(local.total);
}

Result wire_execute(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe) noexcept
{
	if (qp->type == IBV_QPT_UD && wqe.ah)
		return wire_send_ud(ctx, qp, wqe);
	if (qp->type == IBV_QPT_RC || qp->type == IBV_QPT_UC || qp->type == IBV_QPT_XRC_SEND)
		return xsrc_wire_connected_execute(ctx, qp, wqe);
	return xsrc_unrouted_transport.execute(ctx, qp, wqe);
}

}  // namespace

void xsrc_wire_send_multicast(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe) noexcept
{
	if (wqe.ah && wqe.ah->attr.is_global)
		(void)wire_send_ud(ctx, qp, wqe);
}

const xsrc_transport xsrc_wire_transport = {
	.name = "wire",
	.execute = wire_execute,
};
