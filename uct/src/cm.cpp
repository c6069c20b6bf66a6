// Connection set-up by socket address over TCP (see cm.h for the protocol and the API flow):
// the module's entry points. The connections themselves are in cm_conn.cpp.
#include "cm.h"

#include "cm_conn.h"

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <poll.h>
#include <sys/socket.h>

namespace xsrc::uct {

using namespace cm;

// --- Module entry points --------------------------------------------------------------------
ucs_status_t uct_xsrc_cm_iface_init(Iface *iface, const uct_iface_params_t *params)
{
	auto s = std::make_unique<CmState>();
	s->iface = iface;
	uint64_t fm = params ? params->field_mask : 0;
	uint64_t mode = (fm & UCT_IFACE_PARAM_FIELD_OPEN_MODE) ? params->open_mode : uint64_t{UCT_IFACE_OPEN_MODE_DEVICE};
	if ((mode & UCT_IFACE_OPEN_MODE_DEVICE) && params->mode.device.dev_name)
		std::strncpy(s->dev_name, params->mode.device.dev_name, sizeof(s->dev_name) - 1);

	uct_iface_attr_t attr;
	ucs_status_t st = uct_xsrc_cm_ops_of(iface).iface_query(to_uct(iface), &attr);
	if (st != UCS_OK)
		return st;
	if (attr.device_addr_len > max_addr_len || attr.ep_addr_len > max_addr_len)
		return UCS_ERR_UNSUPPORTED;
	s->dev_addr.assign(attr.device_addr_len, '\0');
	st = uct_xsrc_cm_ops_of(iface).iface_get_device_address(to_uct(iface), reinterpret_cast<uct_device_addr_t *>(s->dev_addr.data()));
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
		xsrc::unique_fd fd = uct_xsrc_cm_socket(la.addr->sa_family);
		if (!fd)
			return uct_xsrc_cm_errno_status(errno);
		int one = 1;
		setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		socklen_t len = sizeof(s->listen_addr);
		if (bind(fd.get(), la.addr, la.addrlen) != 0 || listen(fd.get(), SOMAXCONN) != 0 ||
		    getsockname(fd.get(), reinterpret_cast<sockaddr *>(&s->listen_addr), &len) != 0)
			return uct_xsrc_cm_errno_status(errno);  // (unique_fd keeps errno when it closes)
		s->listen_fd = std::move(fd);
	}
	iface_set_cm_state(iface, s.release());
	return UCS_OK;
}

void uct_xsrc_cm_iface_cleanup(Iface *iface)
{
	CmState *s = uct_xsrc_cm_state_of(iface);
	if (!s)
		return;
	for (auto &c : s->conns) {
		uct_xsrc_cm_conn_close_fd(c.get());
		if (!c->ep)
			continue;
		Ep *ep = c->ep;
		bool owned = c->ep_owned;
		ep_set_cm_state(ep, nullptr);
		c->ep = nullptr;
		if (owned)  // accepted but never handed to the user
			uct_xsrc_cm_data_ep_destroy(iface, ep);
	}
	iface_set_cm_state(iface, nullptr);
	delete s;
}

void uct_xsrc_cm_iface_query(Iface *iface, uct_iface_attr_t *attr)
{
	CmState *s = uct_xsrc_cm_state_of(iface);
	if (!s)
		return;
	attr->cap.flags |= UCT_IFACE_FLAG_CONNECT_TO_SOCKADDR;
	attr->max_conn_priv = max_conn_priv;
	if (s->listen_fd)
		std::memcpy(&attr->listen_sockaddr, &s->listen_addr, sizeof(s->listen_addr));
}

unsigned uct_xsrc_cm_iface_progress(Iface *iface)
{
	CmState *s = uct_xsrc_cm_state_of(iface);
	if (!s || (!s->listen_fd && s->conns.empty()) || (++s->tick % poll_every) != 0)
		return 0;
	std::vector<pollfd> pfd;
	std::vector<Conn *> who;
	if (s->listen_fd) {
		pfd.push_back({s->listen_fd.get(), POLLIN, 0});
		who.push_back(nullptr);
	}
	for (auto &c : s->conns) {
		if (c->dead || !c->fd)
			continue;
		short ev = POLLIN;
		if (!c->out.empty() || c->state == ConnState::tcp_connecting)
			ev |= POLLOUT;
		pfd.push_back({c->fd.get(), ev, 0});
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
				uct_xsrc_cm_accept_clients(s);
				continue;
			}
			// A callback of an earlier conn may have destroyed this one's ep (and socket).
			if (c->dead || c->fd.get() != pfd[k].fd)
				continue;
			if (c->state == ConnState::tcp_connecting) {
				if (!(re & (POLLOUT | POLLERR | POLLHUP)))
					continue;
				int err = 0;
				socklen_t len = sizeof(err);
				getsockopt(c->fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
				if (err)
					uct_xsrc_cm_client_fail(c, uct_xsrc_cm_errno_status(err));
				else
					uct_xsrc_cm_client_tcp_up(c);
				continue;
			}
			if (re & POLLOUT)
				uct_xsrc_cm_conn_flush(c);
			if (c->fd && (re & (POLLIN | POLLHUP | POLLERR)))
				uct_xsrc_cm_conn_on_readable(c);
		}
	}
	uct_xsrc_cm_sweep(s);
	return work;
}

