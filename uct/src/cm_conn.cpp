// The connection manager's connections: the frame protocol of cm.h on one TCP socket per ep
// pair, the client's and the server's side of it, and the sockets' upkeep.
#include "cm_conn.h"

#include <ucs/debug/log_def.h>

#include <cerrno>
#include <cstring>

#include <netinet/in.h>
#include <netinet/tcp.h>

namespace xsrc::uct::cm {

ucs_status_t uct_xsrc_cm_errno_status(int e)
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

Conn *uct_xsrc_cm_find_conn(CmState *s, const void *handle)
{
	for (auto &c : s->conns)
		if (c.get() == handle && !c->dead)
			return c.get();
	return nullptr;
}

void uct_xsrc_cm_conn_close_fd(Conn *c) { c->fd.reset(); }

void uct_xsrc_cm_conn_flush(Conn *c)
{
	while (c->fd && !c->out.empty()) {
		ssize_t n = send(c->fd.get(), c->out.data(), c->out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK) {
				c->out.clear();  // the peer is gone: the reader sees EOF/error
				uct_xsrc_cm_conn_close_fd(c);
			}
			return;
		}
		c->out.erase(0, static_cast<size_t>(n));
	}
	if (c->out.empty() && c->close_after_flush) {
		uct_xsrc_cm_conn_close_fd(c);
		if (!c->ep)
			c->dead = true;
	}
}

void uct_xsrc_cm_conn_send_frame(Conn *c, FrameType type, std::string_view dev, std::string_view ep,
				 std::string_view priv)
{
	if (!c->fd)
		return;
	FrameHdr h{frame_magic, static_cast<uint8_t>(type), frame_version, static_cast<uint16_t>(dev.size()),
		   static_cast<uint16_t>(ep.size()), static_cast<uint16_t>(priv.size()), 0};
	c->out.append(reinterpret_cast<const char *>(&h), sizeof(h));
	c->out.append(dev);
	c->out.append(ep);
	c->out.append(priv);
	uct_xsrc_cm_conn_flush(c);
}

static std::string uct_xsrc_cm_ep_address(Iface *iface, Ep *ep, ucs_status_t *st)
{
	std::string a(uct_xsrc_cm_state_of(iface)->ep_addr_len, '\0');
	*st = uct_xsrc_cm_ops_of(iface).ep_get_address(to_uct(ep), reinterpret_cast<uct_ep_addr_t *>(a.data()));
	return a;
}

ucs_status_t uct_xsrc_cm_data_ep_create(Iface *iface, Ep **ep_p)
{
	uct_ep_params_t p{};
	p.field_mask = UCT_EP_PARAM_FIELD_IFACE;
	p.iface = to_uct(iface);
	uct_ep_h ep;
	ucs_status_t st = uct_xsrc_cm_ops_of(iface).ep_create(&p, &ep);
	if (st == UCS_OK)
		*ep_p = to_ep(ep);
	return st;
}

void uct_xsrc_cm_data_ep_destroy(Iface *iface, Ep *ep) { uct_xsrc_cm_ops_of(iface).ep_destroy(to_uct(ep)); }

ucs_status_t uct_xsrc_cm_pack_priv(CmState *s, uct_cm_ep_priv_data_pack_callback_t pack_cb, void *arg, std::string *out)
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
void uct_xsrc_cm_client_fail(Conn *c, ucs_status_t status)
{
	c->state = ConnState::failed;
	c->out.clear();
	uct_xsrc_cm_conn_close_fd(c);
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

void uct_xsrc_cm_client_send_request(Conn *c, std::string_view priv)
{
	CmState *s = c->cm;
	ucs_status_t st;
	std::string ep_addr = uct_xsrc_cm_ep_address(s->iface, c->ep, &st);
	if (st != UCS_OK) {
		uct_xsrc_cm_client_fail(c, st);
		return;
	}
	c->state = ConnState::requested;
	uct_xsrc_cm_conn_send_frame(c, FrameType::conn_req, s->dev_addr, ep_addr, priv);
}

void uct_xsrc_cm_client_tcp_up(Conn *c)
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
			uct_xsrc_cm_client_fail(c, st);
		return;  // the user continues with uct_ep_connect()
	}
	std::string priv;
	ucs_status_t st = uct_xsrc_cm_pack_priv(s, c->pack_cb, c->user_data, &priv);
	if (st != UCS_OK) {
		uct_xsrc_cm_client_fail(c, st);
		return;
	}
	uct_xsrc_cm_client_send_request(c, priv);
}

