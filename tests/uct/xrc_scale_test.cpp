// XRC connection scaling of the UCT shim, measured on the device: N eps from one iface to N
// eps of another iface cost the device 1 XRC send QP + 1 XRC receive QP per iface (and no
// per-ep object at all), against N RC QPs and N receive MRs per side in RC mode
// (XSRC_UCT_TRANSPORT=rc). The counts are the device's own (`xsrc status` objects=). Data on
// every ep arrives, in order and complete (AM both ways, put), with one ep destroyed midway
// while it had work outstanding; the last ep gone takes the shared QPs with it.
#include "uct_pair.h"

#include "harness/device_stats.h"

#include <array>

using namespace uctpair;

namespace {

constexpr unsigned kEps = 8;
constexpr unsigned kMsgs = 160;  // per ep and phase: more than rx_queue_len (credits go round)
constexpr unsigned kVictim = 3;  // the ep destroyed midway
constexpr uint8_t kAmId = 5;
constexpr size_t kSlot = 4096;   // each ep's part of the peer's buffer (put targets)

// One side: an iface (uct_pair's Node without its ep) with kEps eps to the peer's kEps eps.
struct Side {
	Node node;
	std::array<uct_ep_h, kEps> eps{};
	// Received AMs: the next expected sequence number per ep index, and what went wrong.
	std::array<uint32_t, kEps> next{};
	unsigned bad = 0;

	static ucs_status_t on_am(void *arg, void *data, size_t length, unsigned)
	{
		auto *s = static_cast<Side *>(arg);
		uint64_t hdr;
		if (length < sizeof(hdr) + 16) {
			++s->bad;
			return UCS_OK;
		}
		memcpy(&hdr, data, sizeof(hdr));
		uint32_t k = static_cast<uint32_t>(hdr >> 32), seq = static_cast<uint32_t>(hdr);
		const auto *payload = static_cast<const uint8_t *>(data) + sizeof(hdr);
		bool ok = k < kEps && seq == s->next[k];
		for (unsigned b = 0; b < 16 && ok; ++b)
			ok = payload[b] == static_cast<uint8_t>(k * 31 + seq + b);
		if (!ok)
			++s->bad;
		else
			++s->next[k];
		return UCS_OK;
	}

	ucs_status_t open()
	{
		ucs_status_t st = node.open(2 * kEps * kSlot);  // slots the peer puts into, then our put sources
		if (st != UCS_OK)
			return st;
		uct_ep_destroy(node.ep);  // the eps are ours
		node.ep = nullptr;
		return uct_iface_set_am_handler(node.iface, kAmId, on_am, this, 0);
	}

	ucs_status_t create_eps()
	{
		for (auto &ep : eps) {
			uct_ep_params_t p{};
			p.field_mask = UCT_EP_PARAM_FIELD_IFACE;
			p.iface = node.iface;
			ucs_status_t st = uct_ep_create(&p, &ep);
			if (st != UCS_OK)
				return st;
		}
		return UCS_OK;
	}

	// Swaps the device address, every ep address, buffer address and rkey; connects ep k to
	// the peer's ep k, then waits until every ep can send (the XRC set-up may need the
	// peer's progress: both sides wait here).
	ucs_status_t connect(Link &link)
	{
		const uct_iface_attr_t &a = node.attr;
		std::vector<uint8_t> mine(a.device_addr_len + kEps * a.ep_addr_len + 16);
		uint8_t *p = mine.data();
		ucs_status_t st = uct_iface_get_device_address(node.iface, reinterpret_cast<uct_device_addr_t *>(p));
		p += a.device_addr_len;
		for (unsigned k = 0; k < kEps && st == UCS_OK; ++k, p += a.ep_addr_len)
			st = uct_ep_get_address(eps[k], reinterpret_cast<uct_ep_addr_t *>(p));
		if (st != UCS_OK)
			return st;
		uint64_t addr = reinterpret_cast<uintptr_t>(node.mem.data());
		memcpy(p, &addr, 8);
		st = xsrc_uct_md_mkey_pack(node.md, node.memh, p + 8);
		std::vector<uint8_t> theirs;
		if (st != UCS_OK || !send_blob(link, mine) || !recv_blob(link, theirs) || theirs.size() != mine.size())
			return st != UCS_OK ? st : UCS_ERR_IO_ERROR;
		const uint8_t *q = theirs.data();
		auto *dev = reinterpret_cast<const uct_device_addr_t *>(q);
		q += a.device_addr_len;
		for (unsigned k = 0; k < kEps; ++k, q += a.ep_addr_len) {
			st = uct_ep_connect_to_ep(eps[k], dev, reinterpret_cast<const uct_ep_addr_t *>(q));
			if (st != UCS_OK)
				return st;
		}
		memcpy(&node.peer_addr, q, 8);
		st = xsrc_uct_rkey_unpack(nullptr, q + 8, &node.peer_rkey);
		for (unsigned k = 0; k < kEps && st == UCS_OK; ++k)
			st = flush(k);
		return st;
	}

