// Connection set-up by socket address over TCP (see cm.h for the protocol and the API flow).
#include "cm.h"

#include <ucs/debug/log_def.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace xsrc::uct {
namespace {

// --- Wire ---------------------------------------------------------------------------------
enum class FrameType : uint8_t { conn_req = 1, accept = 2, reject = 3, notify = 4, disconnect = 5 };

struct FrameHdr {
	uint32_t magic;
	uint8_t type;  // FrameType
	uint8_t version;
	uint16_t dev_addr_len;
	uint16_t ep_addr_len;
	uint16_t priv_len;
	uint32_t reserved;
};
static_assert(sizeof(FrameHdr) == 16);
inline constexpr uint32_t frame_magic = 0x7873636d;  // "xscm"
inline constexpr uint8_t frame_version = 1;
inline constexpr size_t max_conn_priv = 1024;
inline constexpr size_t max_addr_len = 1024;

// --- State ----------------------------------------------------------------------------------
enum class Role : uint8_t { client, server };

enum class ConnState : uint8_t {
	tcp_connecting,    // client: non-blocking connect in progress
	resolved,          // client with cm_resolve_cb: waiting for uct_ep_connect
	requested,         // client: CONN_REQ sent, waiting for ACCEPT / REJECT
	awaiting_request,  // server: TCP accepted, waiting for CONN_REQ
	pending_decision,  // server: conn_request_cb called, neither accepted nor rejected yet
	accepted,          // server: ACCEPT sent, waiting for NOTIFY; client: ACCEPT received
	connected,         // client: NOTIFY sent; server: NOTIFY received
	failed,            // rejected, reset or broken: only ep_destroy is left
};

struct CmState;

struct Conn {
	CmState *cm = nullptr;
	Role role = Role::client;
	ConnState state = ConnState::tcp_connecting;
	int fd = -1;
	std::string in, out;
	bool close_after_flush = false;
	bool dead = false;  // to be freed by the next sweep
	Ep *ep = nullptr;
	bool ep_owned = false;  // server: accepted, not yet handed to the user by ep_create
	// The user's callbacks (ep params).
	void *user_data = nullptr;
	uct_cm_ep_client_connect_callback_t client_cb = nullptr;
	uct_cm_ep_server_conn_notify_callback_t server_cb = nullptr;
	uct_ep_disconnect_cb_t disconnect_cb = nullptr;
	uct_cm_ep_priv_data_pack_callback_t pack_cb = nullptr;
	uct_cm_ep_resolve_callback_t resolve_cb = nullptr;
	// Connection and disconnection progress.
	bool up = false;           // client: connect cb said UCS_OK; server: NOTIFY arrived
	bool local_disc = false;   // we sent DISCONNECT
	bool remote_disc = false;  // the peer sent DISCONNECT (or went away) and we told the user
	// Server: the client's request.
	std::string peer_dev_addr, peer_ep_addr, peer_priv;
};

struct CmState {
	Iface *iface = nullptr;
	int listen_fd = -1;
	sockaddr_storage listen_addr{};
	uct_sockaddr_conn_request_callback_t conn_request_cb = nullptr;
	void *conn_request_arg = nullptr;
	std::vector<std::unique_ptr<Conn>> conns;
	std::string dev_addr;
	size_t ep_addr_len = 0;
	char dev_name[UCT_DEVICE_NAME_MAX]{};
	unsigned tick = 0;  // progress calls: the sockets are polled on every poll_every-th one
};
// Set-up traffic is rare and not latency-critical; iface progress is hot. Polling the
// sockets on one progress call in 16 keeps a poll(2) off most of the data path's calls.
inline constexpr unsigned poll_every = 16;

CmState *state_of(Iface *iface) { return static_cast<CmState *>(iface_cm_state(iface)); }
Conn *conn_of(Ep *ep) { return static_cast<Conn *>(ep_cm_state(ep)); }
const uct_iface_ops_t &ops_of(Iface *iface) { return to_uct(iface)->ops; }

ucs_status_t errno_status(int e)
{
	switch (e) {
	case ECONNREFUSED:
	case ENETUNREACH:
	case EHOSTUNREACH:
	case ETIMEDOUT:
		return UCS_ERR_UNREACHABLE;
	case EADDRINUSE:
		return UCS_ERR_BUSY;
	case EADDRNOTAVAIL:
	case EAFNOSUPPORT:
	case EINVAL:
		return UCS_ERR_INVALID_ADDR;
	case ENOMEM:
	case ENOBUFS:
		return UCS_ERR_NO_MEMORY;
	default:
		return UCS_ERR_IO_ERROR;
	}
}

Conn *find_conn(CmState *s, const void *handle)
{
	for (auto &c : s->conns)
		if (c.get() == handle && !c->dead)
			return c.get();
	return nullptr;
}

void close_fd(Conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
}

// Writes what is queued; the rest goes out from progress (POLLOUT).
void flush(Conn *c)
{
	while (c->fd >= 0 && !c->out.empty()) {
		ssize_t n = send(c->fd, c->out.data(), c->out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK) {
				c->out.clear();  // the peer is gone: the reader sees EOF/error
				close_fd(c);
			}
			return;
		}
		c->out.erase(0, static_cast<size_t>(n));
	}
	if (c->out.empty() && c->close_after_flush) {
		close_fd(c);
		if (!c->ep)
			c->dead = true;
	}
}

