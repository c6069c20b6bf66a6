// The UCT shim's core ops between two processes on xsrc0, through UCX's public API:
// query and memory domain, put/get, active messages (descriptors kept and released),
// atomics (native and emulated, under contention), flow control and pending queues,
// flush/fence/cancel, a dead peer (ep_check, error handler, failed ops), completion events,
// worker-driven progress, and libuct's own uct_iface_set_am_handler / estimate_perf on
// our iface.
#include "uct_pair.h"

#include <algorithm>
#include <atomic>
#include <numeric>
#include <poll.h>

using namespace uctpair;

// libuct exports uct_iface_estimate_perf, but Debian ships no uct_v2.h: the 1.13.1 struct,
// re-declared.
struct PerfAttr {
	uint64_t field_mask;
	int operation;
	int local_memory_type;
	int remote_memory_type;
	uint8_t local_sys_device;
	uint8_t remote_sys_device;
	double send_pre_overhead;
	double send_post_overhead;
	double recv_overhead;
	uct_ppn_bandwidth_t bandwidth;
	ucs_linear_func_t latency;
	size_t max_inflight_eps;
};
extern "C" ucs_status_t uct_iface_estimate_perf(uct_iface_h, PerfAttr *);
constexpr uint64_t perf_send_pre_overhead = UCS_BIT(5), perf_bandwidth = UCS_BIT(8), perf_latency = UCS_BIT(9);

namespace {

enum Cmd : uint64_t {
	cmd_exit = 1,
	cmd_dump = 2,      // off, len -> blob
	cmd_report = 3,    // -> blob of received AM records
	cmd_release = 4,   // release held descriptors, stop holding
	cmd_send_am = 5,   // send one am_short (id 1) to the peer
	cmd_hold = 6,      // start holding descriptors of AM id 2/3
	cmd_count = 7,     // -> u64 number of AM records
	cmd_iface_addr = 8,  // -> blob: device address + iface address
};

// What the child's AM handlers saw.
struct Rx {
	Node *node = nullptr;
	std::vector<std::vector<uint8_t>> records;  // am id byte + payload, in arrival order
	std::vector<std::pair<void *, size_t>> held;
	bool hold = false;
	bool held_intact = true;
	std::vector<std::vector<uint8_t>> held_copy;
};

ucs_status_t am_record(void *arg, void *data, size_t length, unsigned flags)
{
	auto *rx = static_cast<Rx *>(arg);
	const auto *bytes = static_cast<const uint8_t *>(data);
	std::vector<uint8_t> r{1};
	r.insert(r.end(), bytes, bytes + length);
	rx->records.push_back(std::move(r));
	(void)flags;
	return UCS_OK;
}

// Id 2: keeps the descriptor while holding (UCT_CB_PARAM_FLAG_DESC), records it either way.
ucs_status_t am_keep(void *arg, void *data, size_t length, unsigned flags)
{
	auto *rx = static_cast<Rx *>(arg);
	const auto *bytes = static_cast<const uint8_t *>(data);
	std::vector<uint8_t> r{2};
	r.insert(r.end(), bytes, bytes + length);
	rx->records.push_back(r);
	if (rx->hold && (flags & UCT_CB_PARAM_FLAG_DESC)) {
		rx->held.emplace_back(data, length);
		rx->held_copy.emplace_back(static_cast<uint8_t *>(data), static_cast<uint8_t *>(data) + length);
		return UCS_INPROGRESS;
	}
	return UCS_OK;
}

void release_all(Rx &rx)
{
	for (size_t k = 0; k < rx.held.size(); ++k) {
		auto [data, len] = rx.held[k];
		if (memcmp(data, rx.held_copy[k].data(), len) != 0)
			rx.held_intact = false;
		uct_iface_release_desc(data);  // no rx_headroom: the descriptor is the data
	}
	rx.held.clear();
	rx.held_copy.clear();
	rx.hold = false;
}

// The child: open, connect, then serve commands while progressing.
int serve_child(Link &link, const xsrc_uct_iface_config_t *cfg = nullptr, size_t fill_off = 512 * 1024)
{
	Node n;
	Rx rx;
	rx.node = &n;
	CHILD_CHECK(n.open(1 << 20, cfg) == UCS_OK);
	// libuct's own uct_iface_set_am_handler on our iface (layout-compatible base).
	CHILD_CHECK(uct_iface_set_am_handler(n.iface, 1, am_record, &rx, 0) == UCS_OK);
	CHILD_CHECK(uct_iface_set_am_handler(n.iface, 2, am_keep, &rx, 0) == UCS_OK);
	CHILD_CHECK(uct_iface_set_am_handler(n.iface, 40, am_record, &rx, 0) == UCS_ERR_INVALID_PARAM);
	for (size_t k = 0; k < 64 * 1024; ++k)
		n.mem[fill_off + k] = static_cast<char>(k * 7 + 3);
	CHILD_CHECK(n.connect(link) == UCS_OK);
	for (;;) {
		n.progress();
		if (!link.readable())
			continue;
		uint64_t cmd = recv_u64(link);
		switch (cmd) {
		case cmd_exit:
			CHILD_CHECK(rx.held_intact);
			return 0;
		case cmd_dump: {
			uint64_t off = recv_u64(link), len = recv_u64(link);
			CHILD_CHECK(off + len <= n.mem.size());
			send_blob(link, std::vector<uint8_t>(n.mem.begin() + off, n.mem.begin() + off + len));
			break;
		}
		case cmd_report: {
			std::vector<uint8_t> out;
			for (auto &r : rx.records) {
				uint32_t len = static_cast<uint32_t>(r.size());
				out.insert(out.end(), reinterpret_cast<uint8_t *>(&len), reinterpret_cast<uint8_t *>(&len) + 4);
				out.insert(out.end(), r.begin(), r.end());
			}
			send_blob(link, out);
			break;
		}
		case cmd_release:
			release_all(rx);
			send_u64(link, rx.held_intact ? 1 : 0);
			break;
		case cmd_send_am: {
			uint64_t v = 0xabcdef;
			ucs_status_t st;
			while ((st = uct_ep_am_short(n.ep, 1, v, nullptr, 0)) == UCS_ERR_NO_RESOURCE)
				n.progress();
			send_u64(link, st);
			break;
		}
		case cmd_hold:
			rx.hold = true;
			send_u64(link, 1);
			break;
		case cmd_count:
			send_u64(link, rx.records.size());
			break;
		case cmd_iface_addr: {
			std::vector<uint8_t> b(n.attr.device_addr_len + n.attr.iface_addr_len);
			CHILD_CHECK(uct_iface_get_device_address(n.iface, reinterpret_cast<uct_device_addr_t *>(b.data())) == UCS_OK);
			CHILD_CHECK(uct_iface_get_address(n.iface, reinterpret_cast<uct_iface_addr_t *>(b.data() + n.attr.device_addr_len)) ==
				    UCS_OK);
			send_blob(link, b);
			break;
		}
		default:
			return 2;
		}
	}
}

std::vector<uint8_t> dump(Link &link, uint64_t off, uint64_t len)
{
	send_u64(link, cmd_dump);
	send_u64(link, off);
	send_u64(link, len);
	std::vector<uint8_t> b;
	recv_blob(link, b);
	return b;
}

std::vector<std::vector<uint8_t>> report(Link &link)
{
	send_u64(link, cmd_report);
	std::vector<uint8_t> b;
	recv_blob(link, b);
	std::vector<std::vector<uint8_t>> out;
	for (size_t off = 0; off + 4 <= b.size();) {
		uint32_t len;
		memcpy(&len, b.data() + off, 4);
		out.emplace_back(b.begin() + off + 4, b.begin() + off + 4 + len);
		off += 4 + len;
	}
	return out;
}

// Connects this process to a serve_child and runs `body`; then stops the child.
void with_peer(const std::function<void(Node &, Link &link)> &body, const xsrc_uct_iface_config_t *cfg = nullptr,
	       bool expect_child_ok = true)
{
	int rc = run_pair([cfg](Link &link) { return serve_child(link, cfg); },
			  [&](Link &link, const Child &) {
				  Node n;
				  ASSERT_EQ(n.open(1 << 20, cfg), UCS_OK);
				  ASSERT_EQ(n.connect(link), UCS_OK);
				  send_u64(link, cmd_count);  // the child answers once it is connected too
				  ASSERT_EQ(recv_u64(link), 0u);
				  body(n, link);
				  send_u64(link, cmd_exit);
			  });
	if (expect_child_ok) {
		EXPECT_EQ(rc, 0);
	}
}

size_t pack_pattern(void *dest, void *arg)
{
	auto len = *static_cast<size_t *>(arg);
	for (size_t k = 0; k < len; ++k)
		static_cast<uint8_t *>(dest)[k] = static_cast<uint8_t>(k ^ 0x5a);
	return len;
}

void unpack_copy(void *arg, const void *data, size_t length)
{
	auto *v = static_cast<std::vector<uint8_t> *>(arg);
	v->assign(static_cast<const uint8_t *>(data), static_cast<const uint8_t *>(data) + length);
}

}  // namespace

