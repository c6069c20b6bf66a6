// A completion forged in the world-writable arena must not make its owner
// write where it never registered memory. Small SENDs travel in the CQ ring
// (XSRC_CQE_DEFERRED): the owner's poll copies the payload to deferred_va.
// Anyone who can map the arena can write such a completion into anyone's CQ
// ring; the owner places the payload only inside its own LOCAL_WRITE MRs
// (a list kept in its own memory) and otherwise reports IBV_WC_LOC_PROT_ERR.
//
// This process forges into its own CQ ring, which is what another user's
// process can do to it: the arena is the same file for every process.
#include <xsrc-queues.h>

#include <algorithm>
#include <atomic>
#include <string>

#include <gtest/gtest.h>

#include "device_test_util.h"
#include "harness/arena.h"
#include "harness/device_stats.h"

using namespace xsrc_test;

namespace {

class ForgedCqe : public ::testing::Test {
protected:
	void SetUp() override
	{
		int n = 0;
		ibv_device **list = ibv_get_device_list(&n);
		ASSERT_NE(list, nullptr);
		for (int i = 0; i < n && !ctx_; ++i)
			if (test_device() == ibv_get_device_name(list[i]))
				ctx_ = ibv_open_device(list[i]);
		ibv_free_device_list(list);
		ASSERT_NE(ctx_, nullptr) << "no " << test_device();
		pd_ = ibv_alloc_pd(ctx_);
		cq_ = ibv_create_cq(ctx_, 16, nullptr, nullptr, 0);
		ASSERT_TRUE(pd_ && cq_);
		ibv_qp_init_attr init{};
		init.send_cq = init.recv_cq = cq_;
		init.qp_type = IBV_QPT_RC;
		init.cap = {4, 4, 1, 1, 0};
		qp_ = ibv_create_qp(pd_, &init);
		ASSERT_NE(qp_, nullptr);
		mr_ = ibv_reg_mr(pd_, registered_, sizeof(registered_), IBV_ACCESS_LOCAL_WRITE);
		ro_mr_ = ibv_reg_mr(pd_, read_only_, sizeof(read_only_), 0);
		ASSERT_TRUE(mr_ && ro_mr_);

		ASSERT_TRUE(arena_.ok()) << xsrc::harness::device_arena_path(test_device());
		const xsrc_qp_entry &e = arena_.qp_entry(qp_->qp_num);
		ASSERT_EQ(e.qpn, qp_->qp_num);
		ASSERT_NE(e.recv_cq_off, 0u);
		ring_ = arena_.at<xsrc_cq_ring>(e.recv_cq_off);
		ASSERT_GE(ring_->payload_stride, 64u);
	}

	void TearDown() override
	{
		if (qp_)
			ibv_destroy_qp(qp_);
		if (mr_)
			ibv_dereg_mr(mr_);
		if (ro_mr_)
			ibv_dereg_mr(ro_mr_);
		if (cq_)
			ibv_destroy_cq(cq_);
		if (pd_)
			ibv_dealloc_pd(pd_);
		if (ctx_)
			ibv_close_device(ctx_);
	}

	// Appends a receive completion whose payload goes to va, as an
	// initiator would (the ring protocol of kernel-abi/xsrc-queues.h).
	void forge(uint64_t va, const void *payload, uint32_t len)
	{
		auto *slots = reinterpret_cast<xsrc_cqe *>(ring_ + 1);
		uint64_t pos = std::atomic_ref<__u64>(ring_->tail).fetch_add(1);
		xsrc_cqe &slot = slots[pos & (ring_->num_entries - 1)];
		ASSERT_EQ(std::atomic_ref<__u64>(slot.seq).load(), pos) << "ring slot not free";
		xsrc_cqe c{};
		c.wr_id = 0xf0f0;
		c.status = IBV_WC_SUCCESS;
		c.opcode = IBV_WC_RECV;
		c.byte_len = len;
		c.qp_num = qp_->qp_num;
		c.flags = XSRC_CQE_DEFERRED;
		c.deferred_va = va;
		std::memcpy(reinterpret_cast<char *>(&slot) + sizeof(slot.seq),
			    reinterpret_cast<const char *>(&c) + sizeof(c.seq), sizeof(c) - sizeof(c.seq));
		auto *payload_slots = reinterpret_cast<unsigned char *>(slots) +
				      uint64_t(ring_->num_entries) * sizeof(xsrc_cqe);
		std::memcpy(payload_slots + (pos & (ring_->num_entries - 1)) * ring_->payload_stride, payload, len);
		std::atomic_ref<__u64>(slot.seq).store(pos + 1, std::memory_order_release);
	}

