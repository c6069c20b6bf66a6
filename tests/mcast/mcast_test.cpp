// UD multicast on the device, between two processes: a sender and receivers
// attached to a group (some in the sender's process, some in a child), with
// ibv_attach_mcast / ibv_detach_mcast through the stock libibverbs.
//   mcast_test [gtest flags]            the tests
//   mcast_test --receiver LINK_FD DEV   the child (harness/child.h)
#include <infiniband/verbs.h>
#include <signal.h>
#include <grp.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_test_util.h"
#include "harness/arena.h"
#include "harness/child.h"
#include "harness/completions.h"
#include "harness/qp_connect.h"
#include "xsrc-queues.h"

namespace {

using namespace std::chrono_literals;
using xsrc::harness::Child;
using xsrc::harness::Link;
using xsrc::harness::Msg;

constexpr uint32_t kQkey = 0x01234567;  // RDMA_UDP_QKEY, what rdma_cm gives a UDP id
constexpr uint32_t kGrhBytes = 40;
constexpr uint32_t kRecvBytes = 2048;
constexpr uint32_t kRecvs = 16;

// ::ffff:239.1.2.3 (an IPv4 group as RoCE v2 names it) and ff0e::1234.
const ibv_gid kGroupV4 = {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3}};
const ibv_gid kGroupV6 = {{0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34}};

std::string gid_hex(const ibv_gid &g)
{
	char out[33];
	for (int i = 0; i < 16; ++i)
		snprintf(out + 2 * i, 3, "%02x", g.raw[i]);
	return out;
}

