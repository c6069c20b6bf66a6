// async_event: port and device events reach every open context through the
// async fd. A veth pair (xsrcv0 <-> xsrcv1) is the netdev of a device "xsrcv"
// of its own; link changes on either end must turn into IBV_EVENT_PORT_ERR /
// IBV_EVENT_PORT_ACTIVE, address changes into IBV_EVENT_GID_CHANGE, and
// `xsrc down --name xsrcv` into IBV_EVENT_DEVICE_FATAL. Every wait is bounded
// (non-blocking async fd + poll), and the veth and the device are removed
// whatever happens.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include "device_test_util.h"

using namespace xsrc_test;
using namespace std::chrono_literals;

namespace {

const std::string kDev = "xsrcv";
const std::string kIf = "xsrcv0";
const std::string kPeer = "xsrcv1";

int sh(const std::string &cmd, std::string *out = nullptr)
{
	int status = -1;
	std::string text = run(cmd, &status);
	if (out)
		*out = text;
	return status;
}

const char *event_name(int type)
{
	return ibv_event_type_str(static_cast<ibv_event_type>(type));
}

// Nonblocking async fd, so that a missing event fails instead of hanging.
void make_async_nonblocking(ibv_context *ctx)
{
	int flags = fcntl(ctx->async_fd, F_GETFL);
	ASSERT_GE(flags, 0);
	ASSERT_EQ(fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK), 0);
}

struct Event {
	int type = -1;
	int port = -1;
};

// The next async event within `timeout`, or type -1.
Event next_event(ibv_context *ctx, std::chrono::milliseconds timeout)
{
	auto deadline = std::chrono::steady_clock::now() + timeout;
	for (;;) {
		ibv_async_event ev{};
		if (ibv_get_async_event(ctx, &ev) == 0) {
			Event e{ev.event_type, -1};
			if (ev.event_type == IBV_EVENT_PORT_ACTIVE || ev.event_type == IBV_EVENT_PORT_ERR ||
			    ev.event_type == IBV_EVENT_GID_CHANGE || ev.event_type == IBV_EVENT_LID_CHANGE ||
			    ev.event_type == IBV_EVENT_PKEY_CHANGE || ev.event_type == IBV_EVENT_SM_CHANGE ||
			    ev.event_type == IBV_EVENT_CLIENT_REREGISTER)
				e.port = ev.element.port_num;
			ibv_ack_async_event(&ev);
			return e;
		}
		if (errno != EAGAIN && errno != EWOULDBLOCK) {
			ADD_FAILURE() << "ibv_get_async_event: " << strerror(errno);
			return {};
		}
		auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
			deadline - std::chrono::steady_clock::now()).count();
		if (left <= 0)
			return {};
		pollfd p{ctx->async_fd, POLLIN, 0};
		poll(&p, 1, static_cast<int>(left));
	}
}

// Waits for an event of `type`; GID changes on the way (IPv6 link-local
// addresses come and go with the link) are skipped, anything else fails.
::testing::AssertionResult wait_event(ibv_context *ctx, ibv_event_type type,
				      std::chrono::milliseconds timeout = 10s, int *port = nullptr)
{
	auto deadline = std::chrono::steady_clock::now() + timeout;
	std::string seen;
	for (;;) {
		auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
			deadline - std::chrono::steady_clock::now());
		Event e = next_event(ctx, std::max(left, 0ms));
		if (e.type < 0)
			return ::testing::AssertionFailure()
			       << "no " << event_name(type) << " within " << timeout.count() << " ms"
			       << (seen.empty() ? "" : "; saw:" + seen);
		if (e.type == type) {
			if (port)
				*port = e.port;
			return ::testing::AssertionSuccess();
		}
		seen += std::string(" ") + event_name(e.type);
		if (e.type != IBV_EVENT_GID_CHANGE)
			return ::testing::AssertionFailure()
			       << "expected " << event_name(type) << ", got" << seen;
	}
}

