// The arena says where things are in it: its header where the tables are,
// each ring's header its size and strides. Any process that maps the arena
// can rewrite both, so neither may send a process or xsrcd outside it.
//
// The arena's header: a context reads it once, when it opens the device,
// and checks that every table lies within the arena; xsrcd never reads it
// (its tables are where it laid them out). So a header rewritten under a
// running process changes nothing it does, and one that is wrong when a
// process opens the device is refused with a clear error, not a fault.
//
// A ring's header: a process that completes into a CQ ring, or takes a
// receive from a receive ring, reads the shape once and uses the ring only
// when that shape lies within the arena; otherwise nothing is written (a
// completion is lost, a datagram dropped: the ring's owner was forged
// against, not a bystander).
//
// This process rewrites its own arena, as another user's process can.
#include <xsrc-queues.h>

#include <chrono>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "device_test_util.h"
#include "harness/arena.h"
#include "provider_test_util.h"

using namespace xsrc_test;

namespace {

constexpr uint32_t kQkey = 0x11111111;
using provider_test::kGidIndex;

// The header's table offsets, put back when the test ends however it ends.
class HeaderForger {
public:
	explicit HeaderForger(xsrc::harness::MappedArena &arena)
		: header_(const_cast<xsrc_arena_header &>(arena.header())), saved_(header_)
	{
	}
	~HeaderForger() { restore(); }

	// Every table past the arena's end.
	void forge()
	{
		const uint64_t past = uint64_t(XSRC_ARENA_SIZE) * 4;
		header_.qp_table_off = past;
		header_.mr_table_off = past;
		header_.srq_table_off = past;
		header_.atomic_locks_off = past;
		header_.mcast_table_off = past;
	}
	void restore()
	{
		header_.qp_table_off = saved_.qp_table_off;
		header_.mr_table_off = saved_.mr_table_off;
		header_.srq_table_off = saved_.srq_table_off;
		header_.atomic_locks_off = saved_.atomic_locks_off;
		header_.mcast_table_off = saved_.mcast_table_off;
	}

private:
	xsrc_arena_header &header_;
	const xsrc_arena_header saved_;
};

// A UD QP that sends to itself through the device.
struct SelfSender {
	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	ibv_cq *cq = nullptr;
	ibv_qp *qp = nullptr;
	ibv_mr *mr = nullptr;
	ibv_ah *ah = nullptr;
	char buf[256] = {};

	~SelfSender()
	{
		if (ah)
			ibv_destroy_ah(ah);
		provider_test::destroy_all(std::span(&qp, 1), std::span(&mr, 1), std::span(&cq, 1), pd, ctx);
	}

	void open()
	{
		ctx = open_device(test_device());
		ASSERT_NE(ctx, nullptr) << "no " << test_device();
		pd = ibv_alloc_pd(ctx);
		cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
		mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : nullptr;
		ASSERT_TRUE(pd && cq && mr);
		ibv_qp_init_attr init{};
		init.send_cq = init.recv_cq = cq;
		init.qp_type = IBV_QPT_UD;
		init.cap = {4, 4, 1, 1, 0};
		qp = ibv_create_qp(pd, &init);
		ASSERT_NE(qp, nullptr);
		ibv_qp_attr a{};
		a.qp_state = IBV_QPS_INIT;
		a.port_num = 1;
		a.qkey = kQkey;
		ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
		a = {};
		a.qp_state = IBV_QPS_RTR;
		ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
		a.qp_state = IBV_QPS_RTS;
		ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
		ibv_ah_attr ah_attr{};
		ah_attr.is_global = 1;
		ah_attr.port_num = 1;
		ah_attr.grh.sgid_index = kGidIndex;
		ah_attr.grh.hop_limit = 1;
		ASSERT_EQ(ibv_query_gid(ctx, 1, kGidIndex, &ah_attr.grh.dgid), 0);
		ah = ibv_create_ah(pd, &ah_attr);
		ASSERT_NE(ah, nullptr);
	}

	void post_receive()
	{
		std::memset(buf, 0, 128);
		ibv_sge rsge{reinterpret_cast<uintptr_t>(buf), 128, mr->lkey};
		ibv_recv_wr rwr{};
		rwr.wr_id = 1;
		rwr.sg_list = &rsge;
		rwr.num_sge = 1;
		ibv_recv_wr *rbad = nullptr;
		ASSERT_EQ(ibv_post_recv(qp, &rwr, &rbad), 0);
	}

	void post_send(char mark)
	{
		std::memset(buf + 128, mark, 16);
		ibv_sge ssge{reinterpret_cast<uintptr_t>(buf + 128), 16, mr->lkey};
		ibv_send_wr swr{};
		swr.wr_id = 2;
		swr.sg_list = &ssge;
		swr.num_sge = 1;
		swr.opcode = IBV_WR_SEND;
		swr.send_flags = IBV_SEND_SIGNALED;
		swr.wr.ud.ah = ah;
		swr.wr.ud.remote_qpn = qp->qp_num;
		swr.wr.ud.remote_qkey = kQkey;
		ibv_send_wr *sbad = nullptr;
		ASSERT_EQ(ibv_post_send(qp, &swr, &sbad), 0);
	}

