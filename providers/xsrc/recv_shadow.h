// The private record of the receives we post (driver ABI revision 9): one
// entry per slot of a receive ring, in our own memory, whose address the
// device knows (XSRC_CMD_RECV_SHADOW). A peer of another user reaches our
// receive buffers only through the device, which checks its copy against
// this record, not against the ring in the arena, which anyone can forge.
#pragma once

#include <cstdint>
#include <memory>

#include "xsrc-abi.h"
#include "xsrc-queues.h"

struct ibv_recv_wr;
struct xsrc_context;

class xsrc_rq_shadow {
public:
	enum class queue { qp, srq };
	// Registers a shadow for the queue `handle` (a QP's own ring or an SRQ) of `num_entries` slots with up to `max_sge` SGEs each. A device
	// older than revision 9 keeps none: 0, nothing done. Returns 0 or errno.
	int attach(xsrc_context *ctx, queue kind, uint32_t handle, uint32_t num_entries, uint32_t max_sge) noexcept;
	// Records the receive `wr` (num_sge already checked) posted at ring
	// position `pos`; before the ring publishes it.
	void record(uint64_t pos, const ibv_recv_wr &wr) noexcept;

private:
	std::unique_ptr<std::byte[]> entries_;
	uint32_t num_entries_ = 0;  // a power of two; 0: no shadow
	uint32_t stride_ = 0;
	uint32_t max_sge_ = 0;
};
