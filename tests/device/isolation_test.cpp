// isolation: one process's verbs objects are out of reach of another.
// Process A (the test) allocates PDs, an MR and a CQ; process B (this binary
// re-exec'd with --child-b, so it shares nothing but what it is told) opens
// its own context and writes raw DEALLOC_PD / DEREG_MR / DESTROY_CQ / REG_MR
// commands naming A's handle numbers to its own command file, and tries to
// open A's command file. B reports each errno on stdout; A asserts them and
// then checks that its objects still work and that `xsrc status` counts only
// live objects.
#include <gtest/gtest.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>

#include <map>

#include "device_test_util.h"

using namespace xsrc_test;

namespace {

// ---- process B --------------------------------------------------------------

int child_b(const std::string &device, uint32_t pd_handle, uint32_t mr_handle, uint32_t cq_handle,
	    pid_t a_pid, int a_cmd_fd)
{
	auto report = [](const char *key, long value) { printf("%s=%ld\n", key, value); };
	ibv_context *ctx = open_device(device);
	report("open_device", ctx ? 0 : errno);
	if (!ctx)
		return 1;
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
	printf("a_cmd_file=%s\n", target);
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
	fflush(stdout);
	return 0;
}

// ---- process A --------------------------------------------------------------

std::string g_self;

// Runs B; returns its key=value report. Bounded: B is killed after 30 s.
std::map<std::string, std::string> run_child_b(const std::string &device, uint32_t pd, uint32_t mr,
					       uint32_t cq, int cmd_fd, int *exit_status)
{
	int out[2];
	EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
	pid_t pid = fork();
	if (pid == 0) {
		dup2(out[1], STDOUT_FILENO);
		std::string args[] = {"--child-b", device, std::to_string(pd), std::to_string(mr),
				      std::to_string(cq), std::to_string(getppid()), std::to_string(cmd_fd)};
		const char *argv[] = {g_self.c_str(), args[0].c_str(), args[1].c_str(), args[2].c_str(),
				      args[3].c_str(), args[4].c_str(), args[5].c_str(), args[6].c_str(), nullptr};
		execv(g_self.c_str(), const_cast<char **>(argv));
		_exit(127);
	}
	close(out[1]);
	std::string text;
	auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
	for (;;) {
		auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
			deadline - std::chrono::steady_clock::now()).count();
		pollfd p{out[0], POLLIN, 0};
		if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) {
			ADD_FAILURE() << "process B did not finish within 30 s";
			kill(pid, SIGKILL);
			break;
		}
		char buf[4096];
		ssize_t n = read(out[0], buf, sizeof(buf));
		if (n <= 0)
			break;
		text.append(buf, static_cast<size_t>(n));
	}
	close(out[0]);
	int status = 0;
	waitpid(pid, &status, 0);
	*exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
	std::map<std::string, std::string> kv;
	std::istringstream lines(text);
	for (std::string line; std::getline(lines, line);) {
		auto eq = line.find('=');
		if (eq != std::string::npos)
			kv[line.substr(0, eq)] = line.substr(eq + 1);
	}
	return kv;
}

long num(const std::map<std::string, std::string> &kv, const std::string &key)
{
	auto it = kv.find(key);
	if (it == kv.end()) {
		ADD_FAILURE() << "process B did not report " << key;
		return -12345;
	}
	return std::stol(it->second);
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
		<< "open(" << b["a_cmd_file"] << ") gave " << by_name;
	long by_link = num(b, "open_by_proc_link");
	EXPECT_TRUE(by_link == EPERM || by_link == ENOENT || by_link == EACCES)
		<< "open(/proc/A/fd/cmd_fd) gave " << by_link;
	long by_link_ro = num(b, "open_by_proc_link_ro");
	EXPECT_TRUE(by_link_ro == EPERM || by_link_ro == ENOENT || by_link_ro == EACCES)
		<< "open(/proc/A/fd/cmd_fd, O_RDONLY) gave " << by_link_ro;
	EXPECT_EQ(b.count("via_link_dealloc_pd"), 0u);
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
	g_self = "/proc/self/exe";
	char self[4096] = {};
	if (readlink("/proc/self/exe", self, sizeof(self) - 1) > 0)
		g_self = self;
	if (argc == 8 && std::string(argv[1]) == "--child-b")
		return child_b(argv[2], static_cast<uint32_t>(std::stoul(argv[3])),
			       static_cast<uint32_t>(std::stoul(argv[4])), static_cast<uint32_t>(std::stoul(argv[5])),
			       static_cast<pid_t>(std::stol(argv[6])), std::stoi(argv[7]));
	::testing::InitGoogleTest(&argc, argv);
	return RUN_ALL_TESTS();
}