// No event other than GID changes arrives within `quiet`.
::testing::AssertionResult no_port_event(ibv_context *ctx, std::chrono::milliseconds quiet)
{
	auto deadline = std::chrono::steady_clock::now() + quiet;
	for (;;) {
		auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
			deadline - std::chrono::steady_clock::now());
		if (left <= 0ms)
			return ::testing::AssertionSuccess();
		Event e = next_event(ctx, left);
		if (e.type >= 0 && e.type != IBV_EVENT_GID_CHANGE)
			return ::testing::AssertionFailure() << "unexpected " << event_name(e.type);
	}
}

ibv_port_state port_state(ibv_context *ctx)
{
	ibv_port_attr attr{};
	EXPECT_EQ(ibv_query_port(ctx, 1, &attr), 0);
	return attr.state;
}

bool gid_present(ibv_context *ctx, const std::string &ipv4)
{
	in_addr a{};
	if (inet_pton(AF_INET, ipv4.c_str(), &a) != 1)
		return false;
	ibv_port_attr attr{};
	if (ibv_query_port(ctx, 1, &attr))
		return false;
	for (int i = 0; i < attr.gid_tbl_len; ++i) {
		ibv_gid gid{};
		if (ibv_query_gid(ctx, 1, i, &gid))
			continue;
		static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
		if (!memcmp(gid.raw, prefix, 12) && !memcmp(gid.raw + 12, &a, 4))
			return true;
	}
	return false;
}

class AsyncEvent : public ::testing::Test {
protected:
	void SetUp() override
	{
		std::string out;
		sh("ip link del " + kIf);  // left over from an interrupted run
		ASSERT_EQ(sh("ip link add " + kIf + " type veth peer name " + kPeer, &out), 0) << out;
		veth_ = true;
		ASSERT_EQ(sh("ip link set " + kIf + " up && ip link set " + kPeer + " up", &out), 0) << out;
		ASSERT_TRUE(wait_until(10s, [] {
			return run("cat /sys/class/net/" + kIf + "/operstate").starts_with("up");
		})) << kIf << " did not come up";
		ASSERT_EQ(sh(xsrc_cli() + " up --name " + kDev + " --netdev " + kIf, &out), 0) << out;
		device_ = true;
		auto st = device_status(kDev);
		ASSERT_TRUE(st);
		ASSERT_EQ(st->netdev, kIf);
		ASSERT_TRUE(wait_until(10s, [] {
			auto s = device_status(kDev);
			return s && s->port == "ACTIVE";
		})) << "port of " << kDev << " not ACTIVE";
	}

	void TearDown() override
	{
		for (ibv_context *ctx : contexts_)
			ibv_close_device(ctx);
		contexts_.clear();
		if (device_) {
			std::string out;
			EXPECT_EQ(sh(xsrc_cli() + " down --name " + kDev, &out), 0) << out;
		}
		if (veth_)
			sh("ip link del " + kIf);
		EXPECT_FALSE(device_status(kDev)) << kDev << " still listed after xsrc down";
	}

	ibv_context *open()
	{
		ibv_context *ctx = open_device(kDev);
		EXPECT_NE(ctx, nullptr) << "ibv_open_device(" << kDev << "): " << strerror(errno);
		if (ctx) {
			contexts_.push_back(ctx);
			make_async_nonblocking(ctx);
		}
		return ctx;
	}

	void forget(ibv_context *ctx) { std::erase(contexts_, ctx); }

	std::vector<ibv_context *> contexts_;
	bool veth_ = false;
	bool device_ = false;
};

TEST_F(AsyncEvent, PeerDownAndUp)
{
	ibv_context *ctx = open();
	ASSERT_NE(ctx, nullptr);
	ASSERT_EQ(port_state(ctx), IBV_PORT_ACTIVE);
	EXPECT_TRUE(no_port_event(ctx, 200ms));

	ASSERT_EQ(sh("ip link set " + kPeer + " down"), 0);  // our end loses carrier
	int port = -1;
	ASSERT_TRUE(wait_event(ctx, IBV_EVENT_PORT_ERR, 10s, &port));
	EXPECT_EQ(port, 1);
	EXPECT_EQ(port_state(ctx), IBV_PORT_DOWN);
	EXPECT_EQ(device_status(kDev)->port, "DOWN");

	ASSERT_EQ(sh("ip link set " + kPeer + " up"), 0);
	ASSERT_TRUE(wait_event(ctx, IBV_EVENT_PORT_ACTIVE, 10s, &port));
	EXPECT_EQ(port, 1);
	EXPECT_EQ(port_state(ctx), IBV_PORT_ACTIVE);
	EXPECT_EQ(device_status(kDev)->port, "ACTIVE");
}