// --- Memory domain and query (one process) ------------------------------------------------------
TEST(Query, MemoryDomainAndResources)
{
	uct_md_resource_desc_t *mds = nullptr;
	unsigned nmd = 0;
	ASSERT_EQ(xsrc_uct_query_md_resources(&mds, &nmd), UCS_OK);
	bool found = false;
	for (unsigned k = 0; k < nmd; ++k)
		found |= strcmp(mds[k].md_name, dev_name()) == 0;
	xsrc_uct_release_md_resources(mds);
	EXPECT_TRUE(found);

	uct_md_h md = nullptr;
	EXPECT_EQ(xsrc_uct_md_open("no-such-device", nullptr, &md), UCS_ERR_NO_DEVICE);
	EXPECT_EQ(xsrc_uct_md_open(nullptr, nullptr, &md), UCS_ERR_INVALID_PARAM);
	ASSERT_EQ(xsrc_uct_md_open(dev_name(), nullptr, &md), UCS_OK);
	uct_md_attr_t ma{};
	ASSERT_EQ(xsrc_uct_md_query(md, &ma), UCS_OK);
	EXPECT_TRUE(ma.cap.flags & UCT_MD_FLAG_REG);
	EXPECT_TRUE(ma.cap.flags & UCT_MD_FLAG_NEED_RKEY);
	EXPECT_STREQ(ma.component_name, "xsrc");
	EXPECT_GT(ma.rkey_packed_size, 0u);

	uct_tl_resource_desc_t *tls = nullptr;
	unsigned ntl = 0;
	ASSERT_EQ(xsrc_uct_md_query_tl_resources(md, &tls, &ntl), UCS_OK);
	ASSERT_GE(ntl, 1u);
	EXPECT_STREQ(tls[0].tl_name, "xsrc");
	EXPECT_EQ(std::string(tls[0].dev_name), std::string(dev_name()) + ":1");
	xsrc_uct_release_tl_resource_list(tls);

	// Registration, packing, unpacking; bad input gets a status.
	std::vector<char> buf(4096);
	uct_mem_h memh = nullptr;
	EXPECT_EQ(xsrc_uct_md_mem_reg(md, nullptr, 10, 0, &memh), UCS_ERR_INVALID_PARAM);
	EXPECT_EQ(xsrc_uct_md_mem_reg(md, buf.data(), 0, 0, &memh), UCS_ERR_INVALID_PARAM);
	EXPECT_NE(xsrc_uct_md_mem_reg(md, reinterpret_cast<void *>(0x10000), 4096, 0, &memh), UCS_OK);  // unmapped
	ASSERT_EQ(xsrc_uct_md_mem_reg(md, buf.data(), buf.size(), 0, &memh), UCS_OK);
	std::vector<uint8_t> packed(ma.rkey_packed_size);
	ASSERT_EQ(xsrc_uct_md_mkey_pack(md, memh, packed.data()), UCS_OK);
	uct_rkey_bundle_t rb{};
	ASSERT_EQ(xsrc_uct_rkey_unpack(nullptr, packed.data(), &rb), UCS_OK);
	EXPECT_NE(rb.rkey, UCT_INVALID_RKEY);
	EXPECT_EQ(xsrc_uct_rkey_release(nullptr, &rb), UCS_OK);
	std::vector<uint8_t> garbage(ma.rkey_packed_size, 0xee);
	EXPECT_EQ(xsrc_uct_rkey_unpack(nullptr, garbage.data(), &rb), UCS_ERR_INVALID_PARAM);
	EXPECT_EQ(xsrc_uct_md_mem_dereg(md, memh), UCS_OK);
	xsrc_uct_md_close(md);
}