ibv_gid gid_from_hex(const std::string &hex)
{
	ibv_gid g{};
	for (int i = 0; i < 16 && size_t(2 * i + 1) < hex.size(); ++i)
		g.raw[i] = uint8_t(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
	return g;
}

void check(bool ok, const std::string &what)
{
	if (!ok)
		throw std::runtime_error(what + ": " + strerror(errno));
}

// A UD QP with its own CQ and receive buffers.
struct UdQp {
	ibv_cq *cq = nullptr;
	ibv_qp *qp = nullptr;
	std::vector<unsigned char> buf;
	ibv_mr *mr = nullptr;
	uint64_t next_recv = 0;
};

// One verbs context on the device and the QPs a test makes on it.
class Node {
public:
	explicit Node(const std::string &device)
	{
		ctx_ = xsrc_test::open_device(device);
		check(ctx_ != nullptr, "open " + device);
		pd_ = ibv_alloc_pd(ctx_);
		check(pd_ != nullptr, "alloc_pd");
		check(ibv_query_gid(ctx_, 1, 1, &gid_) == 0, "query_gid");
		send_mr_ = ibv_reg_mr(pd_, send_buf_.data(), send_buf_.size(), 0);
		check(send_mr_ != nullptr, "reg_mr (send)");
	}
	~Node()
	{
		for (auto &q : qps_) {
			if (q->qp) {
				for (const ibv_gid &g : {kGroupV4, kGroupV6})
					ibv_detach_mcast(q->qp, &g, 0);
				ibv_destroy_qp(q->qp);
			}
			if (q->mr)
				ibv_dereg_mr(q->mr);
			if (q->cq)
				ibv_destroy_cq(q->cq);
		}
		if (ah_)
			ibv_destroy_ah(ah_);
		if (send_mr_)
			ibv_dereg_mr(send_mr_);
		if (pd_)
			ibv_dealloc_pd(pd_);
		if (ctx_)
			ibv_close_device(ctx_);
	}
	Node(const Node &) = delete;
	Node &operator=(const Node &) = delete;

	ibv_context *ctx() const { return ctx_; }
	const ibv_gid &gid() const { return gid_; }

	// A UD QP at RTS with Q_Key `qkey` and `recvs` receives posted; its index.
	size_t ud_qp(uint32_t qkey, uint32_t recvs, ibv_qp_type type = IBV_QPT_UD)
	{
		auto q = std::make_unique<UdQp>();
		q->cq = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
		check(q->cq != nullptr, "create_cq");
		ibv_qp_init_attr init{};
		init.send_cq = init.recv_cq = q->cq;
		init.qp_type = type;
		init.cap = {32, kRecvs, 1, 1, 0};
		q->qp = ibv_create_qp(pd_, &init);
		check(q->qp != nullptr, "create_qp");
		q->buf.assign(size_t(kRecvs) * kRecvBytes, 0);
		q->mr = ibv_reg_mr(pd_, q->buf.data(), q->buf.size(), IBV_ACCESS_LOCAL_WRITE);
		check(q->mr != nullptr, "reg_mr");
		xsrc::harness::QpConnectAttrs a;
		a.qkey = qkey;
		xsrc::harness::QpRemote self{q->qp->qp_num, gid_};
		if (xsrc::harness::QpStep s = xsrc::harness::qp_connect(q->qp, self, a))
			throw std::runtime_error("qp_connect: " + s.text());
		qps_.push_back(std::move(q));
		post_recvs(qps_.size() - 1, recvs);
		return qps_.size() - 1;
	}

	void post_recvs(size_t i, uint32_t n)
	{
		UdQp &q = *qps_.at(i);
		for (uint32_t k = 0; k < n; ++k, ++q.next_recv) {
			uint64_t slot = q.next_recv % kRecvs;
			ibv_sge sge{reinterpret_cast<uintptr_t>(q.buf.data() + slot * kRecvBytes), kRecvBytes, q.mr->lkey};
			ibv_recv_wr wr{}, *bad = nullptr;
			wr.wr_id = slot;
			wr.sg_list = &sge;
			wr.num_sge = 1;
			check(ibv_post_recv(q.qp, &wr, &bad) == 0, "post_recv");
		}
	}

	ibv_qp *qp(size_t i) const { return qps_.at(i)->qp; }
	int attach(size_t i, const ibv_gid &g) { return ibv_attach_mcast(qp(i), &g, 0); }
	int detach(size_t i, const ibv_gid &g) { return ibv_detach_mcast(qp(i), &g, 0); }
	int destroy(size_t i)
	{
		int err = ibv_destroy_qp(qps_.at(i)->qp);
		if (!err)
			qps_.at(i)->qp = nullptr;
		return err;
	}

	// Sends `count` datagrams of `len` bytes (the first 4: their number, from
	// `first`) from QP `i` to `group`; each send completion's status.
	std::vector<ibv_wc_status> send(size_t i, const ibv_gid &group, uint32_t count, uint32_t first = 0,
					uint32_t len = 64, uint32_t qkey = kQkey, uint32_t qpn = XSRC_MCAST_QPN)
	{
		if (!ah_) {
			ibv_ah_attr attr = xsrc::harness::grh_ah_attr(group);
			ah_ = ibv_create_ah(pd_, &attr);
			ah_group_ = group;
			check(ah_ != nullptr, "create_ah");
		}
		check(std::memcmp(&ah_group_, &group, sizeof(group)) == 0, "one group per sender node");
		UdQp &q = *qps_.at(i);
		std::vector<ibv_wc_status> out;
		for (uint32_t n = 0; n < count; ++n) {
			uint32_t seq = first + n;
			std::memset(send_buf_.data(), 0xa5, send_buf_.size());
			std::memcpy(send_buf_.data(), &seq, sizeof(seq));
			ibv_sge sge{reinterpret_cast<uintptr_t>(send_buf_.data()), len, send_mr_->lkey};
			ibv_send_wr wr{}, *bad = nullptr;
			wr.wr_id = seq;
			wr.sg_list = &sge;
			wr.num_sge = 1;
			wr.opcode = IBV_WR_SEND;
			wr.send_flags = IBV_SEND_SIGNALED;
			wr.wr.ud = {ah_, qpn, qkey};
			check(ibv_post_send(q.qp, &wr, &bad) == 0, "post_send");
			auto wc = xsrc::harness::poll_completions(q.cq, 1, 5s);
			out.push_back(wc.empty() ? IBV_WC_GENERAL_ERR : wc[0].status);
		}
		return out;
	}

	// What QP `i` received within `timeout`: "seq,byte_len,src_qp,flags,dgid;" per datagram.
	std::string received(size_t i, size_t max, std::chrono::milliseconds timeout)
	{
		UdQp &q = *qps_.at(i);
		std::string out;
		for (const ibv_wc &wc : xsrc::harness::poll_completions(q.cq, max, timeout)) {
			if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) {
				out += "status" + std::to_string(wc.status) + ";";
				continue;
			}
			const unsigned char *slot = q.buf.data() + wc.wr_id * kRecvBytes;
			ibv_grh grh;
			std::memcpy(&grh, slot, sizeof(grh));
			uint32_t seq;
			std::memcpy(&seq, slot + kGrhBytes, sizeof(seq));
			out += std::to_string(seq) + "," + std::to_string(wc.byte_len) + "," + std::to_string(wc.src_qp) +
			       "," + ((wc.wc_flags & IBV_WC_GRH) ? "grh" : "nogrh") + "," + gid_hex(grh.dgid) + "," +
			       gid_hex(grh.sgid) + ";";
		}
		return out;
	}

private:
	ibv_context *ctx_ = nullptr;
	ibv_pd *pd_ = nullptr;
	ibv_gid gid_{};
	ibv_ah *ah_ = nullptr;
	ibv_gid ah_group_{};
	std::vector<unsigned char> send_buf_ = std::vector<unsigned char>(kRecvBytes);
	ibv_mr *send_mr_ = nullptr;
	std::vector<std::unique_ptr<UdQp>> qps_;
};

