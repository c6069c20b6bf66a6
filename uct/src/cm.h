// Connection set-up by socket address for the shim's ifaces (UCX's iface-level sockaddr
// mode: UCT_IFACE_OPEN_MODE_SOCKADDR_SERVER, uct_iface_accept / uct_iface_reject,
// uct_ep_create with UCT_EP_PARAM_FIELD_SOCKADDR or _CONN_REQUEST, uct_ep_connect,
// uct_ep_disconnect, uct_cm_client_ep_conn_notify).
//
// The device has no connection manager of its own (no rdma_cm, no IP-to-GID resolution),
// so the out-of-band exchange of addresses runs over one TCP connection per ep pair: the
// server listens on params->mode.sockaddr.listen_sockaddr; a client ep connects to it and
// sends CONN_REQ (its device and ep address + the user's private data); the server's
// conn_request_cb decides; ACCEPT carries the server's device and ep address back, and both
// RC QPs are connected with the core's ordinary ep_connect_to_ep. NOTIFY (client -> server)
// and DISCONNECT (either way) travel on the same socket; its EOF means the peer is gone.
// Frames: FrameHdr + device address + ep address + private data.
//
// Endpoints:
// - client: uct_ep_create({iface, sockaddr, sockaddr_pack_cb | cm_resolve_cb,
//   sockaddr_cb_client, disconnect_cb, user_data}). With cm_resolve_cb the client calls
//   uct_ep_connect() (private data) after the callback, as UCX documents; with
//   sockaddr_pack_cb the request goes out as soon as the TCP connection is up.
// - server: conn_request_cb(iface, arg, conn_request, priv, len) is called from progress.
//   uct_iface_accept(iface, req) creates and connects the server-side ep; the user gets it
//   (and sets its callbacks) with uct_ep_create({iface, conn_request, sockaddr_cb_server,
//   disconnect_cb, user_data}), which also accepts by itself if uct_iface_accept was not
//   called (then with the private data of that call). uct_iface_reject(iface, req) answers
//   REJECT: the client's sockaddr_cb_client gets UCS_ERR_REJECTED and its iface error
//   handler is called with UCS_ERR_REJECTED (uct_iface_reject's documented behaviour).
//   A request stays valid until it is accepted-and-adopted, rejected, or the iface closes.
//
// What the module relies on from the core (requested of uctcore; 1-5 are done):
//  1. xsrc_uct_iface_open with open_mode UCT_IFACE_OPEN_MODE_SOCKADDR_SERVER (or _CLIENT):
//     mode is a union, so mode.device is absent: the md's device, port 1, and
//     uct_xsrc_cm_iface_init() as for DEVICE mode (it reads params->mode.sockaddr).
//  2. iface_query calls uct_xsrc_cm_iface_query() (max_conn_priv, listen_sockaddr and
//     UCT_IFACE_FLAG_CONNECT_TO_SOCKADDR).
//  3. ep_create calls uct_xsrc_cm_ep_create() when field_mask has UCT_EP_PARAM_FIELD_SOCKADDR or
//     UCT_EP_PARAM_FIELD_CONN_REQUEST. uct_xsrc_cm_ep_create creates the data ep through
//     iface->ops.ep_create with field_mask = UCT_EP_PARAM_FIELD_IFACE only (the plain path).
//  4. ep_destroy calls uct_xsrc_cm_ep_destroy() for every ep before it is freed (eps whose
//     ep_cm_state is null are ignored).
//  5. iface close calls uct_xsrc_cm_iface_cleanup() before the eps are destroyed; it destroys the
//     eps it still owns (accepted but never adopted) through iface->ops.ep_destroy.
//  6. DONE (uctcore: iface_watch_fd in internal.h, EPOLLIN). A hook to add an fd to the iface's event fd (e.g.
//     iface_watch_fd(Iface *, int fd, bool on)) so TCP readiness wakes
//     uct_iface_event_fd_get() waiters; until then the cm's sockets are serviced from iface
//     progress only (polled on one progress call in 16).
#pragma once

#include "internal.h"

#include <uct/api/uct.h>

namespace xsrc::uct {

ucs_status_t uct_xsrc_cm_iface_init(Iface *, const uct_iface_params_t *);
void uct_xsrc_cm_iface_cleanup(Iface *);
void uct_xsrc_cm_iface_query(Iface *, uct_iface_attr_t *);
unsigned uct_xsrc_cm_iface_progress(Iface *);
ucs_status_t uct_xsrc_cm_ep_create(const uct_ep_params_t *, uct_ep_h *);
void uct_xsrc_cm_ep_destroy(Ep *);
ucs_status_t uct_xsrc_cm_ep_connect(uct_ep_h, const uct_ep_connect_params_t *);
ucs_status_t uct_xsrc_cm_ep_disconnect(uct_ep_h, unsigned);
ucs_status_t uct_xsrc_cm_ep_conn_notify(uct_ep_h);
ucs_status_t uct_xsrc_cm_iface_accept(uct_iface_h, uct_conn_request_h);
ucs_status_t uct_xsrc_cm_iface_reject(uct_iface_h, uct_conn_request_h);

}  // namespace xsrc::uct
