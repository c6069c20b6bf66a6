// isolation: one process's verbs objects are out of reach of another.
// Process A (the test) allocates PDs, an MR and a CQ; process B (this binary
// re-exec'd with --child-b, so it shares nothing but what it is told) opens
// its own context and writes raw DEALLOC_PD / DEREG_MR / DESTROY_CQ / REG_MR
// commands naming A's handle numbers to its own command file, and tries to
// open A's command file. B reports each errno over the link; A asserts them and
// then checks that its objects still work and that `xsrc status` counts only
// live objects.
#include <gtest/gtest.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

#include <map>

#include "device_test_util.h"
#include "harness/child.h"

using namespace xsrc_test;
using xsrc::harness::Child;
using xsrc::harness::Link;
using xsrc::harness::Msg;

namespace {

// ---- process B --------------------------------------------------------------

// B's report goes to A over the link as one message, when B is done.
int child_b(Link &to_a, const std::string &device, uint32_t pd_handle, uint32_t mr_handle, uint32_t cq_handle,
	    pid_t a_pid, int a_cmd_fd)
{
	Msg out;
	auto report = [&out](const char *key, long value) { out.set(key, value); };
	ibv_context *ctx = open_device(device);
	report("open_device", ctx ? 0 : errno);
	if (!ctx) {
		to_a.send(out);
		return 1;
	}
	int fd = ctx->cmd_fd;

	// B's own objects get B's own (low) handle numbers.
	ibv_pd *own = ibv_alloc_pd(ctx);
	report("own_pd", own ? 0 : errno);
	if (own)
		report("own_pd_handle", own->handle);

	report("dealloc_pd", raw_dealloc_pd(fd, pd_handle));
	report("dereg_mr", raw_dereg_mr(fd, mr_handle));
	report("destroy_cq", raw_destroy_cq(fd, cq_handle));
	static char buf[4096];
	report("reg_mr_on_a_pd", raw_reg_mr(fd, pd_handle, buf, sizeof(buf), IB_UVERBS_ACCESS_LOCAL_WRITE));

	// A's command file, by the name /proc shows, and through the magic link.
	std::string link = "/proc/" + std::to_string(a_pid) + "/fd/" + std::to_string(a_cmd_fd);
	char target[4096] = {};
	ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
	report("readlink", n > 0 ? 0 : errno);
	out.set("a_cmd_file", target);
	errno = 0;
	int by_name = open(target, O_RDWR | O_CLOEXEC);
	report("open_by_name", by_name >= 0 ? 0 : errno);
	if (by_name >= 0)
		close(by_name);
	errno = 0;
	int by_link = open(link.c_str(), O_RDWR | O_CLOEXEC);
	report("open_by_proc_link", by_link >= 0 ? 0 : errno);
	int by_link_ro = open(link.c_str(), O_RDONLY | O_CLOEXEC);
	report("open_by_proc_link_ro", by_link_ro >= 0 ? 0 : errno);
	if (by_link >= 0) {
		// Had it opened: see whether A's objects would be reachable.
		report("via_link_dealloc_pd", raw_dealloc_pd(by_link, pd_handle));
		close(by_link);
	}
	if (by_link_ro >= 0)
		close(by_link_ro);

	// The command directory does not list other contexts' files.
	std::string dir(target);
	dir = dir.substr(0, dir.rfind('/'));
	long listed = 0;
	if (DIR *d = opendir(dir.c_str())) {
		while (dirent *e = readdir(d))
			if (strncmp(e->d_name, "ctx-", 4) == 0)
				++listed;
		closedir(d);
	}
	report("listed_cmd_files", listed);

	if (own)
		report("own_dealloc", ibv_dealloc_pd(own));
	report("close", ibv_close_device(ctx));
	to_a.send(out);
	return 0;
}

// ---- process A --------------------------------------------------------------

// Runs B; returns its report. Bounded: B is killed after 30 s.
Msg run_child_b(const std::string &device, uint32_t pd, uint32_t mr, uint32_t cq, int cmd_fd, int *exit_status)
{
	auto b = Child::spawn("--child-b", {device, std::to_string(pd), std::to_string(mr), std::to_string(cq),
					    std::to_string(getpid()), std::to_string(cmd_fd)});
	auto report = b.link().recv(std::chrono::seconds(30));
	auto status = report ? b.wait(std::chrono::seconds(30)) : std::nullopt;
	if (!status)
		ADD_FAILURE() << "process B did not finish within 30 s";
	*exit_status = status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
	return report ? *report : Msg();
}

long num(const Msg &kv, const std::string &key)
{
	if (!kv.has(key)) {
		ADD_FAILURE() << "process B did not report " << key;
		return -12345;
	}
	return kv.i64(key);
}

TEST(Isolation, OtherProcessCannotTouchObjects)
{
	PrivateDevice dev("xsrciso");  // its counts are this test's alone
	ASSERT_TRUE(dev.up()) << dev.output();
	auto before = dev.status();
	ASSERT_TRUE(before);
	EXPECT_EQ(before->contexts, 0);
	EXPECT_EQ(before->objects, 0);

	ibv_context *ctx = open_device(dev.name());
	ASSERT_NE(ctx, nullptr) << strerror(errno);
	// Several PDs, so that A's interesting handles are not the numbers B's
	// own first objects get.
	ibv_pd *pds[3];
	for (auto &pd : pds) {
		pd = ibv_alloc_pd(ctx);
		ASSERT_NE(pd, nullptr);
	}
	ibv_pd *pd = pds[2];
	static char buf[3 * 4096];
	ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	ASSERT_NE(mr, nullptr) << strerror(errno);
	ibv_cq *cq = ibv_create_cq(ctx, 8, nullptr, nullptr, 0);
	ASSERT_NE(cq, nullptr) << strerror(errno);
	constexpr int kAObjects = 5;

	auto with_a = dev.status();
	ASSERT_TRUE(with_a);
	EXPECT_EQ(with_a->contexts, before->contexts + 1);
	EXPECT_EQ(with_a->objects, before->objects + kAObjects);

	int exit_status = -1;
	auto b = run_child_b(dev.name(), pd->handle, mr->handle, cq->handle, ctx->cmd_fd, &exit_status);
	EXPECT_EQ(exit_status, 0);
	EXPECT_EQ(num(b, "open_device"), 0);
	EXPECT_EQ(num(b, "own_pd"), 0);
	EXPECT_NE(num(b, "own_pd_handle"), static_cast<long>(pd->handle))
		<< "test premise: B's own PD must not share A's PD handle number";
	EXPECT_EQ(num(b, "dealloc_pd"), EINVAL) << "B deallocated A's PD " << pd->handle;
	EXPECT_EQ(num(b, "dereg_mr"), EINVAL) << "B deregistered A's MR " << mr->handle;
	EXPECT_EQ(num(b, "destroy_cq"), EINVAL) << "B destroyed A's CQ " << cq->handle;
	EXPECT_EQ(num(b, "reg_mr_on_a_pd"), EINVAL) << "B registered an MR on A's PD";
	EXPECT_EQ(num(b, "readlink"), 0);
	long by_name = num(b, "open_by_name");
	EXPECT_TRUE(by_name == ENOENT || by_name == EPERM || by_name == EACCES)
		<< "open(" << b.str("a_cmd_file", "") << ") gave " << by_name;
	long by_link = num(b, "open_by_proc_link");
	EXPECT_TRUE(by_link == EPERM || by_link == ENOENT || by_link == EACCES)
		<< "open(/proc/A/fd/cmd_fd) gave " << by_link;
	long by_link_ro = num(b, "open_by_proc_link_ro");
	EXPECT_TRUE(by_link_ro == EPERM || by_link_ro == ENOENT || by_link_ro == EACCES)
		<< "open(/proc/A/fd/cmd_fd, O_RDONLY) gave " << by_link_ro;
	EXPECT_FALSE(b.has("via_link_dealloc_pd"));
	EXPECT_EQ(num(b, "listed_cmd_files"), 0) << "the command directory lists context files";
	EXPECT_EQ(num(b, "own_dealloc"), 0);
	EXPECT_EQ(num(b, "close"), 0);

	// B is gone: its context with it (FUSE delivers the release asynchronously).
	EXPECT_TRUE(wait_until(std::chrono::seconds(5), [&] {
		auto st = dev.status();
		return st && st->contexts == before->contexts + 1;
	})) << "B's context outlived B";
	auto after_b = dev.status();
	ASSERT_TRUE(after_b);
	EXPECT_EQ(after_b->objects, before->objects + kAObjects) << "B's attempts changed A's objects";

	// A's objects still work: a new MR on the PD, then everything torn down.
	ibv_mr *mr2 = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(mr2, nullptr) << "A's PD unusable after B's attempts: " << strerror(errno);
	EXPECT_EQ(ibv_resize_cq(cq, 32), 0);
	EXPECT_EQ(ibv_req_notify_cq(cq, 0), 0);
	EXPECT_EQ(dev.status()->objects, before->objects + kAObjects + 1);
	EXPECT_EQ(ibv_dereg_mr(mr2), 0);
	EXPECT_EQ(ibv_dereg_mr(mr), 0);
	EXPECT_EQ(ibv_destroy_cq(cq), 0);
	EXPECT_EQ(dev.status()->objects, before->objects + 3);
	for (auto *p : pds)
		EXPECT_EQ(ibv_dealloc_pd(p), 0);
	auto emptied = dev.status();
	ASSERT_TRUE(emptied);
	EXPECT_EQ(emptied->objects, before->objects);
	EXPECT_EQ(emptied->contexts, before->contexts + 1);
	EXPECT_EQ(ibv_close_device(ctx), 0);
	EXPECT_TRUE(wait_until(std::chrono::seconds(5), [&] {
		auto st = dev.status();
		return st && st->contexts == before->contexts && st->objects == before->objects;
	}));
}

// Every thread of the process that opened the context may use it (the
// daemon sees thread ids).
TEST(Isolation, OtherThreadsOfTheOwnerMayUseTheContext)
{
	PrivateDevice dev("xsrciso");
	ASSERT_TRUE(dev.up()) << dev.output();
	ibv_context *ctx = open_device(dev.name());
	ASSERT_NE(ctx, nullptr);
	ibv_pd *pd = ibv_alloc_pd(ctx);
	ASSERT_NE(pd, nullptr);
	int results[4] = {-1, -1, -1, -1};
	std::vector<std::thread> threads;
	for (int i = 0; i < 4; ++i)
		threads.emplace_back([&, i] {
			int failures = 0;
			static char buf[4][4096];
			for (int n = 0; n < 50; ++n) {
				ibv_mr *mr = ibv_reg_mr(pd, buf[i], sizeof(buf[i]), IBV_ACCESS_LOCAL_WRITE);
				ibv_cq *cq = ibv_create_cq(ctx, 4, nullptr, nullptr, 0);
				failures += !mr + !cq;
				if (mr)
					failures += ibv_dereg_mr(mr) != 0;
				if (cq)
					failures += ibv_destroy_cq(cq) != 0;
			}
			results[i] = failures;
		});
	for (auto &t : threads)
		t.join();
	for (int r : results)
		EXPECT_EQ(r, 0);
	EXPECT_EQ(dev.status()->objects, 1);
	EXPECT_EQ(ibv_dealloc_pd(pd), 0);
	EXPECT_EQ(ibv_close_device(ctx), 0);
}

// A forked child (no exec) shares its parent's open command file, as it shares
// a uverbs fd on a kernel device; the file is released when the last holder
// closes it, not when its creator exits.
TEST(Isolation, ForkedChildKeepsInheritedContextAlive)
{
	PrivateDevice dev("xsrciso");
	ASSERT_TRUE(dev.up()) << dev.output();
	auto before = dev.status();
	ASSERT_TRUE(before);
	ibv_context *ctx = open_device(dev.name());
	ASSERT_NE(ctx, nullptr);
	ibv_pd *pd = ibv_alloc_pd(ctx);
	ASSERT_NE(pd, nullptr);
	int go[2];
	ASSERT_EQ(pipe(go), 0);
	pid_t pid = fork();
	if (pid == 0) {
		close(go[1]);
		char c;
		// Holds the inherited fds until the parent says so (or dies).
		if (read(go[0], &c, 1) < 0) {
		}
		_exit(0);
	}
	close(go[0]);
	// The parent drops its context without telling the daemon (as a crash would):
	// only the fd goes, the child's copy keeps the file open.
	int cmd_fd = ctx->cmd_fd;
	close(cmd_fd);
	std::this_thread::sleep_for(std::chrono::milliseconds(200));
	auto held = dev.status();
	ASSERT_TRUE(held);
	EXPECT_EQ(held->contexts, before->contexts + 1) << "context released while a child still holds its file";
	EXPECT_EQ(held->objects, before->objects + 1);
	close(go[1]);
	int status;
	waitpid(pid, &status, 0);
	EXPECT_TRUE(wait_until(std::chrono::seconds(5), [&] {
		auto st = dev.status();
		return st && st->contexts == before->contexts && st->objects == before->objects;
	})) << "the context outlived the last holder of its command file";
	// ctx is unusable now (its cmd_fd is closed); leak the user-space part.
}

}  // namespace

int main(int argc, char **argv)
{
	if (auto b = xsrc::harness::child_args(argc, argv, "--child-b")) {
		const auto &a = b->args;
		if (a.size() != 6)
			return 2;
		return child_b(b->link, a[0], static_cast<uint32_t>(std::stoul(a[1])), static_cast<uint32_t>(std::stoul(a[2])),
			       static_cast<uint32_t>(std::stoul(a[3])), static_cast<pid_t>(std::stol(a[4])), std::stoi(a[5]));
	}
	::testing::InitGoogleTest(&argc, argv);
	return RUN_ALL_TESTS();
}
