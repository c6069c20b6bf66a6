// The uverbs write-ABI (v6) command decoder and dispatcher: one write() on a
// context's command file in, one response into the caller's memory out.
// Distrusts everything: sizes, headers, reserved fields, handles, comp_mask.
#pragma once

#include <cstddef>
#include <span>

#include "caller.h"
#include "objects.h"

namespace xsrc {

// Executes the command in `bytes` for `ctx`, writing any response through
// `caller`. Returns 0 on success or a positive errno for write() to report.
// Called with the daemon's lock held.
int execute_command(Context &ctx, Caller &caller, std::span<const std::byte> bytes);

// Destroys every object `ctx` owns (its process closed the device or died).
void destroy_context_objects(Context &ctx);

}  // namespace xsrc