TEST(Query, IfaceCapsAndLibuctOnOurIface)
{
	Node n;
	ASSERT_EQ(n.open(), UCS_OK);
	const uct_iface_attr_t &a = n.attr;
	uint64_t need = UCT_IFACE_FLAG_AM_SHORT | UCT_IFACE_FLAG_AM_BCOPY | UCT_IFACE_FLAG_AM_ZCOPY |
			UCT_IFACE_FLAG_PUT_SHORT | UCT_IFACE_FLAG_PUT_BCOPY | UCT_IFACE_FLAG_PUT_ZCOPY |
			UCT_IFACE_FLAG_GET_SHORT | UCT_IFACE_FLAG_GET_BCOPY | UCT_IFACE_FLAG_GET_ZCOPY |
			UCT_IFACE_FLAG_PENDING | UCT_IFACE_FLAG_CONNECT_TO_EP | UCT_IFACE_FLAG_EP_CHECK |
			UCT_IFACE_FLAG_EVENT_FD | UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE | UCT_IFACE_FLAG_CB_SYNC;
	EXPECT_EQ(a.cap.flags & need, need);
	EXPECT_GT(a.cap.put.max_short, 0u);
	EXPECT_EQ(a.cap.am.max_bcopy, 8192u - 16u);
	EXPECT_GE(a.cap.put.max_zcopy, size_t{1} << 20);
	EXPECT_GE(a.cap.am.max_iov, 1u);
	uint64_t fops = UCS_BIT(UCT_ATOMIC_OP_ADD) | UCS_BIT(UCT_ATOMIC_OP_AND) | UCS_BIT(UCT_ATOMIC_OP_OR) |
			UCS_BIT(UCT_ATOMIC_OP_XOR) | UCS_BIT(UCT_ATOMIC_OP_SWAP) | UCS_BIT(UCT_ATOMIC_OP_CSWAP);
	EXPECT_EQ(a.cap.atomic64.fop_flags, fops);
	EXPECT_EQ(a.cap.atomic32.fop_flags, fops);
	EXPECT_EQ(a.cap.atomic64.op_flags, fops & ~(UCS_BIT(UCT_ATOMIC_OP_SWAP) | UCS_BIT(UCT_ATOMIC_OP_CSWAP)));
	EXPECT_EQ(a.device_addr_len, 18u);
	EXPECT_EQ(a.ep_addr_len, 32u);
	EXPECT_GT(a.bandwidth.shared, 0);
	EXPECT_GT(a.latency.c, 0);

	// libuct's uct_iface_estimate_perf goes through our internal_ops to its own default.
	PerfAttr pa{};
	pa.field_mask = perf_send_pre_overhead | perf_bandwidth | perf_latency;
	ASSERT_EQ(uct_iface_estimate_perf(n.iface, &pa), UCS_OK);
	EXPECT_EQ(pa.bandwidth.shared, a.bandwidth.shared);
	EXPECT_EQ(pa.latency.c, a.latency.c);
	EXPECT_EQ(pa.send_pre_overhead, a.overhead);

	// Device address is reachable from itself; no peer: null is refused.
	std::vector<uint8_t> dev(a.device_addr_len);
	ASSERT_EQ(uct_iface_get_device_address(n.iface, reinterpret_cast<uct_device_addr_t *>(dev.data())), UCS_OK);
	EXPECT_TRUE(uct_iface_is_reachable(n.iface, reinterpret_cast<uct_device_addr_t *>(dev.data()), nullptr));
	EXPECT_FALSE(uct_iface_is_reachable(n.iface, nullptr, nullptr));
	EXPECT_EQ(uct_iface_get_address(n.iface, nullptr), UCS_ERR_INVALID_PARAM);
	EXPECT_TRUE(a.cap.flags & UCT_IFACE_FLAG_CONNECT_TO_IFACE);
	EXPECT_GT(a.iface_addr_len, 0u);

	// An unconnected ep has no resources yet: sends say NO_RESOURCE, ep_check is a no-op.
	EXPECT_EQ(uct_ep_am_short(n.ep, 1, 0, nullptr, 0), UCS_ERR_NO_RESOURCE);
	EXPECT_EQ(uct_ep_check(n.ep, 0, nullptr), UCS_OK);
	// Bad AM id / too long.
	EXPECT_EQ(uct_ep_am_short(n.ep, 32, 0, nullptr, 0), UCS_ERR_INVALID_PARAM);
	std::vector<char> big(a.cap.am.max_short + 1);
	EXPECT_EQ(uct_ep_am_short(n.ep, 1, 0, big.data(), static_cast<unsigned>(big.size())), UCS_ERR_INVALID_PARAM);
	// Connect-to-iface without an iface address, or with garbage: a status, not a crash.
	uct_ep_params_t ep_params{};
	ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR | UCT_EP_PARAM_FIELD_IFACE_ADDR;
	ep_params.iface = n.iface;
	ep_params.dev_addr = reinterpret_cast<uct_device_addr_t *>(dev.data());
	uct_ep_h ep2 = nullptr;
	EXPECT_EQ(uct_ep_create(&ep_params, &ep2), UCS_ERR_INVALID_PARAM);
	std::vector<uint8_t> junk(a.iface_addr_len, 'j');
	ep_params.iface_addr = reinterpret_cast<uct_iface_addr_t *>(junk.data());
	EXPECT_EQ(uct_ep_create(&ep_params, &ep2), UCS_ERR_INVALID_PARAM);
	EXPECT_FALSE(uct_iface_is_reachable(n.iface, reinterpret_cast<uct_device_addr_t *>(dev.data()),
					    reinterpret_cast<uct_iface_addr_t *>(junk.data())));
	// A well-formed address of an iface that does not exist: unreachable.
	std::vector<uint8_t> gone(a.iface_addr_len, 0);
	memcpy(gone.data(), "xsrcuct-0-0", 11);
	ep_params.iface_addr = reinterpret_cast<uct_iface_addr_t *>(gone.data());
	EXPECT_EQ(uct_ep_create(&ep_params, &ep2), UCS_ERR_UNREACHABLE);
}

// XRC where the device offers it (xsrc does), RC on request; the two do not connect.
TEST(Query, TransportChoice)
{
	Node dflt, rc;
	ASSERT_EQ(dflt.open(), UCS_OK);
	uct_md_attr_t ma{};
	ASSERT_EQ(xsrc_uct_md_query(dflt.md, &ma), UCS_OK);
	const char *env = getenv("XSRC_UCT_TRANSPORT");
	unsigned expect_default = env && strcmp(env, "rc") == 0 ? XSRC_UCT_TRANSPORT_RC : XSRC_UCT_TRANSPORT_XRC;
	EXPECT_EQ(xsrc_uct_iface_transport(dflt.iface), expect_default);
	xsrc_uct_iface_config_t cfg;
	xsrc_uct_iface_config_init(&cfg);
	cfg.transport = XSRC_UCT_TRANSPORT_RC;
	ASSERT_EQ(rc.open(1 << 16, &cfg), UCS_OK);
	EXPECT_EQ(xsrc_uct_iface_transport(rc.iface), XSRC_UCT_TRANSPORT_RC);
	EXPECT_EQ(xsrc_uct_iface_transport(nullptr), 0u);
	cfg.transport = 7;
	Node bad;
	EXPECT_EQ(bad.open(1 << 16, &cfg), UCS_ERR_INVALID_PARAM);
	if (expect_default == XSRC_UCT_TRANSPORT_XRC) {
		// An RC ep cannot connect to an XRC ep (and the other way round).
		std::vector<uint8_t> dev(dflt.attr.device_addr_len), ep_addr(dflt.attr.ep_addr_len);
		ASSERT_EQ(uct_iface_get_device_address(dflt.iface, reinterpret_cast<uct_device_addr_t *>(dev.data())), UCS_OK);
		ASSERT_EQ(uct_ep_get_address(dflt.ep, reinterpret_cast<uct_ep_addr_t *>(ep_addr.data())), UCS_OK);
		EXPECT_EQ(uct_ep_connect_to_ep(rc.ep, reinterpret_cast<uct_device_addr_t *>(dev.data()),
					       reinterpret_cast<uct_ep_addr_t *>(ep_addr.data())),
			  UCS_ERR_UNREACHABLE);
	}
}

TEST(Query, OpenErrors)
{
	ucs_async_context_t *async = nullptr;
	uct_worker_h worker = nullptr;
	ASSERT_EQ(ucs_async_context_create(UCS_ASYNC_MODE_POLL, &async), UCS_OK);
	ASSERT_EQ(uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker), UCS_OK);
	uct_md_h md = nullptr;
	ASSERT_EQ(xsrc_uct_md_open(dev_name(), nullptr, &md), UCS_OK);
	uct_iface_params_t p{};
	p.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE;
	p.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
	p.mode.device.tl_name = "xsrc";
	std::string bad = std::string(dev_name()) + ":9";
	p.mode.device.dev_name = bad.c_str();
	uct_iface_h iface = nullptr;
	EXPECT_EQ(xsrc_uct_iface_open(md, worker, &p, nullptr, &iface), UCS_ERR_NO_DEVICE);
	p.mode.device.dev_name = "mlx5_0:1";
	EXPECT_EQ(xsrc_uct_iface_open(md, worker, &p, nullptr, &iface), UCS_ERR_NO_DEVICE);
	std::string good = std::string(dev_name()) + ":1";
	p.mode.device.dev_name = good.c_str();
	p.mode.device.tl_name = "rc_verbs";
	EXPECT_EQ(xsrc_uct_iface_open(md, worker, &p, nullptr, &iface), UCS_ERR_NO_DEVICE);
	p.mode.device.tl_name = "xsrc";
	xsrc_uct_iface_config_t cfg{};
	EXPECT_EQ(xsrc_uct_iface_open(md, worker, &p, reinterpret_cast<uct_iface_config_t *>(&cfg), &iface),
		  UCS_ERR_INVALID_PARAM);  // no magic
	xsrc_uct_iface_config_init(&cfg);
	cfg.seg_size = 16;
	EXPECT_EQ(xsrc_uct_iface_open(md, worker, &p, reinterpret_cast<uct_iface_config_t *>(&cfg), &iface),
		  UCS_ERR_INVALID_PARAM);
	cfg.seg_size = 0;
	ASSERT_EQ(xsrc_uct_iface_open(md, worker, &p, reinterpret_cast<uct_iface_config_t *>(&cfg), &iface), UCS_OK);
	uct_iface_close(iface);
	xsrc_uct_md_close(md);
	uct_worker_destroy(worker);
	ucs_async_context_destroy(async);
}

