// The other process of the XRC tests (the test binary re-exec'd with
// `--child FD ROLE ARGS...`), in one of two roles:
//   peer DEVICE          serves commands (Msg "cmd=...") over FD: XRC send
//                        QPs and what they post (ibv_post_send and the
//                        ibv_wr_* API), and the other side of a shared
//                        domain: open an XRCD by file, open/modify/query/
//                        destroy an XRC receive QP by number.
//   holder DEVICE PATH   opens the XRC domain of PATH (O_CREAT) and makes an
//                        XRC SRQ and an XRC receive QP in it, reports their
//                        numbers, then waits to be killed.
// Every reply carries either the results or "error=..." (a broken step of
// the peer itself, as opposed to an errno the test asks about).
#include "xrc_peer.h"

#include <infiniband/verbs.h>

#include <cstdlib>
#include <map>

#include "xrc_util.h"

namespace xrc_test {
namespace {

constexpr size_t kBufBytes = 1 << 20;
constexpr ms kCompletionWait = 5s;

struct PeerState {
	CtxPtr ctx;
	PdPtr pd;
	CqPtr cq;
	std::vector<uint8_t> buf = std::vector<uint8_t>(kBufBytes);
	MrPtr mr;
	std::map<uint64_t, xsrc::unique_fd> files;
	std::map<uint64_t, XrcdPtr> xrcds;    // after files, before the QPs in them
	std::map<uint64_t, QpPtr> opened;     // XRC receive QPs opened by number
	std::map<uint64_t, QpPtr> send_qps;
	uint64_t next_id = 1;

	~PeerState()
	{
		send_qps.clear();
		opened.clear();
		xrcds.clear();
		files.clear();
	}

	ibv_qp *send_qp(const Msg &m)
	{
		auto it = send_qps.find(m.u64("id"));
		if (it == send_qps.end())
			fail("no send QP " + m.str("id"));
		return it->second.get();
	}
};

ibv_wr_opcode opcode_of(const std::string &op)
{
	if (op == "send")
		return IBV_WR_SEND;
	if (op == "send_imm")
		return IBV_WR_SEND_WITH_IMM;
	if (op == "write")
		return IBV_WR_RDMA_WRITE;
	if (op == "write_imm")
		return IBV_WR_RDMA_WRITE_WITH_IMM;
	if (op == "read")
		return IBV_WR_RDMA_READ;
	if (op == "fadd")
		return IBV_WR_ATOMIC_FETCH_AND_ADD;
	if (op == "cswap")
		return IBV_WR_ATOMIC_CMP_AND_SWP;
	fail("unknown op " + op);
}

// Waits for `n` completions of the send CQ and puts them into the reply.
void collect(PeerState &s, size_t n, Msg &reply)
{
	auto wcs = poll_completions(s.cq.get(), n, kCompletionWait);
	std::string statuses, opcodes, lens, ids;
	for (auto &wc : wcs) {
		statuses += std::to_string(wc.status) + ",";
		opcodes += std::to_string(wc.opcode) + ",";
		lens += std::to_string(wc.byte_len) + ",";
		ids += std::to_string(wc.wr_id) + ",";
	}
	reply.set("completions", static_cast<uint64_t>(wcs.size()));
	reply.set("statuses", statuses).set("opcodes", opcodes).set("byte_lens", lens).set("wr_ids", ids);
	if (!wcs.empty()) {
		reply.set("status", static_cast<uint64_t>(wcs[0].status));
		reply.set("opcode", static_cast<uint64_t>(wcs[0].opcode));
		reply.set("byte_len", static_cast<uint64_t>(wcs[0].byte_len));
	}
}

Msg cmd_send_qp(PeerState &s, const Msg &m)
{
	ibv_qp_init_attr_ex a{};
	a.qp_type = IBV_QPT_XRC_SEND;
	a.send_cq = s.cq.get();
	a.cap.max_send_wr = static_cast<uint32_t>(m.u64("max_send_wr", 256));
	a.cap.max_send_sge = 1;
	a.cap.max_inline_data = 64;
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	a.pd = s.pd.get();
	if (m.u64("wr_api", 0)) {
		a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
				   IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
	}
	ibv_qp *qp = ibv_create_qp_ex(s.ctx.get(), &a);
	if (!qp)
		fail("ibv_create_qp_ex(XRC_SEND): " + errno_text(errno));
	QpPtr owned(qp);
	to_init(qp, 0);
	uint64_t id = s.next_id++;
	s.send_qps[id] = std::move(owned);
	return Msg().set("id", id).set("qpn", qp->qp_num);
}

// One work request, signaled, and its completion.
Msg cmd_post(PeerState &s, const Msg &m)
{
	ibv_qp *qp = s.send_qp(m);
	ibv_wr_opcode op = opcode_of(m.str("op"));
	uint32_t len = static_cast<uint32_t>(m.u64("len", 8));
	uint8_t *local = s.buf.data();
	if (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM)
		fill_payload(local, len, m.u64("seq", 0), static_cast<uint32_t>(m.u64("srqn")));
	else if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM)
		for (size_t j = 0; j < len; ++j)
			local[j] = pattern(m.u64("seed", 0), j);
	else
		std::memset(local, 0xee, len);
	ibv_sge sge{reinterpret_cast<uintptr_t>(local), len, s.mr->lkey};
	ibv_send_wr wr{};
	wr.wr_id = m.u64("wr_id", 1);
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.qp_type.xrc.remote_srqn = static_cast<uint32_t>(m.u64("srqn"));
	wr.imm_data = htobe32(static_cast<uint32_t>(m.u64("imm", 0)));
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
		wr.wr.atomic.remote_addr = m.u64("raddr");
		wr.wr.atomic.rkey = static_cast<uint32_t>(m.u64("rkey"));
		wr.wr.atomic.compare_add = m.u64("compare_add", 0);
		wr.wr.atomic.swap = m.u64("swap", 0);
	} else if (op != IBV_WR_SEND && op != IBV_WR_SEND_WITH_IMM) {
		wr.wr.rdma.remote_addr = m.u64("raddr");
		wr.wr.rdma.rkey = static_cast<uint32_t>(m.u64("rkey"));
	}
	ibv_send_wr *bad = nullptr;
	Msg reply;
	if (int err = ibv_post_send(qp, &wr, &bad))
		return reply.set("post_err", err);
	reply.set("post_err", 0);
	collect(s, 1, reply);
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
		uint64_t result;
		std::memcpy(&result, local, 8);
		reply.set("result", result);
	}
	if (op == IBV_WR_RDMA_READ)
		reply.set("data", to_hex(local, len));
	return reply;
}

