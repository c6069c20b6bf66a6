// Connect-to-iface (UCT_IFACE_FLAG_CONNECT_TO_IFACE) for RC: an ep created from a peer's
// device and iface address asks the peer's iface, over a datagram socket, for a passive ep
// of its own; the peer creates and connects one and answers with its ep address, and the
// initiator connects. Until the answer the ep has no resources (sends: UCS_ERR_NO_RESOURCE,
// ep_pending_add queues). The iface address is the name of that socket in the abstract
// UNIX namespace, so this reaches ifaces on the same host (every xsrc peer is; ep-to-ep
// connection works between any two verbs peers). Passive eps belong to the iface and go
// with it.
//
// The same socket carries the XRC messages of rc_xrc.cpp (request a receive QP for a send
// QP, the reply, and "this send QP is gone"); an iface's XRC key is its GID with the pid and
// number in its socket name, so an ep address names its iface in 8 bytes.
#include "rc_iface.h"

#include "common/atomic.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace xsrc::uct {

namespace {

constexpr char addr_prefix[] = "xsrcuct-";
constexpr uint32_t conn_magic = 0x78756331;  // "xuc1"

struct IfaceAddr {
	char name[24];  // abstract socket name, NUL-padded
};

enum class ConnType : uint8_t { request = 1, reply = 2, reject = 3 };  // 4..6: XrcMsgType

struct ConnMsg {
	uint32_t magic;
	uint8_t type;
	uint8_t pad[3];
	uint32_t token;       // the initiator's ep id
	int32_t status;       // reject: why
	uint8_t dev[32];      // sender's device address
	uint8_t ep[32];       // sender's ep address
	char from[24];        // sender's socket name
	// XRC messages
	uint32_t pid, seq;    // sender's key (with the GID in dev)
	uint32_t ini, tgt;
};

bool uct_xsrc_rc_iface_conn_is_xrc(uint8_t type)
{
	return type >= static_cast<uint8_t>(XrcMsgType::request) && type <= static_cast<uint8_t>(XrcMsgType::bye);
}

// The socket name of the iface with key `k` (as uct_xsrc_rc_iface_conn_open names it).
void uct_xsrc_rc_iface_conn_name_of(const XrcKey &k, char (&name)[sizeof(IfaceAddr::name)])
{
	snprintf(name, sizeof(name), "%s%u-%u", addr_prefix, k.pid, k.seq);
}

void uct_xsrc_rc_iface_conn_handle_xrc(Iface *i, const ConnMsg &m)
{
	XrcMsg x{};
	x.type = static_cast<XrcMsgType>(m.type);
	ibv_gid gid;
	uct_xsrc_rc_iface_dev_addr_unpack(reinterpret_cast<const uct_device_addr_t *>(m.dev), &gid, &x.lid);
	memcpy(x.from.gid.data(), gid.raw, 16);
	x.from.pid = m.pid;
	x.from.seq = m.seq;
	x.ini = m.ini;
	x.tgt = m.tgt;
	x.status = m.status;
	uct_xsrc_rc_xrc_on_msg(i, x);
}

sockaddr_un uct_xsrc_rc_iface_conn_sun_of(const char *name, socklen_t *len)
{
	sockaddr_un a{};
	a.sun_family = AF_UNIX;
	size_t n = strnlen(name, sizeof(IfaceAddr::name));
	memcpy(a.sun_path + 1, name, n);  // abstract: leading NUL
	*len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
	return a;
}

ucs_status_t uct_xsrc_rc_iface_conn_send_msg(Iface *i, const char *to, const ConnMsg &m)
{
	socklen_t len;
	sockaddr_un a = uct_xsrc_rc_iface_conn_sun_of(to, &len);
	if (sendto(i->conn_fd.get(), &m, sizeof(m), MSG_DONTWAIT, reinterpret_cast<sockaddr *>(&a), len) == sizeof(m))
		return UCS_OK;
	return errno == EAGAIN ? UCS_ERR_NO_RESOURCE : UCS_ERR_UNREACHABLE;
}

// One message. An XRC message must come from the socket of the iface it names as its sender
// (abstract names are bound exclusively): another is dropped as forged.
ssize_t uct_xsrc_rc_iface_conn_recv_one(Iface *i, ConnMsg &m)
{
	sockaddr_un from{};
	socklen_t from_len = sizeof(from);
	ssize_t r = recvfrom(i->conn_fd.get(), &m, sizeof(m), MSG_DONTWAIT, reinterpret_cast<sockaddr *>(&from), &from_len);
	if (r == sizeof(m) && m.magic == conn_magic && uct_xsrc_rc_iface_conn_is_xrc(m.type)) {
		XrcKey k;
		k.pid = m.pid;
		k.seq = m.seq;
		char name[sizeof(IfaceAddr::name)];
		uct_xsrc_rc_iface_conn_name_of(k, name);
		socklen_t want_len;
		sockaddr_un want = uct_xsrc_rc_iface_conn_sun_of(name, &want_len);
		if (from_len != want_len || memcmp(&from, &want, want_len) != 0)
			m.magic = 0;
	}
	return r;
}

void uct_xsrc_rc_iface_conn_fill_self(Iface *i, Ep *ep, ConnMsg &m)
{
	uct_iface_get_device_address(to_uct(i), reinterpret_cast<uct_device_addr_t *>(m.dev));
	if (ep)
		uct_ep_get_address(to_uct(ep), reinterpret_cast<uct_ep_addr_t *>(m.ep));
	memcpy(m.from, i->conn_name, sizeof(m.from));
}

void uct_xsrc_rc_iface_conn_on_request(Iface *i, const ConnMsg &req)
{
	ConnMsg rep{};
	rep.magic = conn_magic;
	rep.token = req.token;
	uct_ep_params_t p{};
	p.field_mask = UCT_EP_PARAM_FIELD_IFACE;
	p.iface = to_uct(i);
	uct_ep_h h = nullptr;
	ucs_status_t st = uct_xsrc_rc_ep_create(&p, &h);
	if (st == UCS_OK) {
		st = uct_xsrc_rc_ep_connect_to_ep(h, reinterpret_cast<const uct_device_addr_t *>(req.dev),
					 reinterpret_cast<const uct_ep_addr_t *>(req.ep));
		if (st != UCS_OK) {
			uct_xsrc_rc_ep_destroy(h);
			h = nullptr;
		}
	}
	if (h) {
		ep_of(h)->passive = true;
		rep.type = static_cast<uint8_t>(ConnType::reply);
		uct_xsrc_rc_iface_conn_fill_self(i, ep_of(h), rep);
	} else {
		rep.type = static_cast<uint8_t>(ConnType::reject);
		rep.status = st;
		uct_xsrc_rc_iface_conn_fill_self(i, nullptr, rep);
	}
	char to[sizeof(req.from) + 1]{};
	memcpy(to, req.from, sizeof(req.from));
	uct_xsrc_rc_iface_conn_send_msg(i, to, rep);  // lost only if the initiator is gone
}

void uct_xsrc_rc_iface_conn_on_answer(Iface *i, const ConnMsg &m)
{
	Ep *ep = nullptr;
	for (Ep *e : i->eps)
		if (e->id == m.token && !e->passive && e->state == EpState::idle)
			ep = e;
	if (!ep)
		return;  // destroyed meanwhile
	ucs_status_t st = static_cast<ConnType>(m.type) == ConnType::reply
				  ? uct_xsrc_rc_ep_connect_to_ep(to_uct(ep), reinterpret_cast<const uct_device_addr_t *>(m.dev),
							reinterpret_cast<const uct_ep_addr_t *>(m.ep))
				  : (m.status < 0 ? static_cast<ucs_status_t>(m.status) : UCS_ERR_REJECTED);
	if (st != UCS_OK)
		ep_set_failed(ep, st);
}

}  // namespace

