// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// RC and UC on the wire, the requester's side (wire_rc.cpp). The requester
// is a NIC's send engine: it lives here, in the process that posts, beside
// the send queue and the local buffers it reads; the peer host's xsrcd is
// the responder. Responses (ACK, NAK) reach this host's xsrcd, which hands
// them to the context's response socket (XSRC_CMD_WIRE_RESPONSES); a thread
// per context reads them and runs the QPs' timers.
#pragma once

#include <infiniband/verbs.h>

#include <memory>

#include "transport.h"

struct xsrc_context;
struct xsrc_qp;
struct xsrc_send_wqe;

namespace xsrc {
class WireEngine;
// Stops and joins the response thread (wire_rc.cpp).
struct WireEngineDeleter {
	void operator()(WireEngine *engine) const noexcept;
};
}  // namespace xsrc

// A QP's state on the wire (wire_rc.cpp), made when its path leads to
// another host.
struct xsrc_wire_qp;

// Before MODIFY_QP gives an RC QP a path to another host: the context's
// response socket is registered and its thread runs (a device that cannot
// take the socket refuses, and so does the modify). Returns 0 or errno.
int xsrc_wire_prepare(xsrc_qp *qp) noexcept;
// After MODIFY_QP succeeded on an RC or UC QP whose engine is the wire:
// the path (IBV_QP_AV), PSNs and timers. Returns 0 or errno.
int xsrc_wire_qp_modify(xsrc_qp *qp, const ibv_qp_attr &attr, int attr_mask) noexcept;
// One RC or UC message onto the wire (the caller holds sq_lock).
xsrc_attempt_result xsrc_wire_connected_execute(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe) noexcept;
// Messages sent and not acknowledged complete with IBV_WC_WR_FLUSH_ERR
// (under sq_lock); with `forget`, they go without completions (RESET).
void xsrc_wire_qp_flush(xsrc_qp *qp, bool forget) noexcept;
// From poll_cq: responses that arrived are handled now, by the polling
// thread, when RC messages are in flight (a load when none are).
void xsrc_wire_poll(xsrc_context *ctx) noexcept;
// From req_notify_cq: an application about to sleep on a completion
// channel needs the response thread to read responses as they come.
void xsrc_wire_armed(xsrc_context *ctx) noexcept;
// The QP is being destroyed: the response thread lets go of it, its state goes.
void xsrc_wire_qp_destroy(xsrc_context *ctx, xsrc_qp *qp) noexcept;
