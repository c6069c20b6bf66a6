// Software tag matching for the shim: the 8 tag ops of uct_iface_ops_t over the core's
// internal messages (MsgKind::tag_*), with UCT's tag-offload semantics (uct.h, UCT_TAG).
//
// Wire (each one internal message, little-endian host order: both ends are the same host
// or the same ABI):
//   tag_eager     EagerHdr + payload
//   tag_rndv_rts  RtsHdr + user header + packed rkey (rkey absent for rndv_request)
//   tag_rndv_ats  AtsMsg: the receiver finished (or failed) the get of a matched RTS
// Rendezvous: rndv_zcopy sends an RTS with the sender's address, length and packed rkey;
// a receiver whose posted receive matches it reads the data with get_zcopy over the ep back
// to the sender and then sends an ATS, which completes the sender's `comp`. An RTS that
// matches no posted receive goes to the iface's rndv_cb (remote address, length, packed
// rkey), and the protocol layer completes it in software and releases the sender's
// operation with rndv_cancel, as with UCX's HW tag offload.
//
// What the module relies on from the core (requested of uctcore, and done):
//  1. uct_xsrc_tag_iface_query() runs after cap.get is filled: the rendezvous and receive limits
//     follow the get_zcopy limits (cap.get.max_zcopy, cap.get.max_iov).
//  2. ep_destroy calls uct_xsrc_tag_ep_failed(iface, ep, UCS_ERR_CANCELED) before the Ep is freed
//     (outstanding rendezvous operations of that ep complete with UCS_ERR_CANCELED).
//  3. rkeys are packed with xsrc_uct_md_mkey_pack and unpacked with xsrc_uct_rkey_unpack.
#pragma once

#include "internal.h"

#include <uct/api/uct.h>

namespace xsrc::uct {

ucs_status_t uct_xsrc_tag_iface_init(Iface *, const uct_iface_params_t *);
void uct_xsrc_tag_iface_cleanup(Iface *);
void uct_xsrc_tag_iface_query(Iface *, uct_iface_attr_t *);
unsigned uct_xsrc_tag_iface_progress(Iface *);
void uct_xsrc_tag_ep_failed(Iface *, Ep *, ucs_status_t);

ucs_status_t uct_xsrc_tag_ep_eager_short(uct_ep_h, uct_tag_t, const void *, size_t);
ssize_t uct_xsrc_tag_ep_eager_bcopy(uct_ep_h, uct_tag_t, uint64_t, uct_pack_callback_t, void *, unsigned);
ucs_status_t uct_xsrc_tag_ep_eager_zcopy(uct_ep_h, uct_tag_t, uint64_t, const uct_iov_t *, size_t, unsigned,
                                uct_completion_t *);
ucs_status_ptr_t uct_xsrc_tag_ep_rndv_zcopy(uct_ep_h, uct_tag_t, const void *, unsigned, const uct_iov_t *, size_t,
                                   unsigned, uct_completion_t *);
ucs_status_t uct_xsrc_tag_ep_rndv_cancel(uct_ep_h, void *);
ucs_status_t uct_xsrc_tag_ep_rndv_request(uct_ep_h, uct_tag_t, const void *, unsigned, unsigned);
ucs_status_t uct_xsrc_tag_iface_recv_zcopy(uct_iface_h, uct_tag_t, uct_tag_t, const uct_iov_t *, size_t,
                                  uct_tag_context_t *);
ucs_status_t uct_xsrc_tag_iface_recv_cancel(uct_iface_h, uct_tag_context_t *, int);

}  // namespace xsrc::uct
