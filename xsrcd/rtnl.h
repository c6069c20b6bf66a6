// One rtnetlink exchange: a request on a socket of its own, then the
// kernel's answers to it (the netdev's addresses, routes, neighbours).
#pragma once

#include <linux/netlink.h>

#include <functional>

namespace xsrc {

// Sends `req` (nlmsg_len covers it and its attributes) and hands each answer
// to `visit` until visit returns false, a dump ends (NLMSG_DONE), or the
// kernel answers with an error or an acknowledgement. Returns 0, the errno
// the kernel answered, or EAGAIN when a dump changed under it
// (NLM_F_DUMP_INTR: ask again).
int rtnl_exchange(nlmsghdr &req, const std::function<bool(const nlmsghdr &)> &visit);

}  // namespace xsrc
