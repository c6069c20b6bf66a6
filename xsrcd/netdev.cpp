// Netdev state from libudev + rtnetlink, RoCE v2 GIDs, and the link monitor.
#include "netdev.h"

#include <libudev.h>
#include <linux/if_addr.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>
#include <utility>

#include "common/fd.h"
#include "rtnl.h"

namespace xsrc {
namespace {

struct UdevDeleter {
	void operator()(udev *u) const { udev_unref(u); }
	void operator()(udev_device *d) const { udev_device_unref(d); }
};

// One sysattr as a string; "" when absent or unreadable (e.g. carrier of a down link).
std::string sysattr(udev_device *dev, const char *name)
{
	const char *v = udev_device_get_sysattr_value(dev, name);
	return v ? std::string(v) : std::string();
}

bool parse_mac(const std::string &s, Mac &mac)
{
	unsigned b[6];
	char tail;
	if (std::sscanf(s.c_str(), "%2x:%2x:%2x:%2x:%2x:%2x%c", &b[0], &b[1], &b[2],
			&b[3], &b[4], &b[5], &tail) != 6)
		return false;
	std::copy(std::begin(b), std::end(b), mac.begin());
	return true;
}

bool valid_ifname(const std::string &name)
{
	return !name.empty() && name.size() < IF_NAMESIZE && name != "." && name != ".." &&
	       name.find('/') == std::string::npos;
}

// Addresses of one ifindex from an RTM_GETADDR dump, in kernel order.
int dump_addresses(int ifindex, std::vector<in_addr> &v4, std::vector<in6_addr> &v6)
{
	struct {
		nlmsghdr nh;
		ifaddrmsg ifa;
	} req{};
	req.nh.nlmsg_len = sizeof(req);
	req.nh.nlmsg_type = RTM_GETADDR;
	req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	req.ifa.ifa_family = AF_UNSPEC;
	return rtnl_exchange(req.nh, [&](const nlmsghdr &nh) {
		if (nh.nlmsg_type != RTM_NEWADDR)
			return true;
		auto *ifa = static_cast<const ifaddrmsg *>(NLMSG_DATA(&nh));
		if (static_cast<int>(ifa->ifa_index) != ifindex)
			return true;
		uint32_t flags = ifa->ifa_flags;
		const void *local = nullptr, *address = nullptr;
		int alen = IFA_PAYLOAD(&nh);
		for (auto *rta = IFA_RTA(ifa); RTA_OK(rta, alen); rta = RTA_NEXT(rta, alen)) {
			if (rta->rta_type == IFA_LOCAL)
				local = RTA_DATA(rta);
			else if (rta->rta_type == IFA_ADDRESS)
				address = RTA_DATA(rta);
			else if (rta->rta_type == IFA_FLAGS)
				std::memcpy(&flags, RTA_DATA(rta), sizeof(flags));
		}
		// An address still in (or failed) DAD is not usable as a source yet.
		if ((flags & IFA_F_DADFAILED) || ((flags & IFA_F_TENTATIVE) && !(flags & IFA_F_OPTIMISTIC)))
			return true;
		if (ifa->ifa_family == AF_INET) {
			// IFA_LOCAL is our end; on point-to-point links IFA_ADDRESS is the peer.
			const void *a = local ? local : address;
			if (a) {
				in_addr v{};
				std::memcpy(&v, a, sizeof(v));
				v4.push_back(v);
			}
		} else if (ifa->ifa_family == AF_INET6 && address) {
			in6_addr v{};
			std::memcpy(&v, address, sizeof(v));
			v6.push_back(v);
		}
		return true;
	});
}

bool is_link_local(const in6_addr &a)
{
	return a.s6_addr[0] == 0xfe && (a.s6_addr[1] & 0xc0) == 0x80;
}

Gid gid_from_in6(const in6_addr &a)
{
	Gid g;
	std::copy(std::begin(a.s6_addr), std::end(a.s6_addr), g.raw.begin());
	return g;
}

}  // namespace

int netdev_read(const std::string &name, NetdevInfo &out)
{
	if (!valid_ifname(name))
		return ENODEV;
	std::unique_ptr<udev, UdevDeleter> u(udev_new());
	if (!u)
		return ENOMEM;
	std::unique_ptr<udev_device, UdevDeleter> dev(
		udev_device_new_from_subsystem_sysname(u.get(), "net", name.c_str()));
	if (!dev)
		return ENODEV;

	NetdevInfo info;
	info.name = name;
	info.ifindex = std::atoi(sysattr(dev.get(), "ifindex").c_str());
	if (info.ifindex <= 0)
		return ENODEV;
	parse_mac(sysattr(dev.get(), "address"), info.mac);  // no MAC (tunnels): stays zero
	info.mtu = static_cast<unsigned>(std::strtoul(sysattr(dev.get(), "mtu").c_str(), nullptr, 10));
	unsigned long flags = std::strtoul(sysattr(dev.get(), "flags").c_str(), nullptr, 16);
	info.loopback = flags & IFF_LOOPBACK;
	// sysfs "flags" is dev->flags, which never holds IFF_RUNNING; carrier is its source.
	std::string operstate = sysattr(dev.get(), "operstate");
	bool running = (flags & IFF_UP) && sysattr(dev.get(), "carrier") == "1";
	info.oper_up = operstate == "up" || (operstate == "unknown" && running);

	int err;
	for (int attempt = 0; attempt < 3; ++attempt) {
		info.ipv4.clear();
		info.ipv6.clear();
		err = dump_addresses(info.ifindex, info.ipv4, info.ipv6);
		if (err != EAGAIN)  // EAGAIN: the address list changed during the dump
			break;
	}
	if (err)
		return err;
	out = std::move(info);
	return 0;
}

std::string netdev_default()
{
	struct if_nameindex *list = if_nameindex();
	if (!list)
		return "lo";
	std::string found = "lo";
	for (auto *i = list; i->if_index; ++i) {
		NetdevInfo info;
		if (netdev_read(i->if_name, info) == 0 && info.oper_up && !info.loopback &&
		    !info.ipv4.empty()) {
			found = info.name;
			break;
		}
	}
	if_freenameindex(list);
	return found;
}

std::vector<Gid> roce_v2_gids(const NetdevInfo &netdev)
{
	std::vector<Gid> gids;
	auto add = [&gids](const Gid &g) {
		if (std::find(gids.begin(), gids.end(), g) == gids.end())
			gids.push_back(g);
	};

	auto ll = std::find_if(netdev.ipv6.begin(), netdev.ipv6.end(), is_link_local);
	if (ll != netdev.ipv6.end()) {
		add(gid_from_in6(*ll));
	} else {
		Gid g;
		g.raw[0] = 0xfe;
		g.raw[1] = 0x80;
		uint64_t eui = guid_from_mac(netdev.mac);
		for (int i = 0; i < 8; ++i)
			g.raw[8 + i] = static_cast<uint8_t>(eui >> (56 - 8 * i));
		add(g);
	}
	for (const in_addr &a : netdev.ipv4) {
		Gid g;
		g.raw[10] = g.raw[11] = 0xff;
		std::memcpy(&g.raw[12], &a.s_addr, 4);  // s_addr is already network order
		add(g);
	}
	for (auto it = netdev.ipv6.begin(); it != netdev.ipv6.end(); ++it)
		if (it != ll)
			add(gid_from_in6(*it));
	return gids;
}

uint64_t guid_from_mac(const Mac &mac)
{
	return uint64_t(mac[0] ^ 0x02) << 56 | uint64_t(mac[1]) << 48 | uint64_t(mac[2]) << 40 |
	       uint64_t(0xfffe) << 24 | uint64_t(mac[3]) << 16 | uint64_t(mac[4]) << 8 | mac[5];
}

int ib_mtu_from_netdev_mtu(unsigned netdev_mtu)
{
	// The netdev MTU excludes the Ethernet header. IPv6 rather than IPv4 because the
	// port also publishes IPv6 GIDs and one path MTU must fit either. The extension
	// headers are the largest set that travels with payload (XRCETH + RETH + ImmDt).
	constexpr unsigned kIp = 40, kUdp = 8, kBth = 12, kXrceth = 4, kReth = 16,
			   kImm = 4, kIcrc = 4;
	constexpr unsigned kOverhead = kIp + kUdp + kBth + kXrceth + kReth + kImm + kIcrc;
	int mtu = 1;  // IBV_MTU_256
	for (int m = 5; m > 1; --m) {
		if (netdev_mtu >= (128u << m) + kOverhead) {
			mtu = m;
			break;
		}
	}
	return mtu;
}

struct NetdevMonitor::Impl {
	Callback on_change;
	unique_fd nl;
	unique_fd stop;
	std::thread thread;

