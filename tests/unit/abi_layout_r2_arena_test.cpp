// The revision-2 arena format (kernel-abi/history/r2/xsrc-queues.h) as a
// translation unit built against it sees it: the half of the arena layout
// test that proves revision 3 moved nothing a revision-2 provider reads.
// Built with kernel-abi/history/r2 first on the include path; its structs
// live in a namespace of their own.
#include <linux/types.h>

#include <cstddef>

#include "abi_layout.h"

namespace xsrc::abi_test::r2 {
#include "xsrc-queues.h"
}  // namespace xsrc::abi_test::r2

#ifdef XSRC_MCAST_GROUPS
#error "this file must see history/r2/xsrc-queues.h"
#endif

namespace xsrc::abi_test {
namespace {

#define XSRC_R2_STRUCT(T) LayoutRow{#T, nullptr, 0, sizeof(r2::T)}
#define XSRC_R2_FIELD(T, f) LayoutRow{#T, #f, offsetof(r2::T, f), sizeof(r2::T::f)}

// Every struct of the r2 arena, every field of its header (revision 3
// changed it) and the reserved bytes revision 5 named in the CQ ring and CQE.
const LayoutRow kR2Arena[] = {
	XSRC_R2_STRUCT(xsrc_arena_header),
	XSRC_R2_FIELD(xsrc_arena_header, magic),
	XSRC_R2_FIELD(xsrc_arena_header, version),
	XSRC_R2_FIELD(xsrc_arena_header, reserved),
	XSRC_R2_FIELD(xsrc_arena_header, size),
	XSRC_R2_FIELD(xsrc_arena_header, qp_table_off),
	XSRC_R2_FIELD(xsrc_arena_header, mr_table_off),
	XSRC_R2_FIELD(xsrc_arena_header, srq_table_off),
	XSRC_R2_FIELD(xsrc_arena_header, atomic_locks_off),
	XSRC_R2_FIELD(xsrc_arena_header, reserved2),
	XSRC_R2_STRUCT(xsrc_qp_entry),
	XSRC_R2_STRUCT(xsrc_mr_entry),
	XSRC_R2_STRUCT(xsrc_srq_entry),
	XSRC_R2_STRUCT(xsrc_cq_ring),
	XSRC_R2_FIELD(xsrc_cq_ring, reserved2),
	XSRC_R2_STRUCT(xsrc_cqe),
	XSRC_R2_FIELD(xsrc_cqe, reserved),
	XSRC_R2_STRUCT(xsrc_sge),
	XSRC_R2_STRUCT(xsrc_recv_ring),
	XSRC_R2_STRUCT(xsrc_recv_wqe),
};

}  // namespace

std::span<const LayoutRow> r2_arena_layout()
{
	return kR2Arena;
}

uint32_t r2_arena_version()
{
	return XSRC_ARENA_VERSION;
}

}  // namespace xsrc::abi_test