	ucs_status_t flush(unsigned k)
	{
		ucs_status_t st;
		auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
		while ((st = uct_ep_flush(eps[k], 0, nullptr)) == UCS_INPROGRESS || st == UCS_ERR_NO_RESOURCE) {
			if (std::chrono::steady_clock::now() > end)
				return UCS_ERR_TIMED_OUT;
			node.progress();
		}
		return st;
	}

	// Runs op() until it is not UCS_ERR_NO_RESOURCE (the eps of an XRC iface share one send
	// queue: one may have to wait for the others' work), progressing in between.
	template <typename Op>
	ucs_status_t retry(Op op)
	{
		ucs_status_t st;
		auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
		while ((st = op()) == UCS_ERR_NO_RESOURCE) {
			if (std::chrono::steady_clock::now() > end)
				return UCS_ERR_TIMED_OUT;
			node.progress();
		}
		return st;
	}

	// kMsgs AMs on every live ep, interleaved, numbered from `first`; each ep also puts its
	// slot of the peer's buffer (short, then zcopy), and is flushed.
	ucs_status_t send_phase(uint32_t first, uint8_t fill)
	{
		for (uint32_t n = 0; n < kMsgs; ++n)
			for (unsigned k = 0; k < kEps; ++k) {
				if (!eps[k])
					continue;
				uint32_t seq = first + n;
				uint8_t payload[16];
				for (unsigned b = 0; b < 16; ++b)
					payload[b] = static_cast<uint8_t>(k * 31 + seq + b);
				uint64_t hdr = (static_cast<uint64_t>(k) << 32) | seq;
				ucs_status_t st =
					retry([&] { return uct_ep_am_short(eps[k], kAmId, hdr, payload, sizeof(payload)); });
				if (st != UCS_OK)
					return st;
			}
		for (unsigned k = 0; k < kEps; ++k) {
			if (!eps[k])
				continue;
			std::vector<char> pattern(kSlot, static_cast<char>(fill + k));
			uint64_t dst = node.peer_addr + k * kSlot;
			ucs_status_t st = retry([&] { return uct_ep_put_short(eps[k], pattern.data(), 64, dst, node.peer_rkey.rkey); });
			if (st == UCS_OK)
				st = flush(k);  // the put lands before the zcopy rewrites the slot's start
			char *src = node.mem.data() + (kEps + k) * kSlot;  // registered source
			memcpy(src, pattern.data(), kSlot);
			uct_iov_t iov{src, kSlot, node.memh, 0, 1};
			if (st == UCS_OK)
				st = retry([&] { return uct_ep_put_zcopy(eps[k], &iov, 1, dst, node.peer_rkey.rkey, nullptr); });
			if (st != UCS_OK && st != UCS_INPROGRESS)
				return st;
			st = flush(k);
			if (st != UCS_OK)
				return st;
		}
		return UCS_OK;
	}

	bool received(uint32_t upto, uint32_t victim_upto)
	{
		return node.wait([&] {
			for (unsigned k = 0; k < kEps; ++k)
				if (next[k] != (k == kVictim ? victim_upto : upto))
					return false;
			return true;
		});
	}

	// The slots the peer put: every byte of slot k is fill + k (peer's pattern).
	bool slots_hold(uint8_t fill, bool victim_too)
	{
		for (unsigned k = 0; k < kEps; ++k) {
			if (k == kVictim && !victim_too)
				continue;
			for (size_t b = 0; b < kSlot; ++b)
				if (static_cast<uint8_t>(node.mem[k * kSlot + b]) != static_cast<uint8_t>(fill + k))
					return false;
		}
		return true;
	}

