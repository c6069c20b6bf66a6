// rdma_cm's error paths on xsrc0, through librdmacm and the interposer (run
// under `xsrc run`): no listener, no route, peers killed while connecting and
// while connected, a process that never reads its events, GET_EVENT's
// non-blocking / poll / threads / signal behaviour, ids dying with their
// process and the id options; malformed commands written straight to a
// channel file are in cm_malformed_test.cpp (<rdma/rdma_user_cm.h> and
// librdmacm's header do not go together). Every wait is bounded. The binary
// is also its own peer process (`--peer ROLE PORT...`). Ports 19300-19399.
#include <fcntl.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <gtest/gtest.h>
#include <thread>

#include "cm_util.h"
#include "harness/child.h"

using namespace xsrc_cm_test;
using xsrc::harness::Child;
using xsrc::harness::Link;

namespace {

constexpr ms kStep{5000};     // one step that should take milliseconds
constexpr ms kSecond{1000};   // the "within a second"

// --- the peer process ---------------------------------------------------------

// Roles, by name: each reports over the link and then waits to be killed
// (or for the link to close).
int peer_main(Link &link, const std::vector<std::string> &args)
{
	if (args.size() < 2)
		return 2;
	const std::string &role = args[0];
	const uint16_t port = static_cast<uint16_t>(std::stoi(args[1]));
	const sockaddr_in addr = ipv4("loopback", port);
	auto hold = [&] {
		std::string s;
		link.recv_frame(&s, ms{60000});
		return 0;
	};
	Endpoint ep;
	if (role == "server-hold") {  // takes the request, never answers it
		if (!ep.listen(addr) || !link.send_frame("listening") || !ep.wait_request(kStep))
			return 1;
		link.send_frame("request");
		return hold();
	}
	if (role == "server-connected") {
		if (!ep.listen(addr) || !link.send_frame("listening") || !ep.wait_request(kStep) || !ep.accept(kStep))
			return 1;
		link.send_frame("connected");
		return hold();
	}
	if (role == "client-hold") {  // connects and stays connected
		if (!ep.connect(addr, kStep))
			return 1;
		link.send_frame("connected");
		return hold();
	}
	if (role == "client-request") {  // sends the request, never sees the answer
		if (!ep.start_connect(addr, kStep))
			return 1;
		link.send_frame("connecting");
		return hold();
	}
	if (role == "client-exchange") {  // connects, one message each way, exits
		if (!ep.connect(addr, kStep) || !ep.exchange(true, kStep))
			return 1;
		link.send_frame("done");
		return 0;
	}
	if (role == "lazy") {
		// Connects and never reads another event; a second channel has a
		// GET_EVENT waiting (held in the daemon) the whole time.
		rdma_event_channel *idle = rdma_create_event_channel();
		if (!idle)
			return 1;
		std::thread waiter([idle] {
			rdma_cm_event *ev;
			if (rdma_get_cm_event(idle, &ev) == 0)
				rdma_ack_cm_event(ev);
		});
		waiter.detach();
		if (!ep.start_connect(addr, kStep))
			return 1;
		Endpoint again;  // a second request, its events unread too
		if (!again.start_connect(addr, kStep))
			return 1;
		link.send_frame("connecting");
		return hold();
	}
	if (role == "listen-and-connect") {  // a listener of its own and a connection to us
		const uint16_t own = static_cast<uint16_t>(std::stoi(args.at(2)));
		Endpoint listener;
		if (!listener.listen(ipv4("loopback", own)) || !ep.connect(addr, kStep))
			return 1;
		link.send_frame("connected");
		return hold();
	}
	return 2;
}

std::string expect_frame(Child &child, ms timeout)
{
	std::string s;
	if (!child.link().recv_frame(&s, timeout))
		return "(nothing: peer exit " + std::to_string(child.wait(ms{0}).value_or(-1)) + ")";
	return s;
}

Child peer(const std::vector<std::string> &args) { return Child::spawn("--peer", args); }

// --- no one there -------------------------------------------------------------

TEST(CmUnreachable, NoListenerIsRejectedWithInvalidServiceId)
{
	Endpoint ep;
	auto t0 = std::chrono::steady_clock::now();
	ASSERT_TRUE(ep.start_connect(ipv4("netdev", 19301), kStep));
	auto ev = next_event(ep.channel(), kSecond);
	ASSERT_TRUE(ev) << "no answer within a second";
	EXPECT_EQ(ev->type, RDMA_CM_EVENT_REJECTED) << rdma_event_str(ev->type);
	EXPECT_EQ(ev->status, 8) << "invalid service id, as RoCE NICs report it";
	EXPECT_LT(std::chrono::steady_clock::now() - t0, kSecond);
	EXPECT_EQ(ep.qp_state(), IBV_QPS_ERR);
}

TEST(CmUnreachable, UdWithoutListenerIsUnreachable)
{
	rdma_event_channel *ch = rdma_create_event_channel();
	ASSERT_TRUE(ch);
	rdma_cm_id *id;
	ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_UDP), 0);
	sockaddr_in dst = ipv4("loopback", 19302);
	ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr *>(&dst), 2000), 0);
	auto ev = next_event(ch, kStep);
	ASSERT_TRUE(ev && ev->type == RDMA_CM_EVENT_ADDR_RESOLVED);
	ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
	ev = next_event(ch, kStep);
	ASSERT_TRUE(ev && ev->type == RDMA_CM_EVENT_ROUTE_RESOLVED);
	rdma_conn_param param{};
	param.qp_num = 0x1234;
	ASSERT_EQ(rdma_connect(id, &param), 0);
	ev = next_event(ch, kSecond);
	ASSERT_TRUE(ev) << "no SIDR answer within a second";
	EXPECT_EQ(ev->type, RDMA_CM_EVENT_UNREACHABLE) << rdma_event_str(ev->type);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