// A train of sends (SEND, or SEND_WITH_IMM with imm = seq for every
// `imm_every`-th), message i to SRQ targets[i], all posted before any
// completion is looked at.
Msg cmd_send_many(PeerState &s, const Msg &m)
{
	ibv_qp *qp = s.send_qp(m);
	auto targets = split(m.str("targets"), ',');
	uint32_t len = static_cast<uint32_t>(m.u64("len", 64));
	uint64_t seq0 = m.u64("seq0", 0);
	uint64_t imm_every = m.u64("imm_every", 0);
	if (targets.size() * len > kBufBytes)
		fail("send_many: too much data");
	size_t posted = 0;
	int post_err = 0;
	for (size_t i = 0; i < targets.size(); ++i) {
		uint32_t srqn = static_cast<uint32_t>(std::stoul(targets[i], nullptr, 0));
		uint64_t seq = seq0 + i;
		uint8_t *p = s.buf.data() + i * len;
		fill_payload(p, len, seq, srqn);
		ibv_sge sge{reinterpret_cast<uintptr_t>(p), len, s.mr->lkey};
		ibv_send_wr wr{};
		wr.wr_id = seq;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.opcode = IBV_WR_SEND;
		if (imm_every && seq % imm_every == 0) {
			wr.opcode = IBV_WR_SEND_WITH_IMM;
			wr.imm_data = htobe32(static_cast<uint32_t>(seq));
		}
		wr.qp_type.xrc.remote_srqn = srqn;
		ibv_send_wr *bad = nullptr;
		if ((post_err = ibv_post_send(qp, &wr, &bad)))
			break;
		++posted;
	}
	Msg reply;
	reply.set("post_err", post_err).set("posted", static_cast<uint64_t>(posted));
	collect(s, posted, reply);
	return reply;
}