	void destroy(unsigned k)
	{
		if (eps[k])
			uct_ep_destroy(eps[k]);
		eps[k] = nullptr;
	}
	void destroy_all()
	{
		for (unsigned k = 0; k < kEps; ++k)
			destroy(k);
	}
};

bool is_xrc(uct_iface_h iface) { return xsrc_uct_iface_transport(iface) == XSRC_UCT_TRANSPORT_XRC; }

// What N eps per side cost the device, over both sides: creating them (every ep's QP and
// receive MR on RC; nothing on XRC), then connecting them (nothing more on RC; on XRC one send
// QP and one receive QP per side).
long created_objects(bool xrc) { return xrc ? 0 : 2 * 2 * kEps; }
long connected_objects(bool xrc) { return xrc ? 2 * 2 : 0; }

}  // namespace

TEST(XrcScale, EightEpsShareOneQpPairPerIfaceDataArrivesEpDestroyedMidway)
{
	// The child: its side of every step, in lock step with the parent over the socket.
	auto child = [](Link &link) -> int {
		Side s;
		CHILD_CHECK(s.open() == UCS_OK);
		CHILD_CHECK(send_u64(link, 1) && recv_u64(link) == 2);  // parent counted the opened ifaces
		CHILD_CHECK(s.create_eps() == UCS_OK);
		CHILD_CHECK(send_u64(link, 3) && recv_u64(link) == 4);  // parent counted after both created eps
		CHILD_CHECK(s.connect(link) == UCS_OK);
		CHILD_CHECK(send_u64(link, 5) && recv_u64(link) == 6);  // counted after connecting
		// Phase 1: every ep, both ways.
		CHILD_CHECK(s.send_phase(0, 0x40) == UCS_OK);
		CHILD_CHECK(s.received(kMsgs, kMsgs));
		CHILD_CHECK(s.bad == 0);
		CHILD_CHECK(send_u64(link, 7) && recv_u64(link) == 8);   // the parent saw phase 1 complete
		CHILD_CHECK(s.slots_hold(0x10, true));
		CHILD_CHECK(send_u64(link, 80));
		// The parent destroys its ep kVictim with a put outstanding; this side too.
		CHILD_CHECK(recv_u64(link) == 9);
		s.destroy(kVictim);
		CHILD_CHECK(send_u64(link, 10) && recv_u64(link) == 11);  // counted with one ep gone
		// Phase 2: the other seven.
		CHILD_CHECK(s.send_phase(kMsgs, 0x60) == UCS_OK);
		CHILD_CHECK(s.received(2 * kMsgs, kMsgs));
		CHILD_CHECK(s.bad == 0);
		CHILD_CHECK(send_u64(link, 12) && recv_u64(link) == 13);
		CHILD_CHECK(s.slots_hold(0x30, false));
		// Every ep gone: the shared QPs go (the peer's receive QP when it hears of it).
		s.destroy_all();
		CHILD_CHECK(send_u64(link, 14));
		// Progress (the parent's "bye" destroys our receive QP for it) until the parent has
		// counted the teardown.
		CHILD_CHECK(s.node.wait([&] { return link.readable(); }, 20));
		CHILD_CHECK(recv_u64(link) == 15);
		return 0;
	};

	auto parent = [](Link &link, const Child &) {
		Side s;
		ASSERT_EQ(s.open(), UCS_OK);
		bool xrc = is_xrc(s.node.iface);
		ASSERT_EQ(recv_u64(link), 1u);
		long base = xsrc::harness::device_objects(dev_name());
		ASSERT_GE(base, 0) << "xsrc status gives no objects= for " << dev_name();
		ASSERT_TRUE(send_u64(link, 2));
		ASSERT_EQ(s.create_eps(), UCS_OK);
		ASSERT_EQ(recv_u64(link), 3u);
		long created = xsrc::harness::device_objects(dev_name());
		EXPECT_EQ(created - base, created_objects(xrc)) << (xrc ? "XRC" : "RC");
		ASSERT_TRUE(send_u64(link, 4));
		ASSERT_EQ(s.connect(link), UCS_OK);
		ASSERT_EQ(recv_u64(link), 5u);
		long connected = xsrc::harness::device_objects(dev_name());
		EXPECT_EQ(connected - created, connected_objects(xrc)) << (xrc ? "XRC" : "RC");
		printf("[ scale    ] %s: %u eps per side; device objects: +%ld for the eps, +%ld to connect them\n",
		       xrc ? "XRC" : "RC", kEps, created - base, connected - created);
		ASSERT_TRUE(send_u64(link, 6));

		ASSERT_EQ(s.send_phase(0, 0x10), UCS_OK);
		ASSERT_TRUE(s.received(kMsgs, kMsgs)) << "AMs missing after phase 1";
		EXPECT_EQ(s.bad, 0u);
		ASSERT_EQ(recv_u64(link), 7u);
		ASSERT_TRUE(send_u64(link, 8));
		EXPECT_TRUE(s.slots_hold(0x40, true));
		ASSERT_EQ(recv_u64(link), 80u);  // the child has checked its slots

		// ep kVictim goes with a put still outstanding; the shared QPs stay for the others.
		std::vector<char> big(kSlot, 0x7f);
		char *src = s.node.mem.data() + (kEps + kVictim) * kSlot;
		memcpy(src, big.data(), kSlot);
		uct_iov_t iov{src, kSlot, s.node.memh, 0, 1};
		ucs_status_t st = s.retry([&] {
			return uct_ep_put_zcopy(s.eps[kVictim], &iov, 1, s.node.peer_addr + kVictim * kSlot, s.node.peer_rkey.rkey,
						nullptr);
		});
		EXPECT_TRUE(st == UCS_OK || st == UCS_INPROGRESS) << ucs_status_string(st);
		s.destroy(kVictim);
		ASSERT_TRUE(send_u64(link, 9));
		ASSERT_EQ(recv_u64(link), 10u);
		long after_victim = xsrc::harness::device_objects(dev_name());
		// RC: the victim's QP and MR on each side are gone; XRC: nothing changed.
		EXPECT_EQ(connected - after_victim, xrc ? 0 : 2 * 2) << (xrc ? "XRC" : "RC");
		ASSERT_TRUE(send_u64(link, 11));

		ASSERT_EQ(s.send_phase(kMsgs, 0x30), UCS_OK);
		ASSERT_TRUE(s.received(2 * kMsgs, kMsgs)) << "AMs missing after phase 2";
		EXPECT_EQ(s.bad, 0u);
		ASSERT_EQ(recv_u64(link), 12u);
		ASSERT_TRUE(send_u64(link, 13));
		EXPECT_TRUE(s.slots_hold(0x60, false));

		s.destroy_all();
		ASSERT_EQ(recv_u64(link), 14u);
		// Every ep of both sides is gone: so are the QPs (the receive QPs when the sides have
		// heard from each other, in progress).
		long now = -1;
		bool back = s.node.wait([&] {
			now = xsrc::harness::device_objects(dev_name());
			return now == base;
		});
		EXPECT_TRUE(back) << "objects " << now << ", before the eps " << base;
		send_u64(link, 15);
	};

	EXPECT_EQ(run_pair(child, parent), 0);
}