// --- RMA ------------------------------------------------------------------------------------------
TEST(Rma, PutShortBcopyZcopy)
{
	with_peer([](Node &n, Link &link) {
		const char msg[] = "put_short over xsrc";
		ASSERT_EQ(uct_ep_put_short(n.ep, msg, sizeof(msg), n.peer_addr + 0, n.peer_rkey.rkey), UCS_OK);
		size_t blen = 5000;
		ASSERT_EQ(uct_ep_put_bcopy(n.ep, pack_pattern, &blen, n.peer_addr + 4096, n.peer_rkey.rkey), 5000);
		// zcopy from two iov entries, with a completion.
		for (size_t k = 0; k < 100000; ++k)
			n.mem[k] = static_cast<char>(k * 13);
		uct_iov_t iov[2]{};
		iov[0] = {n.mem.data(), 60000, n.memh, 0, 1};
		iov[1] = {n.mem.data() + 60000, 40000, n.memh, 0, 1};
		Comp c;
		ucs_status_t st = uct_ep_put_zcopy(n.ep, iov, 2, n.peer_addr + 16384, n.peer_rkey.rkey, &c.c);
		ASSERT_TRUE(st == UCS_INPROGRESS || st == UCS_OK) << st;
		if (st == UCS_INPROGRESS) {
			ASSERT_TRUE(n.wait([&] { return c.calls == 1; }));
		}
		EXPECT_EQ(c.status, UCS_OK);
		// flush with a completion covers the short and bcopy puts.
		Comp f;
		st = uct_ep_flush(n.ep, 0, &f.c);
		if (st == UCS_INPROGRESS) {
			ASSERT_TRUE(n.wait([&] { return f.calls == 1; }));
		} else {
			ASSERT_EQ(st, UCS_OK);
		}
		// Fence: a get after a fence sees the put before it.
		uint64_t mark = 0x1234567890abcdefull, seen = 0;
		ASSERT_EQ(uct_ep_put_short(n.ep, &mark, 8, n.peer_addr + 200000, n.peer_rkey.rkey), UCS_OK);
		EXPECT_EQ(uct_ep_fence(n.ep, 0), UCS_OK);
		st = uct_ep_get_short(n.ep, &seen, 8, n.peer_addr + 200000, n.peer_rkey.rkey);
		ASSERT_TRUE(st == UCS_OK || st == UCS_INPROGRESS);
		ASSERT_EQ(n.flush(), UCS_OK);
		EXPECT_EQ(seen, mark);
		mark = ~mark;
		ASSERT_EQ(uct_ep_put_short(n.ep, &mark, 8, n.peer_addr + 200000, n.peer_rkey.rkey), UCS_OK);
		EXPECT_EQ(uct_iface_fence(n.iface, 0), UCS_OK);
		st = uct_ep_get_short(n.ep, &seen, 8, n.peer_addr + 200000, n.peer_rkey.rkey);
		ASSERT_TRUE(st == UCS_OK || st == UCS_INPROGRESS);
		ASSERT_EQ(n.flush(), UCS_OK);
		EXPECT_EQ(seen, mark);

		auto d = dump(link, 0, sizeof(msg));
		EXPECT_EQ(memcmp(d.data(), msg, sizeof(msg)), 0);
		d = dump(link, 4096, 5000);
		for (size_t k = 0; k < 5000; ++k)
			ASSERT_EQ(d[k], static_cast<uint8_t>(k ^ 0x5a)) << k;
		d = dump(link, 16384, 100000);
		for (size_t k = 0; k < 100000; ++k)
			ASSERT_EQ(d[k], static_cast<uint8_t>(k * 13)) << k;
		// Zero-length put is harmless.
		EXPECT_EQ(uct_ep_put_short(n.ep, msg, 0, n.peer_addr, n.peer_rkey.rkey), UCS_OK);
		EXPECT_EQ(n.flush(), UCS_OK);
	});
}

TEST(Rma, GetShortBcopyZcopy)
{
	with_peer([](Node &n, Link &) {
		const size_t base = 512 * 1024;  // the child filled 64 KiB there with k*7+3
		auto expect = [](size_t k) { return static_cast<char>(k * 7 + 3); };
		char small[64] = {};
		ucs_status_t st = uct_ep_get_short(n.ep, small, sizeof(small), n.peer_addr + base + 10, n.peer_rkey.rkey);
		ASSERT_TRUE(st == UCS_OK || st == UCS_INPROGRESS);
		ASSERT_EQ(n.flush(), UCS_OK);
		for (size_t k = 0; k < sizeof(small); ++k)
			ASSERT_EQ(small[k], expect(10 + k));

		std::vector<uint8_t> got;
		Comp c;
		st = uct_ep_get_bcopy(n.ep, unpack_copy, &got, 3000, n.peer_addr + base + 100, n.peer_rkey.rkey, &c.c);
		ASSERT_EQ(st, UCS_INPROGRESS);
		ASSERT_TRUE(n.wait([&] { return c.calls == 1; }));
		EXPECT_EQ(c.status, UCS_OK);
		ASSERT_EQ(got.size(), 3000u);
		for (size_t k = 0; k < 3000; ++k)
			ASSERT_EQ(static_cast<char>(got[k]), expect(100 + k));

		uct_iov_t iov{n.mem.data() + 1000, 65536 - 200, n.memh, 0, 1};
		Comp z;
		st = uct_ep_get_zcopy(n.ep, &iov, 1, n.peer_addr + base + 200, n.peer_rkey.rkey, &z.c);
		ASSERT_EQ(st, UCS_INPROGRESS);
		ASSERT_TRUE(n.wait([&] { return z.calls == 1; }));
		EXPECT_EQ(z.status, UCS_OK);
		for (size_t k = 0; k < 65536 - 200; ++k)
			ASSERT_EQ(n.mem[1000 + k], expect(200 + k)) << k;
		// An iov without a memory handle is refused.
		uct_iov_t bad{n.mem.data(), 10, nullptr, 0, 1};
		EXPECT_EQ(uct_ep_get_zcopy(n.ep, &bad, 1, n.peer_addr, n.peer_rkey.rkey, nullptr), UCS_ERR_INVALID_PARAM);
	});
}

TEST(Rma, BadRkeyFailsTheEpWithAStatus)
{
	with_peer(
		[](Node &n, Link &) {
			Comp c;
			uct_iov_t iov{n.mem.data(), 64, n.memh, 0, 1};
			ucs_status_t st = uct_ep_put_zcopy(n.ep, &iov, 1, n.peer_addr, n.peer_rkey.rkey ^ 0x5555, &c.c);
			ASSERT_EQ(st, UCS_INPROGRESS);
			ASSERT_TRUE(n.wait([&] { return c.calls == 1; }));
			EXPECT_EQ(c.status, UCS_ERR_INVALID_ADDR);
			EXPECT_EQ(n.errors, 1);
			EXPECT_EQ(n.last_error, UCS_ERR_INVALID_ADDR);
			EXPECT_EQ(n.error_ep, n.ep);
			EXPECT_EQ(uct_ep_put_short(n.ep, "x", 1, n.peer_addr, n.peer_rkey.rkey), UCS_ERR_INVALID_ADDR);
		});
}

// --- Active messages ----------------------------------------------------------------------------
namespace {
size_t pack_text(void *dest, void *arg)
{
	auto *s = static_cast<std::string *>(arg);
	memcpy(dest, s->data(), s->size());
	return s->size();
}
}  // namespace

