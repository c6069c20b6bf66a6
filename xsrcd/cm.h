// The connection manager: what the kernel's rdma_ucm serves on
// /dev/infiniband/rdma_cm, for every process on this host and every xsrc
// device. A channel is one open of the cm file (librdmacm's event channel);
// its ids bind, resolve, listen and connect as <rdma/rdma_user_cm.h> says,
// and their events queue on the channel until GET_EVENT takes them.
//
// The connection protocol between two ids of this daemon is the IB CM's
// (REQ, REP, RTU, REJ, DREQ, DREP; SIDR for UD), run inside the daemon:
// both ends are here, so a message is a state change of the peer and an
// event on its channel. Nothing here blocks on a client; a GET_EVENT with no
// event waiting is held and answered through the front end later.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "caller.h"
#include "neigh.h"
#include "netdev.h"

namespace xsrc {

// What the CM needs of a device: a snapshot taken when it resolves an address.
struct CmDevice {
	std::string name;
	unsigned index = 0;         // uverbsN
	uint64_t node_guid = 0;     // host byte order
	int active_mtu = 3;         // enum ibv_mtu
	NetdevInfo netdev;
	std::vector<Gid> gids;      // the port's GID table, in index order
};

// The daemon, as the CM sees it.
class CmHost {
public:
	virtual ~CmHost() = default;
	virtual std::vector<CmDevice> cm_devices() = 0;
	// The peer of a connection is gone (its id destroyed without a disconnect,
	// its process dead): the surviving QP `qpn` of `device` goes to error.
	virtual void cm_peer_gone(const std::string &device, uint32_t qpn) = 0;
	// The next hop toward another host's `dst` out of netdev `ifindex`:
	// known, or pending with its resolution started (neigh.h).
	virtual Neighbour cm_neighbour(int ifindex, const sockaddr_storage &dst) = 0;
};

// The file side (FUSE), as the CM sees it. Called with the CM's lock held:
// implementations take only locks of their own and never call back.
class CmFrontEnd {
public:
	virtual ~CmFrontEnd() = default;
	// A held GET_EVENT is done: err 0 (its response is written) or an errno.
	virtual void answer(uint64_t token, int err) = 0;
	// An event was queued on `channel`: wake its pollers.
	virtual void readable(uint64_t channel) = 0;
};

// Is this RoCE v2 packet (IP header .. ICRC) for QP1, the GSI QP, which
// carries the CM's MADs between hosts?
bool is_gsi_packet(std::span<const uint8_t> ip_packet);

class CmService {
public:
	explicit CmService(CmHost &host);
	~CmService();
	CmService(const CmService &) = delete;
	CmService &operator=(const CmService &) = delete;

	void set_front_end(CmFrontEnd *front_end);

	// A new channel, owned by `uid`. Returns 0 or an errno.
	int open_channel(uid_t uid, uint64_t &channel);
	// Another file on `channel` (its event file): only its owner may open one.
	int open_event_file(uint64_t channel, uid_t uid);
	// One file of the channel was closed; the last one destroys its ids.
	void release_file(uint64_t channel);
	bool channel_owner(uint64_t channel, uid_t &uid);
	// The channel a file of the caller names (MIGRATE_ID passes an fd):
	// the FUSE side maps an inode to a channel.
	using ChannelOfFd = uint64_t (*)(int daemon_fd);
	void set_channel_of_fd(ChannelOfFd fn);

	// One write() on a channel file. `caller` is the writing thread; a held
	// GET_EVENT keeps `held_caller` to write its response later. Returns 0,
	// an errno, or kHeld (answered later through the front end with `token`).
	static constexpr int kHeld = -1;
	int execute(uint64_t channel, Caller &caller, std::unique_ptr<Caller> held_caller,
		    std::span<const std::byte> command, bool nonblock, uint64_t token);
	// The held request `token` was interrupted by a signal: answered EINTR.
	void cancel(uint64_t token);
	// Is an event waiting on `channel`?
	bool readable(uint64_t channel);

	// Device `name` is gone: its ids get RDMA_CM_EVENT_DEVICE_REMOVAL and
	// lose it (commands that need a device then fail EINVAL).
	void device_removed(const std::string &name);

	// A CM MAD from the wire (a packet is_gsi_packet() took), the ICRC
	// checked, that came in on netdev `ifindex`: IP header .. ICRC.
	void wire_receive(int ifindex, std::span<const uint8_t> ip_packet);

	// Live ids, multicast joins and channels, for tests and `xsrc status`.
	size_t object_count();
	// Ids that listen (rdma_listen done), for tests and `xsrc status`.
	size_t listener_count();
	// The CM MADs counted between hosts, as " name=value" pairs for `xsrc status`.
	std::string wire_status();

	struct Impl;

private:
	std::unique_ptr<Impl> impl_;
};

}  // namespace xsrc