TEST_F(AsyncEvent, OwnNetdevDownAndUp)
{
	ibv_context *ctx = open();
	ASSERT_NE(ctx, nullptr);
	ASSERT_EQ(sh("ip link set " + kIf + " down"), 0);
	int port = -1;
	ASSERT_TRUE(wait_event(ctx, IBV_EVENT_PORT_ERR, 10s, &port));
	EXPECT_EQ(port, 1);
	EXPECT_EQ(port_state(ctx), IBV_PORT_DOWN);
	// Only one PORT_ERR for one transition.
	EXPECT_TRUE(no_port_event(ctx, 300ms));

	ASSERT_EQ(sh("ip link set " + kIf + " up"), 0);
	ASSERT_TRUE(wait_event(ctx, IBV_EVENT_PORT_ACTIVE, 10s, &port));
	EXPECT_EQ(port, 1);
	EXPECT_EQ(port_state(ctx), IBV_PORT_ACTIVE);
}

TEST_F(AsyncEvent, EveryContextGetsTheEvent)
{
	ibv_context *a = open();
	ibv_context *b = open();
	ASSERT_TRUE(a && b);
	ASSERT_EQ(sh("ip link set " + kPeer + " down"), 0);
	EXPECT_TRUE(wait_event(a, IBV_EVENT_PORT_ERR));
	EXPECT_TRUE(wait_event(b, IBV_EVENT_PORT_ERR));
	ASSERT_EQ(sh("ip link set " + kPeer + " up"), 0);
	EXPECT_TRUE(wait_event(a, IBV_EVENT_PORT_ACTIVE));
	EXPECT_TRUE(wait_event(b, IBV_EVENT_PORT_ACTIVE));
}

TEST_F(AsyncEvent, MtuChangeKeepsPortActive)
{
	ibv_context *ctx = open();
	ASSERT_NE(ctx, nullptr);
	ASSERT_EQ(sh("ip link set " + kIf + " mtu 9000"), 0);
	ASSERT_TRUE(wait_until(5s, [&] {
		ibv_port_attr attr{};
		return ibv_query_port(ctx, 1, &attr) == 0 && attr.active_mtu == IBV_MTU_4096;
	})) << "active_mtu did not follow the netdev MTU (9000 -> 4096)";
	EXPECT_TRUE(no_port_event(ctx, 300ms)) << "an MTU change is not a port state change";
	EXPECT_EQ(port_state(ctx), IBV_PORT_ACTIVE);
}

TEST_F(AsyncEvent, AddressChangeIsGidChange)
{
	ibv_context *ctx = open();
	ASSERT_NE(ctx, nullptr);
	// Let the IPv6 link-local address settle, then drain.
	wait_until(3s, [] { return run("ip -6 addr show dev " + kIf).find("fe80") != std::string::npos; });
	no_port_event(ctx, 300ms);
	const std::string addr = "10.231.77.1";
	ASSERT_EQ(sh("ip addr add " + addr + "/24 dev " + kIf), 0);
	ASSERT_TRUE(wait_event(ctx, IBV_EVENT_GID_CHANGE));
	EXPECT_TRUE(wait_until(2s, [&] { return gid_present(ctx, addr); }))
		<< "no ::ffff:" << addr << " GID after the address was added";
	ASSERT_EQ(sh("ip addr del " + addr + "/24 dev " + kIf), 0);
	ASSERT_TRUE(wait_event(ctx, IBV_EVENT_GID_CHANGE));
	EXPECT_TRUE(wait_until(2s, [&] { return !gid_present(ctx, addr); }))
		<< "::ffff:" << addr << " GID still there after the address was removed";
	EXPECT_EQ(port_state(ctx), IBV_PORT_ACTIVE);
}