void send_frame(Conn *c, FrameType type, std::string_view dev = {}, std::string_view ep = {},
		std::string_view priv = {})
{
	if (c->fd < 0)
		return;
	FrameHdr h{frame_magic, static_cast<uint8_t>(type), frame_version, static_cast<uint16_t>(dev.size()),
		   static_cast<uint16_t>(ep.size()), static_cast<uint16_t>(priv.size()), 0};
	c->out.append(reinterpret_cast<const char *>(&h), sizeof(h));
	c->out.append(dev);
	c->out.append(ep);
	c->out.append(priv);
	flush(c);
}

std::string ep_address(Iface *iface, Ep *ep, ucs_status_t *st)
{
	std::string a(state_of(iface)->ep_addr_len, '\0');
	*st = ops_of(iface).ep_get_address(to_uct(ep), reinterpret_cast<uct_ep_addr_t *>(a.data()));
	return a;
}

// A plain data ep on the iface (the core's path without cm fields).
ucs_status_t create_data_ep(Iface *iface, Ep **ep_p)
{
	uct_ep_params_t p{};
	p.field_mask = UCT_EP_PARAM_FIELD_IFACE;
	p.iface = to_uct(iface);
	uct_ep_h ep;
	ucs_status_t st = ops_of(iface).ep_create(&p, &ep);
	if (st == UCS_OK)
		*ep_p = to_ep(ep);
	return st;
}

void destroy_data_ep(Iface *iface, Ep *ep) { ops_of(iface).ep_destroy(to_uct(ep)); }

// The user's private data, from ep params (private_data or sockaddr_pack_cb).
ucs_status_t pack_priv(CmState *s, uct_cm_ep_priv_data_pack_callback_t pack_cb, void *arg, std::string *out)
{
	if (!pack_cb)
		return UCS_OK;
	uct_cm_ep_priv_data_pack_args_t args{};
	if (s->dev_name[0]) {
		args.field_mask = UCT_CM_EP_PRIV_DATA_PACK_ARGS_FIELD_DEVICE_NAME;
		std::memcpy(args.dev_name, s->dev_name, sizeof(args.dev_name));
	}
	std::string buf(max_conn_priv, '\0');
	ssize_t n = pack_cb(arg, &args, buf.data());
	if (n < 0)
		return static_cast<ucs_status_t>(n);
	if (static_cast<size_t>(n) > max_conn_priv)
		return UCS_ERR_EXCEEDS_LIMIT;
	buf.resize(static_cast<size_t>(n));
	*out = std::move(buf);
	return UCS_OK;
}

