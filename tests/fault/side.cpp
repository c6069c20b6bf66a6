// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
#include "side.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

namespace xsrc::fault {

const char *op_name(Op op)
{
	switch (op) {
	case Op::send: return "send";
	case Op::write: return "write";
	case Op::read: return "read";
	case Op::fetch_add: return "fetch_add";
	case Op::cmp_swap: return "cmp_swap";
	default: return "?";
	}
}

// The XRC objects: a domain of no file, its SRQ, a receive and a send QP.
static bool make_xrc(Side &s)
{
	ibv_xrcd_init_attr xa{};
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	xa.fd = -1;
	xa.oflags = O_CREAT;
	if (!(s.xrcd = ibv_open_xrcd(s.ctx, &xa)))
		return false;
	ibv_srq_init_attr_ex sa{};
	sa.attr.max_wr = Side::kRecvs + 1;
	sa.attr.max_sge = 1;
	sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
	sa.srq_type = IBV_SRQT_XRC;
	sa.pd = s.pd;
	sa.xrcd = s.xrcd;
	sa.cq = s.recv_cq;
	if (!(s.srq = ibv_create_srq_ex(s.ctx, &sa)))
		return false;
	ibv_qp_init_attr_ex ra{};
	ra.qp_type = IBV_QPT_XRC_RECV;
	ra.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	ra.xrcd = s.xrcd;
	if (!(s.xrc_recv = ibv_create_qp_ex(s.ctx, &ra)))
		return false;
	ibv_qp_init_attr_ex qa{};
	qa.qp_type = IBV_QPT_XRC_SEND;
	qa.send_cq = s.send_cq;
	qa.cap.max_send_wr = 32;
	qa.cap.max_send_sge = 1;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD;
	qa.pd = s.pd;
	return (s.qp = ibv_create_qp_ex(s.ctx, &qa)) != nullptr;
}

// The PD, CQs, MR and QPs of a side whose context is open.
static bool make_objects(Side &s, bool xrc)
{
	s.pd = ibv_alloc_pd(s.ctx);
	s.send_cq = s.pd ? ibv_create_cq(s.ctx, 64, nullptr, nullptr, 0) : nullptr;
	s.recv_cq = s.send_cq ? ibv_create_cq(s.ctx, 64, nullptr, s.channel, 0) : nullptr;
	s.mr = s.recv_cq ? ibv_reg_mr(s.pd, s.buf.data(), Side::kBufBytes,
				    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
					    IBV_ACCESS_REMOTE_ATOMIC)
			 : nullptr;
	if (!s.mr) {
		std::fprintf(stderr, "cannot make the PD, CQs or MR: %s\n", std::strerror(errno));
		return false;
	}
	if (xrc) {
		if (!make_xrc(s)) {
			std::fprintf(stderr, "cannot make the XRC objects: %s\n", std::strerror(errno));
			return false;
		}
		return true;
	}
	ibv_qp_init_attr attr{};
	attr.send_cq = s.send_cq;
	attr.recv_cq = s.recv_cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap = {32, Side::kRecvs + 1, 1, 1, 0};
	if (s.cm_id) {
		if (rdma_create_qp(s.cm_id, s.pd, &attr) == 0)
			s.qp = s.cm_id->qp;
	} else {
		s.qp = ibv_create_qp(s.pd, &attr);
	}
	if (!s.qp) {
		std::fprintf(stderr, "cannot make the QP: %s\n", std::strerror(errno));
		return false;
	}
	return true;
}

bool Side::open(bool with_channel, bool xrc)
{
	int n = 0;
	ibv_device **list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n && !ctx; ++i)
		if (std::strcmp(ibv_get_device_name(list[i]), "xsrc0") == 0)
			ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	if (!ctx) {
		std::fprintf(stderr, "cannot open xsrc0: %s\n", std::strerror(errno));
		return false;
	}
	if (with_channel && !(channel = ibv_create_comp_channel(ctx)))
		return false;
	return make_objects(*this, xrc);
}

bool Side::open_on(rdma_cm_id *id)
{
	cm_id = id;
	ctx = id->verbs;
	return make_objects(*this, false);
}

Info Side::info() const
{
	Info i;
	i.qpn = qp->qp_num;
	ibv_query_gid(ctx, 1, 1, &i.gid);
	i.addr = reinterpret_cast<uintptr_t>(buf.data());
	i.rkey = mr->rkey;
	if (xrc_recv) {
		i.xrc_recv_qpn = xrc_recv->qp_num;
		ibv_get_srq_num(srq, &i.srqn);
	}
	return i;
}

