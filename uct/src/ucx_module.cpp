// The shim as a UCX transport: a component "xsrc" with one transport "xsrc", registered with
// libuct when this library is loaded (LD_PRELOAD) into a UCX 1.13 program, so that ucx_info -d
// lists it and ucx_perftest -x xsrc runs on it.
//
// libuct keeps no version of its own and checks nothing about the structures it is handed, so
// registration is guarded: the process must contain UCX's libucp reporting 1.13.x, and the
// running libuct must lay out its component, transport, md and iface base as ucx_module.h
// and verbs_iface.h declare (compared with UCX's built-in "self" transport). Otherwise the
// library stays out of UCX's lists and says why in one line on stderr when XSRC_UCT_DEBUG is
// set. XSRC_UCT_REGISTER=0 keeps it out on purpose.
#include "ucx_module.h"

#include "rc_iface_config.h"

#include <xsrc/uct.h>

#include <ucs/sys/stubs.h>
#include <ucs/type/class.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>

// libuct's and libucs's internal interface (exported by libuct.so.0 / libucs.so.0 1.13.1;
// declared in headers Debian does not ship).
extern "C" {
extern ucs_list_link_t uct_components_list;
extern ucs_class_t uct_base_iface_t_class;
void uct_component_register(xsrc::uct::UcxComponent *);
void uct_component_unregister(xsrc::uct::UcxComponent *);
void uct_tl_register(xsrc::uct::UcxComponent *, xsrc::uct::UcxTl *);
void uct_tl_unregister(xsrc::uct::UcxTl *);
ucs_status_t uct_md_query_single_md_resource(xsrc::uct::UcxComponent *, uct_md_resource_desc_t **, unsigned *);
void *ucs_calloc(size_t nmemb, size_t size, const char *name);  // what libuct's ucs_free releases
}