// --- Client ---------------------------------------------------------------------------------
// The connection failed before it was up: the user hears it through the connect (or
// resolve) callback and the iface error handler.
void client_fail(Conn *c, ucs_status_t status)
{
	c->state = ConnState::failed;
	c->out.clear();
	close_fd(c);
	Ep *ep = c->ep;
	if (!ep)
		return;
	if (c->client_cb) {
		uct_cm_remote_data_t rd{};
		uct_cm_ep_client_connect_args_t a{};
		a.field_mask = UCT_CM_EP_CLIENT_CONNECT_ARGS_FIELD_REMOTE_DATA | UCT_CM_EP_CLIENT_CONNECT_ARGS_FIELD_STATUS;
		a.remote_data = &rd;
		a.status = status;
		c->client_cb(to_uct(ep), c->user_data, &a);
	}
	if (c->ep)  // the callback may have destroyed it
		ep_set_failed(c->ep, status);
}

void client_send_request(Conn *c, std::string_view priv)
{
	CmState *s = c->cm;
	ucs_status_t st;
	std::string ep_addr = ep_address(s->iface, c->ep, &st);
	if (st != UCS_OK) {
		client_fail(c, st);
		return;
	}
	c->state = ConnState::requested;
	send_frame(c, FrameType::conn_req, s->dev_addr, ep_addr, priv);
}

void client_tcp_up(Conn *c)
{
	CmState *s = c->cm;
	if (c->resolve_cb) {
		c->state = ConnState::resolved;
		uct_cm_ep_resolve_args_t a{};
		a.field_mask = UCT_CM_EP_RESOLVE_ARGS_FIELD_STATUS;
		a.status = UCS_OK;
		if (s->dev_name[0]) {
			a.field_mask |= UCT_CM_EP_RESOLVE_ARGS_FIELD_DEV_NAME;
			std::memcpy(a.dev_name, s->dev_name, sizeof(a.dev_name));
		}
		ucs_status_t st = c->resolve_cb(c->user_data, &a);
		if (st != UCS_OK && c->ep)
			client_fail(c, st);
		return;  // the user continues with uct_ep_connect()
	}
	std::string priv;
	ucs_status_t st = pack_priv(s, c->pack_cb, c->user_data, &priv);
	if (st != UCS_OK) {
		client_fail(c, st);
		return;
	}
	client_send_request(c, priv);
}

void client_on_accept(Conn *c, std::string_view dev, std::string_view ep_addr, std::string_view priv)
{
	CmState *s = c->cm;
	ucs_status_t st = ops_of(s->iface).ep_connect_to_ep(to_uct(c->ep),
							    reinterpret_cast<const uct_device_addr_t *>(dev.data()),
							    reinterpret_cast<const uct_ep_addr_t *>(ep_addr.data()));
	if (st != UCS_OK) {
		client_fail(c, st);
		return;
	}
	c->state = ConnState::accepted;
	c->up = true;
	if (c->client_cb) {
		uct_cm_remote_data_t rd{};
		rd.field_mask = UCT_CM_REMOTE_DATA_FIELD_DEV_ADDR | UCT_CM_REMOTE_DATA_FIELD_DEV_ADDR_LENGTH |
				UCT_CM_REMOTE_DATA_FIELD_CONN_PRIV_DATA | UCT_CM_REMOTE_DATA_FIELD_CONN_PRIV_DATA_LENGTH;
		rd.dev_addr = reinterpret_cast<const uct_device_addr_t *>(dev.data());
		rd.dev_addr_length = dev.size();
		rd.conn_priv_data = priv.data();
		rd.conn_priv_data_length = priv.size();
		uct_cm_ep_client_connect_args_t a{};
		a.field_mask = UCT_CM_EP_CLIENT_CONNECT_ARGS_FIELD_REMOTE_DATA | UCT_CM_EP_CLIENT_CONNECT_ARGS_FIELD_STATUS;
		a.remote_data = &rd;
		a.status = UCS_OK;
		c->client_cb(to_uct(c->ep), c->user_data, &a);
	}
}