	void run();
	void drain(std::vector<int> &changed);
};

void NetdevMonitor::Impl::drain(std::vector<int> &changed)
{
	alignas(nlmsghdr) char buf[16384];
	auto note = [&changed](int ifindex) {
		if (std::find(changed.begin(), changed.end(), ifindex) == changed.end())
			changed.push_back(ifindex);
	};
	for (;;) {
		ssize_t n = ::recv(nl.get(), buf, sizeof(buf), MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == ENOBUFS)  // the kernel dropped messages: say "re-read all"
				note(0);
			return;
		}
		size_t len = static_cast<size_t>(n);
		for (auto *nh = reinterpret_cast<nlmsghdr *>(buf); NLMSG_OK(nh, len);
		     nh = NLMSG_NEXT(nh, len)) {
			switch (nh->nlmsg_type) {
			case RTM_NEWLINK:
			case RTM_DELLINK:
				if (nh->nlmsg_len >= NLMSG_LENGTH(sizeof(ifinfomsg)))
					note(static_cast<ifinfomsg *>(NLMSG_DATA(nh))->ifi_index);
				break;
			case RTM_NEWADDR:
			case RTM_DELADDR:
				if (nh->nlmsg_len >= NLMSG_LENGTH(sizeof(ifaddrmsg)))
					note(static_cast<int>(
						static_cast<ifaddrmsg *>(NLMSG_DATA(nh))->ifa_index));
				break;
			}
		}
	}
}

