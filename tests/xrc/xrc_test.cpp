// XRC between processes on xsrc0, through the stock libibverbs: domains
// shared by file (per device, bound to the file's inode), receive QPs opened
// by number and their lifetime, routing by remote SRQ number, RDMA and
// atomics to the SRQ owner's memory, the errors of a bad SRQ number, events
// of an XRC SRQ, cleanup after a killed opener, and the ibv_wr_* API. The test process is "A" (it owns the XRC domain, SRQs and
// receive QPs unless said otherwise); "B" is this binary re-exec'd as a
// command-serving peer (xrc_peer.cpp) that holds the XRC send QPs. Every
// wait is bounded.
#include <gtest/gtest.h>
#include <endian.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <xsrc-queues.h>

#include "device_test_util.h"
#include "xrc_peer.h"
#include "xrc_util.h"

using namespace xrc_test;

namespace {

// A file to name an XRC domain by; removed afterwards.
struct TempFile {
	std::string path;
	xsrc::unique_fd file;
	TempFile()
	{
		char p[] = "/tmp/xrc_test_XXXXXX";
		file.reset(mkstemp(p));
		if (!file)
			fail("mkstemp: " + errno_text(errno));
		path = p;
	}
	~TempFile()
	{
		file.reset();
		unlink(path.c_str());
	}
	int fd() const { return file.get(); }
};

// B: the peer process.
class Peer {
public:
	explicit Peer(const std::string &device = test_device()) : child_("peer", {device})
	{
		child_.link().expect(10s, "the peer's hello");
	}
	~Peer()
	{
		try {
			child_.call(Msg().set("cmd", "exit"), 5s);
			child_.wait_exit(5s);
		} catch (...) {
		}
	}
	Msg call(const Msg &m, ms timeout = 10s) { return child_.call(m, timeout); }

