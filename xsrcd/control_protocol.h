// The control socket between the xsrc CLI and xsrcd.
//
// AF_UNIX SOCK_SEQPACKET at <rundir>/xsrcd.sock (root only, mode 0600).
// One request per message, one reply per message, ASCII, fields separated by
// single spaces:
//   up <ibdev> <netdev>   -> "ok created" | "ok exists" | "error <text>"
//   down <ibdev>          -> "ok" | "error <text>"
//   status                -> "ok\n" followed by one line per device:
//                            "<ibdev> uverbs<N> netdev=<if> port=<ACTIVE|DOWN>
//                             contexts=<n> objects=<n>"
//   shutdown              -> "ok"; the daemon removes every device, unmounts
//                            and exits
// A reply never exceeds kControlMaxMessage bytes.
#pragma once

#include <cstddef>

namespace xsrc {

inline constexpr const char *kDefaultRunDir = "/run/xsrc";
inline constexpr const char *kControlSocketName = "xsrcd.sock";
inline constexpr const char *kSysfsDirName = "sysfs";   // <rundir>/sysfs = SYSFS_PATH
inline constexpr const char *kFuseDirName = "fs";       // <rundir>/fs = FUSE mount
inline constexpr const char *kLogFileName = "xsrcd.log";
inline constexpr const char *kPidFileName = "xsrcd.pid";
inline constexpr size_t kControlMaxMessage = 64 * 1024;

}  // namespace xsrc