	// The big slot pool of the ring (revision 5): its busy bitmap and slots.
	uint64_t *big_busy()
	{
		uint64_t off = sizeof(xsrc_cq_ring) + uint64_t(ring_->num_entries) * (sizeof(xsrc_cqe) + ring_->payload_stride);
		return reinterpret_cast<uint64_t *>(reinterpret_cast<unsigned char *>(ring_) + off);
	}
	unsigned char *big_slot(uint32_t i)
	{
		return reinterpret_cast<unsigned char *>(big_busy()) + 64 + uint64_t(i) * ring_->big_stride;
	}

	// As forge(), with the payload in big slot `slot` (XSRC_CQE_DEFERRED_BIG),
	// its busy bit set as an initiator sets it.
	void forge_big(uint64_t va, const void *payload, uint32_t len, uint32_t slot)
	{
		auto *slots = reinterpret_cast<xsrc_cqe *>(ring_ + 1);
		uint64_t pos = std::atomic_ref<__u64>(ring_->tail).fetch_add(1);
		xsrc_cqe &cqe = slots[pos & (ring_->num_entries - 1)];
		ASSERT_EQ(std::atomic_ref<__u64>(cqe.seq).load(), pos) << "ring slot not free";
		xsrc_cqe c{};
		c.wr_id = 0xb1b1;
		c.status = IBV_WC_SUCCESS;
		c.opcode = IBV_WC_RECV;
		c.byte_len = len;
		c.qp_num = qp_->qp_num;
		c.flags = XSRC_CQE_DEFERRED_BIG;
		c.big_slot = static_cast<__u8>(slot);
		c.deferred_va = va;
		if (slot < ring_->big_slots) {
			std::atomic_ref<uint64_t>(big_busy()[slot / 64]).fetch_or(uint64_t(1) << (slot % 64));
			std::memcpy(big_slot(slot), payload, std::min<uint32_t>(len, ring_->big_stride));
		}
		std::memcpy(reinterpret_cast<char *>(&cqe) + sizeof(cqe.seq),
			    reinterpret_cast<const char *>(&c) + sizeof(c.seq), sizeof(c) - sizeof(c.seq));
		std::atomic_ref<__u64>(cqe.seq).store(pos + 1, std::memory_order_release);
	}

	ibv_wc poll()
	{
		ibv_wc wc{};
		for (int i = 0; i < 1000; ++i) {
			int n = ibv_poll_cq(cq_, 1, &wc);
			if (n == 1)
				return wc;
			EXPECT_EQ(n, 0);
			std::this_thread::sleep_for(std::chrono::milliseconds(1));
		}
		ADD_FAILURE() << "no completion";
		return wc;
	}

	ibv_context *ctx_ = nullptr;
	ibv_pd *pd_ = nullptr;
	ibv_cq *cq_ = nullptr;
	ibv_qp *qp_ = nullptr;
	ibv_mr *mr_ = nullptr, *ro_mr_ = nullptr;
	xsrc::harness::MappedArena arena_{test_device()};
	xsrc_cq_ring *ring_ = nullptr;
	alignas(64) char registered_[4096] = {};
	alignas(64) char read_only_[256] = {};  // registered without LOCAL_WRITE
	alignas(64) char unregistered_[256] = {};
};

TEST_F(ForgedCqe, PayloadGoesOnlyIntoOurLocalWriteMemory)
{
	const char attack[64] = "written by a forged completion";

	// Not registered at all: nothing written, a protection error.
	forge(reinterpret_cast<uintptr_t>(unregistered_), attack, sizeof(attack));
	ibv_wc wc = poll();
	EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc.status);
	EXPECT_EQ(wc.byte_len, 0u);
	EXPECT_EQ(std::string(unregistered_, sizeof(attack)), std::string(sizeof(attack), '\0'));

