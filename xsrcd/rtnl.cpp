#include "rtnl.h"

#include <sys/socket.h>

#include <cerrno>

#include "common/fd.h"

namespace xsrc {

int rtnl_exchange(nlmsghdr &req, const std::function<bool(const nlmsghdr &)> &visit)
{
	unique_fd fd(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
	if (!fd)
		return errno;
	if (!req.nlmsg_seq)
		req.nlmsg_seq = 1;
	sockaddr_nl kernel{};
	kernel.nl_family = AF_NETLINK;
	if (::sendto(fd.get(), &req, req.nlmsg_len, 0, reinterpret_cast<sockaddr *>(&kernel), sizeof(kernel)) < 0)
		return errno;

	alignas(nlmsghdr) char buf[32768];
	bool interrupted = false;
	for (;;) {
		ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		size_t len = static_cast<size_t>(n);
		for (auto *nh = reinterpret_cast<nlmsghdr *>(buf); NLMSG_OK(nh, len); nh = NLMSG_NEXT(nh, len)) {
			if (nh->nlmsg_seq != req.nlmsg_seq)
				continue;
			if (nh->nlmsg_flags & NLM_F_DUMP_INTR)
				interrupted = true;
			if (nh->nlmsg_type == NLMSG_DONE)
				return interrupted ? EAGAIN : 0;
			if (nh->nlmsg_type == NLMSG_ERROR)
				return -static_cast<const nlmsgerr *>(NLMSG_DATA(nh))->error;
			if (!visit(*nh))
				return 0;
		}
	}
}

}  // namespace xsrc
