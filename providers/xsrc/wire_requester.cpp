// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The wire engine (xsrc_wire_transport): messages to a GID of another host
// leave as RoCE v2 packets over UDP to port 4791 of the GID's address
// (IPv4-mapped GID: IPv4, else IPv6), sent from this process. Today it
// carries UD: one SEND Only (with Immediate) packet per message, no larger
// than the port's MTU. The receiving host's xsrcd checks the ICRC and
// delivers (xsrcd/wire_receiver.cpp).
#include "xsrc.h"

#include <infiniband/verbs.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "peer_memory.h"
#include "wire/headers.h"
#include "wire_sender.h"

namespace w = xsrc::wire;

namespace {

using Result = xsrc_attempt_result;

// A Q_Key with the high bit set means "use the QP's own" (IBTA 10.2.5).
constexpr uint32_t kQkeyUseQps = 0x80000000u;
constexpr size_t kMaxIp = w::kIpv6Bytes;
constexpr size_t kMaxTransportHeaders = w::kBthBytes + w::kDethBytes + w::kImmDtBytes;

// The IP and UDP headers the kernel will put in front of `udp_payload`
// bytes from socket `s` to `dst`, for the ICRC: written to `ip`, returns
// their length.
size_t predict_ip_udp(const xsrc_wire_socket &s, const std::array<uint8_t, 16> &dgid, size_t udp_payload,
		      uint8_t *ip)
{
	uint16_t udp_len = static_cast<uint16_t>(w::kUdpBytes + udp_payload);
	size_t ip_len;
	if (s.ipv4) {
		w::Ipv4 h;
		h.total_length = static_cast<uint16_t>(w::kIpv4Bytes + udp_len);
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

// The interface a link-local source address is scoped to.
uint32_t sgid_ifindex(ibv_context *ibctx, const xsrc_ah &ah)
{
	ibv_gid_entry entry{};
	if (ibv_query_gid_ex(ibctx, ah.attr.port_num, ah.attr.grh.sgid_index, &entry, 0))
		return 0;
	return entry.ndev_ifindex;
}

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
	const xsrc_wire_socket *s = ctx->wire.socket_for(sgid, sgid_ifindex(&ctx->ibv_ctx.context, *wqe.ah));
	if (!s)
		return Result::dropped();  // no such address (any more): nothing leaves

	bool imm = wqe.opcode == IBV_WR_SEND_WITH_IMM;
	uint8_t pad = static_cast<uint8_t>((4 - local.total % 4) % 4);
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

	// The ICRC: the predicted IP/UDP headers with ours, the payload, the pad.
	std::array<uint8_t, kMaxIp + w::kUdpBytes + kMaxTransportHeaders> pseudo{};
	size_t udp_payload = hdr_len + local.total + pad + w::kIcrcBytes;
	size_t ip_udp = predict_ip_udp(*s, dgid, udp_payload, pseudo.data());
	std::memcpy(pseudo.data() + ip_udp, hdr.data(), hdr_len);
	uint32_t crc = *w::icrc(std::span<const uint8_t>(pseudo.data(), ip_udp + hdr_len));
	for (size_t i = 0; i < local.count; ++i)
		crc = w::icrc_continue(crc, {static_cast<const uint8_t *>(local.iov[i].iov_base), local.iov[i].iov_len});
	std::array<uint8_t, 3 + w::kIcrcBytes> tail{};
	crc = w::icrc_continue(crc, {tail.data(), pad});
	w::store_icrc(crc, std::span<uint8_t, w::kIcrcBytes>(tail.data() + pad, w::kIcrcBytes));

	std::array<iovec, XSRC_MAX_RECV_SGE + 2> iov;
	size_t n = 0;
	iov[n++] = {hdr.data(), hdr_len};
	for (size_t i = 0; i < local.count; ++i)
		iov[n++] = local.iov[i];
	iov[n++] = {tail.data(), pad + w::kIcrcBytes};

	sockaddr_in a4{};
	sockaddr_in6 a6{};
	msghdr msg{};
	if (s->ipv4) {
		a4.sin_family = AF_INET;
		a4.sin_port = htons(w::kRoceV2Port);
		a4.sin_addr = w::gid_ipv4(dgid);
		msg.msg_name = &a4;
		msg.msg_namelen = sizeof(a4);
	} else {
		a6.sin6_family = AF_INET6;
		a6.sin6_port = htons(w::kRoceV2Port);
		std::memcpy(&a6.sin6_addr, dgid.data(), sizeof(a6.sin6_addr));
		if (IN6_IS_ADDR_LINKLOCAL(&a6.sin6_addr))
			a6.sin6_scope_id = s->scope_id;
		msg.msg_name = &a6;
		msg.msg_namelen = sizeof(a6);
	}
	msg.msg_iov = iov.data();
	msg.msg_iovlen = n;
	int saved = errno;
	// A datagram the network cannot take is lost, as on a wire: the sender
	// of an unreliable message never learns.
	(void)sendmsg(s->fd.get(), &msg, MSG_NOSIGNAL);
	errno = saved;
	return Result::done(local.total);
}

Result wire_execute(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe) noexcept
{
	if (qp->type == IBV_QPT_UD && wqe.ah)
		return wire_send_ud(ctx, qp, wqe);
	// Connected transports do not cross hosts yet.
	return xsrc_unrouted_transport.execute(ctx, qp, wqe);
}

}  // namespace

const xsrc_transport xsrc_wire_transport = {
	.name = "wire",
	.execute = wire_execute,
};
