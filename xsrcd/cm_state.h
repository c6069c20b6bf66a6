// The connection manager's state: channels, ids, multicast joins, bound
// ports and queued events, and the operations the commands are made of.
// Internal to cm_service.cpp (lifetimes, events, the connection protocol)
// and cm_commands.cpp (decoding and checking each command).
#pragma once

#include <rdma/rdma_user_cm.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "cm.h"
#include "cm_addr.h"
#include "wire/sender.h"

namespace xsrc::cm {

inline constexpr uint32_t kUdpQkey = 0x01234567;   // RDMA_UDP_QKEY
inline constexpr uint32_t kMulticastQpn = 0xffffff;
inline constexpr int kMaxBacklog = 1024;
// IB CM private data sizes (IBA 12.6), less the 36-byte IP CM header that an
// IP address's REQ and SIDR REQ carry first.
inline constexpr uint8_t kIpCmHeader = 36;
inline constexpr uint8_t kReqPrivate = 92, kRepPrivate = 196, kRejPrivate = 148,
			 kDreqPrivate = 220, kSidrReqPrivate = 216, kSidrRepPrivate = 136;
// REJ reasons and SIDR REP statuses (IBA 12.6.7.2, 12.11.2).
inline constexpr uint32_t kRejTimeout = 4, kRejInvalidCommId = 6, kRejInvalidServiceId = 8, kRejConsumerDefined = 28,
			  kRejVendorOptionNotSupported = 35;
inline constexpr uint32_t kSidrUnsupported = 1, kSidrReject = 2;

// The events of enum rdma_cm_event_type (<rdma/rdma_cma.h>, librdmacm-dev), by value.
enum : uint32_t {
	kEvAddrResolved = 0,
	kEvAddrError = 1,
	kEvRouteResolved = 2,
	kEvRouteError = 3,
	kEvConnectRequest = 4,
	kEvConnectResponse = 5,
	kEvConnectError = 6,
	kEvUnreachable = 7,
	kEvRejected = 8,
	kEvEstablished = 9,
	kEvDisconnected = 10,
	kEvDeviceRemoval = 11,
	kEvMulticastJoin = 12,
	kEvMulticastError = 13,
	kEvAddrChange = 14,
	kEvTimewaitExit = 15,
};

enum class IdState { Idle, AddrBound, AddrQuery, AddrResolved, RouteQuery, RouteResolved, Connect, Listen, Disconnect };
// The IB CM half of an id that connects.
enum class CmState { None, ReqSent, ReqRcvd, RepSent, RepRcvd, Established, DreqSent, DreqRcvd, Timewait, SidrReqSent, SidrReqRcvd };

// What one side offers in REQ/REP (or SIDR REQ/REP).
struct ConnParams {
	uint32_t qp_num = 0;
	uint32_t qkey = 0;
	bool srq = false;
	uint8_t responder_resources = 0;
	uint8_t initiator_depth = 0;
	uint8_t flow_control = 0;
	uint8_t retry_count = 7;
	uint8_t rnr_retry_count = 7;
	std::vector<uint8_t> private_data;
	rdma_ucm_ece ece{};
};

// The far end of a connection with another host, as its MADs name it.
struct Id;
struct WirePeer {
	Gid gid;                   // its address as a GID (where MADs go)
	int ifindex = 0;           // the netdev they leave from
	uint32_t comm_id = 0;      // its communication id (0 until it told us)
	uint64_t tid = 0;          // the transaction id of the exchange under way
	std::vector<uint8_t> last; // the last MAD we sent, for a resend or a duplicate
	unsigned sends = 0;        // times `last` went out (retries + 1)
	std::function<void(Id &)> expired;  // what the retries running out means
};

struct Id {
	uint32_t handle = 0;
	uint64_t uid = 0;          // the caller's context, echoed in events
	uint64_t channel = 0;
	uint16_t ps = 0;           // enum rdma_ucm_port_space
	uint8_t qp_type = 0;       // enum ibv_qp_type
	IdState state = IdState::Idle;
	sockaddr_storage src{}, dst{};
	std::optional<std::pair<uint16_t, uint16_t>> bound_port;  // {port space, port} it holds
	std::optional<Local> local;  // the device, once bound to one
	Route route;
	bool route_resolved = false;
	bool reuseaddr = false;
	bool afonly = false, afonly_set = false;
	std::optional<uint8_t> tos;
	std::optional<uint8_t> ack_timeout;
	uint32_t events_reported = 0;
	int backlog = 0;           // a listener: requests it may still queue
	// The connection.
	CmState cm = CmState::None;
	uint32_t peer = 0;         // the other end's handle while there is one
	bool active = false;       // this end sent the REQ
	uint32_t psn = 0;          // the connection's starting PSN, both directions
	ConnParams mine, theirs;
	uint64_t timer = 0;        // the pending timeout's generation (0: none)
	std::set<uint32_t> mcs;
	// The other end is on another host: the IB CM's messages travel as MADs
	// (cm_wire.cpp) instead of changing a peer of this daemon.
	bool remote = false;       // the route leads off this host
	std::optional<WirePeer> wire;
	uint32_t peer_psn = 0;     // a remote peer's starting PSN (our receive PSN)
};

// This end is done with its peer: the IB CM state it ends in, no peer, no
// pending timeout.
inline void detach_peer(Id &id, CmState to)
{
	id.cm = to;
	id.peer = 0;
	id.timer = 0;
}

struct Multicast {
	uint32_t handle = 0;
	uint32_t id = 0;
	uint64_t uid = 0;
	sockaddr_storage addr{};
	uint16_t join_flags = 0;
	uint32_t events_reported = 0;
};

struct Event {
	uint32_t id = 0;           // counted on this id when taken
	uint32_t mc = 0;           // a multicast event: counted on this join too
	uint32_t request = 0;      // CONNECT_REQUEST: the new id it carries
	rdma_ucm_event_resp resp{};
};

struct Waiter {
	uint64_t token = 0;
	std::unique_ptr<Caller> caller;
	uint64_t response = 0;
	size_t out_len = 0;
};

struct Channel {
	uid_t uid = 0;
	unsigned files = 1;
	std::deque<Event> events;
	std::deque<Waiter> waiters;
	std::set<uint32_t> ids;
};

// One decoded write(): the command's input (zero-extended to what this
// daemon knows) and room for its response.
struct Command {
	uint32_t cmd = 0;
	std::span<const std::byte> in;
	size_t out_len = 0;
	bool nonblock = false;
	uint64_t token = 0;
};

class State;
using CommandHandler = int (*)(State &, uint64_t channel, Caller &, std::unique_ptr<Caller> &, const Command &);
// The command table (cm_commands.cpp): a handler or none (ENOSYS), by command.
CommandHandler command_handler(uint32_t cmd);
const char *command_name(uint32_t cmd);

class State {
public:
	explicit State(CmHost &host);
	~State();

