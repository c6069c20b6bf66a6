// The shim registered as a UCX transport, driven in-process through libuct's own API only:
// component lookup, md open/query/register/pack/unpack, transport resources, iface open and
// uct_iface_mem_alloc, and the transport's configuration table (uct_md_iface_config_read,
// UCX_XSRC_*: what it sets, what an iface refuses, RX_QUEUE_LEN between two processes). This
// program links libucp (it asks ucp_get_version), so it is a UCX 1.13 process and the
// library's constructor registers the "xsrc" component. Needs xsrc0 up.
#include "ucx_module.h"
#include "uct_pair.h"

#include <xsrc/uct.h>

#include <gtest/gtest.h>
#include <ucs/async/async_fwd.h>
#include <uct/api/uct.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <vector>

extern "C" {
void ucp_get_version(unsigned *major, unsigned *minor, unsigned *release);  // libucp.so.0
ucs_status_t uct_md_mem_dereg_v2(uct_md_h, const xsrc::uct::UcxMemDeregParams *);  // uct_v2.h, not shipped
}

namespace {

using uctpair::Child;
using uctpair::Link;
using uctpair::Node;
using uctpair::recv_u64;
using uctpair::run_pair;
using uctpair::send_u64;

uct_component_h find_component(const char *name)
{
	uct_component_h *components = nullptr;
	unsigned n = 0;
	if (uct_query_components(&components, &n) != UCS_OK)
		return nullptr;
	uct_component_h found = nullptr;
	for (unsigned i = 0; i < n; ++i) {
		uct_component_attr_t attr{};
		attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
		if (uct_component_query(components[i], &attr) == UCS_OK && strcmp(attr.name, name) == 0)
			found = components[i];
	}
	uct_release_component_list(components);
	return found;
}

class Module : public ::testing::Test {
protected:
	uct_component_h comp = nullptr;
	uct_md_h md = nullptr;