// Fate sharing: cancelling one ep (flush CANCEL) leaves the others alone on both transports;
// a failed completion (a bad rkey) fails the QP it happened on: on XRC the shared one, so
// every ep on it hears of it through the error handler; on RC that ep alone.
TEST(XrcScale, SharedQpFailureFailsEveryEpCancellingOneDoesNot)
{
	auto child = [](Link &link) -> int {
		Side s;
		CHILD_CHECK(s.open() == UCS_OK);
		CHILD_CHECK(s.create_eps() == UCS_OK);
		CHILD_CHECK(s.connect(link) == UCS_OK);
		CHILD_CHECK(s.node.wait([&] { return link.readable(); }, 30));
		CHILD_CHECK(recv_u64(link) == 1);
		while (s.node.progress() > 0) {
		}  // what the parent flushed before it wrote is in our queue
		unsigned got = 0;
		for (unsigned k = 0; k < kEps; ++k)
			got += s.next[k];
		CHILD_CHECK(send_u64(link, got) && send_u64(link, s.bad));
		CHILD_CHECK(recv_u64(link) == 2);
		return 0;
	};
	auto parent = [](Link &link, const Child &) {
		Side s;
		ASSERT_EQ(s.open(), UCS_OK);
		bool xrc = is_xrc(s.node.iface);
		ASSERT_EQ(s.create_eps(), UCS_OK);
		ASSERT_EQ(s.connect(link), UCS_OK);
		auto am = [&](unsigned k, uint32_t seq) {
			uint8_t payload[16];
			for (unsigned b = 0; b < 16; ++b)
				payload[b] = static_cast<uint8_t>(k * 31 + seq + b);
			uint64_t hdr = (static_cast<uint64_t>(k) << 32) | seq;
			ucs_status_t st = s.retry([&] { return uct_ep_am_short(s.eps[k], kAmId, hdr, payload, sizeof(payload)); });
			return st == UCS_OK ? s.flush(k) : st;
		};

		// Cancel ep 1: no error handler, its sends answer CANCELED, the others go on.
		ucs_status_t st = uct_ep_flush(s.eps[1], UCT_FLUSH_FLAG_CANCEL, nullptr);
		EXPECT_TRUE(st == UCS_OK || st == UCS_INPROGRESS) << ucs_status_string(st);
		EXPECT_EQ(am(1, 0), UCS_ERR_CANCELED);
		unsigned sent = 0;
		for (unsigned k = 0; k < kEps; ++k)
			if (k != 1) {
				EXPECT_EQ(am(k, 0), UCS_OK) << "ep " << k;
				++sent;
			}
		EXPECT_EQ(s.node.errors, 0);

		// A bad rkey on ep 0.
		uint64_t word = 1;
		st = s.retry([&] {
			return uct_ep_put_short(s.eps[0], &word, sizeof(word), s.node.peer_addr, s.node.peer_rkey.rkey ^ 0x5a5a00);
		});
		EXPECT_EQ(st, UCS_OK) << ucs_status_string(st);
		int expect_errors = xrc ? static_cast<int>(kEps) - 1 : 1;  // every ep on the QP but the cancelled one
		EXPECT_TRUE(s.node.wait([&] { return s.node.errors >= expect_errors; }, 10)) << s.node.errors;
		auto settle = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
		while (std::chrono::steady_clock::now() < settle)
			s.node.progress();
		EXPECT_EQ(s.node.errors, expect_errors) << (xrc ? "XRC" : "RC");
		EXPECT_EQ(s.node.last_error, UCS_ERR_INVALID_ADDR) << ucs_status_string(s.node.last_error);
		// Another ep: failed with the QP on XRC, untouched on RC.
		st = am(2, 1);
		if (xrc) {
			EXPECT_EQ(st, UCS_ERR_INVALID_ADDR) << ucs_status_string(st);
		} else {
			EXPECT_EQ(st, UCS_OK) << ucs_status_string(st);
			++sent;
		}
		ASSERT_TRUE(send_u64(link, 1));
		EXPECT_EQ(recv_u64(link), sent) << "AMs the child received";
		EXPECT_EQ(recv_u64(link), 0u) << "AMs the child found wrong";
		send_u64(link, 2);
		s.destroy_all();
	};
	EXPECT_EQ(run_pair(child, parent), 0);
}