// An address nobody has: ADDR_ERROR when no route leads out of an xsrc
// device's netdev; where one does (a default route through the device's
// netdev, as on a CI machine), the address resolves, as the kernel's CM
// resolves it through the gateway, and the connect ends UNREACHABLE once the
// REQ's resends run out (10 sends, 1 to 1.25 s apart). Never connected,
// never a hang.
TEST(CmUnreachable, AddressNobodyHasNeverConnects)
{
	rdma_event_channel *ch = rdma_create_event_channel();
	ASSERT_TRUE(ch);
	rdma_cm_id *id;
	ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
	sockaddr_in dst = ipv4("192.0.2.1", 19303);  // TEST-NET-1: nobody's
	int rc = rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr *>(&dst), 2000);
	if (rc == 0) {
		auto ev = next_event(ch, kStep);
		ASSERT_TRUE(ev) << "no answer to resolve_addr";
		if (ev->type == RDMA_CM_EVENT_ADDR_RESOLVED) {
			ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
			ev = next_event(ch, kStep);
			ASSERT_TRUE(ev && ev->type == RDMA_CM_EVENT_ROUTE_RESOLVED);
			rdma_conn_param param{};
			param.qp_num = 0x1234;
			param.retry_count = 7;
			ASSERT_EQ(rdma_connect(id, &param), 0);
			ev = next_event(ch, std::chrono::seconds(20));
			ASSERT_TRUE(ev) << "no answer to a connect within 20 s";
			EXPECT_EQ(ev->type, RDMA_CM_EVENT_UNREACHABLE) << rdma_event_str(ev->type);
		} else {
			EXPECT_EQ(ev->type, RDMA_CM_EVENT_ADDR_ERROR) << rdma_event_str(ev->type);
			EXPECT_NE(ev->status, 0);
		}
	} else {
		ADD_FAILURE() << "resolve_addr refused at once: " << strerror(errno);
	}
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

// --- peers killed -------------------------------------------------------------

TEST(CmPeerKilled, WhileConnectingTheRequesterIsRejected)
{
	Child server = peer({"server-hold", "19310"});
	ASSERT_EQ(expect_frame(server, kStep), "listening");
	Endpoint ep;
	ASSERT_TRUE(ep.start_connect(ipv4("loopback", 19310), kStep));
	ASSERT_EQ(expect_frame(server, kStep), "request");
	server.kill();  // SIGKILL, reaped: its files are closed by the kernel
	auto t0 = std::chrono::steady_clock::now();
	auto ev = next_event(ep.channel(), kSecond);
	ASSERT_TRUE(ev) << "no event within a second of the peer's death";
	EXPECT_EQ(ev->type, RDMA_CM_EVENT_REJECTED) << rdma_event_str(ev->type);
	EXPECT_LT(std::chrono::steady_clock::now() - t0, kSecond);
	EXPECT_EQ(ep.qp_state(), IBV_QPS_ERR);
	int st = ep.send_status(kStep);
	EXPECT_NE(st, -1) << "a send on the dead connection never completed";
	EXPECT_NE(st, IBV_WC_SUCCESS);
}

