// The peer process of traffic_errors (see peer.h) and the test's handle on it.
#include "peer.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

namespace xsrc_traffic {

namespace {

std::vector<std::string> split(const std::string &s, char sep)
{
	std::vector<std::string> out;
	std::stringstream in(s);
	for (std::string item; std::getline(in, item, sep);)
		if (!item.empty())
			out.push_back(item);
	return out;
}

template <typename T>
T at(const std::vector<T> &v, uint64_t i, const char *what)
{
	if (i >= v.size())
		fail(std::string("no ") + what + " " + std::to_string(i));
	return v[i];
}

void put_wcs(Msg &m, const std::vector<ibv_wc> &wcs)
{
	m.set("n", wcs.size());
	for (size_t i = 0; i < wcs.size(); ++i) {
		std::string s = std::to_string(i);
		m.set("wr_id" + s, wcs[i].wr_id).set("status" + s, static_cast<int>(wcs[i].status));
		m.set("opcode" + s, static_cast<int>(wcs[i].opcode)).set("len" + s, wcs[i].byte_len);
		m.set("flags" + s, wcs[i].wc_flags).set("qp_num" + s, wcs[i].qp_num);
		m.set("src_qp" + s, wcs[i].src_qp).set("imm" + s, wcs[i].imm_data);
	}
}

// The payload of SEND-hammer message `id` (see the Hammer test).
bool payload_ok(const uint8_t *p, uint32_t len, uint32_t *id)
{
	uint32_t a, b;
	memcpy(&a, p, 4);
	memcpy(&b, p + 4, 4);
	if (b != ~a)
		return false;
	for (uint32_t j = 8; j < len; ++j)
		if (p[j] != static_cast<uint8_t>(a * 7 + j))
			return false;
	*id = a;
	return true;
}

class Server {
public:
	Server(Link &link, int scratch_fd) : link_(link)
	{
		xsrc::unique_fd scratch(scratch_fd);  // mapped or not, closed when done here
		struct stat st{};
		if (fstat(scratch_fd, &st) == 0 && st.st_size > 0) {
			void *p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED,
				       scratch_fd, 0);
			if (p != MAP_FAILED) {
				scratch_ = static_cast<uint8_t *>(p);
				scratch_size_ = static_cast<size_t>(st.st_size);
			}
		}
	}