// The child: a Node driven by messages until "exit" or the link closes.
int receiver_main(Link &link, const std::string &device)
{
	try {
		Node node(device);
		for (;;) {
			std::optional<Msg> m = link.recv(xsrc::harness::kForever);
			if (!m || m->str("cmd") == "exit")
				return 0;
			const std::string cmd = m->str("cmd");
			Msg reply("ok");
			try {
				if (cmd == "qp") {
					size_t i = node.ud_qp(uint32_t(m->u64("qkey")), uint32_t(m->u64("recvs")),
							      ibv_qp_type(m->u64("type", IBV_QPT_UD)));
					reply.set("id", i).set("qpn", node.qp(i)->qp_num);
				} else if (cmd == "attach") {
					reply.set("err", node.attach(m->u64("qp"), gid_from_hex(m->str("gid"))));
				} else if (cmd == "detach") {
					reply.set("err", node.detach(m->u64("qp"), gid_from_hex(m->str("gid"))));
				} else if (cmd == "churn") {  // attach and detach, again and again
					size_t q = m->u64("qp");
					ibv_gid g = gid_from_hex(m->str("gid"));
					uint64_t failed = 0, n = m->u64("n");
					for (uint64_t k = 0; k < n; ++k)
						failed += (node.attach(q, g) != 0) + (node.detach(q, g) != 0);
					reply.set("failed", failed);
				} else if (cmd == "send") {
					std::string codes;
					for (ibv_wc_status st : node.send(m->u64("qp"), gid_from_hex(m->str("gid")),
									  uint32_t(m->u64("count")), uint32_t(m->u64("first"))))
						codes += std::to_string(st) + ",";
					reply.set("statuses", codes);
				} else if (cmd == "recv") {
					node.post_recvs(m->u64("qp"), uint32_t(m->u64("n")));
				} else if (cmd == "received") {
					reply.set("got", node.received(m->u64("qp"), m->u64("max"),
								       std::chrono::milliseconds(m->u64("ms"))));
				} else {
					reply.set("error", "unknown command " + cmd);
				}
			} catch (const std::exception &e) {
				reply.set("error", e.what());
			}
			link.send(reply);
		}
	} catch (const std::exception &e) {
		fprintf(stderr, "mcast receiver: %s\n", e.what());
		return 1;
	}
}

// The child as the tests talk to it.
class Receiver {
public:
	explicit Receiver(const std::string &device) : child_(Child::spawn("--receiver", {device})) {}
	explicit Receiver(Child child) : child_(std::move(child)) {}
	~Receiver()
	{
		if (child_.running()) {
			try {
				child_.link().send(Msg("exit"));
			} catch (...) {
			}
			child_.wait(5s);
		}
	}
	Msg call(const Msg &m)
	{
		start(m);
		return finish(m.str("cmd"));
	}
	// A command whose reply is read later (finish), while this process works.
	void start(const Msg &m) { child_.link().send(m); }
	bool done() { return child_.link().readable(); }
	Msg finish(const std::string &cmd) { return child_.link().expect(30s, cmd); }
	size_t qp(uint32_t qkey, uint32_t recvs, uint32_t *qpn = nullptr)
	{
		Msg r = call(Msg("qp").set("qkey", qkey).set("recvs", recvs));
		if (qpn)
			*qpn = uint32_t(r.u64("qpn"));
		return r.u64("id");
	}
	int attach(size_t qp, const ibv_gid &g)
	{
		return int(call(Msg("attach").set("qp", qp).set("gid", gid_hex(g))).i64("err"));
	}
	int detach(size_t qp, const ibv_gid &g)
	{
		return int(call(Msg("detach").set("qp", qp).set("gid", gid_hex(g))).i64("err"));
	}
	void post_recvs(size_t qp, uint32_t n) { call(Msg("recv").set("qp", qp).set("n", n)); }
	// The send completions' statuses, "0,0,...," for successes.
	std::string send(size_t qp, const ibv_gid &g, uint32_t count, uint32_t first)
	{
		return call(Msg("send").set("qp", qp).set("gid", gid_hex(g)).set("count", count).set("first", first))
			.str("statuses");
	}
	std::string received(size_t qp, size_t max, std::chrono::milliseconds timeout)
	{
		return call(Msg("received").set("qp", qp).set("max", max).set("ms", timeout.count())).str("got");
	}
	Child &child() { return child_; }

private:
	Child child_;
};