// The same through ibv_qp_ex: one ibv_wr_start .. ibv_wr_complete batch of
// items "op,srqn,args..." separated by ';':
//   send,SRQN,LEN,SEQ  send_imm,SRQN,LEN,SEQ,IMM  send_inline,SRQN,LEN,SEQ
//   write,SRQN,LEN,RADDR,RKEY,SEED  fadd,SRQN,RADDR,RKEY,ADD
// Item i uses the local buffer at i * 4096; wr_id = i.
Msg cmd_wr_batch(PeerState &s, const Msg &m)
{
	ibv_qp *qp = s.send_qp(m);
	ibv_qp_ex *qpx = ibv_qp_to_qp_ex(qp);
	if (!qpx)
		fail("ibv_qp_to_qp_ex returned NULL");
	auto items = split(m.str("items"), ';');
	ibv_wr_start(qpx);
	for (size_t i = 0; i < items.size(); ++i) {
		auto f = split(items[i], ',');
		auto num = [&](size_t k) { return std::stoull(f.at(k), nullptr, 0); };
		uint8_t *local = s.buf.data() + i * 4096;
		qpx->wr_id = i;
		qpx->wr_flags = IBV_SEND_SIGNALED;
		const std::string &op = f.at(0);
		uint32_t srqn = static_cast<uint32_t>(num(1));
		if (op == "send" || op == "send_imm" || op == "send_inline") {
			uint32_t len = static_cast<uint32_t>(num(2));
			fill_payload(local, len, num(3), srqn);
			if (op == "send_imm")
				ibv_wr_send_imm(qpx, htobe32(static_cast<uint32_t>(num(4))));
			else
				ibv_wr_send(qpx);
			ibv_wr_set_xrc_srqn(qpx, srqn);
			if (op == "send_inline")
				ibv_wr_set_inline_data(qpx, local, len);
			else
				ibv_wr_set_sge(qpx, s.mr->lkey, reinterpret_cast<uintptr_t>(local), len);
		} else if (op == "write") {
			uint32_t len = static_cast<uint32_t>(num(2));
			for (size_t j = 0; j < len; ++j)
				local[j] = pattern(num(5), j);
			ibv_wr_rdma_write(qpx, static_cast<uint32_t>(num(4)), num(3));
			ibv_wr_set_xrc_srqn(qpx, srqn);
			ibv_wr_set_sge(qpx, s.mr->lkey, reinterpret_cast<uintptr_t>(local), len);
		} else if (op == "fadd") {
			std::memset(local, 0xee, 8);
			ibv_wr_atomic_fetch_add(qpx, static_cast<uint32_t>(num(3)), num(2), num(4));
			ibv_wr_set_xrc_srqn(qpx, srqn);
			ibv_wr_set_sge(qpx, s.mr->lkey, reinterpret_cast<uintptr_t>(local), 8);
		} else {
			ibv_wr_abort(qpx);
			fail("wr_batch: unknown op " + op);
		}
	}
	Msg reply;
	int err = ibv_wr_complete(qpx);
	reply.set("complete_err", err);
	if (err)
		return reply;
	collect(s, items.size(), reply);
	std::string results;
	for (size_t i = 0; i < items.size(); ++i) {
		uint64_t v;
		std::memcpy(&v, s.buf.data() + i * 4096, 8);
		results += std::to_string(v) + ",";
	}
	return reply.set("results", results);
}

Msg cmd_open_xrcd(PeerState &s, const Msg &m)
{
	xsrc::unique_fd fd(open(m.str("path").c_str(), O_RDONLY | O_CLOEXEC));
	if (!fd)
		fail("open " + m.str("path") + ": " + errno_text(errno));
	ibv_xrcd *x = open_xrcd_raw(s.ctx.get(), fd.get(), static_cast<int>(m.u64("oflags", 0)));
	if (!x)
		return Msg().set("errno", errno);
	uint64_t id = s.next_id++;
	s.files[id] = std::move(fd);
	s.xrcds[id] = XrcdPtr(x);
	return Msg().set("errno", 0).set("id", id);
}

Msg cmd_close_xrcd(PeerState &s, const Msg &m)
{
	uint64_t id = m.u64("id");
	auto it = s.xrcds.find(id);
	if (it == s.xrcds.end())
		fail("no xrcd " + m.str("id"));
	int err = ibv_close_xrcd(it->second.release());
	s.xrcds.erase(it);
	s.files.erase(id);
	return Msg().set("ret", err);
}

Msg cmd_open_qp(PeerState &s, const Msg &m)
{
	auto it = s.xrcds.find(m.u64("xrcd"));
	if (it == s.xrcds.end())
		fail("no xrcd " + m.str("xrcd"));
	ibv_qp_open_attr a{};
	a.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	a.qp_num = static_cast<uint32_t>(m.u64("qpn"));
	a.xrcd = it->second.get();
	a.qp_type = IBV_QPT_XRC_RECV;
	ibv_qp *qp = ibv_open_qp(s.ctx.get(), &a);
	if (!qp)
		return Msg().set("errno", errno);
	uint64_t id = s.next_id++;
	s.opened[id] = QpPtr(qp);
	return Msg().set("errno", 0).set("id", id).set("qpn", qp->qp_num);
}

ibv_qp *opened_qp(PeerState &s, const Msg &m)
{
	auto it = s.opened.find(m.u64("id"));
	if (it == s.opened.end())
		fail("no opened QP " + m.str("id"));
	return it->second.get();
}

Msg cmd_query_qp(PeerState &s, const Msg &m)
{
	ibv_qp_attr a{};
	ibv_qp_init_attr init{};
	int err = ibv_query_qp(opened_qp(s, m), &a, IBV_QP_STATE | IBV_QP_DEST_QPN, &init);
	Msg reply;
	reply.set("ret", err);
	if (!err)
		reply.set("state", static_cast<uint64_t>(a.qp_state))
			.set("dest_qp_num", static_cast<uint64_t>(a.dest_qp_num))
			.set("qp_type", static_cast<uint64_t>(init.qp_type));
	return reply;
}

