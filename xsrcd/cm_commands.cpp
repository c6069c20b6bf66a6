// The rdma_cm commands: each one decoded and checked as the kernel's ucma
// checks it (the same errno for the same mistake), then handed to the state.
#include <arpa/inet.h>
#include <endian.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "cm_state.h"
#include "log.h"

namespace xsrc::cm {
namespace {

constexpr size_t kMaxOptionLength = 1 << 20;
constexpr uint8_t kLocalAckTimeout = 17;  // the kernel CM's RoCE packet life time, plus one

// The command struct, zero-extended when an older caller sent less.
template <typename T>
T load(const Command &c)
{
	T v{};
	std::memcpy(&v, c.in.data(), std::min(sizeof(T), c.in.size()));
	return v;
}

template <typename T>
int respond(Caller &caller, uint64_t addr, const T &resp, size_t out_len)
{
	size_t n = std::min(out_len, sizeof(T));
	return caller.write_memory(addr, std::span(reinterpret_cast<const std::byte *>(&resp), n)) ? EFAULT : 0;
}

sockaddr_storage storage_of(const void *addr, size_t size)
{
	sockaddr_storage s{};
	std::memcpy(&s, addr, std::min(size, sizeof(s)));
	return s;
}

// An id that must be on a device already (the kernel's ucma_get_ctx_dev).
int find_on_device(State &s, uint64_t channel, uint32_t handle, Id *&id)
{
	if (int err = s.find(channel, handle, id))
		return err;
	return id->local ? 0 : refuse(EINVAL, "cm id has no device yet");
}

uid_t channel_uid(State &s, uint64_t channel)
{
	return s.channels.at(channel).uid;
}

ConnParams params_of(const rdma_ucm_conn_param &p)
{
	ConnParams c;
	c.qp_num = p.qp_num & 0xffffff;
	c.qkey = p.qkey;
	c.srq = p.srq;
	c.responder_resources = p.responder_resources;
	c.initiator_depth = p.initiator_depth;
	c.flow_control = p.flow_control;
	c.retry_count = p.retry_count;
	c.rnr_retry_count = p.rnr_retry_count;
	c.private_data.assign(p.private_data, p.private_data + p.private_data_len);
	return c;
}

uint64_t service_id(const State &s, const Id &id, const sockaddr_storage &addr)
{
	return (static_cast<uint64_t>(s.port_space(id)) << 16) | port_of(addr);
}

size_t copy_address(void *out, size_t room, const sockaddr_storage &addr)
{
	size_t n = std::min(address_size(addr.ss_family), room);
	std::memcpy(out, &addr, n);
	return n;
}

int cmd_create_id(State &s, uint64_t channel, Caller &caller, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_create_id>(c);
	rdma_ucm_create_id_resp resp{};
	if (c.out_len < sizeof(resp))
		return refuse(ENOSPC, "no room for the response");
	uint8_t qp_type;
	switch (cmd.ps) {
	case RDMA_PS_TCP: qp_type = IBV_QPT_RC; break;
	case RDMA_PS_UDP:
	case RDMA_PS_IPOIB: qp_type = IBV_QPT_UD; break;
	case RDMA_PS_IB: qp_type = cmd.qp_type; break;
	default: return refuse(EINVAL, "port space");
	}
	Id &id = s.create_id(channel, cmd.uid, cmd.ps, qp_type);
	resp.id = id.handle;
	if (int err = respond(caller, cmd.response, resp, c.out_len)) {
		s.destroy_id(id.handle);
		return err;
	}
	return 0;
}

int cmd_destroy_id(State &s, uint64_t channel, Caller &caller, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_destroy_id>(c);
	rdma_ucm_destroy_id_resp resp{};
	if (c.out_len < sizeof(resp))
		return refuse(ENOSPC, "no room for the response");
	Id *id;
	if (int err = s.find(channel, cmd.id, id))
		return err;
	resp.events_reported = s.destroy_id(cmd.id);
	return respond(caller, cmd.response, resp, c.out_len);
}

int bind_common(State &s, uint64_t channel, uint32_t handle, const sockaddr_storage &addr)
{
	Id *id;
	if (int err = s.find(channel, handle, id))
		return err;
	if (id->state != IdState::Idle)
		return refuse(EINVAL, "bind: already bound");
	return s.bind(*id, addr, channel_uid(s, channel));
}

int cmd_bind_ip(State &s, uint64_t channel, Caller &, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_bind_ip>(c);
	sockaddr_storage addr = storage_of(&cmd.addr, sizeof(cmd.addr));
	if (addr.ss_family != AF_INET && addr.ss_family != AF_INET6)
		return refuse(EINVAL, "address family");
	return bind_common(s, channel, cmd.id, addr);
}

int cmd_bind(State &s, uint64_t channel, Caller &, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_bind>(c);
	sockaddr_storage addr = storage_of(&cmd.addr, sizeof(cmd.addr));
	if (cmd.reserved || !cmd.addr_size || !checked_address_size(addr, cmd.addr_size))
		return refuse(EINVAL, "address size");
	return bind_common(s, channel, cmd.id, addr);
}

int resolve_common(State &s, uint64_t channel, uint32_t handle, const sockaddr_storage *src,
		   const sockaddr_storage &dst, uint32_t timeout_ms)
{
	Id *id;
	if (int err = s.find(channel, handle, id))
		return err;
	return s.resolve_addr(*id, src, dst, channel_uid(s, channel), std::chrono::milliseconds(timeout_ms));
}

int cmd_resolve_ip(State &s, uint64_t channel, Caller &, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_resolve_ip>(c);
	sockaddr_storage src = storage_of(&cmd.src_addr, sizeof(cmd.src_addr));
	sockaddr_storage dst = storage_of(&cmd.dst_addr, sizeof(cmd.dst_addr));
	auto ip = [](const sockaddr_storage &a) { return a.ss_family == AF_INET || a.ss_family == AF_INET6; };
	if ((src.ss_family && !ip(src)) || !ip(dst))
		return refuse(EINVAL, "address family");
	return resolve_common(s, channel, cmd.id, src.ss_family ? &src : nullptr, dst, cmd.timeout_ms);
}

int cmd_resolve_addr(State &s, uint64_t channel, Caller &, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_resolve_addr>(c);
	sockaddr_storage src = storage_of(&cmd.src_addr, sizeof(cmd.src_addr));
	sockaddr_storage dst = storage_of(&cmd.dst_addr, sizeof(cmd.dst_addr));
	if (cmd.reserved || (cmd.src_size && !checked_address_size(src, cmd.src_size)) || !cmd.dst_size ||
	    !checked_address_size(dst, cmd.dst_size))
		return refuse(EINVAL, "address size");
	return resolve_common(s, channel, cmd.id, cmd.src_size ? &src : nullptr, dst, cmd.timeout_ms);
}

int cmd_resolve_route(State &s, uint64_t channel, Caller &, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_resolve_route>(c);
	Id *id;
	if (int err = find_on_device(s, channel, cmd.id, id))
		return err;
	return s.resolve_route(*id);
}

// The GIDs of an id's route, or of its address before there is one.
std::pair<Gid, Gid> route_gids(const Id &id)
{
	if (id.state >= IdState::AddrResolved && id.state != IdState::Listen)
		return {id.route.sgid, id.route.dgid};
	return {id.local ? id.local->gid : Gid{}, gid_of(id.dst)};
}

int cmd_query_route(State &s, uint64_t channel, Caller &caller, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_query>(c);
	if (c.out_len < offsetof(rdma_ucm_query_route_resp, ibdev_index))
		return refuse(ENOSPC, "no room for the response");
	Id *id;
	if (int err = s.find(channel, cmd.id, id))
		return err;
	rdma_ucm_query_route_resp resp{};
	copy_address(&resp.src_addr, sizeof(resp.src_addr), id->src);
	copy_address(&resp.dst_addr, sizeof(resp.dst_addr), id->dst);
	if (id->local) {
		resp.node_guid = htobe64(id->local->device.node_guid);
		resp.ibdev_index = id->local->device.index;
		resp.port_num = 1;
		auto [sgid, dgid] = route_gids(*id);
		resp.num_paths = id->route_resolved ? 1 : 0;
		Route r = id->route;
		r.sgid = sgid;
		r.dgid = dgid;
		resp.ib_route[0] = user_path_record(r);
	}
	return respond(caller, cmd.response, resp, c.out_len);
}

int query_addr(State &s, const Id &id, Caller &caller, uint64_t response, size_t out_len)
{
	if (out_len < offsetof(rdma_ucm_query_addr_resp, ibdev_index))
		return refuse(ENOSPC, "no room for the response");
	rdma_ucm_query_addr_resp resp{};
	resp.src_size = static_cast<uint16_t>(copy_address(&resp.src_addr, sizeof(resp.src_addr), id.src));
	resp.dst_size = static_cast<uint16_t>(copy_address(&resp.dst_addr, sizeof(resp.dst_addr), id.dst));
	if (id.local) {
		resp.node_guid = htobe64(id.local->device.node_guid);
		resp.ibdev_index = id.local->device.index;
		resp.port_num = 1;
		resp.pkey = 0xffff;
	}
	(void)s;
	return respond(caller, response, resp, out_len);
}

int query_gid(State &s, const Id &id, Caller &caller, uint64_t response, size_t out_len)
{
	if (out_len < offsetof(rdma_ucm_query_addr_resp, ibdev_index))
		return refuse(ENOSPC, "no room for the response");
	rdma_ucm_query_addr_resp resp{};
	if (id.local) {
		resp.node_guid = htobe64(id.local->device.node_guid);
		resp.ibdev_index = id.local->device.index;
		resp.port_num = 1;
		resp.pkey = 0xffff;
		auto [sgid, dgid] = route_gids(id);
		auto fill = [&](void *out, const Gid &gid, const sockaddr_storage &addr) {
			SockaddrIb sib{};
			sib.sib_family = kAfIb;
			sib.sib_pkey = htons(0xffff);
			std::memcpy(sib.sib_addr, gid.raw.data(), 16);
			sib.sib_sid = htobe64(service_id(s, id, addr));
			sib.sib_sid_mask = htobe64(~0ull);
			std::memcpy(out, &sib, sizeof(sib));
		};
		fill(&resp.src_addr, sgid, id.src);
		fill(&resp.dst_addr, dgid, id.dst);
		resp.src_size = resp.dst_size = sizeof(SockaddrIb);
	}
	return respond(caller, response, resp, out_len);
}

int query_path(State &s, const Id &id, Caller &caller, uint64_t response, size_t out_len)
{
	// struct rdma_ucm_query_path_resp and room for the one path there is.
	std::array<std::byte, sizeof(rdma_ucm_query_path_resp) + sizeof(ib_path_rec_data)> resp{};
	if (out_len < resp.size())
		return refuse(ENOSPC, "no room for the response");
	rdma_ucm_query_path_resp head{};
	size_t n = sizeof(head);
	if (id.route_resolved) {
		head.num_paths = 1;
		ib_path_rec_data path = wire_path_record(id.route, service_id(s, id, id.dst));
		std::memcpy(resp.data() + sizeof(head), &path, sizeof(path));
		n = resp.size();
	}
	std::memcpy(resp.data(), &head, sizeof(head));
	return caller.write_memory(response, std::span(resp.data(), n)) ? EFAULT : 0;
}

int cmd_query(State &s, uint64_t channel, Caller &caller, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_query>(c);
	Id *id;
	if (int err = s.find(channel, cmd.id, id))
		return err;
	switch (cmd.option) {
	case RDMA_USER_CM_QUERY_ADDR: return query_addr(s, *id, caller, cmd.response, c.out_len);
	case RDMA_USER_CM_QUERY_PATH: return query_path(s, *id, caller, cmd.response, c.out_len);
	case RDMA_USER_CM_QUERY_GID: return query_gid(s, *id, caller, cmd.response, c.out_len);
	default: return refuse(ENOSYS, "query option");
	}
}

uint8_t req_private_room(const Id &id)
{
	uint8_t size = id.qp_type == IBV_QPT_UD ? kSidrReqPrivate : kReqPrivate;
	return id.src.ss_family == kAfIb ? size : static_cast<uint8_t>(size - kIpCmHeader);
}

int cmd_connect(State &s, uint64_t channel, Caller &, std::unique_ptr<Caller> &, const Command &c)
{
	if (c.in.size() < offsetof(rdma_ucm_connect, reserved) + sizeof(uint32_t))
		return refuse(EINVAL, "short command");
	auto cmd = load<rdma_ucm_connect>(c);
	if (!cmd.conn_param.valid)
		return refuse(EINVAL, "connect without parameters");
	Id *id;
	if (int err = find_on_device(s, channel, cmd.id, id))
		return err;
	if (id->state != IdState::RouteResolved)
		return refuse(EINVAL, "connect: route not resolved");
	if (cmd.conn_param.private_data_len > req_private_room(*id))
		return refuse(EINVAL, "connect: private data too long");
	ConnParams p = params_of(cmd.conn_param);
	p.ece = cmd.ece;
	return s.connect(*id, std::move(p));
}

int cmd_listen(State &s, uint64_t channel, Caller &, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_listen>(c);
	Id *id;
	if (int err = s.find(channel, cmd.id, id))
		return err;
	int backlog = cmd.backlog > 0 && cmd.backlog < static_cast<uint32_t>(kMaxBacklog)
			      ? static_cast<int>(cmd.backlog) : kMaxBacklog;
	return s.listen(*id, backlog, channel_uid(s, channel));
}

int cmd_accept(State &s, uint64_t channel, Caller &, std::unique_ptr<Caller> &, const Command &c)
{
	if (c.in.size() < offsetof(rdma_ucm_accept, reserved) + sizeof(uint32_t))
		return refuse(EINVAL, "short command");
	auto cmd = load<rdma_ucm_accept>(c);
	Id *id;
	if (int err = find_on_device(s, channel, cmd.id, id))
		return err;
	if (!cmd.conn_param.valid)
		return s.accept(*id, std::nullopt, 0);
	uint8_t room = id->qp_type == IBV_QPT_UD ? kSidrRepPrivate : kRepPrivate;
	if (cmd.conn_param.private_data_len > room)
		return refuse(EINVAL, "accept: private data too long");
	ConnParams p = params_of(cmd.conn_param);
	p.ece = cmd.ece;
	return s.accept(*id, std::move(p), cmd.uid);
}

int cmd_reject(State &s, uint64_t channel, Caller &, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_reject>(c);
	uint8_t reason = cmd.reason ? cmd.reason : kRejConsumerDefined;
	if (reason != kRejConsumerDefined && reason != kRejVendorOptionNotSupported)
		return refuse(EINVAL, "reject: reason");
	Id *id;
	if (int err = find_on_device(s, channel, cmd.id, id))
		return err;
	if (cmd.private_data_len > kRejPrivate)
		return refuse(EINVAL, "reject: private data too long");
	return s.reject(*id, reason, std::vector<uint8_t>(cmd.private_data, cmd.private_data + cmd.private_data_len));
}

int cmd_disconnect(State &s, uint64_t channel, Caller &, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_disconnect>(c);
	Id *id;
	if (int err = find_on_device(s, channel, cmd.id, id))
		return err;
	return s.disconnect(*id);
}

// The local responder resources and initiator depth of a connection: the
// other end's offer (swapped) until this end answered or was answered, then
// its own ACCEPT's (passive) or the REP's (active), as the IB CM keeps them.
std::pair<uint8_t, uint8_t> rd_atomic(const Id &id)
{
	if (id.active && (id.cm == CmState::ReqSent || id.cm == CmState::None))
		return {id.mine.responder_resources, id.mine.initiator_depth};
	bool answered = id.active || id.cm != CmState::ReqRcvd;
	if (id.active == answered)
		return {id.theirs.initiator_depth, id.theirs.responder_resources};
	return {id.mine.responder_resources, id.mine.initiator_depth};
}

int init_qp_attr(const Id &id, uint32_t state, ib_uverbs_qp_attr &a)
{
	a.qp_state = state;
	a.port_num = 1;
	a.pkey_index = 0;
	const bool ud = id.qp_type == IBV_QPT_UD;
	const bool rc = id.qp_type == IBV_QPT_RC || id.qp_type == IBV_QPT_XRC_SEND || id.qp_type == IBV_QPT_XRC_RECV;
	auto [rr, depth] = rd_atomic(id);
	if (ud || state == IBV_QPS_INIT) {
		a.qp_attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
		if (ud) {
			a.qkey = id.mine.qkey ? id.mine.qkey : kUdpQkey;
			a.qp_attr_mask |= IBV_QP_QKEY;
		} else {
			a.qp_attr_mask |= IBV_QP_ACCESS_FLAGS;
			if (id.cm != CmState::None)
				a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						    (rr ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC : 0);
		}
		return 0;
	}
	switch (id.cm) {
	case CmState::ReqRcvd:
	case CmState::RepSent:
	case CmState::RepRcvd:
	case CmState::Established:
		break;
	default:
		return refuse(EINVAL, "init_qp_attr: no connection to take attributes from");
	}
	if (state == IBV_QPS_RTR) {
		a.qp_attr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
		a.ah_attr = ah_attr_of(id.route);
		a.path_mtu = static_cast<uint32_t>(id.route.mtu);
		a.dest_qp_num = id.theirs.qp_num;
		a.rq_psn = id.remote ? id.peer_psn : id.psn;  // the peer's send PSN
		if (rc) {
			a.qp_attr_mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
			a.max_dest_rd_atomic = rr;
			a.min_rnr_timer = 0;
		}
		return 0;
	}
	if (state == IBV_QPS_RTS) {
		a.qp_attr_mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
		a.sq_psn = id.psn;
		if (id.qp_type == IBV_QPT_RC || id.qp_type == IBV_QPT_XRC_SEND) {
			// The REQ's retry count on both sides; the RNR retry count the other end asked for.
			a.qp_attr_mask |= IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
			a.retry_cnt = id.active ? id.mine.retry_count : id.theirs.retry_count;
			a.rnr_retry = id.theirs.rnr_retry_count;
			a.max_rd_atomic = depth;
		}
		if (rc) {
			a.qp_attr_mask |= IBV_QP_TIMEOUT;
			a.timeout = id.ack_timeout.value_or(kLocalAckTimeout);
		}
		return 0;
	}
	return refuse(EINVAL, "init_qp_attr: state");
}

int cmd_init_qp_attr(State &s, uint64_t channel, Caller &caller, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_init_qp_attr>(c);
	ib_uverbs_qp_attr resp{};
	if (c.out_len < sizeof(resp))
		return refuse(ENOSPC, "no room for the response");
	if (cmd.qp_state > IBV_QPS_ERR)
		return refuse(EINVAL, "qp_state");
	Id *id;
	if (int err = find_on_device(s, channel, cmd.id, id))
		return err;
	if (int err = init_qp_attr(*id, cmd.qp_state, resp))
		return err;
	return respond(caller, cmd.response, resp, c.out_len);
}

int cmd_get_event(State &s, uint64_t channel, Caller &caller, std::unique_ptr<Caller> &held, const Command &c)
{
	auto cmd = load<rdma_ucm_get_event>(c);
	if (c.out_len < offsetof(rdma_ucm_event_resp, reserved))
		return refuse(ENOSPC, "no room for the event");
	Channel &ch = s.channels.at(channel);
	if (!ch.events.empty())
		return s.take(ch, caller, cmd.response, c.out_len);
	if (c.nonblock)
		return EAGAIN;
	if (!held)
		return refuse(EAGAIN, "this caller cannot wait");
	ch.waiters.push_back(Waiter{c.token, std::move(held), cmd.response, c.out_len});
	return CmService::kHeld;
}

int set_id_option(Id &id, uint32_t name, std::span<const std::byte> val)
{
	auto int_value = [&](int &out) {
		if (val.size() != sizeof(int))
			return refuse(EINVAL, "option length");
		std::memcpy(&out, val.data(), sizeof(int));
		return 0;
	};
	int v = 0;
	switch (name) {
	case RDMA_OPTION_ID_TOS:
		if (val.size() != 1)
			return refuse(EINVAL, "option length");
		id.tos = static_cast<uint8_t>(val[0]);
		return 0;
	case RDMA_OPTION_ID_REUSEADDR:
		if (int err = int_value(v))
			return err;
		if (!((v && id.state != IdState::Listen) || id.state == IdState::Idle))
			return refuse(EINVAL, "reuseaddr: state");
		id.reuseaddr = v != 0;
		return 0;
	case RDMA_OPTION_ID_AFONLY:
		if (int err = int_value(v))
			return err;
		if (id.state != IdState::Idle && id.state != IdState::AddrBound)
			return refuse(EINVAL, "afonly: state");
		id.afonly = v != 0;
		id.afonly_set = true;
		return 0;
	case RDMA_OPTION_ID_ACK_TIMEOUT:
		if (val.size() != 1)
			return refuse(EINVAL, "option length");
		if (id.qp_type != IBV_QPT_RC && id.qp_type != IBV_QPT_XRC_SEND)
			return refuse(EINVAL, "ack timeout: not RC");
		id.ack_timeout = std::min<uint8_t>(static_cast<uint8_t>(val[0]), 31);
		return 0;
	default:
		return refuse(ENOSYS, "option name");
	}
}

int set_ib_path(State &s, Id &id, std::span<const std::byte> val)
{
	if (val.empty() || val.size() % sizeof(ib_path_rec_data))
		return refuse(EINVAL, "path records length");
	bool primary = false;
	for (size_t off = 0; off < val.size(); off += sizeof(ib_path_rec_data)) {
		ib_path_rec_data d;
		std::memcpy(&d, val.data() + off, sizeof(d));
		primary |= d.flags == (IB_PATH_GMP | IB_PATH_PRIMARY | IB_PATH_BIDIRECTIONAL);
	}
	if (!primary)
		return refuse(EINVAL, "no primary bidirectional path");
	if (!id.local)
		return refuse(EINVAL, "cm id has no device yet");
	if (id.state != IdState::AddrResolved)
		return refuse(EINVAL, "path: address not resolved");
	// The device has one path to anywhere: the record only confirms it.
	return s.resolve_route(id);
}

int cmd_set_option(State &s, uint64_t channel, Caller &caller, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_set_option>(c);
	if (cmd.optlen > kMaxOptionLength)
		return refuse(EINVAL, "option length");
	std::vector<std::byte> val(cmd.optlen);
	if (caller.read_memory(cmd.optval, val))
		return refuse(EFAULT, "option value unreadable");
	Id *id;
	if (int err = s.find(channel, cmd.id, id))
		return err;
	if (cmd.level == RDMA_OPTION_ID)
		return set_id_option(*id, cmd.optname, val);
	if (cmd.level == RDMA_OPTION_IB) {
		if (cmd.optname != RDMA_OPTION_IB_PATH)
			return refuse(ENOSYS, "option name");
		return set_ib_path(s, *id, val);
	}
	return refuse(ENOSYS, "option level");
}

int cmd_notify(State &s, uint64_t channel, Caller &, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_notify>(c);
	Id *id;
	if (int err = s.find(channel, cmd.id, id))
		return err;
	if (!id->local)
		return refuse(EINVAL, "cm id has no device yet");
	return s.notify(*id, cmd.event);
}

int join_common(State &s, uint64_t channel, Caller &caller, const rdma_ucm_join_mcast &cmd, size_t out_len)
{
	rdma_ucm_create_id_resp resp{};
	if (out_len < sizeof(resp))
		return refuse(ENOSPC, "no room for the response");
	if (cmd.join_flags != RDMA_MC_JOIN_FLAG_FULLMEMBER && cmd.join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER)
		return refuse(EINVAL, "join flags");
	Id *id;
	if (int err = find_on_device(s, channel, cmd.id, id))
		return err;
	sockaddr_storage addr = storage_of(&cmd.addr, sizeof(cmd.addr));
	if (int err = s.join(*id, addr, cmd.join_flags, cmd.uid, resp.id))
		return err;
	if (int err = respond(caller, cmd.response, resp, out_len)) {
		s.leave(resp.id);
		return err;
	}
	return 0;
}

int cmd_join_ip_mcast(State &s, uint64_t channel, Caller &caller, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_join_ip_mcast>(c);
	rdma_ucm_join_mcast join{};
	join.response = cmd.response;
	join.uid = cmd.uid;
	join.id = cmd.id;
	sockaddr_storage addr = storage_of(&cmd.addr, sizeof(cmd.addr));
	if (addr.ss_family != AF_INET && addr.ss_family != AF_INET6)
		return refuse(EINVAL, "address family");
	join.addr_size = static_cast<uint16_t>(address_size(addr.ss_family));
	join.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
	std::memcpy(&join.addr, &addr, join.addr_size);
	return join_common(s, channel, caller, join, c.out_len);
}

int cmd_join_mcast(State &s, uint64_t channel, Caller &caller, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_join_mcast>(c);
	sockaddr_storage addr = storage_of(&cmd.addr, sizeof(cmd.addr));
	if (!checked_address_size(addr, cmd.addr_size))
		return refuse(EINVAL, "address size");
	return join_common(s, channel, caller, cmd, c.out_len);
}

int cmd_leave_mcast(State &s, uint64_t channel, Caller &caller, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_destroy_id>(c);
	rdma_ucm_destroy_id_resp resp{};
	if (c.out_len < sizeof(resp))
		return refuse(ENOSPC, "no room for the response");
	auto mc = s.mcs.find(cmd.id);
	if (mc == s.mcs.end())
		return refuse(ENOENT, "no such multicast join");
	auto id = s.ids.find(mc->second.id);
	if (id == s.ids.end() || id->second.channel != channel)
		return refuse(EINVAL, "multicast join of another channel");
	resp.events_reported = mc->second.events_reported;
	s.leave(cmd.id);
	return respond(caller, cmd.response, resp, c.out_len);
}

int cmd_migrate_id(State &s, uint64_t channel, Caller &caller, std::unique_ptr<Caller> &, const Command &c)
{
	auto cmd = load<rdma_ucm_migrate_id>(c);
	rdma_ucm_migrate_resp resp{};
	int fd = caller.take_fd(static_cast<int>(cmd.fd));
	if (fd < 0)
		return refuse(ENOENT, "migrate: no such fd");
	uint64_t from = s.channel_of_fd ? s.channel_of_fd(fd) : 0;
	::close(fd);
	if (!from || !s.channels.count(from))
		return refuse(EINVAL, "migrate: not an rdma_cm file");
	Id *id;
	if (int err = s.find(from, cmd.id, id))
		return err;
	if (from != channel) {
		Channel &old_ch = s.channels.at(from);
		old_ch.ids.erase(id->handle);
		s.channels.at(channel).ids.insert(id->handle);
		id->channel = channel;
		std::vector<Event> moving;
		std::erase_if(old_ch.events, [&](const Event &ev) {
			if (ev.id != id->handle)
				return false;
			moving.push_back(ev);
			return true;
		});
		for (const Event &ev : moving)
			s.queue(channel, ev);
	}
	resp.events_reported = id->events_reported;
	return respond(caller, cmd.response, resp, sizeof(resp));
}

struct Entry {
	const char *name;
	CommandHandler handler;
};

// Filled by index (clang rejects C99 array designators in C++).
constexpr auto kCommands = [] {
	std::array<Entry, RDMA_USER_CM_CMD_JOIN_MCAST + 1> t{};
	t[RDMA_USER_CM_CMD_CREATE_ID] = {"CREATE_ID", cmd_create_id};
	t[RDMA_USER_CM_CMD_DESTROY_ID] = {"DESTROY_ID", cmd_destroy_id};
	t[RDMA_USER_CM_CMD_BIND_IP] = {"BIND_IP", cmd_bind_ip};
	t[RDMA_USER_CM_CMD_RESOLVE_IP] = {"RESOLVE_IP", cmd_resolve_ip};
	t[RDMA_USER_CM_CMD_RESOLVE_ROUTE] = {"RESOLVE_ROUTE", cmd_resolve_route};
	t[RDMA_USER_CM_CMD_QUERY_ROUTE] = {"QUERY_ROUTE", cmd_query_route};
	t[RDMA_USER_CM_CMD_CONNECT] = {"CONNECT", cmd_connect};
	t[RDMA_USER_CM_CMD_LISTEN] = {"LISTEN", cmd_listen};
	t[RDMA_USER_CM_CMD_ACCEPT] = {"ACCEPT", cmd_accept};
	t[RDMA_USER_CM_CMD_REJECT] = {"REJECT", cmd_reject};
	t[RDMA_USER_CM_CMD_DISCONNECT] = {"DISCONNECT", cmd_disconnect};
	t[RDMA_USER_CM_CMD_INIT_QP_ATTR] = {"INIT_QP_ATTR", cmd_init_qp_attr};
	t[RDMA_USER_CM_CMD_GET_EVENT] = {"GET_EVENT", cmd_get_event};
	t[RDMA_USER_CM_CMD_GET_OPTION] = {"GET_OPTION", nullptr};  // the kernel has none either: ENOSYS
	t[RDMA_USER_CM_CMD_SET_OPTION] = {"SET_OPTION", cmd_set_option};
	t[RDMA_USER_CM_CMD_NOTIFY] = {"NOTIFY", cmd_notify};
	t[RDMA_USER_CM_CMD_JOIN_IP_MCAST] = {"JOIN_IP_MCAST", cmd_join_ip_mcast};
	t[RDMA_USER_CM_CMD_LEAVE_MCAST] = {"LEAVE_MCAST", cmd_leave_mcast};
	t[RDMA_USER_CM_CMD_MIGRATE_ID] = {"MIGRATE_ID", cmd_migrate_id};
	t[RDMA_USER_CM_CMD_QUERY] = {"QUERY", cmd_query};
	t[RDMA_USER_CM_CMD_BIND] = {"BIND", cmd_bind};
	t[RDMA_USER_CM_CMD_RESOLVE_ADDR] = {"RESOLVE_ADDR", cmd_resolve_addr};
	t[RDMA_USER_CM_CMD_JOIN_MCAST] = {"JOIN_MCAST", cmd_join_mcast};
	return t;
}();

}  // namespace

CommandHandler command_handler(uint32_t cmd)
{
	return cmd < std::size(kCommands) ? kCommands[cmd].handler : nullptr;
}

const char *command_name(uint32_t cmd)
{
	return cmd < std::size(kCommands) ? kCommands[cmd].name : "unknown";
}

}  // namespace xsrc::cm