namespace xsrc::uct {

namespace {

void uct_xsrc_ucx_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void uct_xsrc_ucx_log(const char *fmt, ...)
{
	if (!getenv("XSRC_UCT_DEBUG"))
		return;
	char line[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "xsrc-uct: %s\n", line);
}

// --- The component ------------------------------------------------------------------------------
ucs_status_t uct_xsrc_component_query_md_resources(UcxComponent *, uct_md_resource_desc_t **resources_p, unsigned *num_p)
{
	uct_md_resource_desc_t *res = nullptr;
	unsigned n = 0;
	ucs_status_t st = xsrc_uct_query_md_resources(&res, &n);
	if (st != UCS_OK)
		return st;
	auto *out = static_cast<uct_md_resource_desc_t *>(ucs_calloc(n ? n : 1, sizeof(uct_md_resource_desc_t), "xsrc md resources"));
	if (!out) {
		xsrc_uct_release_md_resources(res);
		return UCS_ERR_NO_MEMORY;
	}
	memcpy(out, res, n * sizeof(*out));
	xsrc_uct_release_md_resources(res);
	*resources_p = out;
	*num_p = n;
	return UCS_OK;
}

ucs_status_t uct_xsrc_component_md_open(UcxComponent *, const char *md_name, const uct_md_config_t *config, uct_md_h *md_p)
{
	return xsrc_uct_md_open(md_name, config, md_p);
}

// The shim's connection manager is reached through its iface (sockaddr open modes), not as a
// UCX uct_cm_h: the component does not set UCT_COMPONENT_FLAG_CM.
ucs_status_t uct_xsrc_component_cm_open(UcxComponent *, uct_worker_h, const uct_cm_config_t *, uct_cm_h *)
{
	return UCS_ERR_UNSUPPORTED;
}

ucs_status_t uct_xsrc_component_rkey_unpack(UcxComponent *, const void *rkey_buffer, uct_rkey_t *rkey_p, void **handle_p)
{
	if (!rkey_p || !handle_p)
		return UCS_ERR_INVALID_PARAM;
	uct_rkey_bundle_t bundle{};
	ucs_status_t st = xsrc_uct_rkey_unpack(nullptr, rkey_buffer, &bundle);
	if (st != UCS_OK)
		return st;
	*rkey_p = bundle.rkey;
	*handle_p = bundle.handle;
	return UCS_OK;
}

// Remote memory is reached by RDMA only; it is never mapped into this process.
ucs_status_t uct_xsrc_component_rkey_ptr(UcxComponent *, uct_rkey_t, void *, uint64_t, void **) { return UCS_ERR_UNSUPPORTED; }

ucs_status_t uct_xsrc_component_rkey_release(UcxComponent *, uct_rkey_t, void *) { return UCS_OK; }

void uct_xsrc_component_md_vfs_init(uct_md_h) {}

// --- The transport --------------------------------------------------------------------------
ucs_status_t uct_xsrc_tl_query_devices(uct_md_h md, UcxTlDeviceResource **devices_p, unsigned *num_p)
{
	if (!devices_p || !num_p)
		return UCS_ERR_INVALID_PARAM;
	uct_tl_resource_desc_t *res = nullptr;
	unsigned n = 0;
	ucs_status_t st = xsrc_uct_md_query_tl_resources(md, &res, &n);
	if (st != UCS_OK)
		return st;
	auto *out = static_cast<UcxTlDeviceResource *>(ucs_calloc(n ? n : 1, sizeof(UcxTlDeviceResource), "xsrc devices"));
	if (!out) {
		xsrc_uct_release_tl_resource_list(res);
		return UCS_ERR_NO_MEMORY;
	}
	for (unsigned i = 0; i < n; ++i) {
		snprintf(out[i].name, sizeof(out[i].name), "%s", res[i].dev_name);
		out[i].type = res[i].dev_type;
		out[i].sys_device = res[i].sys_device;
	}
	xsrc_uct_release_tl_resource_list(res);
	*devices_p = out;
	*num_p = n;
	return UCS_OK;
}

// How UCX's uct_iface_mem_alloc gets memory for this iface: none from the md (it registers
// only), then anonymous mappings, then the heap; the result is registered with the md.
constexpr uct_alloc_method_t iface_alloc_methods[] = {UCT_ALLOC_METHOD_MMAP, UCT_ALLOC_METHOD_HEAP};

// config: from uct_md_iface_config_read (the transport's table, UCX_XSRC_*: rc_iface_config.cpp).
ucs_status_t uct_xsrc_tl_iface_open(uct_md_h md, uct_worker_h worker, const uct_iface_params_t *params,
			   const uct_iface_config_t *config, uct_iface_h *iface_p)
{
	if (!md || !params || !iface_p)
		return UCS_ERR_INVALID_PARAM;
	ucs_status_t st = xsrc_uct_iface_open(md, worker, params, config, iface_p);
	if (st != UCS_OK)
		return st;
	// libuct's base-iface helpers (uct_iface_mem_alloc) use these as UCX's own ifaces set them.
	auto *base = reinterpret_cast<UcxBaseIface *>(*iface_p);
	base->md = md;
	base->config.num_alloc_methods = sizeof(iface_alloc_methods) / sizeof(iface_alloc_methods[0]);
	for (unsigned i = 0; i < base->config.num_alloc_methods; ++i)
		base->config.alloc_methods[i] = iface_alloc_methods[i];
	base->config.failure_level = UCS_LOG_LEVEL_ERROR;
	return UCS_OK;
}

// --- Configuration: the md has no options of its own (a valid, empty table) -------------------
struct EmptyConfig {
	char reserved;  // C structures cannot be empty (UCX's uct_md_config_t has the same)
};
ucs_config_field_t md_config_table[] = {{nullptr, nullptr, nullptr, 0, {}}};

UcxComponent component = {
	.name = XSRC_UCT_TL_NAME,
	.query_md_resources = uct_xsrc_component_query_md_resources,
	.md_open = uct_xsrc_component_md_open,
	.cm_open = uct_xsrc_component_cm_open,
	.rkey_unpack = uct_xsrc_component_rkey_unpack,
	.rkey_ptr = uct_xsrc_component_rkey_ptr,
	.rkey_release = uct_xsrc_component_rkey_release,
	.md_config = {"xsrc memory domain", "XSRC_", md_config_table, sizeof(EmptyConfig), {}},
	.cm_config = {"", "", nullptr, 0, {}},  // UCX's empty entry (UCS_CONFIG_EMPTY_GLOBAL_LIST_ENTRY)
	.tl_list = {&component.tl_list, &component.tl_list},  // empty until registered (uct_find_tl walks it)
	.list = {},
	.flags = 0,
	.md_vfs_init = uct_xsrc_component_md_vfs_init,
};

UcxTl transport = {
	.name = XSRC_UCT_TL_NAME,
	.query_devices = uct_xsrc_tl_query_devices,
	.iface_open = uct_xsrc_tl_iface_open,
	.config = {"xsrc transport", "XSRC_", uct_xsrc_iface_config_table, sizeof(UcxIfaceConfig), {}},
	.list = {},
};

bool registered = false;

// A longer component list is taken for a corrupt one (UCX 1.13 has about a dozen components).
constexpr unsigned component_list_max = 256;

// --- The guard --------------------------------------------------------------------------------
template <typename F>
const void *uct_xsrc_ucx_fn_addr(F *f)
{
	return reinterpret_cast<const void *>(f);
}

bool uct_xsrc_ucx_list_linked(const ucs_list_link_t *l) { return l->next && l->prev && l->next->prev == l && l->prev->next == l; }

// UCX's version, from libucp (libuct and libucs carry none). Null if libucp is not loaded.
bool uct_xsrc_ucx_version(unsigned *major, unsigned *minor, unsigned *release)
{
	using GetVersion = void (*)(unsigned *, unsigned *, unsigned *);
	auto get = reinterpret_cast<GetVersion>(dlsym(RTLD_DEFAULT, "ucp_get_version"));
	if (!get)
		return false;
	get(major, minor, release);
	return true;
}

// Reads UCX's built-in "self" component, transport and md through our declarations and
// compares them with what UCX 1.13.1's self.c puts there. Returns null when they match, or
// what differs.
const char *uct_xsrc_ucx_layout_check()
{
	const ucs_class_t &iface_class = uct_base_iface_t_class;
	if (!iface_class.name || strcmp(iface_class.name, "uct_base_iface_t") != 0)
		return "uct_base_iface_t's class";
	// Without statistics the base iface ends where our (never used) stats pointer starts.
	if (iface_class.size != offsetof(UcxBaseIface, stats) && iface_class.size != sizeof(UcxBaseIface))
		return "the size of uct_base_iface_t";

	if (!uct_xsrc_ucx_list_linked(&uct_components_list))
		return "uct_components_list";
	UcxComponent *self = nullptr;
	unsigned count = 0;
	for (ucs_list_link_t *l = uct_components_list.next; l != &uct_components_list; l = l->next) {
		if (++count > component_list_max || !uct_xsrc_ucx_list_linked(l))
			return "the component list";
		auto *c = reinterpret_cast<UcxComponent *>(reinterpret_cast<char *>(l) - offsetof(UcxComponent, list));
		if (strncmp(c->name, "self", sizeof(c->name)) == 0) {
			self = c;
			break;
		}
	}
	if (!self)
		return "uct_component_t (no \"self\" component found through its list entry)";
	if (uct_xsrc_ucx_fn_addr(self->query_md_resources) != uct_xsrc_ucx_fn_addr(uct_md_query_single_md_resource) ||
	    uct_xsrc_ucx_fn_addr(self->cm_open) != uct_xsrc_ucx_fn_addr(ucs_empty_function_return_unsupported) ||
	    uct_xsrc_ucx_fn_addr(self->rkey_ptr) != uct_xsrc_ucx_fn_addr(ucs_empty_function_return_unsupported) ||
	    uct_xsrc_ucx_fn_addr(self->rkey_release) != uct_xsrc_ucx_fn_addr(ucs_empty_function_return_success) ||
	    uct_xsrc_ucx_fn_addr(self->md_vfs_init) != uct_xsrc_ucx_fn_addr(ucs_empty_function) || self->flags != 0)
		return "uct_component_t's methods";
	if (!self->md_config.prefix || strcmp(self->md_config.prefix, "SELF_") != 0 || !self->md_config.table ||
	    !uct_xsrc_ucx_list_linked(&self->md_config.list) || self->cm_config.table != nullptr || self->cm_config.size != 0)
		return "uct_component_t's configuration entries";
	if (!uct_xsrc_ucx_list_linked(&self->tl_list) || self->tl_list.next == &self->tl_list || self->tl_list.next->next != &self->tl_list)
		return "uct_component_t's transport list";
	auto *tl = reinterpret_cast<UcxTl *>(reinterpret_cast<char *>(self->tl_list.next) - offsetof(UcxTl, list));
	if (strncmp(tl->name, "self", sizeof(tl->name)) != 0 || !tl->query_devices || !tl->iface_open ||
	    !tl->config.prefix || strcmp(tl->config.prefix, "SELF_") != 0 || !tl->config.table || tl->config.size == 0)
		return "uct_tl_t";

	// The md: open self's and read its ops table.
	uct_md_config_t *config = nullptr;
	if (uct_md_config_read(reinterpret_cast<uct_component_h>(self), nullptr, nullptr, &config) != UCS_OK)
		return "self's md configuration (cannot be read)";
	uct_md_h md = nullptr;
	ucs_status_t st = uct_md_open(reinterpret_cast<uct_component_h>(self), "self", config, &md);
	uct_config_release(config);
	if (st != UCS_OK)
		return "self's md (cannot be opened)";
	const char *bad = nullptr;
	const auto *m = reinterpret_cast<const UcxMd *>(md);
	const UcxMdOps *ops = m->ops;
	if (m->component != self)
		bad = "uct_md_t";
	else if (!ops || uct_xsrc_ucx_fn_addr(ops->close) != uct_xsrc_ucx_fn_addr(ucs_empty_function) || !ops->query || ops->mem_alloc || ops->mem_free ||
		 ops->mem_advise || !ops->mem_reg || !ops->mem_dereg || ops->mem_query ||
		 uct_xsrc_ucx_fn_addr(ops->mkey_pack) != uct_xsrc_ucx_fn_addr(ucs_empty_function_return_success) || ops->is_sockaddr_accessible ||
		 uct_xsrc_ucx_fn_addr(ops->detect_memory_type) != uct_xsrc_ucx_fn_addr(ucs_empty_function_return_unsupported))
		bad = "uct_md_ops_t";
	uct_md_close(md);
	return bad;
}

// Runs when the library is loaded, after libuct's and libucs's own constructors (it depends on them).
__attribute__((constructor)) void uct_xsrc_ucx_module_init()
{
	if (const char *env = getenv("XSRC_UCT_REGISTER"); env && (strcmp(env, "0") == 0 || strcmp(env, "no") == 0)) {
		uct_xsrc_ucx_log("not registering with UCX: XSRC_UCT_REGISTER=%s", env);
		return;
	}
	unsigned major = 0, minor = 0, release = 0;
	if (!uct_xsrc_ucx_version(&major, &minor, &release)) {
		uct_xsrc_ucx_log("not registering with UCX: no UCX version in this process (libucp is not loaded)");
		return;
	}
	if (major != 1 || minor != 13) {
		uct_xsrc_ucx_log("not registering with UCX: UCX %u.%u.%u is not 1.13.x", major, minor, release);
		return;
	}
	if (const char *bad = uct_xsrc_ucx_layout_check()) {
		uct_xsrc_ucx_log("not registering with UCX %u.%u.%u: libuct's %s differs from UCX 1.13.1's", major, minor, release,
			 bad);
		return;
	}
	ucs_list_head_init(&component.tl_list);
	uct_component_register(&component);
	uct_tl_register(&component, &transport);
	registered = true;
	uct_xsrc_ucx_log("registered component and transport \"%s\" with UCX %u.%u.%u", XSRC_UCT_TL_NAME, major, minor, release);
}

__attribute__((destructor)) void uct_xsrc_ucx_module_fini()
{
	if (!registered)
		return;
	// libuct's unregister functions take only the configuration entries off the global list
	// (1.13.1 leaves the list links, a TODO there): unlink those too, so nothing points into
	// this library once it is gone.
	uct_tl_unregister(&transport);
	ucs_list_del(&transport.list);
	uct_component_unregister(&component);
	ucs_list_del(&component.list);
	registered = false;
}

}  // namespace

UcxComponent *ucx_component() { return &component; }

}  // namespace xsrc::uct