// --- Server ---------------------------------------------------------------------------------
void server_notify_cb(Conn *c, ucs_status_t status)
{
	if (!c->server_cb || !c->ep || c->ep_owned)
		return;
	uct_cm_ep_server_conn_notify_args_t a{};
	a.field_mask = UCT_CM_EP_SERVER_CONN_NOTIFY_ARGS_FIELD_STATUS;
	a.status = status;
	c->server_cb(to_uct(c->ep), c->user_data, &a);
}

void server_reject(Conn *c)
{
	c->state = ConnState::failed;
	c->close_after_flush = true;
	send_frame(c, FrameType::reject);
	if (c->fd < 0 && !c->ep)
		c->dead = true;
}

ucs_status_t server_accept(Conn *c, std::string_view priv)
{
	CmState *s = c->cm;
	Ep *ep;
	ucs_status_t st = create_data_ep(s->iface, &ep);
	if (st != UCS_OK) {
		server_reject(c);
		return st;
	}
	st = ops_of(s->iface).ep_connect_to_ep(to_uct(ep),
					       reinterpret_cast<const uct_device_addr_t *>(c->peer_dev_addr.data()),
					       reinterpret_cast<const uct_ep_addr_t *>(c->peer_ep_addr.data()));
	std::string ep_addr;
	if (st == UCS_OK)
		ep_addr = ep_address(s->iface, ep, &st);
	if (st != UCS_OK) {
		destroy_data_ep(s->iface, ep);
		server_reject(c);
		return st;
	}
	c->ep = ep;
	c->ep_owned = true;
	ep_set_cm_state(ep, c);
	c->state = ConnState::accepted;
	send_frame(c, FrameType::accept, s->dev_addr, ep_addr, priv);
	return UCS_OK;
}

void server_on_request(Conn *c, std::string_view dev, std::string_view ep_addr, std::string_view priv)
{
	CmState *s = c->cm;
	if (dev.size() != s->dev_addr.size() || ep_addr.size() != s->ep_addr_len) {
		ucs_warn("xsrc cm: connection request with foreign addresses (%zu/%zu bytes): rejected", dev.size(),
			 ep_addr.size());
		server_reject(c);
		return;
	}
	c->peer_dev_addr.assign(dev);
	c->peer_ep_addr.assign(ep_addr);
	c->peer_priv.assign(priv);
	c->state = ConnState::pending_decision;
	s->conn_request_cb(to_uct(s->iface), s->conn_request_arg, reinterpret_cast<uct_conn_request_h>(c),
			   c->peer_priv.data(), c->peer_priv.size());
}

// --- Both -----------------------------------------------------------------------------------
void on_remote_disconnect(Conn *c)
{
	if (c->remote_disc)
		return;
	c->remote_disc = true;
	if (c->disconnect_cb && c->ep && !c->ep_owned)
		c->disconnect_cb(to_uct(c->ep), c->user_data);
}

// EOF or a socket error.
void on_eof(Conn *c)
{
	close_fd(c);
	c->out.clear();
	if (c->up) {
		on_remote_disconnect(c);
	} else if (c->role == Role::client) {
		if (c->state != ConnState::failed)
			client_fail(c, UCS_ERR_CONNECTION_RESET);
	} else if (c->state == ConnState::accepted) {
		c->state = ConnState::failed;
		server_notify_cb(c, UCS_ERR_CONNECTION_RESET);
	} else {
		c->state = ConnState::failed;
	}
	if (!c->ep)
		c->dead = true;
}

void protocol_error(Conn *c, const char *what)
{
	ucs_warn("xsrc cm: %s: connection dropped", what);
	on_eof(c);
}