TEST(Am, ShortIovBcopyZcopy)
{
	with_peer([](Node &n, Link &link) {
		uint64_t hdr = 0x1122334455667788ull;
		const char p1[] = "short";
		ASSERT_EQ(uct_ep_am_short(n.ep, 1, hdr, p1, sizeof(p1)), UCS_OK);
		char a[] = "iov-a", b[] = "iov-bb";
		uct_iov_t iov[2]{{a, 5, nullptr, 0, 1}, {b, 6, nullptr, 0, 1}};
		ASSERT_EQ(uct_ep_am_short_iov(n.ep, 1, iov, 2), UCS_OK);
		std::string text(7000, 'q');
		text[0] = 'B';
		ASSERT_EQ(uct_ep_am_bcopy(n.ep, 1, pack_text, &text, 0), 7000);
		const char zh[] = "zhdr";
		memset(n.mem.data(), 'z', 6000);
		uct_iov_t ziov{n.mem.data(), 6000, n.memh, 0, 1};
		Comp c;
		ucs_status_t st = uct_ep_am_zcopy(n.ep, 1, zh, 4, &ziov, 1, 0, &c.c);
		ASSERT_TRUE(st == UCS_INPROGRESS || st == UCS_OK);
		if (st == UCS_INPROGRESS) {
			ASSERT_TRUE(n.wait([&] { return c.calls == 1; }));
		}
		EXPECT_EQ(c.status, UCS_OK);
		ASSERT_EQ(n.flush(), UCS_OK);

		std::vector<std::vector<uint8_t>> r;
		ASSERT_TRUE(n.wait(
			[&] {
				r = report(link);
				return r.size() >= 4;
			},
			10));
		ASSERT_EQ(r.size(), 4u);
		ASSERT_EQ(r[0].size(), 1 + 8 + sizeof(p1));
		EXPECT_EQ(memcmp(r[0].data() + 1, &hdr, 8), 0);
		EXPECT_EQ(memcmp(r[0].data() + 9, p1, sizeof(p1)), 0);
		EXPECT_EQ(std::string(r[1].begin() + 1, r[1].end()), "iov-aiov-bb");
		EXPECT_EQ(std::string(r[2].begin() + 1, r[2].end()), text);
		ASSERT_EQ(r[3].size(), 1 + 4 + 6000u);
		EXPECT_EQ(std::string(r[3].begin() + 1, r[3].begin() + 5), "zhdr");
		EXPECT_TRUE(std::all_of(r[3].begin() + 5, r[3].end(), [](uint8_t x) { return x == 'z'; }));
		// Over the limits: a status, nothing sent.
		uct_iov_t huge{n.mem.data(), n.attr.cap.am.max_zcopy + 1, n.memh, 0, 1};
		EXPECT_EQ(uct_ep_am_zcopy(n.ep, 1, zh, 4, &huge, 1, 0, nullptr), UCS_ERR_INVALID_PARAM);
	});
}

TEST(Am, HandlerKeepsDescriptorUntilReleased)
{
	with_peer([](Node &n, Link &link) {
		send_u64(link, cmd_hold);
		ASSERT_EQ(recv_u64(link), 1u);
		for (int k = 0; k < 3; ++k) {
			std::string s = "kept-" + std::to_string(k) + std::string(100 * (k + 1), static_cast<char>('a' + k));
			ASSERT_EQ(uct_ep_am_bcopy(n.ep, 2, pack_text, &s, 0), static_cast<ssize_t>(s.size()));
		}
		ASSERT_EQ(n.flush(), UCS_OK);
		std::vector<std::vector<uint8_t>> r;
		ASSERT_TRUE(n.wait([&] {
			r = report(link);
			return r.size() >= 3;
		}));
		// More traffic while they are held: the held buffers must stay intact.
		for (int k = 0; k < 20; ++k) {
			std::string s(500, 'x');
			ssize_t len;
			while ((len = uct_ep_am_bcopy(n.ep, 1, pack_text, &s, 0)) == UCS_ERR_NO_RESOURCE)
				n.progress();
			ASSERT_EQ(len, 500);
		}
		send_u64(link, cmd_release);
		EXPECT_EQ(recv_u64(link), 1u);  // contents unchanged at release time
	});
}

// The receiver asks for rx_headroom: a kept descriptor starts that many bytes before the
// data, the user may write there, and uct_iface_release_desc(data - headroom) gives it back.
namespace {
struct Keeper {
	size_t headroom = 0;
	std::vector<std::pair<char *, uint64_t>> held;  // data, header seen
};
ucs_status_t am_keep_headroom(void *arg, void *data, size_t length, unsigned flags)
{
	auto *k = static_cast<Keeper *>(arg);
	if (!(flags & UCT_CB_PARAM_FLAG_DESC) || length != 8)
		return UCS_OK;
	memset(static_cast<char *>(data) - k->headroom, 0xEE, k->headroom);  // ours to use
	uint64_t hdr;
	memcpy(&hdr, data, 8);
	k->held.emplace_back(static_cast<char *>(data), hdr);
	return UCS_INPROGRESS;
}
}  // namespace

TEST(Am, RxHeadroomDescriptorsReleaseAndRepost)
{
	int rc = run_pair([](Link &link) { return serve_child(link); },
			  [](Link &link, const Child &) {
				  Node n;
				  ASSERT_EQ(n.open(1 << 20, nullptr, 40), UCS_OK);
				  ASSERT_EQ(n.connect(link), UCS_OK);
				  Keeper k;
				  k.headroom = 40;
				  ASSERT_EQ(uct_iface_set_am_handler(n.iface, 1, am_keep_headroom, &k, 0), UCS_OK);
				  auto ask = [&](int count) {
					  for (int c = 0; c < count; ++c) {
						  send_u64(link, cmd_send_am);
						  ASSERT_EQ(recv_u64(link), static_cast<uint64_t>(UCS_OK));
					  }
				  };
				  ask(10);
				  ASSERT_TRUE(n.wait([&] { return k.held.size() == 10; }));
				  for (auto &[data, hdr] : k.held) {
					  EXPECT_EQ(hdr, 0xabcdefu);  // the neighbours' headroom writes did not reach it
					  uint64_t now;
					  memcpy(&now, data, 8);
					  EXPECT_EQ(now, 0xabcdefu);
					  uct_iface_release_desc(data - 40);
				  }
				  k.held.clear();
				  // 70 more than the 64 receives: only re-posted (released) buffers make room.
				  for (int round = 0; round < 7; ++round) {
					  ask(10);
					  ASSERT_TRUE(n.wait([&] { return k.held.size() == 10; }));
					  for (auto &h : k.held)
						  uct_iface_release_desc(h.first - 40);
					  k.held.clear();
				  }
				  send_u64(link, cmd_exit);
			  });
	EXPECT_EQ(rc, 0);
}

// --- Flow control and pending ---------------------------------------------------------------------
namespace {
struct Sender {
	uct_pending_req_t req{};  // first: the callback finds us from it
	Node *n = nullptr;
	int next = 0;
	int total = 0;
	int calls = 0;
	static ucs_status_t run(uct_pending_req_t *self)
	{
		auto *s = reinterpret_cast<Sender *>(self);
		++s->calls;
		while (s->next < s->total) {
			uint64_t seq = static_cast<uint64_t>(s->next);
			ucs_status_t st = uct_ep_am_short(s->n->ep, 2, seq, nullptr, 0);
			if (st == UCS_ERR_NO_RESOURCE)
				return UCS_ERR_NO_RESOURCE;  // stays queued
			if (st != UCS_OK)
				return st;
			++s->next;
		}
		return UCS_OK;
	}
};
}  // namespace

