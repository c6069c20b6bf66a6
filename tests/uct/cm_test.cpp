// Connection set-up by socket address (the shim's iface-level sockaddr mode) between two
// processes on xsrc0, through UCX's public API: a server iface opened with
// UCT_IFACE_OPEN_MODE_SOCKADDR_SERVER (this process) and a client ep created with
// UCT_EP_PARAM_FIELD_SOCKADDR (the peer); uct_iface_accept / uct_iface_reject,
// uct_ep_create(conn_request), uct_ep_connect, uct_cm_client_ep_conn_notify,
// uct_ep_disconnect; data both ways afterwards.
#include "tag_harness.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <memory>
#include <vector>

using namespace xsrc_uct_test;

namespace {

constexpr uint8_t am_id = 5;
const std::string client_priv = "client-private-data";
const std::string server_priv = "server-private-data";

// What the peer is told to do.
struct ClientCfg {
	uint16_t port;
	uint8_t use_resolve;  // cm_resolve_cb + uct_ep_connect instead of sockaddr_pack_cb
	char disconnect;      // 'C': the client starts it, 'S': the server does, 'N': nobody
};

// What the peer saw.
struct ClientReport {
	int32_t connect_status;
	int32_t err_calls;
	int32_t err_status;
	uint32_t server_priv_len;
	char server_priv[64];
};

struct ClientState {
	int connect_calls = 0;
	ucs_status_t connect_status = UCS_INPROGRESS;
	std::string server_priv;
	int resolved = 0;
	int disconnects = 0;
	int err_calls = 0;
	ucs_status_t err_status = UCS_OK;
	std::vector<std::string> am;
};

ucs_status_t on_am(void *arg, void *data, size_t length, unsigned)
{
	// am_short: 8 bytes of header, then the payload.
	static_cast<std::vector<std::string> *>(arg)->emplace_back(static_cast<char *>(data) + 8, length - 8);
	return UCS_OK;
}

ucs_status_t send_am(Side &s, uct_ep_h ep, std::string_view text)
{
	return s.retry([&] { return uct_ep_am_short(ep, am_id, 0x1234, text.data(), static_cast<unsigned>(text.size())); });
}

XSRC_UCT_PEER(cm_client)
{
	ClientCfg cfg;
	PEER_CHECK(link.recv_value(&cfg, kLinkTimeout));
	ClientState cs;
	Side side;
	uct_iface_params_t ip{};
	ip.field_mask = UCT_IFACE_PARAM_FIELD_ERR_HANDLER | UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG |
			UCT_IFACE_PARAM_FIELD_ERR_HANDLER_FLAGS;
	ip.err_handler = [](void *arg, uct_ep_h, ucs_status_t status) {
		auto *c = static_cast<ClientState *>(arg);
		++c->err_calls;
		c->err_status = status;
		return UCS_OK;
	};
	ip.err_handler_arg = &cs;
	ip.err_handler_flags = UCT_CB_FLAG_ASYNC;
	PEER_CHECK_EQ(side.open(ip), UCS_OK);
	PEER_CHECK(side.attr.cap.flags & UCT_IFACE_FLAG_CONNECT_TO_SOCKADDR);
	PEER_CHECK_EQ(uct_iface_set_am_handler(side.iface, am_id, on_am, &cs.am, UCT_CB_FLAG_ASYNC), UCS_OK);

	sockaddr_in sin{};
	sin.sin_family = AF_INET;
	sin.sin_port = htons(cfg.port);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ucs_sock_addr_t sa{reinterpret_cast<sockaddr *>(&sin), sizeof(sin)};

	uct_ep_params_t p{};
	p.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_USER_DATA | UCT_EP_PARAM_FIELD_SOCKADDR |
		       UCT_EP_PARAM_FIELD_SOCKADDR_CB_FLAGS | UCT_EP_PARAM_FIELD_SOCKADDR_CONNECT_CB_CLIENT |
		       UCT_EP_PARAM_FIELD_SOCKADDR_DISCONNECT_CB;
	p.iface = side.iface;
	p.user_data = &cs;
	p.sockaddr = &sa;
	p.sockaddr_cb_flags = UCT_CB_FLAG_ASYNC;
	p.sockaddr_cb_client = [](uct_ep_h, void *arg, const uct_cm_ep_client_connect_args_t *a) {
		auto *c = static_cast<ClientState *>(arg);
		++c->connect_calls;
		c->connect_status = a->status;
		if (a->status == UCS_OK && (a->field_mask & UCT_CM_EP_CLIENT_CONNECT_ARGS_FIELD_REMOTE_DATA) &&
		    (a->remote_data->field_mask & UCT_CM_REMOTE_DATA_FIELD_CONN_PRIV_DATA))
			c->server_priv.assign(static_cast<const char *>(a->remote_data->conn_priv_data),
					      a->remote_data->conn_priv_data_length);
	};
	p.disconnect_cb = [](uct_ep_h, void *arg) { ++static_cast<ClientState *>(arg)->disconnects; };
	if (cfg.use_resolve) {
		p.field_mask |= UCT_EP_PARAM_FIELD_CM_RESOLVE_CB;
		p.cm_resolve_cb = [](void *arg, const uct_cm_ep_resolve_args_t *a) {
			auto *c = static_cast<ClientState *>(arg);
			c->resolved = (a->field_mask & UCT_CM_EP_RESOLVE_ARGS_FIELD_STATUS) && a->status == UCS_OK ? 1 : -1;
			return UCS_OK;
		};
	} else {
		p.field_mask |= UCT_EP_PARAM_FIELD_SOCKADDR_PACK_CB;
		p.sockaddr_pack_cb = [](void *, const uct_cm_ep_priv_data_pack_args_t *, void *priv) -> ssize_t {
			std::memcpy(priv, client_priv.data(), client_priv.size());
			return static_cast<ssize_t>(client_priv.size());
		};
	}
	uct_ep_h ep;
	PEER_CHECK_EQ(uct_ep_create(&p, &ep), UCS_OK);
	PEER_CHECK_EQ(uct_ep_disconnect(ep, 0), UCS_ERR_BUSY);  // not connected yet
	PEER_CHECK_EQ(uct_cm_client_ep_conn_notify(ep), UCS_ERR_NOT_CONNECTED);
	if (cfg.use_resolve) {
		PEER_CHECK(side.progress_until([&] { return cs.resolved != 0; }));
		PEER_CHECK_EQ(cs.resolved, 1);
		uct_ep_connect_params_t cp{};
		cp.field_mask = UCT_EP_CONNECT_PARAM_FIELD_PRIVATE_DATA | UCT_EP_CONNECT_PARAM_FIELD_PRIVATE_DATA_LENGTH;
		cp.private_data = client_priv.data();
		cp.private_data_length = client_priv.size();
		PEER_CHECK_EQ(uct_ep_connect(ep, &cp), UCS_OK);
		PEER_CHECK_EQ(uct_ep_connect(ep, &cp), UCS_ERR_BUSY);  // once
	}
	PEER_CHECK(side.progress_until([&] { return cs.connect_calls > 0; }));
	side.progress_for(50);  // an error handler call comes right after

	ClientReport rep{};
	rep.connect_status = cs.connect_status;
	rep.err_calls = cs.err_calls;
	rep.err_status = cs.err_status;
	rep.server_priv_len = static_cast<uint32_t>(std::min(cs.server_priv.size(), sizeof(rep.server_priv)));
	std::memcpy(rep.server_priv, cs.server_priv.data(), rep.server_priv_len);
	PEER_CHECK(link.send_value(rep));
	PEER_CHECK_EQ(cs.connect_calls, 1);
	if (cs.connect_status == UCS_OK) {
		PEER_CHECK_EQ(uct_cm_client_ep_conn_notify(ep), UCS_OK);
		PEER_CHECK_EQ(send_am(side, ep, "ping"), UCS_OK);
		PEER_CHECK(side.progress_until([&] { return !cs.am.empty(); }));
		PEER_CHECK(cs.am[0] == "pong");
		PEER_CHECK(link.send_frame("got pong"));
		if (cfg.disconnect == 'C') {
			PEER_CHECK_EQ(uct_ep_disconnect(ep, 0), UCS_INPROGRESS);
			PEER_CHECK(side.progress_until([&] { return cs.disconnects > 0; }));
			PEER_CHECK_EQ(uct_ep_disconnect(ep, 0), UCS_ERR_NOT_CONNECTED);
			PEER_CHECK(link.send_frame("disconnected"));
		} else if (cfg.disconnect == 'S') {
			PEER_CHECK(side.progress_until([&] { return cs.disconnects > 0; }));
			PEER_CHECK_EQ(uct_ep_disconnect(ep, 0), UCS_OK);  // answering the server's
			PEER_CHECK_EQ(uct_ep_disconnect(ep, 0), UCS_ERR_NOT_CONNECTED);
			PEER_CHECK(link.send_frame("disconnected"));
		}
	}
	// Until the test side says bye (it may still need our progress).
	while (!link.readable())
		if (!side.progress())
			usleep(50);
	PEER_CHECK_EQ(cs.disconnects, cfg.disconnect == 'N' || cs.connect_status != UCS_OK ? 0 : 1);
	uct_ep_destroy(ep);
	return 0;
}

// --- The server (this process) ------------------------------------------------------------------
enum class Decision { accept_then_adopt, accept_by_ep_create, reject };

struct Server {
	Decision decision = Decision::accept_then_adopt;
	int requests = 0;
	std::string priv;
	ucs_status_t decision_status = UCS_INPROGRESS;
	ucs_status_t adopt_status = UCS_INPROGRESS;
	uct_ep_h ep = nullptr;
	int notify_calls = 0;
	ucs_status_t notify_status = UCS_INPROGRESS;
	int disconnects = 0;
	std::vector<std::string> am;
	uct_iface_h iface = nullptr;
};

void adopt(Server *s, uct_conn_request_h req, bool with_priv)
{
	uct_ep_params_t p{};
	p.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_CONN_REQUEST | UCT_EP_PARAM_FIELD_USER_DATA |
		       UCT_EP_PARAM_FIELD_SOCKADDR_NOTIFY_CB_SERVER | UCT_EP_PARAM_FIELD_SOCKADDR_DISCONNECT_CB;
	p.iface = s->iface;
	p.conn_request = req;
	p.user_data = s;
	p.sockaddr_cb_server = [](uct_ep_h, void *arg, const uct_cm_ep_server_conn_notify_args_t *a) {
		auto *sv = static_cast<Server *>(arg);
		++sv->notify_calls;
		sv->notify_status = a->status;
	};
	p.disconnect_cb = [](uct_ep_h, void *arg) { ++static_cast<Server *>(arg)->disconnects; };
	if (with_priv) {
		p.field_mask |= UCT_EP_PARAM_FIELD_PRIV_DATA | UCT_EP_PARAM_FIELD_PRIV_DATA_LENGTH;
		p.private_data = server_priv.data();
		p.private_data_length = server_priv.size();
	}
	s->adopt_status = uct_ep_create(&p, &s->ep);
}

void on_conn_request(uct_iface_h iface, void *arg, uct_conn_request_h req, const void *priv, size_t length)
{
	auto *s = static_cast<Server *>(arg);
	++s->requests;
	s->priv.assign(static_cast<const char *>(priv), length);
	EXPECT_EQ(iface, s->iface);
	switch (s->decision) {
	case Decision::accept_then_adopt:
		s->decision_status = uct_iface_accept(iface, req);
		EXPECT_EQ(uct_iface_accept(iface, req), UCS_ERR_INVALID_PARAM) << "accepted once";
		adopt(s, req, false);
		break;
	case Decision::accept_by_ep_create:
		adopt(s, req, true);
		s->decision_status = s->adopt_status;
		break;
	case Decision::reject:
		s->decision_status = uct_iface_reject(iface, req);
		EXPECT_EQ(uct_iface_accept(iface, req), UCS_ERR_INVALID_PARAM) << "a rejected request is gone";
		break;
	}
}

class Cm : public ::testing::Test {
protected:
	void SetUp() override
	{
		ASSERT_EQ(srv.open_md(), UCS_OK);
		sockaddr_in sin{};
		sin.sin_family = AF_INET;
		sin.sin_port = 0;  // any free port: read back from iface_query
		sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		uct_iface_params_t p{};
		p.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_SOCKADDR;
		p.open_mode = UCT_IFACE_OPEN_MODE_SOCKADDR_SERVER;
		p.mode.sockaddr.listen_sockaddr = {reinterpret_cast<sockaddr *>(&sin), sizeof(sin)};
		p.mode.sockaddr.conn_request_cb = on_conn_request;
		p.mode.sockaddr.conn_request_arg = &server;
		p.mode.sockaddr.cb_flags = UCT_CB_FLAG_ASYNC;
		ASSERT_EQ(srv.open(p), UCS_OK);
		server.iface = srv.iface;
		ASSERT_EQ(uct_iface_set_am_handler(srv.iface, am_id, on_am, &server.am, UCT_CB_FLAG_ASYNC), UCS_OK);
		ASSERT_TRUE(srv.attr.cap.flags & UCT_IFACE_FLAG_CONNECT_TO_SOCKADDR);
		ASSERT_GE(srv.attr.max_conn_priv, client_priv.size());
		ASSERT_EQ(srv.attr.listen_sockaddr.ss_family, AF_INET);
		port = ntohs(reinterpret_cast<const sockaddr_in *>(&srv.attr.listen_sockaddr)->sin_port);
		ASSERT_NE(port, 0) << "the listening port is reported";
	}
	void TearDown() override
	{
		if (peer) {
			peer->link.send_frame("bye");
			auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
			int rc = -1;
			while (std::chrono::steady_clock::now() < end) {  // keep progressing: the peer may need us
				srv.progress();
				rc = peer->wait(1);
				if (rc != -1)
					break;
			}
			EXPECT_EQ(rc, 0) << "the peer's checks";
		}
		if (server.ep)
			uct_ep_destroy(server.ep);
	}
	void start(bool use_resolve, char disconnect)
	{
		peer = std::make_unique<Peer>("cm_client");
		ASSERT_TRUE(peer->started());
		ClientCfg cfg{port, static_cast<uint8_t>(use_resolve), disconnect};
		ASSERT_TRUE(peer->link.send_value(cfg));
	}
	ClientReport report()
	{
		ClientReport r{};
		bool ok = srv.progress_until([&] { return peer->link.readable(); }, 15000) &&
			  peer->link.recv_value(&r, kLinkTimeout);
		EXPECT_TRUE(ok) << "no report from the client";
		return r;
	}
	bool wait_link(const char *what)
	{
		std::string msg;
		bool ok = srv.progress_until([&] { return peer->link.readable(); }, 15000) &&
			  peer->link.recv_frame(&msg, kLinkTimeout);
		return ok && msg == what;
	}
	// Connect, then data both ways.
	void connect_and_talk(bool use_resolve, char disconnect, Decision d)
	{
		server.decision = d;
		start(use_resolve, disconnect);
		ClientReport r = report();
		ASSERT_EQ(server.requests, 1);
		EXPECT_EQ(server.priv, client_priv) << "conn_request_cb gets the client's private data";
		EXPECT_EQ(server.decision_status, UCS_OK);
		EXPECT_EQ(server.adopt_status, UCS_OK);
		ASSERT_NE(server.ep, nullptr);
		ASSERT_EQ(r.connect_status, UCS_OK);
		EXPECT_EQ(r.err_calls, 0);
		EXPECT_EQ(std::string(r.server_priv, r.server_priv_len), d == Decision::accept_by_ep_create ? server_priv : "");
		// The client's conn_notify reaches sockaddr_cb_server; then data flows both ways.
		ASSERT_TRUE(srv.progress_until([&] { return server.notify_calls > 0; }));
		EXPECT_EQ(server.notify_status, UCS_OK);
		ASSERT_TRUE(srv.progress_until([&] { return !server.am.empty(); }));
		EXPECT_EQ(server.am[0], "ping");
		EXPECT_EQ(send_am(srv, server.ep, "pong"), UCS_OK);
		EXPECT_TRUE(wait_link("got pong"));
	}

