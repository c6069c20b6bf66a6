#include "device.h"

#include <endian.h>
#include <infiniband/verbs.h>

#include <algorithm>

namespace xsrc {

void fill_query_device(const Device &dev, ib_uverbs_query_device_resp &r)
{
	using L = DeviceLimits;
	r.fw_ver = kFirmwareVersion;
	r.node_guid = htobe64(dev.view.node_guid);
	r.sys_image_guid = htobe64(dev.view.node_guid);
	r.max_mr_size = UINT64_MAX;
	r.page_size_cap = 0xfffff000;  // any power of two from 4 KiB
	r.vendor_id = 0xffffff;        // no IEEE OUI: a software device
	r.vendor_part_id = 0;
	r.hw_ver = 0;
	r.max_qp = L::max_qp;
	r.max_qp_wr = L::max_qp_wr;
	r.device_cap_flags = IBV_DEVICE_CURR_QP_STATE_MOD | IBV_DEVICE_PORT_ACTIVE_EVENT |
			     IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN |
			     IBV_DEVICE_XRC;  // no SRQ_RESIZE: an SRQ's ring cannot grow in place
	r.max_sge = L::max_sge;
	r.max_sge_rd = L::max_sge;
	r.max_cq = L::max_cq;
	r.max_cqe = L::max_cqe;
	r.max_mr = L::max_mr;
	r.max_pd = L::max_pd;
	r.max_qp_rd_atom = L::max_qp_rd_atom;
	r.max_res_rd_atom = L::max_qp_rd_atom * L::max_qp;
	r.max_qp_init_rd_atom = L::max_qp_rd_atom;
	r.atomic_cap = IBV_ATOMIC_HCA;
	r.max_ah = L::max_ah;
	r.max_srq = L::max_srq;
	r.max_srq_wr = L::max_srq_wr;
	r.max_srq_sge = L::max_sge;
	r.max_pkeys = 1;
	r.local_ca_ack_delay = 15;
	r.phys_port_cnt = 1;
	if (mw_supported(dev)) {  // memory windows came with revision 4: types 1 and 2B
		r.device_cap_flags |= IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
		r.max_mw = L::max_mw;
	}
	if (dev.abi_revision >= 3) {  // multicast came with revision 3
		r.max_mcast_grp = L::max_mcast_grp;
		r.max_mcast_qp_attach = L::max_mcast_qp_attach;
		r.max_total_mcast_qp_attach = L::max_total_mcast_qp_attach;
	}
}

bool mw_supported(const Device &dev)
{
	return dev.abi_revision >= 4;
}

bool odp_supported(const Device &dev)
{
	return dev.abi_revision >= 3;
}

// The data path never pins pages: every access translates through the MR
// table and moves bytes with process_vm_* (or the device's copy), which
// fault pages in as they go and fail (EFAULT) on a hole. So ODP works for
// every operation of every transport, and an implicit MR is one table
// entry covering the whole address space.
void fill_odp_caps(const Device &dev, ib_uverbs_ex_query_device_resp &r)
{
	if (!odp_supported(dev))
		return;
	constexpr uint32_t kMessages = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
	constexpr uint32_t kRdma = IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC;
	r.odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
	r.odp_caps.per_transport_caps.rc_odp_caps = kMessages | kRdma;
	r.odp_caps.per_transport_caps.uc_odp_caps = kMessages | IBV_ODP_SUPPORT_WRITE;
	r.odp_caps.per_transport_caps.ud_odp_caps = kMessages;
	// An XRC send QP has no receive queue: its receives are on SRQs.
	r.xrc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_SRQ_RECV | kRdma;
}

void fill_tm_caps(const Device &dev, ib_uverbs_ex_query_device_resp &r)
{
	if (dev.abi_revision < 7)  // tag matching came with revision 7
		return;
	r.tm_caps.max_rndv_hdr_size = DeviceLimits::max_rndv_hdr_size;
	r.tm_caps.max_num_tags = DeviceLimits::max_num_tags;
	r.tm_caps.flags = IBV_TM_CAP_RC;
	r.tm_caps.max_ops = DeviceLimits::max_tm_ops;
	r.tm_caps.max_sge = DeviceLimits::max_sge;
}

void fill_query_port(const Device &dev, ib_uverbs_query_port_resp &r)
{
	const PortView &port = dev.view.port;
	r.port_cap_flags = port.port_cap_flags;  // the same values as the sysfs view
	r.max_msg_sz = DeviceLimits::max_msg_size;
	r.gid_tbl_len = port.gid_tbl_len;
	r.pkey_tbl_len = 1;
	r.state = port.active ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
	r.max_mtu = IBV_MTU_4096;
	r.active_mtu = static_cast<uint8_t>(port.active_mtu);
	r.max_vl_num = 1;
	r.active_width = port.active_width;
	r.active_speed = port.active_speed;
	r.phys_state = port.active ? 5 : 3;  // LinkUp : Disabled
	r.link_layer = IBV_LINK_LAYER_ETHERNET;
}

void refresh_device_view(Device &dev)
{
	DeviceView &v = dev.view;
	v.ibdev = dev.name;
	v.uverbs_index = dev.uverbs_index;
	v.node_guid = guid_from_mac(dev.netdev.mac);
	v.port.active = dev.netdev.oper_up;
	v.port.active_mtu = ib_mtu_from_netdev_mtu(dev.netdev.mtu);
	v.port.netdev = dev.netdev.name;
	v.port.gid_tbl_len = DeviceLimits::gid_tbl_len;
	v.port.gids = roce_v2_gids(dev.netdev);
	if (v.port.gids.size() > v.port.gid_tbl_len)
		v.port.gids.resize(v.port.gid_tbl_len);
}

}  // namespace xsrc
