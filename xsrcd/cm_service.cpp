// The connection manager's lifetimes, events and connection protocol. The
// commands that drive it are decoded in cm_commands.cpp.
#include <arpa/inet.h>
#include <endian.h>
#include <infiniband/verbs.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cm_state.h"
#include "common/fd.h"
#include "log.h"

namespace xsrc {
namespace cm {
namespace {

constexpr auto kReqTimeout = std::chrono::seconds(10);     // no REP (or REJ) for a REQ
constexpr auto kRepTimeout = std::chrono::seconds(10);     // no RTU for a REP
constexpr auto kDreqTimeout = std::chrono::seconds(2);     // no DREP for a DREQ
constexpr auto kTimewait = std::chrono::milliseconds(500); // DREP to TIMEWAIT_EXIT
constexpr auto kNeighbourPoll = std::chrono::milliseconds(50);  // a next hop's resolution
constexpr uint16_t kEphemeralLow = 32768, kEphemeralHigh = 60999;  // Linux's ip_local_port_range

bool connected_ish(CmState s)
{
	return s == CmState::Established || s == CmState::RepSent || s == CmState::RepRcvd;
}

bool is_multicast(const sockaddr_storage &a)
{
	if (a.ss_family == AF_INET)
		return IN_MULTICAST(ntohl(reinterpret_cast<const sockaddr_in &>(a).sin_addr.s_addr));
	if (a.ss_family == AF_INET6)
		return IN6_IS_ADDR_MULTICAST(&reinterpret_cast<const sockaddr_in6 &>(a).sin6_addr);
	return false;
}

// The multicast GID a group address has on a RoCE v2 port: an IPv4 group
// IPv4-mapped (::ffff:a.b.c.d), an IPv6 group itself.
Gid multicast_gid(const sockaddr_storage &a)
{
	return gid_of(a);
}

ConnParams swapped(ConnParams p)
{
	std::swap(p.responder_resources, p.initiator_depth);
	return p;
}

uint8_t private_len(const Id &id, uint8_t size)
{
	return id.src.ss_family == kAfIb ? size : static_cast<uint8_t>(size - kIpCmHeader);
}

// The address the kernel's routing table sends to `dst` from (a connected
// UDP socket's name: no packet leaves), as rdma_resolve_addr's route lookup
// finds it; nothing when there is no route.
std::optional<sockaddr_storage> route_source(const sockaddr_storage &dst)
{
	unique_fd fd(::socket(dst.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
	if (!fd)
		return std::nullopt;
	sockaddr_storage to = dst;
	if (port_of(to) == 0)
		set_port(to, 9);  // any port: connect() wants one
	socklen_t len = static_cast<socklen_t>(address_size(dst.ss_family));
	if (::connect(fd.get(), reinterpret_cast<const sockaddr *>(&to), len))
		return std::nullopt;
	sockaddr_storage from{};
	len = sizeof(from);
	if (getsockname(fd.get(), reinterpret_cast<sockaddr *>(&from), &len))
		return std::nullopt;
	set_port(from, 0);
	return from;
}

}  // namespace

void fill_conn(rdma_ucm_conn_param &out, const ConnParams &p, uint8_t private_len)
{
	out.qp_num = p.qp_num;
	out.qkey = p.qkey;
	size_t n = std::min<size_t>(p.private_data.size(), sizeof(out.private_data));
	std::copy_n(p.private_data.begin(), n, out.private_data);  // memcpy of an empty vector's data() is UB
	out.private_data_len = static_cast<uint8_t>(std::max<size_t>(private_len, n));
	out.srq = p.srq;
	out.responder_resources = p.responder_resources;
	out.initiator_depth = p.initiator_depth;
	out.flow_control = p.flow_control;
	out.retry_count = p.retry_count;
	out.rnr_retry_count = p.rnr_retry_count;
}

State::State(CmHost &h) : host(h)
{
	timer_thread_ = std::thread([this] { timer_loop(); });
}

State::~State()
{
	{
		std::lock_guard lock(mu);
		stopping_ = true;
	}
	timer_cv_.notify_all();
	timer_thread_.join();
}

void State::timer_loop()
{
	std::unique_lock lock(mu);
	while (!stopping_) {
		if (timers_.empty()) {
			timer_cv_.wait(lock);
			continue;
		}
		auto first = timers_.begin();
		if (first->first > std::chrono::steady_clock::now()) {
			timer_cv_.wait_until(lock, first->first);
			continue;
		}
		auto fn = std::move(first->second);
		timers_.erase(first);
		fn();
	}
}

void State::arm(Id &id, std::chrono::milliseconds ms, std::function<void(Id &)> fn)
{
	uint64_t generation = next_timer_++;
	id.timer = generation;
	uint32_t handle = id.handle;
	timers_.emplace(std::chrono::steady_clock::now() + ms, [this, handle, generation, fn = std::move(fn)] {
		auto it = ids.find(handle);
		if (it == ids.end() || it->second.timer != generation)
			return;
		it->second.timer = 0;
		fn(it->second);
	});
	timer_cv_.notify_one();
}

uint16_t State::port_space(const Id &id) const
{
	if (id.ps != RDMA_PS_IB)
		return id.ps;
	if (id.src.ss_family == kAfIb) {  // the service id names the space
		uint64_t sid = be64toh(reinterpret_cast<const SockaddrIb &>(id.src).sib_sid);
		return static_cast<uint16_t>((sid >> 16) & 0xffff);
	}
	return id.qp_type == IBV_QPT_UD ? RDMA_PS_UDP : RDMA_PS_TCP;
}

int State::find(uint64_t channel, uint32_t handle, Id *&out)
{
	auto it = ids.find(handle);
	if (it == ids.end())
		return refuse(ENOENT, "no such cm id");
	if (it->second.channel != channel)
		return refuse(EINVAL, "cm id of another channel");
	out = &it->second;
	return 0;
}

Id &State::create_id(uint64_t channel, uint64_t uid, uint16_t ps, uint8_t qp_type)
{
	uint32_t handle = next_handle++;
	Id &id = ids[handle];
	id.handle = handle;
	id.uid = uid;
	id.channel = channel;
	id.ps = ps;
	id.qp_type = qp_type;
	channels[channel].ids.insert(handle);
	return id;
}

// --- events ---------------------------------------------------------------

int State::take(Channel &ch, Caller &caller, uint64_t response, size_t out_len)
{
	Event &ev = ch.events.front();
	size_t n = std::min(out_len, sizeof(ev.resp));
	auto bytes = std::span(reinterpret_cast<const std::byte *>(&ev.resp), n);
	if (int err = caller.write_memory(response, bytes))
		return err;  // the event stays queued, as the kernel keeps it
	if (auto it = ids.find(ev.id); it != ids.end()) {
		it->second.events_reported++;
		if (ev.resp.event == kEvConnectRequest)
			it->second.backlog++;
	}
	if (auto it = mcs.find(ev.mc); ev.mc && it != mcs.end())
		it->second.events_reported++;
	ch.events.pop_front();
	return 0;
}

void State::queue(uint64_t channel, Event ev)
{
	auto it = channels.find(channel);
	if (it == channels.end())
		return;
	Channel &ch = it->second;
	ch.events.push_back(ev);
	while (!ch.waiters.empty() && !ch.events.empty()) {
		Waiter w = std::move(ch.waiters.front());
		ch.waiters.pop_front();
		int err = take(ch, *w.caller, w.response, w.out_len);
		if (front_end)
			front_end->answer(w.token, err);
	}
	if (!ch.events.empty() && front_end)
		front_end->readable(channel);
}

void State::queue_sidr_established(Id &id, const ConnParams &rep)
{
	Event ev;
	ev.id = id.handle;
	ev.resp.uid = id.uid;
	ev.resp.id = id.handle;
	ev.resp.event = kEvEstablished;
	auto &ud = ev.resp.param.ud;
	ud.qp_num = rep.qp_num;
	ud.qkey = rep.qkey;
	ud.ah_attr = ah_attr_of(id.route);
	size_t n = std::min(rep.private_data.size(), sizeof(ud.private_data));
	std::copy_n(rep.private_data.begin(), n, ud.private_data);  // memcpy of an empty vector's data() is UB
	ud.private_data_len = kSidrRepPrivate;
	ev.resp.ece = rep.ece;
	queue(id.channel, ev);
}

void State::queue_id_event(Id &id, uint32_t event, int32_t status, const ConnParams *conn, uint8_t plen)
{
	// A request the application has not accepted yet has no context of its
	// own: librdmacm would take its event for the listener's (whose uid the
	// CONNECT_REQUEST carried) and then wait forever in rdma_destroy_id for
	// an event it counted on the wrong id. The kernel drops these events;
	// ACCEPT then fails (the connection is gone).
	if (!id.uid)
		return;
	Event ev;
	ev.id = id.handle;
	ev.resp.uid = id.uid;
	ev.resp.id = id.handle;
	ev.resp.event = event;
	ev.resp.status = static_cast<uint32_t>(status);
	if (conn) {
		if (id.qp_type == IBV_QPT_UD) {
			ev.resp.param.ud.qp_num = conn->qp_num;
			ev.resp.param.ud.qkey = conn->qkey;
			size_t n = std::min<size_t>(conn->private_data.size(), sizeof(ev.resp.param.ud.private_data));
			std::copy_n(conn->private_data.begin(), n, ev.resp.param.ud.private_data);  // memcpy of an empty vector's data() is UB
			ev.resp.param.ud.private_data_len = static_cast<uint8_t>(std::max<size_t>(plen, n));
		} else {
			fill_conn(ev.resp.param.conn, *conn, plen);
		}
		ev.resp.ece = conn->ece;
	}
	queue(id.channel, ev);
}

void State::cancel(uint64_t token)
{
	for (auto &[cid, ch] : channels) {
		auto it = std::find_if(ch.waiters.begin(), ch.waiters.end(),
				       [&](const Waiter &w) { return w.token == token; });
		if (it == ch.waiters.end())
			continue;
		ch.waiters.erase(it);
		if (front_end)
			front_end->answer(token, EINTR);
		return;
	}
}

// --- lifetimes ------------------------------------------------------------

// What the other end sees when `id` goes away mid-connection: the IB CM's
// REJ, DREQ or DREP (ib_destroy_cm_id sends whichever its state calls for).
void State::teardown(Id &id)
{
	if (id.remote) {
		wire_teardown(id);
		return;
	}
	auto it = ids.find(id.peer);
	Id *peer = it == ids.end() ? nullptr : &it->second;
	CmState was = id.cm;
	id.cm = CmState::None;
	id.peer = 0;
	if (!peer || peer->peer != id.handle)
		return;
	auto rejected = [&](uint32_t reason) {
		detach_peer(*peer, CmState::Timewait);
		ConnParams none;
		queue_id_event(*peer, kEvRejected, static_cast<int32_t>(reason), &none, kRejPrivate);
	};
	switch (was) {
	case CmState::ReqSent:
		rejected(kRejTimeout);
		break;
	case CmState::ReqRcvd:
	case CmState::RepSent:
	case CmState::RepRcvd:
		rejected(kRejConsumerDefined);
		break;
	case CmState::Established: {
		// Gone without a disconnect (destroyed, or its process died): the
		// DREQ says so, and the survivor's QP can no longer reach anyone.
		detach_peer(*peer, CmState::DreqRcvd);
		peer->state = IdState::Disconnect;
		ConnParams none;
		queue_id_event(*peer, kEvDisconnected, 0, &none, 0);
		if (peer->local && peer->mine.qp_num)
			host.cm_peer_gone(peer->local->device.name, peer->mine.qp_num);
		break;
	}
	case CmState::DreqRcvd:  // our DREP
		if (peer->cm == CmState::DreqSent) {
			detach_peer(*peer, CmState::Timewait);
			peer->state = IdState::Disconnect;
			ConnParams none;
			queue_id_event(*peer, kEvDisconnected, 0, &none, 0);
		}
		break;
	case CmState::SidrReqRcvd:  // never answered: the requester gives up
		if (peer->cm == CmState::SidrReqSent) {
			detach_peer(*peer, CmState::None);
			queue_id_event(*peer, kEvUnreachable, -ETIMEDOUT);
		}
		break;
	default:
		peer->peer = 0;
		break;
	}
}

uint32_t State::destroy_id(uint32_t handle)
{
	auto it = ids.find(handle);
	if (it == ids.end())
		return 0;
	Id &id = it->second;
	// A DREQ to another host still unanswered: the id outlives its channel
	// until the DREP (or the last retry), or the peer would never hear it.
	const bool linger = id.remote && id.wire && id.cm == CmState::DreqSent;
	if (!linger)
		teardown(id);
	std::vector<uint32_t> requests;
	if (auto ch = channels.find(id.channel); ch != channels.end()) {
		auto &events = ch->second.events;
		for (const Event &ev : events)
			if (ev.id == handle && ev.request)
				requests.push_back(ev.request);
		std::erase_if(events, [&](const Event &ev) { return ev.id == handle || ev.request == handle; });
		ch->second.ids.erase(handle);
	}
	for (uint32_t mc : std::vector<uint32_t>(id.mcs.begin(), id.mcs.end()))
		leave(mc);
	release_port(id);
	uint32_t reported = id.events_reported;
	if (linger) {
		id.channel = 0;
		id.uid = 0;  // its events go nowhere
		id.wire->expired = [this](Id &self) { ids.erase(self.handle); };
	} else {
		ids.erase(it);
	}
	// Requests the application never saw die with their listener: their
	// requesters are rejected.
	for (uint32_t r : requests)
		destroy_id(r);
	return reported;
}

void State::destroy_channel(uint64_t channel)
{
	auto it = channels.find(channel);
	if (it == channels.end())
		return;
	for (uint32_t handle : std::vector<uint32_t>(it->second.ids.begin(), it->second.ids.end()))
		destroy_id(handle);
	it = channels.find(channel);
	if (it == channels.end())
		return;
	for (Waiter &w : it->second.waiters)
		if (front_end)
			front_end->answer(w.token, EINTR);
	channels.erase(it);
}

void State::leave(uint32_t mc_handle)
{
	auto it = mcs.find(mc_handle);
	if (it == mcs.end())
		return;
	if (auto id = ids.find(it->second.id); id != ids.end()) {
		id->second.mcs.erase(mc_handle);
		if (auto ch = channels.find(id->second.channel); ch != channels.end())
			std::erase_if(ch->second.events, [&](const Event &ev) { return ev.mc == mc_handle; });
	}
	mcs.erase(it);
}

// --- addresses and ports ----------------------------------------------------

int State::check_port(const Id &id, const std::set<uint32_t> &owners, bool reuseaddr) const
{
	for (uint32_t h : owners) {
		auto it = ids.find(h);
		if (h == id.handle || it == ids.end())
			continue;
		const Id &cur = it->second;
		if (reuseaddr && cur.reuseaddr)
			continue;
		if (id.afonly && cur.afonly && id.src.ss_family != cur.src.ss_family)
			continue;
		if (is_any(id.src) || is_any(cur.src))
			return refuse(EADDRNOTAVAIL, "port taken on a wildcard address");
		if (same_address(id.src, cur.src))
			return refuse(EADDRINUSE, "address and port in use");
	}
	return 0;
}

int State::take_port(Id &id, uid_t uid, bool)
{
	const uint16_t space = port_space(id);
	uint16_t port = port_of(id.src);
	if (port == 0) {
		const unsigned range = kEphemeralHigh - kEphemeralLow + 1;
		unsigned start = rng() % range;
		for (unsigned i = 0; i < range && !port; ++i) {
			uint16_t p = static_cast<uint16_t>(kEphemeralLow + (start + i) % range);
			auto owners = ports.find({space, p});
			if (owners == ports.end() || owners->second.empty())
				port = p;
		}
		if (!port)
			return refuse(EADDRNOTAVAIL, "no free port");
		set_port(id.src, port);
	} else {
		if (port < 1024 && uid != 0)
			return refuse(EACCES, "a privileged port");
		if (auto owners = ports.find({space, port}); owners != ports.end())
			if (int err = check_port(id, owners->second, id.reuseaddr))
				return err;
	}
	ports[{space, port}].insert(id.handle);
	id.bound_port = {space, port};
	return 0;
}

void State::release_port(Id &id)
{
	if (!id.bound_port)
		return;
	auto it = ports.find(*id.bound_port);
	if (it != ports.end()) {
		it->second.erase(id.handle);
		if (it->second.empty())
			ports.erase(it);
	}
	id.bound_port.reset();
}

int State::bind(Id &id, const sockaddr_storage &addr, uid_t uid)
{
	if (!address_size(addr.ss_family))
		return refuse(EAFNOSUPPORT, "address family");
	std::optional<Local> local;
	if (!is_any(addr)) {
		local = find_local(devices(), addr);
		if (!local)
			return refuse(EADDRNOTAVAIL, "no xsrc device has that address");
	}
	const sockaddr_storage saved = id.src;
	id.src = addr;
	if (!id.afonly_set)
		id.afonly = addr.ss_family == AF_INET;  // IPv6 follows bindv6only, which is 0
	if (int err = take_port(id, uid, false)) {
		id.src = saved;
		return err;
	}
	id.local = local;
	id.state = IdState::AddrBound;
	return 0;
}

int State::listen(Id &id, int backlog, uid_t uid)
{
	if (id.state == IdState::Idle)
		if (int err = bind(id, any_address(AF_INET), uid))
			return err;
	if (id.state != IdState::AddrBound)
		return refuse(EINVAL, "listen: not bound");
	// A listener is unique on its port, whatever REUSEADDR says.
	if (id.reuseaddr && id.bound_port)
		if (auto owners = ports.find(*id.bound_port); owners != ports.end())
			if (int err = check_port(id, owners->second, false))
				return err;
	id.backlog = backlog;
	id.state = IdState::Listen;
	return 0;
}

void State::set_route(Id &id, const Local &src, const Gid &dgid, int peer_mtu)
{
	id.local = src;
	id.route = Route{};
	id.route.sgid = src.gid;
	id.route.sgid_index = src.gid_index;
	id.route.dgid = dgid;
	id.route.mtu = std::min(src.device.active_mtu, peer_mtu);
	id.route.tos = id.tos.value_or(0);
}

int State::resolve_addr(Id &id, const sockaddr_storage *src, const sockaddr_storage &dst, uid_t uid,
			std::chrono::milliseconds timeout)
{
	if (id.state == IdState::Idle) {
		int err = src && src->ss_family ? bind(id, *src, uid) : bind(id, any_address(dst.ss_family), uid);
		if (err)
			return err;
	}
	if (id.src.ss_family != dst.ss_family)
		return refuse(EINVAL, "source and destination families differ");
	if (id.state != IdState::AddrBound)
		return refuse(EINVAL, "resolve_addr: not bound");
	id.state = IdState::AddrQuery;
	id.dst = dst;
	bool remote = false;

	const std::vector<CmDevice> devs = devices();
	std::optional<Local> source = id.local;
	std::optional<Gid> dgid;
	int peer_mtu = 5;
	if (is_any(dst) || is_multicast(dst)) {
		if (!source)
			source = first_device(devs, dst.ss_family);
		if (source)
			dgid = is_any(dst) ? source->gid : multicast_gid(dst);
	} else if (auto there = find_local(devs, dst)) {
		if (!source)
			source = there;
		dgid = there->gid;
		peer_mtu = there->device.active_mtu;
		if (is_any(id.src)) {  // the source address is the one the route leaves from
			uint16_t port = port_of(id.src);
			id.src = dst;
			set_port(id.src, port);
		}
	} else if (!is_loopback(dst) && (dst.ss_family == AF_INET || dst.ss_family == AF_INET6)) {
		// Another host's address, routed out of an xsrc device's netdev: the
		// IB CM talks to it over the wire (cm_wire.cpp).
		auto from = route_source(dst);
		std::optional<Local> out = from ? find_local(devs, *from) : std::nullopt;
		if (out) {
			if (!source)
				source = out;
			dgid = gid_of(dst);
			peer_mtu = source->device.active_mtu;
			remote = true;
			if (is_any(id.src)) {
				uint16_t port = port_of(id.src);
				id.src = *from;
				set_port(id.src, port);
			}
		}
	}
	if (!source || !dgid) {
		// No route, or one that leaves from no xsrc device.
		id.state = IdState::AddrBound;
		queue_id_event(id, kEvAddrError, -EHOSTUNREACH);
		return 0;
	}
	set_route(id, *source, *dgid, peer_mtu);
	id.remote = remote;
	if (remote) {
		await_neighbour(id, source->device.netdev.ifindex, std::chrono::steady_clock::now() + timeout);
		return 0;
	}
	id.state = IdState::AddrResolved;
	queue_id_event(id, kEvAddrResolved, 0);
	return 0;
}

void State::await_neighbour(Id &id, int ifindex, std::chrono::steady_clock::time_point deadline)
{
	int32_t error = 0;
	switch (host.cm_neighbour(ifindex, id.dst)) {
	case Neighbour::known:
		id.state = IdState::AddrResolved;
		queue_id_event(id, kEvAddrResolved, 0);
		return;
	case Neighbour::failed:
		error = -EHOSTUNREACH;
		break;
	case Neighbour::pending: {
		auto now = std::chrono::steady_clock::now();
		if (now < deadline) {
			auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
			arm(id, std::min<std::chrono::milliseconds>(kNeighbourPoll, left),
			    [this, ifindex, deadline](Id &self) { await_neighbour(self, ifindex, deadline); });
			return;
		}
		error = -ETIMEDOUT;
		break;
	}
	}
	// As the kernel's addr_handler: back to ADDR_BOUND, ADDR_ERROR.
	id.state = IdState::AddrBound;
	queue_id_event(id, kEvAddrError, error);
}

int State::resolve_route(Id &id)
{
	if (id.state != IdState::AddrResolved)
		return refuse(EINVAL, "resolve_route: address not resolved");
	id.route.tos = id.tos.value_or(0);
	id.route_resolved = true;
	id.state = IdState::RouteResolved;
	queue_id_event(id, kEvRouteResolved, 0);
	return 0;
}

// --- the connection protocol ------------------------------------------------

Id *State::find_listener(uint16_t space, const sockaddr_storage &dst)
{
	auto owners = ports.find({space, port_of(dst)});
	if (owners == ports.end())
		return nullptr;
	Id *wildcard = nullptr;
	for (uint32_t h : owners->second) {
		Id &l = ids.at(h);
		if (l.state != IdState::Listen)
			continue;
		if (same_address(l.src, dst))
			return &l;
		bool family_ok = l.src.ss_family == dst.ss_family || l.src.ss_family == kAfIb ||
				 (l.src.ss_family == AF_INET6 && !l.afonly && dst.ss_family == AF_INET);
		if (is_any(l.src) && family_ok && !wildcard)
			wildcard = &l;
	}
	return wildcard;
}

// A new id on the listener's channel for a request of `from`, as the kernel
// CM makes one for every REQ (or SIDR REQ) a listener gets.
static Id &new_request(State &s, Id &listener, Id &from)
{
	// No context (uid 0) until ACCEPT gives it one: the kernel's ucma drops
	// the events of such an id (see queue_id_event).
	Id &req = s.create_id(listener.channel, 0, listener.ps, listener.qp_type);
	req.state = IdState::Connect;
	req.src = from.dst;
	req.dst = from.src;
	req.tos = listener.tos;
	req.afonly = listener.afonly;
	auto here = find_local(s.devices(), from.dst);
	Local local = here ? *here : *from.local;
	local.gid = from.route.dgid;
	req.local = local;
	req.route = from.route;
	std::swap(req.route.sgid, req.route.dgid);
	req.route.sgid_index = here ? here->gid_index : from.route.sgid_index;
	req.route.tos = listener.tos.value_or(from.route.tos);
	req.route_resolved = true;
	req.psn = from.psn;
	req.peer = from.handle;
	from.peer = req.handle;
	return req;
}

void State::connect_sidr(Id &id, Id *listener)
{
	if (!listener) {
		queue_id_event(id, kEvUnreachable, static_cast<int32_t>(kSidrUnsupported));
		return;
	}
	Id &req = new_request(*this, *listener, id);
	req.cm = CmState::SidrReqRcvd;
	req.theirs = id.mine;
	id.cm = CmState::SidrReqSent;
	Event ev;
	ev.id = listener->handle;
	ev.request = req.handle;
	ev.resp.uid = listener->uid;
	ev.resp.id = req.handle;
	ev.resp.event = kEvConnectRequest;
	auto &ud = ev.resp.param.ud;
	size_t n = std::min(id.mine.private_data.size(), sizeof(ud.private_data));
	std::copy_n(id.mine.private_data.begin(), n, ud.private_data);  // memcpy of an empty vector's data() is UB
	ud.private_data_len = private_len(id, kSidrReqPrivate);
	ud.ah_attr = ah_attr_of(req.route);
	queue(listener->channel, ev);
	arm(id, kReqTimeout, [this](Id &self) {
		if (self.cm != CmState::SidrReqSent)
			return;
		self.cm = CmState::None;
		if (auto p = ids.find(self.peer); p != ids.end() && p->second.peer == self.handle)
			p->second.peer = 0;
		self.peer = 0;
		queue_id_event(self, kEvUnreachable, -ETIMEDOUT);
	});
}

int State::connect(Id &id, ConnParams params)
{
	if (id.remote && !id.local)
		return refuse(ENODEV, "connect: the route's device is gone");
	id.state = IdState::Connect;
	id.active = true;
	id.mine = std::move(params);
	id.psn = rng() & 0xffffff;
	if (id.remote) {  // another host's: REQ (or SIDR REQ) on the wire
		if (id.qp_type == IBV_QPT_UD)
			wire_connect_sidr(id);
		else
			wire_connect(id);
		return 0;
	}
	Id *listener = find_listener(port_space(id), id.dst);
	if (id.qp_type == IBV_QPT_UD) {
		connect_sidr(id, listener);
		return 0;
	}
	if (!listener || listener->backlog <= 0) {
		// No one listens on that port: the REJ a RoCE NIC's CM sends.
		id.cm = CmState::Timewait;
		ConnParams none;
		queue_id_event(id, kEvRejected,
			       static_cast<int32_t>(listener ? kRejConsumerDefined : kRejInvalidServiceId), &none,
			       kRejPrivate);
		return 0;
	}
	Id &req = new_request(*this, *listener, id);
	req.cm = CmState::ReqRcvd;
	req.theirs = id.mine;
	id.cm = CmState::ReqSent;
	listener->backlog--;
	Event ev;
	ev.id = listener->handle;
	ev.request = req.handle;
	ev.resp.uid = listener->uid;
	ev.resp.id = req.handle;
	ev.resp.event = kEvConnectRequest;
	fill_conn(ev.resp.param.conn, swapped(id.mine), private_len(id, kReqPrivate));
	ev.resp.ece = id.mine.ece;
	queue(listener->channel, ev);
	arm(id, kReqTimeout, [this](Id &self) {
		if (self.cm != CmState::ReqSent)
			return;
		teardown(self);  // the requester gives up: REJ (timeout) to the other end
		self.cm = CmState::Timewait;
		queue_id_event(self, kEvUnreachable, -ETIMEDOUT);
	});
	return 0;
}

int State::accept(Id &id, std::optional<ConnParams> params, uint64_t uid)
{
	if (id.state != IdState::Connect)
		return refuse(EINVAL, "accept: not connecting");
	auto it = ids.find(id.peer);
	Id *peer = it == ids.end() ? nullptr : &it->second;
	if (id.qp_type == IBV_QPT_UD) {
		if (id.cm != CmState::SidrReqRcvd)
			return refuse(EINVAL, "accept: no SIDR request");
		ConnParams rep = params.value_or(ConnParams{});
		if (!rep.qkey)
			rep.qkey = kUdpQkey;
		if (params)
			id.uid = uid;
		id.mine = rep;
		id.cm = CmState::None;
		id.peer = 0;
		if (id.remote) {
			wire_accept_sidr(id, rep, 0);
			return 0;
		}
		if (peer && peer->cm == CmState::SidrReqSent) {
			detach_peer(*peer, CmState::None);
			queue_sidr_established(*peer, rep);
		}
		return 0;
	}
	if (params) {  // the passive side's REP
		if (id.cm != CmState::ReqRcvd || (!peer && !id.remote))
			return refuse(EINVAL, "accept: no request to answer");
		id.mine = *params;
		id.uid = uid;
		if (id.remote) {
			wire_accept(id);
			return 0;
		}
		id.cm = CmState::RepSent;
		peer->theirs = *params;
		peer->cm = CmState::RepRcvd;
		peer->timer = 0;
		ConnParams rep = swapped(*params);
		queue_id_event(*peer, kEvConnectResponse, 0, &rep, kRepPrivate);
		arm(id, kRepTimeout, [this](Id &self) {
			if (self.cm != CmState::RepSent)
				return;
			teardown(self);
			self.cm = CmState::Timewait;
			queue_id_event(self, kEvUnreachable, -ETIMEDOUT);
		});
		return 0;
	}
	// The active side's RTU (librdmacm sends ACCEPT without parameters once
	// its QP is ready, or rdma_establish).
	if (id.cm != CmState::RepRcvd)
		return refuse(EINVAL, "accept: no reply to confirm");
	id.cm = CmState::Established;
	if (id.remote) {
		wire_rtu(id);
		return 0;
	}
	if (peer && peer->cm == CmState::RepSent) {
		peer->cm = CmState::Established;
		peer->timer = 0;
		queue_id_event(*peer, kEvEstablished, 0);
	}
	return 0;
}

int State::reject(Id &id, uint8_t reason, std::vector<uint8_t> private_data)
{
	auto it = ids.find(id.peer);
	Id *peer = it == ids.end() ? nullptr : &it->second;
	ConnParams rej;
	rej.private_data = std::move(private_data);
	if (id.cm == CmState::SidrReqRcvd) {
		id.cm = CmState::None;
		id.peer = 0;
		if (id.remote) {
			wire_accept_sidr(id, rej, static_cast<uint8_t>(kSidrReject));
			return 0;
		}
		if (peer && peer->cm == CmState::SidrReqSent) {
			detach_peer(*peer, CmState::None);
			queue_id_event(*peer, kEvUnreachable, static_cast<int32_t>(kSidrReject), &rej,
				       kSidrRepPrivate);
		}
		return 0;
	}
	switch (id.cm) {
	case CmState::ReqSent:
	case CmState::ReqRcvd:
	case CmState::RepSent:
	case CmState::RepRcvd:
		break;
	default:
		return refuse(EINVAL, "reject: nothing to reject");
	}
	if (id.remote) {
		wire_reject(id, reason, rej.private_data);
		detach_peer(id, CmState::Timewait);
		return 0;
	}
	detach_peer(id, CmState::Timewait);
	if (peer && peer->peer == id.handle) {
		detach_peer(*peer, CmState::Timewait);
		queue_id_event(*peer, kEvRejected, reason, &rej, kRejPrivate);
	}
	return 0;
}

// Both ends of a connection that ended: TIMEWAIT_EXIT after the IB CM's time wait.
void State::enter_timewait(Id &id)
{
	id.cm = CmState::Timewait;
	id.peer = 0;
	arm(id, kTimewait, [this](Id &self) {
		if (self.cm == CmState::Timewait)
			queue_id_event(self, kEvTimewaitExit, 0);
	});
}

int State::disconnect(Id &id)
{
	if (id.cm == CmState::None)
		return refuse(EINVAL, "disconnect: never connected");
	if (id.remote) {  // DREQ, or the DREP to the peer's
		if (connected_ish(id.cm) || id.cm == CmState::DreqRcvd)
			wire_disconnect(id);
		return 0;
	}
	auto it = ids.find(id.peer);
	Id *peer = it == ids.end() || it->second.peer != id.handle ? nullptr : &it->second;
	ConnParams none;
	if (connected_ish(id.cm)) {  // DREQ
		id.cm = CmState::DreqSent;
		if (peer && connected_ish(peer->cm)) {
			peer->cm = CmState::DreqRcvd;
			peer->timer = 0;
			peer->state = IdState::Disconnect;
			queue_id_event(*peer, kEvDisconnected, 0, &none, 0);
		}
		if (!peer) {  // nobody to answer: the DREQ times out at once
			id.state = IdState::Disconnect;
			enter_timewait(id);
			queue_id_event(id, kEvDisconnected, -ETIMEDOUT, &none, 0);
			return 0;
		}
		arm(id, kDreqTimeout, [this](Id &self) {
			if (self.cm != CmState::DreqSent)
				return;
			self.state = IdState::Disconnect;
			ConnParams nothing;
			queue_id_event(self, kEvDisconnected, -ETIMEDOUT, &nothing, 0);
			enter_timewait(self);
		});
		return 0;
	}
	if (id.cm == CmState::DreqRcvd) {  // DREP
		enter_timewait(id);
		if (peer && peer->cm == CmState::DreqSent) {
			peer->state = IdState::Disconnect;
			queue_id_event(*peer, kEvDisconnected, 0, &none, 0);
			enter_timewait(*peer);
		}
	}
	return 0;  // anything else: the IB CM has nothing to send, and says nothing
}

int State::notify(Id &id, uint32_t event)
{
	if (id.cm == CmState::None)
		return refuse(EINVAL, "notify: no connection");
	if (event == IBV_EVENT_COMM_EST) {
		if (id.cm == CmState::Established)
			return refuse(EISCONN, "notify: already established");
		if (id.cm != CmState::RepSent)
			return refuse(EINVAL, "notify: no reply sent");
		id.cm = CmState::Established;
		id.timer = 0;
		queue_id_event(id, kEvEstablished, 0);
		return 0;
	}
	if (event == IBV_EVENT_PATH_MIG && id.cm == CmState::Established)
		return 0;  // one path: nothing to migrate to, nothing to do
	return refuse(EINVAL, "notify: event");
}

int State::join(Id &id, const sockaddr_storage &addr, uint16_t flags, uint64_t uid, uint32_t &handle)
{
	if (!id.local)
		return refuse(EINVAL, "join: no device");
	if (id.state != IdState::AddrBound && id.state != IdState::AddrResolved)
		return refuse(EINVAL, "join: neither bound nor resolved");
	if (id.qp_type != IBV_QPT_UD)
		return refuse(EINVAL, "join: not a UD id");
	if (is_any(addr))
		return refuse(EINVAL, "join: wildcard group");
	handle = next_handle++;
	Multicast &mc = mcs[handle];
	mc.handle = handle;
	mc.id = id.handle;
	mc.uid = uid;
	mc.addr = addr;
	mc.join_flags = flags;
	id.mcs.insert(handle);

	Route group = id.route;
	group.sgid = id.local->gid;
	group.sgid_index = id.local->gid_index;
	group.dgid = addr.ss_family == kAfIb ? gid_of(addr) : multicast_gid(addr);
	group.hop_limit = 1;
	Event ev;
	ev.id = id.handle;
	ev.mc = handle;
	ev.resp.uid = uid;
	ev.resp.id = handle;
	ev.resp.event = kEvMulticastJoin;
	ev.resp.param.ud.qp_num = kMulticastQpn;
	ev.resp.param.ud.qkey = kUdpQkey;
	ev.resp.param.ud.ah_attr = ah_attr_of(group);
	queue(id.channel, ev);
	return 0;
}

}  // namespace cm

// --- the service ----------------------------------------------------------

struct CmService::Impl {
	explicit Impl(CmHost &host) : state(host) {}
	cm::State state;
};

CmService::CmService(CmHost &host) : impl_(std::make_unique<Impl>(host)) {}

CmService::~CmService() = default;

void CmService::set_front_end(CmFrontEnd *front_end)
{
	std::lock_guard lock(impl_->state.mu);
	impl_->state.front_end = front_end;
}

void CmService::set_channel_of_fd(ChannelOfFd fn)
{
	std::lock_guard lock(impl_->state.mu);
	impl_->state.channel_of_fd = fn;
}

int CmService::open_channel(uid_t uid, uint64_t &channel)
{
	cm::State &s = impl_->state;
	std::lock_guard lock(s.mu);
	channel = s.next_channel++;
	s.channels[channel].uid = uid;
	return 0;
}

int CmService::open_event_file(uint64_t channel, uid_t uid)
{
	cm::State &s = impl_->state;
	std::lock_guard lock(s.mu);
	auto it = s.channels.find(channel);
	if (it == s.channels.end())
		return ENOENT;
	if (it->second.uid != uid)
		return EACCES;
	it->second.files++;
	return 0;
}

void CmService::release_file(uint64_t channel)
{
	cm::State &s = impl_->state;
	std::lock_guard lock(s.mu);
	auto it = s.channels.find(channel);
	if (it != s.channels.end() && --it->second.files == 0)
		s.destroy_channel(channel);
}

bool CmService::channel_owner(uint64_t channel, uid_t &uid)
{
	cm::State &s = impl_->state;
	std::lock_guard lock(s.mu);
	auto it = s.channels.find(channel);
	if (it == s.channels.end())
		return false;
	uid = it->second.uid;
	return true;
}

bool CmService::readable(uint64_t channel)
{
	cm::State &s = impl_->state;
	std::lock_guard lock(s.mu);
	auto it = s.channels.find(channel);
	return it != s.channels.end() && !it->second.events.empty();
}

void CmService::cancel(uint64_t token)
{
	cm::State &s = impl_->state;
	std::lock_guard lock(s.mu);
	s.cancel(token);
}

void CmService::device_removed(const std::string &name)
{
	cm::State &s = impl_->state;
	std::lock_guard lock(s.mu);
	for (auto &[handle, id] : s.ids) {
		if (!id.local || id.local->device.name != name)
			continue;
		id.local.reset();
		s.queue_id_event(id, cm::kEvDeviceRemoval, 0);
	}
}

void CmService::wire_receive(int ifindex, std::span<const uint8_t> ip_packet)
{
	cm::State &s = impl_->state;
	std::lock_guard lock(s.mu);
	s.wire_receive(ifindex, ip_packet);
}

std::string CmService::wire_status()
{
	cm::State &s = impl_->state;
	std::lock_guard lock(s.mu);
	const auto &c = s.counters;
	return " cm_mads_sent=" + std::to_string(c.mads_sent) + " cm_mads_resent=" + std::to_string(c.mads_resent) +
	       " cm_mads_received=" + std::to_string(c.mads_received) +
	       " cm_mads_duplicate=" + std::to_string(c.mads_duplicate) + " cm_mads_bad=" + std::to_string(c.mads_bad);
}

size_t CmService::object_count()
{
	cm::State &s = impl_->state;
	std::lock_guard lock(s.mu);
	return s.channels.size() + s.ids.size() + s.mcs.size();
}

size_t CmService::listener_count()
{
	cm::State &s = impl_->state;
	std::lock_guard lock(s.mu);
	return static_cast<size_t>(std::count_if(s.ids.begin(), s.ids.end(), [](const auto &entry) {
		return entry.second.state == cm::IdState::Listen;
	}));
}

int CmService::execute(uint64_t channel, Caller &caller, std::unique_ptr<Caller> held_caller,
		       std::span<const std::byte> command, bool nonblock, uint64_t token)
{
	rdma_ucm_cmd_hdr hdr{};
	if (command.size() < sizeof(hdr))
		return EINVAL;
	std::memcpy(&hdr, command.data(), sizeof(hdr));
	if (hdr.in + sizeof(hdr) > command.size())
		return EINVAL;
	cm::CommandHandler handler = cm::command_handler(hdr.cmd);
	if (hdr.cmd > RDMA_USER_CM_CMD_JOIN_MCAST)
		return EINVAL;
	if (!handler)
		return ENOSYS;
	cm::Command cmd{hdr.cmd, command.subspan(sizeof(hdr), hdr.in), hdr.out, nonblock, token};
	cm::State &s = impl_->state;
	std::lock_guard lock(s.mu);
	if (!s.channels.count(channel))
		return EBADF;
	detail::refusal_reason = nullptr;
	int err = handler(s, channel, caller, held_caller, cmd);
	if (err > 0 && debug_enabled())
		debug_log("xsrcd: cm channel %llu (pid %d): %s refused: %s (%d): %s",
			  static_cast<unsigned long long>(channel), caller.pid(), cm::command_name(hdr.cmd),
			  strerror(err), err, detail::refusal_reason ? detail::refusal_reason : "no reason given");
	return err;
}

}  // namespace xsrc