void on_frame(Conn *c, const FrameHdr &h, std::string_view dev, std::string_view ep_addr, std::string_view priv)
{
	auto type = static_cast<FrameType>(h.type);
	switch (type) {
	case FrameType::conn_req:
		if (c->role != Role::server || c->state != ConnState::awaiting_request)
			return protocol_error(c, "unexpected CONN_REQ");
		return server_on_request(c, dev, ep_addr, priv);
	case FrameType::accept:
		if (c->role != Role::client || c->state != ConnState::requested)
			return protocol_error(c, "unexpected ACCEPT");
		if (dev.size() != c->cm->dev_addr.size() || ep_addr.size() != c->cm->ep_addr_len)
			return client_fail(c, UCS_ERR_INVALID_ADDR);
		return client_on_accept(c, dev, ep_addr, priv);
	case FrameType::reject:
		if (c->role != Role::client || c->state != ConnState::requested)
			return protocol_error(c, "unexpected REJECT");
		return client_fail(c, UCS_ERR_REJECTED);
	case FrameType::notify:
		if (c->role != Role::server || c->state != ConnState::accepted)
			return protocol_error(c, "unexpected NOTIFY");
		c->state = ConnState::connected;
		c->up = true;
		return server_notify_cb(c, UCS_OK);
	case FrameType::disconnect:
		if (!c->up)
			return protocol_error(c, "DISCONNECT before the connection was up");
		return on_remote_disconnect(c);
	}
	protocol_error(c, "unknown frame");
}

// Handles every complete frame in `in`; stops if the conn dies meanwhile.
void parse_frames(Conn *c)
{
	while (c->in.size() >= sizeof(FrameHdr) && !c->dead && c->fd >= 0) {
		FrameHdr h;
		std::memcpy(&h, c->in.data(), sizeof(h));
		if (h.magic != frame_magic || h.version != frame_version || h.dev_addr_len > max_addr_len ||
		    h.ep_addr_len > max_addr_len || h.priv_len > max_conn_priv)
			return protocol_error(c, "malformed frame");
		size_t len = sizeof(h) + size_t{h.dev_addr_len} + h.ep_addr_len + h.priv_len;
		if (c->in.size() < len)
			return;
		std::string frame = c->in.substr(0, len);  // callbacks may reenter: keep our copy
		c->in.erase(0, len);
		const char *q = frame.data() + sizeof(h);
		on_frame(c, h, {q, h.dev_addr_len}, {q + h.dev_addr_len, h.ep_addr_len},
			 {q + h.dev_addr_len + h.ep_addr_len, h.priv_len});
	}
}

void on_readable(Conn *c)
{
	bool eof = false;
	char buf[4096];
	for (;;) {
		ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0) {
			c->in.append(buf, static_cast<size_t>(n));
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		eof = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
		break;
	}
	parse_frames(c);  // the frames that arrived before an EOF count
	if (eof && !c->dead && c->fd >= 0)
		on_eof(c);
}

int make_socket(int family)
{
	int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd >= 0 && (family == AF_INET || family == AF_INET6)) {
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	}
	return fd;
}

void accept_clients(CmState *s)
{
	for (;;) {
		int fd = accept4(s->listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;  // EAGAIN, or a client that gave up already
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		auto c = std::make_unique<Conn>();
		c->cm = s;
		c->role = Role::server;
		c->state = ConnState::awaiting_request;
		c->fd = fd;
		s->conns.push_back(std::move(c));
	}
}

void sweep(CmState *s)
{
	std::erase_if(s->conns, [](const std::unique_ptr<Conn> &c) {
		if (!c->dead)
			return false;
		if (c->fd >= 0)
			close(c->fd);
		return true;
	});
}

}  // namespace

