// The revision-1 half of the layout test. Built with kernel-abi/history/r1
// first on the include path, so "xsrc-abi.h" here is the frozen r1 header.
// Its structs live in a namespace of their own: they never meet today's
// structs of the same name in one program.
#include <linux/types.h>
#include <rdma/ib_user_verbs.h>

#include <cstddef>

#include "abi_layout.h"

namespace xsrc::abi_test::r1 {
#include "xsrc-abi.h"
}  // namespace xsrc::abi_test::r1

static_assert(XSRC_DRIVER_ABI_REVISION == 1, "this file must see history/r1/xsrc-abi.h");

namespace xsrc::abi_test {
namespace {

#define XSRC_R1_STRUCT(T) LayoutRow{#T, nullptr, 0, sizeof(r1::T)}
#define XSRC_R1_FIELD(T, f) LayoutRow{#T, #f, offsetof(r1::T, f), sizeof(r1::T::f)}

// Every struct of the r1 header and every field of it.
const LayoutRow kR1Layout[] = {
	XSRC_R1_STRUCT(xsrc_fd_pair),
	XSRC_R1_FIELD(xsrc_fd_pair, rd_fd),
	XSRC_R1_FIELD(xsrc_fd_pair, wr_fd),
	XSRC_R1_STRUCT(xsrc_get_context_req),
	XSRC_R1_FIELD(xsrc_get_context_req, comp_mask),
	XSRC_R1_FIELD(xsrc_get_context_req, num_channel_fds),
	XSRC_R1_FIELD(xsrc_get_context_req, async_fds),
	XSRC_R1_FIELD(xsrc_get_context_req, channel_fds),
	XSRC_R1_STRUCT(xsrc_get_context_resp),
	XSRC_R1_FIELD(xsrc_get_context_resp, comp_mask),
	XSRC_R1_FIELD(xsrc_get_context_resp, driver_abi),
	XSRC_R1_FIELD(xsrc_get_context_resp, context_id),
	XSRC_R1_FIELD(xsrc_get_context_resp, max_inline_data),
	XSRC_R1_FIELD(xsrc_get_context_resp, channel_pool_free),
	XSRC_R1_STRUCT(xsrc_create_cq_resp),
	XSRC_R1_FIELD(xsrc_create_cq_resp, comp_mask),
	XSRC_R1_FIELD(xsrc_create_cq_resp, channel_pool_free),
	XSRC_R1_FIELD(xsrc_create_cq_resp, ring_off),
	XSRC_R1_STRUCT(xsrc_resize_cq_resp),
	XSRC_R1_FIELD(xsrc_resize_cq_resp, ring_off),
	XSRC_R1_STRUCT(xsrc_alloc_pd_resp),
	XSRC_R1_FIELD(xsrc_alloc_pd_resp, pd_id),
	XSRC_R1_FIELD(xsrc_alloc_pd_resp, reserved),
	XSRC_R1_STRUCT(xsrc_create_qp_resp),
	XSRC_R1_FIELD(xsrc_create_qp_resp, comp_mask),
	XSRC_R1_FIELD(xsrc_create_qp_resp, reserved),
	XSRC_R1_FIELD(xsrc_create_qp_resp, rq_off),
	XSRC_R1_STRUCT(xsrc_create_srq_resp),
	XSRC_R1_FIELD(xsrc_create_srq_resp, comp_mask),
	XSRC_R1_FIELD(xsrc_create_srq_resp, reserved),
	XSRC_R1_FIELD(xsrc_create_srq_resp, ring_off),
	XSRC_R1_STRUCT(xsrc_raise_event),
	XSRC_R1_FIELD(xsrc_raise_event, kind),
	XSRC_R1_FIELD(xsrc_raise_event, reserved),
	XSRC_R1_FIELD(xsrc_raise_event, object),
	XSRC_R1_STRUCT(xsrc_channel_pool),
	XSRC_R1_FIELD(xsrc_channel_pool, response),
	XSRC_R1_FIELD(xsrc_channel_pool, comp_mask),
	XSRC_R1_FIELD(xsrc_channel_pool, reserved),
	XSRC_R1_FIELD(xsrc_channel_pool, fds),
	XSRC_R1_STRUCT(xsrc_channel_pool_resp),
	XSRC_R1_FIELD(xsrc_channel_pool_resp, channel_pool_free),
	XSRC_R1_FIELD(xsrc_channel_pool_resp, reserved),
};

#undef XSRC_R1_STRUCT
#undef XSRC_R1_FIELD

}  // namespace

std::span<const LayoutRow> r1_layout()
{
	return kR1Layout;
}

}  // namespace xsrc::abi_test
