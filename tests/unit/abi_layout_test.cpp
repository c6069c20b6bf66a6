// Layout tests of the driver ABI (kernel-abi/xsrc-abi.h) and of the queue
// formats shared through the arena (kernel-abi/xsrc-queues.h): every struct's
// size and alignment and every field's offset and size are pinned, and every
// revision-1 struct must be a prefix of today's (kernel-abi/README.md).
// A change that moves a field fails here; an append needs a new pin.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "abi_layout.h"
#include "xsrc-abi.h"
#include "xsrc-queues.h"

namespace xsrc::abi_test {
namespace {

struct Pin {
	LayoutRow actual;
	size_t offset;  // pinned
	size_t size;    // pinned
	size_t align;   // pinned, structs only
	size_t actual_align;
};

#define XSRC_PIN_STRUCT(T, size_, align_) \
	Pin{{#T, nullptr, 0, sizeof(T)}, 0, size_, align_, alignof(T)}
#define XSRC_PIN_FIELD(T, f, offset_, size_) \
	Pin{{#T, #f, offsetof(T, f), sizeof(T::f)}, offset_, size_, 0, 0}

const Pin kPins[] = {
	// xsrc-abi.h
	XSRC_PIN_STRUCT(xsrc_fd_pair, 8, 4),
	XSRC_PIN_FIELD(xsrc_fd_pair, rd_fd, 0, 4),
	XSRC_PIN_FIELD(xsrc_fd_pair, wr_fd, 4, 4),
	XSRC_PIN_STRUCT(xsrc_get_context_req, 80, 4),
	XSRC_PIN_FIELD(xsrc_get_context_req, comp_mask, 0, 4),
	XSRC_PIN_FIELD(xsrc_get_context_req, num_channel_fds, 4, 4),
	XSRC_PIN_FIELD(xsrc_get_context_req, async_fds, 8, 8),
	XSRC_PIN_FIELD(xsrc_get_context_req, channel_fds, 16, 64),
	XSRC_PIN_STRUCT(xsrc_get_context_resp, 48, 8),
	XSRC_PIN_FIELD(xsrc_get_context_resp, comp_mask, 0, 4),
	XSRC_PIN_FIELD(xsrc_get_context_resp, driver_abi, 4, 4),
	XSRC_PIN_FIELD(xsrc_get_context_resp, context_id, 8, 8),
	XSRC_PIN_FIELD(xsrc_get_context_resp, max_inline_data, 16, 4),
	XSRC_PIN_FIELD(xsrc_get_context_resp, channel_pool_free, 20, 4),
	XSRC_PIN_FIELD(xsrc_get_context_resp, caller_pid, 24, 4),
	XSRC_PIN_FIELD(xsrc_get_context_resp, caller_uid, 28, 4),
	XSRC_PIN_FIELD(xsrc_get_context_resp, caps, 32, 4),
	XSRC_PIN_FIELD(xsrc_get_context_resp, reserved, 36, 4),
	XSRC_PIN_FIELD(xsrc_get_context_resp, cq_head_mode, 40, 4),  // r10
	XSRC_PIN_FIELD(xsrc_get_context_resp, reserved2, 44, 4),
	XSRC_PIN_STRUCT(xsrc_create_cq_resp, 16, 8),
	XSRC_PIN_FIELD(xsrc_create_cq_resp, comp_mask, 0, 4),
	XSRC_PIN_FIELD(xsrc_create_cq_resp, channel_pool_free, 4, 4),
	XSRC_PIN_FIELD(xsrc_create_cq_resp, ring_off, 8, 8),
	XSRC_PIN_STRUCT(xsrc_resize_cq_resp, 8, 8),
	XSRC_PIN_FIELD(xsrc_resize_cq_resp, ring_off, 0, 8),
	XSRC_PIN_STRUCT(xsrc_alloc_pd_resp, 8, 4),
	XSRC_PIN_FIELD(xsrc_alloc_pd_resp, pd_id, 0, 4),
	XSRC_PIN_FIELD(xsrc_alloc_pd_resp, reserved, 4, 4),
	XSRC_PIN_STRUCT(xsrc_create_qp_resp, 16, 8),
	XSRC_PIN_FIELD(xsrc_create_qp_resp, comp_mask, 0, 4),
	XSRC_PIN_FIELD(xsrc_create_qp_resp, reserved, 4, 4),
	XSRC_PIN_FIELD(xsrc_create_qp_resp, rq_off, 8, 8),
	XSRC_PIN_STRUCT(xsrc_create_srq_resp, 16, 8),
	XSRC_PIN_FIELD(xsrc_create_srq_resp, comp_mask, 0, 4),
	XSRC_PIN_FIELD(xsrc_create_srq_resp, reserved, 4, 4),
	XSRC_PIN_FIELD(xsrc_create_srq_resp, ring_off, 8, 8),
	XSRC_PIN_STRUCT(xsrc_raise_event, 16, 8),
	XSRC_PIN_FIELD(xsrc_raise_event, kind, 0, 4),
	XSRC_PIN_FIELD(xsrc_raise_event, reserved, 4, 4),
	XSRC_PIN_FIELD(xsrc_raise_event, object, 8, 8),
	XSRC_PIN_STRUCT(xsrc_channel_pool, 24, 8),
	XSRC_PIN_FIELD(xsrc_channel_pool, response, 0, 8),
	XSRC_PIN_FIELD(xsrc_channel_pool, comp_mask, 8, 4),
	XSRC_PIN_FIELD(xsrc_channel_pool, reserved, 12, 4),
	XSRC_PIN_FIELD(xsrc_channel_pool, fds, 16, 8),
	XSRC_PIN_STRUCT(xsrc_channel_pool_resp, 8, 4),
	XSRC_PIN_FIELD(xsrc_channel_pool_resp, channel_pool_free, 0, 4),
	XSRC_PIN_FIELD(xsrc_channel_pool_resp, reserved, 4, 4),
	XSRC_PIN_STRUCT(xsrc_copy, 80, 8),
	XSRC_PIN_FIELD(xsrc_copy, response, 0, 8),
	XSRC_PIN_FIELD(xsrc_copy, comp_mask, 8, 4),
	XSRC_PIN_FIELD(xsrc_copy, op, 12, 4),
	XSRC_PIN_FIELD(xsrc_copy, key_kind, 16, 4),
	XSRC_PIN_FIELD(xsrc_copy, key, 20, 4),
	XSRC_PIN_FIELD(xsrc_copy, qp_handle, 24, 4),
	XSRC_PIN_FIELD(xsrc_copy, peer_qpn, 28, 4),
	XSRC_PIN_FIELD(xsrc_copy, peer_addr, 32, 8),
	XSRC_PIN_FIELD(xsrc_copy, length, 40, 8),
	XSRC_PIN_FIELD(xsrc_copy, local_iov, 48, 8),
	XSRC_PIN_FIELD(xsrc_copy, num_local, 56, 4),
	XSRC_PIN_FIELD(xsrc_copy, peer_srqn, 60, 4),
	XSRC_PIN_FIELD(xsrc_copy, compare_add, 64, 8),
	XSRC_PIN_FIELD(xsrc_copy, swap, 72, 8),
	XSRC_PIN_STRUCT(xsrc_copy_resp, 16, 8),
	XSRC_PIN_FIELD(xsrc_copy_resp, status, 0, 4),
	XSRC_PIN_FIELD(xsrc_copy_resp, reserved, 4, 4),
	XSRC_PIN_FIELD(xsrc_copy_resp, bytes, 8, 8),
	XSRC_PIN_STRUCT(xsrc_copy_recv, 16, 8),  // r9
	XSRC_PIN_FIELD(xsrc_copy_recv, comp_mask, 0, 4),
	XSRC_PIN_FIELD(xsrc_copy_recv, reserved, 4, 4),
	XSRC_PIN_FIELD(xsrc_copy_recv, recv_pos, 8, 8),
	XSRC_PIN_STRUCT(xsrc_recv_shadow, 32, 8),  // r9
	XSRC_PIN_FIELD(xsrc_recv_shadow, comp_mask, 0, 4),
	XSRC_PIN_FIELD(xsrc_recv_shadow, kind, 4, 4),
	XSRC_PIN_FIELD(xsrc_recv_shadow, handle, 8, 4),
	XSRC_PIN_FIELD(xsrc_recv_shadow, num_entries, 12, 4),
	XSRC_PIN_FIELD(xsrc_recv_shadow, stride, 16, 4),
	XSRC_PIN_FIELD(xsrc_recv_shadow, reserved, 20, 4),
	XSRC_PIN_FIELD(xsrc_recv_shadow, addr, 24, 8),
	XSRC_PIN_STRUCT(xsrc_recv_shadow_entry, 24, 8),  // r9
	XSRC_PIN_FIELD(xsrc_recv_shadow_entry, posted, 0, 8),
	XSRC_PIN_FIELD(xsrc_recv_shadow_entry, wr_id, 8, 8),
	XSRC_PIN_FIELD(xsrc_recv_shadow_entry, num_sge, 16, 4),
	XSRC_PIN_FIELD(xsrc_recv_shadow_entry, reserved, 20, 4),
	XSRC_PIN_STRUCT(xsrc_bind_mw, 40, 8),  // r4
	XSRC_PIN_FIELD(xsrc_bind_mw, comp_mask, 0, 4),
	XSRC_PIN_FIELD(xsrc_bind_mw, qp_handle, 4, 4),
	XSRC_PIN_FIELD(xsrc_bind_mw, mw_handle, 8, 4),
	XSRC_PIN_FIELD(xsrc_bind_mw, mr_handle, 12, 4),
	XSRC_PIN_FIELD(xsrc_bind_mw, rkey, 16, 4),
	XSRC_PIN_FIELD(xsrc_bind_mw, access, 20, 4),
	XSRC_PIN_FIELD(xsrc_bind_mw, addr, 24, 8),
	XSRC_PIN_FIELD(xsrc_bind_mw, length, 32, 8),
	XSRC_PIN_STRUCT(xsrc_wire_responses, 16, 4),  // r8: 8 bytes; the ACK board (later in r10) appended 8
	XSRC_PIN_FIELD(xsrc_wire_responses, comp_mask, 0, 4),
	XSRC_PIN_FIELD(xsrc_wire_responses, fd, 4, 4),
	XSRC_PIN_FIELD(xsrc_wire_responses, board_fd, 8, 4),
	XSRC_PIN_FIELD(xsrc_wire_responses, board_entries, 12, 4),
	XSRC_PIN_STRUCT(xsrc_invalidate, 24, 4),  // r4
	XSRC_PIN_FIELD(xsrc_invalidate, comp_mask, 0, 4),
	XSRC_PIN_FIELD(xsrc_invalidate, kind, 4, 4),
	XSRC_PIN_FIELD(xsrc_invalidate, qp_handle, 8, 4),
	XSRC_PIN_FIELD(xsrc_invalidate, rkey, 12, 4),
	XSRC_PIN_FIELD(xsrc_invalidate, peer_qpn, 16, 4),
	XSRC_PIN_FIELD(xsrc_invalidate, reserved, 20, 4),
	// r6: import
	XSRC_PIN_STRUCT(xsrc_import_context, 24, 8),
	XSRC_PIN_FIELD(xsrc_import_context, response, 0, 8),
	XSRC_PIN_FIELD(xsrc_import_context, comp_mask, 8, 4),
	XSRC_PIN_FIELD(xsrc_import_context, reserved, 12, 4),
	XSRC_PIN_FIELD(xsrc_import_context, async_fds, 16, 8),
	XSRC_PIN_STRUCT(xsrc_query_object, 16, 8),
	XSRC_PIN_FIELD(xsrc_query_object, response, 0, 8),
	XSRC_PIN_FIELD(xsrc_query_object, type, 8, 4),
	XSRC_PIN_FIELD(xsrc_query_object, handle, 12, 4),
	XSRC_PIN_STRUCT(xsrc_query_object_resp, 48, 8),
	XSRC_PIN_FIELD(xsrc_query_object_resp, pd_handle, 0, 4),
	XSRC_PIN_FIELD(xsrc_query_object_resp, pd_id, 4, 4),
	XSRC_PIN_FIELD(xsrc_query_object_resp, lkey, 8, 4),
	XSRC_PIN_FIELD(xsrc_query_object_resp, rkey, 12, 4),
	XSRC_PIN_FIELD(xsrc_query_object_resp, addr, 16, 8),
	XSRC_PIN_FIELD(xsrc_query_object_resp, iova, 24, 8),
	XSRC_PIN_FIELD(xsrc_query_object_resp, length, 32, 8),
	XSRC_PIN_FIELD(xsrc_query_object_resp, access, 40, 4),
	XSRC_PIN_FIELD(xsrc_query_object_resp, reserved, 44, 4),
	// xsrc-queues.h
	XSRC_PIN_STRUCT(xsrc_arena_header, 72, 8),
	XSRC_PIN_FIELD(xsrc_arena_header, magic, 0, 8),
	XSRC_PIN_FIELD(xsrc_arena_header, version, 8, 4),
	XSRC_PIN_FIELD(xsrc_arena_header, eager_heads, 12, 4),  // r10, was reserved
	XSRC_PIN_FIELD(xsrc_arena_header, size, 16, 8),
	XSRC_PIN_FIELD(xsrc_arena_header, qp_table_off, 24, 8),
	XSRC_PIN_FIELD(xsrc_arena_header, mr_table_off, 32, 8),
	XSRC_PIN_FIELD(xsrc_arena_header, srq_table_off, 40, 8),
	XSRC_PIN_FIELD(xsrc_arena_header, atomic_locks_off, 48, 8),
	XSRC_PIN_FIELD(xsrc_arena_header, mcast_table_off, 56, 8),  // r3, was reserved2[0]
	XSRC_PIN_FIELD(xsrc_arena_header, reserved2, 64, 8),
	XSRC_PIN_STRUCT(xsrc_qp_entry, 184, 8),
	XSRC_PIN_FIELD(xsrc_qp_entry, state, 0, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, qpn, 4, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, generation, 8, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, owner_pid, 12, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, owner_context, 16, 8),
	XSRC_PIN_FIELD(xsrc_qp_entry, qp_type, 24, 1),
	XSRC_PIN_FIELD(xsrc_qp_entry, port_num, 25, 1),
	XSRC_PIN_FIELD(xsrc_qp_entry, path_mtu, 26, 1),
	XSRC_PIN_FIELD(xsrc_qp_entry, min_rnr_timer, 27, 1),
	XSRC_PIN_FIELD(xsrc_qp_entry, rnr_retry, 28, 1),
	XSRC_PIN_FIELD(xsrc_qp_entry, retry_cnt, 29, 1),
	XSRC_PIN_FIELD(xsrc_qp_entry, timeout, 30, 1),
	XSRC_PIN_FIELD(xsrc_qp_entry, sq_sig_all, 31, 1),
	XSRC_PIN_FIELD(xsrc_qp_entry, pd_id, 32, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, qkey, 36, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, access_flags, 40, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, dest_qpn, 44, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, rq_psn, 48, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, sq_psn, 52, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, srqn, 56, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, xrcd_id, 60, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, rq_off, 64, 8),
	XSRC_PIN_FIELD(xsrc_qp_entry, send_cq_off, 72, 8),
	XSRC_PIN_FIELD(xsrc_qp_entry, recv_cq_off, 80, 8),
	XSRC_PIN_FIELD(xsrc_qp_entry, max_send_wr, 88, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, max_recv_wr, 92, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, max_send_sge, 96, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, max_recv_sge, 100, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, max_inline_data, 104, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, max_rd_atomic, 108, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, max_dest_rd_atomic, 112, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, reserved, 116, 4),
	XSRC_PIN_FIELD(xsrc_qp_entry, dgid, 120, 16),
	XSRC_PIN_FIELD(xsrc_qp_entry, reserved2, 136, 48),
	XSRC_PIN_STRUCT(xsrc_mr_entry, 48, 8),
	XSRC_PIN_FIELD(xsrc_mr_entry, key, 0, 4),
	XSRC_PIN_FIELD(xsrc_mr_entry, pd_id, 4, 4),
	XSRC_PIN_FIELD(xsrc_mr_entry, access, 8, 4),
	XSRC_PIN_FIELD(xsrc_mr_entry, owner_pid, 12, 4),
	XSRC_PIN_FIELD(xsrc_mr_entry, addr, 16, 8),
	XSRC_PIN_FIELD(xsrc_mr_entry, length, 24, 8),
	XSRC_PIN_FIELD(xsrc_mr_entry, iova, 32, 8),
	XSRC_PIN_FIELD(xsrc_mr_entry, mw_type, 40, 4),    // r4, was reserved
	XSRC_PIN_FIELD(xsrc_mr_entry, bound_qpn, 44, 4),  // r4, was reserved
	XSRC_PIN_STRUCT(xsrc_srq_entry, 48, 8),
	XSRC_PIN_FIELD(xsrc_srq_entry, srqn, 0, 4),
	XSRC_PIN_FIELD(xsrc_srq_entry, owner_pid, 4, 4),
	XSRC_PIN_FIELD(xsrc_srq_entry, owner_context, 8, 8),
	XSRC_PIN_FIELD(xsrc_srq_entry, ring_off, 16, 8),
	XSRC_PIN_FIELD(xsrc_srq_entry, cq_off, 24, 8),
	XSRC_PIN_FIELD(xsrc_srq_entry, pd_id, 32, 4),
	XSRC_PIN_FIELD(xsrc_srq_entry, xrcd_id, 36, 4),
	XSRC_PIN_FIELD(xsrc_srq_entry, srq_type, 40, 4),
	XSRC_PIN_FIELD(xsrc_srq_entry, reserved, 44, 4),
	XSRC_PIN_STRUCT(xsrc_cq_ring, 64, 8),
	XSRC_PIN_FIELD(xsrc_cq_ring, num_entries, 0, 4),
	XSRC_PIN_FIELD(xsrc_cq_ring, cqe, 4, 4),
	XSRC_PIN_FIELD(xsrc_cq_ring, head, 8, 8),
	XSRC_PIN_FIELD(xsrc_cq_ring, tail, 16, 8),
	XSRC_PIN_FIELD(xsrc_cq_ring, armed, 24, 4),
	XSRC_PIN_FIELD(xsrc_cq_ring, overflow, 28, 4),
	XSRC_PIN_FIELD(xsrc_cq_ring, owner_pid, 32, 4),
	XSRC_PIN_FIELD(xsrc_cq_ring, payload_stride, 36, 4),
	XSRC_PIN_FIELD(xsrc_cq_ring, big_slots, 40, 4),
	XSRC_PIN_FIELD(xsrc_cq_ring, big_stride, 44, 4),
	XSRC_PIN_FIELD(xsrc_cq_ring, big_polled, 48, 4),
	XSRC_PIN_FIELD(xsrc_cq_ring, arm_sees_tail, 52, 4),  // r11, was reserved2
	XSRC_PIN_FIELD(xsrc_cq_ring, reserved3, 56, 8),
	XSRC_PIN_STRUCT(xsrc_cqe, 64, 8),
	XSRC_PIN_FIELD(xsrc_cqe, seq, 0, 8),
	XSRC_PIN_FIELD(xsrc_cqe, wr_id, 8, 8),
	XSRC_PIN_FIELD(xsrc_cqe, status, 16, 4),
	XSRC_PIN_FIELD(xsrc_cqe, opcode, 20, 4),
	XSRC_PIN_FIELD(xsrc_cqe, vendor_err, 24, 4),
	XSRC_PIN_FIELD(xsrc_cqe, byte_len, 28, 4),
	XSRC_PIN_FIELD(xsrc_cqe, imm_data, 32, 4),
	XSRC_PIN_FIELD(xsrc_cqe, qp_num, 36, 4),
	XSRC_PIN_FIELD(xsrc_cqe, src_qp, 40, 4),
	XSRC_PIN_FIELD(xsrc_cqe, wc_flags, 44, 4),
	XSRC_PIN_FIELD(xsrc_cqe, pkey_index, 48, 2),
	XSRC_PIN_FIELD(xsrc_cqe, slid, 50, 2),
	XSRC_PIN_FIELD(xsrc_cqe, sl, 52, 1),
	XSRC_PIN_FIELD(xsrc_cqe, dlid_path_bits, 53, 1),
	XSRC_PIN_FIELD(xsrc_cqe, flags, 54, 1),
	XSRC_PIN_FIELD(xsrc_cqe, big_slot, 55, 1),
	XSRC_PIN_FIELD(xsrc_cqe, deferred_va, 56, 8),
	XSRC_PIN_STRUCT(xsrc_sge, 16, 8),
	XSRC_PIN_FIELD(xsrc_sge, addr, 0, 8),
	XSRC_PIN_FIELD(xsrc_sge, length, 8, 4),
	XSRC_PIN_FIELD(xsrc_sge, lkey, 12, 4),
	XSRC_PIN_STRUCT(xsrc_recv_ring, 64, 8),
	XSRC_PIN_FIELD(xsrc_recv_ring, num_entries, 0, 4),
	XSRC_PIN_FIELD(xsrc_recv_ring, stride, 4, 4),
	XSRC_PIN_FIELD(xsrc_recv_ring, max_wr, 8, 4),
	XSRC_PIN_FIELD(xsrc_recv_ring, max_sge, 12, 4),
	XSRC_PIN_FIELD(xsrc_recv_ring, head, 16, 8),
	XSRC_PIN_FIELD(xsrc_recv_ring, tail, 24, 8),
	XSRC_PIN_FIELD(xsrc_recv_ring, srq_limit, 32, 4),
	XSRC_PIN_FIELD(xsrc_recv_ring, owner_pid, 36, 4),
	XSRC_PIN_FIELD(xsrc_recv_ring, reserved, 40, 24),
	XSRC_PIN_STRUCT(xsrc_recv_wqe, 24, 8),
	XSRC_PIN_FIELD(xsrc_recv_wqe, seq, 0, 8),
	XSRC_PIN_FIELD(xsrc_recv_wqe, wr_id, 8, 8),
	XSRC_PIN_FIELD(xsrc_recv_wqe, num_sge, 16, 4),
	XSRC_PIN_FIELD(xsrc_recv_wqe, reserved, 20, 4),
	// r3: multicast
	XSRC_PIN_STRUCT(xsrc_mcast_group, 320, 8),
	XSRC_PIN_FIELD(xsrc_mcast_group, seq, 0, 4),
	XSRC_PIN_FIELD(xsrc_mcast_group, num_qps, 4, 4),
	XSRC_PIN_FIELD(xsrc_mcast_group, gid, 8, 16),
	XSRC_PIN_FIELD(xsrc_mcast_group, qpns, 24, 256),
	XSRC_PIN_FIELD(xsrc_mcast_group, reserved, 280, 40),
	XSRC_PIN_STRUCT(xsrc_mcast_table, 64, 8),
	XSRC_PIN_FIELD(xsrc_mcast_table, num_groups, 0, 4),
	XSRC_PIN_FIELD(xsrc_mcast_table, scan_end, 4, 4),
	XSRC_PIN_FIELD(xsrc_mcast_table, reserved, 8, 56),
	// r7: a TM-SRQ's tag table, after its ring.
	XSRC_PIN_STRUCT(xsrc_tm_table, 64, 8),
	XSRC_PIN_FIELD(xsrc_tm_table, lock, 0, 4),
	XSRC_PIN_FIELD(xsrc_tm_table, num_tags, 4, 4),
	XSRC_PIN_FIELD(xsrc_tm_table, max_sge, 8, 4),
	XSRC_PIN_FIELD(xsrc_tm_table, stride, 12, 4),
	XSRC_PIN_FIELD(xsrc_tm_table, unexpected, 16, 4),
	XSRC_PIN_FIELD(xsrc_tm_table, sw_count, 20, 4),
	XSRC_PIN_FIELD(xsrc_tm_table, next_order, 24, 8),
	XSRC_PIN_FIELD(xsrc_tm_table, reserved, 32, 32),
	XSRC_PIN_STRUCT(xsrc_tm_entry, 48, 8),
	XSRC_PIN_FIELD(xsrc_tm_entry, state, 0, 4),
	XSRC_PIN_FIELD(xsrc_tm_entry, num_sge, 4, 4),
	XSRC_PIN_FIELD(xsrc_tm_entry, order, 8, 8),
	XSRC_PIN_FIELD(xsrc_tm_entry, tag, 16, 8),
	XSRC_PIN_FIELD(xsrc_tm_entry, mask, 24, 8),
	XSRC_PIN_FIELD(xsrc_tm_entry, wr_id, 32, 8),
	XSRC_PIN_FIELD(xsrc_tm_entry, generation, 40, 4),
	XSRC_PIN_FIELD(xsrc_tm_entry, reserved, 44, 4),
};

#undef XSRC_PIN_STRUCT
#undef XSRC_PIN_FIELD

std::string name_of(const LayoutRow &row)
{
	return std::string(row.type) + (row.field ? std::string(".") + row.field : "");
}

const Pin *find_pin(const char *type, const char *field)
{
	auto it = std::ranges::find_if(kPins, [&](const Pin &pin) {
		return std::string(pin.actual.type) == type &&
		       (field ? pin.actual.field && std::string(pin.actual.field) == field : !pin.actual.field);
	});
	return it == std::end(kPins) ? nullptr : &*it;
}

TEST(AbiLayout, EveryStructAndFieldIsWherePinned)
{
	for (const Pin &pin : kPins) {
		SCOPED_TRACE(name_of(pin.actual));
		EXPECT_EQ(pin.actual.offset, pin.offset);
		EXPECT_EQ(pin.actual.size, pin.size);
		EXPECT_EQ(pin.actual_align, pin.align);
	}
}

// The rules of kernel-abi/README.md that a layout can break by itself.
TEST(AbiLayout, StructsAreWholeWordsAndFieldsNaturallyAligned)
{
	for (const Pin &pin : kPins) {
		SCOPED_TRACE(name_of(pin.actual));
		if (!pin.actual.field) {
			EXPECT_EQ(pin.actual.size % 8, 0u) << "a struct is a multiple of 8 bytes";
			continue;
		}
		size_t natural = std::min<size_t>(pin.actual.size, 8);
		if (natural == 8 || natural == 4 || natural == 2) {
			EXPECT_EQ(pin.actual.offset % natural, 0u) << "fields are naturally aligned";
		}
	}
}

// Fields never overlap and leave no hole: the compiler added no padding
// that a different compiler might place differently.
TEST(AbiLayout, FieldsTileEachStructWithoutPadding)
{
	for (const Pin &pin : kPins) {
		if (pin.actual.field)
			continue;
		SCOPED_TRACE(pin.actual.type);
		size_t end = 0;
		for (const Pin &field : kPins) {
			if (!field.actual.field || std::string(field.actual.type) != pin.actual.type)
				continue;
			EXPECT_EQ(field.actual.offset, end) << field.actual.field;
			end = field.actual.offset + field.actual.size;
		}
		EXPECT_EQ(end, pin.actual.size);
	}
}

TEST(AbiLayout, TheFrozenR1HeaderIsTheRevisionOneLayout)
{
	// A few rows of the r1 half, checked against the numbers that r1
	// providers were built with (they must never change).
	auto r1 = r1_layout();
	ASSERT_FALSE(r1.empty());
	auto row = [&](const char *type, const char *field) -> const LayoutRow * {
		auto it = std::ranges::find_if(r1, [&](const LayoutRow &r) {
			return std::string(r.type) == type &&
			       (field ? r.field && std::string(r.field) == field : !r.field);
		});
		return it == r1.end() ? nullptr : &*it;
	};
	const LayoutRow *resp = row("xsrc_get_context_resp", nullptr);
	ASSERT_NE(resp, nullptr);
	EXPECT_EQ(resp->size, 24u);
	EXPECT_EQ(row("xsrc_get_context_resp", "caller_pid"), nullptr);
	EXPECT_EQ(row("xsrc_copy", nullptr), nullptr);
	const LayoutRow *pool = row("xsrc_get_context_resp", "channel_pool_free");
	ASSERT_NE(pool, nullptr);
	EXPECT_EQ(pool->offset, 20u);
}

// Append-only: every r1 field is where r1 put it, with its size; every
// field added since lies past the r1 struct's end.
TEST(AbiLayout, EveryR1StructIsAPrefixOfTodays)
{
	for (const LayoutRow &old : r1_layout()) {
		SCOPED_TRACE(name_of(old));
		const Pin *now = find_pin(old.type, old.field);
		ASSERT_NE(now, nullptr) << "removed or renamed since revision 1";
		EXPECT_EQ(now->actual.offset, old.offset);
		if (old.field) {
			EXPECT_EQ(now->actual.size, old.size);
		} else {
			EXPECT_GE(now->actual.size, old.size);
		}
	}
	for (const Pin &pin : kPins) {
		if (!pin.actual.field)
			continue;
		bool in_r1 = std::ranges::any_of(r1_layout(), [&](const LayoutRow &r) {
			return r.field && std::string(r.type) == pin.actual.type && std::string(r.field) == pin.actual.field;
		});
		auto r1_struct = std::ranges::find_if(r1_layout(), [&](const LayoutRow &r) {
			return !r.field && std::string(r.type) == pin.actual.type;
		});
		if (in_r1 || r1_struct == r1_layout().end())
			continue;  // an r1 field, or a struct that revision 1 did not have
		SCOPED_TRACE(name_of(pin.actual));
		EXPECT_GE(pin.actual.offset, r1_struct->size) << "a field was inserted, not appended";
	}
}

// Revision 3 changed the arena only by appending: every revision-2 struct
// has its size, every field of the r2 header is where it was, and the r2
// reserved word that became mcast_table_off is covered exactly by today's
// fields. The version a revision-2 provider checks is unchanged.
TEST(AbiLayout, TheArenaOfRevisionTwoIsUnmovedInToday)
{
	EXPECT_EQ(r2_arena_version(), uint32_t(XSRC_ARENA_VERSION));
	for (const LayoutRow &old : r2_arena_layout()) {
		SCOPED_TRACE(name_of(old));
		const Pin *now = find_pin(old.type, old.field);
		if (!old.field) {
			ASSERT_NE(now, nullptr);
			EXPECT_EQ(now->actual.size, old.size);
			continue;
		}
		if (now && now->actual.offset == old.offset && now->actual.size == old.size)
			continue;
		ASSERT_EQ(std::string(old.field).rfind("reserved", 0), 0u) << "only reserved bytes may take a new name";
		size_t covered = 0;
		for (const Pin &pin : kPins)
			if (pin.actual.field && std::string(pin.actual.type) == old.type &&
			    pin.actual.offset >= old.offset && pin.actual.offset + pin.actual.size <= old.offset + old.size)
				covered += pin.actual.size;
		EXPECT_EQ(covered, old.size) << "the reserved bytes are not tiled by today's fields";
	}
}

}  // namespace
}  // namespace xsrc::abi_test