// --- Module entry points --------------------------------------------------------------------
ucs_status_t cm_iface_init(Iface *iface, const uct_iface_params_t *params)
{
	auto s = std::make_unique<CmState>();
	s->iface = iface;
	uint64_t fm = params ? params->field_mask : 0;
	uint64_t mode = (fm & UCT_IFACE_PARAM_FIELD_OPEN_MODE) ? params->open_mode : uint64_t{UCT_IFACE_OPEN_MODE_DEVICE};
	if ((mode & UCT_IFACE_OPEN_MODE_DEVICE) && params->mode.device.dev_name)
		std::strncpy(s->dev_name, params->mode.device.dev_name, sizeof(s->dev_name) - 1);

	uct_iface_attr_t attr;
	ucs_status_t st = ops_of(iface).iface_query(to_uct(iface), &attr);
	if (st != UCS_OK)
		return st;
	if (attr.device_addr_len > max_addr_len || attr.ep_addr_len > max_addr_len)
		return UCS_ERR_UNSUPPORTED;
	s->dev_addr.assign(attr.device_addr_len, '\0');
	st = ops_of(iface).iface_get_device_address(to_uct(iface), reinterpret_cast<uct_device_addr_t *>(s->dev_addr.data()));
	if (st != UCS_OK)
		return st;
	s->ep_addr_len = attr.ep_addr_len;

	if (mode & UCT_IFACE_OPEN_MODE_SOCKADDR_SERVER) {
		const ucs_sock_addr_t &la = params->mode.sockaddr.listen_sockaddr;
		if (!(fm & UCT_IFACE_PARAM_FIELD_SOCKADDR) || !la.addr || !la.addrlen ||
		    la.addrlen > sizeof(sockaddr_storage) || !params->mode.sockaddr.conn_request_cb)
			return UCS_ERR_INVALID_PARAM;
		s->conn_request_cb = params->mode.sockaddr.conn_request_cb;
		s->conn_request_arg = params->mode.sockaddr.conn_request_arg;
		int fd = make_socket(la.addr->sa_family);
		if (fd < 0)
			return errno_status(errno);
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		socklen_t len = sizeof(s->listen_addr);
		if (bind(fd, la.addr, la.addrlen) != 0 || listen(fd, SOMAXCONN) != 0 ||
		    getsockname(fd, reinterpret_cast<sockaddr *>(&s->listen_addr), &len) != 0) {
			st = errno_status(errno);
			close(fd);
			return st;
		}
		s->listen_fd = fd;
	}
	iface_set_cm_state(iface, s.release());
	return UCS_OK;
}

void cm_iface_cleanup(Iface *iface)
{
	CmState *s = state_of(iface);
	if (!s)
		return;
	for (auto &c : s->conns) {
		close_fd(c.get());
		if (!c->ep)
			continue;
		Ep *ep = c->ep;
		bool owned = c->ep_owned;
		ep_set_cm_state(ep, nullptr);
		c->ep = nullptr;
		if (owned)  // accepted but never handed to the user
			destroy_data_ep(iface, ep);
	}
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	iface_set_cm_state(iface, nullptr);
	delete s;
}

void cm_iface_query(Iface *iface, uct_iface_attr_t *attr)
{
	CmState *s = state_of(iface);
	if (!s)
		return;
	attr->cap.flags |= UCT_IFACE_FLAG_CONNECT_TO_SOCKADDR;
	attr->max_conn_priv = max_conn_priv;
	if (s->listen_fd >= 0)
		std::memcpy(&attr->listen_sockaddr, &s->listen_addr, sizeof(s->listen_addr));
}

unsigned cm_iface_progress(Iface *iface)
{
	CmState *s = state_of(iface);
	if (!s || (s->listen_fd < 0 && s->conns.empty()) || (++s->tick % poll_every) != 0)
		return 0;
	std::vector<pollfd> pfd;
	std::vector<Conn *> who;
	if (s->listen_fd >= 0) {
		pfd.push_back({s->listen_fd, POLLIN, 0});
		who.push_back(nullptr);
	}
	for (auto &c : s->conns) {
		if (c->dead || c->fd < 0)
			continue;
		short ev = POLLIN;
		if (!c->out.empty() || c->state == ConnState::tcp_connecting)
			ev |= POLLOUT;
		pfd.push_back({c->fd, ev, 0});
		who.push_back(c.get());
	}
	unsigned work = 0;
	if (!pfd.empty() && poll(pfd.data(), pfd.size(), 0) > 0) {
		for (size_t k = 0; k < pfd.size(); ++k) {
			short re = pfd[k].revents;
			if (!re)
				continue;
			++work;
			Conn *c = who[k];
			if (!c) {
				accept_clients(s);
				continue;
			}
			// A callback of an earlier conn may have destroyed this one's ep (and socket).
			if (c->dead || c->fd != pfd[k].fd)
				continue;
			if (c->state == ConnState::tcp_connecting) {
				if (!(re & (POLLOUT | POLLERR | POLLHUP)))
					continue;
				int err = 0;
				socklen_t len = sizeof(err);
				getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
				if (err)
					client_fail(c, errno_status(err));
				else
					client_tcp_up(c);
				continue;
			}
			if (re & POLLOUT)
				flush(c);
			if (c->fd >= 0 && (re & (POLLIN | POLLHUP | POLLERR)))
				on_readable(c);
		}
	}
	sweep(s);
	return work;
}