	void SetUp() override
	{
		unsigned major = 0, minor = 0, release = 0;
		ucp_get_version(&major, &minor, &release);
		ASSERT_EQ(major, 1u);
		ASSERT_EQ(minor, 13u) << "this test expects UCX 1.13 (the library registers only there)";
		comp = find_component("xsrc");
		ASSERT_NE(comp, nullptr) << "the xsrc component is not registered with libuct";
		uct_md_config_t *config = nullptr;
		ASSERT_EQ(uct_md_config_read(comp, nullptr, nullptr, &config), UCS_OK);
		ucs_status_t st = uct_md_open(comp, "xsrc0", config, &md);
		uct_config_release(config);
		ASSERT_EQ(st, UCS_OK);
	}
	void TearDown() override
	{
		if (md)
			uct_md_close(md);
	}
};

TEST(ModuleRegistration, ComponentListsXsrc0)
{
	uct_component_h comp = find_component("xsrc");
	ASSERT_NE(comp, nullptr);
	uct_component_attr_t attr{};
	attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT | UCT_COMPONENT_ATTR_FIELD_FLAGS;
	ASSERT_EQ(uct_component_query(comp, &attr), UCS_OK);
	EXPECT_EQ(attr.flags, 0u);  // no UCT_COMPONENT_FLAG_CM: cm_open is not offered
	ASSERT_GE(attr.md_resource_count, 1u);
	std::vector<uct_md_resource_desc_t> res(attr.md_resource_count);
	attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
	attr.md_resources = res.data();
	ASSERT_EQ(uct_component_query(comp, &attr), UCS_OK);
	bool xsrc0 = false;
	for (auto &r : res)
		xsrc0 |= strcmp(r.md_name, "xsrc0") == 0;
	EXPECT_TRUE(xsrc0);
	// UCX's built-in components are still there.
	EXPECT_NE(find_component("self"), nullptr);
	EXPECT_NE(find_component("posix"), nullptr);
}

TEST(ModuleRegistration, UnknownMdIsNoDevice)
{
	uct_component_h comp = find_component("xsrc");
	ASSERT_NE(comp, nullptr);
	uct_md_config_t *config = nullptr;
	ASSERT_EQ(uct_md_config_read(comp, nullptr, nullptr, &config), UCS_OK);
	uct_md_h md = nullptr;
	EXPECT_EQ(uct_md_open(comp, "no-such-device", config, &md), UCS_ERR_NO_DEVICE);
	uct_config_release(config);
}

TEST_F(Module, QueryThroughLibuct)
{
	uct_md_attr_t attr{};
	ASSERT_EQ(uct_md_query(md, &attr), UCS_OK);
	EXPECT_STREQ(attr.component_name, "xsrc");
	EXPECT_TRUE(attr.cap.flags & UCT_MD_FLAG_REG);
	EXPECT_TRUE(attr.cap.flags & UCT_MD_FLAG_NEED_RKEY);
	EXPECT_FALSE(attr.cap.flags & UCT_MD_FLAG_ALLOC);
	EXPECT_EQ(attr.rkey_packed_size, 8u);
	EXPECT_EQ(attr.cap.reg_mem_types, UCS_BIT(UCS_MEMORY_TYPE_HOST));
	// The same handle still works with the shim's own functions.
	uct_md_attr_t own{};
	ASSERT_EQ(xsrc_uct_md_query(md, &own), UCS_OK);
	EXPECT_EQ(own.cap.flags, attr.cap.flags);
	EXPECT_EQ(own.rkey_packed_size, attr.rkey_packed_size);
}

TEST_F(Module, RegisterPackUnpack)
{
	std::vector<uint64_t> buf(4096);
	uct_mem_h memh = nullptr;
	ASSERT_EQ(uct_md_mem_reg(md, buf.data(), buf.size() * 8, UCT_MD_MEM_ACCESS_ALL, &memh), UCS_OK);
	ASSERT_NE(memh, nullptr);
	uint8_t packed[8] = {};
	ASSERT_EQ(uct_md_mkey_pack(md, memh, packed), UCS_OK);
	uct_rkey_bundle_t via_ucx{}, via_shim{};
	ASSERT_EQ(uct_rkey_unpack(comp, packed, &via_ucx), UCS_OK);
	ASSERT_EQ(xsrc_uct_rkey_unpack(nullptr, packed, &via_shim), UCS_OK);
	EXPECT_EQ(via_ucx.rkey, via_shim.rkey);
	EXPECT_EQ(uct_rkey_release(comp, &via_ucx), UCS_OK);
	void *local = nullptr;
	EXPECT_EQ(uct_rkey_ptr(comp, &via_ucx, reinterpret_cast<uint64_t>(buf.data()), &local), UCS_ERR_UNSUPPORTED);
	// Garbage is refused, not unpacked.
	uint8_t garbage[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	EXPECT_EQ(uct_rkey_unpack(comp, garbage, &via_ucx), UCS_ERR_INVALID_PARAM);
	// Invalidation is not offered (no UCT_MD_FLAG_INVALIDATE): refused, memory stays registered.
	xsrc::uct::UcxMemDeregParams inval{};
	inval.field_mask = xsrc::uct::ucx_mem_dereg_field_memh | xsrc::uct::ucx_mem_dereg_field_flags;
	inval.flags = xsrc::uct::ucx_mem_dereg_flag_invalidate;
	inval.memh = memh;
	EXPECT_EQ(uct_md_mem_dereg_v2(md, &inval), UCS_ERR_UNSUPPORTED);
	xsrc::uct::UcxMemDeregParams no_memh{};
	EXPECT_EQ(uct_md_mem_dereg_v2(md, &no_memh), UCS_ERR_INVALID_PARAM);
	EXPECT_EQ(uct_md_mem_dereg(md, memh), UCS_OK);
}

TEST_F(Module, BadRegistrationsFail)
{
	uct_mem_h memh = nullptr;
	char c = 0;
	EXPECT_EQ(uct_md_mem_reg(md, &c, 0, UCT_MD_MEM_ACCESS_ALL | UCT_MD_MEM_FLAG_HIDE_ERRORS, &memh), UCS_ERR_INVALID_PARAM);
	// Memory the process has not mapped: the device refuses it (EFAULT).
	size_t page = 4096;
	void *hole = mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(hole, MAP_FAILED);
	ASSERT_EQ(munmap(hole, 4 * page), 0);
	ucs_status_t st = uct_md_mem_reg(md, hole, 4 * page, UCT_MD_MEM_ACCESS_ALL | UCT_MD_MEM_FLAG_HIDE_ERRORS, &memh);
	EXPECT_NE(st, UCS_OK);
	EXPECT_EQ(st, UCS_ERR_INVALID_ADDR);
}

TEST_F(Module, MemoryTypesAndSockaddr)
{
	std::vector<char> buf(256);
	ucs_memory_type_t type = UCS_MEMORY_TYPE_UNKNOWN;
	EXPECT_EQ(uct_md_detect_memory_type(md, buf.data(), buf.size(), &type), UCS_OK);
	EXPECT_EQ(type, UCS_MEMORY_TYPE_HOST);
	uct_md_mem_attr_t mattr{};
	mattr.field_mask = UCT_MD_MEM_ATTR_FIELD_MEM_TYPE | UCT_MD_MEM_ATTR_FIELD_BASE_ADDRESS |
			   UCT_MD_MEM_ATTR_FIELD_ALLOC_LENGTH;
	ASSERT_EQ(uct_md_mem_query(md, buf.data(), buf.size(), &mattr), UCS_OK);
	EXPECT_EQ(mattr.mem_type, UCS_MEMORY_TYPE_HOST);
	EXPECT_EQ(mattr.base_address, buf.data());
	EXPECT_EQ(mattr.alloc_length, buf.size());
	EXPECT_EQ(uct_md_mem_query(md, nullptr, 8, &mattr), UCS_ERR_INVALID_PARAM);
	sockaddr_in sin{};
	sin.sin_family = AF_INET;
	ucs_sock_addr_t sa{reinterpret_cast<const sockaddr *>(&sin), sizeof(sin)};
	EXPECT_EQ(uct_md_is_sockaddr_accessible(md, &sa, UCT_SOCKADDR_ACC_LOCAL), 0);
}

TEST_F(Module, TransportAndIfaceThroughLibuct)
{
	uct_tl_resource_desc_t *res = nullptr;
	unsigned n = 0;
	ASSERT_EQ(uct_md_query_tl_resources(md, &res, &n), UCS_OK);
	bool found = false;
	for (unsigned i = 0; i < n; ++i)
		found |= strcmp(res[i].tl_name, "xsrc") == 0 && strcmp(res[i].dev_name, "xsrc0:1") == 0 &&
			 res[i].dev_type == UCT_DEVICE_TYPE_NET;
	uct_release_tl_resource_list(res);
	ASSERT_TRUE(found) << "no xsrc/xsrc0:1 resource";

	ucs_async_context_t *async = nullptr;
	ASSERT_EQ(ucs_async_context_create(UCS_ASYNC_MODE_POLL, &async), UCS_OK);
	uct_worker_h worker = nullptr;
	ASSERT_EQ(uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker), UCS_OK);
	uct_iface_config_t *config = nullptr;
	ASSERT_EQ(uct_md_iface_config_read(md, "xsrc", nullptr, nullptr, &config), UCS_OK);
	uct_iface_params_t params{};
	params.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_RX_HEADROOM;
	params.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
	params.mode.device.tl_name = "xsrc";
	params.mode.device.dev_name = "xsrc0:1";
	params.rx_headroom = 0;
	uct_iface_h iface = nullptr;
	ucs_status_t st = uct_iface_open(md, worker, &params, config, &iface);
	ASSERT_EQ(st, UCS_OK);
	uct_iface_attr_t iattr{};
	EXPECT_EQ(uct_iface_query(iface, &iattr), UCS_OK);
	EXPECT_TRUE(iattr.cap.flags & UCT_IFACE_FLAG_PUT_ZCOPY);
	// A device that is not there.
	params.mode.device.dev_name = "xsrc0:9";
	uct_iface_h none = nullptr;
	EXPECT_EQ(uct_iface_open(md, worker, &params, config, &none), UCS_ERR_NO_DEVICE);
	uct_config_release(config);

	// libuct allocates and registers through the iface's md: the result is usable memory
	// with a memory handle of this md.
	uct_allocated_memory_t mem{};
	ASSERT_EQ(uct_iface_mem_alloc(iface, 1 << 20, UCT_MD_MEM_ACCESS_ALL, "module_md_test", &mem), UCS_OK);
	EXPECT_EQ(mem.md, md);
	EXPECT_NE(mem.memh, nullptr);  // UCT_MEM_HANDLE_NULL
	EXPECT_GE(mem.length, size_t{1} << 20);
	memset(mem.address, 0x5a, 1 << 20);
	uint8_t packed[8] = {};
	EXPECT_EQ(uct_md_mkey_pack(md, mem.memh, packed), UCS_OK);
	uct_iface_mem_free(&mem);

	uct_iface_close(iface);
	uct_worker_destroy(worker);
	ucs_async_context_destroy(async);
}

// --- The transport's configuration table (UCX_XSRC_*, rc_iface_config.cpp) --------------------

// The two ways an iface takes a configuration read by uct_md_iface_config_read: libuct's
// uct_iface_open (through the registered transport) and the shim's own xsrc_uct_iface_open.
enum class OpenPath { libuct, shim };
const char *open_path_name(OpenPath path) { return path == OpenPath::libuct ? "uct_iface_open" : "xsrc_uct_iface_open"; }
constexpr OpenPath open_paths[] = {OpenPath::libuct, OpenPath::shim};

// What an iface opened on xsrc0:1 with `config` reports.
struct Opened {
	ucs_status_t status = UCS_ERR_LAST;
	uct_iface_attr_t attr{};
	unsigned transport = 0;  // xsrc_uct_iface_transport
};

Opened open_with_config(uct_md_h md, uct_worker_h worker, const uct_iface_config_t *config, OpenPath path)
{
	uct_iface_params_t params{};
	params.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE;
	params.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
	params.mode.device.tl_name = "xsrc";
	params.mode.device.dev_name = "xsrc0:1";
	Opened out;
	uct_iface_h iface = nullptr;
	out.status = path == OpenPath::libuct ? uct_iface_open(md, worker, &params, config, &iface)
					      : xsrc_uct_iface_open(md, worker, &params, config, &iface);
	if (out.status != UCS_OK)
		return out;
	out.status = uct_iface_query(iface, &out.attr);
	out.transport = xsrc_uct_iface_transport(iface);
	uct_iface_close(iface);
	return out;
}

// uct_md_iface_config_read's result for "xsrc", released with uct_config_release.
struct TlConfig {
	uct_iface_config_t *config = nullptr;
	~TlConfig()
	{
		if (config)
			uct_config_release(config);
	}
};

TEST_F(Module, IfaceConfigTableSetsTunables)
{
	xsrc::harness::UctIface w;  // its worker only: the md is the fixture's
	ASSERT_EQ(w.open_worker(), UCS_OK);
	TlConfig c;
	ASSERT_EQ(uct_md_iface_config_read(md, "xsrc", nullptr, nullptr, &c.config), UCS_OK);
	// The table's defaults: 8k segments (bcopy AM less the 16-byte header), 8 SGEs, 64 eps, and
	// TRANSPORT=auto: XRC on xsrc0 unless XSRC_UCT_TRANSPORT=rc (ctest does not set it here).
	const char *env = getenv("XSRC_UCT_TRANSPORT");
	const unsigned default_transport = env && strcmp(env, "rc") == 0 ? XSRC_UCT_TRANSPORT_RC : XSRC_UCT_TRANSPORT_XRC;
	for (OpenPath path : open_paths) {
		SCOPED_TRACE(open_path_name(path));
		Opened o = open_with_config(md, w.worker, c.config, path);
		ASSERT_EQ(o.status, UCS_OK);
		EXPECT_EQ(o.attr.cap.put.max_short, 256u);
		EXPECT_EQ(o.attr.cap.put.max_bcopy, 8192u);
		EXPECT_EQ(o.attr.cap.am.max_bcopy, 8176u);
		EXPECT_EQ(o.attr.cap.put.max_iov, 8u);
		EXPECT_EQ(o.attr.max_num_eps, 64u);
		EXPECT_EQ(o.transport, default_transport);
	}
	// Modified as UCX modifies a configuration (the field names without the XSRC_ prefix).
	ASSERT_EQ(uct_config_modify(c.config, "MAX_SHORT", "128"), UCS_OK);
	ASSERT_EQ(uct_config_modify(c.config, "SEG_SIZE", "4k"), UCS_OK);
	ASSERT_EQ(uct_config_modify(c.config, "MAX_SGE", "2"), UCS_OK);
	ASSERT_EQ(uct_config_modify(c.config, "MAX_EPS", "8"), UCS_OK);
	ASSERT_EQ(uct_config_modify(c.config, "TRANSPORT", "rc"), UCS_OK);
	for (OpenPath path : open_paths) {
		SCOPED_TRACE(open_path_name(path));
		Opened o = open_with_config(md, w.worker, c.config, path);
		ASSERT_EQ(o.status, UCS_OK);
		EXPECT_EQ(o.attr.cap.put.max_short, 128u);
		EXPECT_EQ(o.attr.cap.put.max_bcopy, 4096u);
		EXPECT_EQ(o.attr.cap.am.max_bcopy, 4080u);
		EXPECT_EQ(o.attr.cap.put.max_iov, 2u);
		EXPECT_EQ(o.attr.max_num_eps, 8u);
		EXPECT_EQ(o.transport, unsigned{XSRC_UCT_TRANSPORT_RC});
	}
}

// Values the table parses but an iface does not take: refused by both open paths.
TEST_F(Module, IfaceConfigTableRefusesWhatTheIfaceCannotTake)
{
	xsrc::harness::UctIface w;  // its worker only: the md is the fixture's
	ASSERT_EQ(w.open_worker(), UCS_OK);
	struct Case {
		const char *name, *value;
		ucs_status_t status;
	};
	const Case cases[] = {
		{"SEG_SIZE", "100", UCS_ERR_INVALID_PARAM},       // below 256
		{"RX_QUEUE_LEN", "5000", UCS_ERR_INVALID_PARAM},  // above 4096
		{"XRC_RX_MEM_MAX", "1m", UCS_ERR_EXCEEDS_LIMIT},  // 64 eps x 64 receives x 8k is 32m
	};
	for (const Case &k : cases) {
		TlConfig c;
		ASSERT_EQ(uct_md_iface_config_read(md, "xsrc", nullptr, nullptr, &c.config), UCS_OK);
		// XRC_RX_MEM_MAX limits XRC only: XRC whatever XSRC_UCT_TRANSPORT says.
		ASSERT_EQ(uct_config_modify(c.config, "TRANSPORT", "xrc"), UCS_OK);
		ASSERT_EQ(uct_config_modify(c.config, k.name, k.value), UCS_OK) << k.name << "=" << k.value;
		for (OpenPath path : open_paths) {
			SCOPED_TRACE(std::string(k.name) + "=" + k.value + " through " + open_path_name(path));
			EXPECT_EQ(open_with_config(md, w.worker, c.config, path).status, k.status);
		}
	}
}

// UCX_XSRC_RX_QUEUE_LEN takes effect: a receiver whose configuration UCX read with it set to 8
// gives its sender (defaults, 64) exactly 8 active messages; the 9th waits for a credit, which
// comes once the receiver has consumed the 8.
namespace rxq {
constexpr unsigned rx_queue_len = 8;
constexpr uint8_t am_id = 2;
constexpr uint64_t cmd_consume = 1;  // receive until `rx_queue_len` arrived, answer the count
constexpr uint64_t cmd_finish = 2;   // receive the one more, answer the count

int receiver(Link &link)
{
	CHILD_CHECK(setenv("UCX_XSRC_RX_QUEUE_LEN", std::to_string(rx_queue_len).c_str(), 1) == 0);
	Node n;
	CHILD_CHECK(n.open_md() == UCS_OK);
	uct_iface_config_t *config = nullptr;
	CHILD_CHECK(uct_md_iface_config_read(n.md, "xsrc", nullptr, nullptr, &config) == UCS_OK);
	ucs_status_t st = n.open_iface_ep(1 << 16, config);
	uct_config_release(config);
	CHILD_CHECK(st == UCS_OK);
	uint64_t received = 0;
	auto count = [](void *arg, void *, size_t, unsigned) {
		++*static_cast<uint64_t *>(arg);
		return UCS_OK;
	};
	CHILD_CHECK(uct_iface_set_am_handler(n.iface, am_id, count, &received, 0) == UCS_OK);
	CHILD_CHECK(n.connect(link) == UCS_OK);
	send_u64(link, 1);  // connected: the sender may start; nothing is received until it says so
	CHILD_CHECK(recv_u64(link) == cmd_consume);
	n.wait([&] { return received >= rx_queue_len; });
	send_u64(link, received);
	CHILD_CHECK(recv_u64(link) == cmd_finish);
	n.wait([&] { return received >= rx_queue_len + 1; });
	send_u64(link, received);
	return 0;
}
}  // namespace rxq

TEST(ModuleIfaceConfig, RxQueueLenFromUcxLimitsWhatThePeerMaySend)
{
	int rc = run_pair(rxq::receiver, [](Link &link, const Child &) {
		Node n;
		ASSERT_EQ(n.open(), UCS_OK);
		ASSERT_EQ(n.connect(link), UCS_OK);
		ASSERT_EQ(recv_u64(link), 1u);
		// The receiver does not progress: no credit comes back while this sends.
		unsigned sent = 0;
		ucs_status_t st = UCS_OK;
		while (sent <= 4 * rxq::rx_queue_len && (st = uct_ep_am_short(n.ep, rxq::am_id, sent, nullptr, 0)) == UCS_OK)
			++sent;
		EXPECT_EQ(st, UCS_ERR_NO_RESOURCE);
		EXPECT_EQ(sent, rxq::rx_queue_len);
		n.wait([] { return false; }, 0.3);
		EXPECT_EQ(uct_ep_am_short(n.ep, rxq::am_id, sent, nullptr, 0), UCS_ERR_NO_RESOURCE);
		send_u64(link, rxq::cmd_consume);
		EXPECT_EQ(recv_u64(link), uint64_t{rxq::rx_queue_len});
		// The receiver re-posted and granted: the next message goes.
		ASSERT_TRUE(n.wait([&] { return uct_ep_am_short(n.ep, rxq::am_id, sent, nullptr, 0) == UCS_OK; }));
		ASSERT_EQ(n.flush(), UCS_OK);
		send_u64(link, rxq::cmd_finish);
		EXPECT_EQ(recv_u64(link), uint64_t{rxq::rx_queue_len + 1});
	});
	EXPECT_EQ(rc, 0);
}

// An md opened with the shim's function is a UCX md as well.
TEST(ModuleShimMd, LibuctOnShimOpenedMd)
{
	uct_md_h md = nullptr;
	ASSERT_EQ(xsrc_uct_md_open("xsrc0", nullptr, &md), UCS_OK);
	uct_md_attr_t attr{};
	ASSERT_EQ(uct_md_query(md, &attr), UCS_OK);
	EXPECT_STREQ(attr.component_name, "xsrc");
	std::vector<char> buf(8192);
	uct_mem_h memh = nullptr;
	ASSERT_EQ(uct_md_mem_reg(md, buf.data(), buf.size(), UCT_MD_MEM_ACCESS_ALL, &memh), UCS_OK);
	EXPECT_EQ(xsrc_uct_md_mem_dereg(md, memh), UCS_OK);
	uct_md_close(md);  // through libuct: the ops table's close
}

}  // namespace
