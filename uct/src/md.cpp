// The memory domain: a verbs device and PD; registration, remote-key packing. Every md is a
// UCX 1.13.1 uct_md_t (ucx_module.h), so libuct's uct_md_* work on it as well as ours.
#include "ucx_module.h"
#include "owners.h"
#include "verbs_iface.h"

#include <xsrc/uct.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace xsrc::uct {

namespace {

// What a uct_md_h points to: UCX's md header, then our device state.
struct MdObject {
	UcxMd ucx;
	Md md;
};

MdObject *uct_xsrc_md_object(Md *md) { return reinterpret_cast<MdObject *>(reinterpret_cast<char *>(md) - offsetof(MdObject, md)); }

}  // namespace

// Every handle is what md_open returned: UCX's md header, whose ops are ours, then the Md.
// A handle of another component is refused (nullptr) rather than misread.
Md *to_md(uct_md_h h)
{
	if (!h)
		return nullptr;
	const void *first;
	memcpy(&first, h, sizeof(first));
	if (first != static_cast<const void *>(&md_ops))
		return nullptr;
	return &reinterpret_cast<MdObject *>(h)->md;
}

uct_md_h md_handle(Md *md) { return md ? reinterpret_cast<uct_md_h>(&uct_xsrc_md_object(md)->ucx) : nullptr; }

ucs_status_t uct_xsrc_md_errno_status(int e)
{
	switch (e) {
	case ENOMEM: return UCS_ERR_NO_MEMORY;
	case EINVAL: return UCS_ERR_INVALID_PARAM;
	case EFAULT: return UCS_ERR_INVALID_ADDR;
	case ENODEV: case ENXIO: return UCS_ERR_NO_DEVICE;
	case EPERM: case EACCES: return UCS_ERR_IO_ERROR;
	default: return UCS_ERR_IO_ERROR;
	}
}

namespace {

constexpr int mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			  IBV_ACCESS_REMOTE_ATOMIC;

}  // namespace

}  // namespace xsrc::uct

using namespace xsrc::uct;