TEST(FlowControl, SlowReceiverThrottlesSenderNothingLost)
{
	xsrc_uct_iface_config_t cfg;
	xsrc_uct_iface_config_init(&cfg);
	cfg.rx_queue_len = 8;
	with_peer(
		[](Node &n, Link &link) {
			send_u64(link, cmd_hold);  // the receiver keeps every message: no receive is re-posted
			ASSERT_EQ(recv_u64(link), 1u);
			Sender s;
			s.req.func = Sender::run;
			s.n = &n;
			s.total = 40;
			// Send until real exhaustion: exactly the peer's 8 receives.
			while (s.next < s.total) {
				ucs_status_t st = uct_ep_am_short(n.ep, 2, static_cast<uint64_t>(s.next), nullptr, 0);
				if (st == UCS_ERR_NO_RESOURCE)
					break;
				ASSERT_EQ(st, UCS_OK);
				++s.next;
			}
			EXPECT_EQ(s.next, 8);
			ASSERT_EQ(uct_ep_pending_add(n.ep, &s.req, 0), UCS_OK);
			// Progress a while: no credits come back, the pending request does not run.
			n.wait([] { return false; }, 0.3);
			EXPECT_EQ(s.calls, 0);
			send_u64(link, cmd_count);
			EXPECT_EQ(recv_u64(link), 8u);
			// Flush refuses while requests are pending (UCX semantics).
			EXPECT_EQ(uct_ep_flush(n.ep, 0, nullptr), UCS_ERR_NO_RESOURCE);
			// The receiver releases (and re-posts) everything: grants come, pending runs.
			send_u64(link, cmd_release);
			EXPECT_EQ(recv_u64(link), 1u);
			ASSERT_TRUE(n.wait([&] { return s.next == s.total; }));
			EXPECT_GE(s.calls, 1);
			ASSERT_EQ(n.flush(), UCS_OK);
			std::vector<std::vector<uint8_t>> r;
			ASSERT_TRUE(n.wait([&] {
				r = report(link);
				return r.size() >= 40;
			}));
			ASSERT_EQ(r.size(), 40u);
			for (uint64_t k = 0; k < 40; ++k) {
				ASSERT_EQ(r[k].size(), 9u);
				uint64_t seq;
				memcpy(&seq, r[k].data() + 1, 8);
				EXPECT_EQ(seq, k);  // in order, none lost
			}
		},
		&cfg);
}

TEST(Pending, AddWhenResourcesFreeIsBusyPurgeCallsBack)
{
	xsrc_uct_iface_config_t cfg;
	xsrc_uct_iface_config_init(&cfg);
	cfg.rx_queue_len = 4;
	with_peer(
		[](Node &n, Link &link) {
			uct_pending_req_t r1{}, r2{};
			r1.func = r2.func = [](uct_pending_req_t *) { return UCS_OK; };
			EXPECT_EQ(uct_ep_pending_add(n.ep, &r1, 0), UCS_ERR_BUSY);  // credits available
			send_u64(link, cmd_hold);
			ASSERT_EQ(recv_u64(link), 1u);
			int sent = 0;
			while (uct_ep_am_short(n.ep, 2, 0, nullptr, 0) == UCS_OK)
				++sent;
			EXPECT_EQ(sent, 4);
			ASSERT_EQ(uct_ep_pending_add(n.ep, &r1, 0), UCS_OK);
			ASSERT_EQ(uct_ep_pending_add(n.ep, &r2, 0), UCS_OK);
			// Sends behind queued requests are refused, to keep order.
			EXPECT_EQ(uct_ep_put_short(n.ep, "x", 1, n.peer_addr, n.peer_rkey.rkey), UCS_ERR_NO_RESOURCE);
			std::vector<uct_pending_req_t *> purged;
			uct_ep_pending_purge(
				n.ep,
				[](uct_pending_req_t *r, void *arg) {
					static_cast<std::vector<uct_pending_req_t *> *>(arg)->push_back(r);
				},
				&purged);
			ASSERT_EQ(purged.size(), 2u);
			EXPECT_EQ(purged[0], &r1);
			EXPECT_EQ(purged[1], &r2);
			send_u64(link, cmd_release);
			EXPECT_EQ(recv_u64(link), 1u);
			EXPECT_EQ(n.flush(), UCS_OK);
		},
		&cfg);
}

// --- Atomics --------------------------------------------------------------------------------------
TEST(Atomic, Ops64FetchPostCswap)
{
	with_peer([](Node &n, Link &link) {
		uint64_t w = n.peer_addr + 0x1000;
		uct_rkey_t rk = n.peer_rkey.rkey;
		auto fetch = [&](uct_atomic_op_t op, uint64_t v) {
			uint64_t res = 0xdead;
			Comp c;
			ucs_status_t st = uct_ep_atomic64_fetch(n.ep, op, v, &res, w, rk, &c.c);
			EXPECT_TRUE(st == UCS_INPROGRESS || st == UCS_OK);
			if (st == UCS_INPROGRESS) {
				EXPECT_TRUE(n.wait([&] { return c.calls == 1; }));
			}
			EXPECT_EQ(c.status, UCS_OK);
			return res;
		};
		auto cswap = [&](uint64_t cmp, uint64_t swp) {
			uint64_t res = 0xdead;
			Comp c;
			ucs_status_t st = uct_ep_atomic_cswap64(n.ep, cmp, swp, w, rk, &res, &c.c);
			if (st == UCS_INPROGRESS) {
				EXPECT_TRUE(n.wait([&] { return c.calls == 1; }));
			}
			return res;
		};
		EXPECT_EQ(fetch(UCT_ATOMIC_OP_ADD, 5), 0u);
		ASSERT_EQ(uct_ep_atomic64_post(n.ep, UCT_ATOMIC_OP_ADD, 3, w, rk), UCS_OK);
		EXPECT_EQ(fetch(UCT_ATOMIC_OP_AND, 0xC), 8u);   // 8 & 12 = 8
		EXPECT_EQ(fetch(UCT_ATOMIC_OP_OR, 1), 8u);      // 9
		EXPECT_EQ(fetch(UCT_ATOMIC_OP_XOR, 0xF), 9u);   // 6
		EXPECT_EQ(fetch(UCT_ATOMIC_OP_SWAP, 42), 6u);   // 42
		EXPECT_EQ(cswap(42, 7), 42u);                   // 7
		EXPECT_EQ(cswap(1, 99), 7u);                    // compare fails: stays 7
		ASSERT_EQ(uct_ep_atomic64_post(n.ep, UCT_ATOMIC_OP_AND, 3, w, rk), UCS_OK);   // 3
		ASSERT_EQ(uct_ep_atomic64_post(n.ep, UCT_ATOMIC_OP_OR, 8, w, rk), UCS_OK);    // 11
		ASSERT_EQ(uct_ep_atomic64_post(n.ep, UCT_ATOMIC_OP_XOR, 1, w, rk), UCS_OK);   // 10
		ASSERT_EQ(n.flush(), UCS_OK);
		auto d = dump(link, 0x1000, 8);
		uint64_t v;
		memcpy(&v, d.data(), 8);
		EXPECT_EQ(v, 10u);
		EXPECT_EQ(uct_ep_atomic64_post(n.ep, UCT_ATOMIC_OP_SWAP, 1, w, rk), UCS_ERR_UNSUPPORTED);
		EXPECT_EQ(uct_ep_atomic64_post(n.ep, UCT_ATOMIC_OP_ADD, 1, w + 4, rk), UCS_ERR_INVALID_PARAM);
	});
}

