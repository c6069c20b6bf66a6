/* xsrc UCT shim: UCX transport interface objects (uct_iface_h, uct_ep_h) over verbs.
 *
 * The interface and endpoint objects this library returns are real UCX objects: their ops
 * table is UCX 1.13's uct_iface_ops_t, so UCX's public inline API (uct_ep_put_short,
 * uct_ep_am_bcopy, uct_iface_progress, uct_ep_flush, ...) drives them unchanged. The iface
 * starts with the layout of UCX 1.13.1's uct_base_iface_t, so libuct's
 * uct_iface_set_am_handler, uct_iface_set_am_tracer and uct_iface_estimate_perf work on it.
 *
 * Memory domains are UCX 1.13 memory domains: open, query, register, pack and unpack remote
 * keys with the xsrc_uct_md_* / xsrc_uct_rkey_* functions below (same shapes as UCX's);
 * libuct's uct_md_* work on them too. Preloaded into a UCX 1.13 program, the library
 * registers a component and a transport named "xsrc" with libuct (see the README).
 */
#ifndef XSRC_UCT_H
#define XSRC_UCT_H

#include <uct/api/uct.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XSRC_UCT_TL_NAME "xsrc"

/* Optional interface configuration. Pass NULL to xsrc_uct_iface_open for the defaults, or a
 * filled xsrc_uct_iface_config_t cast to (const uct_iface_config_t *) after
 * xsrc_uct_iface_config_init() (which sets `magic`). Zero fields take the defaults. */
#define XSRC_UCT_IFACE_CONFIG_MAGIC 0x78737263u
typedef struct xsrc_uct_iface_config {
	unsigned magic;
	unsigned rx_queue_len; /* receives per ep = send credits of its peer (default 64) */
	unsigned sq_len;       /* send work requests per ep (default 128) */
	unsigned tx_bufs;      /* bounce buffers per iface (default 512) */
	size_t seg_size;       /* bounce / receive buffer size (default 8192) */
	unsigned max_eps;      /* endpoints per iface (default 64) */
	unsigned transport;    /* XSRC_UCT_TRANSPORT_*: default AUTO (XRC when the device offers it) */
} xsrc_uct_iface_config_t;
#define XSRC_UCT_TRANSPORT_AUTO 0
#define XSRC_UCT_TRANSPORT_RC 1
#define XSRC_UCT_TRANSPORT_XRC 2
void xsrc_uct_iface_config_init(xsrc_uct_iface_config_t *config);

/* Memory domains: one per verbs device ("xsrc0", or any verbs device). */
ucs_status_t xsrc_uct_query_md_resources(uct_md_resource_desc_t **resources_p, unsigned *num_resources_p);
void xsrc_uct_release_md_resources(uct_md_resource_desc_t *resources);
/* config: unused, may be NULL. */
ucs_status_t xsrc_uct_md_open(const char *md_name, const uct_md_config_t *config, uct_md_h *md_p);
void xsrc_uct_md_close(uct_md_h md);
ucs_status_t xsrc_uct_md_query(uct_md_h md, uct_md_attr_t *md_attr);
ucs_status_t xsrc_uct_md_mem_reg(uct_md_h md, void *address, size_t length, unsigned flags, uct_mem_h *memh_p);
ucs_status_t xsrc_uct_md_mem_dereg(uct_md_h md, uct_mem_h memh);
ucs_status_t xsrc_uct_md_mkey_pack(uct_md_h md, uct_mem_h memh, void *rkey_buffer);
/* component: unused, may be NULL. */
ucs_status_t xsrc_uct_rkey_unpack(uct_component_h component, const void *rkey_buffer, uct_rkey_bundle_t *rkey_ob);
ucs_status_t xsrc_uct_rkey_release(uct_component_h component, const uct_rkey_bundle_t *rkey_ob);
/* One resource per active port: tl_name "xsrc", dev_name "<ibdev>:<port>". */
ucs_status_t xsrc_uct_md_query_tl_resources(uct_md_h md, uct_tl_resource_desc_t **resources_p, unsigned *num_resources_p);
void xsrc_uct_release_tl_resource_list(uct_tl_resource_desc_t *resources);

/* Interfaces. worker: a uct_worker_h from libuct's uct_worker_create; the iface's progress
 * is registered with it while progress is enabled (UCT_PROGRESS_SEND/RECV), so
 * uct_worker_progress() drives it. params: open_mode UCT_IFACE_OPEN_MODE_DEVICE with
 * mode.device = {"xsrc", "<ibdev>:<port>"}; field_mask may carry ERR_HANDLER*,
 * RX_HEADROOM (0 only), OPEN_MODE. config: NULL or an xsrc_uct_iface_config_t (above). */
ucs_status_t xsrc_uct_iface_open(uct_md_h md, uct_worker_h worker, const uct_iface_params_t *params,
				 const uct_iface_config_t *config, uct_iface_h *iface_p);

/* Which transport an open iface uses: XSRC_UCT_TRANSPORT_RC or XSRC_UCT_TRANSPORT_XRC
 * (0 for a handle that is not an xsrc iface). Both ends of a connection must use the same:
 * connecting an RC ep to an XRC ep fails with UCS_ERR_UNREACHABLE. The environment variable
 * XSRC_UCT_TRANSPORT=rc turns the AUTO default to RC. */
unsigned xsrc_uct_iface_transport(uct_iface_h iface);

#ifdef __cplusplus
}
#endif

#endif /* XSRC_UCT_H */