// What a member gets for datagrams [first, first + count) of `len` bytes
// from `sender` to `group`.
std::string expected(uint32_t first, uint32_t count, uint32_t len, uint32_t sender, const ibv_gid &group,
		     const ibv_gid &sgid)
{
	std::string out;
	for (uint32_t n = first; n < first + count; ++n)
		out += std::to_string(n) + "," + std::to_string(len + kGrhBytes) + "," + std::to_string(sender) +
		       ",grh," + gid_hex(group) + "," + gid_hex(sgid) + ";";
	return out;
}

// The groups in use in the device's multicast table (read from its arena file).
int groups_in_use(const std::string &device)
{
	xsrc::harness::MappedArena arena(device, false);
	if (!arena.ok() || !arena.header().mcast_table_off)
		return -1;
	auto *table = arena.at<const xsrc_mcast_table>(arena.header().mcast_table_off);
	auto *groups = reinterpret_cast<const xsrc_mcast_group *>(table + 1);
	int n = 0;
	for (uint32_t i = 0; i < XSRC_MCAST_GROUPS; ++i)
		n += groups[i].num_qps != 0;
	return n;
}

const std::string &device() 
{
	static const std::string name = xsrc_test::test_device();
	return name;
}

// A sender and members in two processes: each member gets each datagram
// once, with the GRH naming the group; a QP not attached, a member with
// another Q_Key and the sending QP itself (a member too) get nothing; the
// sender's completions are successes.
TEST(Mcast, EveryMemberGetsEachDatagramOnce)
{
	Node me(device());
	Receiver peer(device());
	size_t sender = me.ud_qp(kQkey, kRecvs);
	size_t local_member = me.ud_qp(kQkey, kRecvs);  // in the sender's own process
	uint32_t b_qpn, c_qpn;
	size_t b = peer.qp(kQkey, kRecvs, &b_qpn), c = peer.qp(kQkey, kRecvs, &c_qpn);
	size_t not_attached = peer.qp(kQkey, kRecvs);
	size_t wrong_qkey = peer.qp(kQkey + 1, kRecvs);
	ASSERT_EQ(me.attach(sender, kGroupV4), 0);
	ASSERT_EQ(me.attach(local_member, kGroupV4), 0);
	ASSERT_EQ(peer.attach(b, kGroupV4), 0);
	ASSERT_EQ(peer.attach(c, kGroupV4), 0);
	ASSERT_EQ(peer.attach(wrong_qkey, kGroupV4), 0);
	ASSERT_EQ(peer.attach(b, kGroupV6), 0);  // and a second group, of b alone

	constexpr uint32_t kCount = 5, kLen = 100;
	for (ibv_wc_status st : me.send(sender, kGroupV4, kCount, 0, kLen))
		EXPECT_EQ(st, IBV_WC_SUCCESS) << ibv_wc_status_str(st);
	uint32_t sqpn = me.qp(sender)->qp_num;
	std::string want = expected(0, kCount, kLen, sqpn, kGroupV4, me.gid());
	EXPECT_EQ(me.received(local_member, kCount + 1, 2s), want);
	EXPECT_EQ(peer.received(b, kCount + 1, 2s), want);
	EXPECT_EQ(peer.received(c, kCount + 1, 2s), want);
	EXPECT_EQ(peer.received(not_attached, 1, 100ms), "");
	EXPECT_EQ(peer.received(wrong_qkey, 1, 100ms), "") << "a Q_Key violation was delivered";
	EXPECT_EQ(me.received(sender, 1, 100ms), "") << "the sender heard its own datagram";

	// The IPv6 group reaches b only.
	Node me6(device());
	size_t sender6 = me6.ud_qp(kQkey, 0);
	for (ibv_wc_status st : me6.send(sender6, kGroupV6, 2, 100, kLen))
		EXPECT_EQ(st, IBV_WC_SUCCESS) << ibv_wc_status_str(st);
	EXPECT_EQ(peer.received(b, 3, 2s), expected(100, 2, kLen, me6.qp(sender6)->qp_num, kGroupV6, me6.gid()));
	EXPECT_EQ(peer.received(c, 1, 100ms), "");
	EXPECT_EQ(me.received(local_member, 1, 100ms), "");

	// A multicast GID with a unicast QPN (a member's): nobody gets it, the
	// send still completes.
	for (ibv_wc_status st : me6.send(sender6, kGroupV6, 1, 200, kLen, kQkey, b_qpn))
		EXPECT_EQ(st, IBV_WC_SUCCESS) << ibv_wc_status_str(st);
	EXPECT_EQ(peer.received(b, 1, 200ms), "");
}