void NetdevMonitor::Impl::run()
{
	pollfd fds[2] = {{nl.get(), POLLIN, 0}, {stop.get(), POLLIN, 0}};
	std::vector<int> changed;
	for (;;) {
		if (::poll(fds, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		if (fds[1].revents)
			return;
		if (!fds[0].revents)
			continue;
		changed.clear();
		drain(changed);
		for (int ifindex : changed)
			on_change(ifindex);
	}
}

std::unique_ptr<NetdevMonitor> NetdevMonitor::start(Callback on_change, int &err)
{
	auto impl = std::make_unique<Impl>();
	impl->on_change = std::move(on_change);
	impl->nl = unique_fd(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
	impl->stop = unique_fd(::eventfd(0, EFD_CLOEXEC));
	if (!impl->nl || !impl->stop) {
		err = errno;
		return nullptr;
	}
	int rcvbuf = 1 << 20;  // link flaps produce bursts; an overrun costs a full re-read
	::setsockopt(impl->nl.get(), SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
	sockaddr_nl sa{};
	sa.nl_family = AF_NETLINK;
	sa.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
	if (::bind(impl->nl.get(), reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) < 0) {
		err = errno;
		return nullptr;
	}
	Impl *raw = impl.get();
	impl->thread = std::thread([raw] { raw->run(); });
	std::unique_ptr<NetdevMonitor> mon(new NetdevMonitor());
	mon->impl_ = std::move(impl);
	err = 0;
	return mon;
}

NetdevMonitor::~NetdevMonitor()
{
	if (!impl_)
		return;
	uint64_t one = 1;
	if (::write(impl_->stop.get(), &one, sizeof(one)) != sizeof(one))
		std::abort();  // an eventfd write cannot fail here; joining would hang
	impl_->thread.join();
}

}  // namespace xsrc
