// The provider says why it refuses, through libibverbs' own log: with
// VERBS_LOG_LEVEL and VERBS_LOG_FILE set (by CTest, or here when run by
// hand) a refused verb leaves a line naming the attribute or limit.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <sys/wait.h>
#include <unistd.h>
#include <fstream>
#include <sstream>
#include <string>

#include "provider_test_util.h"

namespace {

using namespace provider_test;

std::string log_path;

std::string read_log()
{
	std::ifstream in(log_path);
	std::stringstream all;
	all << in.rdbuf();
	return all.str();
}

// libibverbs buffers its log file until the process exits: each case runs
// in a child, which opens xsrc0 itself, and reports through its exit code
// (0: refused as expected). Returns what the log gained, and the code.
template <typename Case>
std::string logged_by_child(Case verb, int &code)
{
	size_t before = read_log().size();
	pid_t pid = fork();
	if (pid == 0)
		_exit([&] {
			int rc = verb();
			fflush(nullptr);  // _exit would not, and exit() runs gtest's atexit
			return rc;
		}());
	int status = 0;
	waitpid(pid, &status, 0);
	code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	std::string now = read_log();
	return now.size() > before ? now.substr(before) : std::string();
}

// A context with a PD and a CQ, in the child.
struct Objects {
	ibv_context *ctx = open_xsrc0();
	ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
	ibv_cq *cq = ctx ? ibv_create_cq(ctx, 16, nullptr, nullptr, 0) : nullptr;
	bool ok() const { return ctx && pd && cq; }
};

constexpr int kNoDevice = 10, kNotRefused = 11, kWrongErrno = 12, kSetupFailed = 13;

TEST(ProviderLog, CreateQpNamesTheCapOverTheLimit)
{
	int code = -1;
	std::string line = logged_by_child(
		[] {
			Objects o;
			if (!o.ok())
				return kNoDevice;
			ibv_qp_init_attr attr = rc_attr(o.cq, 16, 1024);  // the device takes 512
			if (ibv_create_qp(o.pd, &attr))
				return kNotRefused;
			return errno == EINVAL ? 0 : kWrongErrno;
		},
		code);
	EXPECT_EQ(code, 0);
	EXPECT_NE(line.find("xsrc0: "), std::string::npos) << line;
	EXPECT_NE(line.find("create_qp: max_inline_data 1024 exceeds 512"), std::string::npos) << line;
}

TEST(ProviderLog, CreateQpNamesUnsupportedFlags)
{
	int code = -1;
	std::string line = logged_by_child(
		[] {
			Objects o;
			if (!o.ok())
				return kNoDevice;
			ibv_qp_init_attr_ex ex{};
			ex.send_cq = ex.recv_cq = o.cq;
			ex.qp_type = IBV_QPT_RC;
			ex.cap = rc_attr(o.cq, 4, 0).cap;
			ex.pd = o.pd;
			ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
			ex.create_flags = IBV_QP_CREATE_SCATTER_FCS;
			if (ibv_create_qp_ex(o.ctx, &ex))
				return kNotRefused;
			return errno == EOPNOTSUPP ? 0 : kWrongErrno;
		},
		code);
	EXPECT_EQ(code, 0);
	EXPECT_NE(line.find("create_qp: create_flags 0x100"), std::string::npos) << line;
}

// A refused post (debug level): the limit is in the line.
TEST(ProviderLog, PostSendNamesMaxSendSge)
{
	int code = -1;
	std::string line = logged_by_child(
		[] {
			Objects o;
			if (!o.ok())
				return kNoDevice;
			ibv_qp_init_attr attr = rc_attr(o.cq, 4, 0);
			attr.cap.max_send_sge = 1;
			ibv_qp *a = ibv_create_qp(o.pd, &attr);
			ibv_qp *b = ibv_create_qp(o.pd, &attr);
			if (!a || !b || rc_connect(a, b->qp_num) || rc_connect(b, a->qp_num))
				return kSetupFailed;
			static char buf[64];
			ibv_mr *mr = ibv_reg_mr(o.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
			if (!mr)
				return kSetupFailed;
			ibv_sge sges[2] = {{reinterpret_cast<uintptr_t>(buf), 8, mr->lkey},
					   {reinterpret_cast<uintptr_t>(buf) + 8, 8, mr->lkey}};
			ibv_send_wr wr{};
			wr.opcode = IBV_WR_SEND;
			wr.sg_list = sges;
			wr.num_sge = 2;
			ibv_send_wr *bad = nullptr;
			int ret = ibv_post_send(a, &wr, &bad);
			if (ret == 0)
				return kNotRefused;
			return ret == EINVAL && bad == &wr ? 0 : kWrongErrno;
		},
		code);
	EXPECT_EQ(code, 0);
	EXPECT_NE(line.find("num_sge 2 exceeds max_send_sge 1"), std::string::npos) << line;
}

}  // namespace

int main(int argc, char **argv)
{
	// libibverbs reads both once, when it first lists the devices.
	setenv("VERBS_LOG_LEVEL", "4", 0);  // debug
	if (!getenv("VERBS_LOG_FILE")) {
		static char tmpl[] = "/tmp/xsrc-provider-log-XXXXXX";
		int fd = mkstemp(tmpl);
		if (fd >= 0)
			close(fd);
		setenv("VERBS_LOG_FILE", tmpl, 1);
	}
	log_path = getenv("VERBS_LOG_FILE");
	::testing::InitGoogleTest(&argc, argv);
	return RUN_ALL_TESTS();
}