	// An XRC send QP in INIT: {id, qpn}.
	std::pair<uint64_t, uint32_t> send_qp(bool wr_api = false)
	{
		Msg r = call(Msg().set("cmd", "send_qp").set("wr_api", wr_api ? 1 : 0));
		return {r.u64("id"), static_cast<uint32_t>(r.u64("qpn"))};
	}
	void connect(uint64_t id, uint32_t dest)
	{
		call(Msg().set("cmd", "connect").set("id", id).set("dest", dest));
	}
	// send_many: message i (seq0 + i) to SRQ targets[i].
	Msg send(uint64_t id, const std::vector<uint32_t> &targets, uint64_t seq0 = 0, uint32_t len = 64,
		 uint64_t imm_every = 0)
	{
		std::string t;
		for (uint32_t s : targets)
			t += std::to_string(s) + ",";
		return call(Msg().set("cmd", "send_many").set("id", id).set("targets", t).set("seq0", seq0)
				    .set("len", len).set("imm_every", imm_every));
	}
	Child &child() { return child_; }

private:
	Child child_;
};

std::vector<uint64_t> numbers(const Msg &m, const std::string &key)
{
	std::vector<uint64_t> out;
	for (auto &s : split(m.str(key), ','))
		out.push_back(std::stoull(s));
	return out;
}

// Every completion of a reply had `status`.
void expect_all(const Msg &r, size_t n, ibv_wc_status status)
{
	EXPECT_EQ(r.u64("post_err", 0), 0u);
	EXPECT_EQ(r.u64("completions"), n);
	for (uint64_t s : numbers(r, "statuses"))
		EXPECT_EQ(s, static_cast<uint64_t>(status)) << ibv_wc_status_str(static_cast<ibv_wc_status>(s));
}

// A receive-side view of one SRQ: its CQ, and the buffers its receives
// (wr_id k -> slot k) point at.
struct SrqSlots {
	ibv_cq *cq;
	uint32_t srqn;
	uint8_t *base;
	uint32_t slot;
};

// The next completions of `s` are the messages `seqs`, each a SEND of `len`
// bytes through receive QP `qpn`, consuming receives first_wr_id, +1, ...
void expect_messages(const SrqSlots &s, uint32_t qpn, const std::vector<uint64_t> &seqs,
		     uint64_t first_wr_id, uint32_t len, uint64_t imm_every = 0)
{
	auto wcs = poll_completions(s.cq, seqs.size(), 2s);
	ASSERT_EQ(wcs.size(), seqs.size()) << "completions on the CQ of SRQ " << s.srqn;
	for (size_t k = 0; k < wcs.size(); ++k) {
		const ibv_wc &wc = wcs[k];
		SCOPED_TRACE("SRQ " + std::to_string(s.srqn) + " completion " + std::to_string(k));
		ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
		EXPECT_EQ(wc.opcode, IBV_WC_RECV);
		ASSERT_EQ(wc.wr_id, first_wr_id + k);  // an SRQ is consumed in order
		EXPECT_EQ(wc.qp_num, qpn);
		EXPECT_EQ(wc.byte_len, len);
		bool imm = imm_every && seqs[k] % imm_every == 0;
		EXPECT_EQ((wc.wc_flags & IBV_WC_WITH_IMM) != 0, imm);
		if (imm) {
			EXPECT_EQ(be32toh(wc.imm_data), static_cast<uint32_t>(seqs[k]));
		}
		EXPECT_EQ(check_payload(s.base + wc.wr_id * s.slot, len, seqs[k], s.srqn), "");
	}
}

uint32_t query_state(ibv_qp *qp, uint32_t *dest = nullptr)
{
	ibv_qp_attr a{};
	ibv_qp_init_attr init{};
	if (int err = ibv_query_qp(qp, &a, IBV_QP_STATE | IBV_QP_DEST_QPN, &init))
		fail("ibv_query_qp: " + errno_text(err));
	if (dest)
		*dest = a.dest_qp_num;
	return a.qp_state;
}

// ibv_open_qp of an XRC receive QP; nullptr with errno set.
ibv_qp *open_recv_qp(ibv_context *ctx, ibv_xrcd *xrcd, uint32_t qpn)
{
	ibv_qp_open_attr a{};
	a.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	a.qp_num = qpn;
	a.xrcd = xrcd;
	a.qp_type = IBV_QPT_XRC_RECV;
	return ibv_open_qp(ctx, &a);
}

// ---- domains --------------------------------------------------------------------

// A makes the domain of a file, an XRC SRQ and a receive QP in it; B opens
// the same file's domain and the receive QP by number, connects it (through
// its handle) to its send QP, and sends. Then A lets go of everything: the
// receive QP lives on in B's handle, and dies with B's last handle.
TEST(XrcDomain, SharedByFileAcrossProcesses)
{
	TempFile file;
	CtxPtr ctx = open_device(test_device());
	PdPtr pd = alloc_pd(ctx.get());
	XrcdPtr xrcd = open_xrcd(ctx.get(), file.fd(), O_CREAT);
	CqPtr cq = create_cq(ctx.get());
	std::vector<uint8_t> buf(16 * 256);
	MrPtr mr = reg_mr(pd.get(), buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
	SrqPtr srq = create_xrc_srq(ctx.get(), xrcd.get(), pd.get(), cq.get());
	const uint32_t srqn = srq_num(srq.get());
	QpPtr rqp = create_xrc_recv_qp(ctx.get(), xrcd.get(), 0);
	const uint32_t rqpn = rqp->qp_num;
	for (int i = 0; i < 16; ++i)
		post_srq_recv(srq.get(), i, buf.data() + i * 256, 256, mr->lkey);
	SrqSlots slots{cq.get(), srqn, buf.data(), 256};

	Peer b;
	// The file's domain exists: B needs no O_CREAT.
	Msg x = b.call(Msg().set("cmd", "open_xrcd").set("path", file.path).set("oflags", 0));
	ASSERT_EQ(x.u64("errno"), 0u) << "B: ibv_open_xrcd of the file A made the domain of";
	Msg o = b.call(Msg().set("cmd", "open_qp").set("xrcd", x.u64("id")).set("qpn", rqpn));
	ASSERT_EQ(o.u64("errno"), 0u) << "B: ibv_open_qp of A's receive QP";
	EXPECT_EQ(o.u64("qpn"), rqpn);
	auto [sid, sqpn] = b.send_qp();
	// The receive QP is connected through B's handle; A's handle sees it.
	b.call(Msg().set("cmd", "modify_rtr").set("id", o.u64("id")).set("dest", sqpn));
	uint32_t dest = 0;
	EXPECT_EQ(query_state(rqp.get(), &dest), IBV_QPS_RTR);
	EXPECT_EQ(dest, sqpn);
	b.connect(sid, rqpn);

	expect_all(b.send(sid, {srqn, srqn, srqn, srqn}, 0), 4, IBV_WC_SUCCESS);
	expect_messages(slots, rqpn, {0, 1, 2, 3}, 0, 64);

	// A destroys its handle: B's keeps the receive QP, and traffic flows.
	ASSERT_EQ(ibv_destroy_qp(rqp.release()), 0);
	Msg q = b.call(Msg().set("cmd", "query_qp").set("id", o.u64("id")));
	ASSERT_EQ(q.u64("ret"), 0u) << "B: ibv_query_qp after A destroyed its handle";
	EXPECT_EQ(q.u64("state"), static_cast<uint64_t>(IBV_QPS_RTR));
	EXPECT_EQ(q.u64("dest_qp_num"), sqpn);
	EXPECT_EQ(q.u64("qp_type"), static_cast<uint64_t>(IBV_QPT_XRC_RECV));
	expect_all(b.send(sid, {srqn, srqn}, 4), 2, IBV_WC_SUCCESS);
	expect_messages(slots, rqpn, {4, 5}, 4, 64);

	// A leaves the domain altogether; the QP still lives in B's handle...
	ASSERT_EQ(ibv_destroy_srq(srq.release()), 0);
	ASSERT_EQ(ibv_close_xrcd(xrcd.release()), 0);
	q = b.call(Msg().set("cmd", "query_qp").set("id", o.u64("id")));
	ASSERT_EQ(q.u64("ret"), 0u) << "B: ibv_query_qp after A closed the domain";
	EXPECT_EQ(q.u64("state"), static_cast<uint64_t>(IBV_QPS_RTR));
	// ...but the SRQ its messages named is gone.
	Msg r = b.send(sid, {srqn}, 6);
	EXPECT_EQ(r.u64("completions"), 1u);
	EXPECT_EQ(r.u64("status", 0), static_cast<uint64_t>(IBV_WC_REM_INV_REQ_ERR));
	EXPECT_EQ(stray_completions(cq.get()), 0u);

	// More handles while one lives; the QP number dies with the last one.
	Msg o2 = b.call(Msg().set("cmd", "open_qp").set("xrcd", x.u64("id")).set("qpn", rqpn));
	ASSERT_EQ(o2.u64("errno"), 0u) << "B: a second ibv_open_qp while the QP lives";
	EXPECT_EQ(b.call(Msg().set("cmd", "destroy_qp").set("id", o.u64("id"))).u64("ret"), 0u);
	EXPECT_EQ(b.call(Msg().set("cmd", "query_qp").set("id", o2.u64("id"))).u64("ret"), 0u);
	EXPECT_EQ(b.call(Msg().set("cmd", "destroy_qp").set("id", o2.u64("id"))).u64("ret"), 0u);
	Msg gone = b.call(Msg().set("cmd", "open_qp").set("xrcd", x.u64("id")).set("qpn", rqpn));
	EXPECT_EQ(gone.u64("errno"), static_cast<uint64_t>(EINVAL)) << "ibv_open_qp after the last handle";

	// B's handle was the last on the domain: the file has none any more.
	EXPECT_EQ(b.call(Msg().set("cmd", "close_xrcd").set("id", x.u64("id"))).u64("ret"), 0u);
	errno = 0;
	ibv_xrcd *again = open_xrcd_raw(ctx.get(), file.fd(), 0);
	EXPECT_EQ(again, nullptr) << "the domain outlived its last handle";
	EXPECT_EQ(errno, EAGAIN);
	if (again)
		ibv_close_xrcd(again);
}

// ibv_open_xrcd of a file: without O_CREAT only a domain that exists opens
// (EAGAIN otherwise, as the kernel answers); O_EXCL refuses an existing one
// (EINVAL); handles of one file are one domain, another file is another.
TEST(XrcDomain, OpenNeedsCreateOrExistingDomain)
{
	TempFile file, other;
	CtxPtr ctx = open_device(test_device());
	errno = 0;
	ibv_xrcd *none = open_xrcd_raw(ctx.get(), file.fd(), 0);
	EXPECT_EQ(none, nullptr) << "ibv_open_xrcd without O_CREAT on a file with no domain";
	EXPECT_EQ(errno, EAGAIN);
	if (none)
		ibv_close_xrcd(none);

	// The fd must be one of the caller's open files (EBADF, as the kernel).
	errno = 0;
	ibv_xrcd *badf = open_xrcd_raw(ctx.get(), 1000000, O_CREAT);
	EXPECT_EQ(badf, nullptr) << "ibv_open_xrcd of a file descriptor that is not open";
	EXPECT_EQ(errno, EBADF);
	if (badf)
		ibv_close_xrcd(badf);

	XrcdPtr made = open_xrcd(ctx.get(), file.fd(), O_CREAT);
	XrcdPtr again = open_xrcd(ctx.get(), file.fd(), 0);
	XrcdPtr created_again = open_xrcd(ctx.get(), file.fd(), O_CREAT);  // exists: just opens
	errno = 0;
	ibv_xrcd *excl = open_xrcd_raw(ctx.get(), file.fd(), O_CREAT | O_EXCL);
	EXPECT_EQ(excl, nullptr) << "O_EXCL on a file that has a domain";
	EXPECT_EQ(errno, EINVAL);
	if (excl)
		ibv_close_xrcd(excl);
	XrcdPtr foreign = open_xrcd(ctx.get(), other.fd(), O_CREAT);

	// One domain: a receive QP made through one handle opens through another
	// of the same file, not through the other file's.
	QpPtr rqp = create_xrc_recv_qp(ctx.get(), made.get(), 0);
	QpPtr opened(open_recv_qp(ctx.get(), again.get(), rqp->qp_num));
	EXPECT_NE(opened, nullptr) << "ibv_open_qp through a second handle: " << errno_text(errno);
	errno = 0;
	QpPtr wrong(open_recv_qp(ctx.get(), foreign.get(), rqp->qp_num));
	EXPECT_EQ(wrong, nullptr) << "ibv_open_qp through another domain";
	EXPECT_EQ(errno, EINVAL);

	// Another process: its own fd of the file reaches the domain; a file
	// without one does not.
	{
		Peer b;
		Msg x = b.call(Msg().set("cmd", "open_xrcd").set("path", file.path).set("oflags", 0));
		EXPECT_EQ(x.u64("errno"), 0u);
		TempFile fresh;
		Msg y = b.call(Msg().set("cmd", "open_xrcd").set("path", fresh.path).set("oflags", 0));
		EXPECT_EQ(y.u64("errno"), static_cast<uint64_t>(EAGAIN));
	}

	// Closing a handle in use is refused; all handles closed, the domain is gone.
	EXPECT_EQ(ibv_close_xrcd(made.get()), EBUSY) << "close_xrcd with a receive QP made through it";
	opened.reset();
	rqp.reset();
	made.reset();
	again.reset();
	created_again.reset();
	errno = 0;
	ibv_xrcd *after = open_xrcd_raw(ctx.get(), file.fd(), 0);
	EXPECT_EQ(after, nullptr) << "the domain outlived its handles";
	EXPECT_EQ(errno, EAGAIN);
	if (after)
		ibv_close_xrcd(after);
}

// ibv_open_qp opens XRC receive QPs of the domain only: an RC QP's or an
// XRC send QP's number, or a number no QP has, is EINVAL (ib_open_qp). A
// receive QP has no queues: posting to it fails.
TEST(XrcDomain, OpenQpOpensOnlyXrcReceiveQps)
{
	CtxPtr ctx = open_device(test_device());
	PdPtr pd = alloc_pd(ctx.get());
	CqPtr cq = create_cq(ctx.get());
	XrcdPtr xrcd = open_xrcd(ctx.get(), -1, O_CREAT);
	ibv_qp_init_attr rc{};
	rc.send_cq = rc.recv_cq = cq.get();
	rc.cap.max_send_wr = rc.cap.max_recv_wr = 4;
	rc.cap.max_send_sge = rc.cap.max_recv_sge = 1;
	rc.qp_type = IBV_QPT_RC;
	QpPtr rc_qp(ibv_create_qp(pd.get(), &rc));
	ASSERT_TRUE(rc_qp) << errno_text(errno);
	ibv_qp_init_attr_ex xs{};
	xs.qp_type = IBV_QPT_XRC_SEND;
	xs.send_cq = cq.get();
	xs.cap.max_send_wr = 4;
	xs.cap.max_send_sge = 1;
	xs.comp_mask = IBV_QP_INIT_ATTR_PD;
	xs.pd = pd.get();
	QpPtr send_qp(ibv_create_qp_ex(ctx.get(), &xs));
	ASSERT_TRUE(send_qp) << errno_text(errno);
	for (uint32_t qpn : {rc_qp->qp_num, send_qp->qp_num, 0xfffff0u}) {
		errno = 0;
		QpPtr opened(open_recv_qp(ctx.get(), xrcd.get(), qpn));
		EXPECT_FALSE(opened) << "ibv_open_qp of QP number " << qpn;
		EXPECT_EQ(errno, EINVAL) << "QP number " << qpn;
	}

	QpPtr rqp = create_xrc_recv_qp(ctx.get(), xrcd.get(), 0);
	uint8_t byte;
	ibv_sge sge{reinterpret_cast<uintptr_t>(&byte), 1, 0};
	ibv_recv_wr rwr{};
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	ibv_recv_wr *bad_r = nullptr;
	EXPECT_NE(ibv_post_recv(rqp.get(), &rwr, &bad_r), 0) << "ibv_post_recv on an XRC receive QP";
	ibv_send_wr swr{};
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_INLINE;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.qp_type.xrc.remote_srqn = XSRC_SRQN_BASE;
	ibv_send_wr *bad_s = nullptr;
	EXPECT_NE(ibv_post_send(rqp.get(), &swr, &bad_s), 0) << "ibv_post_send on an XRC receive QP";
	EXPECT_EQ(stray_completions(cq.get()), 0u);
}

// The kernel keeps a domain's inode (igrab) for as long as the domain
// lives, so the file's inode number cannot pass to another file meanwhile.
// A: the domain of F1, then F1's fd closed and F1 unlinked; F2 made next
// (ext4 hands out the freed inode number again): F2 has no domain, so
// opening it without O_CREAT must fail, not join F1's domain.
TEST(XrcDomainInode, ReusedInodeNumberIsNotTheOldDomain)
{
	CtxPtr ctx = open_device(test_device());
	char p1[] = "/tmp/xrc_test_XXXXXX";
	xsrc::unique_fd fd1(mkstemp(p1));
	ASSERT_GE(fd1.get(), 0);
	struct stat st1;
	ASSERT_EQ(fstat(fd1.get(), &st1), 0);
	XrcdPtr old_domain = open_xrcd(ctx.get(), fd1.get(), O_CREAT);
	QpPtr rqp = create_xrc_recv_qp(ctx.get(), old_domain.get(), 0);
	fd1.reset();
	unlink(p1);

	TempFile f2;
	struct stat st2;
	ASSERT_EQ(fstat(f2.fd(), &st2), 0);
	if (st1.st_dev != st2.st_dev || st1.st_ino != st2.st_ino)
		GTEST_SKIP() << "the file system did not reuse the inode number";
	errno = 0;
	ibv_xrcd *x = open_xrcd_raw(ctx.get(), f2.fd(), 0);
	EXPECT_EQ(x, nullptr) << "a new file with a reused inode number opened a live domain of another file";
	EXPECT_EQ(errno, EAGAIN);
	if (x) {
		QpPtr joined(open_recv_qp(ctx.get(), x, rqp->qp_num));
		EXPECT_FALSE(joined) << "...and reaches that domain's receive QP " << rqp->qp_num;
		joined.reset();
		ibv_close_xrcd(x);
	}
}

// ---- routing --------------------------------------------------------------------

// One XRC send QP, one receive QP, three XRC SRQs of the domain with a CQ
// each: every message lands on the SRQ its remote_srqn names, in order,
// intact, and on no other.
TEST(XrcRouting, OneSendQpToThreeSrqs)
{
	constexpr int kSrqs = 3, kRecvs = 32;
	constexpr uint32_t kSlot = 128, kLen = 64;
	CtxPtr ctx = open_device(test_device());
	PdPtr pd = alloc_pd(ctx.get());
	XrcdPtr xrcd = open_xrcd(ctx.get(), -1, O_CREAT);  // a private domain
	std::vector<uint8_t> buf(kSrqs * kRecvs * kSlot);
	MrPtr mr = reg_mr(pd.get(), buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
	std::vector<CqPtr> cqs;
	std::vector<SrqPtr> srqs;
	std::vector<SrqSlots> slots;
	for (int s = 0; s < kSrqs; ++s) {
		cqs.push_back(create_cq(ctx.get()));
		srqs.push_back(create_xrc_srq(ctx.get(), xrcd.get(), pd.get(), cqs[s].get(), kRecvs));
		uint8_t *base = buf.data() + s * kRecvs * kSlot;
		for (int k = 0; k < kRecvs; ++k)
			post_srq_recv(srqs[s].get(), k, base + k * kSlot, kSlot, mr->lkey);
		slots.push_back({cqs[s].get(), srq_num(srqs[s].get()), base, kSlot});
	}
	QpPtr rqp = create_xrc_recv_qp(ctx.get(), xrcd.get(), 0);

	Peer b;
	auto [sid, sqpn] = b.send_qp();
	recv_to_rtr(rqp.get(), sqpn);
	b.connect(sid, rqp->qp_num);

	// 60 messages in an irregular order over the three SRQs; every third
	// carries immediate data.
	std::vector<uint32_t> targets;
	std::vector<std::vector<uint64_t>> expected(kSrqs);
	for (uint64_t i = 0; i < 60; ++i) {
		int s = static_cast<int>((i * 7 + i / 5) % kSrqs);
		targets.push_back(slots[s].srqn);
		expected[s].push_back(i);
	}
	for (int s = 0; s < kSrqs; ++s)
		ASSERT_LE(expected[s].size(), static_cast<size_t>(kRecvs));
	Msg r = b.send(sid, targets, 0, kLen, 3);
	expect_all(r, targets.size(), IBV_WC_SUCCESS);
	auto ids = numbers(r, "wr_ids");
	for (size_t i = 0; i < ids.size(); ++i)
		EXPECT_EQ(ids[i], i) << "send completions in order";

	for (int s = 0; s < kSrqs; ++s) {
		expect_messages(slots[s], rqp->qp_num, expected[s], 0, kLen, 3);
		EXPECT_EQ(stray_completions(cqs[s].get()), 0u) << "SRQ " << slots[s].srqn;
	}
}

// ---- RDMA and atomics -------------------------------------------------------------

// RDMA WRITE / READ, FETCH_ADD, CMP_SWAP (both outcomes) and WRITE_WITH_IMM
// over XRC into memory of the SRQ's owner, through an rkey of the SRQ's PD.
// Only WRITE_WITH_IMM consumes a receive. An rkey of another PD is refused.
TEST(XrcRdma, WriteReadAtomicsToSrqOwnerMemory)
{
	CtxPtr ctx = open_device(test_device());
	PdPtr pd = alloc_pd(ctx.get());
	PdPtr other_pd = alloc_pd(ctx.get());
	XrcdPtr xrcd = open_xrcd(ctx.get(), -1, O_CREAT);
	CqPtr cq = create_cq(ctx.get());
	alignas(4096) static uint8_t region[16384];
	alignas(4096) static uint8_t other_region[4096];
	std::memset(region, 0, sizeof(region));
	std::memset(other_region, 0x5a, sizeof(other_region));
	MrPtr mr = reg_mr(pd.get(), region, sizeof(region), IBV_ACCESS_LOCAL_WRITE | kRemoteAll);
	MrPtr other_mr = reg_mr(other_pd.get(), other_region, sizeof(other_region),
				IBV_ACCESS_LOCAL_WRITE | kRemoteAll);
	std::vector<uint8_t> rbuf(4 * 256);
	MrPtr rmr = reg_mr(pd.get(), rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
	SrqPtr srq = create_xrc_srq(ctx.get(), xrcd.get(), pd.get(), cq.get());
	const uint32_t srqn = srq_num(srq.get());
	for (int k = 0; k < 4; ++k)
		post_srq_recv(srq.get(), k, rbuf.data() + k * 256, 256, rmr->lkey);
	QpPtr rqp = create_xrc_recv_qp(ctx.get(), xrcd.get(), kRemoteAll);

	Peer b;
	auto [sid, sqpn] = b.send_qp();
	recv_to_rtr(rqp.get(), sqpn);
	b.connect(sid, rqp->qp_num);
	const uint64_t base = reinterpret_cast<uintptr_t>(region);
	auto post = [&](const std::string &op) {
		return Msg().set("cmd", "post").set("id", sid).set("op", op).set("srqn", srqn).set("rkey", mr->rkey);
	};
	auto expect_done = [](const Msg &r, ibv_wc_opcode opcode, uint32_t len) {
		ASSERT_EQ(r.u64("post_err"), 0u);
		ASSERT_EQ(r.u64("completions"), 1u);
		EXPECT_EQ(r.u64("status"), static_cast<uint64_t>(IBV_WC_SUCCESS))
			<< ibv_wc_status_str(static_cast<ibv_wc_status>(r.u64("status")));
		EXPECT_EQ(r.u64("opcode"), static_cast<uint64_t>(opcode));
		if (opcode != IBV_WC_RDMA_WRITE) {  // byte_len is undefined for writes
			EXPECT_EQ(r.u64("byte_len"), len);
		}
	};

	// WRITE: 4 KiB land in A's region.
	expect_done(b.call(post("write").set("len", 4096).set("raddr", base).set("seed", 5)), IBV_WC_RDMA_WRITE, 4096);
	for (size_t j = 0; j < 4096; ++j)
		ASSERT_EQ(region[j], pattern(5, j)) << "written byte " << j;

	// READ: 4 KiB of A's region come back.
	for (size_t j = 0; j < 4096; ++j)
		region[4096 + j] = pattern(9, j);
	Msg rd = b.call(post("read").set("len", 4096).set("raddr", base + 4096));
	expect_done(rd, IBV_WC_RDMA_READ, 4096);
	EXPECT_EQ(rd.str("data"), to_hex(region + 4096, 4096));

	// FETCH_ADD twice, then CMP_SWAP that misses and one that hits.
	uint64_t *counter = reinterpret_cast<uint64_t *>(region + 8192);
	*counter = 100;
	Msg fa = b.call(post("fadd").set("raddr", base + 8192).set("compare_add", 5));
	expect_done(fa, IBV_WC_FETCH_ADD, 8);
	EXPECT_EQ(fa.u64("result"), 100u);
	EXPECT_EQ(*counter, 105u);
	fa = b.call(post("fadd").set("raddr", base + 8192).set("compare_add", 10));
	expect_done(fa, IBV_WC_FETCH_ADD, 8);
	EXPECT_EQ(fa.u64("result"), 105u);
	EXPECT_EQ(*counter, 115u);
	Msg cs = b.call(post("cswap").set("raddr", base + 8192).set("compare_add", 105).set("swap", 7));
	expect_done(cs, IBV_WC_COMP_SWAP, 8);
	EXPECT_EQ(cs.u64("result"), 115u);
	EXPECT_EQ(*counter, 115u) << "a compare that misses swaps nothing";
	cs = b.call(post("cswap").set("raddr", base + 8192).set("compare_add", 115).set("swap", 7));
	expect_done(cs, IBV_WC_COMP_SWAP, 8);
	EXPECT_EQ(cs.u64("result"), 115u);
	EXPECT_EQ(*counter, 7u);

	// None of that consumed a receive.
	EXPECT_EQ(stray_completions(cq.get()), 0u);

	// WRITE_WITH_IMM: the data, and a receive of the named SRQ consumed.
	Msg wi = b.call(post("write_imm").set("len", 64).set("raddr", base + 12288).set("seed", 3).set("imm", 0x1234));
	expect_done(wi, IBV_WC_RDMA_WRITE, 64);
	for (size_t j = 0; j < 64; ++j)
		ASSERT_EQ(region[12288 + j], pattern(3, j)) << "byte " << j;
	auto wcs = poll_completions(cq.get(), 1, 2s);
	ASSERT_EQ(wcs.size(), 1u);
	EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
	EXPECT_EQ(wcs[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
	EXPECT_EQ(wcs[0].wr_id, 0u);
	EXPECT_TRUE(wcs[0].wc_flags & IBV_WC_WITH_IMM);
	EXPECT_EQ(be32toh(wcs[0].imm_data), 0x1234u);
	EXPECT_EQ(wcs[0].qp_num, rqp->qp_num);

	// An rkey of a PD that is not the SRQ's: remote access error, nothing written.
	Msg bad = b.call(post("write").set("len", 64).set("raddr", reinterpret_cast<uintptr_t>(other_region))
				 .set("rkey", other_mr->rkey).set("seed", 1));
	ASSERT_EQ(bad.u64("completions"), 1u);
	EXPECT_EQ(bad.u64("status"), static_cast<uint64_t>(IBV_WC_REM_ACCESS_ERR))
		<< ibv_wc_status_str(static_cast<ibv_wc_status>(bad.u64("status")));
	for (size_t j = 0; j < sizeof(other_region); ++j)
		ASSERT_EQ(other_region[j], 0x5a) << "byte " << j;
	EXPECT_EQ(stray_completions(cq.get()), 0u);
	// An access violation is fatal to the receive QP (IBTA class C), not to
	// the SRQ, which is shared: its receives stay posted for other QPs.
	EXPECT_EQ(query_state(rqp.get()), IBV_QPS_ERR);
	QpPtr rqp2 = create_xrc_recv_qp(ctx.get(), xrcd.get(), kRemoteAll);
	auto [sid2, sqpn2] = b.send_qp();
	recv_to_rtr(rqp2.get(), sqpn2);
	b.connect(sid2, rqp2->qp_num);
	expect_all(b.send(sid2, {srqn, srqn}, 0), 2, IBV_WC_SUCCESS);
	expect_messages({cq.get(), srqn, rbuf.data(), 256}, rqp2->qp_num, {0, 1}, 1, 64);
}

// ---- errors -------------------------------------------------------------------------

// Messages naming an SRQ number that is not an XRC SRQ of the receive QP's
// domain: the requester completes with IBV_WC_REM_INV_REQ_ERR (the rest of
// its queue is flushed), and no receive is consumed anywhere.
TEST(XrcErrors, BadSrqNumbers)
{
	TempFile f1, f2;
	CtxPtr ctx = open_device(test_device());
	PdPtr pd = alloc_pd(ctx.get());
	XrcdPtr xrcd1 = open_xrcd(ctx.get(), f1.fd(), O_CREAT);
	XrcdPtr xrcd2 = open_xrcd(ctx.get(), f2.fd(), O_CREAT);
	CqPtr cq1 = create_cq(ctx.get());
	CqPtr cq2 = create_cq(ctx.get());
	std::vector<uint8_t> buf(2 * 8 * 128);
	MrPtr mr = reg_mr(pd.get(), buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
	SrqPtr srq1 = create_xrc_srq(ctx.get(), xrcd1.get(), pd.get(), cq1.get(), 8);
	SrqPtr srq2 = create_xrc_srq(ctx.get(), xrcd2.get(), pd.get(), cq2.get(), 8);
	ibv_srq_init_attr basic_attr{};
	basic_attr.attr.max_wr = 8;
	basic_attr.attr.max_sge = 1;
	SrqPtr basic(ibv_create_srq(pd.get(), &basic_attr));
	ASSERT_NE(basic, nullptr) << errno_text(errno);
	SrqSlots s1{cq1.get(), srq_num(srq1.get()), buf.data(), 128};
	SrqSlots s2{cq2.get(), srq_num(srq2.get()), buf.data() + 8 * 128, 128};
	for (int k = 0; k < 4; ++k) {
		post_srq_recv(srq1.get(), k, s1.base + k * 128, 128, mr->lkey);
		post_srq_recv(srq2.get(), k, s2.base + k * 128, 128, mr->lkey);
	}

	Peer b;
	std::vector<QpPtr> rqps;
	// A fresh pair (receive QP of `xrcd`, send QP of B) for each case.
	auto pair = [&](ibv_xrcd *xrcd) {
		rqps.push_back(create_xrc_recv_qp(ctx.get(), xrcd, 0));
		auto [sid, sqpn] = b.send_qp();
		recv_to_rtr(rqps.back().get(), sqpn);
		b.connect(sid, rqps.back()->qp_num);
		return std::pair{sid, rqps.back()->qp_num};
	};

	// ibv_get_srq_num is meant for XRC SRQs; a basic SRQ's number is
	// taken from it too if the provider tells it (else that case is skipped).
	uint32_t basic_srqn = 0;
	if (ibv_get_srq_num(basic.get(), &basic_srqn))
		basic_srqn = 0;
	const struct {
		const char *what;
		uint32_t srqn;
	} cases[] = {
		{"never allocated (last SRQ table slot)", XSRC_SRQN_BASE + XSRC_SRQ_TABLE_LEN - 1},
		{"never allocated (beyond the table)", 0xfffff0},
		{"below the first SRQ number", 1},
		{"an XRC SRQ of another domain", s2.srqn},
		{"a basic (non-XRC) SRQ", basic_srqn},
	};
	for (const auto &c : cases) {
		const uint32_t srqn = c.srqn;
		if (!srqn)
			continue;
		SCOPED_TRACE(std::string(c.what) + ": SRQN " + std::to_string(srqn));
		auto [sid, rqpn] = pair(xrcd1.get());
		// The bad message, then a good one behind it: flushed, not delivered.
		Msg r = b.send(sid, {srqn, s1.srqn}, 100);
		ASSERT_EQ(r.u64("completions"), 2u);
		auto st = numbers(r, "statuses");
		EXPECT_EQ(st[0], static_cast<uint64_t>(IBV_WC_REM_INV_REQ_ERR))
			<< ibv_wc_status_str(static_cast<ibv_wc_status>(st[0]));
		EXPECT_EQ(st[1], static_cast<uint64_t>(IBV_WC_WR_FLUSH_ERR))
			<< ibv_wc_status_str(static_cast<ibv_wc_status>(st[1]));
		EXPECT_EQ(stray_completions(cq1.get(), 20ms), 0u);
		EXPECT_EQ(stray_completions(cq2.get(), 20ms), 0u);
	}

	// Every receive is still posted: new pairs deliver to both SRQs, and
	// the first receive of each (wr_id 0) is the one consumed first.
	auto [g1, q1] = pair(xrcd1.get());
	expect_all(b.send(g1, {s1.srqn, s1.srqn, s1.srqn, s1.srqn}, 0), 4, IBV_WC_SUCCESS);
	expect_messages(s1, q1, {0, 1, 2, 3}, 0, 64);
	auto [g2, q2] = pair(xrcd2.get());
	expect_all(b.send(g2, {s2.srqn, s2.srqn, s2.srqn, s2.srqn}, 10), 4, IBV_WC_SUCCESS);
	expect_messages(s2, q2, {10, 11, 12, 13}, 0, 64);
	// And a receive QP of domain 2 cannot reach domain 1's SRQ either.
	auto [x2, xq2] = pair(xrcd2.get());
	(void)xq2;
	Msg cross = b.send(x2, {s1.srqn}, 20);
	EXPECT_EQ(cross.u64("status", 0), static_cast<uint64_t>(IBV_WC_REM_INV_REQ_ERR));
	EXPECT_EQ(stray_completions(cq1.get()), 0u);
	EXPECT_EQ(stray_completions(cq2.get()), 0u);
	rqps.clear();
}

// ---- cleanup --------------------------------------------------------------------------

// On a device of its own (its `xsrc status` counts are this test's alone).
constexpr const char *kPrivateDevice = "xsrcxrc";

bool status_is(const xsrc_test::PrivateDevice &dev, int contexts, int objects)
{
	auto st = dev.status();
	return st && st->contexts == contexts && st->objects == objects;
}

// A process that is the only opener of a domain, holding an XRC SRQ and a
// receive QP in it, is SIGKILLed: every object goes, and with the domain
// gone the file needs O_CREAT again.
TEST(XrcCleanup, LastOpenerKilled)
{
	xsrc_test::PrivateDevice dev(kPrivateDevice);
	ASSERT_TRUE(dev.up()) << dev.output();
	auto base = dev.status();
	ASSERT_TRUE(base);
	TempFile file;

	Child holder("holder", {dev.name(), file.path});
	Msg ready = holder.link().expect(10s, "the holder's objects");
	auto during = dev.status();
	ASSERT_TRUE(during);
	EXPECT_EQ(during->contexts, base->contexts + 1);
	EXPECT_GT(during->objects, base->objects);
	{
		// The domain is there: it opens without O_CREAT, and so does its QP.
		CtxPtr ctx = open_device(dev.name());
		XrcdPtr x = open_xrcd(ctx.get(), file.fd(), 0);
		QpPtr qp(open_recv_qp(ctx.get(), x.get(), static_cast<uint32_t>(ready.u64("qpn"))));
		EXPECT_NE(qp, nullptr) << errno_text(errno);
	}
	EXPECT_TRUE(xsrc_test::wait_until(5s, [&] { return status_is(dev, during->contexts, during->objects); }));

	holder.kill();
	EXPECT_TRUE(xsrc_test::wait_until(5s, [&] { return status_is(dev, base->contexts, base->objects); }))
		<< "after the kill: " << xsrc_test::run(xsrc_test::xsrc_cli() + " status");

	CtxPtr ctx = open_device(dev.name());
	errno = 0;
	ibv_xrcd *x = open_xrcd_raw(ctx.get(), file.fd(), 0);
	EXPECT_EQ(x, nullptr) << "the domain outlived its only opener";
	EXPECT_EQ(errno, EAGAIN);
	if (x)
		ibv_close_xrcd(x);
	// A new domain of the file does not have the dead one's receive QP.
	XrcdPtr fresh = open_xrcd(ctx.get(), file.fd(), O_CREAT);
	errno = 0;
	QpPtr old(open_recv_qp(ctx.get(), fresh.get(), static_cast<uint32_t>(ready.u64("qpn"))));
	EXPECT_EQ(old, nullptr);
	EXPECT_EQ(errno, EINVAL);
}

// Two openers; the one that made the domain, the SRQ and the receive QP is
// SIGKILLed. The survivor's handles keep the domain and the receive QP.
TEST(XrcCleanup, KilledCreatorOfSharedDomain)
{
	xsrc_test::PrivateDevice dev(kPrivateDevice);
	ASSERT_TRUE(dev.up()) << dev.output();
	auto base = dev.status();
	ASSERT_TRUE(base);
	TempFile file;
	{
		CtxPtr ctx = open_device(dev.name());
		Child holder("holder", {dev.name(), file.path});
		Msg ready = holder.link().expect(10s, "the holder's objects");
		const uint32_t qpn = static_cast<uint32_t>(ready.u64("qpn"));
		XrcdPtr x = open_xrcd(ctx.get(), file.fd(), 0);
		QpPtr qp(open_recv_qp(ctx.get(), x.get(), qpn));
		ASSERT_NE(qp, nullptr) << errno_text(errno);

		holder.kill();
		EXPECT_TRUE(xsrc_test::wait_until(5s, [&] {
			auto st = dev.status();
			return st && st->contexts == base->contexts + 1;
		}));
		EXPECT_EQ(query_state(qp.get()), IBV_QPS_INIT) << "the survivor's handle keeps the QP";

		// ...and it works: connected through the survivor's handle, it
		// delivers to an SRQ the survivor makes in the domain; the dead
		// creator's SRQ is gone.
		{
			PdPtr pd = alloc_pd(ctx.get());
			CqPtr cq = create_cq(ctx.get());
			std::vector<uint8_t> buf(4 * 128);
			MrPtr mr = reg_mr(pd.get(), buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
			SrqPtr srq = create_xrc_srq(ctx.get(), x.get(), pd.get(), cq.get(), 4);
			SrqSlots slots{cq.get(), srq_num(srq.get()), buf.data(), 128};
			for (int k = 0; k < 4; ++k)
				post_srq_recv(srq.get(), k, buf.data() + k * 128, 128, mr->lkey);
			Peer b(dev.name());
			auto [sid, sqpn] = b.send_qp();
			recv_to_rtr(qp.get(), sqpn);
			b.connect(sid, qpn);
			expect_all(b.send(sid, {slots.srqn, slots.srqn, slots.srqn}, 0), 3, IBV_WC_SUCCESS);
			expect_messages(slots, qpn, {0, 1, 2}, 0, 64);
			Msg dead = b.send(sid, {static_cast<uint32_t>(ready.u64("srqn"))}, 3);
			EXPECT_EQ(dead.u64("status", 0), static_cast<uint64_t>(IBV_WC_REM_INV_REQ_ERR));
			EXPECT_EQ(stray_completions(cq.get()), 0u);
		}

		XrcdPtr second = open_xrcd(ctx.get(), file.fd(), 0);  // the domain is still there
		QpPtr qp2(open_recv_qp(ctx.get(), second.get(), qpn));
		EXPECT_NE(qp2, nullptr) << errno_text(errno);
		qp2.reset();
		second.reset();

		// The survivor lets go: domain and QP are gone.
		qp.reset();
		x.reset();
		errno = 0;
		ibv_xrcd *none = open_xrcd_raw(ctx.get(), file.fd(), 0);
		EXPECT_EQ(none, nullptr);
		EXPECT_EQ(errno, EAGAIN);
		if (none)
			ibv_close_xrcd(none);
	}
	EXPECT_TRUE(xsrc_test::wait_until(5s, [&] { return status_is(dev, base->contexts, base->objects); }))
		<< xsrc_test::run(xsrc_test::xsrc_cli() + " status");
}

// A file names one domain per device (the kernel keeps a table per uverbs
// device): its domain on xsrc0 is not there on another device.
TEST(XrcDevices, DomainsArePerDevice)
{
	xsrc_test::PrivateDevice dev(kPrivateDevice);
	ASSERT_TRUE(dev.up()) << dev.output();
	TempFile file;
	CtxPtr main_ctx = open_device(test_device());
	CtxPtr other_ctx = open_device(dev.name());
	XrcdPtr on_main = open_xrcd(main_ctx.get(), file.fd(), O_CREAT);
	errno = 0;
	ibv_xrcd *x = open_xrcd_raw(other_ctx.get(), file.fd(), 0);
	EXPECT_EQ(x, nullptr) << "the domain of " << test_device() << " opened on " << dev.name();
	EXPECT_EQ(errno, EAGAIN);
	if (x)
		ibv_close_xrcd(x);
	XrcdPtr on_other = open_xrcd(other_ctx.get(), file.fd(), O_CREAT | O_EXCL);  // a new one there
}

// ---- events ---------------------------------------------------------------------------

// Readable within `timeout`?
bool readable(int fd, ms timeout)
{
	pollfd p{fd, POLLIN, 0};
	return poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

// What another process's sends into A's XRC SRQ make A see: completion
// events on the SRQ's CQ (a completion channel), the SRQ limit event once
// per arming, and, with the SRQ empty, an RNR retry error at the sender.
TEST(XrcEvents, SrqCompletionAndLimitEventsFromAnotherProcess)
{
	CtxPtr ctx = open_device(test_device());
	ibv_comp_channel *channel = ibv_create_comp_channel(ctx.get());
	ASSERT_NE(channel, nullptr) << errno_text(errno);
	std::unique_ptr<ibv_comp_channel, Destroy<ibv_destroy_comp_channel>> channel_owner(channel);
	PdPtr pd = alloc_pd(ctx.get());
	XrcdPtr xrcd = open_xrcd(ctx.get(), -1, O_CREAT);
	ibv_cq *raw_cq = ibv_create_cq(ctx.get(), 64, nullptr, channel, 0);
	ASSERT_NE(raw_cq, nullptr) << errno_text(errno);
	CqPtr cq(raw_cq);
	unsigned cq_events = 0;
	std::vector<uint8_t> buf(8 * 128);
	MrPtr mr = reg_mr(pd.get(), buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
	SrqPtr srq = create_xrc_srq(ctx.get(), xrcd.get(), pd.get(), cq.get(), 8);
	SrqSlots slots{cq.get(), srq_num(srq.get()), buf.data(), 128};
	for (int k = 0; k < 4; ++k)
		post_srq_recv(srq.get(), k, buf.data() + k * 128, 128, mr->lkey);
	ibv_srq_attr limit{};
	limit.srq_limit = 2;
	ASSERT_EQ(ibv_modify_srq(srq.get(), &limit, IBV_SRQ_LIMIT), 0);
	QpPtr rqp = create_xrc_recv_qp(ctx.get(), xrcd.get(), 0);
	Peer b;
	auto [sid, sqpn] = b.send_qp();
	recv_to_rtr(rqp.get(), sqpn);
	b.connect(sid, rqp->qp_num);

	// One message: a completion event, no limit event (3 receives left).
	ASSERT_EQ(ibv_req_notify_cq(cq.get(), 0), 0);
	expect_all(b.send(sid, {slots.srqn}, 0), 1, IBV_WC_SUCCESS);
	ASSERT_TRUE(readable(channel->fd, 2s)) << "no completion event";
	ibv_cq *ev_cq = nullptr;
	void *ev_ctx = nullptr;
	ASSERT_EQ(ibv_get_cq_event(channel, &ev_cq, &ev_ctx), 0);
	++cq_events;
	EXPECT_EQ(ev_cq, cq.get());
	expect_messages(slots, rqp->qp_num, {0}, 0, 64);
	EXPECT_FALSE(readable(ctx->async_fd, 50ms)) << "an async event above the SRQ limit";

	// Two more: one receive left, below the limit of 2.
	expect_all(b.send(sid, {slots.srqn, slots.srqn}, 1), 2, IBV_WC_SUCCESS);
	ASSERT_TRUE(readable(ctx->async_fd, 2s)) << "no SRQ limit event";
	ibv_async_event ev{};
	ASSERT_EQ(ibv_get_async_event(ctx.get(), &ev), 0);
	EXPECT_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED) << ibv_event_type_str(ev.event_type);
	if (ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED) {
		EXPECT_EQ(ev.element.srq, srq.get());
	}
	ibv_ack_async_event(&ev);
	expect_messages(slots, rqp->qp_num, {1, 2}, 1, 64);

	// The limit fired and is disarmed: the last receive goes without an event.
	expect_all(b.send(sid, {slots.srqn}, 3), 1, IBV_WC_SUCCESS);
	expect_messages(slots, rqp->qp_num, {3}, 3, 64);
	EXPECT_FALSE(readable(ctx->async_fd, 50ms)) << "a second limit event for one arming";

	// The SRQ is empty: the sender retries and gives up.
	Msg rnr = b.send(sid, {slots.srqn}, 4);
	EXPECT_EQ(rnr.u64("completions"), 1u);
	EXPECT_EQ(rnr.u64("status", 0), static_cast<uint64_t>(IBV_WC_RNR_RETRY_EXC_ERR))
		<< ibv_wc_status_str(static_cast<ibv_wc_status>(rnr.u64("status", 0)));
	EXPECT_EQ(stray_completions(cq.get()), 0u);
	ibv_ack_cq_events(cq.get(), cq_events);
}

// ---- ibv_wr_* ---------------------------------------------------------------------------

// One ibv_wr_start .. ibv_wr_complete batch on an XRC send QP (ibv_qp_ex):
// sends (with immediate, inline) to two SRQs by ibv_wr_set_xrc_srqn, an
// RDMA write and a fetch-add.
TEST(XrcWrApi, BatchWithSetXrcSrqn)
{
	CtxPtr ctx = open_device(test_device());
	PdPtr pd = alloc_pd(ctx.get());
	XrcdPtr xrcd = open_xrcd(ctx.get(), -1, O_CREAT);
	CqPtr cq0 = create_cq(ctx.get());
	CqPtr cq1 = create_cq(ctx.get());
	std::vector<uint8_t> buf(2 * 8 * 256);
	MrPtr mr = reg_mr(pd.get(), buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
	alignas(4096) static uint8_t region[8192];
	std::memset(region, 0, sizeof(region));
	MrPtr rmr = reg_mr(pd.get(), region, sizeof(region), IBV_ACCESS_LOCAL_WRITE | kRemoteAll);
	SrqPtr srq0 = create_xrc_srq(ctx.get(), xrcd.get(), pd.get(), cq0.get(), 8);
	SrqPtr srq1 = create_xrc_srq(ctx.get(), xrcd.get(), pd.get(), cq1.get(), 8);
	SrqSlots s0{cq0.get(), srq_num(srq0.get()), buf.data(), 256};
	SrqSlots s1{cq1.get(), srq_num(srq1.get()), buf.data() + 8 * 256, 256};
	for (int k = 0; k < 8; ++k) {
		post_srq_recv(srq0.get(), k, s0.base + k * 256, 256, mr->lkey);
		post_srq_recv(srq1.get(), k, s1.base + k * 256, 256, mr->lkey);
	}
	QpPtr rqp = create_xrc_recv_qp(ctx.get(), xrcd.get(), kRemoteAll);

	Peer b;
	auto [sid, sqpn] = b.send_qp(true);
	recv_to_rtr(rqp.get(), sqpn);
	b.connect(sid, rqp->qp_num);

	const uint64_t base = reinterpret_cast<uintptr_t>(region);
	uint64_t *counter = reinterpret_cast<uint64_t *>(region + 4096);
	*counter = 40;
	auto n = [](uint64_t v) { return std::to_string(v); };
	std::string items =
		"send," + n(s0.srqn) + ",64,0;" +
		"send_imm," + n(s1.srqn) + ",64,1,2748;" +
		"send_inline," + n(s1.srqn) + ",48,2;" +
		"send," + n(s0.srqn) + ",100,3;" +
		"send_imm," + n(s0.srqn) + ",64,4,68;" +
		"write," + n(s1.srqn) + ",256," + n(base) + "," + n(rmr->rkey) + ",11;" +
		"fadd," + n(s0.srqn) + "," + n(base + 4096) + "," + n(rmr->rkey) + ",3";
	Msg r = b.call(Msg().set("cmd", "wr_batch").set("id", sid).set("items", items));
	ASSERT_EQ(r.u64("complete_err"), 0u) << "ibv_wr_complete";
	expect_all(r, 7, IBV_WC_SUCCESS);
	auto ids = numbers(r, "wr_ids");
	auto opcodes = numbers(r, "opcodes");
	const ibv_wc_opcode want[] = {IBV_WC_SEND, IBV_WC_SEND, IBV_WC_SEND, IBV_WC_SEND,
				      IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_FETCH_ADD};
	for (size_t i = 0; i < ids.size() && i < 7; ++i) {
		EXPECT_EQ(ids[i], i);
		EXPECT_EQ(opcodes[i], static_cast<uint64_t>(want[i])) << "completion " << i;
	}
	EXPECT_EQ(numbers(r, "results").at(6), 40u) << "fetch-add's original value";
	EXPECT_EQ(*counter, 43u);
	for (size_t j = 0; j < 256; ++j)
		ASSERT_EQ(region[j], pattern(11, j)) << "written byte " << j;

	// SRQ 0: messages 0 (64 B), 3 (100 B), 4 (64 B, imm 68).
	auto w0 = poll_completions(cq0.get(), 3, 2s);
	ASSERT_EQ(w0.size(), 3u);
	const uint64_t seq0[] = {0, 3, 4};
	const uint32_t len0[] = {64, 100, 64};
	for (size_t k = 0; k < 3; ++k) {
		EXPECT_EQ(w0[k].status, IBV_WC_SUCCESS);
		EXPECT_EQ(w0[k].wr_id, k);
		EXPECT_EQ(w0[k].byte_len, len0[k]);
		EXPECT_EQ(check_payload(s0.base + k * 256, len0[k], seq0[k], s0.srqn), "");
	}
	EXPECT_FALSE(w0[0].wc_flags & IBV_WC_WITH_IMM);
	EXPECT_TRUE(w0[2].wc_flags & IBV_WC_WITH_IMM);
	EXPECT_EQ(be32toh(w0[2].imm_data), 68u);
	// SRQ 1: messages 1 (imm 2748) and 2 (inline, 48 B).
	auto w1 = poll_completions(cq1.get(), 2, 2s);
	ASSERT_EQ(w1.size(), 2u);
	EXPECT_EQ(w1[0].wr_id, 0u);
	EXPECT_TRUE(w1[0].wc_flags & IBV_WC_WITH_IMM);
	EXPECT_EQ(be32toh(w1[0].imm_data), 2748u);
	EXPECT_EQ(check_payload(s1.base, 64, 1, s1.srqn), "");
	EXPECT_EQ(w1[1].wr_id, 1u);
	EXPECT_EQ(w1[1].byte_len, 48u);
	EXPECT_EQ(check_payload(s1.base + 256, 48, 2, s1.srqn), "");
	EXPECT_EQ(stray_completions(cq0.get()), 0u);
	EXPECT_EQ(stray_completions(cq1.get()), 0u);
}

}  // namespace

int main(int argc, char **argv)
{
	if (auto child = xsrc::harness::child_args(argc, argv, "--child")) {
		if (child->args.empty())
			return 2;
		std::string role = child->args.front();
		child->args.erase(child->args.begin());
		return xrc_test::child_main(role, child->link, child->args);
	}
	testing::InitGoogleTest(&argc, argv);
	return RUN_ALL_TESTS();
}
