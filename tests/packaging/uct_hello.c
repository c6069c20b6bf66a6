/* uct_hello: the smallest program against the installed libxsrc-uct-dev,
 * built with nothing but `pkg-config --cflags --libs xsrc-uct`, in C (the
 * header must be C). Two interfaces on one device in one process, connected
 * endpoint to endpoint: an active message one way, an RDMA put the other,
 * each checked.
 *
 *   uct_hello [DEVICE]     (default xsrc0)
 */
#include <xsrc/uct.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(what, expr)                                                         \
	do {                                                                      \
		ucs_status_t st_ = (expr);                                        \
		if (st_ != UCS_OK) {                                              \
			fprintf(stderr, "uct_hello: %s: %s\n", what, ucs_status_string(st_)); \
			exit(1);                                                  \
		}                                                                 \
	} while (0)

static int am_arrived;
static char am_text[64];

static ucs_status_t on_am(void *arg, void *data, size_t length, unsigned flags)
{
	(void)arg;
	(void)flags;
	/* am_short: an 8-byte header, then the payload */
	if (length > 8 && length - 8 < sizeof(am_text)) {
		memcpy(am_text, (char *)data + 8, length - 8);
		am_arrived = 1;
	}
	return UCS_OK;
}

struct side {
	uct_iface_h iface;
	uct_ep_h ep;
	uct_iface_attr_t attr;
	void *dev_addr;
	void *ep_addr;
};

static void open_side(uct_md_h md, uct_worker_h worker, const char *tl_dev, struct side *s)
{
	uct_iface_params_t params;
	memset(&params, 0, sizeof(params));
	params.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE;
	params.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
	params.mode.device.tl_name = XSRC_UCT_TL_NAME;
	params.mode.device.dev_name = tl_dev;
	CHECK("xsrc_uct_iface_open", xsrc_uct_iface_open(md, worker, &params, NULL, &s->iface));
	CHECK("uct_iface_query", uct_iface_query(s->iface, &s->attr));
	uct_ep_params_t ep_params;
	memset(&ep_params, 0, sizeof(ep_params));
	ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE;
	ep_params.iface = s->iface;
	CHECK("uct_ep_create", uct_ep_create(&ep_params, &s->ep));
	s->dev_addr = calloc(1, s->attr.device_addr_len);
	s->ep_addr = calloc(1, s->attr.ep_addr_len);
	CHECK("uct_iface_get_device_address", uct_iface_get_device_address(s->iface, s->dev_addr));
	CHECK("uct_ep_get_address", uct_ep_get_address(s->ep, s->ep_addr));
}

int main(int argc, char **argv)
{
	const char *device = argc > 1 ? argv[1] : "xsrc0";
	uct_md_h md;
	CHECK("xsrc_uct_md_open", xsrc_uct_md_open(device, NULL, &md));
	uct_tl_resource_desc_t *tls;
	unsigned num_tls;
	CHECK("xsrc_uct_md_query_tl_resources", xsrc_uct_md_query_tl_resources(md, &tls, &num_tls));
	if (num_tls == 0) {
		fprintf(stderr, "uct_hello: no transport resource on %s\n", device);
		return 1;
	}
	char tl_dev[UCT_DEVICE_NAME_MAX];
	snprintf(tl_dev, sizeof(tl_dev), "%s", tls[0].dev_name);
	xsrc_uct_release_tl_resource_list(tls);

	ucs_async_context_t *async;
	uct_worker_h worker;
	CHECK("ucs_async_context_create", ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async));
	CHECK("uct_worker_create", uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker));

	struct side a, b;
	open_side(md, worker, tl_dev, &a);
	open_side(md, worker, tl_dev, &b);
	CHECK("uct_ep_connect_to_ep a->b", uct_ep_connect_to_ep(a.ep, b.dev_addr, b.ep_addr));
	CHECK("uct_ep_connect_to_ep b->a", uct_ep_connect_to_ep(b.ep, a.dev_addr, a.ep_addr));
	CHECK("uct_iface_set_am_handler", uct_iface_set_am_handler(b.iface, 5, on_am, NULL, UCT_CB_FLAG_ASYNC));

	/* An active message from a to b. */
	const char hello[] = "hello over xsrc";
	ucs_status_t st;
	do {
		st = uct_ep_am_short(a.ep, 5, 0x1122334455667788ull, hello, sizeof(hello));
		uct_iface_progress(a.iface);
		uct_iface_progress(b.iface);
	} while (st == UCS_ERR_NO_RESOURCE);
	CHECK("uct_ep_am_short", st);
	for (long i = 0; !am_arrived && i < 100000000L; ++i) {
		uct_iface_progress(b.iface);
		uct_iface_progress(a.iface);
	}
	if (!am_arrived || strcmp(am_text, hello) != 0) {
		fprintf(stderr, "uct_hello: the active message did not arrive intact\n");
		return 1;
	}

	/* An RDMA put from b into a's registered buffer. */
	static char target[256];
	uct_mem_h memh;
	CHECK("xsrc_uct_md_mem_reg", xsrc_uct_md_mem_reg(md, target, sizeof(target), UCT_MD_MEM_ACCESS_ALL, &memh));
	uct_md_attr_t md_attr;
	CHECK("xsrc_uct_md_query", xsrc_uct_md_query(md, &md_attr));
	void *packed = calloc(1, md_attr.rkey_packed_size);
	CHECK("xsrc_uct_md_mkey_pack", xsrc_uct_md_mkey_pack(md, memh, packed));
	uct_rkey_bundle_t rkey;
	CHECK("xsrc_uct_rkey_unpack", xsrc_uct_rkey_unpack(NULL, packed, &rkey));
	const char put_text[] = "put by the other interface";
	CHECK("uct_ep_put_short", uct_ep_put_short(b.ep, put_text, sizeof(put_text), (uintptr_t)target, rkey.rkey));
	for (long i = 0; (st = uct_ep_flush(b.ep, 0, NULL)) == UCS_INPROGRESS && i < 100000000L; ++i) {
		uct_iface_progress(b.iface);
		uct_iface_progress(a.iface);
	}
	CHECK("uct_ep_flush", st);
	if (strcmp(target, put_text) != 0) {
		fprintf(stderr, "uct_hello: the put did not land\n");
		return 1;
	}

	unsigned transport = xsrc_uct_iface_transport(a.iface);
	xsrc_uct_rkey_release(NULL, &rkey);
	free(packed);
	xsrc_uct_md_mem_dereg(md, memh);
	uct_ep_destroy(a.ep);
	uct_ep_destroy(b.ep);
	uct_iface_close(a.iface);
	uct_iface_close(b.iface);
	free(a.dev_addr);
	free(a.ep_addr);
	free(b.dev_addr);
	free(b.ep_addr);
	uct_worker_destroy(worker);
	ucs_async_context_destroy(async);
	xsrc_uct_md_close(md);
	printf("uct_hello: active message and put on %s over %s: ok\n", tl_dev,
	       transport == XSRC_UCT_TRANSPORT_XRC ? "XRC" : "RC");
	return 0;
}