TEST(CmPeerKilled, WhileConnectedTheSurvivorIsDisconnectedAndItsQpInError)
{
	Child server = peer({"server-connected", "19311"});
	ASSERT_EQ(expect_frame(server, kStep), "listening");
	Endpoint ep;
	ASSERT_TRUE(ep.connect(ipv4("loopback", 19311), kStep));
	ASSERT_EQ(expect_frame(server, kStep), "connected");
	ASSERT_EQ(ep.qp_state(), IBV_QPS_RTS);
	server.kill();
	auto t0 = std::chrono::steady_clock::now();
	ASSERT_TRUE(channel_readable(ep.channel(), kSecond)) << "no event within a second of the peer's death";
	EXPECT_LT(std::chrono::steady_clock::now() - t0, kSecond);
	// Before librdmacm sees the event: the daemon moved the QP itself.
	EXPECT_EQ(ep.qp_state(), IBV_QPS_ERR);
	auto ev = next_event(ep.channel(), kStep);
	ASSERT_TRUE(ev);
	EXPECT_EQ(ev->type, RDMA_CM_EVENT_DISCONNECTED) << rdma_event_str(ev->type);
	int st = ep.send_status(kStep);
	EXPECT_NE(st, -1) << "a send on the dead connection never completed";
	EXPECT_NE(st, IBV_WC_SUCCESS);
}

TEST(CmPeerKilled, RequesterKilledBeforeTheAnswerFailsTheAcceptAndNothingHangs)
{
	Endpoint ep;
	ASSERT_TRUE(ep.listen(ipv4("loopback", 19312)));
	Child client = peer({"client-request", "19312"});
	ASSERT_TRUE(ep.wait_request(kStep));
	ASSERT_EQ(expect_frame(client, kStep), "connecting");
	client.kill();
	// As the kernel's ucma: a request not accepted yet has no context of
	// its own, so its events are dropped and ACCEPT fails instead.
	auto ev = next_event(ep.channel(), ms{500});
	EXPECT_FALSE(ev) << "an event for a request nobody accepted: " << rdma_event_str(ev->type);
	std::this_thread::sleep_for(ms{100});
	EXPECT_FALSE(ep.accept(kStep)) << "accepted a request whose requester is dead";
	// rdma_destroy_id waits for every event the daemon counted on the id.
	rdma_cm_id *request = ep.take_id();
	std::atomic<bool> destroyed{false};
	std::thread destroyer([&] {
		if (request->qp)
			rdma_destroy_qp(request);
		rdma_destroy_id(request);
		destroyed = true;
	});
	for (int i = 0; i < 500 && !destroyed; ++i)
		std::this_thread::sleep_for(ms{10});
	if (!destroyed) {
		ADD_FAILURE() << "rdma_destroy_id of the request hangs";
		destroyer.detach();
		return;
	}
	destroyer.join();
}

TEST(CmPeerKilled, PassiveSurvivorIsDisconnectedAndItsQpInError)
{
	Endpoint ep;
	ASSERT_TRUE(ep.listen(ipv4("loopback", 19313)));
	Child client = peer({"client-hold", "19313"});
	ASSERT_TRUE(ep.wait_request(kStep));
	ASSERT_TRUE(ep.accept(kStep));
	ASSERT_EQ(expect_frame(client, kStep), "connected");
	client.kill();
	ASSERT_TRUE(channel_readable(ep.channel(), kSecond)) << "no event within a second of the peer's death";
	EXPECT_EQ(ep.qp_state(), IBV_QPS_ERR);
	auto ev = next_event(ep.channel(), kStep);
	ASSERT_TRUE(ev);
	EXPECT_EQ(ev->type, RDMA_CM_EVENT_DISCONNECTED) << rdma_event_str(ev->type);
	int st = ep.send_status(kStep);
	EXPECT_NE(st, -1) << "a send on the dead connection never completed";
	EXPECT_NE(st, IBV_WC_SUCCESS);
}

// --- one process does not stall the others -------------------------------------