TEST(Atomic, Ops32OnHalvesOfAWordUnderContention)
{
	with_peer([](Node &n, Link &link) {
		uct_rkey_t rk = n.peer_rkey.rkey;
		uint64_t lo = n.peer_addr + 0x2000, hi = lo + 4;
		uint32_t init[2] = {0xFFFFFFFFu, 0x12345678u};
		ASSERT_EQ(uct_ep_put_short(n.ep, init, 8, lo, rk), UCS_OK);
		ASSERT_EQ(n.flush(), UCS_OK);
		auto fetch = [&](uint64_t addr, uct_atomic_op_t op, uint32_t v) {
			uint32_t res = 0xdead;
			Comp c;
			ucs_status_t st = uct_ep_atomic32_fetch(n.ep, op, v, &res, addr, rk, &c.c);
			if (st == UCS_INPROGRESS) {
				EXPECT_TRUE(n.wait([&] { return c.calls == 1; }));
			}
			EXPECT_EQ(c.status, UCS_OK);
			return res;
		};
		EXPECT_EQ(fetch(lo, UCT_ATOMIC_OP_ADD, 1), 0xFFFFFFFFu);  // wraps to 0, no carry into hi
		EXPECT_EQ(fetch(hi, UCT_ATOMIC_OP_XOR, 0xFF), 0x12345678u);
		EXPECT_EQ(fetch(hi, UCT_ATOMIC_OP_AND, 0xFFFF0000u), 0x12345687u);
		EXPECT_EQ(fetch(hi, UCT_ATOMIC_OP_OR, 0x1u), 0x12340000u);
		EXPECT_EQ(fetch(hi, UCT_ATOMIC_OP_SWAP, 100), 0x12340001u);
		uint32_t res = 0;
		Comp c;
		ucs_status_t st = uct_ep_atomic_cswap32(n.ep, 100, 200, hi, rk, &res, &c.c);
		if (st == UCS_INPROGRESS) {
			ASSERT_TRUE(n.wait([&] { return c.calls == 1; }));
		}
		EXPECT_EQ(res, 100u);
		ASSERT_EQ(uct_ep_atomic32_post(n.ep, UCT_ATOMIC_OP_ADD, 7, lo, rk), UCS_OK);
		ASSERT_EQ(n.flush(), UCS_OK);
		auto d = dump(link, 0x2000, 8);
		uint32_t got[2];
		memcpy(got, d.data(), 8);
		EXPECT_EQ(got[0], 7u);
		EXPECT_EQ(got[1], 200u);

		// 48 fetch-adds in flight on both halves at once: every compare-and-swap loop races
		// the others on the same 64-bit word; each half must count exactly, each old value once.
		constexpr int k_ops = 24;
		std::vector<uint32_t> rl(k_ops), rh(k_ops);
		Comp all(2 * k_ops);
		int posted = 0;
		for (int k = 0; k < k_ops; ++k) {
			for (int half = 0; half < 2; ++half) {
				uint32_t *out = half ? &rh[k] : &rl[k];
				for (;;) {
					st = uct_ep_atomic32_fetch(n.ep, UCT_ATOMIC_OP_ADD, 1, out, half ? hi : lo, rk, &all.c);
					if (st != UCS_ERR_NO_RESOURCE)
						break;
					n.progress();
				}
				ASSERT_TRUE(st == UCS_INPROGRESS || st == UCS_OK);
				if (st == UCS_OK)
					--all.c.count;
				++posted;
			}
		}
		ASSERT_TRUE(n.wait([&] { return all.c.count == 0; }));
		EXPECT_EQ(all.c.status, UCS_OK);
		std::sort(rl.begin(), rl.end());
		std::sort(rh.begin(), rh.end());
		for (int k = 0; k < k_ops; ++k) {
			EXPECT_EQ(rl[k], 7u + k);
			EXPECT_EQ(rh[k], 200u + k);
		}
		d = dump(link, 0x2000, 8);
		memcpy(got, d.data(), 8);
		EXPECT_EQ(got[0], 7u + k_ops);
		EXPECT_EQ(got[1], 200u + k_ops);
		EXPECT_EQ(uct_ep_atomic32_post(n.ep, UCT_ATOMIC_OP_ADD, 1, lo + 1, rk), UCS_ERR_INVALID_PARAM);
	});
}

// --- Flush, cancel --------------------------------------------------------------------------------
TEST(Flush, IfaceFlushAndCancel)
{
	with_peer([](Node &n, Link &) {
		for (int k = 0; k < 10; ++k)
			ASSERT_EQ(uct_ep_put_short(n.ep, &k, sizeof(k), n.peer_addr + 8 * k, n.peer_rkey.rkey), UCS_OK);
		ucs_status_t st;
		ASSERT_TRUE(n.wait([&] { return (st = uct_iface_flush(n.iface, 0, nullptr)) != UCS_INPROGRESS; }));
		EXPECT_EQ(st, UCS_OK);
		Comp dummy;
		EXPECT_EQ(uct_iface_flush(n.iface, 0, &dummy.c), UCS_ERR_UNSUPPORTED);  // UCX 1.13: comp must be NULL
		// Cancel: outstanding work (if any) completes with UCS_ERR_CANCELED; the ep is done.
		uct_iov_t iov{n.mem.data(), 4096, n.memh, 0, 1};
		Comp z;
		st = uct_ep_put_zcopy(n.ep, &iov, 1, n.peer_addr, n.peer_rkey.rkey, &z.c);
		ASSERT_EQ(st, UCS_INPROGRESS);
		Comp f;
		st = uct_ep_flush(n.ep, UCT_FLUSH_FLAG_CANCEL, &f.c);
		ASSERT_TRUE(st == UCS_OK || st == UCS_INPROGRESS) << st;
		if (st == UCS_INPROGRESS) {
			ASSERT_TRUE(n.wait([&] { return f.calls == 1; }));
		}
		ASSERT_TRUE(n.wait([&] { return z.calls == 1; }));
		EXPECT_TRUE(z.status == UCS_OK || z.status == UCS_ERR_CANCELED);
		EXPECT_EQ(uct_ep_put_short(n.ep, "x", 1, n.peer_addr, n.peer_rkey.rkey), UCS_ERR_CANCELED);
		EXPECT_EQ(n.errors, 0);  // a cancel is not a peer failure
	});
}

// --- Dead peer ------------------------------------------------------------------------------------
TEST(DeadPeer, EpCheckReportsThroughErrorHandler)
{
	int rc = run_pair([](Link &link) { return serve_child(link); },
			  [](Link &link, const Child &peer) {
				  Node n;
				  ASSERT_EQ(n.open(), UCS_OK);
				  ASSERT_EQ(n.connect(link), UCS_OK);
				  ASSERT_EQ(uct_ep_check(n.ep, 0, nullptr), UCS_OK);  // alive: no error
				  ASSERT_EQ(n.flush(), UCS_OK);
				  EXPECT_EQ(n.errors, 0);
				  EXPECT_EQ(uct_ep_check(n.ep, 1, nullptr), UCS_ERR_INVALID_PARAM);
				  kill(peer.pid(), SIGKILL);
				  peer.wait_exited();
				  ASSERT_EQ(uct_ep_check(n.ep, 0, nullptr), UCS_OK);
				  ASSERT_TRUE(n.wait([&] { return n.errors > 0; }, 20));
				  EXPECT_EQ(n.errors, 1);
				  EXPECT_EQ(n.last_error, UCS_ERR_ENDPOINT_TIMEOUT);
				  EXPECT_EQ(n.error_ep, n.ep);
				  // The ep is failed: new work gets the failure status.
				  EXPECT_EQ(uct_ep_put_short(n.ep, "x", 1, n.peer_addr, n.peer_rkey.rkey),
					    UCS_ERR_ENDPOINT_TIMEOUT);
				  EXPECT_EQ(uct_ep_am_short(n.ep, 1, 0, nullptr, 0), UCS_ERR_ENDPOINT_TIMEOUT);
				  EXPECT_EQ(uct_ep_flush(n.ep, 0, nullptr), UCS_ERR_ENDPOINT_TIMEOUT);
				  EXPECT_EQ(uct_ep_check(n.ep, 0, nullptr), UCS_OK);
				  n.wait([] { return false; }, 0.2);
				  EXPECT_EQ(n.errors, 1);  // reported once
			  });
	EXPECT_EQ(rc, 128 + SIGKILL);
}

