// The contract between the shim's core (iface, ep, flow control, data ops) and its
// tag-matching (tag.*) and connection-manager (cm.*) modules. Extend only; never change
// an existing declaration incompatibly.
#pragma once

#include <uct/api/uct.h>

#include <cstddef>
#include <cstdint>
#include <sys/types.h>

namespace xsrc::uct {

struct Iface;  // behind uct_iface_h: layout-compatible with UCX 1.13.1's uct_base_iface_t (see verbs_iface.h)
struct Ep;     // behind uct_ep_h: starts with a uct_ep_t

Iface *to_iface(uct_iface_h);
Ep *to_ep(uct_ep_h);
Iface *ep_iface(Ep *);
uct_iface_h to_uct(Iface *);
uct_ep_h to_uct(Ep *);

// Internal messages travel in the shim's wire header beside the user's AM id and never
// reach user AM handlers.
// The values are on the wire: never renumber one. Free: 4-7 for the tag module, 8-11 for the
// cm module (it has needed no in-band message so far), 16 and up for the core (credit grants
// and ep_check probes are RDMA writes, emulated atomics compare-and-swap loops: none yet).
enum class MsgKind : uint8_t {
	user_am = 0,
	tag_eager = 1, tag_rndv_rts = 2, tag_rndv_ats = 3,
};
inline constexpr unsigned msg_kind_count = 32;

// Called from iface progress. `data` is hdr+payload as sent. Same descriptor rules as UCT AM
// handlers: if the handler returns UCS_INPROGRESS and flags has UCT_CB_PARAM_FLAG_DESC, it
// keeps `data` until it calls iface_release_desc(data).
// src_ep: the local Ep connected to the sender (always known for RC and XRC: the core puts
// the sender's identity in its header). It may be null only if that ep was destroyed locally.
using InternalHandler = ucs_status_t (*)(void *arg, Ep *src_ep, void *data, size_t length, unsigned flags);
void iface_set_internal_handler(Iface *, MsgKind, InternalHandler, void *arg);
void iface_release_desc(Iface *, void *data);

// One internal message, like am_bcopy (same flow control and resource rules): returns the
// packed length (>= 0), or UCS_ERR_NO_RESOURCE (no send credit / queue full: the caller
// returns it to the user, who may use ep_pending_add), or another error if the ep failed.
ssize_t ep_send_internal(Ep *, MsgKind, uct_pack_callback_t pack, void *arg);
size_t iface_internal_max(Iface *);  // largest message ep_send_internal can carry

void *iface_tag_state(Iface *);  // one pointer slot for the tag module
void iface_set_tag_state(Iface *, void *);
void *iface_cm_state(Iface *);   // one pointer slot for the cm module
void iface_set_cm_state(Iface *, void *);
const uct_iface_params_t &iface_params(Iface *);
uct_md_h iface_md(Iface *);

// The ordinary ops (put/get zcopy for rendezvous, ep_create/get_address/connect_to_ep for
// cm) are used through UCX's public inline API on to_uct(...).

// --- Additions (extend-only) ---
// The worker the iface was opened on (for the cm module's async events).
uct_worker_h iface_worker(Iface *);
// Report an ep failure through the core: the ep moves to failed, its outstanding ops
// complete with `status`, uct_xsrc_tag_ep_failed() runs, and the user's err_handler is called.
void ep_set_failed(Ep *, ucs_status_t status);
// One pointer slot per ep for the cm module (e.g. its connection state).
void *ep_cm_state(Ep *);
void ep_set_cm_state(Ep *, void *);
// Adds (on) or removes (!on) an fd to the set behind uct_iface_event_fd_get(): its readability
// (EPOLLIN) wakes waiters, and uct_iface_event_arm() answers UCS_ERR_BUSY while it is readable.
// Remove an fd before closing it.
ucs_status_t iface_watch_fd(Iface *, int fd, bool on);

}  // namespace xsrc::uct
