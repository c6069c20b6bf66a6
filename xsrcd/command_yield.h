// The daemon serves one command at a time under one lock. A command that
// takes long (a device copy of many MiB) calls command_yield() between its
// steps, so that the commands of other contexts waiting for the lock run in
// between instead of after it (issue 16: a long copy must not stall them).
#pragma once

namespace xsrc {

// When other commands wait for the daemon's lock: lets them run, then takes
// the lock back. Everything the caller looked up before (objects, contexts,
// the peer) may have changed or gone: look it up again. Does nothing when
// nobody waits, and outside the daemon (unit tests, the fuzzer).
void command_yield();

}  // namespace xsrc