long settled_cm_objects(long want, ms timeout)
{
	auto deadline = std::chrono::steady_clock::now() + timeout;
	long n = cm_objects();
	while (n != want && std::chrono::steady_clock::now() < deadline) {
		std::this_thread::sleep_for(ms{50});
		n = cm_objects();
	}
	return n;
}


void stall_scenario();

TEST(CmStall, AProcessThatNeverReadsItsEventsStallsNoOne)
{
	const long before = cm_objects();
	ASSERT_GE(before, 0) << "`xsrc status` has no rdma_cm line";
	{
		stall_scenario();
	}
	// A died with a GET_EVENT held and events unread: nothing of it is left.
	EXPECT_EQ(settled_cm_objects(before, kStep), before);
}

void stall_scenario()
{
	// B: our listener for the lazy process A, which connects twice and
	// then reads nothing (and has a GET_EVENT held on another channel).
	Endpoint b;
	ASSERT_TRUE(b.listen(ipv4("loopback", 19320)));
	Child a = peer({"lazy", "19320"});
	ASSERT_TRUE(b.wait_request(kStep));
	rdma_conn_param param{};
	param.responder_resources = param.initiator_depth = 1;
	ASSERT_EQ(rdma_accept(b.id(), &param), 0) << "accepting the lazy one";
	ASSERT_EQ(expect_frame(a, kStep), "connecting");

	// C and D (D is us, on another channel) connect and exchange data.
	for (int round = 0; round < 3; ++round) {
		Endpoint d;
		const uint16_t port = static_cast<uint16_t>(19321 + round);
		ASSERT_TRUE(d.listen(ipv4("loopback", port)));
		Child c = peer({"client-exchange", std::to_string(port)});
		ASSERT_TRUE(d.wait_request(kStep)) << "round " << round;
		ASSERT_TRUE(d.accept(kStep)) << "round " << round;
		ASSERT_TRUE(d.exchange(false, kStep)) << "round " << round;
		EXPECT_EQ(expect_frame(c, kStep), "done");
		auto status = c.wait(kStep);
		ASSERT_TRUE(status);
		EXPECT_EQ(xsrc::harness::exit_code(*status), 0);
	}
	EXPECT_TRUE(a.running());
	a.kill();
}

// --- GET_EVENT ----------------------------------------------------------------

TEST(CmGetEvent, NonBlockingChannelSaysEagain)
{
	rdma_event_channel *ch = rdma_create_event_channel();
	ASSERT_TRUE(ch);
	int flags = fcntl(ch->fd, F_GETFL);
	ASSERT_EQ(fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK), 0);
	rdma_cm_event *ev = nullptr;
	errno = 0;
	EXPECT_EQ(rdma_get_cm_event(ch, &ev), -1);
	EXPECT_EQ(errno, EAGAIN);
	// An event then comes at once, still without blocking.
	rdma_cm_id *id;
	ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
	sockaddr_in dst = ipv4("loopback", 19330);
	ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr *>(&dst), 2000), 0);
	ASSERT_TRUE(channel_readable(ch, kStep));
	ASSERT_EQ(rdma_get_cm_event(ch, &ev), 0);
	EXPECT_EQ(ev->event, RDMA_CM_EVENT_ADDR_RESOLVED);
	rdma_ack_cm_event(ev);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

TEST(CmGetEvent, PollIsReadableOnlyWhileAnEventWaits)
{
	rdma_event_channel *ch = rdma_create_event_channel();
	ASSERT_TRUE(ch);
	EXPECT_FALSE(channel_readable(ch, ms{100}));
	rdma_cm_id *id;
	ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
	EXPECT_FALSE(channel_readable(ch, ms{100}));
	sockaddr_in dst = ipv4("loopback", 19331);
	ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr *>(&dst), 2000), 0);
	EXPECT_TRUE(channel_readable(ch, kSecond));
	auto ev = next_event(ch, kStep);
	ASSERT_TRUE(ev);
	EXPECT_EQ(ev->type, RDMA_CM_EVENT_ADDR_RESOLVED);
	EXPECT_FALSE(channel_readable(ch, ms{100}));
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

