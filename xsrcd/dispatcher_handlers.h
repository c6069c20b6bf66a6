// Every command handler, by object, and the release functions teardown
// uses. Each handler validates all of its input before it changes anything,
// and gives the reason for a refusal through refuse() (dispatcher_request.h).
// Internal to the command files; dispatcher.cpp holds the command tables.
#pragma once

#include <infiniband/verbs.h>

#include <optional>
#include <span>

#include "dispatcher_request.h"

namespace xsrc {

struct RecvWqe;

// context_commands.cpp
int cmd_get_context(Context &ctx, Caller &caller, const Request &req);
int cmd_query_device(Context &ctx, Caller &caller, const Request &req);
int cmd_ex_query_device(Context &ctx, Caller &caller, const Request &req);
int cmd_query_port(Context &ctx, Caller &caller, const Request &req);
int cmd_create_comp_channel(Context &ctx, Caller &caller, const Request &req);
int cmd_channel_pool(Context &ctx, Caller &caller, const Request &req);
int cmd_import_context(Context &ctx, Caller &caller, const Request &req);  // r6
// A context that GET_CONTEXT or IMPORT_CONTEXT counted in the arena header
// as trusting CQ heads (r10) is counted no more (its objects are gone).
void uncount_eager_cq_heads(Context &ctx);
int cmd_query_object(Context &ctx, Caller &caller, const Request &req);    // r6
int cmd_wire_responses(Context &ctx, Caller &caller, const Request &req);    // r8

// pd_mr_commands.cpp
int cmd_alloc_pd(Context &ctx, Caller &caller, const Request &req);
int cmd_dealloc_pd(Context &ctx, Caller &caller, const Request &req);
int cmd_reg_mr(Context &ctx, Caller &caller, const Request &req);
int cmd_dereg_mr(Context &ctx, Caller &caller, const Request &req);
int cmd_rereg_mr(Context &ctx, Caller &caller, const Request &req);
void release_pd(Context &ctx, uint32_t handle);
void release_mr(Context &ctx, uint32_t handle);
// A free index of the MR table (MRs and windows share it, and its keys).
uint32_t allocate_key_index(Device &dev);

// mw_commands.cpp (driver ABI r4): memory windows.
int cmd_alloc_mw(Context &ctx, Caller &caller, const Request &req);
int cmd_dealloc_mw(Context &ctx, Caller &caller, const Request &req);
int cmd_bind_mw(Context &ctx, Caller &caller, const Request &req);
int cmd_invalidate(Context &ctx, Caller &caller, const Request &req);
void release_mw(Context &ctx, uint32_t handle);
// The windows bound to an MR that goes or changes, or (type 2) to a QP that
// goes, lose their binding.
void mw_unbind_from_mr(Device &dev, uint32_t mr_index);
void mw_unbind_from_qp(Device &dev, Qpn qpn);
// SEND with Invalidate from the wire (wire_deliver.cpp): the type 2 window
// `rkey` of `owner`, bound to responder QP `qpn` and of PD `pd`, is
// invalidated. False (nothing changes) when the rkey names no such window.
bool mw_remote_invalidate(Device &dev, Context &owner, Qpn qpn, PdId pd, uint32_t rkey);
// The bound window `rkey` names in `owner`, or null (XSRC_CMD_COPY's check).
const Mw *mw_find(Device &dev, Context &owner, uint32_t rkey);

// copy_commands.cpp: where [addr, +length) under `rkey` lies in `owner`'s
// memory for remote access `need` (IB_UVERBS_ACCESS_REMOTE_*) through the
// responder QP `qp` of PD `pd`: the QP must allow it, and the key (an MR,
// or a window bound there) be of that PD with those rights and cover the
// range. Nothing when it may not: a remote access error. XSRC_CMD_COPY and
// the wire's responder (wire_deliver.cpp) both check with it.
std::optional<uint64_t> remote_key_target(Device &dev, Context &owner, const Qp &qp, PdId pd, uint32_t rkey,
					  uint32_t need, uint64_t addr, uint64_t length);
// copy_commands.cpp: FETCH_ADD (`fetch_add`) or CMP_SWAP on the 8 bytes at
// `va` of `owner`, under the device-wide atomics lock the providers take
// too (IBV_ATOMIC_HCA). 0 with `original`, EAGAIN (the lock stayed busy),
// ESRCH (the owner is gone) or EACCES (its memory is not there).
int device_atomic(Device &dev, Context &owner, uint64_t va, bool fetch_add, uint64_t compare_add, uint64_t swap,
		  uint64_t &original);

// copy_commands.cpp: ATOMIC WRITE: the 8 bytes `value` land at `va` of
// `owner` at once, under the same lock as device_atomic(). 0, EAGAIN, ESRCH
// or EACCES as there.
int device_atomic_write(Device &dev, Context &owner, uint64_t va, std::span<const std::byte, 8> value);

// cq_commands.cpp
int cmd_create_cq(Context &ctx, Caller &caller, const Request &req);
int cmd_ex_create_cq(Context &ctx, Caller &caller, const Request &req);
int cmd_resize_cq(Context &ctx, Caller &caller, const Request &req);
int cmd_destroy_cq(Context &ctx, Caller &caller, const Request &req);
int cmd_req_notify_cq(Context &ctx, Caller &caller, const Request &req);
void release_cq(Context &ctx, uint32_t handle);

// qp_commands.cpp
int cmd_create_qp(Context &ctx, Caller &caller, const Request &req);
int cmd_ex_create_qp(Context &ctx, Caller &caller, const Request &req);
int cmd_query_qp(Context &ctx, Caller &caller, const Request &req);
int cmd_destroy_qp(Context &ctx, Caller &caller, const Request &req);
int cmd_open_qp(Context &ctx, Caller &caller, const Request &req);
// Drops one handle; a shared XRC receive QP goes with its last handle.
void release_qp(Context &ctx, uint32_t handle);
// The state in the arena (kernel-abi/xsrc-qp-state.h): the truth, since a
// provider may move a QP to ERR.
ibv_qp_state qp_current_state(Device &dev, const Qp &qp);

// qp_modify.cpp
int cmd_modify_qp(Context &ctx, Caller &caller, const Request &req);
int cmd_ex_modify_qp(Context &ctx, Caller &caller, const Request &req);
// Puts a QP into ERR (a fatal error the data path reported).
void qp_enter_error(Context &ctx, Qp &qp);
// IBV_EVENT_QP_LAST_WQE_REACHED for a QP on an SRQ, once per entry into ERR.
void qp_report_last_wqe(Context &ctx, Qp &qp);

// srq_commands.cpp
int cmd_create_srq(Context &ctx, Caller &caller, const Request &req);
int cmd_create_xsrq(Context &ctx, Caller &caller, const Request &req);
int cmd_modify_srq(Context &ctx, Caller &caller, const Request &req);
int cmd_query_srq(Context &ctx, Caller &caller, const Request &req);
int cmd_destroy_srq(Context &ctx, Caller &caller, const Request &req);
void release_srq(Context &ctx, uint32_t handle);

// xrc_commands.cpp
int cmd_open_xrcd(Context &ctx, Caller &caller, const Request &req);
int cmd_close_xrcd(Context &ctx, Caller &caller, const Request &req);
// Drops one handle; the domain goes with its last handle.
void release_xrcd(Context &ctx, uint32_t handle);

// copy_commands.cpp (driver ABI r2): bytes moved for a caller that may not
// reach the peer's memory itself.
int cmd_copy(Context &ctx, Caller &caller, const Request &req);

// recv_shadow.cpp (driver ABI r9): a copy into a receive is checked against
// the receive its owner posted.
int cmd_recv_shadow(Context &ctx, Caller &caller, const Request &req);
// 0 when [addr, +length) with `lkey` lies inside one SGE of the receive the
// owner posted at ring position `pos`, by the owner's shadow; else EACCES
// (no position named, not posted or reposted since, outside its SGEs) or
// ESRCH (the owner is gone). A queue without a shadow passes.
uint32_t recv_shadow_check(Context &owner, const RecvShadow &shadow, std::optional<uint64_t> pos, uint32_t lkey,
			   uint64_t addr, uint64_t length);
// A receive the device popped from the owner's ring (of `entries`) at
// rwqe.pos, made the one the owner posted there: its wr_id and SGEs from the
// owner's shadow, not from the arena, which anyone can forge. False: the
// owner posted none there (a forged slot), the device took that one before
// (a slot rewound in the arena), or the owner is gone. A queue without a
// shadow passes as is.
bool recv_shadow_take(Context &owner, RecvShadow &shadow, uint64_t entries, RecvWqe &rwqe);

// mcast_commands.cpp (driver ABI r3): UD QPs in multicast groups.
int cmd_attach_mcast(Context &ctx, Caller &caller, const Request &req);
int cmd_detach_mcast(Context &ctx, Caller &caller, const Request &req);
// The QP leaves every group it is in (its handle goes, or its context).
void mcast_leave_all(Context &ctx, Qp &qp);

// ah_commands.cpp
int cmd_create_ah(Context &ctx, Caller &caller, const Request &req);
int cmd_destroy_ah(Context &ctx, Caller &caller, const Request &req);
void release_ah(Context &ctx, uint32_t handle);
// A valid RoCE source GID index of the device's port.
bool valid_sgid_index(const Device &dev, uint32_t index);

// events.cpp
int cmd_raise_event(Context &ctx, Caller &caller, const Request &req);
// Async events on an object, to its owner's async pipe; counted when delivered.
// An event on a shared XRC receive QP goes to every handle on it.
void post_qp_event(Context &owner, Qp &qp, ibv_event_type type);
void post_srq_event(Context &owner, Srq &srq, ibv_event_type type);
void post_cq_event(Context &owner, Cq &cq, ibv_event_type type);
// The CQ's user handle to its completion channel; counted when delivered.
void post_completion_event(Context &owner, Cq &cq);
// At destroy: events of the object still unread in its pipe, taken back so
// that the reported counts are what the application read.
uint32_t reclaim_unread_events(Context &owner, Cq &cq);
uint32_t reclaim_unread_async_events(Context &owner, uint64_t user_handle, uint32_t reported);

}  // namespace xsrc