// Detaching stops delivery; a member without a posted receive drops its copy
// and the others still get theirs; nobody attached: the send still succeeds.
TEST(Mcast, DetachAndMissingReceives)
{
	Node me(device());
	Receiver peer(device());
	size_t sender = me.ud_qp(kQkey, 0);
	size_t b = peer.qp(kQkey, kRecvs), empty = peer.qp(kQkey, 0);
	ASSERT_EQ(peer.attach(b, kGroupV4), 0);
	ASSERT_EQ(peer.attach(empty, kGroupV4), 0);
	uint32_t sqpn = me.qp(sender)->qp_num;

	for (ibv_wc_status st : me.send(sender, kGroupV4, 3, 0))
		EXPECT_EQ(st, IBV_WC_SUCCESS) << ibv_wc_status_str(st);
	EXPECT_EQ(peer.received(b, 4, 2s), expected(0, 3, 64, sqpn, kGroupV4, me.gid()));
	EXPECT_EQ(peer.received(empty, 1, 100ms), "");
	peer.post_recvs(empty, 4);
	EXPECT_EQ(peer.received(empty, 1, 100ms), "") << "dropped datagrams are not kept for later";
	for (ibv_wc_status st : me.send(sender, kGroupV4, 1, 10))
		EXPECT_EQ(st, IBV_WC_SUCCESS);
	EXPECT_EQ(peer.received(empty, 2, 2s), expected(10, 1, 64, sqpn, kGroupV4, me.gid()));
	EXPECT_EQ(peer.received(b, 2, 2s), expected(10, 1, 64, sqpn, kGroupV4, me.gid()));

	ASSERT_EQ(peer.detach(b, kGroupV4), 0);
	for (ibv_wc_status st : me.send(sender, kGroupV4, 1, 20))
		EXPECT_EQ(st, IBV_WC_SUCCESS);
	EXPECT_EQ(peer.received(b, 1, 200ms), "") << "delivered after detach";
	EXPECT_EQ(peer.received(empty, 2, 2s), expected(20, 1, 64, sqpn, kGroupV4, me.gid()));

	ASSERT_EQ(peer.detach(empty, kGroupV4), 0);
	for (ibv_wc_status st : me.send(sender, kGroupV4, 2, 30))
		EXPECT_EQ(st, IBV_WC_SUCCESS) << "a group with no members";
	EXPECT_EQ(peer.received(empty, 1, 200ms), "");
}

// A sender of another user (which may not write into a member's memory
// itself: the device moves the bytes, XSRC_CMD_COPY) reaches members of both
// users, each once.
TEST(Mcast, ReachesMembersOfAnotherUser)
{
	if (getuid() != 0)
		GTEST_SKIP() << "needs root, to run the other side as uid 65534";
	constexpr uid_t kNobody = 65534;
	// Forked before this process opens the device.
	Receiver nobody(Child::run([](Link &link) {
		if (setgroups(0, nullptr) || setresgid(kNobody, kNobody, kNobody) || setresuid(kNobody, kNobody, kNobody))
			return 3;
		return receiver_main(link, device());
	}));
	Node me(device());
	size_t root_member = me.ud_qp(kQkey, kRecvs);
	ASSERT_EQ(me.attach(root_member, kGroupV4), 0);
	uint32_t sqpn;
	size_t sender = nobody.qp(kQkey, 0, &sqpn);
	size_t own_member = nobody.qp(kQkey, kRecvs);
	ASSERT_EQ(nobody.attach(own_member, kGroupV4), 0);
	ASSERT_EQ(nobody.send(sender, kGroupV4, 3, 0), "0,0,0,");
	ibv_gid sgid = me.gid();  // the same port's GID
	EXPECT_EQ(me.received(root_member, 4, 2s), expected(0, 3, 64, sqpn, kGroupV4, sgid));
	EXPECT_EQ(nobody.received(own_member, 4, 2s), expected(0, 3, 64, sqpn, kGroupV4, sgid));
}

