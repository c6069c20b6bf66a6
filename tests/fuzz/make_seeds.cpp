// Writes the synthetic seeds of the fuzz corpus: command streams for what
// the captured programs never send (the provider uses the non-extended
// commands): extended CREATE_CQ / CREATE_QP / MODIFY_QP, RESIZE_CQ,
// REQ_NOTIFY_CQ, SRQ modify/query, RAISE_EVENT on the stream's own objects,
// XSRC_CMD_COPY, REREG_MR, ATTACH_MCAST / DETACH_MCAST, memory windows,
// import (IMPORT_CONTEXT, QUERY_OBJECT, the ASYNC_EVENT_ALLOC ioctl). Built from the kernel's and xsrc's own structs, so the
// seeds follow the ABI headers. Handles and numbers are those a fresh device
// hands out (handles from 0, QPN/SRQN from their bases, MR keys from 1 << 8).
//   xsrcd_fuzz_seeds OUTDIR    (tests/fuzz/corpus: synthetic-*)
#include <infiniband/verbs.h>
#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_ioctl_cmds.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "command_capture.h"
#include "xsrc-abi.h"
#include "xsrc-queues.h"

namespace {

using namespace xsrc;

constexpr uint8_t kFlags = capture::kResponseInScratch | capture::kCallerMapsAll | capture::kFixLengths;
constexpr uint64_t kSomeResponse = 1;  // replaced by the replay's response area
constexpr uint64_t kSomeAddress = 0x7e0100000000;  // mapped: kCallerMapsAll

class Stream {
public:
	// A non-extended command: core struct (its response pointer, if any,
	// set by the caller), driver bytes, room for `out_bytes` of response.
	template <typename Core>
	Stream &cmd(uint32_t num, const Core &core, size_t out_bytes = 0, std::span<const std::byte> drv = {})
	{
		std::vector<std::byte> b(sizeof(ib_uverbs_cmd_hdr) + sizeof(Core) + drv.size());
		ib_uverbs_cmd_hdr hdr{num, uint16_t(b.size() / 4), uint16_t(out_bytes / 4)};
		std::memcpy(b.data(), &hdr, sizeof(hdr));
		std::memcpy(b.data() + sizeof(hdr), &core, sizeof(Core));
		if (!drv.empty())
			std::memcpy(b.data() + sizeof(hdr) + sizeof(Core), drv.data(), drv.size());
		return add(b);
	}

	// An extended command: room for `out_core` bytes of core and `out_drv`
	// bytes of driver response.
	template <typename Core>
	Stream &ex(uint32_t num, const Core &core, size_t out_core, size_t out_drv = 0)
	{
		std::vector<std::byte> b(sizeof(ib_uverbs_cmd_hdr) + sizeof(ib_uverbs_ex_cmd_hdr) + sizeof(Core));
		ib_uverbs_cmd_hdr hdr{num | IB_USER_VERBS_CMD_FLAG_EXTENDED, uint16_t(sizeof(Core) / 8),
				      uint16_t(out_core / 8)};
		ib_uverbs_ex_cmd_hdr exh{};
		exh.response = out_core + out_drv ? kSomeResponse : 0;
		exh.provider_out_words = uint16_t(out_drv / 8);
		std::memcpy(b.data(), &hdr, sizeof(hdr));
		std::memcpy(b.data() + sizeof(hdr), &exh, sizeof(exh));
		std::memcpy(b.data() + sizeof(hdr) + sizeof(exh), &core, sizeof(Core));
		return add(b);
	}

	// An RDMA_VERBS_IOCTL: the header and `attrs`, as libibverbs lays them out.
	Stream &ioctl(uint16_t object, uint16_t method, std::span<const ib_uverbs_attr> attrs)
	{
		ib_uverbs_ioctl_hdr hdr{};
		hdr.length = uint16_t(sizeof(hdr) + attrs.size_bytes());
		hdr.object_id = object;
		hdr.method_id = method;
		hdr.num_attrs = uint16_t(attrs.size());
		std::vector<std::byte> b(hdr.length);
		std::memcpy(b.data(), &hdr, sizeof(hdr));
		std::memcpy(b.data() + sizeof(hdr), attrs.data(), attrs.size_bytes());
		return add(b, capture::kIoctl | capture::kCallerMapsAll);
	}

