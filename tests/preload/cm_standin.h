// A stand-in for xsrcd's rdma_cm directory, for testing libxsrc-preload.so
// against real librdmacm without the daemon: a FUSE file system with the
// contract's files (tools/preload/preload.cpp, ISSUE 12):
//   create("channel")   a fresh channel inode (direct_io, nonseekable)
//   open("event-<ino>") the event file of live channel <ino>
//   "stats"             "channels=N events=N waiting=N commands=N\n"
// Commands written on either file: GET_EVENT takes a queued event, or fails
// EAGAIN when the file is O_NONBLOCK, or waits; NOTIFY queues an event on the
// channel (waking one waiting GET_EVENT); CREATE_ID fails ENOSYS (so that
// librdmacm's AF_IB probe gives up at once); anything else succeeds. Nothing
// is written back into the caller's memory.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace xsrc::test {

// Serves `mountpoint` until SIGTERM or SIGINT; returns the exit status.
int cm_standin_serve(const char *mountpoint);

// For the clients, which include <rdma/rdma_cma.h> (it clashes with
// <rdma/rdma_user_cm.h>): the command numbers the stand-in looks at, and one
// command as librdmacm writes it (header + 32 bytes of payload).
extern const uint32_t kCmGetEvent, kCmNotify, kCmQuery;
extern const size_t kCmCommandSize;
ssize_t write_cm_command(int fd, uint32_t cmd);

}  // namespace xsrc::test