Msg cmd_modify_rtr(PeerState &s, const Msg &m)
{
	recv_to_rtr(opened_qp(s, m), static_cast<uint32_t>(m.u64("dest")));
	return Msg().set("ret", 0);
}

Msg cmd_destroy_qp(PeerState &s, const Msg &m)
{
	uint64_t id = m.u64("id");
	for (auto *map : {&s.opened, &s.send_qps}) {
		auto it = map->find(id);
		if (it == map->end())
			continue;
		int err = ibv_destroy_qp(it->second.release());
		map->erase(it);
		return Msg().set("ret", err);
	}
	fail("no QP " + m.str("id"));
}

int peer_main(Link &link, const std::vector<std::string> &args)
{
	PeerState s;
	s.ctx = open_device(args.at(0));
	s.pd = alloc_pd(s.ctx.get());
	s.cq = create_cq(s.ctx.get(), 1024);
	s.mr = reg_mr(s.pd.get(), s.buf.data(), s.buf.size(), IBV_ACCESS_LOCAL_WRITE);
	link.send(Msg().set("hello", 1).set("pid", static_cast<uint64_t>(getpid())));
	for (;;) {
		Msg m = link.expect(600s, "a command");
		const std::string &cmd = m.str("cmd");
		Msg reply;
		if (cmd == "exit") {
			link.send(Msg().set("bye", 1));
			return 0;
		} else if (cmd == "send_qp") {
			reply = cmd_send_qp(s, m);
		} else if (cmd == "connect") {
			send_to_rts(s.send_qp(m), static_cast<uint32_t>(m.u64("dest")));
			reply.set("ret", 0);
		} else if (cmd == "post") {
			reply = cmd_post(s, m);
		} else if (cmd == "send_many") {
			reply = cmd_send_many(s, m);
		} else if (cmd == "wr_batch") {
			reply = cmd_wr_batch(s, m);
		} else if (cmd == "open_xrcd") {
			reply = cmd_open_xrcd(s, m);
		} else if (cmd == "close_xrcd") {
			reply = cmd_close_xrcd(s, m);
		} else if (cmd == "open_qp") {
			reply = cmd_open_qp(s, m);
		} else if (cmd == "query_qp") {
			reply = cmd_query_qp(s, m);
		} else if (cmd == "modify_rtr") {
			reply = cmd_modify_rtr(s, m);
		} else if (cmd == "destroy_qp") {
			reply = cmd_destroy_qp(s, m);
		} else {
			fail("unknown command " + cmd);
		}
		link.send(reply);
	}
}

// Holds an XRC domain (made by it), an XRC SRQ and an XRC receive QP until
// it is killed.
int holder_main(Link &link, const std::vector<std::string> &args)
{
	CtxPtr ctx = open_device(args.at(0));
	xsrc::unique_fd fd(open(args.at(1).c_str(), O_RDONLY | O_CLOEXEC));
	if (!fd)
		fail("open " + args.at(1) + ": " + errno_text(errno));
	XrcdPtr xrcd = open_xrcd(ctx.get(), fd.get(), O_CREAT);
	PdPtr pd = alloc_pd(ctx.get());
	CqPtr cq = create_cq(ctx.get());
	std::vector<uint8_t> buf(4096);
	MrPtr mr = reg_mr(pd.get(), buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
	SrqPtr srq = create_xrc_srq(ctx.get(), xrcd.get(), pd.get(), cq.get());
	for (int i = 0; i < 4; ++i)
		post_srq_recv(srq.get(), i, buf.data() + i * 1024, 1024, mr->lkey);
	QpPtr qp = create_xrc_recv_qp(ctx.get(), xrcd.get(), kRemoteAll);
	link.send(Msg().set("ready", 1).set("qpn", qp->qp_num).set("srqn", srq_num(srq.get())));
	for (;;)
		link.expect(600s, "being killed");
}

}  // namespace

int child_main(const std::string &role, Link &link, const std::vector<std::string> &args)
{
	alarm(120);  // whatever happens, a child does not outlive a test's time limit
	try {
		if (role == "peer")
			return peer_main(link, args);
		if (role == "holder")
			return holder_main(link, args);
		fail("unknown role " + role);
	} catch (const std::exception &e) {
		try {
			link.send(Msg().set("error", e.what()));
		} catch (...) {
		}
		fprintf(stderr, "xrc_test child %s: %s\n", role.c_str(), e.what());
		return 1;
	}
}

}  // namespace xrc_test