// A peer process that dies says no "bye": the receive QP its iface had here is found (its
// socket name is free) and destroyed by progress within about a second. RC has none.
TEST(XrcScale, ReceiveQpOfADeadPeerIsReaped)
{
	auto child = [](Link &link) -> int {
		Side s;
		CHILD_CHECK(s.open() == UCS_OK);
		CHILD_CHECK(s.create_eps() == UCS_OK);
		CHILD_CHECK(s.connect(link) == UCS_OK);
		CHILD_CHECK(send_u64(link, 1));
		recv_u64(link);  // until the parent is ready to watch
		kill(getpid(), SIGKILL);
		return 1;
	};
	int rc = run_pair(child, [](Link &link, const Child &peer) {
		Side s;
		ASSERT_EQ(s.open(), UCS_OK);
		bool xrc = is_xrc(s.node.iface);
		ASSERT_EQ(s.create_eps(), UCS_OK);
		ASSERT_EQ(s.connect(link), UCS_OK);
		ASSERT_EQ(recv_u64(link), 1u);
		ASSERT_TRUE(send_u64(link, 2));
		peer.wait_exited();
		// The device releases what the child owned; this side does not progress meanwhile.
		long before = xsrc::harness::device_objects(dev_name()), now;
		for (int k = 0; k < 50; ++k) {
			usleep(20000);
			now = xsrc::harness::device_objects(dev_name());
			if (now == before && k >= 5)
				break;
			before = now;
		}
		long expect = before - (xrc ? 1 : 0);
		auto end = std::chrono::steady_clock::now() + std::chrono::seconds(xrc ? 5 : 2);
		while (std::chrono::steady_clock::now() < end && (now = xsrc::harness::device_objects(dev_name())) != expect)
			for (int k = 0; k < 1000; ++k)
				s.node.progress();
		if (!xrc) {  // nothing to reap: stays as it was after the progress
			now = xsrc::harness::device_objects(dev_name());
		}
		EXPECT_EQ(now, expect) << (xrc ? "XRC: the dead peer's receive QP stays" : "RC: objects changed");
		EXPECT_EQ(s.node.errors, 0);  // no traffic: nobody failed
		s.destroy_all();
	});
	EXPECT_EQ(rc, 128 + SIGKILL);
}
