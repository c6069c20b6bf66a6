// The interface's tunables: UCX's configuration table for the "xsrc" transport (UCX_XSRC_*,
// listed by `ucx_info -c -f`) and the public xsrc_uct_iface_config_t, both read into one
// IfaceConfig and checked against the same limits.
#include "rc_iface_config.h"

#include <xsrc/uct.h>

#include <ucs/sys/preprocessor.h>

#include <cstring>

namespace xsrc::uct {

namespace {

// What an iface accepts (larger values would exhaust the device or this process for nothing).
constexpr size_t seg_size_min = 256;
constexpr size_t seg_size_max = size_t{1} << 20;
constexpr unsigned queue_len_max = 4096;  // rx_queue_len, sq_len, max_eps, cq_slack
constexpr unsigned tx_ops_max = 65536;
constexpr unsigned tx_bufs_max = 65536;

static_assert(XSRC_UCT_TRANSPORT_AUTO == 0 && XSRC_UCT_TRANSPORT_RC == 1 && XSRC_UCT_TRANSPORT_XRC == 2);
static_assert(XSRC_UCT_DFL_XRC_RX_MEM_MAX == size_t{64} << 30, "XRC_RX_MEM_MAX's default below is \"64g\"");
const char *const transport_names[] = {"auto", "rc", "xrc", nullptr};

// UCX_XSRC_TRANSPORT: an enum stored behind ucx_iface_config_tag (see UcxIfaceTransport).
int uct_xsrc_iface_config_transport_read(const char *buf, void *dest, const void *arg)
{
	auto *t = static_cast<UcxIfaceTransport *>(dest);
	if (!ucs_config_sscanf_enum(buf, &t->value, arg))
		return 0;
	t->tag = ucx_iface_config_tag;
	return 1;
}

int uct_xsrc_iface_config_transport_write(char *buf, size_t max, const void *src, const void *arg)
{
	return ucs_config_sprintf_enum(buf, max, &static_cast<const UcxIfaceTransport *>(src)->value, arg);
}

ucs_status_t uct_xsrc_iface_config_transport_clone(const void *src, void *dest, const void *)
{
	memcpy(dest, src, sizeof(UcxIfaceTransport));
	return UCS_OK;
}

// From the public structure: a zero field takes the default.
ucs_status_t uct_xsrc_iface_config_from_public(const xsrc_uct_iface_config_t &c, IfaceConfig *cfg, unsigned *transport)
{
	if (c.rx_queue_len)
		cfg->rx_queue_len = c.rx_queue_len;
	if (c.sq_len)
		cfg->sq_len = c.sq_len;
	if (c.tx_bufs)
		cfg->tx_bufs = c.tx_bufs;
	if (c.seg_size)
		cfg->seg_size = c.seg_size;
	if (c.max_eps)
		cfg->max_eps = c.max_eps;
	*transport = c.transport;
	return UCS_OK;
}

// From UCX's table: every field is set (to its default at least); zero is no size.
ucs_status_t uct_xsrc_iface_config_from_ucx(const UcxIfaceConfig &c, IfaceConfig *cfg, unsigned *transport)
{
	if (!c.rx_queue_len || !c.sq_len || !c.tx_ops || !c.tx_bufs || !c.max_eps || !c.max_sge || !c.xrc_rx_mem_max)
		return UCS_ERR_INVALID_PARAM;
	cfg->rx_queue_len = c.rx_queue_len;
	cfg->sq_len = c.sq_len;
	cfg->tx_ops = c.tx_ops;
	cfg->tx_bufs = c.tx_bufs;
	cfg->seg_size = c.seg_size;
	cfg->max_eps = c.max_eps;
	cfg->max_short = c.max_short;
	cfg->max_sge = c.max_sge;
	cfg->cq_slack = c.cq_slack;
	cfg->xrc_rx_mem_max = c.xrc_rx_mem_max;
	*transport = c.transport.value;
	return UCS_OK;
}

}  // namespace

ucs_config_field_t uct_xsrc_iface_config_table[] = {
	{"TRANSPORT", "auto",
	 "How endpoints reach their peers: xrc (send QPs shared per remote interface, one shared\n"
	 "receive queue), rc (a QP per endpoint), or auto (xrc where the device offers it; the\n"
	 "environment variable XSRC_UCT_TRANSPORT=rc turns auto to rc). Both sides must agree.",
	 offsetof(UcxIfaceConfig, transport),
	 {uct_xsrc_iface_config_transport_read, uct_xsrc_iface_config_transport_write,
	  uct_xsrc_iface_config_transport_clone, ucs_config_release_nop, ucs_config_help_enum, transport_names}},

	{"RX_QUEUE_LEN", UCS_PP_MAKE_STRING(XSRC_UCT_DFL_RX_QUEUE_LEN),
	 "Receives posted per endpoint for its peer: the messages the peer may send before it\n"
	 "waits for a credit grant (at most 4096).",
	 offsetof(UcxIfaceConfig, rx_queue_len), UCS_CONFIG_TYPE_UINT},

	{"SQ_LEN", UCS_PP_MAKE_STRING(XSRC_UCT_DFL_SQ_LEN),
	 "Send work requests per QP: per endpoint with rc, per remote interface with xrc (at most 4096).",
	 offsetof(UcxIfaceConfig, sq_len), UCS_CONFIG_TYPE_UINT},

	{"TX_OPS", UCS_PP_MAKE_STRING(XSRC_UCT_DFL_TX_OPS),
	 "Operations an interface may have outstanding at once (at most 65536).",
	 offsetof(UcxIfaceConfig, tx_ops), UCS_CONFIG_TYPE_UINT},

	{"TX_BUFS", UCS_PP_MAKE_STRING(XSRC_UCT_DFL_TX_BUFS),
	 "Bounce buffers per interface, for short, bcopy and get operations (at most 65536).",
	 offsetof(UcxIfaceConfig, tx_bufs), UCS_CONFIG_TYPE_UINT},

	{"SEG_SIZE", UCS_PP_MAKE_STRING(XSRC_UCT_DFL_SEG_SIZE),
	 "Size of a bounce and of a receive buffer, the shim's 16-byte message header included\n"
	 "(256 to 1m; rounded down to a multiple of 8).",
	 offsetof(UcxIfaceConfig, seg_size), UCS_CONFIG_TYPE_MEMUNITS},

	{"MAX_EPS", UCS_PP_MAKE_STRING(XSRC_UCT_DFL_MAX_EPS),
	 "Endpoints per interface (at most 4096). With xrc, the shared receive area is reserved\n"
	 "for this many.",
	 offsetof(UcxIfaceConfig, max_eps), UCS_CONFIG_TYPE_UINT},

	{"MAX_SHORT", UCS_PP_MAKE_STRING(XSRC_UCT_DFL_MAX_SHORT),
	 "Largest put_short, get_short and am_short (capped by SEG_SIZE less the header).",
	 offsetof(UcxIfaceConfig, max_short), UCS_CONFIG_TYPE_MEMUNITS},

	{"MAX_SGE", UCS_PP_MAKE_STRING(XSRC_UCT_DFL_MAX_SGE),
	 "Scatter/gather entries per work request, i.e. the iov of zcopy operations (1 to 8;\n"
	 "capped by the device).",
	 offsetof(UcxIfaceConfig, max_sge), UCS_CONFIG_TYPE_UINT},

	{"CQ_SLACK", UCS_PP_MAKE_STRING(XSRC_UCT_DFL_CQ_SLACK),
	 "Completion queue entries beyond twice what live operations and receives can fill\n"
	 "(at most 4096).",
	 offsetof(UcxIfaceConfig, cq_slack), UCS_CONFIG_TYPE_UINT},

	{"XRC_RX_MEM_MAX", "64g",
	 "Largest shared receive area an xrc interface reserves (MAX_EPS x RX_QUEUE_LEN buffers,\n"
	 "reserved, not committed); opening fails above it.",
	 offsetof(UcxIfaceConfig, xrc_rx_mem_max), UCS_CONFIG_TYPE_MEMUNITS},

	{nullptr, nullptr, nullptr, 0, {}},
};

ucs_status_t uct_xsrc_iface_config_parse(const uct_iface_config_t *config, IfaceConfig *cfg, unsigned *transport)
{
	*cfg = IfaceConfig{};
	*transport = XSRC_UCT_TRANSPORT_AUTO;
	if (!config)
		return UCS_OK;
	uint32_t first;
	memcpy(&first, config, sizeof(first));
	ucs_status_t st;
	if (first == XSRC_UCT_IFACE_CONFIG_MAGIC)
		st = uct_xsrc_iface_config_from_public(*reinterpret_cast<const xsrc_uct_iface_config_t *>(config), cfg,
						       transport);
	else if (first == ucx_iface_config_tag)
		st = uct_xsrc_iface_config_from_ucx(*reinterpret_cast<const UcxIfaceConfig *>(config), cfg, transport);
	else
		return UCS_ERR_INVALID_PARAM;
	if (st != UCS_OK)
		return st;
	if (*transport > XSRC_UCT_TRANSPORT_XRC)
		return UCS_ERR_INVALID_PARAM;
	if (cfg->seg_size < seg_size_min || cfg->seg_size > seg_size_max || cfg->rx_queue_len > queue_len_max ||
	    cfg->sq_len > queue_len_max || cfg->max_eps > queue_len_max || cfg->tx_bufs > tx_bufs_max ||
	    cfg->tx_ops > tx_ops_max || cfg->max_sge > max_sge_limit || cfg->cq_slack > queue_len_max ||
	    cfg->max_short > seg_size_max)
		return UCS_ERR_INVALID_PARAM;
	cfg->seg_size &= ~size_t{7};
	return UCS_OK;
}

}  // namespace xsrc::uct