static void uct_xsrc_cm_client_on_accept(Conn *c, std::string_view dev, std::string_view ep_addr, std::string_view priv)
{
	CmState *s = c->cm;
	ucs_status_t st = uct_xsrc_cm_ops_of(s->iface).ep_connect_to_ep(to_uct(c->ep),
							    reinterpret_cast<const uct_device_addr_t *>(dev.data()),
							    reinterpret_cast<const uct_ep_addr_t *>(ep_addr.data()));
	if (st != UCS_OK) {
		uct_xsrc_cm_client_fail(c, st);
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
static void uct_xsrc_cm_server_notify_cb(Conn *c, ucs_status_t status)
{
	if (!c->server_cb || !c->ep || c->ep_owned)
		return;
	uct_cm_ep_server_conn_notify_args_t a{};
	a.field_mask = UCT_CM_EP_SERVER_CONN_NOTIFY_ARGS_FIELD_STATUS;
	a.status = status;
	c->server_cb(to_uct(c->ep), c->user_data, &a);
}

void uct_xsrc_cm_server_reject(Conn *c)
{
	c->state = ConnState::failed;
	c->close_after_flush = true;
	uct_xsrc_cm_conn_send_frame(c, FrameType::reject);
	if (!c->fd && !c->ep)
		c->dead = true;
}

ucs_status_t uct_xsrc_cm_server_accept(Conn *c, std::string_view priv)
{
	CmState *s = c->cm;
	Ep *ep;
	ucs_status_t st = uct_xsrc_cm_data_ep_create(s->iface, &ep);
	if (st != UCS_OK) {
		uct_xsrc_cm_server_reject(c);
		return st;
	}
	st = uct_xsrc_cm_ops_of(s->iface).ep_connect_to_ep(to_uct(ep),
					       reinterpret_cast<const uct_device_addr_t *>(c->peer_dev_addr.data()),
					       reinterpret_cast<const uct_ep_addr_t *>(c->peer_ep_addr.data()));
	std::string ep_addr;
	if (st == UCS_OK)
		ep_addr = uct_xsrc_cm_ep_address(s->iface, ep, &st);
	if (st != UCS_OK) {
		uct_xsrc_cm_data_ep_destroy(s->iface, ep);
		uct_xsrc_cm_server_reject(c);
		return st;
	}
	c->ep = ep;
	c->ep_owned = true;
	ep_set_cm_state(ep, c);
	c->state = ConnState::accepted;
	uct_xsrc_cm_conn_send_frame(c, FrameType::accept, s->dev_addr, ep_addr, priv);
	return UCS_OK;
}

static void uct_xsrc_cm_server_on_request(Conn *c, std::string_view dev, std::string_view ep_addr, std::string_view priv)
{
	CmState *s = c->cm;
	if (dev.size() != s->dev_addr.size() || ep_addr.size() != s->ep_addr_len) {
		ucs_warn("xsrc cm: connection request with foreign addresses (%zu/%zu bytes): rejected", dev.size(),
			 ep_addr.size());
		uct_xsrc_cm_server_reject(c);
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
static void uct_xsrc_cm_conn_on_remote_disconnect(Conn *c)
{
	if (c->remote_disc)
		return;
	c->remote_disc = true;
	if (c->disconnect_cb && c->ep && !c->ep_owned)
		c->disconnect_cb(to_uct(c->ep), c->user_data);
}

// EOF or a socket error.
static void uct_xsrc_cm_conn_on_eof(Conn *c)
{
	uct_xsrc_cm_conn_close_fd(c);
	c->out.clear();
	if (c->up) {
		uct_xsrc_cm_conn_on_remote_disconnect(c);
	} else if (c->role == Role::client) {
		if (c->state != ConnState::failed)
			uct_xsrc_cm_client_fail(c, UCS_ERR_CONNECTION_RESET);
	} else if (c->state == ConnState::accepted) {
		c->state = ConnState::failed;
		uct_xsrc_cm_server_notify_cb(c, UCS_ERR_CONNECTION_RESET);
	} else {
		c->state = ConnState::failed;
	}
	if (!c->ep)
		c->dead = true;
}

static void uct_xsrc_cm_conn_protocol_error(Conn *c, const char *what)
{
	ucs_warn("xsrc cm: %s: connection dropped", what);
	uct_xsrc_cm_conn_on_eof(c);
}

static void uct_xsrc_cm_conn_on_frame(Conn *c, const FrameHdr &h, std::string_view dev, std::string_view ep_addr, std::string_view priv)
{
	auto type = static_cast<FrameType>(h.type);
	switch (type) {
	case FrameType::conn_req:
		if (c->role != Role::server || c->state != ConnState::awaiting_request)
			return uct_xsrc_cm_conn_protocol_error(c, "unexpected CONN_REQ");
		return uct_xsrc_cm_server_on_request(c, dev, ep_addr, priv);
	case FrameType::accept:
		if (c->role != Role::client || c->state != ConnState::requested)
			return uct_xsrc_cm_conn_protocol_error(c, "unexpected ACCEPT");
		if (dev.size() != c->cm->dev_addr.size() || ep_addr.size() != c->cm->ep_addr_len)
			return uct_xsrc_cm_client_fail(c, UCS_ERR_INVALID_ADDR);
		return uct_xsrc_cm_client_on_accept(c, dev, ep_addr, priv);
	case FrameType::reject:
		if (c->role != Role::client || c->state != ConnState::requested)
			return uct_xsrc_cm_conn_protocol_error(c, "unexpected REJECT");
		return uct_xsrc_cm_client_fail(c, UCS_ERR_REJECTED);
	case FrameType::notify:
		if (c->role != Role::server || c->state != ConnState::accepted)
			return uct_xsrc_cm_conn_protocol_error(c, "unexpected NOTIFY");
		c->state = ConnState::connected;
		c->up = true;
		return uct_xsrc_cm_server_notify_cb(c, UCS_OK);
	case FrameType::disconnect:
		if (!c->up)
			return uct_xsrc_cm_conn_protocol_error(c, "DISCONNECT before the connection was up");
		return uct_xsrc_cm_conn_on_remote_disconnect(c);
	}
	uct_xsrc_cm_conn_protocol_error(c, "unknown frame");
}

// Handles every complete frame in `in`; stops if the conn dies meanwhile.
static void uct_xsrc_cm_conn_parse_frames(Conn *c)
{
	while (c->in.size() >= sizeof(FrameHdr) && !c->dead && c->fd) {
		FrameHdr h;
		std::memcpy(&h, c->in.data(), sizeof(h));
		if (h.magic != frame_magic || h.version != frame_version || h.dev_addr_len > max_addr_len ||
		    h.ep_addr_len > max_addr_len || h.priv_len > max_conn_priv)
			return uct_xsrc_cm_conn_protocol_error(c, "malformed frame");
		size_t len = sizeof(h) + size_t{h.dev_addr_len} + h.ep_addr_len + h.priv_len;
		if (c->in.size() < len)
			return;
		std::string frame = c->in.substr(0, len);  // callbacks may reenter: keep our copy
		c->in.erase(0, len);
		const char *q = frame.data() + sizeof(h);
		uct_xsrc_cm_conn_on_frame(c, h, {q, h.dev_addr_len}, {q + h.dev_addr_len, h.ep_addr_len},
			 {q + h.dev_addr_len + h.ep_addr_len, h.priv_len});
	}
}

void uct_xsrc_cm_conn_on_readable(Conn *c)
{
	bool eof = false;
	char buf[4096];
	for (;;) {
		ssize_t n = recv(c->fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0) {
			c->in.append(buf, static_cast<size_t>(n));
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		eof = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
		break;
	}
	uct_xsrc_cm_conn_parse_frames(c);  // the frames that arrived before an EOF count
	if (eof && !c->dead && c->fd)
		uct_xsrc_cm_conn_on_eof(c);
}

static void uct_xsrc_cm_set_nodelay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

xsrc::unique_fd uct_xsrc_cm_socket(int family)
{
	xsrc::unique_fd fd(socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
	if (fd && (family == AF_INET || family == AF_INET6))
		uct_xsrc_cm_set_nodelay(fd.get());
	return fd;
}

void uct_xsrc_cm_accept_clients(CmState *s)
{
	for (;;) {
		xsrc::unique_fd fd(accept4(s->listen_fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
		if (!fd)
			return;  // EAGAIN, or a client that gave up already
		uct_xsrc_cm_set_nodelay(fd.get());
		auto c = std::make_unique<Conn>();
		c->cm = s;
		c->role = Role::server;
		c->state = ConnState::awaiting_request;
		c->fd = std::move(fd);
		s->conns.push_back(std::move(c));
	}
}

void uct_xsrc_cm_sweep(CmState *s)
{
	std::erase_if(s->conns, [](const std::unique_ptr<Conn> &c) { return c->dead; });  // (closing their sockets)
}


}  // namespace xsrc::uct::cm