	// The completions polled within `limit` (at most `want`).
	int poll(int want, std::chrono::milliseconds limit, bool *received = nullptr)
	{
		int got = 0;
		wait_until(limit, [&] {
			ibv_wc wc[2];
			int n = ibv_poll_cq(cq, 2, wc);
			for (int i = 0; i < n; ++i) {
				EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc[i].status);
				if (received)
					*received |= wc[i].wr_id == 1;
			}
			got += n > 0 ? n : 0;
			return got >= want;
		});
		return got;
	}

	// One datagram to ourselves: its receive completes with the bytes.
	void send_and_receive(char mark)
	{
		ASSERT_NO_FATAL_FAILURE(post_receive());
		ASSERT_NO_FATAL_FAILURE(post_send(mark));
		int got = 0;
		bool received = false;
		ASSERT_TRUE(wait_until(std::chrono::seconds(2), [&] {
			ibv_wc wc[2];
			int n = ibv_poll_cq(cq, 2, wc);
			for (int i = 0; i < n; ++i) {
				EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc[i].status);
				received |= wc[i].wr_id == 1;
			}
			got += n > 0 ? n : 0;
			return got >= 2;
		})) << "completions: " << got;
		ASSERT_TRUE(received);
		EXPECT_EQ(buf[40], mark) << "the payload after the 40-byte GRH";
		EXPECT_EQ(buf[40 + 15], mark);
	}
};

TEST(ForgedHeader, ARunningContextKeepsTheTablesItFoundAtOpen)
{
	xsrc::harness::MappedArena arena(test_device());
	ASSERT_TRUE(arena.ok());
	SelfSender s;
	ASSERT_NO_FATAL_FAILURE(s.open());
	ASSERT_NO_FATAL_FAILURE(s.send_and_receive('a'));
	HeaderForger header(arena);
	header.forge();
	ASSERT_NO_FATAL_FAILURE(s.send_and_receive('b'));
}

TEST(ForgedHeader, OpeningTheDeviceWithAForgedHeaderIsRefused)
{
	xsrc::harness::MappedArena arena(test_device());
	ASSERT_TRUE(arena.ok());
	{
		HeaderForger header(arena);
		header.forge();
		errno = 0;
		ibv_context *ctx = open_device(test_device());
		EXPECT_EQ(ctx, nullptr) << "a table past the arena's end was taken";
		if (ctx)
			ibv_close_device(ctx);
	}
	// Put back, the device opens and works again (xsrcd never read it).
	SelfSender s;
	ASSERT_NO_FATAL_FAILURE(s.open());
	ASSERT_NO_FATAL_FAILURE(s.send_and_receive('c'));
}

// A shape that reaches 64 GiB past the ring (and the 1 GiB arena).
constexpr uint32_t kFar = 1u << 30;

TEST(ForgedRingShape, ACqRingThatSaysItReachesPastTheArenaGetsNothingWritten)
{
	xsrc::harness::MappedArena arena(test_device());
	ASSERT_TRUE(arena.ok());
	SelfSender s;
	ASSERT_NO_FATAL_FAILURE(s.open());
	auto *ring = arena.at<xsrc_cq_ring>(arena.qp_entry(s.qp->qp_num).recv_cq_off);
	const xsrc_cq_ring made = *ring;
	ASSERT_NO_FATAL_FAILURE(s.post_receive());
	// A small datagram rides in the payload slot, placed by its shape.
	ring->num_entries = kFar;
	ring->payload_stride = kFar;
	ASSERT_NO_FATAL_FAILURE(s.post_send('d'));
	std::this_thread::sleep_for(std::chrono::milliseconds(50));
	const uint64_t tail = ring->tail;
	ring->num_entries = made.num_entries;
	ring->payload_stride = made.payload_stride;
	EXPECT_EQ(tail, made.tail) << "a completion was placed by the forged shape";
	// The receive was taken: what was placed by the ring's own shape still
	// comes, nothing else (the forged completions are lost).
	ASSERT_NO_FATAL_FAILURE(s.send_and_receive('e'));
}

TEST(ForgedRingShape, AReceiveRingThatSaysItReachesPastTheArenaIsNotTakenFrom)
{
	xsrc::harness::MappedArena arena(test_device());
	ASSERT_TRUE(arena.ok());
	SelfSender s;
	ASSERT_NO_FATAL_FAILURE(s.open());
	ASSERT_NO_FATAL_FAILURE(s.send_and_receive('f'));  // the ring's head is 1 now
	auto *rq = arena.at<xsrc_recv_ring>(arena.qp_entry(s.qp->qp_num).rq_off);
	const xsrc_recv_ring made = *rq;
	ASSERT_NO_FATAL_FAILURE(s.post_receive());
	// Slot 1 4 GiB past the ring: not in the arena, nor (as a rule) in
	// anything else this process has mapped.
	rq->num_entries = 1u << 31;
	rq->stride = 0xffffffc0u;
	ASSERT_NO_FATAL_FAILURE(s.post_send('g'));
	bool received = false;
	EXPECT_EQ(s.poll(2, std::chrono::milliseconds(300), &received), 1) << "only the send completes";
	EXPECT_FALSE(received) << "a receive was taken by the forged shape";
	rq->num_entries = made.num_entries;
	rq->stride = made.stride;
	// The receive is still posted, and the next datagram takes it.
	ASSERT_NO_FATAL_FAILURE(s.post_send('h'));
	EXPECT_EQ(s.poll(2, std::chrono::seconds(2), &received), 2);
	EXPECT_TRUE(received);
	EXPECT_EQ(s.buf[40], 'h');
}

}  // namespace