TEST(CmGetEvent, ABlockedGetEventDoesNotHoldUpTheChannel)
{
	rdma_event_channel *ch = rdma_create_event_channel();
	ASSERT_TRUE(ch);
	std::atomic<int> got{-1};
	std::thread waiter([&] {
		rdma_cm_event *ev;
		if (rdma_get_cm_event(ch, &ev) == 0) {
			got = ev->event;
			rdma_ack_cm_event(ev);
		} else {
			got = -2;
		}
	});
	std::this_thread::sleep_for(ms{200});  // the waiter is in GET_EVENT
	rdma_cm_id *id;
	ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
	sockaddr_in dst = ipv4("loopback", 19332);
	ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr *>(&dst), 2000), 0);
	auto deadline = std::chrono::steady_clock::now() + kStep;
	while (got == -1 && std::chrono::steady_clock::now() < deadline)
		std::this_thread::sleep_for(ms{10});
	EXPECT_EQ(got, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (got == -1) {
		waiter.detach();  // stuck: do not destroy what it uses
		return;
	}
	waiter.join();
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

void on_alarm(int) {}

TEST(CmGetEvent, ASignalInterruptsABlockedGetEvent)
{
	struct sigaction sa{}, old{};
	sa.sa_handler = on_alarm;  // no SA_RESTART
	sigemptyset(&sa.sa_mask);
	ASSERT_EQ(sigaction(SIGALRM, &sa, &old), 0);
	rdma_event_channel *ch = rdma_create_event_channel();
	ASSERT_TRUE(ch);
	rdma_cm_id *id;
	ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
	// Should the signal not interrupt it, an event ends the wait after 3 s.
	std::atomic<bool> done{false};
	sigset_t alrm, saved;
	sigemptyset(&alrm);
	sigaddset(&alrm, SIGALRM);
	pthread_sigmask(SIG_BLOCK, &alrm, &saved);  // the fallback thread never takes the signal
	std::thread fallback([&] {
		for (int i = 0; i < 300 && !done; ++i)
			std::this_thread::sleep_for(ms{10});
		if (!done) {
			sockaddr_in dst = ipv4("loopback", 19333);
			rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr *>(&dst), 2000);
		}
	});
	pthread_sigmask(SIG_SETMASK, &saved, nullptr);
	itimerval tv{};
	tv.it_value.tv_usec = 200 * 1000;
	ASSERT_EQ(setitimer(ITIMER_REAL, &tv, nullptr), 0);
	rdma_cm_event *ev = nullptr;
	errno = 0;
	int rc = rdma_get_cm_event(ch, &ev);
	int err = errno;
	done = true;
	fallback.join();
	EXPECT_EQ(rc, -1);
	EXPECT_EQ(err, EINTR);
	if (rc == 0)
		rdma_ack_cm_event(ev);
	sigaction(SIGALRM, &old, nullptr);
	// The channel still works after the interrupted wait.
	sockaddr_in dst = ipv4("loopback", 19334);
	if (rc != 0) {
		ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr *>(&dst), 2000), 0);
		auto next = next_event(ch, kStep);
		ASSERT_TRUE(next);
		EXPECT_EQ(next->type, RDMA_CM_EVENT_ADDR_RESOLVED);
	}
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

// --- ids die with their process -------------------------------------------------

TEST(CmCleanup, IdsDieWithTheirProcess)
{
	const long before = cm_objects();
	ASSERT_GE(before, 0) << "`xsrc status` has no rdma_cm line";
	for (bool killed : {true, false}) {
		SCOPED_TRACE(killed ? "killed" : "exited");
		{
			Endpoint us;
			ASSERT_TRUE(us.listen(ipv4("loopback", 19340)));
			Child other = peer({"listen-and-connect", "19340", "19341"});
			ASSERT_TRUE(us.wait_request(kStep));
			ASSERT_TRUE(us.accept(kStep));
			ASSERT_EQ(expect_frame(other, kStep), "connected");
			// Ours: channel, listener, connection; its: two channels, a listener, a connection.
			EXPECT_EQ(cm_objects(), before + 7);
			if (killed)
				other.kill();
			else
				other.link().close();  // it returns from its wait and exits
			auto ev = next_event(us.channel(), kStep);
			ASSERT_TRUE(ev);
			EXPECT_EQ(ev->type, RDMA_CM_EVENT_DISCONNECTED);
			EXPECT_EQ(settled_cm_objects(before + 3, kStep), before + 3) << "the peer's ids outlived it";
			other.wait(kStep);
		}
		EXPECT_EQ(settled_cm_objects(before, kStep), before);
	}
}

// --- options ------------------------------------------------------------------

