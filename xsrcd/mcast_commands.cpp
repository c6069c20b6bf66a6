// UD multicast (driver ABI r3): ATTACH_MCAST, DETACH_MCAST, and a QP leaving
// its groups when its context goes. The daemon is the authority for
// membership (Device::mcast_groups); the arena's multicast table mirrors it
// for the data path, where a sender finds a group's members without entering
// the daemon (kernel-abi/xsrc-queues.h: one sequence lock per group entry).
//
// The answers are the kernel's (ib_uverbs_attach_mcast / ib_attach_mcast and
// the detach pair) and rxe's: a QP that is not UD or a GID that is not
// multicast is EINVAL; attaching a QP to a group it is in is 0; detaching it
// from a group it is not in is EINVAL; past max_mcast_grp,
// max_mcast_qp_attach or max_total_mcast_qp_attach is ENOMEM. The multicast
// LID is ignored, as the kernel ignores it on a RoCE port. While a group
// has members here, the host is a member of its IP group on the netdev.
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/atomic.h"
#include "dispatcher_handlers.h"
#include "log.h"

namespace xsrc {
namespace {

using GidBytes = std::array<uint8_t, 16>;

// Rewrites a group's arena entry under its sequence lock: the members, or
// (none) a free entry.
void publish_group(Arena &arena, uint32_t entry, const GidBytes &gid, const std::vector<Qpn> &members)
{
	xsrc_mcast_group &g = arena.mcast_group(entry);
	auto seq = atomic(g.seq);
	uint32_t before = seq.load(std::memory_order_relaxed);
	seq.store(before + 1, std::memory_order_relaxed);  // odd: readers retry
	std::atomic_thread_fence(std::memory_order_release);
	std::memcpy(g.gid, members.empty() ? GidBytes{}.data() : gid.data(), sizeof(g.gid));
	for (size_t i = 0; i < members.size(); ++i)
		g.qpns[i] = members[i].value();
	std::fill(std::begin(g.qpns) + members.size(), std::end(g.qpns), 0u);
	g.num_qps = static_cast<__u32>(members.size());
	seq.store(before + 2, std::memory_order_release);
}

// Readers scan the entries below scan_end: one past the highest in use.
void publish_scan_end(Device &dev)
{
	uint32_t end = 0;
	for (const auto &[gid, group] : dev.mcast_groups)
		end = std::max(end, group.entry + 1);
	store_release<__u32>(dev.arena->mcast_table().scan_end, end);
}

// The lowest entry no group uses (the caller checked max_mcast_grp).
uint32_t free_entry(const Device &dev)
{
	std::vector<bool> used(XSRC_MCAST_GROUPS);
	for (const auto &[gid, group] : dev.mcast_groups)
		used[group.entry] = true;
	return static_cast<uint32_t>(std::find(used.begin(), used.end(), false) - used.begin());
}

// Joins the group's IP multicast address (IPv4 for an IPv4-mapped GID) on
// the device's netdev, so that other hosts' datagrams to the group reach it
// (xsrcd/wire_receiver.cpp, wire_deliver.cpp). One socket per group: the
// kernel limits memberships per socket (igmp_max_memberships, 20), not
// sockets. A group that cannot be joined (no netdev, no IPv6) still works
// on this host; the reason goes to the debug log.
unique_fd join_ip_group(const Device &dev, const GidBytes &gid)
{
	bool ipv4 = gid[10] == 0xFF && gid[11] == 0xFF && gid[0] == 0;
	unique_fd fd(::socket(ipv4 ? AF_INET : AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, IPPROTO_UDP));
	int rc = -1;
	if (fd && ipv4) {
		ip_mreqn m{};
		std::memcpy(&m.imr_multiaddr, gid.data() + 12, 4);
		m.imr_ifindex = dev.netdev.ifindex;
		rc = setsockopt(fd.get(), IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof(m));
	} else if (fd) {
		ipv6_mreq m{};
		std::memcpy(&m.ipv6mr_multiaddr, gid.data(), sizeof(m.ipv6mr_multiaddr));
		m.ipv6mr_interface = static_cast<unsigned>(dev.netdev.ifindex);
		rc = setsockopt(fd.get(), IPPROTO_IPV6, IPV6_JOIN_GROUP, &m, sizeof(m));
	}
	if (rc) {
		debug_log("attach_mcast: cannot join the IP group on ifindex %d (%s): members on other hosts do not reach it",
			  dev.netdev.ifindex, strerror(errno));
		fd.reset();
	}
	return fd;
}

// Takes the QP out of one group; the group goes with its last member.
void leave_group(Device &dev, Qp &qp, const Gid &gid)
{
	std::erase(qp.mcast_groups, gid);
	auto it = dev.mcast_groups.find(gid.raw);
	if (it == dev.mcast_groups.end() || std::erase(it->second.members, qp.qpn()) == 0)
		return;
	--dev.mcast_attachments;
	uint32_t entry = it->second.entry;
	if (it->second.members.empty()) {
		dev.mcast_groups.erase(it);  // closes its socket: leaves the IP group
		publish_group(*dev.arena, entry, gid.raw, {});
	} else {
		publish_group(*dev.arena, entry, gid.raw, it->second.members);
	}
	publish_scan_end(dev);
}

// What ATTACH_MCAST and DETACH_MCAST name (their structs differ only in name).
struct McastRequest {
	Qp *qp = nullptr;
	Gid gid;
};

template <typename Cmd>
int decode_mcast_request(Context &ctx, const Request &req, McastRequest &out)
{
	auto cmd = load<Cmd>(req.core);
	out.qp = lookup<Qp>(ctx, cmd.qp_handle);
	if (!out.qp)
		return refuse(EINVAL, "no such QP handle");
	if (cmd.reserved)
		return refuse(EINVAL, "non-zero reserved field");
	if (int err = check_no_driver_data(req))
		return err;
	std::memcpy(out.gid.raw.data(), cmd.gid, sizeof(cmd.gid));
	return 0;
}

}  // namespace

int cmd_attach_mcast(Context &ctx, Caller &, const Request &req)
{
	using L = DeviceLimits;
	McastRequest r;
	if (int err = decode_mcast_request<ib_uverbs_attach_mcast>(ctx, req, r))
		return err;
	if (r.qp->qp_type != IBV_QPT_UD)
		return refuse(EINVAL, "multicast needs a UD QP");
	if (!xsrc_is_multicast_gid(r.gid.raw.data()))
		return refuse(EINVAL, "not a multicast GID (ff00::/8 or ::ffff:224.0.0.0/4)");
	if (std::ranges::find(r.qp->mcast_groups, r.gid) != r.qp->mcast_groups.end())
		return 0;  // attached already: the kernel answers 0 and changes nothing
	Device &dev = *ctx.device;
	auto it = dev.mcast_groups.find(r.gid.raw);
	bool new_group = it == dev.mcast_groups.end();
	if (new_group && dev.mcast_groups.size() >= L::max_mcast_grp)
		return refuse(ENOMEM, "limit: max_mcast_grp groups on the device");
	if (dev.mcast_attachments >= L::max_total_mcast_qp_attach)
		return refuse(ENOMEM, "limit: max_total_mcast_qp_attach memberships on the device");
	if (!new_group && it->second.members.size() >= L::max_mcast_qp_attach)
		return refuse(ENOMEM, "limit: max_mcast_qp_attach QPs in the group");

	r.qp->mcast_groups.reserve(r.qp->mcast_groups.size() + 1);
	if (new_group)
		it = dev.mcast_groups.emplace(r.gid.raw, Device::McastGroup{free_entry(dev), {}, join_ip_group(dev, r.gid.raw)})
			     .first;
	it->second.members.push_back(r.qp->qpn());
	r.qp->mcast_groups.push_back(r.gid);
	++dev.mcast_attachments;
	publish_group(*dev.arena, it->second.entry, r.gid.raw, it->second.members);
	publish_scan_end(dev);
	return 0;
}

int cmd_detach_mcast(Context &ctx, Caller &, const Request &req)
{
	McastRequest r;
	if (int err = decode_mcast_request<ib_uverbs_detach_mcast>(ctx, req, r))
		return err;
	if (std::ranges::find(r.qp->mcast_groups, r.gid) == r.qp->mcast_groups.end())
		return refuse(EINVAL, "the QP is not attached to that group");
	leave_group(*ctx.device, *r.qp, r.gid);
	return 0;
}

void mcast_leave_all(Context &ctx, Qp &qp)
{
	std::vector<Gid> groups = std::move(qp.mcast_groups);
	qp.mcast_groups.clear();
	if (!ctx.device)
		return;
	for (const Gid &gid : groups)
		leave_group(*ctx.device, qp, gid);
}

}  // namespace xsrc
