// xsrcd's wire receiver (xsrcd/wire_receiver.cpp) on the loopback netdev:
// its timer. Needs CAP_NET_RAW for the packet socket (CTest runs as root).
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "common/fd.h"
#include "wire/headers.h"
#include "wire_receiver.h"

namespace xsrc {
namespace {

// The time the timer asks for is kept with no packet arriving: it runs
// again at that time or after it (the receiver keeps one timer armed, and
// moves it only when it would fire more than a millisecond late). A
// datagram to UDP 4791 wakes the receiver first: it runs the timer after
// each batch.
TEST(WireReceiverTimer, RunsAtTheTimeItAskedForWithNoPacketArriving)
{
	std::atomic<int> calls{0};
	std::atomic<uint64_t> asked{0}, again{0};
	int err = 0;
	std::unique_ptr<WireReceiver> r = WireReceiver::start(
		static_cast<int>(if_nametoindex("lo")), [](std::span<const uint8_t>) { return WireOutcome::dropped; },
		err, {}, [&]() -> uint64_t {
			const uint64_t now = monotonic_ns();
			if (calls++ == 0) {
				asked = now + 2'000'000;
				return asked;
			}
			if (!again)
				again = now;
			return 0;
		});
	if (!r && err == EPERM)
		GTEST_SKIP() << "no CAP_NET_RAW for a packet socket";
	ASSERT_TRUE(r) << strerror(err);
	unique_fd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
	ASSERT_TRUE(s);
	sockaddr_in to{};
	to.sin_family = AF_INET;
	to.sin_port = htons(wire::kRoceV2Port);
	to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	const char junk[32] = {};
	ASSERT_EQ(sendto(s.get(), junk, sizeof(junk), 0, reinterpret_cast<const sockaddr *>(&to), sizeof(to)),
		  static_cast<ssize_t>(sizeof(junk)));
	auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
	while (calls == 0 && std::chrono::steady_clock::now() < until)
		std::this_thread::sleep_for(std::chrono::milliseconds(1));
	ASSERT_GT(calls.load(), 0) << "the datagram did not wake the receiver";
	until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
	while (!again && std::chrono::steady_clock::now() < until)
		std::this_thread::sleep_for(std::chrono::milliseconds(1));
	ASSERT_NE(again.load(), 0u) << "the timer did not run again";
	EXPECT_GE(again.load(), asked.load()) << "it ran before the time it asked for";
}

}  // namespace
}  // namespace xsrc
