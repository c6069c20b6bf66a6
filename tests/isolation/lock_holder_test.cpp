// Lock words in the arena (the tag table of a TM SRQ, the atomics locks)
// hold their holder's pid as the device sees it. A provider in another PID
// namespace cannot test that pid with kill(): there it names nothing, so it
// must never take such a lock over from a live holder. When the holder's
// process exits, xsrcd frees its words (it watches each context owner's
// pidfd), so that waiter does not wait for ever either.
//
// The holder here is a process of this test with a context of its own,
// whose pid the test writes into the lock words (a holder is never caught
// holding one otherwise: it holds it for a few stores).
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xsrc-queues.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "device_test_util.h"
#include "harness/arena.h"

using namespace xsrc_test;
using Clock = std::chrono::steady_clock;

namespace {

ibv_context *open_test_device()
{
	return open_device(test_device());
}

using xsrc::harness::MappedArena;

// The lock word of SRQ `srqn`'s tag table.
uint32_t *tm_lock(const MappedArena &arena, uint32_t srqn)
{
	auto *srqs = arena.at<xsrc_srq_entry>(arena.header().srq_table_off);
	const xsrc_srq_entry &e = srqs[srqn - XSRC_SRQN_BASE];
	if (e.srqn != srqn || !e.ring_off)
		return nullptr;
	auto *ring = arena.at<xsrc_recv_ring>(e.ring_off);
	uint64_t off = e.ring_off + sizeof(xsrc_recv_ring) + uint64_t(ring->num_entries) * ring->stride;
	return &arena.at<xsrc_tm_table>(off)->lock;
}

uint32_t *atomic_lock(const MappedArena &arena, uint32_t index)
{
	return arena.at<uint32_t>(arena.header().atomic_locks_off) + index;
}

uint32_t load(const uint32_t *word)
{
	return __atomic_load_n(word, __ATOMIC_ACQUIRE);
}

// A process with a context of the device that does nothing until killed.
// `released`: it closes the context first, as the device sees a dying
// process whose files close before its exit shows on its pidfd.
pid_t start_holder(bool released = false)
{
	int ready[2];
	if (pipe2(ready, O_CLOEXEC) < 0)
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(ready[0]);
		ibv_context *ctx = open_test_device();
		char c = ctx ? 'y' : 'n';
		if (ctx && released)
			c = ibv_close_device(ctx) == 0 ? 'y' : 'n';
		if (write(ready[1], &c, 1) != 1 || c != 'y')
			_exit(1);
		for (;;)
			pause();
	}
	close(ready[1]);
	char c = 0;
	bool ok = pid > 0 && read(ready[0], &c, 1) == 1 && c == 'y';
	close(ready[0]);
	if (!ok && pid > 0) {
		kill(pid, SIGKILL);
		waitpid(pid, nullptr, 0);
		return -1;
	}
	return pid;
}

void stop(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, nullptr, 0);
}

// Waits up to `limit` for `word` to become 0.
bool freed_within(const uint32_t *word, std::chrono::milliseconds limit)
{
	return wait_until(limit, [word] { return load(word) == 0; });
}

// Reads one line of a pipe within `limit`; empty when nothing came.
std::string read_line(int fd, std::chrono::milliseconds limit)
{
	std::string line;
	auto end = Clock::now() + limit;
	while (Clock::now() < end) {
		pollfd p{fd, POLLIN, 0};
		if (poll(&p, 1, 10) != 1)
			continue;
		char c;
		if (read(fd, &c, 1) != 1)
			break;
		if (c == '\n')
			return line;
		line += c;
	}
	return line;
}

