// What a device reports about itself: device and port attributes, and the
// view refreshed from its netdev.
#pragma once

#include <rdma/ib_user_verbs.h>

#include "objects.h"

namespace xsrc {

void fill_query_device(const Device &dev, ib_uverbs_query_device_resp &resp);
void fill_query_port(const Device &dev, ib_uverbs_query_port_resp &resp);
// On-demand paging: what QUERY_DEVICE_EX reports in odp_caps and xrc_odp_caps.
void fill_odp_caps(const Device &dev, ib_uverbs_ex_query_device_resp &resp);
// Tag matching (driver ABI r7): none at an older --abi.
void fill_tm_caps(const Device &dev, ib_uverbs_ex_query_device_resp &resp);
// Whether the device takes IB_UVERBS_ACCESS_ON_DEMAND (revision 3 providers honour it).
bool odp_supported(const Device &dev);
// Whether the device has memory windows (driver ABI revision 4).
bool mw_supported(const Device &dev);

// Rebuilds dev.view (GUID, GIDs, port state, MTU) from dev.netdev.
void refresh_device_view(Device &dev);

// fw_ver as libibverbs decodes it: major.minor.sub_minor in 16-bit fields.
constexpr uint64_t kFirmwareVersion = (0ull << 32) | (1ull << 16) | 0;

}  // namespace xsrc