	Side srv;
	Server server;
	std::unique_ptr<Peer> peer;
	uint16_t port = 0;
};

TEST_F(Cm, AcceptThenDataBothWays)
{
	connect_and_talk(false, 'N', Decision::accept_then_adopt);
	EXPECT_EQ(server.disconnects, 0);
}

TEST_F(Cm, AcceptByEpCreateWithResolveAndConnect)
{
	connect_and_talk(true, 'N', Decision::accept_by_ep_create);
}

TEST_F(Cm, RejectReachesTheClient)
{
	server.decision = Decision::reject;
	start(false, 'N');
	ClientReport r = report();
	EXPECT_EQ(server.requests, 1);
	EXPECT_EQ(server.decision_status, UCS_OK);
	EXPECT_EQ(server.ep, nullptr);
	EXPECT_EQ(r.connect_status, UCS_ERR_REJECTED) << "sockaddr_cb_client hears the rejection";
	EXPECT_EQ(r.err_calls, 1) << "and the client iface's error handler (uct_iface_reject)";
	EXPECT_EQ(r.err_status, UCS_ERR_REJECTED);
}

TEST_F(Cm, DisconnectStartedByTheClient)
{
	connect_and_talk(false, 'C', Decision::accept_then_adopt);
	ASSERT_TRUE(srv.progress_until([&] { return server.disconnects > 0; }));
	EXPECT_EQ(uct_ep_disconnect(server.ep, 0), UCS_OK) << "answering the client's disconnect";
	EXPECT_TRUE(wait_link("disconnected"));
	EXPECT_EQ(server.disconnects, 1);
	EXPECT_EQ(uct_ep_disconnect(server.ep, 0), UCS_ERR_NOT_CONNECTED);
}

TEST_F(Cm, DisconnectStartedByTheServer)
{
	connect_and_talk(false, 'S', Decision::accept_then_adopt);
	EXPECT_EQ(uct_ep_disconnect(server.ep, 0), UCS_INPROGRESS);
	EXPECT_TRUE(wait_link("disconnected"));
	ASSERT_TRUE(srv.progress_until([&] { return server.disconnects > 0; })) << "the client answered";
	EXPECT_EQ(server.disconnects, 1);
	EXPECT_EQ(uct_ep_disconnect(server.ep, 0), UCS_ERR_NOT_CONNECTED);
}

TEST_F(Cm, ClientDeathIsADisconnect)
{
	connect_and_talk(false, 'N', Decision::accept_then_adopt);
	peer.reset();  // SIGKILL: the TCP connection drops
	ASSERT_TRUE(srv.progress_until([&] { return server.disconnects > 0; }));
	EXPECT_EQ(server.disconnects, 1);
}

TEST(CmClient, NoServerIsUnreachable)
{
	// A port nobody listens on: bind one, then close it.
	xsrc::unique_fd fd(socket(AF_INET, SOCK_STREAM, 0));
	ASSERT_GE(fd.get(), 0);
	sockaddr_in sin{};
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t len = sizeof(sin);
	ASSERT_EQ(bind(fd.get(), reinterpret_cast<sockaddr *>(&sin), sizeof(sin)), 0);
	ASSERT_EQ(getsockname(fd.get(), reinterpret_cast<sockaddr *>(&sin), &len), 0);
	fd.reset();

	Side side;
	ASSERT_EQ(side.open(), UCS_OK);
	ClientState cs;
	ucs_sock_addr_t sa{reinterpret_cast<sockaddr *>(&sin), sizeof(sin)};
	uct_ep_params_t p{};
	p.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_USER_DATA | UCT_EP_PARAM_FIELD_SOCKADDR |
		       UCT_EP_PARAM_FIELD_SOCKADDR_CONNECT_CB_CLIENT;
	p.iface = side.iface;
	p.user_data = &cs;
	p.sockaddr = &sa;
	p.sockaddr_cb_client = [](uct_ep_h, void *arg, const uct_cm_ep_client_connect_args_t *a) {
		auto *c = static_cast<ClientState *>(arg);
		++c->connect_calls;
		c->connect_status = a->status;
	};
	uct_ep_h ep;
	ASSERT_EQ(uct_ep_create(&p, &ep), UCS_OK);
	ASSERT_TRUE(side.progress_until([&] { return cs.connect_calls > 0; }));
	EXPECT_EQ(cs.connect_status, UCS_ERR_UNREACHABLE);
	EXPECT_EQ(uct_ep_disconnect(ep, 0), UCS_ERR_BUSY) << "never connected";
	uct_ep_destroy(ep);

	// Parameters that cannot work get a status.
	p.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_SOCKADDR;
	p.sockaddr = nullptr;
	EXPECT_EQ(uct_ep_create(&p, &ep), UCS_ERR_INVALID_PARAM);
	p.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_CONN_REQUEST;
	p.conn_request = reinterpret_cast<uct_conn_request_h>(&cs);  // not a request of this iface
	EXPECT_EQ(uct_ep_create(&p, &ep), UCS_ERR_INVALID_PARAM);
	EXPECT_EQ(uct_iface_accept(side.iface, reinterpret_cast<uct_conn_request_h>(&cs)), UCS_ERR_INVALID_PARAM);
	EXPECT_EQ(uct_iface_reject(side.iface, reinterpret_cast<uct_conn_request_h>(&cs)), UCS_ERR_INVALID_PARAM);
}

}  // namespace

int main(int argc, char **argv)
{
	return xsrc_uct_test::peer_or_tests_main(argc, argv);
}
