// traffic_errors: main() of the test binary, which is also its own peer process
// (--peer, see peer.h), and a per-test watchdog.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>

#include "traffic_fixture.h"

using namespace xsrc_traffic;

namespace {

// --- a per-test watchdog ---------------------------------------------------------

class TestTimeout : public ::testing::EmptyTestEventListener {
	void OnTestStart(const ::testing::TestInfo &) override { alarm(kTestTimeoutSec); }
	void OnTestEnd(const ::testing::TestInfo &) override { alarm(0); }
};

void on_alarm(int)
{
	static const char msg[] = "\n*** traffic_errors: test exceeded its time limit (hung?) ***\n";
	ssize_t n = write(STDERR_FILENO, msg, sizeof(msg) - 1);
	(void)n;
	_exit(3);  // peers die with us (PR_SET_PDEATHSIG)
}

}  // namespace

int main(int argc, char **argv)
{
	if (auto peer = xsrc::harness::child_args(argc, argv, "--peer")) {
		// The peer may run another provider than the test (compat_r1_cq_heads).
		if (const char *drivers = getenv("XSRC_PEER_RDMAV_DRIVERS"))
			setenv("RDMAV_DRIVERS", drivers, 1);
		return peer->args.size() == 1 ? peer_main(peer->link, atoi(peer->args[0].c_str())) : 2;
	}
	signal(SIGALRM, on_alarm);
	::testing::InitGoogleTest(&argc, argv);
	::testing::UnitTest::GetInstance()->listeners().Append(new TestTimeout);
	return RUN_ALL_TESTS();
}