	int run()
	{
		for (;;) {
			auto m = link_.recv(120s);
			if (!m)
				return 2;  // the test is gone or silent
			std::string cmd = m->str("cmd", "");
			if (cmd == "stop")
				continue;  // for a sink that had already finished: no reply
			Msg reply;
			try {
				if (cmd == "exit") {
					std::string errors;
					for (ibv_mw *w : mws_)  // before their PDs go
						if (w && ibv_dealloc_mw(w))
							errors += "ibv_dealloc_mw ";
					errors += v_ ? v_->close() : "";
					v_.reset();
					reply.set("ok", 1).set("cleanup", errors);
					link_.send(reply);
					return errors.empty() ? 0 : 1;
				}
				reply = handle(cmd, *m);
				reply.set("ok", 1);
			} catch (const std::exception &e) {
				reply = Msg();
				reply.set("error", std::string(e.what()));
			}
			link_.send(reply);
		}
	}

private:
	Msg handle(const std::string &cmd, const Msg &m)
	{
		Msg r;
		if (cmd == "hello") {
			v_ = std::make_unique<Verbs>();
			int flags = fcntl(v_->ctx->async_fd, F_GETFL);
			check(flags >= 0 && fcntl(v_->ctx->async_fd, F_SETFL, flags | O_NONBLOCK) == 0,
			      "async fd O_NONBLOCK");
			pds_.push_back(v_->pd);
			r.set("gid", gid_hex(v_->gid)).set("mtu", v_->mtu_bytes).set("pid", getpid());
			return r;
		}
		if (!v_)
			fail("no hello yet");
		Verbs &v = *v_;
		if (cmd == "pd") {
			pds_.push_back(v.new_pd());
			return r.set("id", pds_.size() - 1);
		}
		if (cmd == "cq") {
			ibv_comp_channel *ch = m.u64("channel", 0) ? v.channel() : nullptr;
			ibv_cq *cq = v.cq(static_cast<int>(m.u64("cqe")), ch);
			cqs_.push_back(cq);
			channels_.push_back(ch);
			return r.set("id", cqs_.size() - 1).set("cqe", cq->cqe);
		}
		if (cmd == "srq") {
			ibv_srq *s = v.srq(static_cast<uint32_t>(m.u64("max_wr")), static_cast<uint32_t>(m.u64("max_sge", 1)),
					   at(pds_, m.u64("pd", 0), "pd"));
			srqs_.push_back(s);
			uint32_t srqn = 0;
			ibv_get_srq_num(s, &srqn);
			return r.set("id", srqs_.size() - 1).set("srqn", srqn);
		}
		if (cmd == "mr") {
			Buffer *b = v.buffer(m.u64("size"), static_cast<uint32_t>(m.u64("access")),
					     static_cast<uint8_t>(m.u64("fill", 0)), at(pds_, m.u64("pd", 0), "pd"),
					     m.u64("off", 0), m.u64("len", 0));
			mrs_.push_back(b);
			return r.set("id", mrs_.size() - 1).set("addr", b->addr()).set("rkey", b->rkey())
				.set("lkey", b->lkey()).set("len", b->mr->length);
		}
		if (cmd == "shm_mr") {  // a SysV shared memory segment filled with `fill`, all of it an MR
			Buffer *b = v.shm_buffer(m.u64("size"), static_cast<uint32_t>(m.u64("access")),
						 static_cast<uint8_t>(m.u64("fill", 0)));
			mrs_.push_back(b);
			return r.set("id", mrs_.size() - 1).set("addr", b->addr()).set("rkey", b->rkey())
				.set("lkey", b->lkey()).set("len", b->mr->length);
		}
		if (cmd == "dereg") {  // an MR, now (its memory stays)
			v.dereg(at(mrs_, m.u64("mr"), "mr"));
			return r;
		}
		if (cmd == "dm_mr") {  // device memory filled with `fill`, a zero-based MR on [off, off+len)
			Verbs::DevMem d = v.dev_mem(m.u64("size"), static_cast<uint32_t>(m.u64("access")),
						    static_cast<uint8_t>(m.u64("fill", 0)), m.u64("off", 0), m.u64("len", 0));
			dms_.push_back(d);
			return r.set("id", dms_.size() - 1).set("rkey", d.mr->rkey).set("len", d.mr->length);
		}
		if (cmd == "dm_check") {  // bytes of the DM that differ from `fill`
			Verbs::DevMem d = at(dms_, m.u64("dm"), "dm");
			std::vector<uint8_t> bytes(d.size);
			check_rc(ibv_memcpy_from_dm(bytes.data(), d.dm, 0, d.size), "ibv_memcpy_from_dm");
			size_t off = m.u64("off", 0), len = m.u64("len", d.size - off);
			auto fill = static_cast<uint8_t>(m.u64("fill"));
			return r.set("bad", std::count_if(bytes.begin() + off, bytes.begin() + off + len,
							  [fill](uint8_t b) { return b != fill; }));
		}
		if (cmd == "rereg") {  // ibv_rereg_mr; a new range is [off, off+len) of the same buffer
			Buffer *b = at(mrs_, m.u64("mr"), "mr");
			int flags = static_cast<int>(m.u64("flags"));
			void *addr = nullptr;
			size_t len = 0;
			if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
				addr = b->data + m.u64("off");
				len = m.u64("len");
			}
			ibv_pd *pd = (flags & IBV_REREG_MR_CHANGE_PD) ? at(pds_, m.u64("pd"), "pd") : nullptr;
			errno = 0;
			int rc = ibv_rereg_mr(b->mr, flags, pd, addr, len, static_cast<int>(m.u64("access", 0)));
			r.set("rc", rc).set("errno", rc ? errno : 0);
			if (!rc && (flags & IBV_REREG_MR_CHANGE_TRANSLATION))
				b->mr_off = m.u64("off");
			return r.set("rkey", b->rkey()).set("lkey", b->lkey()).set("addr", b->addr());
		}
		if (cmd == "mw") {  // ibv_alloc_mw; rc and errno when it is refused
			errno = 0;
			ibv_mw *w = ibv_alloc_mw(at(pds_, m.u64("pd", 0), "pd"), static_cast<ibv_mw_type>(m.u64("type")));
			if (!w)
				return r.set("rc", -1).set("errno", errno);
			mws_.push_back(w);
			return r.set("rc", 0).set("id", mws_.size() - 1).set("rkey", w->rkey);
		}
		if (cmd == "bind") {  // a window bound by ibv_bind_mw (type 1) or a BIND_MW work request
			ibv_mw *w = at(mws_, m.u64("mw"), "mw");
			ibv_qp *qp = at(qps_, m.u64("qp"), "qp");
			int64_t mr_id = m.i64("mr", -1);
			ibv_mw_bind_info info{};
			if (mr_id >= 0) {
				Buffer *b = at(mrs_, static_cast<uint64_t>(mr_id), "mr");
				info.mr = b->mr;
				info.addr = b->addr() + m.u64("off", 0);
			}
			info.length = m.u64("len", 0);
			info.mw_access_flags = static_cast<unsigned>(m.u64("access", 0));
			int rc;
			uint32_t rkey;
			if (w->type == IBV_MW_TYPE_1) {
				ibv_mw_bind bind{};
				bind.wr_id = m.u64("wr_id", 0);
				bind.send_flags = IBV_SEND_SIGNALED;
				bind.bind_info = info;
				rc = ibv_bind_mw(qp, w, &bind);
				rkey = w->rkey;
			} else {
				ibv_send_wr wr{}, *bad = nullptr;
				wr.wr_id = m.u64("wr_id", 0);
				wr.opcode = IBV_WR_BIND_MW;
				wr.send_flags = IBV_SEND_SIGNALED;
				wr.bind_mw.mw = w;
				rkey = static_cast<uint32_t>(m.u64("rkey", ibv_inc_rkey(w->rkey)));
				wr.bind_mw.rkey = rkey;
				wr.bind_mw.bind_info = info;
				rc = ibv_post_send(qp, &wr, &bad);
			}
			return r.set("rc", rc).set("rkey", rkey);
		}
		if (cmd == "local_inv") {
			ibv_send_wr wr{}, *bad = nullptr;
			wr.wr_id = m.u64("wr_id", 0);
			wr.opcode = IBV_WR_LOCAL_INV;
			wr.send_flags = IBV_SEND_SIGNALED;
			wr.invalidate_rkey = static_cast<uint32_t>(m.u64("rkey"));
			return r.set("rc", ibv_post_send(at(qps_, m.u64("qp"), "qp"), &wr, &bad));
		}
		if (cmd == "dealloc_mw") {
			uint64_t id = m.u64("mw");
			int rc = ibv_dealloc_mw(at(mws_, id, "mw"));
			if (!rc)
				mws_[id] = nullptr;
			return r.set("rc", rc);
		}
		if (cmd == "odp_mr") {
			Buffer *b = v.odp_buffer(m.u64("size"), static_cast<uint32_t>(m.u64("access")),
						 m.u64("implicit", 0) != 0, at(pds_, m.u64("pd", 0), "pd"));
			mrs_.push_back(b);
			return r.set("id", mrs_.size() - 1).set("addr", b->addr()).set("rkey", b->rkey())
				.set("lkey", b->lkey()).set("len", b->mr->length);
		}
		if (cmd == "unmap") {  // pages of an MR's buffer go away (the MR stays)
			Buffer *b = at(mrs_, m.u64("mr"), "mr");
			check(munmap(b->data + m.u64("off"), m.u64("len")) == 0, "munmap");
			return r;
		}
		if (cmd == "scratch_mr") {
			if (!scratch_)
				fail("no scratch memory");
			Buffer *b = v.wrap(scratch_, scratch_size_, static_cast<uint32_t>(m.u64("access")));
			mrs_.push_back(b);
			return r.set("id", mrs_.size() - 1).set("addr", b->addr()).set("rkey", b->rkey())
				.set("lkey", b->lkey());
		}
		if (cmd == "qp") {
			std::string type = m.str("type", "rc");
			ibv_cq *scq = at(cqs_, m.u64("cq"), "cq");
			ibv_cq *rcq = at(cqs_, m.u64("rcq", m.u64("cq")), "cq");
			int64_t srq = m.i64("srq", -1);
			QpCaps caps;
			caps.max_recv_wr = static_cast<uint32_t>(m.u64("max_recv_wr", 16));
			caps.max_send_wr = static_cast<uint32_t>(m.u64("max_send_wr", 16));
			ibv_qp *qp = v.qp(type == "ud" ? IBV_QPT_UD : IBV_QPT_RC, scq, rcq, caps,
					  srq >= 0 ? at(srqs_, static_cast<uint64_t>(srq), "srq") : nullptr);
			qps_.push_back(qp);
			return r.set("id", qps_.size() - 1).set("qpn", qp->qp_num);
		}
		if (cmd == "connect") {
			RcParams p;
			p.access = static_cast<uint32_t>(m.u64("access", kAllRemote));
			p.min_rnr_timer = static_cast<uint8_t>(m.u64("min_rnr_timer", kMinRnrTimer));
			p.rnr_retry = static_cast<uint8_t>(m.u64("rnr_retry", 7));
			p.retry_cnt = static_cast<uint8_t>(m.u64("retry_cnt", kRetryCnt));
			p.timeout = static_cast<uint8_t>(m.u64("timeout", kTimeout));
			rc_connect(at(qps_, m.u64("qp"), "qp"), static_cast<uint32_t>(m.u64("remote_qpn")),
				   gid_from_hex(m.str("gid")), p);
			return r;
		}
		if (cmd == "ud_up") {
			ud_connect(at(qps_, m.u64("qp"), "qp"), static_cast<uint32_t>(m.u64("qkey")));
			return r;
		}
		if (cmd == "post_recv") {
			Buffer *b = at(mrs_, m.u64("mr"), "mr");
			uint64_t off = m.u64("off", 0), len = m.u64("len"), count = m.u64("count", 1);
			uint64_t stride = m.u64("stride", len), wr_id = m.u64("wr_id", 0);
			uint32_t lkey = static_cast<uint32_t>(m.u64("lkey", b->lkey()));
			for (uint64_t i = 0; i < count; ++i) {
				uint64_t addr = reinterpret_cast<uintptr_t>(b->data) + off + i * stride;
				int rc = m.has("srq")
					? post_srq_recv(at(srqs_, m.u64("srq"), "srq"), wr_id + i, addr,
							static_cast<uint32_t>(len), lkey)
					: post_recv(at(qps_, m.u64("qp"), "qp"), wr_id + i, addr,
						    static_cast<uint32_t>(len), lkey);
				check_rc(rc, "post_recv #" + std::to_string(i));
			}
			return r;
		}
		if (cmd == "poll") {
			auto wcs = poll_completions(at(cqs_, m.u64("cq"), "cq"), m.u64("n", 1), ms(m.u64("timeout_ms", 1000)));
			put_wcs(r, wcs);
			return r;
		}
		if (cmd == "check") {
			Buffer *b = at(mrs_, m.u64("mr"), "mr");
			size_t first = 0;
			size_t bad = b->mismatches(m.u64("off", 0), m.u64("len", b->size),
						   static_cast<uint8_t>(m.u64("fill")), &first);
			r.set("bad", bad);
			if (bad)
				r.set("first", first).set("value", b->data[first]);
			return r;
		}
		if (cmd == "read64") {
			Buffer *b = at(mrs_, m.u64("mr"), "mr");
			uint64_t value;
			memcpy(&value, b->data + m.u64("off", 0), 8);
			return r.set("value", value);
		}
		if (cmd == "qp_state") {
			return r.set("state", static_cast<int>(qp_state(at(qps_, m.u64("qp"), "qp"))));
		}
		if (cmd == "arm") {
			check_rc(ibv_req_notify_cq(at(cqs_, m.u64("cq"), "cq"), static_cast<int>(m.u64("solicited", 0))),
				 "ibv_req_notify_cq");
			return r;
		}
		if (cmd == "wait_cq_event") {
			uint64_t id = m.u64("cq");
			ibv_comp_channel *ch = at(channels_, id, "cq");
			if (!ch)
				fail("cq without a channel");
			auto t0 = Clock::now();
			ibv_cq *got = wait_cq_event(ch, ms(m.u64("timeout_ms")));
			auto elapsed = std::chrono::duration_cast<ms>(Clock::now() - t0).count();
			return r.set("woke", got != nullptr).set("same_cq", got == cqs_[id]).set("elapsed_ms", elapsed);
		}
		if (cmd == "fork_holder") {
			// A child that inherits every fd (the command file too) and
			// outlives us: our context stays open after we die.
			pid_t child = fork();
			if (child == 0) {
				alarm(static_cast<unsigned>(m.u64("seconds", 20)));
				for (;;)
					pause();
			}
			check(child > 0, "fork");
			return r.set("pid", child);
		}
		if (cmd == "async_wait") {
			return async_wait(m);
		}
		if (cmd == "srq_sink") {
			return srq_sink(m);
		}
		if (cmd == "faa_hammer") {
			std::vector<ibv_qp *> qps;
			std::vector<ibv_cq *> cqs;
			for (auto &s : split(m.str("qps"), ','))
				qps.push_back(at(qps_, std::stoull(s), "qp"));
			for (auto &s : split(m.str("cqs"), ','))
				cqs.push_back(at(cqs_, std::stoull(s), "cq"));
			Buffer *res = at(mrs_, m.u64("result_mr"), "mr");
			HammerResult h = faa_hammer(qps, cqs, static_cast<int>(m.u64("threads")),
						    static_cast<int>(m.u64("k")), m.u64("raddr"),
						    static_cast<uint32_t>(m.u64("rkey")),
						    reinterpret_cast<uint64_t *>(res->mr_start()), res->lkey(),
						    ms(m.u64("timeout_ms", 60000)), static_cast<int>(m.u64("window", 16)),
						    static_cast<int>(m.u64("signal_every", 1)),
						    static_cast<int>(m.u64("words", 1)));
			return hammer_to_msg(h);
		}
		fail("unknown command '" + cmd + "'");
	}