// In a new PID namespace (pid 1 there): a TM SRQ, its max_wr then shrunk
// below what its ring holds (the tag table stays where the ring put it); its
// SRQN goes out on `out`, then on a byte from `in` one TAG_ADD, whose result
// goes out.
[[noreturn]] void tm_waiter(int in, int out)
{
	auto say = [out](const std::string &s) {
		std::string line = s + "\n";
		if (write(out, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
			_exit(1);
	};
	ibv_context *ctx = open_test_device();
	ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
	ibv_cq *cq = ctx ? ibv_create_cq(ctx, 16, nullptr, nullptr, 0) : nullptr;
	if (!pd || !cq) {
		say("no device");
		_exit(1);
	}
	ibv_srq_init_attr_ex attr{};
	attr.attr.max_wr = 16;
	attr.attr.max_sge = 1;
	attr.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
	attr.srq_type = IBV_SRQT_TM;
	attr.pd = pd;
	attr.cq = cq;
	attr.tm_cap.max_num_tags = 4;
	attr.tm_cap.max_ops = 4;
	ibv_srq *srq = ibv_create_srq_ex(ctx, &attr);
	uint32_t srqn = 0;
	if (!srq || ibv_get_srq_num(srq, &srqn)) {
		say("no TM SRQ");
		_exit(1);
	}
	ibv_srq_attr smaller{};
	smaller.max_wr = 2;
	if (ibv_modify_srq(srq, &smaller, IBV_SRQ_MAX_WR)) {
		say("modify_srq failed");
		_exit(1);
	}
	say("srqn " + std::to_string(srqn) + " pid " + std::to_string(getpid()));
	char go;
	if (read(in, &go, 1) != 1)
		_exit(1);
	static char buf[64];
	ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	ibv_sge sge{reinterpret_cast<uintptr_t>(buf), sizeof(buf), mr ? mr->lkey : 0};
	ibv_ops_wr wr{};
	wr.opcode = IBV_WR_TAG_ADD;
	wr.tm.add.tag = 7;
	wr.tm.add.mask = ~0ull;
	wr.tm.add.sg_list = &sge;
	wr.tm.add.num_sge = 1;
	ibv_ops_wr *bad = nullptr;
	say("tag_add " + std::to_string(ibv_post_srq_ops(srq, &wr, &bad)));
	_exit(0);
}

TEST(LockHolder, AWaiterInAnotherPidNamespaceWaitsForALiveHolderAndTheDeviceFreesADeadOnes)
{
	MappedArena arena(test_device());
	ASSERT_TRUE(arena.ok());
	pid_t holder = start_holder();
	ASSERT_GT(holder, 0);

	int to_waiter[2], from_waiter[2];
	ASSERT_EQ(pipe2(to_waiter, O_CLOEXEC), 0);
	ASSERT_EQ(pipe2(from_waiter, O_CLOEXEC), 0);
	pid_t middle = fork();
	ASSERT_GE(middle, 0);
	if (middle == 0) {
		// The child after unshare() is pid 1 of a new PID namespace. Each
		// dies with its parent: a waiter that never gets the lock must not
		// outlive a failed test.
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (unshare(CLONE_NEWPID) < 0)
			_exit(2);
		pid_t w = fork();
		if (w == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			tm_waiter(to_waiter[0], from_waiter[1]);
		}
		int status = 0;
		waitpid(w, &status, 0);
		_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 3);
	}
	close(to_waiter[0]);
	close(from_waiter[1]);

	std::string hello = read_line(from_waiter[0], std::chrono::seconds(10));
	unsigned srqn = 0, inner_pid = 0;
	ASSERT_EQ(sscanf(hello.c_str(), "srqn %u pid %u", &srqn, &inner_pid), 2) << hello;
	EXPECT_EQ(inner_pid, 1u) << "the waiter is not in a PID namespace of its own";
	uint32_t *lock = tm_lock(arena, srqn);
	ASSERT_NE(lock, nullptr);
	ASSERT_EQ(load(lock), 0u);

	// The holder is alive; in the waiter's namespace its pid names nothing.
	__atomic_store_n(lock, static_cast<uint32_t>(holder), __ATOMIC_RELEASE);
	ASSERT_EQ(write(to_waiter[1], "g", 1), 1);
	std::string early = read_line(from_waiter[0], std::chrono::milliseconds(700));
	EXPECT_EQ(early, "") << "the waiter took the tag table's lock from a live holder";
	EXPECT_EQ(load(lock), static_cast<uint32_t>(holder));

	// The holder dies: the device frees its word and the waiter goes on.
	auto killed = Clock::now();
	stop(holder);
	std::string done = early.empty() ? read_line(from_waiter[0], std::chrono::seconds(5)) : early;
	EXPECT_EQ(done, "tag_add 0");
	EXPECT_LT(Clock::now() - killed, std::chrono::seconds(2));

	if (done.empty())
		kill(middle, SIGKILL);  // and with it the waiter
	int status = 0;
	waitpid(middle, &status, 0);
	EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
	close(to_waiter[1]);
	close(from_waiter[0]);
}

TEST(LockHolder, TheDeviceFreesTheAtomicsLocksOfAnExitedProcessOnly)
{
	MappedArena arena(test_device());
	ASSERT_TRUE(arena.ok());
	ibv_context *mine = open_test_device();  // a live context with our pid
	ASSERT_NE(mine, nullptr);
	pid_t holder = start_holder();
	ASSERT_GT(holder, 0);

	// Words no one holds now (the device shares them among all users).
	uint32_t *held = nullptr, *ours = nullptr;
	for (uint32_t i = XSRC_ATOMIC_LOCKS; i-- > 0 && !(held && ours);) {
		uint32_t *w = atomic_lock(arena, i);
		uint32_t free_word = 0;
		uint32_t who = held ? static_cast<uint32_t>(getpid()) : static_cast<uint32_t>(holder);
		if (__atomic_compare_exchange_n(w, &free_word, who, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			(held ? ours : held) = w;
	}
	ASSERT_TRUE(held && ours);

	stop(holder);
	EXPECT_TRUE(freed_within(held, std::chrono::seconds(2))) << "still held by " << load(held);
	// The same when the context was released before the exit.
	pid_t released = start_holder(true);
	ASSERT_GT(released, 0);
	uint32_t free_word = 0;
	ASSERT_TRUE(__atomic_compare_exchange_n(held, &free_word, static_cast<uint32_t>(released), false,
						__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
	std::this_thread::sleep_for(std::chrono::milliseconds(100));
	EXPECT_EQ(load(held), static_cast<uint32_t>(released)) << "freed while its process lives";
	stop(released);
	EXPECT_TRUE(freed_within(held, std::chrono::seconds(2))) << "still held by " << load(held);
	// A context that ends while its process lives frees nothing of it.
	ibv_context *again = open_test_device();
	ASSERT_NE(again, nullptr);
	ibv_close_device(again);
	std::this_thread::sleep_for(std::chrono::milliseconds(100));
	EXPECT_EQ(load(ours), static_cast<uint32_t>(getpid()));
	__atomic_store_n(ours, 0u, __ATOMIC_RELEASE);
	ibv_close_device(mine);
}

}  // namespace
