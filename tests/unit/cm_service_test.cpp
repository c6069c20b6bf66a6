// CmService in-process: the commands as librdmacm writes them, on a fake host
// with one device, a caller whose memory is a buffer and a front end that
// records answers. Two channels play the two processes.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_user_cm.h>

#include <chrono>
#include <cstring>
#include <gtest/gtest.h>
#include <optional>
#include <thread>

#include "cm_fakes.h"

namespace xsrc::cmtest {
namespace {

using std::chrono::milliseconds;

// Event types (enum rdma_cm_event_type) by value.
enum : uint32_t {
	kAddrResolved = 0, kAddrError = 1, kRouteResolved = 2, kConnectRequest = 4, kConnectResponse = 5,
	kUnreachable = 7, kRejected = 8, kEstablished = 9, kDisconnected = 10, kMulticastJoin = 12,
	kTimewaitExit = 15,
};

constexpr uint64_t kResp = BufferCaller::kBase + 0x1000;
constexpr uint64_t kOptval = BufferCaller::kBase + 0x2000;
constexpr uint64_t kHeldResp = BufferCaller::kBase + 0x3000;

sockaddr_storage ip(const char *addr, uint16_t port)
{
	sockaddr_storage s{};
	if (std::strchr(addr, ':')) {
		auto &a = reinterpret_cast<sockaddr_in6 &>(s);
		a.sin6_family = AF_INET6;
		a.sin6_port = htons(port);
		inet_pton(AF_INET6, addr, &a.sin6_addr);
	} else {
		auto &a = reinterpret_cast<sockaddr_in &>(s);
		a.sin_family = AF_INET;
		a.sin_port = htons(port);
		inet_pton(AF_INET, addr, &a.sin_addr);
	}
	return s;
}

uint16_t size_of(const sockaddr_storage &s)
{
	return s.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

class CmServiceTest : public ::testing::Test {
protected:
	CmServiceTest()
	{
		cm.set_front_end(&fe);
		cm.open_channel(1000, server);
		cm.open_channel(1000, client);
	}
	~CmServiceTest() override { cm.set_front_end(nullptr); }

	// One write() of `cmd` with `body`, `out` bytes of response room.
	template <typename T>
	int run(uint64_t ch, uint32_t cmd, const T &body, uint16_t out, bool nonblock = true, uint64_t token = 0,
		bool holdable = false)
	{
		std::vector<std::byte> buf(sizeof(rdma_ucm_cmd_hdr) + sizeof(T));
		rdma_ucm_cmd_hdr hdr{cmd, sizeof(T), out};
		std::memcpy(buf.data(), &hdr, sizeof(hdr));
		std::memcpy(buf.data() + sizeof(hdr), &body, sizeof(T));
		std::unique_ptr<Caller> held;
		if (holdable)
			held = std::make_unique<ForwardingCaller>(caller);
		return cm.execute(ch, caller, std::move(held), buf, nonblock, token);
	}

	uint32_t create_id(uint64_t ch, uint16_t ps = RDMA_PS_TCP, uint64_t uid = 0x77)
	{
		rdma_ucm_create_id c{};
		c.uid = uid;
		c.response = kResp;
		c.ps = ps;
		EXPECT_EQ(run(ch, RDMA_USER_CM_CMD_CREATE_ID, c, sizeof(rdma_ucm_create_id_resp)), 0);
		return caller.read<rdma_ucm_create_id_resp>(kResp).id;
	}
	int destroy_id(uint64_t ch, uint32_t id, uint32_t *events_reported = nullptr)
	{
		rdma_ucm_destroy_id c{kResp, id, 0};
		int err = run(ch, RDMA_USER_CM_CMD_DESTROY_ID, c, sizeof(rdma_ucm_destroy_id_resp));
		if (events_reported)
			*events_reported = caller.read<rdma_ucm_destroy_id_resp>(kResp).events_reported;
		return err;
	}
	int bind(uint64_t ch, uint32_t id, const sockaddr_storage &addr)
	{
		rdma_ucm_bind c{};
		c.id = id;
		c.addr_size = size_of(addr);
		std::memcpy(&c.addr, &addr, sizeof(addr));
		return run(ch, RDMA_USER_CM_CMD_BIND, c, 0);
	}
	int listen(uint64_t ch, uint32_t id, uint32_t backlog = 8)
	{
		rdma_ucm_listen c{id, backlog};
		return run(ch, RDMA_USER_CM_CMD_LISTEN, c, 0);
	}
	int resolve_addr(uint64_t ch, uint32_t id, const sockaddr_storage &dst)
	{
		rdma_ucm_resolve_addr c{};
		c.id = id;
		c.timeout_ms = 2000;
		c.dst_size = size_of(dst);
		std::memcpy(&c.dst_addr, &dst, sizeof(dst));
		return run(ch, RDMA_USER_CM_CMD_RESOLVE_ADDR, c, 0);
	}
	int resolve_route(uint64_t ch, uint32_t id)
	{
		rdma_ucm_resolve_route c{id, 2000};
		return run(ch, RDMA_USER_CM_CMD_RESOLVE_ROUTE, c, 0);
	}
	static rdma_ucm_conn_param conn(uint32_t qpn, const char *priv = "")
	{
		rdma_ucm_conn_param p{};
		p.qp_num = qpn;
		p.private_data_len = static_cast<uint8_t>(std::strlen(priv));
		std::memcpy(p.private_data, priv, p.private_data_len);
		p.responder_resources = 2;
		p.initiator_depth = 1;
		p.retry_count = 5;
		p.rnr_retry_count = 6;
		p.valid = 1;
		return p;
	}
	int connect(uint64_t ch, uint32_t id, uint32_t qpn, const char *priv = "")
	{
		rdma_ucm_connect c{};
		c.id = id;
		c.conn_param = conn(qpn, priv);
		return run(ch, RDMA_USER_CM_CMD_CONNECT, c, 0);
	}
	int accept(uint64_t ch, uint32_t id, std::optional<uint32_t> qpn, const char *priv = "")
	{
		rdma_ucm_accept c{};
		c.id = id;
		c.uid = 0x99;
		if (qpn)
			c.conn_param = conn(*qpn, priv);
		return run(ch, RDMA_USER_CM_CMD_ACCEPT, c, 0);
	}
	int disconnect(uint64_t ch, uint32_t id)
	{
		rdma_ucm_disconnect c{id};
		return run(ch, RDMA_USER_CM_CMD_DISCONNECT, c, 0);
	}
	int init_qp_attr(uint64_t ch, uint32_t id, uint32_t state, ib_uverbs_qp_attr &out)
	{
		rdma_ucm_init_qp_attr c{kResp, id, state};
		int err = run(ch, RDMA_USER_CM_CMD_INIT_QP_ATTR, c, sizeof(ib_uverbs_qp_attr));
		out = caller.read<ib_uverbs_qp_attr>(kResp);
		return err;
	}
	int set_option(uint64_t ch, uint32_t id, uint32_t level, uint32_t name, const void *val, uint32_t len)
	{
		std::memcpy(&scratch, val, len);
		caller.write(kOptval, scratch);
		rdma_ucm_set_option c{kOptval, id, level, name, len};
		return run(ch, RDMA_USER_CM_CMD_SET_OPTION, c, 0);
	}

	// The next event of `ch`, without waiting.
	std::optional<rdma_ucm_event_resp> event(uint64_t ch)
	{
		rdma_ucm_get_event c{kResp};
		if (run(ch, RDMA_USER_CM_CMD_GET_EVENT, c, sizeof(rdma_ucm_event_resp)) != 0)
			return std::nullopt;
		return caller.read<rdma_ucm_event_resp>(kResp);
	}
	// The next event within `timeout` (timer-driven ones).
	std::optional<rdma_ucm_event_resp> wait_event(uint64_t ch, milliseconds timeout)
	{
		auto deadline = std::chrono::steady_clock::now() + timeout;
		for (;;) {
			if (auto ev = event(ch))
				return ev;
			if (std::chrono::steady_clock::now() > deadline)
				return std::nullopt;
			std::this_thread::sleep_for(milliseconds(5));
		}
	}
	uint32_t expect_event(uint64_t ch, uint32_t type, int32_t status = 0)
	{
		auto ev = event(ch);
		EXPECT_TRUE(ev) << "no event (wanted " << type << ")";
		if (!ev)
			return 0;
		EXPECT_EQ(ev->event, type);
		EXPECT_EQ(static_cast<int32_t>(ev->status), status);
		return ev->id;
	}

	// A listener on the server channel at kDeviceIpv4:port and a client id
	// with its route resolved toward it.
	void listen_and_route(uint16_t port)
	{
		listener = create_id(server);
		ASSERT_EQ(bind(server, listener, ip(kDeviceIpv4, port)), 0);
		ASSERT_EQ(listen(server, listener), 0);
		active = create_id(client);
		ASSERT_EQ(resolve_addr(client, active, ip(kDeviceIpv4, port)), 0);
		expect_event(client, kAddrResolved);
		ASSERT_EQ(resolve_route(client, active), 0);
		expect_event(client, kRouteResolved);
	}
	// Up to ESTABLISHED on both sides: active QP 0x100, passive QP 0x200.
	void establish(uint16_t port)
	{
		listen_and_route(port);
		ASSERT_EQ(connect(client, active, 0x100, "hello"), 0);
		auto req = event(server);
		ASSERT_TRUE(req);
		ASSERT_EQ(req->event, kConnectRequest);
		passive = req->id;
		ASSERT_EQ(accept(server, passive, 0x200, "welcome"), 0);
		expect_event(client, kConnectResponse);
		ASSERT_EQ(accept(client, active, std::nullopt), 0);  // the RTU
		expect_event(server, kEstablished);
	}

	// The service goes first: its held GET_EVENTs keep callers of `caller`.
	FakeHost host;
	RecordingFrontEnd fe;
	BufferCaller caller;
	CmService cm{host};
	uint64_t server = 0, client = 0;
	uint32_t listener = 0, active = 0, passive = 0;
	std::array<std::byte, 256> scratch{};
};

TEST_F(CmServiceTest, ConnectionRunsRequestReplyReadyToUseWithPrivateData)
{
	listen_and_route(5000);
	ASSERT_EQ(connect(client, active, 0x100, "hello"), 0);
	auto req = event(server);
	ASSERT_TRUE(req);
	EXPECT_EQ(req->event, kConnectRequest);
	EXPECT_NE(req->id, listener) << "a request is a new id";
	EXPECT_EQ(req->uid, 0x77u) << "the listener's context";
	EXPECT_EQ(std::memcmp(req->param.conn.private_data, "hello", 5), 0);
	EXPECT_EQ(req->param.conn.private_data_len, 92 - 36) << "the REQ's private data room less the IP CM header";
	EXPECT_EQ(req->param.conn.qp_num, 0x100u);
	// The offer, seen from the passive side: its responder resources are the
	// active side's initiator depth.
	EXPECT_EQ(req->param.conn.responder_resources, 1);
	EXPECT_EQ(req->param.conn.initiator_depth, 2);
	passive = req->id;
	ASSERT_EQ(accept(server, passive, 0x200, "welcome"), 0);
	auto rep = event(client);
	ASSERT_TRUE(rep);
	EXPECT_EQ(rep->event, kConnectResponse);
	EXPECT_EQ(rep->param.conn.qp_num, 0x200u);
	EXPECT_EQ(std::memcmp(rep->param.conn.private_data, "welcome", 7), 0);
	EXPECT_EQ(rep->param.conn.private_data_len, 196);
	EXPECT_FALSE(event(server)) << "nothing before the RTU";
	ASSERT_EQ(accept(client, active, std::nullopt), 0);
	auto est = event(server);
	ASSERT_TRUE(est);
	EXPECT_EQ(est->event, kEstablished);
	EXPECT_EQ(est->uid, 0x99u) << "ACCEPT's uid is the request id's context from then on";
}

TEST_F(CmServiceTest, DisconnectOnBothSidesThenTimewaitExit)
{
	establish(5001);
	ASSERT_EQ(disconnect(client, active), 0);  // DREQ
	expect_event(server, kDisconnected);
	EXPECT_FALSE(event(client)) << "the DREQ's sender waits for the DREP";
	ASSERT_EQ(disconnect(server, passive), 0);  // DREP
	expect_event(client, kDisconnected);
	auto a = wait_event(client, milliseconds(3000));
	auto b = wait_event(server, milliseconds(3000));
	ASSERT_TRUE(a && b);
	EXPECT_EQ(a->event, kTimewaitExit);
	EXPECT_EQ(b->event, kTimewaitExit);
	EXPECT_TRUE(host.gone().empty()) << "an orderly disconnect moves no QP";
}

TEST_F(CmServiceTest, InitQpAttrGivesEachSideTheOthersQpAndMatchingPsns)
{
	establish(5002);
	ib_uverbs_qp_attr ai{}, ar{}, as{}, pi{}, pr{}, ps{};
	ASSERT_EQ(init_qp_attr(client, active, IBV_QPS_INIT, ai), 0);
	ASSERT_EQ(init_qp_attr(client, active, IBV_QPS_RTR, ar), 0);
	ASSERT_EQ(init_qp_attr(client, active, IBV_QPS_RTS, as), 0);
	ASSERT_EQ(init_qp_attr(server, passive, IBV_QPS_INIT, pi), 0);
	ASSERT_EQ(init_qp_attr(server, passive, IBV_QPS_RTR, pr), 0);
	ASSERT_EQ(init_qp_attr(server, passive, IBV_QPS_RTS, ps), 0);
	const uint32_t init_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	EXPECT_EQ(ai.qp_attr_mask, init_mask);
	EXPECT_EQ(pi.qp_attr_mask, init_mask);
	const uint32_t rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	EXPECT_EQ(ar.qp_attr_mask, rtr_mask);
	EXPECT_EQ(pr.qp_attr_mask, rtr_mask);
	const uint32_t rts_mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				  IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_TIMEOUT;
	EXPECT_EQ(as.qp_attr_mask, rts_mask);
	EXPECT_EQ(ps.qp_attr_mask, rts_mask);
	EXPECT_EQ(ar.dest_qp_num, 0x200u);
	EXPECT_EQ(pr.dest_qp_num, 0x100u);
	EXPECT_EQ(as.sq_psn, pr.rq_psn) << "what the active side sends first is what the passive side expects";
	EXPECT_EQ(ps.sq_psn, ar.rq_psn);
	EXPECT_EQ(ai.qp_state, IBV_QPS_INIT);
	EXPECT_EQ(ar.qp_state, IBV_QPS_RTR);
	EXPECT_EQ(ps.qp_state, IBV_QPS_RTS);
	// Both GIDs are the device's (one host): each side's AV points at the other's.
	EXPECT_EQ(std::memcmp(ar.ah_attr.grh.dgid, pr.ah_attr.grh.dgid, 16), 0);
	EXPECT_EQ(as.retry_cnt, 5);
	EXPECT_EQ(ps.retry_cnt, 5) << "the REQ's retry count on both sides";
	EXPECT_NE(ai.qp_access_flags & IBV_ACCESS_REMOTE_READ, 0u) << "responder resources were offered";
	// An id with nothing to connect has no RTR.
	uint32_t idle = create_id(client);
	ib_uverbs_qp_attr none{};
	EXPECT_EQ(init_qp_attr(client, idle, IBV_QPS_RTR, none), EINVAL) << "no device yet";
}

TEST_F(CmServiceTest, NoListenerIsRejectedWithInvalidServiceId)
{
	active = create_id(client);
	ASSERT_EQ(resolve_addr(client, active, ip(kDeviceIpv4, 5003)), 0);
	expect_event(client, kAddrResolved);
	ASSERT_EQ(resolve_route(client, active), 0);
	expect_event(client, kRouteResolved);
	ASSERT_EQ(connect(client, active, 0x100), 0);
	expect_event(client, kRejected, 8);
}

TEST_F(CmServiceTest, UdWithoutListenerIsUnreachable)
{
	active = create_id(client, RDMA_PS_UDP);
	ASSERT_EQ(resolve_addr(client, active, ip(kDeviceIpv4, 5004)), 0);
	expect_event(client, kAddrResolved);
	ASSERT_EQ(resolve_route(client, active), 0);
	expect_event(client, kRouteResolved);
	ASSERT_EQ(connect(client, active, 0x100), 0);
	auto ev = event(client);
	ASSERT_TRUE(ev);
	EXPECT_EQ(ev->event, kUnreachable);
}

TEST_F(CmServiceTest, AddressNoDeviceHasIsAddrError)
{
	active = create_id(client);
	ASSERT_EQ(resolve_addr(client, active, ip("192.0.2.1", 5005)), 0);
	auto ev = event(client);
	ASSERT_TRUE(ev);
	EXPECT_EQ(ev->event, kAddrError);
	EXPECT_NE(ev->status, 0u);
}

TEST_F(CmServiceTest, RejectCarriesPrivateDataAndReason)
{
	listen_and_route(5006);
	ASSERT_EQ(connect(client, active, 0x100), 0);
	auto req = event(server);
	ASSERT_TRUE(req);
	rdma_ucm_reject r{};
	r.id = req->id;
	r.reason = 28;
	r.private_data_len = 3;
	std::memcpy(r.private_data, "no!", 3);
	ASSERT_EQ(run(server, RDMA_USER_CM_CMD_REJECT, r, 0), 0);
	auto ev = event(client);
	ASSERT_TRUE(ev);
	EXPECT_EQ(ev->event, kRejected);
	EXPECT_EQ(ev->status, 28u);
	EXPECT_EQ(std::memcmp(ev->param.conn.private_data, "no!", 3), 0);
	EXPECT_EQ(ev->param.conn.private_data_len, 148);
	r.reason = 3;  // only the consumer's reasons are the consumer's to give
	EXPECT_EQ(run(server, RDMA_USER_CM_CMD_REJECT, r, 0), EINVAL);
}

TEST_F(CmServiceTest, DestroyedRequestRejectsTheRequester)
{
	listen_and_route(5007);
	ASSERT_EQ(connect(client, active, 0x100), 0);
	auto req = event(server);
	ASSERT_TRUE(req);
	ASSERT_EQ(destroy_id(server, req->id), 0);
	auto ev = event(client);
	ASSERT_TRUE(ev);
	EXPECT_EQ(ev->event, kRejected);
}

TEST_F(CmServiceTest, DestroyedRequesterRejectsTheRequest)
{
	listen_and_route(5008);
	ASSERT_EQ(connect(client, active, 0x100), 0);
	auto req = event(server);
	ASSERT_TRUE(req);
	ASSERT_EQ(destroy_id(client, active), 0);
	EXPECT_EQ(accept(server, req->id, 0x200), EINVAL) << "nothing left to answer";
}

TEST_F(CmServiceTest, AnUnacceptedRequestHasNoEventsOfItsOwn)
{
	// The kernel's ucma drops them (the request has no context until ACCEPT
	// gives it one); librdmacm would count such an event on the listener and
	// wait forever in rdma_destroy_id of the request.
	listen_and_route(5020);
	ASSERT_EQ(connect(client, active, 0x100), 0);
	auto req = event(server);
	ASSERT_TRUE(req);
	ASSERT_EQ(destroy_id(client, active), 0);  // the requester goes: a REJ to the request
	EXPECT_FALSE(event(server));
	EXPECT_EQ(accept(server, req->id, 0x200), EINVAL);
	uint32_t reported = 99;
	ASSERT_EQ(destroy_id(server, req->id, &reported), 0);
	EXPECT_EQ(reported, 0u);
	ASSERT_EQ(destroy_id(server, listener, &reported), 0);
	EXPECT_EQ(reported, 1u) << "the CONNECT_REQUEST counts on its listener";
}

TEST_F(CmServiceTest, DestroyWhileEstablishedDisconnectsThePeerAndErrorsItsQp)
{
	establish(5009);
	ASSERT_EQ(destroy_id(client, active), 0);
	expect_event(server, kDisconnected);
	auto gone = host.gone();
	ASSERT_EQ(gone.size(), 1u);
	EXPECT_EQ(gone[0].first, "xsrcfake0");
	EXPECT_EQ(gone[0].second, 0x200u) << "the survivor's QP";
}

TEST_F(CmServiceTest, ChannelReleaseDestroysItsIdsAndThePeerSeesIt)
{
	establish(5010);
	EXPECT_EQ(cm.object_count(), 2u + 3u);  // two channels, the listener, both ends
	cm.release_file(client);
	expect_event(server, kDisconnected);
	EXPECT_EQ(cm.object_count(), 1u + 2u);
	cm.release_file(server);
	EXPECT_EQ(cm.object_count(), 0u);
}

TEST_F(CmServiceTest, UnseenRequestsDieWithTheirListener)
{
	listen_and_route(5011);
	ASSERT_EQ(connect(client, active, 0x100), 0);
	ASSERT_EQ(destroy_id(server, listener), 0);
	expect_event(client, kRejected, 28);  // the IB CM's REJ of a destroyed request: consumer defined
	EXPECT_EQ(cm.object_count(), 2u + 1u);
}

TEST_F(CmServiceTest, DestroyReportsTheEventsTaken)
{
	active = create_id(client);
	ASSERT_EQ(resolve_addr(client, active, ip(kDeviceIpv4, 5012)), 0);
	ASSERT_TRUE(event(client));
	ASSERT_EQ(resolve_route(client, active), 0);  // its event stays queued
	uint32_t reported = 0;
	ASSERT_EQ(destroy_id(client, active, &reported), 0);
	EXPECT_EQ(reported, 1u);
	EXPECT_FALSE(event(client)) << "a destroyed id's events go with it";
}

TEST_F(CmServiceTest, HeldGetEventIsAnsweredWhenAnEventIsQueued)
{
	rdma_ucm_get_event g{kHeldResp};
	EXPECT_EQ(run(client, RDMA_USER_CM_CMD_GET_EVENT, g, sizeof(rdma_ucm_event_resp)), EAGAIN) << "O_NONBLOCK";
	EXPECT_EQ(run(client, RDMA_USER_CM_CMD_GET_EVENT, g, sizeof(rdma_ucm_event_resp), false, 41, true),
		  CmService::kHeld);
	EXPECT_TRUE(fe.answers().empty());
	EXPECT_FALSE(cm.readable(client));
	active = create_id(client);  // the channel serves on while a GET_EVENT waits
	ASSERT_EQ(resolve_addr(client, active, ip(kDeviceIpv4, 5013)), 0);
	auto answers = fe.answers();
	ASSERT_EQ(answers.size(), 1u);
	EXPECT_EQ(answers[0], std::make_pair(uint64_t{41}, 0));
	auto ev = caller.read<rdma_ucm_event_resp>(kHeldResp);
	EXPECT_EQ(ev.event, kAddrResolved);
	EXPECT_EQ(ev.id, active);
	EXPECT_FALSE(cm.readable(client)) << "the waiting GET_EVENT took it";
	ASSERT_EQ(resolve_route(client, active), 0);
	EXPECT_TRUE(cm.readable(client));
	auto r = fe.readable_calls();
	EXPECT_NE(std::find(r.begin(), r.end(), client), r.end());
}

TEST_F(CmServiceTest, CancelAnswersEintrAndReleaseAnswersTheRest)
{
	rdma_ucm_get_event g{kHeldResp};
	ASSERT_EQ(run(client, RDMA_USER_CM_CMD_GET_EVENT, g, sizeof(rdma_ucm_event_resp), false, 7, true),
		  CmService::kHeld);
	ASSERT_EQ(run(client, RDMA_USER_CM_CMD_GET_EVENT, g, sizeof(rdma_ucm_event_resp), false, 8, true),
		  CmService::kHeld);
	cm.cancel(7);
	cm.cancel(7);  // once only
	ASSERT_EQ(fe.answers().size(), 1u);
	EXPECT_EQ(fe.answers()[0], std::make_pair(uint64_t{7}, EINTR));
	cm.release_file(client);
	ASSERT_EQ(fe.answers().size(), 2u);
	EXPECT_EQ(fe.answers()[1].first, 8u);
	EXPECT_NE(fe.answers()[1].second, 0);
}

TEST_F(CmServiceTest, MigrateMovesAnIdAndItsEvents)
{
	static uint64_t from;
	from = client;
	cm.set_channel_of_fd([](int) { return from; });
	active = create_id(client);
	ASSERT_EQ(resolve_addr(client, active, ip(kDeviceIpv4, 5014)), 0);  // an event waits on client
	rdma_ucm_migrate_id m{kResp, active, 5};
	ASSERT_EQ(run(server, RDMA_USER_CM_CMD_MIGRATE_ID, m, sizeof(rdma_ucm_migrate_resp)), 0);
	EXPECT_EQ(caller.read<rdma_ucm_migrate_resp>(kResp).events_reported, 0u);
	EXPECT_FALSE(event(client));
	expect_event(server, kAddrResolved);
	EXPECT_EQ(destroy_id(client, active), EINVAL) << "it is the other channel's now";
	EXPECT_EQ(destroy_id(server, active), 0);
}

TEST_F(CmServiceTest, JoinAndLeaveMulticast)
{
	uint32_t id = create_id(client, RDMA_PS_UDP);
	ASSERT_EQ(bind(client, id, ip(kDeviceIpv4, 0)), 0);
	rdma_ucm_join_ip_mcast j{};
	j.response = kResp;
	j.uid = 0xabc;
	j.id = id;
	sockaddr_storage group = ip("224.1.2.3", 0);
	std::memcpy(&j.addr, &group, sizeof(sockaddr_in));
	ASSERT_EQ(run(client, RDMA_USER_CM_CMD_JOIN_IP_MCAST, j, sizeof(rdma_ucm_create_id_resp)), 0);
	uint32_t mc = caller.read<rdma_ucm_create_id_resp>(kResp).id;
	auto ev = event(client);
	ASSERT_TRUE(ev);
	EXPECT_EQ(ev->event, kMulticastJoin);
	EXPECT_EQ(ev->uid, 0xabcu);
	EXPECT_EQ(ev->param.ud.qp_num, 0xffffffu);
	// An IPv4 group on a RoCE v2 port: the IPv4-mapped GID ::ffff:224.1.2.3.
	const uint8_t mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 224, 1, 2, 3};
	EXPECT_EQ(std::memcmp(ev->param.ud.ah_attr.grh.dgid, mapped, 16), 0);
	EXPECT_EQ(cm.object_count(), 2u + 2u);
	rdma_ucm_destroy_id leave{kResp, mc, 0};
	ASSERT_EQ(run(client, RDMA_USER_CM_CMD_LEAVE_MCAST, leave, sizeof(rdma_ucm_destroy_id_resp)), 0);
	EXPECT_EQ(caller.read<rdma_ucm_destroy_id_resp>(kResp).events_reported, 1u);
	EXPECT_EQ(run(client, RDMA_USER_CM_CMD_LEAVE_MCAST, leave, sizeof(rdma_ucm_destroy_id_resp)), ENOENT);
	EXPECT_EQ(cm.object_count(), 2u + 1u);
	uint32_t rc = create_id(client);
	ASSERT_EQ(bind(client, rc, ip(kDeviceIpv4, 0)), 0);
	j.id = rc;
	EXPECT_EQ(run(client, RDMA_USER_CM_CMD_JOIN_IP_MCAST, j, sizeof(rdma_ucm_create_id_resp)), EINVAL)
		<< "an RC id joins nothing";
}

TEST_F(CmServiceTest, PortRules)
{
	uint32_t a = create_id(client), b = create_id(client);
	ASSERT_EQ(bind(client, a, ip(kDeviceIpv4, 6000)), 0);
	EXPECT_EQ(bind(client, b, ip(kDeviceIpv4, 6000)), EADDRINUSE);
	EXPECT_EQ(bind(client, b, ip("0.0.0.0", 6000)), EADDRNOTAVAIL) << "a wildcard over a taken port";
	EXPECT_EQ(bind(client, b, ip(kDeviceIpv4, 80)), EACCES) << "a privileged port, and the channel's uid is 1000";
	EXPECT_EQ(bind(client, b, ip(kDeviceIpv6, 6000)), 0) << "another address on the same port";
	EXPECT_EQ(bind(client, b, ip(kDeviceIpv6, 6001)), EINVAL) << "bound already";
}

TEST_F(CmServiceTest, ReuseaddrAndAfonly)
{
	int one = 1, zero = 0;
	uint32_t a = create_id(client), b = create_id(client);
	ASSERT_EQ(set_option(client, a, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof(one)), 0);
	ASSERT_EQ(set_option(client, b, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof(one)), 0);
	ASSERT_EQ(bind(client, a, ip(kDeviceIpv4, 6001)), 0);
	EXPECT_EQ(bind(client, b, ip(kDeviceIpv4, 6001)), 0);
	EXPECT_EQ(listen(client, a), EADDRINUSE) << "a listener is alone on its address, REUSEADDR or not";
	ASSERT_EQ(destroy_id(client, b), 0);
	EXPECT_EQ(listen(client, a), 0);

	uint32_t v6 = create_id(client), v4 = create_id(client);
	ASSERT_EQ(set_option(client, v6, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one, sizeof(one)), 0);
	ASSERT_EQ(bind(client, v6, ip("::", 6002)), 0);
	EXPECT_EQ(bind(client, v4, ip("0.0.0.0", 6002)), 0);

	uint32_t w6 = create_id(client), w4 = create_id(client);
	ASSERT_EQ(set_option(client, w6, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &zero, sizeof(zero)), 0);
	ASSERT_EQ(bind(client, w6, ip("::", 6003)), 0);
	EXPECT_EQ(bind(client, w4, ip("0.0.0.0", 6003)), EADDRNOTAVAIL);

	uint8_t tos = 16;
	EXPECT_EQ(set_option(client, w4, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1), 0);
	EXPECT_EQ(set_option(client, w4, RDMA_OPTION_ID, 99, &one, sizeof(one)), ENOSYS);
	EXPECT_EQ(set_option(client, w4, 42, 0, &one, sizeof(one)), ENOSYS);
	EXPECT_EQ(set_option(client, w4, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, 2), EINVAL);
}

TEST_F(CmServiceTest, UdConnectsThroughSidrWithQpnAndQkey)
{
	uint32_t ud_listener = create_id(server, RDMA_PS_UDP);
	ASSERT_EQ(bind(server, ud_listener, ip(kDeviceIpv4, 5016)), 0);
	ASSERT_EQ(listen(server, ud_listener), 0);
	uint32_t ud = create_id(client, RDMA_PS_UDP);
	ASSERT_EQ(resolve_addr(client, ud, ip(kDeviceIpv4, 5016)), 0);
	expect_event(client, kAddrResolved);
	ASSERT_EQ(resolve_route(client, ud), 0);
	expect_event(client, kRouteResolved);
	ASSERT_EQ(connect(client, ud, 0x300, "sidr"), 0);
	auto req = event(server);
	ASSERT_TRUE(req);
	EXPECT_EQ(req->event, kConnectRequest);
	EXPECT_EQ(std::memcmp(req->param.ud.private_data, "sidr", 4), 0);
	EXPECT_EQ(req->param.ud.private_data_len, 216 - 36);
	ASSERT_EQ(accept(server, req->id, 0x400, "ok"), 0);
	auto est = event(client);
	ASSERT_TRUE(est);
	EXPECT_EQ(est->event, kEstablished);
	EXPECT_EQ(est->param.ud.qp_num, 0x400u);
	EXPECT_EQ(est->param.ud.qkey, 0x01234567u) << "RDMA_UDP_QKEY when the acceptor gives none";
	EXPECT_EQ(std::memcmp(est->param.ud.private_data, "ok", 2), 0);
	// A UD QP's attributes are the same for every state: port, pkey and the qkey.
	for (uint32_t state : {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS}) {
		ib_uverbs_qp_attr a{};
		ASSERT_EQ(init_qp_attr(client, ud, state, a), 0);
		EXPECT_EQ(a.qp_attr_mask, uint32_t(IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
		EXPECT_EQ(a.qkey, 0x01234567u);
	}
}

TEST_F(CmServiceTest, CommEstablishedNotifyStandsInForTheRtu)
{
	listen_and_route(5017);
	ASSERT_EQ(connect(client, active, 0x100), 0);
	auto req = event(server);
	ASSERT_TRUE(req);
	passive = req->id;
	rdma_ucm_notify n{passive, IBV_EVENT_COMM_EST};
	EXPECT_EQ(run(server, RDMA_USER_CM_CMD_NOTIFY, n, 0), EINVAL) << "no REP sent yet";
	ASSERT_EQ(accept(server, passive, 0x200), 0);
	ASSERT_EQ(run(server, RDMA_USER_CM_CMD_NOTIFY, n, 0), 0);
	expect_event(server, kEstablished);
	EXPECT_EQ(run(server, RDMA_USER_CM_CMD_NOTIFY, n, 0), EISCONN);
}

TEST_F(CmServiceTest, PrivateDataBeyondTheCmMessageIsRefused)
{
	listen_and_route(5018);
	rdma_ucm_connect c{};
	c.id = active;
	c.conn_param = conn(0x100);
	c.conn_param.private_data_len = 92 - 36 + 1;
	EXPECT_EQ(run(client, RDMA_USER_CM_CMD_CONNECT, c, 0), EINVAL);
	c.conn_param.private_data_len = 92 - 36;
	EXPECT_EQ(run(client, RDMA_USER_CM_CMD_CONNECT, c, 0), 0);
	rdma_ucm_connect again = c;
	EXPECT_EQ(run(client, RDMA_USER_CM_CMD_CONNECT, again, 0), EINVAL) << "connecting already";
}

TEST_F(CmServiceTest, QueriesDescribeTheBoundDevice)
{
	establish(5019);
	rdma_ucm_query q{kResp, active, RDMA_USER_CM_QUERY_ADDR};
	ASSERT_EQ(run(client, RDMA_USER_CM_CMD_QUERY, q, sizeof(rdma_ucm_query_addr_resp)), 0);
	auto addr = caller.read<rdma_ucm_query_addr_resp>(kResp);
	EXPECT_EQ(addr.node_guid, htobe64(0x0002c9fffe000001ull));
	EXPECT_EQ(addr.src_size, sizeof(sockaddr_in));
	EXPECT_EQ(addr.dst_size, sizeof(sockaddr_in));
	EXPECT_EQ(ntohs(reinterpret_cast<const sockaddr_in &>(addr.dst_addr).sin_port), 5019);
	q.option = RDMA_USER_CM_QUERY_PATH;
	EXPECT_EQ(run(client, RDMA_USER_CM_CMD_QUERY, q, sizeof(rdma_ucm_query_path_resp)), ENOSPC)
		<< "no room for the one path there is";
	q.option = 77;
	EXPECT_EQ(run(client, RDMA_USER_CM_CMD_QUERY, q, sizeof(rdma_ucm_query_addr_resp)), ENOSYS);
	rdma_ucm_query r{kResp, passive, 0};
	ASSERT_EQ(run(server, RDMA_USER_CM_CMD_QUERY_ROUTE, r, sizeof(rdma_ucm_query_route_resp)), 0);
	auto route = caller.read<rdma_ucm_query_route_resp>(kResp);
	EXPECT_EQ(route.num_paths, 1);
	EXPECT_EQ(route.port_num, 1);
}

TEST_F(CmServiceTest, MalformedCommands)
{
	std::array<std::byte, 4> tiny{};
	EXPECT_EQ(cm.execute(client, caller, nullptr, tiny, true, 0), EINVAL);
	rdma_ucm_get_event g{kResp};
	EXPECT_EQ(run(client, 99, g, 0), EINVAL);
	EXPECT_EQ(run(client, RDMA_USER_CM_CMD_GET_OPTION, g, 0), ENOSYS);
	EXPECT_EQ(run(client, RDMA_USER_CM_CMD_GET_EVENT, g, 8), ENOSPC);
	rdma_ucm_create_id c{};
	c.response = 8;  // outside the caller's memory
	c.ps = RDMA_PS_TCP;
	EXPECT_EQ(run(client, RDMA_USER_CM_CMD_CREATE_ID, c, sizeof(rdma_ucm_create_id_resp)), EFAULT);
	EXPECT_EQ(cm.object_count(), 2u) << "the id whose response was lost is gone";
	EXPECT_EQ(destroy_id(client, 12345), ENOENT);
	uint32_t theirs = create_id(server);
	EXPECT_EQ(destroy_id(client, theirs), EINVAL);
	std::vector<std::byte> past(sizeof(rdma_ucm_cmd_hdr) + 4);
	rdma_ucm_cmd_hdr hdr{RDMA_USER_CM_CMD_CREATE_ID, sizeof(rdma_ucm_create_id), sizeof(rdma_ucm_create_id_resp)};
	std::memcpy(past.data(), &hdr, sizeof(hdr));
	EXPECT_EQ(cm.execute(client, caller, nullptr, past, true, 0), EINVAL);
	EXPECT_EQ(run(99, RDMA_USER_CM_CMD_GET_EVENT, g, sizeof(rdma_ucm_event_resp)), EBADF);
}

// --- the IB CM from another host (cm_wire.cpp) ----------------------------------

// A CM MAD as a RoCE v2 IPv4 packet from 10.0.0.2 to the device (kDeviceIpv4),
// laid out here from IBTA 12.6 and the kernel's IP CM header, not from xsrc's
// codec: IPv4, UDP to 4791, BTH (UD SEND Only, P_Key 0xFFFF, dest QP 1), DETH
// (Q_Key 0x80010000, source QP 1), the 256-byte MAD, a 4-byte ICRC slot.
struct MadPacket {
	std::vector<uint8_t> bytes = std::vector<uint8_t>(20 + 8 + 12 + 8 + 256 + 4);
	uint8_t *mad() { return bytes.data() + 48; }
	uint8_t *cm() { return mad() + 24; }  // the CM message after the MAD header
	void be(uint8_t *at, uint64_t v, int n)
	{
		for (int i = 0; i < n; ++i)
			at[i] = static_cast<uint8_t>(v >> (8 * (n - 1 - i)));
	}
	MadPacket(uint16_t attr, uint64_t tid)
	{
		uint8_t *ip = bytes.data();
		ip[0] = 0x45;
		be(ip + 2, bytes.size(), 2);
		ip[8] = 64;
		ip[9] = 17;
		inet_pton(AF_INET, "10.0.0.2", ip + 12);
		inet_pton(AF_INET, kDeviceIpv4, ip + 16);
		be(ip + 20, 0xC000, 2);
		be(ip + 22, 4791, 2);
		be(ip + 24, bytes.size() - 20, 2);
		uint8_t *bth = ip + 28;
		bth[0] = 0x64;
		be(bth + 2, 0xFFFF, 2);
		be(bth + 5, 1, 3);
		be(bth + 12, 0x80010000, 4);
		be(bth + 17, 1, 3);
		mad()[0] = 1;     // base version
		mad()[1] = 0x07;  // class: CM
		mad()[2] = 2;     // class version
		mad()[3] = 0x03;  // Send
		be(mad() + 8, tid, 8);
		be(mad() + 16, attr, 2);
	}
};

// A REQ from 10.0.0.2:40000, communication id 0x1234, QPN 0x300, PSN 0xabcdef,
// to `port` of the TCP port space, with `user` after the IP CM header.
MadPacket wire_req(uint16_t port, const char *user, uint8_t ip_cm_version = 0)
{
	MadPacket p(0x0010, 0x77);
	uint8_t *m = p.cm();
	p.be(m + 0, 0x1234, 4);
	p.be(m + 8, 0x0000000001060000ull | port, 8);
	p.be(m + 32, 0x300, 3);
	m[35] = 4;  // responder resources
	m[39] = 2;  // initiator depth
	p.be(m + 44, 0xabcdef, 3);
	m[47] = 7;  // retry count
	m[50] = 3 << 4 | 6;  // path MTU 1024, RNR retry 6
	uint8_t *h = m + 140;
	h[0] = ip_cm_version;
	h[1] = 0x40;
	p.be(h + 2, 40000, 2);
	inet_pton(AF_INET, "10.0.0.2", h + 4 + 12);
	inet_pton(AF_INET, kDeviceIpv4, h + 20 + 12);
	std::memcpy(h + 36, user, std::strlen(user));
	return p;
}

TEST_F(CmServiceTest, WireReqBecomesAConnectRequest)
{
	listener = create_id(server);
	ASSERT_EQ(bind(server, listener, ip(kDeviceIpv4, 5100)), 0);
	ASSERT_EQ(listen(server, listener), 0);
	MadPacket req = wire_req(5100, "from afar");
	ASSERT_TRUE(is_gsi_packet(req.bytes));
	cm.wire_receive(7, req.bytes);
	auto ev = event(server);
	ASSERT_TRUE(ev);
	ASSERT_EQ(ev->event, kConnectRequest);
	EXPECT_EQ(ev->param.conn.qp_num, 0x300u);
	// The requester's resources, as this side sees them.
	EXPECT_EQ(ev->param.conn.responder_resources, 2);
	EXPECT_EQ(ev->param.conn.initiator_depth, 4);
	EXPECT_EQ(ev->param.conn.rnr_retry_count, 6);
	EXPECT_EQ(ev->param.conn.private_data_len, 92 - 36);
	EXPECT_STREQ(reinterpret_cast<const char *>(ev->param.conn.private_data), "from afar");
	passive = ev->id;
	// The same REQ again (our REP not yet sent): no second request.
	cm.wire_receive(7, req.bytes);
	EXPECT_FALSE(event(server));
	// RTR takes the requester's PSN and QPN; the QP's MTU is the REQ's.
	ASSERT_EQ(accept(server, passive, 0x200), 0);
	ib_uverbs_qp_attr a{};
	ASSERT_EQ(init_qp_attr(server, passive, IBV_QPS_RTR, a), 0);
	EXPECT_EQ(a.rq_psn, 0xabcdefu);
	EXPECT_EQ(a.dest_qp_num, 0x300u);
	EXPECT_EQ(a.path_mtu, 3u);
	// An RTU for it: ESTABLISHED. Its remote comm id is ours, which only the
	// REP (sent to nobody here) told: without it the RTU is nobody's.
	MadPacket rtu(0x0014, 0x77);
	rtu.be(rtu.cm(), 0x1234, 4);
	rtu.be(rtu.cm() + 4, 0xdeadbeef, 4);
	cm.wire_receive(7, rtu.bytes);
	EXPECT_FALSE(event(server));
}

TEST_F(CmServiceTest, WireReqWithoutListenerOrHeaderMakesNoRequest)
{
	listener = create_id(server);
	ASSERT_EQ(bind(server, listener, ip(kDeviceIpv4, 5101)), 0);
	ASSERT_EQ(listen(server, listener), 0);
	const size_t before = cm.object_count();
	cm.wire_receive(7, wire_req(5102, "nobody listens").bytes);
	cm.wire_receive(7, wire_req(5101, "bad ip cm version", 1).bytes);
	EXPECT_FALSE(event(server));
	EXPECT_EQ(cm.object_count(), before);  // no request id was made
}

TEST_F(CmServiceTest, WireMalformedMadsAreCountedAndIgnored)
{
	listener = create_id(server);
	ASSERT_EQ(bind(server, listener, ip(kDeviceIpv4, 5103)), 0);
	ASSERT_EQ(listen(server, listener), 0);
	MadPacket req = wire_req(5103, "x");
	std::vector<uint8_t> short_packet(req.bytes.begin(), req.bytes.begin() + 100);
	cm.wire_receive(7, short_packet);
	MadPacket other_class = wire_req(5103, "x");
	other_class.mad()[1] = 0x04;  // performance management
	cm.wire_receive(7, other_class.bytes);
	MadPacket bad_qkey = wire_req(5103, "x");
	bad_qkey.bytes[40] = 0x12;
	cm.wire_receive(7, bad_qkey.bytes);
	MadPacket unknown_attr(0x0019, 1);
	cm.wire_receive(7, unknown_attr.bytes);
	EXPECT_FALSE(event(server));
	EXPECT_NE(cm.wire_status().find("cm_mads_bad=4"), std::string::npos) << cm.wire_status();
	MadPacket data = wire_req(5103, "x");
	data.bytes[28 + 5 + 2] = 0x20;  // dest QP 0x20: not QP1
	EXPECT_FALSE(is_gsi_packet(data.bytes));
}

}  // namespace
}  // namespace xsrc::cmtest