TEST_F(AsyncEvent, DeviceDownIsDeviceFatal)
{
	ibv_context *ctx = open();
	ASSERT_NE(ctx, nullptr);
	ibv_pd *pd = ibv_alloc_pd(ctx);
	ASSERT_NE(pd, nullptr);
	ibv_cq *cq = ibv_create_cq(ctx, 4, nullptr, nullptr, 0);
	ASSERT_NE(cq, nullptr);

	std::string out;
	ASSERT_EQ(sh(xsrc_cli() + " down --name " + kDev, &out), 0) << out;
	device_ = false;
	ASSERT_TRUE(wait_event(ctx, IBV_EVENT_DEVICE_FATAL, 10s));
	EXPECT_FALSE(device_status(kDev));

	// Later verbs fail (the kernel answers EIO on a disassociated context).
	errno = 0;
	EXPECT_EQ(ibv_alloc_pd(ctx), nullptr);
	EXPECT_EQ(errno, EIO);
	ibv_port_attr attr{};
	EXPECT_NE(ibv_query_port(ctx, 1, &attr), 0);
	ibv_device_attr dattr{};
	EXPECT_NE(ibv_query_device(ctx, &dattr), 0);
	EXPECT_EQ(ibv_create_cq(ctx, 4, nullptr, nullptr, 0), nullptr);
	// The device is gone from discovery too.
	EXPECT_EQ(open_device(kDev), nullptr);
	// A device brought up again under the same name is a new device: the old
	// context stays disassociated, a new one works.
	ASSERT_EQ(sh(xsrc_cli() + " up --name " + kDev + " --netdev " + kIf, &out), 0) << out;
	device_ = true;
	errno = 0;
	EXPECT_EQ(ibv_alloc_pd(ctx), nullptr) << "a disassociated context reached the new device";
	EXPECT_EQ(errno, EIO);
	ibv_context *fresh = open();
	ASSERT_NE(fresh, nullptr);
	ibv_pd *fresh_pd = ibv_alloc_pd(fresh);
	EXPECT_NE(fresh_pd, nullptr) << strerror(errno);
	if (fresh_pd) {
		EXPECT_EQ(ibv_dealloc_pd(fresh_pd), 0);
	}
	EXPECT_EQ(device_status(kDev)->contexts, 1) << "the old context counts on the new device";
	// Closing the context still works (destroy calls may fail; the objects are gone).
	(void)ibv_destroy_cq(cq);
	(void)ibv_dealloc_pd(pd);
	forget(ctx);
	EXPECT_EQ(ibv_close_device(ctx), 0);
	// xsrc0 was not affected.
	auto main = device_status(test_device());
	EXPECT_TRUE(main && main->port == "ACTIVE");
}

// An application that closed its async fd (or never reads it) must not hurt
// the daemon or the other contexts when events are posted.
TEST_F(AsyncEvent, ClosedAsyncFdHarmsNobody)
{
	ibv_context *rude = open();
	ibv_context *good = open();
	ASSERT_TRUE(rude && good);
	close(rude->async_fd);
	ASSERT_EQ(sh("ip link set " + kPeer + " down"), 0);
	EXPECT_TRUE(wait_event(good, IBV_EVENT_PORT_ERR));
	ASSERT_EQ(sh("ip link set " + kPeer + " up"), 0);
	EXPECT_TRUE(wait_event(good, IBV_EVENT_PORT_ACTIVE));
	// Both contexts still serve commands.
	ibv_pd *pd = ibv_alloc_pd(rude);
	EXPECT_NE(pd, nullptr) << strerror(errno);
	if (pd) {
		EXPECT_EQ(ibv_dealloc_pd(pd), 0);
	}
	EXPECT_EQ(port_state(good), IBV_PORT_ACTIVE);
	rude->async_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // for ibv_close_device to close
}

TEST_F(AsyncEvent, NetdevDeletedIsPortErr)
{
	ibv_context *ctx = open();
	ASSERT_NE(ctx, nullptr);
	ASSERT_EQ(sh("ip link del " + kIf), 0);
	veth_ = false;
	ASSERT_TRUE(wait_event(ctx, IBV_EVENT_PORT_ERR, 10s));
	EXPECT_EQ(port_state(ctx), IBV_PORT_DOWN);
	auto st = device_status(kDev);
	ASSERT_TRUE(st);
	EXPECT_EQ(st->port, "DOWN");
}

}  // namespace