	bool write(const std::string &path) const
	{
		std::ofstream out(path, std::ios::binary | std::ios::trunc);
		out.write(reinterpret_cast<const char *>(bytes_.data()), std::streamsize(bytes_.size()));
		return bool(out);
	}

private:
	Stream &add(std::span<const std::byte> command, uint8_t flags = kFlags)
	{
		auto r = capture::encode_record(command, flags, slot_++);
		bytes_.insert(bytes_.end(), r.begin(), r.end());
		return *this;
	}
	std::vector<std::byte> bytes_;
	uint8_t slot_ = 0;
};

template <typename T>
std::span<const std::byte> bytes_of(const T &v)
{
	return {reinterpret_cast<const std::byte *>(&v), sizeof(T)};
}

// GET_CONTEXT with an async pipe (fds 3, 4) and two channel pipes, and a PD
// (handle 0) — what every stream starts with.
Stream &open_context(Stream &s)
{
	xsrc_get_context_req drv{};
	drv.async_fds = {3, 4};
	drv.num_channel_fds = 2;
	drv.channel_fds[0] = {5, 6};
	drv.channel_fds[1] = {7, 8};
	ib_uverbs_get_context gc{};
	gc.response = kSomeResponse;
	s.cmd(IB_USER_VERBS_CMD_GET_CONTEXT, gc,
	      sizeof(ib_uverbs_get_context_resp) + sizeof(xsrc_get_context_resp), bytes_of(drv));
	ib_uverbs_alloc_pd pd{};
	pd.response = kSomeResponse;
	return s.cmd(IB_USER_VERBS_CMD_ALLOC_PD, pd, sizeof(ib_uverbs_alloc_pd_resp) + sizeof(xsrc_alloc_pd_resp));
}

ib_uverbs_ex_create_cq ex_cq(int channel)
{
	ib_uverbs_ex_create_cq cq{};
	cq.user_handle = 0xc0;
	cq.cqe = 16;
	cq.comp_channel = channel;
	return cq;
}

ib_uverbs_ex_create_qp ex_qp(uint8_t type, uint32_t pd, uint32_t cq, std::optional<uint32_t> srq = {})
{
	ib_uverbs_ex_create_qp qp{};
	qp.user_handle = 0x9b;
	qp.pd_handle = pd;
	qp.send_cq_handle = qp.recv_cq_handle = cq;
	qp.srq_handle = srq.value_or(0);
	qp.is_srq = srq.has_value();
	qp.max_send_wr = qp.max_recv_wr = 8;
	qp.max_send_sge = qp.max_recv_sge = 1;
	qp.max_inline_data = 32;
	qp.qp_type = type;
	return qp;
}

ib_uverbs_ex_modify_qp to_state(uint32_t qp, uint8_t state, uint32_t mask)
{
	ib_uverbs_ex_modify_qp m{};
	m.base.qp_handle = qp;
	m.base.attr_mask = mask | IBV_QP_STATE;
	m.base.qp_state = state;
	m.base.port_num = 1;
	m.base.qkey = 0x11111111;
	m.base.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
	m.base.path_mtu = IBV_MTU_1024;
	m.base.dest_qp_num = XSRC_QPN_BASE;
	m.base.dest.sgid_index = 1;
	m.base.dest.is_global = 1;
	m.base.dest.port_num = 1;
	m.base.max_dest_rd_atomic = 1;
	m.base.max_rd_atomic = 1;
	m.base.min_rnr_timer = 12;
	m.base.timeout = 14;
	m.base.retry_cnt = 7;
	m.base.rnr_retry = 7;
	return m;
}

// An RC QP through INIT, RTR and RTS (connected to the first QPN), with
// and without room for the extended response.
Stream &to_rts(Stream &s, uint32_t qp)
{
	s.ex(IB_USER_VERBS_EX_CMD_MODIFY_QP,
	     to_state(qp, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
	     sizeof(ib_uverbs_ex_modify_qp_resp));
	s.ex(IB_USER_VERBS_EX_CMD_MODIFY_QP,
	     to_state(qp, IBV_QPS_RTR, IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
	     sizeof(ib_uverbs_ex_modify_qp_resp));
	return s.ex(IB_USER_VERBS_EX_CMD_MODIFY_QP,
		    to_state(qp, IBV_QPS_RTS, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
						      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
		    0);
}

// Extended CQs and an RC QP taken through INIT, RTR and RTS, resized,
// armed, raised on, queried and destroyed.
Stream extended_rc()
{
	Stream s;
	open_context(s);
	ib_uverbs_create_comp_channel ch{};
	ch.response = kSomeResponse;
	s.cmd(IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL, ch, sizeof(ib_uverbs_create_comp_channel_resp));
	s.ex(IB_USER_VERBS_EX_CMD_CREATE_CQ, ex_cq(5), sizeof(ib_uverbs_ex_create_cq_resp),
	     sizeof(xsrc_create_cq_resp));                                             // handle 1
	s.ex(IB_USER_VERBS_EX_CMD_CREATE_CQ, ex_cq(-1), sizeof(ib_uverbs_ex_create_cq_resp));  // 2, no driver room
	s.ex(IB_USER_VERBS_EX_CMD_CREATE_QP, ex_qp(IBV_QPT_RC, 0, 1), sizeof(ib_uverbs_ex_create_qp_resp),
	     sizeof(xsrc_create_qp_resp));                                             // handle 3, first QPN
	to_rts(s, 3);
	ib_uverbs_resize_cq rz{};
	rz.response = kSomeResponse;
	rz.cq_handle = 1;
	rz.cqe = 100;
	s.cmd(IB_USER_VERBS_CMD_RESIZE_CQ, rz, sizeof(ib_uverbs_resize_cq_resp) + sizeof(xsrc_resize_cq_resp));
	ib_uverbs_req_notify_cq arm{};
	arm.cq_handle = 1;
	s.cmd(IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, arm);
	xsrc_raise_event fatal{};
	fatal.kind = XSRC_EVENT_QP_FATAL;
	fatal.object = XSRC_QPN_BASE;
	s.cmd(XSRC_CMD_RAISE_EVENT, fatal);
	ib_uverbs_query_qp q{};
	q.response = kSomeResponse;
	q.qp_handle = 3;
	q.attr_mask = ~0u;
	s.cmd(IB_USER_VERBS_CMD_QUERY_QP, q, sizeof(ib_uverbs_query_qp_resp));
	ib_uverbs_destroy_qp dq{};
	dq.response = kSomeResponse;
	dq.qp_handle = 3;
	s.cmd(IB_USER_VERBS_CMD_DESTROY_QP, dq, sizeof(ib_uverbs_destroy_qp_resp));
	ib_uverbs_destroy_cq dc{};
	dc.response = kSomeResponse;
	dc.cq_handle = 2;
	return s.cmd(IB_USER_VERBS_CMD_DESTROY_CQ, dc, sizeof(ib_uverbs_destroy_cq_resp));
}

// An SRQ with a limit and an extended QP on it; the limit and last-WQE
// events raised; an MR and XSRC_CMD_COPY through the QP to itself.
Stream srq_and_copy()
{
	Stream s;
	open_context(s);
	s.ex(IB_USER_VERBS_EX_CMD_CREATE_CQ, ex_cq(-1), sizeof(ib_uverbs_ex_create_cq_resp),
	     sizeof(xsrc_create_cq_resp));  // handle 1
	ib_uverbs_create_srq cs{};
	cs.response = kSomeResponse;
	cs.user_handle = 0x5e;
	cs.pd_handle = 0;
	cs.max_wr = 16;
	cs.max_sge = 1;
	s.cmd(IB_USER_VERBS_CMD_CREATE_SRQ, cs, sizeof(ib_uverbs_create_srq_resp) + sizeof(xsrc_create_srq_resp));  // 2
	ib_uverbs_modify_srq ms{};
	ms.srq_handle = 2;
	ms.attr_mask = IBV_SRQ_LIMIT;
	ms.srq_limit = 4;
	s.cmd(IB_USER_VERBS_CMD_MODIFY_SRQ, ms);
	ib_uverbs_query_srq qs{};
	qs.response = kSomeResponse;
	qs.srq_handle = 2;
	s.cmd(IB_USER_VERBS_CMD_QUERY_SRQ, qs, sizeof(ib_uverbs_query_srq_resp));
	s.ex(IB_USER_VERBS_EX_CMD_CREATE_QP, ex_qp(IBV_QPT_RC, 0, 1, 2), sizeof(ib_uverbs_ex_create_qp_resp),
	     sizeof(xsrc_create_qp_resp));  // 3
	to_rts(s, 3);
	xsrc_raise_event ev{};
	ev.kind = XSRC_EVENT_SRQ_LIMIT;
	ev.object = XSRC_SRQN_BASE;
	s.cmd(XSRC_CMD_RAISE_EVENT, ev);
	ev.kind = XSRC_EVENT_QP_LAST_WQE;
	ev.object = XSRC_QPN_BASE;
	s.cmd(XSRC_CMD_RAISE_EVENT, ev);
	ib_uverbs_reg_mr mr{};
	mr.response = kSomeResponse;
	mr.start = mr.hca_va = kSomeAddress;
	mr.length = 4096;
	mr.pd_handle = 0;
	mr.access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			  IBV_ACCESS_REMOTE_ATOMIC;
	s.cmd(IB_USER_VERBS_CMD_REG_MR, mr, sizeof(ib_uverbs_reg_mr_resp));  // 4, key 0x100
	xsrc_copy cp{};
	cp.response = kSomeResponse;
	cp.op = XSRC_COPY_WRITE;
	cp.key_kind = XSRC_COPY_RKEY;
	cp.key = 1u << 8;
	cp.qp_handle = 3;
	cp.peer_qpn = XSRC_QPN_BASE;
	cp.peer_addr = kSomeAddress;
	cp.length = 64;
	cp.local_iov = kSomeAddress + 1024;
	cp.num_local = 1;
	s.cmd(XSRC_CMD_COPY, cp, sizeof(xsrc_copy_resp));
	cp.op = XSRC_COPY_FETCH_ADD;
	cp.length = 8;
	cp.compare_add = 1;
	s.cmd(XSRC_CMD_COPY, cp, sizeof(xsrc_copy_resp));
	ib_uverbs_rereg_mr rr{};  // the MR moves, loses remote access, changes PD (to its own), is refused
	rr.response = kSomeResponse;
	rr.mr_handle = 4;
	rr.flags = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS;
	rr.start = rr.hca_va = kSomeAddress + 8192;
	rr.length = 4096;
	rr.access_flags = IBV_ACCESS_LOCAL_WRITE;
	s.cmd(IB_USER_VERBS_CMD_REREG_MR, rr, sizeof(ib_uverbs_rereg_mr_resp));
	rr.flags = IBV_REREG_MR_CHANGE_PD;
	rr.pd_handle = 0;
	s.cmd(IB_USER_VERBS_CMD_REREG_MR, rr, sizeof(ib_uverbs_rereg_mr_resp));
	rr.flags = 0;
	s.cmd(IB_USER_VERBS_CMD_REREG_MR, rr, sizeof(ib_uverbs_rereg_mr_resp));  // EINVAL
	s.cmd(XSRC_CMD_COPY, cp, sizeof(xsrc_copy_resp));  // the key now misses
	ib_uverbs_destroy_srq ds{};
	ds.response = kSomeResponse;
	ds.srq_handle = 2;
	return s.cmd(IB_USER_VERBS_CMD_DESTROY_SRQ, ds, sizeof(ib_uverbs_destroy_srq_resp));  // EBUSY: the QP
}

// UD QPs in multicast groups: attached (IPv4-mapped and IPv6 groups, twice,
// refused for a unicast GID and an RC QP), detached (and once more), and a
// destroy refused while attached; the context's teardown detaches the rest.
Stream multicast()
{
	Stream s;
	open_context(s);
	s.ex(IB_USER_VERBS_EX_CMD_CREATE_CQ, ex_cq(-1), sizeof(ib_uverbs_ex_create_cq_resp),
	     sizeof(xsrc_create_cq_resp));  // handle 1
	for (uint8_t type : {IBV_QPT_UD, IBV_QPT_UD, IBV_QPT_RC})  // handles 2, 3, 4
		s.ex(IB_USER_VERBS_EX_CMD_CREATE_QP, ex_qp(type, 0, 1), sizeof(ib_uverbs_ex_create_qp_resp),
		     sizeof(xsrc_create_qp_resp));
	const uint8_t v4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3};
	const uint8_t v6[16] = {0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34};
	const uint8_t unicast[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1};
	auto attach = [&](uint32_t qp, const uint8_t (&gid)[16]) {
		ib_uverbs_attach_mcast a{};
		std::memcpy(a.gid, gid, sizeof(a.gid));
		a.qp_handle = qp;
		s.cmd(IB_USER_VERBS_CMD_ATTACH_MCAST, a);
	};
	auto detach = [&](uint32_t qp, const uint8_t (&gid)[16]) {
		ib_uverbs_detach_mcast d{};
		std::memcpy(d.gid, gid, sizeof(d.gid));
		d.qp_handle = qp;
		s.cmd(IB_USER_VERBS_CMD_DETACH_MCAST, d);
	};
	attach(2, v4);
	attach(3, v4);
	attach(2, v4);       // 0: attached already
	attach(2, v6);
	attach(2, unicast);  // EINVAL
	attach(4, v4);       // EINVAL: an RC QP
	detach(3, v4);
	detach(3, v4);       // EINVAL: not attached
	ib_uverbs_destroy_qp dq{};
	dq.response = kSomeResponse;
	dq.qp_handle = 2;
	return s.cmd(IB_USER_VERBS_CMD_DESTROY_QP, dq, sizeof(ib_uverbs_destroy_qp_resp));  // EBUSY
}

// Memory windows (driver ABI r4): an MR with MW_BIND, windows of types 1, 2
// and 3 (EINVAL), binds (one refused), local and remote invalidation (the
// remote one refused: the QP is connected to nobody), the MR's dereg
// unbinding the rest, a dealloc.
Stream windows()
{
	Stream s;
	open_context(s);  // PD 0
	s.ex(IB_USER_VERBS_EX_CMD_CREATE_CQ, ex_cq(-1), sizeof(ib_uverbs_ex_create_cq_resp),
	     sizeof(xsrc_create_cq_resp));  // 1
	s.ex(IB_USER_VERBS_EX_CMD_CREATE_QP, ex_qp(IBV_QPT_RC, 0, 1), sizeof(ib_uverbs_ex_create_qp_resp),
	     sizeof(xsrc_create_qp_resp));  // 2
	ib_uverbs_reg_mr mr{};
	mr.response = kSomeResponse;
	mr.start = mr.hca_va = kSomeAddress;
	mr.length = 4096;
	mr.access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
	s.cmd(IB_USER_VERBS_CMD_REG_MR, mr, sizeof(ib_uverbs_reg_mr_resp));  // 3, key 0x100
	for (uint8_t type : {uint8_t(IBV_MW_TYPE_1), uint8_t(IBV_MW_TYPE_2), uint8_t(3)}) {  // 4 (0x201), 5 (0x302), EINVAL
		ib_uverbs_alloc_mw mw{};
		mw.response = kSomeResponse;
		mw.mw_type = type;
		s.cmd(IB_USER_VERBS_CMD_ALLOC_MW, mw, sizeof(ib_uverbs_alloc_mw_resp));
	}
	xsrc_bind_mw b{};
	b.qp_handle = 2;
	b.mw_handle = 4;
	b.mr_handle = 3;
	b.rkey = 0x202;
	b.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	b.addr = kSomeAddress + 64;
	b.length = 256;
	s.cmd(XSRC_CMD_BIND_MW, b);
	b.mw_handle = 5;
	b.rkey = 0x303;
	s.cmd(XSRC_CMD_BIND_MW, b);
	s.cmd(XSRC_CMD_BIND_MW, b);  // EINVAL: a bound type 2 window
	xsrc_invalidate inv{};
	inv.kind = XSRC_INVALIDATE_REMOTE;
	inv.qp_handle = 2;
	inv.rkey = 0x303;
	inv.peer_qpn = XSRC_QPN_BASE;
	s.cmd(XSRC_CMD_INVALIDATE, inv);  // EINVAL: not connected
	inv.kind = XSRC_INVALIDATE_LOCAL;
	inv.peer_qpn = 0;
	s.cmd(XSRC_CMD_INVALIDATE, inv);
	b.rkey = 0x304;
	s.cmd(XSRC_CMD_BIND_MW, b);
	s.cmd(IB_USER_VERBS_CMD_DEREG_MR, ib_uverbs_dereg_mr{3});
	return s.cmd(IB_USER_VERBS_CMD_DEALLOC_MW, ib_uverbs_dealloc_mw{4});
}

}  // namespace

// Import (r6): IMPORT_CONTEXT with a pipe (fds 9, 10), QUERY_OBJECT of the
// PD and of an MR, the ASYNC_EVENT_ALLOC ioctl that hands the pipe out, and
// an ioctl of a method not served (ENOTTY).
Stream imports()
{
	Stream s;
	open_context(s);
	ib_uverbs_reg_mr mr{};
	mr.response = kSomeResponse;
	mr.start = mr.hca_va = kSomeAddress;
	mr.length = 4096;
	mr.access_flags = IBV_ACCESS_LOCAL_WRITE;
	s.cmd(IB_USER_VERBS_CMD_REG_MR, mr, sizeof(ib_uverbs_reg_mr_resp));
	xsrc_import_context ic{};
	ic.response = kSomeResponse;
	ic.async_fds = {9, 10};
	s.cmd(XSRC_CMD_IMPORT_CONTEXT, ic, sizeof(xsrc_get_context_resp));
	for (auto [type, handle] : {std::pair{XSRC_OBJECT_PD, 0u}, std::pair{XSRC_OBJECT_MR, 1u}}) {
		xsrc_query_object q{};
		q.response = kSomeResponse;
		q.type = type;
		q.handle = handle;
		s.cmd(XSRC_CMD_QUERY_OBJECT, q, sizeof(xsrc_query_object_resp));
	}
	ib_uverbs_attr fd{};
	fd.attr_id = UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE;
	fd.flags = UVERBS_ATTR_F_MANDATORY;
	s.ioctl(UVERBS_OBJECT_ASYNC_EVENT, UVERBS_METHOD_ASYNC_EVENT_ALLOC, std::span(&fd, 1));
	// CQ_CREATE as libibverbs sends it for an imported context; outputs in
	// the mapped data area.
	auto attr = [](uint16_t id, uint64_t data, uint16_t len) {
		ib_uverbs_attr a{};
		a.attr_id = id;
		a.flags = UVERBS_ATTR_F_MANDATORY;
		a.len = len;
		a.data = data;
		return a;
	};
	const ib_uverbs_attr cq[] = {
		attr(UVERBS_ATTR_CREATE_CQ_HANDLE, 0, 0),
		attr(UVERBS_ATTR_CREATE_CQ_RESP_CQE, kSomeAddress, 4),
		attr(UVERBS_ATTR_CREATE_CQ_CQE, 16, 4),
		attr(UVERBS_ATTR_CREATE_CQ_USER_HANDLE, 0xc0, 8),
		attr(UVERBS_ATTR_CREATE_CQ_COMP_VECTOR, 0, 4),
		attr(UVERBS_ATTR_CREATE_CQ_EVENT_FD, 9, 0),
		attr(UVERBS_ATTR_UHW_OUT, kSomeAddress + 64, sizeof(xsrc_create_cq_resp)),
	};
	s.ioctl(UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_CREATE, cq);
	// QP_CREATE on that CQ (handle 2: after the PD 0 and the MR 1).
	const ib_uverbs_qp_cap cap{8, 8, 1, 1, 32};
	static_assert(sizeof(cap) == 20);
	const ib_uverbs_attr qp[] = {
		attr(UVERBS_ATTR_CREATE_QP_PD_HANDLE, 0, 0),
		attr(UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE, 2, 0),
		attr(UVERBS_ATTR_CREATE_QP_RECV_CQ_HANDLE, 2, 0),
		attr(UVERBS_ATTR_CREATE_QP_HANDLE, 0, 0),
		attr(UVERBS_ATTR_CREATE_QP_TYPE, IBV_QPT_RC, 8),
		attr(UVERBS_ATTR_CREATE_QP_USER_HANDLE, 0x9b, 8),
		// The capabilities' 20 bytes: in the data area, as the caller's struct.
		attr(UVERBS_ATTR_CREATE_QP_CAP, kSomeAddress + 128, sizeof(cap)),
		attr(UVERBS_ATTR_CREATE_QP_RESP_CAP, kSomeAddress + 192, sizeof(cap)),
		attr(UVERBS_ATTR_CREATE_QP_RESP_QP_NUM, kSomeAddress + 256, 4),
		attr(UVERBS_ATTR_UHW_OUT, kSomeAddress + 320, sizeof(xsrc_create_qp_resp)),
	};
	s.ioctl(UVERBS_OBJECT_QP, UVERBS_METHOD_QP_CREATE, qp);
	// A method not served: EPROTONOSUPPORT once imported.
	return s.ioctl(UVERBS_OBJECT_PD, UVERBS_METHOD_PD_DESTROY, std::span(&fd, 1));
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
		return 2;
	}
	std::string dir = argv[1];
	bool ok = extended_rc().write(dir + "/synthetic-extended-rc") &&
		  srq_and_copy().write(dir + "/synthetic-srq-copy") &&
		  multicast().write(dir + "/synthetic-multicast") && windows().write(dir + "/synthetic-windows") &&
		  imports().write(dir + "/synthetic-imports");
	if (!ok)
		fprintf(stderr, "%s: cannot write the seeds into %s\n", argv[0], dir.c_str());
	return ok ? 0 : 1;
}
