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

// Destroys every object `ctx` owns (its process closed the device or died).
void destroy_context_objects(Context &ctx);

}  // namespace xsrc