bool Side::connect(const Info &peer)
{
	harness::QpConnectAttrs a;
	a.timeout = 8;  // 1 ms a try
	a.retry_cnt = 3;
	if (harness::QpStep step = harness::qp_connect(qp, {xrc_recv ? peer.xrc_recv_qpn : peer.qpn, peer.gid}, a)) {
		std::fprintf(stderr, "connect: %s\n", step.text().c_str());
		return false;
	}
	if (!xrc_recv)
		return true;
	// The receive QP answers the peer's send QP; it never sends.
	harness::QpStep step = harness::qp_to_init(xrc_recv, a);
	if (!step)
		step = harness::qp_to_rtr(xrc_recv, {peer.qpn, peer.gid}, a);
	if (step)
		std::fprintf(stderr, "connect the XRC receive QP: %s\n", step.text().c_str());
	return !step;
}

int Side::post_recv(uint64_t wr_id)
{
	ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()) + 2048, 1024, mr->lkey};
	ibv_recv_wr wr{}, *bad = nullptr;
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(qp, &wr, &bad);
}

int Side::post_op(Op op, const Info &peer, uint64_t wr_id, bool signaled)
{
	ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()) + 64, 64, mr->lkey};
	ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
	wr.wr.rdma.remote_addr = peer.addr + 64;
	wr.wr.rdma.rkey = peer.rkey;
	if (xrc_recv)
		wr.qp_type.xrc.remote_srqn = peer.srqn;
	switch (op) {
	case Op::send: wr.opcode = IBV_WR_SEND; break;
	case Op::write: wr.opcode = IBV_WR_RDMA_WRITE; break;
	case Op::read: wr.opcode = IBV_WR_RDMA_READ; break;
	case Op::fetch_add:
	case Op::cmp_swap:
		sge.length = 8;
		wr.opcode = op == Op::fetch_add ? IBV_WR_ATOMIC_FETCH_AND_ADD : IBV_WR_ATOMIC_CMP_AND_SWP;
		wr.wr.atomic.remote_addr = peer.addr;
		wr.wr.atomic.rkey = peer.rkey;
		wr.wr.atomic.compare_add = 1;
		wr.wr.atomic.swap = wr_id;
		break;
	default: return EINVAL;
	}
	return ibv_post_send(qp, &wr, &bad);
}

int Side::teardown()
{
	int first = 0;
	auto note = [&](int err) {
		if (err && !first)
			first = err;
	};
	if (qp)
		note(ibv_destroy_qp(qp));  // what rdma_destroy_qp does, with the result kept
	if (cm_id)
		cm_id->qp = nullptr;
	if (xrc_recv)
		note(ibv_destroy_qp(xrc_recv));
	if (srq)
		note(ibv_destroy_srq(srq));
	if (xrcd)
		note(ibv_close_xrcd(xrcd));
	if (mr)
		note(ibv_dereg_mr(mr));
	if (recv_cq)
		note(ibv_destroy_cq(recv_cq));
	if (send_cq)
		note(ibv_destroy_cq(send_cq));
	if (pd)
		note(ibv_dealloc_pd(pd));
	if (channel)
		note(ibv_destroy_comp_channel(channel));
	if (ctx && !cm_id)
		note(ibv_close_device(ctx));
	qp = xrc_recv = nullptr, srq = nullptr, xrcd = nullptr, mr = nullptr, recv_cq = send_cq = nullptr, pd = nullptr, channel = nullptr, ctx = nullptr, cm_id = nullptr;
	return first;
}

int open_fd_count()
{
	int n = 0;
	if (DIR *d = opendir("/proc/self/fd")) {
		while (dirent *e = readdir(d))
			n += e->d_name[0] != '.';
		closedir(d);
		--n;  // the directory's own fd
	}
	return n;
}

int wait_async_event(ibv_context *ctx, ms timeout)
{
	int flags = fcntl(ctx->async_fd, F_GETFL);
	fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
	pollfd p{ctx->async_fd, POLLIN, 0};
	int type = -1;
	ibv_async_event ev;
	if (poll(&p, 1, static_cast<int>(timeout.count())) == 1 && ibv_get_async_event(ctx, &ev) == 0) {
		type = ev.event_type;
		ibv_ack_async_event(&ev);
	}
	fcntl(ctx->async_fd, F_SETFL, flags);
	return type;
}

bool poll_one(ibv_cq *cq, ibv_wc &wc, ms timeout)
{
	auto until = Clock::now() + timeout;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n > 0)
			return true;
		if (n < 0 || Clock::now() >= until)
			return false;
		std::this_thread::yield();
	}
}

}  // namespace xsrc::fault