struct TwoIds : ::testing::Test {
	rdma_event_channel *ch = rdma_create_event_channel();
	rdma_cm_id *a = nullptr, *b = nullptr;
	void SetUp() override
	{
		ASSERT_TRUE(ch);
		ASSERT_EQ(rdma_create_id(ch, &a, nullptr, RDMA_PS_TCP), 0);
		ASSERT_EQ(rdma_create_id(ch, &b, nullptr, RDMA_PS_TCP), 0);
	}
	void TearDown() override
	{
		if (a)
			rdma_destroy_id(a);
		if (b)
			rdma_destroy_id(b);
		rdma_destroy_event_channel(ch);
	}
	static int set_int(rdma_cm_id *id, int name, int v)
	{
		return rdma_set_option(id, RDMA_OPTION_ID, name, &v, sizeof(v));
	}
	static int bind(rdma_cm_id *id, sockaddr_in addr) { return rdma_bind_addr(id, reinterpret_cast<sockaddr *>(&addr)); }
	static int bind6(rdma_cm_id *id, uint16_t port)
	{
		sockaddr_in6 a{};
		a.sin6_family = AF_INET6;
		a.sin6_port = htons(port);
		return rdma_bind_addr(id, reinterpret_cast<sockaddr *>(&a));
	}
	static int error_of(int rc) { return rc ? errno : 0; }
};

TEST_F(TwoIds, SameAddressAndPortIsInUse)
{
	ASSERT_EQ(bind(a, ipv4("loopback", 19350)), 0);
	EXPECT_EQ(error_of(bind(b, ipv4("loopback", 19350))), EADDRINUSE);
}

TEST_F(TwoIds, ReuseaddrLetsBothBind)
{
	ASSERT_EQ(set_int(a, RDMA_OPTION_ID_REUSEADDR, 1), 0);
	ASSERT_EQ(set_int(b, RDMA_OPTION_ID_REUSEADDR, 1), 0);
	ASSERT_EQ(bind(a, ipv4("loopback", 19351)), 0);
	EXPECT_EQ(bind(b, ipv4("loopback", 19351)), 0);
}

TEST_F(TwoIds, ReuseaddrOnOneSideOnlyIsInUse)
{
	ASSERT_EQ(set_int(b, RDMA_OPTION_ID_REUSEADDR, 1), 0);
	ASSERT_EQ(bind(a, ipv4("loopback", 19352)), 0);
	EXPECT_EQ(error_of(bind(b, ipv4("loopback", 19352))), EADDRINUSE);
}

TEST_F(TwoIds, AgainstAWildcardBindItIsNotAvailable)
{
	ASSERT_EQ(bind(a, ipv4("0.0.0.0", 19353)), 0);
	EXPECT_EQ(error_of(bind(b, ipv4("loopback", 19353))), EADDRNOTAVAIL);
}

TEST_F(TwoIds, AfonlyLetsV6AndV4WildcardsShareAPort)
{
	ASSERT_EQ(set_int(a, RDMA_OPTION_ID_AFONLY, 1), 0);
	ASSERT_EQ(bind6(a, 19354), 0);
	EXPECT_EQ(bind(b, ipv4("0.0.0.0", 19354)), 0);
}

TEST_F(TwoIds, WithoutAfonlyAV6WildcardTakesTheV4Port)
{
	ASSERT_EQ(set_int(a, RDMA_OPTION_ID_AFONLY, 0), 0);
	ASSERT_EQ(bind6(a, 19355), 0);
	EXPECT_EQ(error_of(bind(b, ipv4("0.0.0.0", 19355))), EADDRNOTAVAIL);
}

TEST_F(TwoIds, TosIsAcceptedAndUnknownOptionsAreNotImplemented)
{
	uint8_t tos = 32;
	EXPECT_EQ(rdma_set_option(a, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos)), 0);
	int v = 1;
	EXPECT_EQ(error_of(rdma_set_option(a, RDMA_OPTION_ID, 99, &v, sizeof(v))), ENOSYS);
	EXPECT_EQ(error_of(rdma_set_option(a, 77, 0, &v, sizeof(v))), ENOSYS);
}

}  // namespace

int main(int argc, char **argv)
{
	if (auto p = xsrc::harness::child_args(argc, argv, "--peer"))
		return peer_main(p->link, p->args);
	::testing::InitGoogleTest(&argc, argv);
	return RUN_ALL_TESTS();
}