	std::mutex mu;
	CmHost &host;
	CmFrontEnd *front_end = nullptr;
	std::function<uint64_t(int)> channel_of_fd;

	std::map<uint64_t, Channel> channels;
	std::map<uint32_t, Id> ids;
	std::map<uint32_t, Multicast> mcs;
	std::map<std::pair<uint16_t, uint16_t>, std::set<uint32_t>> ports;  // {space, port} -> ids bound
	uint64_t next_channel = 1;
	uint32_t next_handle = 1;

	// Ids of `channel` by handle: ENOENT when there is none, EINVAL when it
	// belongs to another channel (the kernel's ucma_get_ctx).
	int find(uint64_t channel, uint32_t handle, Id *&out);
	Id &create_id(uint64_t channel, uint64_t uid, uint16_t ps, uint8_t qp_type);
	uint32_t destroy_id(uint32_t handle);  // returns events_reported
	void destroy_channel(uint64_t channel);
	void leave(uint32_t mc_handle);

	// Addresses and ports.
	int bind(Id &id, const sockaddr_storage &addr, uid_t uid);
	// Resolves toward `dst` (rdma_resolve_addr); another host's address
	// resolves once its next hop's link-layer address is known, or ends in
	// ADDR_ERROR (-ETIMEDOUT) after `timeout`, as the kernel's does.
	int resolve_addr(Id &id, const sockaddr_storage *src, const sockaddr_storage &dst, uid_t uid,
			 std::chrono::milliseconds timeout);
	int resolve_route(Id &id);
	int listen(Id &id, int backlog, uid_t uid);