ucs_status_t uct_xsrc_cm_ep_create(const uct_ep_params_t *params, uct_ep_h *ep_p)
{
	if (!params || !ep_p || !(params->field_mask & UCT_EP_PARAM_FIELD_IFACE) || !params->iface)
		return UCS_ERR_INVALID_PARAM;
	Iface *iface = to_iface(params->iface);
	CmState *s = uct_xsrc_cm_state_of(iface);
	if (!s)
		return UCS_ERR_UNSUPPORTED;
	uint64_t fm = params->field_mask;
	void *user_data = (fm & UCT_EP_PARAM_FIELD_USER_DATA) ? params->user_data : nullptr;
	auto disconnect_cb = (fm & UCT_EP_PARAM_FIELD_SOCKADDR_DISCONNECT_CB) ? params->disconnect_cb : nullptr;
	auto pack_cb = (fm & UCT_EP_PARAM_FIELD_SOCKADDR_PACK_CB) ? params->sockaddr_pack_cb : nullptr;

	if (fm & UCT_EP_PARAM_FIELD_CONN_REQUEST) {  // server side
		Conn *c = uct_xsrc_cm_find_conn(s, params->conn_request);
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
				ucs_status_t st = uct_xsrc_cm_pack_priv(s, pack_cb, user_data, &priv);
				if (st != UCS_OK) {
					uct_xsrc_cm_server_reject(c);
					return st;
				}
			}
			ucs_status_t st = uct_xsrc_cm_server_accept(c, priv);
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
	xsrc::unique_fd fd = uct_xsrc_cm_socket(sa->sa_family);
	if (!fd)
		return uct_xsrc_cm_errno_status(errno);
	if (connect(fd.get(), sa, params->sockaddr->addrlen) != 0 && errno != EINPROGRESS)
		return uct_xsrc_cm_errno_status(errno);
	Ep *ep;
	ucs_status_t st = uct_xsrc_cm_data_ep_create(iface, &ep);
	if (st != UCS_OK)
		return st;
	auto c = std::make_unique<Conn>();
	c->cm = s;
	c->role = Role::client;
	c->state = ConnState::tcp_connecting;
	c->fd = std::move(fd);
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

void uct_xsrc_cm_ep_destroy(Ep *ep)
{
	Conn *c = uct_xsrc_cm_conn_of(ep);
	if (!c)
		return;
	ep_set_cm_state(ep, nullptr);
	c->ep = nullptr;
	c->ep_owned = false;
	c->out.clear();
	uct_xsrc_cm_conn_close_fd(c);  // the peer sees EOF: its disconnect (or reset) path runs
	c->dead = true;
}

ucs_status_t uct_xsrc_cm_ep_connect(uct_ep_h tl_ep, const uct_ep_connect_params_t *params)
{
	Conn *c = uct_xsrc_cm_conn_of(to_ep(tl_ep));
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
	uct_xsrc_cm_client_send_request(c, priv);
	return c->state == ConnState::failed ? UCS_ERR_IO_ERROR : UCS_OK;
}

ucs_status_t uct_xsrc_cm_ep_disconnect(uct_ep_h tl_ep, unsigned)
{
	Conn *c = uct_xsrc_cm_conn_of(to_ep(tl_ep));
	if (!c)
		return UCS_ERR_INVALID_PARAM;  // not an ep connected by sockaddr
	if (!c->up)
		return UCS_ERR_BUSY;
	if (c->local_disc)
		return c->remote_disc ? UCS_ERR_NOT_CONNECTED : UCS_INPROGRESS;
	c->local_disc = true;
	uct_xsrc_cm_conn_send_frame(c, FrameType::disconnect);
	return c->remote_disc ? UCS_OK : UCS_INPROGRESS;
}

ucs_status_t uct_xsrc_cm_ep_conn_notify(uct_ep_h tl_ep)
{
	Conn *c = uct_xsrc_cm_conn_of(to_ep(tl_ep));
	if (!c || c->role != Role::client)
		return UCS_ERR_INVALID_PARAM;
	if (c->state != ConnState::accepted)
		return UCS_ERR_NOT_CONNECTED;
	c->state = ConnState::connected;
	uct_xsrc_cm_conn_send_frame(c, FrameType::notify);
	return UCS_OK;
}

ucs_status_t uct_xsrc_cm_iface_accept(uct_iface_h tl_iface, uct_conn_request_h req)
{
	CmState *s = uct_xsrc_cm_state_of(to_iface(tl_iface));
	Conn *c = s ? uct_xsrc_cm_find_conn(s, req) : nullptr;
	if (!c || c->role != Role::server || c->state != ConnState::pending_decision)
		return UCS_ERR_INVALID_PARAM;
	return uct_xsrc_cm_server_accept(c, {});
}

ucs_status_t uct_xsrc_cm_iface_reject(uct_iface_h tl_iface, uct_conn_request_h req)
{
	CmState *s = uct_xsrc_cm_state_of(to_iface(tl_iface));
	Conn *c = s ? uct_xsrc_cm_find_conn(s, req) : nullptr;
	if (!c || c->role != Role::server || c->state != ConnState::pending_decision)
		return UCS_ERR_INVALID_PARAM;
	uct_xsrc_cm_server_reject(c);
	return UCS_OK;
}

}  // namespace xsrc::uct
