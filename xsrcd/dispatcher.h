// The command dispatcher: decodes one write() of the uverbs write ABI (v6)
// on a context's command file, runs its handler (<object>_commands.cpp), and
// writes one response into the caller's memory. Distrusts everything: sizes,
// headers, reserved fields, handles, comp_mask. A refused command makes one
// debug line (log.h) naming the command, the errno and the check.
#pragma once

#include <cstddef>
#include <span>

#include "caller.h"
#include "objects.h"

namespace xsrc {

// Executes the command in `bytes` for `ctx`, writing any response through
// `caller`. Returns 0 on success or a positive errno for write() to report.
// Called with the daemon's lock held.
int dispatch_command(Context &ctx, Caller &caller, std::span<const std::byte> bytes);

// Executes one RDMA_VERBS_IOCTL: `header` is its ib_uverbs_ioctl_hdr (what
// FUSE copied in), `arg` the caller's pointer to it, the attribute array
// following it in the caller. ENOTTY for every method but the one served
// (ioctl_commands.cpp). Called with the daemon's lock held.
int dispatch_ioctl(Context &ctx, Caller &caller, std::span<const std::byte> header, uint64_t arg);

// Destroys every object `ctx` owns (its process closed the device or died).
void destroy_context_objects(Context &ctx);

}  // namespace xsrc
