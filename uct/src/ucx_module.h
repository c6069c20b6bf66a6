// The shim as a UCX transport: UCX 1.13.1's memory-domain, component and transport
// structures (src/uct/base/uct_md.h, uct_component.h, uct_iface.h and api/v2/uct_v2.h; Debian
// ships none of them), re-declared with their offsets pinned, and what the memory domain
// (md.cpp) shares with the registration code (ucx_module.cpp).
//
// libuct walks these structures directly and nothing checks them at run time, so
// ucx_module.cpp registers the component only after comparing them with UCX's own "self"
// component and memory domain in the running libuct (see ucx_layout_check).
#pragma once

#include "verbs_iface.h"

#include <ucs/config/parser.h>
#include <ucs/datastruct/list.h>
#include <uct/api/uct.h>

#include <cstddef>
#include <cstdint>

namespace xsrc::uct {

// --- uct_v2.h: the parameters of mem_dereg and mkey_pack ---------------------------------
struct UcxMemDeregParams {
	uint64_t field_mask;
	unsigned flags;
	uct_mem_h memh;
	uct_completion_t *comp;
};
inline constexpr uint64_t ucx_mem_dereg_field_memh = 1u << 0;
inline constexpr uint64_t ucx_mem_dereg_field_flags = 1u << 1;
inline constexpr uint64_t ucx_mem_dereg_field_completion = 1u << 2;
inline constexpr unsigned ucx_mem_dereg_flag_invalidate = 1u << 0;

struct UcxMkeyPackParams {
	uint64_t field_mask;
	unsigned flags;
};
inline constexpr uint64_t ucx_mkey_pack_field_flags = 1u << 0;
inline constexpr unsigned ucx_mkey_pack_flag_invalidate = 1u << 0;

// --- uct_md.h: uct_md_ops_t and uct_md_t ----------------------------------------------------
struct UcxComponent;

struct UcxMdOps {
	void (*close)(uct_md_h);
	ucs_status_t (*query)(uct_md_h, uct_md_attr_t *);
	ucs_status_t (*mem_alloc)(uct_md_h, size_t *length_p, void **address_p, ucs_memory_type_t, unsigned flags,
				  const char *alloc_name, uct_mem_h *memh_p);
	ucs_status_t (*mem_free)(uct_md_h, uct_mem_h);
	ucs_status_t (*mem_advise)(uct_md_h, uct_mem_h, void *addr, size_t length, unsigned advice);
	ucs_status_t (*mem_reg)(uct_md_h, void *address, size_t length, unsigned flags, uct_mem_h *memh_p);
	ucs_status_t (*mem_dereg)(uct_md_h, const UcxMemDeregParams *);
	ucs_status_t (*mem_query)(uct_md_h, const void *address, size_t length, uct_md_mem_attr_t *);
	ucs_status_t (*mkey_pack)(uct_md_h, uct_mem_h, const UcxMkeyPackParams *, void *rkey_buffer);
	int (*is_sockaddr_accessible)(uct_md_h, const ucs_sock_addr_t *, uct_sockaddr_accessibility_t);
	ucs_status_t (*detect_memory_type)(uct_md_h, const void *addr, size_t length, ucs_memory_type_t *);
};

struct UcxMd {
	const UcxMdOps *ops;
	UcxComponent *component;
};

// --- uct_component.h: uct_component_t -------------------------------------------------------
struct UcxComponent {
	char name[UCT_COMPONENT_NAME_MAX];
	ucs_status_t (*query_md_resources)(UcxComponent *, uct_md_resource_desc_t **, unsigned *);
	ucs_status_t (*md_open)(UcxComponent *, const char *md_name, const uct_md_config_t *, uct_md_h *);
	ucs_status_t (*cm_open)(UcxComponent *, uct_worker_h, const uct_cm_config_t *, uct_cm_h *);
	ucs_status_t (*rkey_unpack)(UcxComponent *, const void *rkey_buffer, uct_rkey_t *, void **handle_p);
	ucs_status_t (*rkey_ptr)(UcxComponent *, uct_rkey_t, void *handle, uint64_t remote_addr, void **local_addr_p);
	ucs_status_t (*rkey_release)(UcxComponent *, uct_rkey_t, void *handle);
	ucs_config_global_list_entry_t md_config;
	ucs_config_global_list_entry_t cm_config;
	ucs_list_link_t tl_list;  // UcxTl::list
	ucs_list_link_t list;     // entry in libuct's uct_components_list
	uint64_t flags;           // UCT_COMPONENT_FLAG_*
	void (*md_vfs_init)(uct_md_h);
};

// --- uct_iface.h: uct_tl_device_resource_t and uct_tl_t -------------------------------------
struct UcxTlDeviceResource {
	char name[UCT_DEVICE_NAME_MAX];
	uct_device_type_t type;
	ucs_sys_device_t sys_device;
};

struct UcxTl {
	char name[UCT_TL_NAME_MAX];
	ucs_status_t (*query_devices)(uct_md_h, UcxTlDeviceResource **, unsigned *);
	ucs_status_t (*iface_open)(uct_md_h, uct_worker_h, const uct_iface_params_t *, const uct_iface_config_t *,
				   uct_iface_h *);
	ucs_config_global_list_entry_t config;
	ucs_list_link_t list;  // entry in UcxComponent::tl_list
};

// Sizes and offsets in UCX 1.13.1 on LP64, derived from the headers above.
static_assert(sizeof(void *) == 8);
static_assert(sizeof(ucs_list_link_t) == 16);
static_assert(sizeof(ucs_config_global_list_entry_t) == 48);
static_assert(offsetof(ucs_config_global_list_entry_t, list) == 32);
static_assert(sizeof(UcxMdOps) == 11 * sizeof(void *));
static_assert(offsetof(UcxMdOps, mem_reg) == 40);
static_assert(offsetof(UcxMdOps, mkey_pack) == 64);
static_assert(offsetof(UcxMdOps, detect_memory_type) == 80);
static_assert(sizeof(UcxMd) == 16 && offsetof(UcxMd, component) == 8);
static_assert(UCT_COMPONENT_NAME_MAX == 16 && UCT_TL_NAME_MAX == 10 && UCT_DEVICE_NAME_MAX == 32);
static_assert(offsetof(UcxComponent, query_md_resources) == 16);
static_assert(offsetof(UcxComponent, rkey_release) == 56);
static_assert(offsetof(UcxComponent, md_config) == 64);
static_assert(offsetof(UcxComponent, cm_config) == 112);
static_assert(offsetof(UcxComponent, tl_list) == 160);
static_assert(offsetof(UcxComponent, list) == 176);
static_assert(offsetof(UcxComponent, flags) == 192);
static_assert(offsetof(UcxComponent, md_vfs_init) == 200);
static_assert(sizeof(UcxComponent) == 208);
static_assert(sizeof(uct_device_type_t) == 4 && sizeof(ucs_sys_device_t) == 1);
static_assert(offsetof(UcxTlDeviceResource, type) == 32 && offsetof(UcxTlDeviceResource, sys_device) == 36);
static_assert(sizeof(UcxTlDeviceResource) == 40);
static_assert(offsetof(UcxTl, query_devices) == 16);
static_assert(offsetof(UcxTl, iface_open) == 24);
static_assert(offsetof(UcxTl, config) == 32);
static_assert(offsetof(UcxTl, list) == 80);
static_assert(sizeof(UcxTl) == 96);
static_assert(sizeof(UcxMemDeregParams) == 32 && offsetof(UcxMemDeregParams, memh) == 16);
static_assert(sizeof(UcxMkeyPackParams) == 16);

// --- Shared between md.cpp and ucx_module.cpp -----------------------------------------------
// The memory domain's ops table: every xsrc md handle (xsrc_uct_md_open, or the component's
// md_open) is a UcxMd whose ops point here.
extern const UcxMdOps md_ops;
// The uct_md_h of an open Md: a real UCX md (libuct's uct_md_* work on it).
uct_md_h md_handle(Md *);
// The "xsrc" component. Every md points at it, whether or not it is registered with libuct.
UcxComponent *ucx_component();

}  // namespace xsrc::uct
