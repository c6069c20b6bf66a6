// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Routing by destination GID: a connected QP (at RTR) and an address handle
// pick the engine that carries their messages. A GID of this device's port is
// the shared-memory engine; any other GID is another host, reached by the
// wire engine (RoCE v2, wire_requester.cpp): UD address handles, RC, UC and
// XRC send QPs. Never a local QP that happens to have the same number. A QP
// the wire cannot carry is unrouted: reliable QPs retry, then complete with
// IBV_WC_RETRY_EXC_ERR, unreliable ones lose the message, as on a wire with
// nobody at the other end.
// A multicast GID is a group with members on this device and beyond it:
// the shared-memory engine delivers to this device's members and puts one
// datagram on the wire for the other hosts' (xsrc_wire_send_multicast).
#include "xsrc.h"

#include <cstring>

namespace {

xsrc_attempt_result unrouted_execute(xsrc_context *, xsrc_qp *qp, const xsrc_send_wqe &) noexcept
{
	bool reliable = qp->type == IBV_QPT_RC || qp->type == IBV_QPT_XRC_SEND;
	return reliable ? xsrc_attempt_result::unreachable() : xsrc_attempt_result::dropped();
}

}  // namespace

const xsrc_transport xsrc_unrouted_transport = {
	.name = "unrouted",
	.execute = unrouted_execute,
};

bool xsrc_gid_is_local(ibv_context *ibctx, uint8_t port_num, const ibv_gid &gid)
{
	ibv_port_attr port{};
	if (ibv_query_port(ibctx, port_num, &port))
		return false;
	static const ibv_gid kNoGid{};
	if (std::memcmp(&gid, &kNoGid, sizeof(gid)) == 0)
		return false;
	for (int i = 0; i < port.gid_tbl_len; ++i) {
		ibv_gid entry;
		if (ibv_query_gid(ibctx, port_num, i, &entry) == 0 && std::memcmp(&entry, &gid, sizeof(gid)) == 0)
			return true;
	}
	return false;
}

const xsrc_transport *xsrc_route(ibv_context *ibctx, const ibv_ah_attr &ah)
{
	const xsrc_transport *local = to_xsrc_ctx(ibctx)->transport;
	// Without a GRH the destination is on this port (the device's own LID).
	if (!ah.is_global || xsrc_is_multicast_gid(ah.grh.dgid.raw) ||
	    xsrc_gid_is_local(ibctx, ah.port_num, ah.grh.dgid))
		return local;
	return &xsrc_wire_transport;
}
