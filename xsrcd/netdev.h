// The network device a port is bound to: addresses, MAC, MTU, link state,
// and the RoCE v2 GID table derived from them.
#pragma once

#include <netinet/in.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace xsrc {

using Mac = std::array<uint8_t, 6>;

struct Gid {
	std::array<uint8_t, 16> raw{};  // network byte order, as in union ibv_gid
	bool operator==(const Gid &) const = default;
};

struct NetdevInfo {
	std::string name;
	int ifindex = 0;
	Mac mac{};
	unsigned mtu = 0;
	bool oper_up = false;             // operstate up, or unknown with IFF_UP + carrier
	bool loopback = false;            // IFF_LOOPBACK
	std::vector<in_addr> ipv4;
	std::vector<in6_addr> ipv6;       // link-local and global, kernel order
};

// Reads the current state of netdev `name` (libudev for the device, netlink
// for addresses). Returns 0 or an errno (ENODEV when there is no such netdev).
int netdev_read(const std::string &name, NetdevInfo &out);

// The netdev `xsrc up` binds to when none is named: the first one that is up,
// not loopback and has an IPv4 address; else "lo".
std::string netdev_default();

// RoCE v2 GID table in the order the port publishes it: the IPv6 link-local
// GID (fe80::EUI-64 of the MAC when the netdev has no link-local address),
// then one IPv4-mapped GID (::ffff:a.b.c.d) per IPv4 address, then every
// other IPv6 address.
std::vector<Gid> roce_v2_gids(const NetdevInfo &netdev);

// Node GUID from the MAC as an EUI-64 (ff:fe inserted, U/L bit flipped), in
// host byte order: 00:11:22:33:44:55 -> 0x021122fffe334455.
uint64_t guid_from_mac(const Mac &mac);

// The largest IB MTU (enum ibv_mtu value 1..5) whose payload plus RoCE v2
// headers fits in the netdev MTU; IBV_MTU_256 at least.
int ib_mtu_from_netdev_mtu(unsigned netdev_mtu);

// Watches rtnetlink (links and addresses) on a thread of its own and calls
// on_change(ifindex) after a link's state, MTU or addresses changed; once per
// ifindex per batch of messages. on_change(0) means events were lost (socket
// overrun): re-read every netdev. Callbacks run on the monitor thread and must
// not destroy the monitor.
class NetdevMonitor {
public:
	using Callback = std::function<void(int ifindex)>;
	static std::unique_ptr<NetdevMonitor> start(Callback on_change, int &err);
	~NetdevMonitor();  // stops and joins the thread
	NetdevMonitor(const NetdevMonitor &) = delete;
	NetdevMonitor &operator=(const NetdevMonitor &) = delete;

private:
	NetdevMonitor() = default;
	struct Impl;
	std::unique_ptr<Impl> impl_;
};

}  // namespace xsrc
