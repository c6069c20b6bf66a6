// The connection manager's connections (cm.h): the frames on the wire, one Conn per TCP
// connection with its client or server state machine (cm_conn.cpp), and the iface's CmState.
#pragma once

#include "internal.h"

#include "common/fd.h"

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace xsrc::uct::cm {

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
	xsrc::unique_fd fd;
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
	xsrc::unique_fd listen_fd;
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


inline CmState *uct_xsrc_cm_state_of(Iface *iface) { return static_cast<CmState *>(iface_cm_state(iface)); }
inline Conn *uct_xsrc_cm_conn_of(Ep *ep) { return static_cast<Conn *>(ep_cm_state(ep)); }
inline const uct_iface_ops_t &uct_xsrc_cm_ops_of(Iface *iface) { return to_uct(iface)->ops; }

ucs_status_t uct_xsrc_cm_errno_status(int e);
Conn *uct_xsrc_cm_find_conn(CmState *, const void *handle);  // a live conn, or null
void uct_xsrc_cm_conn_close_fd(Conn *);
// Writes what is queued; the rest goes out from progress (POLLOUT).
void uct_xsrc_cm_conn_flush(Conn *);
void uct_xsrc_cm_conn_send_frame(Conn *, FrameType, std::string_view dev = {}, std::string_view ep = {},
				 std::string_view priv = {});
// Reads what arrived and handles every complete frame; EOF or an error ends the conn.
void uct_xsrc_cm_conn_on_readable(Conn *);
// A plain data ep on the iface (the core's path without cm fields), and its end.
ucs_status_t uct_xsrc_cm_data_ep_create(Iface *, Ep **ep_p);
void uct_xsrc_cm_data_ep_destroy(Iface *, Ep *);
// The user's private data, from ep params (private_data or sockaddr_pack_cb).
ucs_status_t uct_xsrc_cm_pack_priv(CmState *, uct_cm_ep_priv_data_pack_callback_t, void *arg, std::string *out);
// Client: the connection failed before it was up (callbacks and error handler); the TCP
// connection is up (resolve callback, or CONN_REQ); CONN_REQ with the private data.
void uct_xsrc_cm_client_fail(Conn *, ucs_status_t);
void uct_xsrc_cm_client_tcp_up(Conn *);
void uct_xsrc_cm_client_send_request(Conn *, std::string_view priv);
// Server: REJECT; or a connected data ep and ACCEPT (REJECT when that fails).
void uct_xsrc_cm_server_reject(Conn *);
ucs_status_t uct_xsrc_cm_server_accept(Conn *, std::string_view priv);
// A non-blocking TCP socket (TCP_NODELAY for IP).
xsrc::unique_fd uct_xsrc_cm_socket(int family);
void uct_xsrc_cm_accept_clients(CmState *);
void uct_xsrc_cm_sweep(CmState *);  // frees dead conns

}  // namespace xsrc::uct::cm