	// Waits for an async event of `type`; others seen on the way are listed.
	Msg async_wait(const Msg &m)
	{
		Msg r;
		auto type = static_cast<ibv_event_type>(m.u64("type"));
		auto deadline = Clock::now() + ms(m.u64("timeout_ms"));
		std::string seen;
		for (;;) {
			ibv_async_event ev{};
			if (ibv_get_async_event(v_->ctx, &ev) == 0) {
				bool match = ev.event_type == type;
				seen += std::string(seen.empty() ? "" : ",") + ibv_event_type_str(ev.event_type);
				if (match && (type == IBV_EVENT_CQ_ERR) && m.has("cq"))
					r.set("cq_match", ev.element.cq == at(cqs_, m.u64("cq"), "cq"));
				ibv_ack_async_event(&ev);
				if (match)
					return r.set("got", 1).set("seen", seen);
				continue;
			}
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				fail("ibv_get_async_event");
			auto left = std::chrono::duration_cast<ms>(deadline - Clock::now()).count();
			if (left <= 0)
				return r.set("got", 0).set("seen", seen);
			pollfd p{v_->ctx->async_fd, POLLIN, 0};
			poll(&p, 1, static_cast<int>(left));
		}
	}

	// The receiving end of the SEND hammer: `slots` receives of `slot` bytes
	// (wr_id = slot index; UD: `head` bytes of GRH first) were posted on the SRQ; every completion is
	// checked, its message id recorded, its slot zeroed and re-posted, until
	// `expected` messages came or the test says "stop" (then `linger_ms`
	// more for stragglers), or the time is up.
	Msg srq_sink(const Msg &m)
	{
		ibv_cq *cq = at(cqs_, m.u64("cq"), "cq");
		ibv_srq *srq = at(srqs_, m.u64("srq"), "srq");
		Buffer *b = at(mrs_, m.u64("mr"), "mr");
		uint64_t slot = m.u64("slot"), slots = m.u64("slots"), expected = m.u64("expected");
		uint32_t msg_len = static_cast<uint32_t>(m.u64("msg_len"));
		uint32_t head = static_cast<uint32_t>(m.u64("head", 0));  // UD: the GRH before each message
		auto deadline = Clock::now() + ms(m.u64("timeout_ms"));
		std::vector<uint32_t> count(expected);
		uint64_t received = 0, bad_status = 0, bad_len = 0, bad_payload = 0, out_of_range = 0,
			 repost_fail = 0;
		std::string first_problem;
		auto problem = [&](const std::string &s) {
			if (first_problem.empty())
				first_problem = s;
		};
		std::optional<Clock::time_point> linger_until;
		for (;;) {
			ibv_wc wc[32];
			int n = ibv_poll_cq(cq, 32, wc);
			if (n < 0)
				fail("ibv_poll_cq");
			for (int i = 0; i < n; ++i) {
				++received;
				if (wc[i].status != IBV_WC_SUCCESS) {
					++bad_status;
					problem("recv " + status_str(wc[i].status));
					continue;  // its slot is not re-posted
				}
				if (wc[i].wr_id >= slots) {
					++out_of_range;
					problem("recv wr_id " + std::to_string(wc[i].wr_id));
					continue;
				}
				uint8_t *p = b->data + wc[i].wr_id * slot;
				uint32_t id = 0;
				if (wc[i].byte_len != msg_len + head) {
					++bad_len;
					problem("byte_len " + std::to_string(wc[i].byte_len));
				} else if (!payload_ok(p + head, msg_len, &id)) {
					++bad_payload;
					problem("bad payload in slot " + std::to_string(wc[i].wr_id));
				} else if (id >= expected) {
					++out_of_range;
					problem("message id " + std::to_string(id));
				} else {
					count[id]++;
				}
				memset(p, 0, slot);
				if (post_srq_recv(srq, wc[i].wr_id, reinterpret_cast<uintptr_t>(p),
						  static_cast<uint32_t>(slot), b->lkey()))
					++repost_fail;
			}
			if (received >= expected && !linger_until)
				linger_until = Clock::now() + ms(m.u64("linger_ms", 200));
			// "stop": the senders are done; what has not come by now is lost.
			if (n == 0 && !linger_until && link_.recv(0ms))
				linger_until = Clock::now() + ms(m.u64("linger_ms", 200));
			auto now = Clock::now();
			if ((linger_until && now >= *linger_until) || now >= deadline)
				break;
			if (n == 0)
				std::this_thread::sleep_for(100us);
		}
		uint64_t once = 0, dup = 0, missing = 0;
		std::string missing_ids;
		for (size_t id = 0; id < count.size(); ++id) {
			uint32_t c = count[id];
			if (c == 0 && ++missing <= 8)
				missing_ids += (missing_ids.empty() ? "" : ",") + std::to_string(id);
			if (c == 0)
				continue;
			else if (c == 1)
				++once;
			else
				++dup;
		}
		Msg r;
		r.set("received", received).set("once", once).set("dup", dup).set("missing", missing);
		r.set("bad_status", bad_status).set("bad_len", bad_len).set("bad_payload", bad_payload);
		r.set("out_of_range", out_of_range).set("repost_fail", repost_fail);
		r.set("first_problem", first_problem).set("missing_ids", missing_ids);
		// Async events that came meanwhile (a CQ overrun would show here).
		std::string events;
		ibv_async_event ev{};
		while (ibv_get_async_event(v_->ctx, &ev) == 0) {
			events += std::string(events.empty() ? "" : ",") + ibv_event_type_str(ev.event_type);
			ibv_ack_async_event(&ev);
		}
		r.set("async_events", events);
		return r;
	}