	// The connection protocol.
	int connect(Id &id, ConnParams params);
	int accept(Id &id, std::optional<ConnParams> params, uint64_t uid);
	int reject(Id &id, uint8_t reason, std::vector<uint8_t> private_data);
	int disconnect(Id &id);
	int notify(Id &id, uint32_t event);
	int join(Id &id, const sockaddr_storage &addr, uint16_t flags, uint64_t uid, uint32_t &handle);

	// Events: queue one (it goes straight to a waiting GET_EVENT if there is
	// one); take the oldest into a caller's buffer.
	void queue(uint64_t channel, Event ev);
	// ESTABLISHED for the SIDR REQ id sent: the answer's QPN, Q_Key and
	// private data (kSidrRepPrivate bytes), the AH of its route.
	void queue_sidr_established(Id &id, const ConnParams &rep);
	void queue_id_event(Id &id, uint32_t event, int32_t status, const ConnParams *conn = nullptr,
			    uint8_t private_len = 0);
	int take(Channel &ch, Caller &caller, uint64_t response, size_t out_len);
	void cancel(uint64_t token);

	// Timeouts: `fn` runs under `mu` after `ms` unless the id's timer changed.
	void arm(Id &id, std::chrono::milliseconds ms, std::function<void(Id &)> fn);

	std::vector<CmDevice> devices() { return host.cm_devices(); }
	uint16_t port_space(const Id &id) const;

private:
	int take_port(Id &id, uid_t uid, bool listening);
	// An id in AddrQuery toward another host: resolved once the neighbour
	// is known; checked again every kNeighbourPoll until `deadline`.
	void await_neighbour(Id &id, int ifindex, std::chrono::steady_clock::time_point deadline);
	void release_port(Id &id);
	int check_port(const Id &id, const std::set<uint32_t> &owners, bool reuseaddr) const;
	void teardown(Id &id);
	void connect_sidr(Id &id, Id *listener);
	void set_route(Id &id, const Local &src, const Gid &dgid, int peer_mtu);
	void timer_loop();
public:
	// The IB CM between hosts (cm_wire.cpp): a MAD from the wire, and the
	// messages this host's ids send to remote peers.
	void wire_receive(int ifindex, std::span<const uint8_t> ip_packet);
	uint32_t comm_id(const Id &id) const { return id.handle ^ comm_salt_; }
	Id *by_comm_id(uint32_t comm, const Gid &from);
	void wire_connect(Id &id);
	void wire_accept(Id &id);
	void wire_rtu(Id &id);
	void wire_reject(Id &id, uint16_t reason, const std::vector<uint8_t> &private_data);
	void wire_disconnect(Id &id);
	void wire_teardown(Id &id);
	void wire_connect_sidr(Id &id);
	void wire_accept_sidr(Id &id, const ConnParams &rep, uint8_t status);
	// Sends `mad` to the id's peer and, when `retry`, again on a timeout
	// until the retries run out, then `expired`.
	void wire_send(Id &id, std::vector<uint8_t> mad, bool retry, std::function<void(Id &)> expired = {});
	void wire_resend(Id &id, std::chrono::milliseconds timeout);
	void send_mad(const Gid &sgid, const Gid &dgid, int ifindex, std::span<const uint8_t> mad);
	void enter_timewait(Id &id);
	Id *find_listener(uint16_t space, const sockaddr_storage &dst);
	struct {
		uint64_t mads_sent = 0, mads_resent = 0, mads_received = 0, mads_duplicate = 0, mads_bad = 0;
	} counters;
	// PSNs, ephemeral ports, MAD transaction ids, resend jitter.
	std::mt19937_64 rng{std::random_device{}()};

private:
	uint32_t comm_salt_ = static_cast<uint32_t>(std::random_device{}());
	std::unique_ptr<xsrc_wire_sender> wire_sender_;
	uint32_t next_sidr_ = 1;
	uint32_t mad_psn_ = 0;

	std::multimap<std::chrono::steady_clock::time_point, std::function<void()>> timers_;
	uint64_t next_timer_ = 1;
	std::condition_variable timer_cv_;
	bool stopping_ = false;
	std::thread timer_thread_;
};

// Builds an event's connection or UD parameters.
void fill_conn(rdma_ucm_conn_param &out, const ConnParams &p, uint8_t private_len);

}  // namespace xsrc::cm