ucs_status_t cm_ep_create(const uct_ep_params_t *params, uct_ep_h *ep_p)
{
	if (!params || !ep_p || !(params->field_mask & UCT_EP_PARAM_FIELD_IFACE) || !params->iface)
		return UCS_ERR_INVALID_PARAM;
	Iface *iface = to_iface(params->iface);
	CmState *s = state_of(iface);
	if (!s)
		return UCS_ERR_UNSUPPORTED;
	uint64_t fm = params->field_mask;
	void *user_data = (fm & UCT_EP_PARAM_FIELD_USER_DATA) ? params->user_data : nullptr;
	auto disconnect_cb = (fm & UCT_EP_PARAM_FIELD_SOCKADDR_DISCONNECT_CB) ? params->disconnect_cb : nullptr;
	auto pack_cb = (fm & UCT_EP_PARAM_FIELD_SOCKADDR_PACK_CB) ? params->sockaddr_pack_cb : nullptr;

	if (fm & UCT_EP_PARAM_FIELD_CONN_REQUEST) {  // server side
		Conn *c = find_conn(s, params->conn_request);
		if (!c || c->role != Role::server)
			return UCS_ERR_INVALID_PARAM;
		if (c->state == ConnState::pending_decision) {
			std::string priv;
			if (fm & UCT_EP_PARAM_FIELD_PRIV_DATA) {
				size_t len = (fm & UCT_EP_PARAM_FIELD_PRIV_DATA_LENGTH) ? params->private_data_length : 0;
				if (len > max_conn_priv || (len && !params->private_data))
					return UCS_ERR_INVALID_PARAM;
				priv.assign(static_cast<const char *>(params->private_data), len);
			} else {
				ucs_status_t st = pack_priv(s, pack_cb, user_data, &priv);
				if (st != UCS_OK) {
					server_reject(c);
					return st;
				}
			}
			ucs_status_t st = server_accept(c, priv);
			if (st != UCS_OK)
				return st;
		} else if (!(c->ep && c->ep_owned)) {
			return UCS_ERR_INVALID_PARAM;  // rejected, failed, or handed out already
		}
		c->ep_owned = false;
		c->user_data = user_data;
		c->disconnect_cb = disconnect_cb;
		c->server_cb = (fm & UCT_EP_PARAM_FIELD_SOCKADDR_NOTIFY_CB_SERVER) ? params->sockaddr_cb_server : nullptr;
		*ep_p = to_uct(c->ep);
		return UCS_OK;
	}

	if (!(fm & UCT_EP_PARAM_FIELD_SOCKADDR) || !params->sockaddr || !params->sockaddr->addr ||
	    !params->sockaddr->addrlen)
		return UCS_ERR_INVALID_PARAM;
	auto resolve_cb = (fm & UCT_EP_PARAM_FIELD_CM_RESOLVE_CB) ? params->cm_resolve_cb : nullptr;
	if (resolve_cb && pack_cb)
		return UCS_ERR_INVALID_PARAM;  // mutually exclusive (uct.h)
	const sockaddr *sa = params->sockaddr->addr;
	int fd = make_socket(sa->sa_family);
	if (fd < 0)
		return errno_status(errno);
	if (connect(fd, sa, params->sockaddr->addrlen) != 0 && errno != EINPROGRESS) {
		ucs_status_t st = errno_status(errno);
		close(fd);
		return st;
	}
	Ep *ep;
	ucs_status_t st = create_data_ep(iface, &ep);
	if (st != UCS_OK) {
		close(fd);
		return st;
	}
	auto c = std::make_unique<Conn>();
	c->cm = s;
	c->role = Role::client;
	c->state = ConnState::tcp_connecting;
	c->fd = fd;
	c->ep = ep;
	c->user_data = user_data;
	c->disconnect_cb = disconnect_cb;
	c->pack_cb = pack_cb;
	c->resolve_cb = resolve_cb;
	c->client_cb = (fm & UCT_EP_PARAM_FIELD_SOCKADDR_CONNECT_CB_CLIENT) ? params->sockaddr_cb_client : nullptr;
	ep_set_cm_state(ep, c.get());
	s->conns.push_back(std::move(c));
	*ep_p = to_uct(ep);
	return UCS_OK;
}