size_t uct_xsrc_rc_iface_addr_len() { return sizeof(IfaceAddr); }

XrcKey uct_xsrc_rc_iface_conn_self_key(Iface *i)
{
	XrcKey k;
	memcpy(k.gid.data(), i->gid.raw, 16);
	k.pid = i->conn_pid;
	k.seq = i->conn_seq;
	return k;
}

ucs_status_t uct_xsrc_rc_iface_conn_send_xrc(Iface *i, const XrcKey &to, const XrcMsg &x)
{
	ConnMsg m{};
	m.magic = conn_magic;
	m.type = static_cast<uint8_t>(x.type);
	m.status = x.status;
	uct_xsrc_rc_iface_conn_fill_self(i, nullptr, m);
	m.pid = i->conn_pid;
	m.seq = i->conn_seq;
	m.ini = x.ini;
	m.tgt = x.tgt;
	char name[sizeof(IfaceAddr::name)];
	uct_xsrc_rc_iface_conn_name_of(to, name);
	return uct_xsrc_rc_iface_conn_send_msg(i, name, m);
}

bool uct_xsrc_rc_iface_conn_iface_alive(Iface *i, const XrcKey &k)
{
	char name[sizeof(IfaceAddr::name)];
	uct_xsrc_rc_iface_conn_name_of(k, name);
	socklen_t len;
	sockaddr_un a = uct_xsrc_rc_iface_conn_sun_of(name, &len);
	// An empty datagram: a live iface ignores it; nobody bound to the name refuses it.
	return !(sendto(i->conn_fd.get(), "", 0, MSG_DONTWAIT, reinterpret_cast<sockaddr *>(&a), len) < 0 &&
		 errno == ECONNREFUSED);
}