	Link &link_;
	uint8_t *scratch_ = nullptr;
	size_t scratch_size_ = 0;
	std::unique_ptr<Verbs> v_;
	std::vector<ibv_pd *> pds_;
	std::vector<ibv_cq *> cqs_;
	std::vector<ibv_comp_channel *> channels_;  // per CQ, null if none
	std::vector<ibv_srq *> srqs_;
	std::vector<Buffer *> mrs_;
	std::vector<Verbs::DevMem> dms_;
	std::vector<ibv_mw *> mws_;  // null once deallocated
	std::vector<ibv_qp *> qps_;
};

constexpr size_t kScratchBytes = 1 << 20;

}  // namespace

int peer_main(Link &link, int scratch_fd)
{
	alarm(110);  // never outlive a hung test (SIGALRM's default action)
	Server server(link, scratch_fd);
	return server.run();
}

// --- the test's side -----------------------------------------------------------

Peer::Peer()
{
	scratch_fd_.reset(memfd_create("traffic-errors-scratch", MFD_CLOEXEC));
	check(static_cast<bool>(scratch_fd_), "memfd_create");
	check(ftruncate(scratch_fd_.get(), kScratchBytes) == 0, "ftruncate");
	void *p = mmap(nullptr, kScratchBytes, PROT_READ | PROT_WRITE, MAP_SHARED, scratch_fd_.get(), 0);
	check(p != MAP_FAILED, "mmap scratch");
	scratch = static_cast<uint64_t *>(p);
	scratch_size = kScratchBytes;

	child_ = xsrc::harness::Child::spawn("--peer", {std::to_string(scratch_fd_.get())}, {scratch_fd_.get()});
	Msg hello = call(Msg("hello"), 20s);
	gid = gid_from_hex(hello.str("gid"));
	mtu_bytes = static_cast<uint32_t>(hello.u64("mtu"));
}