TEST(DeadPeer, OutstandingOpsCompleteWithError)
{
	int rc = run_pair([](Link &link) { return serve_child(link); },
			  [](Link &link, const Child &peer) {
				  Node n;
				  ASSERT_EQ(n.open(), UCS_OK);
				  ASSERT_EQ(n.connect(link), UCS_OK);
				  kill(peer.pid(), SIGKILL);
				  peer.wait_exited();
				  uct_iov_t iov{n.mem.data(), 4096, n.memh, 0, 1};
				  Comp g, a;
				  ucs_status_t st = uct_ep_get_zcopy(n.ep, &iov, 1, n.peer_addr, n.peer_rkey.rkey, &g.c);
				  ASSERT_EQ(st, UCS_INPROGRESS);
				  uint64_t res;
				  st = uct_ep_atomic64_fetch(n.ep, UCT_ATOMIC_OP_ADD, 1, &res, n.peer_addr, n.peer_rkey.rkey,
							     &a.c);
				  ASSERT_EQ(st, UCS_INPROGRESS);
				  ASSERT_TRUE(n.wait([&] { return g.calls == 1 && a.calls == 1; }, 20));
				  EXPECT_EQ(g.status, UCS_ERR_ENDPOINT_TIMEOUT);
				  EXPECT_EQ(a.status, UCS_ERR_ENDPOINT_TIMEOUT);
				  EXPECT_EQ(n.errors, 1);
				  EXPECT_EQ(n.last_error, UCS_ERR_ENDPOINT_TIMEOUT);
			  });
	EXPECT_EQ(rc, 128 + SIGKILL);
}

// --- Connect to an iface address ---------------------------------------------------------------
TEST(ConnectToIface, EpFromIfaceAddressCarriesTraffic)
{
	with_peer([](Node &n, Link &link) {
		send_u64(link, cmd_iface_addr);
		std::vector<uint8_t> b;
		ASSERT_TRUE(recv_blob(link, b));
		ASSERT_EQ(b.size(), n.attr.device_addr_len + n.attr.iface_addr_len);
		auto *dev = reinterpret_cast<uct_device_addr_t *>(b.data());
		auto *ia = reinterpret_cast<uct_iface_addr_t *>(b.data() + n.attr.device_addr_len);
		EXPECT_TRUE(uct_iface_is_reachable(n.iface, dev, ia));
		uct_ep_params_t p{};
		p.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR | UCT_EP_PARAM_FIELD_IFACE_ADDR;
		p.iface = n.iface;
		p.dev_addr = dev;
		p.iface_addr = ia;
		uct_ep_h ep2 = nullptr;
		ASSERT_EQ(uct_ep_create(&p, &ep2), UCS_OK);
		// Until the peer answers the ep has no resources: the request waits in the pending queue.
		struct Req {
			uct_pending_req_t req{};
			uct_ep_h ep = nullptr;
			int ran = 0;
		} r;
		r.ep = ep2;
		r.req.func = [](uct_pending_req_t *self) {
			auto *me = reinterpret_cast<Req *>(self);
			ucs_status_t st = uct_ep_am_short(me->ep, 1, 0x77, "via-iface", 9);
			if (st == UCS_OK)
				++me->ran;
			return st;
		};
		ucs_status_t st = uct_ep_am_short(ep2, 1, 0x77, "via-iface", 9);
		if (st == UCS_ERR_NO_RESOURCE) {
			ASSERT_EQ(uct_ep_pending_add(ep2, &r.req, 0), UCS_OK);
			ASSERT_TRUE(n.wait([&] { return r.ran == 1; }));  // the child progresses: it answers
		} else {
			ASSERT_EQ(st, UCS_OK);
		}
		// RMA over the new ep too.
		ASSERT_EQ(uct_ep_put_short(ep2, "iface-put", 9, n.peer_addr + 300000, n.peer_rkey.rkey), UCS_OK);
		ucs_status_t fs;
		ASSERT_TRUE(n.wait([&] { return (fs = uct_ep_flush(ep2, 0, nullptr)) != UCS_INPROGRESS; }));
		EXPECT_EQ(fs, UCS_OK);
		auto d = dump(link, 300000, 9);
		EXPECT_EQ(std::string(d.begin(), d.end()), "iface-put");
		std::vector<std::vector<uint8_t>> rec;
		ASSERT_TRUE(n.wait([&] {
			rec = report(link);
			return !rec.empty();
		}));
		ASSERT_EQ(rec.size(), 1u);
		ASSERT_EQ(rec[0].size(), 1 + 8 + 9u);
		EXPECT_EQ(std::string(rec[0].begin() + 9, rec[0].end()), "via-iface");
		uct_ep_destroy(ep2);
	});
}

// --- Events and progress ----------------------------------------------------------------------
namespace {
ucs_status_t count_am(void *arg, void *, size_t, unsigned)
{
	++*static_cast<int *>(arg);
	return UCS_OK;
}
}  // namespace

TEST(Events, EventFdWakesOnReceiveArmIsBusyWhilePending)
{
	with_peer([](Node &n, Link &link) {
		int got = 0;
		ASSERT_EQ(uct_iface_set_am_handler(n.iface, 1, count_am, &got, 0), UCS_OK);
		int efd = -1;
		ASSERT_EQ(uct_iface_event_fd_get(n.iface, &efd), UCS_OK);
		ASSERT_GE(efd, 0);
		n.progress();
		ASSERT_EQ(uct_iface_event_arm(n.iface, UCT_EVENT_RECV | UCT_EVENT_SEND_COMP), UCS_OK);
		pollfd p{efd, POLLIN, 0};
		EXPECT_EQ(poll(&p, 1, 0), 0);  // nothing yet
		send_u64(link, cmd_send_am);
		EXPECT_EQ(recv_u64(link), static_cast<uint64_t>(UCS_OK));
		p = {efd, POLLIN, 0};
		ASSERT_EQ(poll(&p, 1, 5000), 1);  // the receive woke the channel
		EXPECT_EQ(got, 0);  // not handled until progress
		EXPECT_EQ(uct_iface_event_arm(n.iface, UCT_EVENT_RECV), UCS_ERR_BUSY);
		ASSERT_TRUE(n.wait([&] { return got == 1; }));
		ucs_status_t st;
		ASSERT_TRUE(n.wait([&] { return (st = uct_iface_event_arm(n.iface, UCT_EVENT_RECV)) == UCS_OK; }));
		EXPECT_EQ(uct_iface_event_fd_get(n.iface, nullptr), UCS_ERR_INVALID_PARAM);
	});
}

TEST(Progress, WorkerDrivesIfaceWhenEnabled)
{
	with_peer([](Node &n, Link &link) {
		int got = 0;
		ASSERT_EQ(uct_iface_set_am_handler(n.iface, 1, count_am, &got, 0), UCS_OK);
		uct_iface_progress_enable(n.iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
		send_u64(link, cmd_send_am);
		EXPECT_EQ(recv_u64(link), static_cast<uint64_t>(UCS_OK));
		auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
		while (got == 0 && std::chrono::steady_clock::now() < end)
			uct_worker_progress(n.worker);
		EXPECT_EQ(got, 1);
		uct_iface_progress_disable(n.iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
		send_u64(link, cmd_send_am);
		EXPECT_EQ(recv_u64(link), static_cast<uint64_t>(UCS_OK));
		end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
		while (std::chrono::steady_clock::now() < end)
			uct_worker_progress(n.worker);
		EXPECT_EQ(got, 1);  // the worker no longer drives it
		ASSERT_TRUE(n.wait([&] { return got == 2; }));  // uct_iface_progress does
	});
}