void uct_xsrc_rc_iface_conn_poll(Iface *i)
{
	ConnMsg m;
	ssize_t r;
	while (i->conn_fd && (r = uct_xsrc_rc_iface_conn_recv_one(i, m)) >= 0) {
		if (r != sizeof(m) || m.magic != conn_magic)
			continue;
		if (uct_xsrc_rc_iface_conn_is_xrc(m.type))
			uct_xsrc_rc_iface_conn_handle_xrc(i, m);
		else
			i->conn_deferred.emplace_back(reinterpret_cast<char *>(&m), reinterpret_cast<char *>(&m) + sizeof(m));
	}
}

ucs_status_t uct_xsrc_rc_iface_conn_open(Iface *i)
{
	static unsigned counter;
	i->conn_pid = static_cast<uint32_t>(getpid());
	i->conn_seq = xsrc::atomic(counter).fetch_add(1, std::memory_order_relaxed);
	snprintf(i->conn_name, sizeof(i->conn_name), "%s%u-%u", addr_prefix, i->conn_pid, i->conn_seq);
	xsrc::unique_fd fd(socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
	if (!fd)
		return UCS_ERR_IO_ERROR;
	socklen_t len;
	sockaddr_un a = uct_xsrc_rc_iface_conn_sun_of(i->conn_name, &len);
	if (bind(fd.get(), reinterpret_cast<sockaddr *>(&a), len) != 0)
		return UCS_ERR_IO_ERROR;
	i->conn_fd = std::move(fd);
	return iface_watch_fd(i, i->conn_fd.get(), true);
}

void uct_xsrc_rc_iface_conn_close(Iface *i)
{
	if (!i->conn_fd)
		return;
	iface_watch_fd(i, i->conn_fd.get(), false);
	i->conn_fd.reset();
}

ucs_status_t uct_xsrc_rc_iface_conn_get_address(Iface *i, uct_iface_addr_t *addr)
{
	if (!addr)
		return UCS_ERR_INVALID_PARAM;
	IfaceAddr a{};
	memcpy(a.name, i->conn_name, sizeof(a.name));
	memcpy(addr, &a, sizeof(a));
	return UCS_OK;
}

bool uct_xsrc_rc_iface_conn_addr_valid(const uct_iface_addr_t *addr)
{
	IfaceAddr a;
	memcpy(&a, addr, sizeof(a));
	return strncmp(a.name, addr_prefix, sizeof(addr_prefix) - 1) == 0 && memchr(a.name, 0, sizeof(a.name));
}

ucs_status_t uct_xsrc_rc_iface_conn_ep_create(Iface *i, const uct_device_addr_t *dev, const uct_iface_addr_t *iface_addr,
			       uct_ep_h *ep_p)
{
	if (!uct_xsrc_rc_iface_conn_addr_valid(iface_addr))
		return UCS_ERR_INVALID_PARAM;
	(void)dev;  // the peer's reply carries its device address again, with its ep address
	uct_ep_params_t p{};
	p.field_mask = UCT_EP_PARAM_FIELD_IFACE;
	p.iface = to_uct(i);
	uct_ep_h h = nullptr;
	ucs_status_t st = uct_xsrc_rc_ep_create(&p, &h);
	if (st != UCS_OK)
		return st;
	ConnMsg req{};
	req.magic = conn_magic;
	req.type = static_cast<uint8_t>(ConnType::request);
	req.token = ep_of(h)->id;
	uct_xsrc_rc_iface_conn_fill_self(i, ep_of(h), req);
	IfaceAddr a;
	memcpy(&a, iface_addr, sizeof(a));
	st = uct_xsrc_rc_iface_conn_send_msg(i, a.name, req);
	if (st != UCS_OK) {
		uct_xsrc_rc_ep_destroy(h);
		return st;
	}
	*ep_p = h;
	return UCS_OK;
}

unsigned uct_xsrc_rc_iface_conn_progress(Iface *i)
{
	unsigned n = 0;
	ConnMsg m;
	ssize_t r;
	for (;;) {
		if (!i->conn_deferred.empty()) {
			memcpy(&m, i->conn_deferred.front().data(), sizeof(m));
			i->conn_deferred.pop_front();
			r = sizeof(m);
		} else if (!i->conn_fd || (r = uct_xsrc_rc_iface_conn_recv_one(i, m)) < 0) {
			break;
		}
		++n;
		if (r != sizeof(m) || m.magic != conn_magic)
			continue;  // not ours: ignore
		if (uct_xsrc_rc_iface_conn_is_xrc(m.type))
			uct_xsrc_rc_iface_conn_handle_xrc(i, m);
		else if (static_cast<ConnType>(m.type) == ConnType::request)
			uct_xsrc_rc_iface_conn_on_request(i, m);
		else
			uct_xsrc_rc_iface_conn_on_answer(i, m);
	}
	return n;
}

}  // namespace xsrc::uct