// Members come and go while a sender sends: the daemon rewrites the group's
// entry under its sequence lock each time, and a member that stays attached
// still gets every datagram exactly once, in order.
TEST(Mcast, MembershipChurnLosesNothingForStableMembers)
{
	Node me(device());
	Receiver peer(device());
	size_t sender = me.ud_qp(kQkey, 0);
	size_t stable = me.ud_qp(kQkey, kRecvs);
	ASSERT_EQ(me.attach(stable, kGroupV6), 0);
	size_t churning = peer.qp(kQkey, kRecvs);
	uint32_t sqpn = me.qp(sender)->qp_num;
	constexpr uint32_t kBatch = kRecvs / 2;
	constexpr int kMinBatches = 50;
	peer.start(Msg("churn").set("qp", churning).set("gid", gid_hex(kGroupV6)).set("n", 3000));
	uint32_t sent = 0;
	for (int batch = 0; batch < kMinBatches || !peer.done(); ++batch) {
		for (ibv_wc_status st : me.send(sender, kGroupV6, kBatch, sent))
			ASSERT_EQ(st, IBV_WC_SUCCESS) << ibv_wc_status_str(st);
		ASSERT_EQ(me.received(stable, kBatch, 2s), expected(sent, kBatch, 64, sqpn, kGroupV6, me.gid()))
			<< "batch " << batch;
		me.post_recvs(stable, kBatch);
		sent += kBatch;
	}
	EXPECT_EQ(peer.finish("churn").u64("failed"), 0u);
	EXPECT_EQ(me.received(stable, 1, 100ms), "") << "a datagram twice";
	RecordProperty("datagrams", int(sent));
}

// What the kernel answers: EINVAL for an RC QP, a non-multicast GID or a
// detach from a group the QP is not in; 0 for a second attach; EBUSY for
// destroying an attached QP; ENOMEM past a limit, which ibv_query_device
// advertises.
TEST(Mcast, ErrorsAndLimits)
{
	Node me(device());
	size_t ud = me.ud_qp(kQkey, 0);
	size_t rc = me.ud_qp(0, 0, IBV_QPT_RC);
	EXPECT_EQ(me.attach(rc, kGroupV4), EINVAL);
	const ibv_gid unicast = {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 99, 0, 1}};
	EXPECT_EQ(me.attach(ud, unicast), EINVAL);
	EXPECT_EQ(me.attach(ud, me.gid()), EINVAL) << "the port's own GID";
	EXPECT_EQ(me.detach(ud, kGroupV4), EINVAL);
	EXPECT_EQ(me.attach(ud, kGroupV4), 0);
	EXPECT_EQ(me.attach(ud, kGroupV4), 0) << "attaching twice";
	EXPECT_EQ(me.destroy(ud), EBUSY);
	EXPECT_EQ(me.detach(ud, kGroupV4), 0);
	EXPECT_EQ(me.detach(ud, kGroupV4), EINVAL);
	EXPECT_EQ(me.destroy(ud), 0);

	ibv_device_attr attr{};
	ASSERT_EQ(ibv_query_device(me.ctx(), &attr), 0);
	EXPECT_EQ(attr.max_mcast_grp, XSRC_MCAST_GROUPS);
	EXPECT_EQ(attr.max_mcast_qp_attach, XSRC_MCAST_GROUP_QPS);
	EXPECT_GT(attr.max_total_mcast_qp_attach, attr.max_mcast_qp_attach);
	std::vector<size_t> qps;
	for (int i = 0; i <= attr.max_mcast_qp_attach; ++i)
		qps.push_back(me.ud_qp(kQkey, 0));
	for (int i = 0; i < attr.max_mcast_qp_attach; ++i)
		ASSERT_EQ(me.attach(qps[i], kGroupV6), 0) << i;
	EXPECT_EQ(me.attach(qps.back(), kGroupV6), ENOMEM) << "max_mcast_qp_attach + 1";
	ASSERT_EQ(me.detach(qps[0], kGroupV6), 0);
	EXPECT_EQ(me.attach(qps.back(), kGroupV6), 0);
}