Peer::~Peer()
{
	kill();
	if (scratch)
		munmap(scratch, scratch_size);
}

void Peer::send(const Msg &m)
{
	if (!alive())
		fail("peer is not running");
	child_.link().send(m);
}

Msg Peer::reply(ms timeout)
{
	auto r = child_.link().recv(timeout);
	if (!r)
		fail("no reply from the peer within " + std::to_string(timeout.count()) + " ms");
	if (r->has("error"))
		fail("peer: " + r->str("error"));
	return *r;
}

Msg Peer::call(const Msg &m, ms timeout)
{
	send(m);
	try {
		return reply(timeout);
	} catch (const std::exception &e) {
		fail(std::string(e.what()) + " [cmd " + m.str("cmd", "?") + "]");
	}
}

void Peer::kill()
{
	child_.kill();
}

std::string Peer::finish(bool *exited_ok)
{
	if (exited_ok)
		*exited_ok = false;
	if (!alive())
		return "peer not running";
	std::string cleanup;
	try {
		send(Msg("exit"));
		// Skip the replies of commands a failed test never collected.
		auto deadline = Clock::now() + 20s;
		for (;;) {
			auto left = std::chrono::duration_cast<ms>(deadline - Clock::now());
			auto r = child_.link().recv(std::max(left, 0ms));
			if (!r) {
				cleanup = "no reply to exit";
				break;
			}
			if (r->has("cleanup")) {
				cleanup = r->str("cleanup");
				break;
			}
		}
	} catch (const std::exception &e) {
		cleanup = e.what();
	}
	// It exits right after replying; give it a moment, then kill.
	auto status = child_.wait(2s);
	if (!status) {
		kill();
		return cleanup.empty() ? "peer did not exit" : cleanup;
	}
	if (exited_ok)
		*exited_ok = WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
	return cleanup;
}

}  // namespace xsrc_traffic
