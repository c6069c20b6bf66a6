// The interface's UCX configuration: the transport's table, so that UCX_XSRC_* variables set
// the tunables of rc_iface.h's IfaceConfig and `ucx_info -c -f` documents them.
#pragma once

#include "rc_iface.h"

#include <ucs/config/parser.h>

#include <cstddef>
#include <cstdint>

namespace xsrc::uct {

// UCX_XSRC_TRANSPORT as stored: the tag (always ucx_iface_config_tag) tells a configuration
// read by UCX from an xsrc_uct_iface_config_t, whose first word is XSRC_UCT_IFACE_CONFIG_MAGIC.
struct UcxIfaceTransport {
	uint32_t tag;
	uint32_t value;  // XSRC_UCT_TRANSPORT_*
};
inline constexpr uint32_t ucx_iface_config_tag = 0x78737243;  // "Crsx"

// What uct_md_iface_config_read returns for the "xsrc" transport.
struct UcxIfaceConfig {
	UcxIfaceTransport transport;  // must stay first
	unsigned rx_queue_len;
	unsigned sq_len;
	unsigned tx_ops;
	unsigned tx_bufs;
	unsigned max_eps;
	unsigned max_sge;
	unsigned cq_slack;
	size_t seg_size;
	size_t max_short;
	size_t xrc_rx_mem_max;
};
static_assert(offsetof(UcxIfaceConfig, transport) == 0);

extern ucs_config_field_t uct_xsrc_iface_config_table[];

// The tunables in `config`: null (the defaults), an xsrc_uct_iface_config_t, or a
// UcxIfaceConfig (from uct_md_iface_config_read). UCS_ERR_INVALID_PARAM for anything else
// or for a value out of range.
ucs_status_t uct_xsrc_iface_config_parse(const uct_iface_config_t *config, IfaceConfig *cfg, unsigned *transport);

}  // namespace xsrc::uct