void cm_ep_destroy(Ep *ep)
{
	Conn *c = conn_of(ep);
	if (!c)
		return;
	ep_set_cm_state(ep, nullptr);
	c->ep = nullptr;
	c->ep_owned = false;
	c->out.clear();
	close_fd(c);  // the peer sees EOF: its disconnect (or reset) path runs
	c->dead = true;
}

ucs_status_t cm_ep_connect(uct_ep_h tl_ep, const uct_ep_connect_params_t *params)
{
	Conn *c = conn_of(to_ep(tl_ep));
	if (!c || c->role != Role::client || !c->resolve_cb)
		return UCS_ERR_INVALID_PARAM;  // only a client ep created with cm_resolve_cb
	if (c->state == ConnState::failed)
		return UCS_ERR_NOT_CONNECTED;
	if (c->state != ConnState::resolved)
		return UCS_ERR_BUSY;  // before cm_resolve_cb, or connected already
	std::string priv;
	uint64_t fm = params ? params->field_mask : 0;
	if (fm & UCT_EP_CONNECT_PARAM_FIELD_PRIVATE_DATA) {
		size_t len = (fm & UCT_EP_CONNECT_PARAM_FIELD_PRIVATE_DATA_LENGTH) ? params->private_data_length : 0;
		if (len > max_conn_priv || (len && !params->private_data))
			return UCS_ERR_INVALID_PARAM;
		priv.assign(static_cast<const char *>(params->private_data), len);
	}
	client_send_request(c, priv);
	return c->state == ConnState::failed ? UCS_ERR_IO_ERROR : UCS_OK;
}

ucs_status_t cm_ep_disconnect(uct_ep_h tl_ep, unsigned)
{
	Conn *c = conn_of(to_ep(tl_ep));
	if (!c)
		return UCS_ERR_INVALID_PARAM;  // not an ep connected by sockaddr
	if (!c->up)
		return UCS_ERR_BUSY;
	if (c->local_disc)
		return c->remote_disc ? UCS_ERR_NOT_CONNECTED : UCS_INPROGRESS;
	c->local_disc = true;
	send_frame(c, FrameType::disconnect);
	return c->remote_disc ? UCS_OK : UCS_INPROGRESS;
}

ucs_status_t cm_ep_conn_notify(uct_ep_h tl_ep)
{
	Conn *c = conn_of(to_ep(tl_ep));
	if (!c || c->role != Role::client)
		return UCS_ERR_INVALID_PARAM;
	if (c->state != ConnState::accepted)
		return UCS_ERR_NOT_CONNECTED;
	c->state = ConnState::connected;
	send_frame(c, FrameType::notify);
	return UCS_OK;
}

ucs_status_t cm_iface_accept(uct_iface_h tl_iface, uct_conn_request_h req)
{
	CmState *s = state_of(to_iface(tl_iface));
	Conn *c = s ? find_conn(s, req) : nullptr;
	if (!c || c->role != Role::server || c->state != ConnState::pending_decision)
		return UCS_ERR_INVALID_PARAM;
	return server_accept(c, {});
}

ucs_status_t cm_iface_reject(uct_iface_h tl_iface, uct_conn_request_h req)
{
	CmState *s = state_of(to_iface(tl_iface));
	Conn *c = s ? find_conn(s, req) : nullptr;
	if (!c || c->role != Role::server || c->state != ConnState::pending_decision)
		return UCS_ERR_INVALID_PARAM;
	server_reject(c);
	return UCS_OK;
}

}  // namespace xsrc::uct