	// Registered, but without LOCAL_WRITE.
	forge(reinterpret_cast<uintptr_t>(read_only_), attack, sizeof(attack));
	wc = poll();
	EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc.status);
	EXPECT_EQ(std::string(read_only_, sizeof(attack)), std::string(sizeof(attack), '\0'));

	// Straddling the end of a LOCAL_WRITE MR.
	forge(reinterpret_cast<uintptr_t>(registered_) + sizeof(registered_) - 8, attack, sizeof(attack));
	wc = poll();
	EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc.status);

	// Inside a LOCAL_WRITE MR: placed, as a legitimate small SEND is (so
	// the checks above are not failing for some other reason).
	forge(reinterpret_cast<uintptr_t>(registered_) + 128, attack, sizeof(attack));
	wc = poll();
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
	EXPECT_EQ(wc.byte_len, sizeof(attack));
	EXPECT_STREQ(registered_ + 128, attack);

	// After deregistration that memory is no longer a target.
	ASSERT_EQ(ibv_dereg_mr(mr_), 0);
	mr_ = nullptr;
	std::memset(registered_, 0, sizeof(registered_));
	forge(reinterpret_cast<uintptr_t>(registered_) + 128, attack, sizeof(attack));
	wc = poll();
	EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc.status);
	EXPECT_EQ(registered_[128], '\0');
}

// The same rules for a payload in a big slot: only into our own
// LOCAL_WRITE memory, only from a slot the ring has and only as much as a
// slot holds; the slot is free again whatever the outcome.
TEST_F(ForgedCqe, BigSlotPayloadGoesOnlyIntoOurLocalWriteMemory)
{
	ASSERT_EQ(ring_->big_slots, 64u) << "a CQ of 16 entries has 64 big slots";
	ASSERT_EQ(ring_->big_polled, 1u) << "our provider announced that it places big payloads";
	std::string attack(2000, 'X');

	forge_big(reinterpret_cast<uintptr_t>(unregistered_), attack.data(), 200, 3);
	ibv_wc wc = poll();
	EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc.status);
	EXPECT_EQ(std::string(unregistered_, 200), std::string(200, '\0'));

	forge_big(reinterpret_cast<uintptr_t>(read_only_), attack.data(), 200, 4);
	wc = poll();
	EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc.status);
	EXPECT_EQ(std::string(read_only_, 200), std::string(200, '\0'));

	// A slot past the pool, and more bytes than a slot holds.
	forge_big(reinterpret_cast<uintptr_t>(registered_), attack.data(), 200, 200);
	wc = poll();
	EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc.status);
	forge_big(reinterpret_cast<uintptr_t>(registered_), attack.data(), ring_->big_stride + 1, 5);
	wc = poll();
	EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc.status);
	EXPECT_EQ(registered_[0], '\0');

	// Inside a LOCAL_WRITE MR: placed.
	forge_big(reinterpret_cast<uintptr_t>(registered_) + 1000, attack.data(), 2000, 63);
	wc = poll();
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
	EXPECT_EQ(wc.byte_len, 2000u);
	EXPECT_EQ(std::string(registered_ + 1000, 2000), attack);
	EXPECT_EQ(registered_[999], '\0');
	EXPECT_EQ(registered_[3000], '\0');

	// Every slot is free again whatever the outcome: the consumer gives
	// emptied slots back once a quarter of the pool is (driver ABI r10).
	for (uint32_t slot = 10; slot < 22; ++slot) {  // with 3, 4, 5 and 63: 16
		forge_big(reinterpret_cast<uintptr_t>(registered_), attack.data(), 100, slot);
		EXPECT_EQ(poll().status, IBV_WC_SUCCESS);
	}
	EXPECT_EQ(big_busy()[0], 0u) << "16 of 64 emptied: all given back";
}

} // namespace