extern "C" {

ucs_status_t xsrc_uct_query_md_resources(uct_md_resource_desc_t **resources_p, unsigned *num_resources_p)
{
	if (!resources_p || !num_resources_p)
		return UCS_ERR_INVALID_PARAM;
	int n = 0;
	DeviceListPtr list(ibv_get_device_list(&n));
	if (!list)
		n = 0;
	auto *res = static_cast<uct_md_resource_desc_t *>(calloc(n > 0 ? n : 1, sizeof(uct_md_resource_desc_t)));
	if (!res)
		return UCS_ERR_NO_MEMORY;
	for (int i = 0; i < n; ++i)
		snprintf(res[i].md_name, sizeof(res[i].md_name), "%s", ibv_get_device_name(list.get()[i]));
	*resources_p = res;
	*num_resources_p = static_cast<unsigned>(n);
	return UCS_OK;
}

void xsrc_uct_release_md_resources(uct_md_resource_desc_t *resources) { free(resources); }

ucs_status_t xsrc_uct_md_open(const char *md_name, const uct_md_config_t *, uct_md_h *md_p)
{
	if (!md_name || !md_p)
		return UCS_ERR_INVALID_PARAM;
	int n = 0;
	DeviceListPtr list(ibv_get_device_list(&n));
	if (!list)
		return UCS_ERR_NO_DEVICE;
	ibv_device *dev = nullptr;
	for (int i = 0; i < n; ++i)
		if (strcmp(ibv_get_device_name(list.get()[i]), md_name) == 0)
			dev = list.get()[i];
	if (!dev)
		return UCS_ERR_NO_DEVICE;
	std::unique_ptr<MdObject> obj(new (std::nothrow) MdObject());
	if (!obj)
		return UCS_ERR_NO_MEMORY;
	ContextPtr ctx(ibv_open_device(dev));
	if (!ctx)
		return uct_xsrc_md_errno_status(errno);
	Md *md = &obj->md;
	PdPtr pd;
	if (ibv_query_device(ctx.get(), &md->dev_attr) != 0 || !(pd = PdPtr(ibv_alloc_pd(ctx.get()))))
		return uct_xsrc_md_errno_status(errno);
	obj->ucx.ops = &md_ops;
	obj->ucx.component = ucx_component();
	md->ctx = ctx.release();  // xsrc_uct_md_close frees them
	md->pd = pd.release();
	snprintf(md->name, sizeof(md->name), "%s", md_name);
	*md_p = md_handle(md);
	obj.release();
	return UCS_OK;
}

void xsrc_uct_md_close(uct_md_h h)
{
	Md *md = to_md(h);
	if (!md)
		return;
	ibv_dealloc_pd(md->pd);
	ibv_close_device(md->ctx);
	delete uct_xsrc_md_object(md);
}

ucs_status_t xsrc_uct_md_query(uct_md_h h, uct_md_attr_t *attr)
{
	Md *md = to_md(h);
	if (!md || !attr)
		return UCS_ERR_INVALID_PARAM;
	memset(attr, 0, sizeof(*attr));
	attr->cap.max_alloc = 0;
	attr->cap.max_reg = md->dev_attr.max_mr_size ? md->dev_attr.max_mr_size : SIZE_MAX;
	attr->cap.flags = UCT_MD_FLAG_REG | UCT_MD_FLAG_NEED_MEMH | UCT_MD_FLAG_NEED_RKEY;
	attr->cap.reg_mem_types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
	attr->cap.access_mem_types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
	attr->reg_cost = ucs_linear_func_make(10e-6, 0.01e-9);  // a daemon round trip, plus page checks
	snprintf(attr->component_name, sizeof(attr->component_name), "%s", XSRC_UCT_TL_NAME);
	attr->rkey_packed_size = packed_rkey_size;
	memset(&attr->local_cpus, 0xff, sizeof(attr->local_cpus));  // no NUMA affinity: a software device
	return UCS_OK;
}

ucs_status_t xsrc_uct_md_mem_reg(uct_md_h h, void *address, size_t length, unsigned, uct_mem_h *memh_p)
{
	Md *md = to_md(h);
	if (!md || !memh_p || !address || length == 0)
		return UCS_ERR_INVALID_PARAM;
	ibv_mr *mr = ibv_reg_mr(md->pd, address, length, mr_access);
	if (!mr)
		return uct_xsrc_md_errno_status(errno);
	auto *m = new (std::nothrow) Mr{mr};
	if (!m) {
		ibv_dereg_mr(mr);
		return UCS_ERR_NO_MEMORY;
	}
	*memh_p = m;
	return UCS_OK;
}

ucs_status_t xsrc_uct_md_mem_dereg(uct_md_h h, uct_mem_h memh)
{
	if (!to_md(h) || !memh || memh == UCT_MEM_HANDLE_NULL)
		return UCS_ERR_INVALID_PARAM;
	auto *m = static_cast<Mr *>(memh);
	int rc = ibv_dereg_mr(m->mr);
	if (rc != 0)
		return uct_xsrc_md_errno_status(rc);
	delete m;
	return UCS_OK;
}

ucs_status_t xsrc_uct_md_mkey_pack(uct_md_h h, uct_mem_h memh, void *rkey_buffer)
{
	if (!to_md(h) || !memh || memh == UCT_MEM_HANDLE_NULL || !rkey_buffer)
		return UCS_ERR_INVALID_PARAM;
	PackedRkey p{packed_rkey_magic, static_cast<Mr *>(memh)->mr->rkey};
	memcpy(rkey_buffer, &p, sizeof(p));
	return UCS_OK;
}

ucs_status_t xsrc_uct_rkey_unpack(uct_component_h, const void *rkey_buffer, uct_rkey_bundle_t *rkey_ob)
{
	if (!rkey_buffer || !rkey_ob)
		return UCS_ERR_INVALID_PARAM;
	PackedRkey p;
	memcpy(&p, rkey_buffer, sizeof(p));
	if (p.magic != packed_rkey_magic)
		return UCS_ERR_INVALID_PARAM;
	rkey_ob->rkey = p.rkey;
	rkey_ob->handle = nullptr;
	rkey_ob->type = nullptr;
	return UCS_OK;
}

ucs_status_t xsrc_uct_rkey_release(uct_component_h, const uct_rkey_bundle_t *rkey_ob)
{
	return rkey_ob ? UCS_OK : UCS_ERR_INVALID_PARAM;
}

ucs_status_t xsrc_uct_md_query_tl_resources(uct_md_h h, uct_tl_resource_desc_t **resources_p, unsigned *num_p)
{
	Md *md = to_md(h);
	if (!md || !resources_p || !num_p)
		return UCS_ERR_INVALID_PARAM;
	unsigned ports = md->dev_attr.phys_port_cnt;
	auto *res = static_cast<uct_tl_resource_desc_t *>(calloc(ports ? ports : 1, sizeof(uct_tl_resource_desc_t)));
	if (!res)
		return UCS_ERR_NO_MEMORY;
	unsigned n = 0;
	for (unsigned p = 1; p <= ports; ++p) {
		ibv_port_attr pa{};
		if (ibv_query_port(md->ctx, static_cast<uint8_t>(p), &pa) != 0 || pa.state != IBV_PORT_ACTIVE)
			continue;
		snprintf(res[n].tl_name, sizeof(res[n].tl_name), "%s", XSRC_UCT_TL_NAME);
		snprintf(res[n].dev_name, sizeof(res[n].dev_name), "%s:%u", md->name, p);
		res[n].dev_type = UCT_DEVICE_TYPE_NET;
		res[n].sys_device = UCS_SYS_DEVICE_ID_UNKNOWN;
		++n;
	}
	*resources_p = res;
	*num_p = n;
	return UCS_OK;
}

void xsrc_uct_release_tl_resource_list(uct_tl_resource_desc_t *resources) { free(resources); }

void xsrc_uct_iface_config_init(xsrc_uct_iface_config_t *config)
{
	if (!config)
		return;
	memset(config, 0, sizeof(*config));
	config->magic = XSRC_UCT_IFACE_CONFIG_MAGIC;
}

}  // extern "C"

