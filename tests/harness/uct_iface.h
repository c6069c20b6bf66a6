// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The UCT objects of one side of a shim test or benchmark: async context, worker, md and
// iface, opened through the shim's public API and closed in reverse order.
#pragma once

#include <xsrc/uct.h>

#include <string>

namespace xsrc::harness {

struct UctIface {
	ucs_async_context_t *async = nullptr;
	uct_worker_h worker = nullptr;
	uct_md_h md = nullptr;
	uct_iface_h iface = nullptr;
	uct_iface_attr_t attr{};

	UctIface() = default;
	UctIface(const UctIface &) = delete;
	UctIface &operator=(const UctIface &) = delete;
	~UctIface() { close(); }

	// The async context and a single-threaded worker.
	ucs_status_t open_worker()
	{
		ucs_status_t st = ucs_async_context_create(UCS_ASYNC_MODE_POLL, &async);
		if (st != UCS_OK)
			return st;
		return uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker);
	}

	// The iface on transport device `tl_dev` ("xsrc0:1"; DEVICE mode unless `params` sets
	// an open mode), then its attributes.
	ucs_status_t open_iface(const std::string &tl_dev, uct_iface_params_t params = {},
				const uct_iface_config_t *config = nullptr)
	{
		if (!(params.field_mask & UCT_IFACE_PARAM_FIELD_OPEN_MODE)) {
			params.field_mask |= UCT_IFACE_PARAM_FIELD_OPEN_MODE;
			params.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
			params.mode.device.tl_name = XSRC_UCT_TL_NAME;
			params.mode.device.dev_name = tl_dev.c_str();
		}
		ucs_status_t st = xsrc_uct_iface_open(md, worker, &params, config, &iface);
		if (st != UCS_OK)
			return st;
		return uct_iface_query(iface, &attr);
	}

	unsigned progress() { return uct_iface_progress(iface); }

	void close()
	{
		if (iface)
			uct_iface_close(iface);
		iface = nullptr;
		if (md)
			xsrc_uct_md_close(md);
		md = nullptr;
		if (worker)
			uct_worker_destroy(worker);
		worker = nullptr;
		if (async)
			ucs_async_context_destroy(async);
		async = nullptr;
	}
};

}  // namespace xsrc::harness