// A process that dies leaves its groups: the device's table empties and its
// objects go; the survivors' sends still succeed.
TEST(Mcast, ProcessDeathLeavesTheGroups)
{
	xsrc_test::PrivateDevice pdev("xsrcmc0");
	ASSERT_TRUE(pdev.up()) << pdev.output();
	ASSERT_EQ(groups_in_use(pdev.name()), 0);
	{
		Receiver peer(pdev.name());
		for (int i = 0; i < 3; ++i) {
			size_t q = peer.qp(kQkey, kRecvs);
			ASSERT_EQ(peer.attach(q, kGroupV4), 0);
			ASSERT_EQ(peer.attach(q, kGroupV6), 0);
		}
		EXPECT_EQ(groups_in_use(pdev.name()), 2);
		EXPECT_GT(xsrc::harness::device_objects(pdev.name()), 0);
		peer.child().kill();
	}
	EXPECT_TRUE(xsrc_test::wait_until(5s, [&] { return groups_in_use(pdev.name()) == 0; }))
		<< groups_in_use(pdev.name()) << " groups left";
	EXPECT_TRUE(xsrc_test::wait_until(5s, [&] { return xsrc::harness::device_objects(pdev.name()) == 0; }))
		<< xsrc::harness::device_objects(pdev.name()) << " objects left";

	Node me(pdev.name());
	size_t sender = me.ud_qp(kQkey, 0);
	for (ibv_wc_status st : me.send(sender, kGroupV4, 2))
		EXPECT_EQ(st, IBV_WC_SUCCESS);
	// A destroyed QP has left too (after its detach).
	size_t q = me.ud_qp(kQkey, 0);
	ASSERT_EQ(me.attach(q, kGroupV6), 0);
	EXPECT_EQ(groups_in_use(pdev.name()), 1);
	ASSERT_EQ(me.detach(q, kGroupV6), 0);
	ASSERT_EQ(me.destroy(q), 0);
	EXPECT_EQ(groups_in_use(pdev.name()), 0);
}

// A provider or daemon older than revision 3 (the compat tests set
// XSRC_EXPECT_NO_MCAST=1, and XSRC_EXPECT_ABI_REVISION for the daemon's
// revision): ibv_attach_mcast is EOPNOTSUPP, and a daemon that predates
// multicast advertises none.
TEST(Mcast, AbsentBeforeRevision3)
{
	if (xsrc_test::env_or("XSRC_EXPECT_NO_MCAST", "") != "1")
		GTEST_SKIP() << "for the compat tests (XSRC_EXPECT_NO_MCAST=1)";
	Node me(device());
	size_t ud = me.ud_qp(kQkey, kRecvs);
	EXPECT_EQ(me.attach(ud, kGroupV4), EOPNOTSUPP);
	EXPECT_EQ(me.detach(ud, kGroupV4), EOPNOTSUPP);
	if (std::stoul(xsrc_test::env_or("XSRC_EXPECT_ABI_REVISION", "3")) < 3) {
		ibv_device_attr attr{};
		ASSERT_EQ(ibv_query_device(me.ctx(), &attr), 0);
		EXPECT_EQ(attr.max_mcast_grp, 0);
		EXPECT_EQ(attr.max_mcast_qp_attach, 0);
		EXPECT_EQ(attr.max_total_mcast_qp_attach, 0);
	}
	for (ibv_wc_status st : me.send(ud, kGroupV4, 1))
		EXPECT_EQ(st, IBV_WC_SUCCESS) << "a send to a group nobody can join";
	EXPECT_EQ(me.received(ud, 1, 100ms), "");
}

}  // namespace

int main(int argc, char **argv)
{
	if (auto child = xsrc::harness::child_args(argc, argv, "--receiver"))
		return child->args.size() == 1 ? receiver_main(child->link, child->args[0]) : 2;
	::testing::InitGoogleTest(&argc, argv);
	return RUN_ALL_TESTS();
}