// --- The md as UCX sees it (uct_md_ops_t) -----------------------------------------------------
namespace xsrc::uct {

namespace {

void uct_xsrc_md_ucx_close(uct_md_h md) { xsrc_uct_md_close(md); }

// Registration only: memory comes from the caller (UCX's heap/mmap allocation methods).
ucs_status_t uct_xsrc_md_ucx_mem_alloc(uct_md_h, size_t *, void **, ucs_memory_type_t, unsigned, const char *, uct_mem_h *)
{
	return UCS_ERR_UNSUPPORTED;
}

ucs_status_t uct_xsrc_md_ucx_mem_free(uct_md_h, uct_mem_h) { return UCS_ERR_UNSUPPORTED; }

ucs_status_t uct_xsrc_md_ucx_mem_advise(uct_md_h, uct_mem_h, void *, size_t, unsigned) { return UCS_ERR_UNSUPPORTED; }

ucs_status_t uct_xsrc_md_ucx_mem_dereg(uct_md_h md, const UcxMemDeregParams *params)
{
	if (!params || !(params->field_mask & ucx_mem_dereg_field_memh))
		return UCS_ERR_INVALID_PARAM;
	// Invalidation needs UCT_MD_FLAG_INVALIDATE, which this md does not offer.
	if ((params->field_mask & ucx_mem_dereg_field_flags) && (params->flags & ucx_mem_dereg_flag_invalidate))
		return UCS_ERR_UNSUPPORTED;
	return xsrc_uct_md_mem_dereg(md, params->memh);
}

// Every address this md can register is host memory.
ucs_status_t uct_xsrc_md_ucx_mem_query(uct_md_h md, const void *address, size_t length, uct_md_mem_attr_t *attr)
{
	if (!to_md(md) || !address || !attr)
		return UCS_ERR_INVALID_PARAM;
	if (attr->field_mask & UCT_MD_MEM_ATTR_FIELD_MEM_TYPE)
		attr->mem_type = UCS_MEMORY_TYPE_HOST;
	if (attr->field_mask & UCT_MD_MEM_ATTR_FIELD_SYS_DEV)
		attr->sys_dev = UCS_SYS_DEVICE_ID_UNKNOWN;
	if (attr->field_mask & UCT_MD_MEM_ATTR_FIELD_BASE_ADDRESS)
		attr->base_address = const_cast<void *>(address);
	if (attr->field_mask & UCT_MD_MEM_ATTR_FIELD_ALLOC_LENGTH)
		attr->alloc_length = length;
	return UCS_OK;
}

ucs_status_t uct_xsrc_md_ucx_mkey_pack(uct_md_h md, uct_mem_h memh, const UcxMkeyPackParams *params, void *rkey_buffer)
{
	if (params && (params->field_mask & ucx_mkey_pack_field_flags) && (params->flags & ucx_mkey_pack_flag_invalidate))
		return UCS_ERR_UNSUPPORTED;
	return xsrc_uct_md_mkey_pack(md, memh, rkey_buffer);
}

// Connections by socket address go through the shim's own connection manager, not the md.
int uct_xsrc_md_ucx_is_sockaddr_accessible(uct_md_h, const ucs_sock_addr_t *, uct_sockaddr_accessibility_t) { return 0; }

ucs_status_t uct_xsrc_md_ucx_detect_memory_type(uct_md_h md, const void *addr, size_t, ucs_memory_type_t *mem_type_p)
{
	if (!to_md(md) || !addr || !mem_type_p)
		return UCS_ERR_INVALID_PARAM;
	*mem_type_p = UCS_MEMORY_TYPE_HOST;
	return UCS_OK;
}

}  // namespace

const UcxMdOps md_ops = {
	.close = uct_xsrc_md_ucx_close,
	.query = xsrc_uct_md_query,
	.mem_alloc = uct_xsrc_md_ucx_mem_alloc,
	.mem_free = uct_xsrc_md_ucx_mem_free,
	.mem_advise = uct_xsrc_md_ucx_mem_advise,
	.mem_reg = xsrc_uct_md_mem_reg,
	.mem_dereg = uct_xsrc_md_ucx_mem_dereg,
	.mem_query = uct_xsrc_md_ucx_mem_query,
	.mkey_pack = uct_xsrc_md_ucx_mkey_pack,
	.is_sockaddr_accessible = uct_xsrc_md_ucx_is_sockaddr_accessible,
	.detect_memory_type = uct_xsrc_md_ucx_detect_memory_type,
};

}  // namespace xsrc::uct
