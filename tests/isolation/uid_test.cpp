// Isolation between users. One binary, three roles:
//   uid_test server PORT | uid_test client HOST PORT
//     The two ends of a traffic check, meant to run as different users (the
//     script starts one as root, one as uid 65534, and then the other way
//     round). Each end is the requester once and the responder once: RC SEND
//     (large, and small enough for the CQ ring), RDMA WRITE, RDMA READ,
//     fetch-and-add, compare-and-swap and a UD SEND, every byte checked, and
//     an RDMA WRITE through the responder's type 2 memory window; then
//     access errors: an rkey without remote access, a key nobody registered,
//     the window's rkey through another QP than it was bound on (from the
//     unprivileged end with the window's arena entry forged to name no QP),
//     and (from the unprivileged end) an MR entry forged in the
//     world-writable arena must each give IBV_WC_REM_ACCESS_ERR with nothing
//     written.
//   uid_test handles
//     As root: makes objects, then runs itself as uid 65534 (`probe`) with
//     their handle numbers: a second user cannot use, query or destroy them,
//     cannot register memory it has not mapped, cannot open an XRC domain on
//     a file it may not open; root's objects still work afterwards.
// Every check prints one line; the exit status is 0 only if all passed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <xsrc-abi.h>
#include <xsrc-queues.h>

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "device_test_util.h"
#include "harness/arena.h"
#include "harness/link.h"
#include "harness/qp_connect.h"

using namespace xsrc_test;

namespace {

int failures = 0;

void check(bool ok, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("%s: ", ok ? "ok" : "FAIL");
	vprintf(fmt, ap);
	printf("\n");
	fflush(stdout);
	va_end(ap);
	if (!ok)
		++failures;
}

[[noreturn]] void die(const char *what)
{
	printf("FAIL: %s: %s\n", what, strerror(errno));
	exit(2);
}

constexpr int kGidIndex = 1;
constexpr int kRcPairs = 9;      // 0: traffic; 1-3 and 4-6: the error cases of each direction; 7, 8: the window's
constexpr size_t kBig = 64 * 1024;
constexpr size_t kSmall = 100;
constexpr size_t kUd = 512;
constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kAllAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// Layout of each side's registered buffer.
constexpr size_t kRecvOff = 0;                 // RC SENDs land here (big, then small)
constexpr size_t kRdmaOff = 128 * 1024;        // WRITE target [0,64K), READ source [64K,128K)
constexpr size_t kCounterOff = 256 * 1024;     // the atomics' target
constexpr size_t kUdOff = 260 * 1024;          // UD receive (GRH + payload)
constexpr size_t kWinOff = 384 * 1024;         // a type 2 window's 64 bytes, then 64 outside it
constexpr size_t kWinLen = 64;
constexpr size_t kForgeOff = 448 * 1024;       // LOCAL_WRITE, never posted: a forged receive's target
constexpr size_t kForgeLen = 8192;             // past a CQ ring's big slot: the device copies it
constexpr size_t kLocalOff = 512 * 1024;       // our own sources and destinations
constexpr size_t kBufLen = 1024 * 1024;
constexpr size_t kSecretLen = 4096;

struct Info {
	uint32_t rc_qpn[kRcPairs];
	uint32_t ud_qpn;
	uint8_t gid[16];
	uint64_t buf;
	uint32_t rkey;
	uint32_t secret_rkey;  // LOCAL_WRITE only
	uint64_t secret;
	uint32_t uid;
	uint32_t pd_id;        // for the forged entry
};

// --- the link between the two ends ------------------------------------------------

xsrc::harness::Link g_link;  // TCP between the two users' processes

template <typename T>
void link_send(const T &v)
{
	if (!g_link.send_value(v))
		die("link send");
}

template <typename T>
void link_recv(T *v)
{
	if (!g_link.recv_value(v, xsrc::harness::kForever))
		die("link recv");
}

void sync_point(uint32_t tag)
{
	link_send(tag);
	uint32_t other;
	link_recv(&other);
	if (other != tag) {
		printf("FAIL: out of step (%u vs %u)\n", tag, other);
		exit(2);
	}
}

void connect_link(const char *host, const char *port)
{
	xsrc::unique_fd link;
	if (!host) {
		xsrc::unique_fd ls(socket(AF_INET, SOCK_STREAM, 0));
		int one = 1;
		setsockopt(ls.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		sockaddr_in a{};
		a.sin_family = AF_INET;
		a.sin_port = htons(static_cast<uint16_t>(atoi(port)));
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (bind(ls.get(), reinterpret_cast<sockaddr *>(&a), sizeof(a)) || listen(ls.get(), 1))
			die("listen");
		link.reset(accept(ls.get(), nullptr, nullptr));
	} else {
		addrinfo hints{}, *res;
		hints.ai_family = AF_INET;
		hints.ai_socktype = SOCK_STREAM;
		if (getaddrinfo(host, port, &hints, &res))
			die("getaddrinfo");
		for (int i = 0; i < 100; ++i) {
			link.reset(socket(AF_INET, SOCK_STREAM, 0));
			if (connect(link.get(), res->ai_addr, res->ai_addrlen) == 0)
				break;
			link.reset();
			std::this_thread::sleep_for(std::chrono::milliseconds(100));
		}
		freeaddrinfo(res);
	}
	if (!link)
		die("connect");
	g_link = xsrc::harness::Link(std::move(link));
}

// --- verbs ----------------------------------------------------------------------------

struct Side {
	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	ibv_cq *cq = nullptr;
	ibv_qp *rc[kRcPairs] = {};
	ibv_qp *ud = nullptr;
	unsigned char *buf = nullptr;
	unsigned char *secret = nullptr;
	ibv_mr *mr = nullptr;
	ibv_mr *secret_mr = nullptr;
	ibv_mw *mw = nullptr;
	ibv_gid gid{};
	ibv_ah *ah = nullptr;
};

ibv_qp *make_qp(Side &s, ibv_qp_type type)
{
	ibv_qp_init_attr a{};
	a.send_cq = a.recv_cq = s.cq;
	a.qp_type = type;
	a.cap.max_send_wr = a.cap.max_recv_wr = 16;
	a.cap.max_send_sge = a.cap.max_recv_sge = 2;
	ibv_qp *qp = ibv_create_qp(s.pd, &a);
	if (!qp)
		die("create qp");
	return qp;
}

xsrc::harness::QpConnectAttrs qp_attrs()
{
	xsrc::harness::QpConnectAttrs a;
	a.qkey = kQkey;
	a.sgid_index = kGidIndex;
	a.hop_limit = 64;
	return a;
}

void to_init(ibv_qp *qp)
{
	if (xsrc::harness::qp_to_init(qp, qp_attrs()))
		die("to init");
}

void rc_connect(ibv_qp *qp, uint32_t dest, const uint8_t *dgid)
{
	xsrc::harness::QpRemote remote{dest, {}};
	memcpy(remote.gid.raw, dgid, 16);
	if (xsrc::harness::qp_to_rtr(qp, remote, qp_attrs()))
		die("to rtr");
	if (xsrc::harness::qp_to_rts(qp, qp_attrs()))
		die("to rts");
}

void ud_ready(ibv_qp *qp)
{
	if (xsrc::harness::qp_to_rtr(qp, {}, qp_attrs()))
		die("ud rtr");
	if (xsrc::harness::qp_to_rts(qp, qp_attrs()))
		die("ud rts");
}

Info setup(Side &s)
{
	s.ctx = open_device(test_device());
	if (!s.ctx)
		die("open device");
	s.pd = ibv_alloc_pd(s.ctx);
	s.cq = ibv_create_cq(s.ctx, 256, nullptr, nullptr, 0);
	if (!s.pd || !s.cq)
		die("pd/cq");
	s.buf = static_cast<unsigned char *>(aligned_alloc(4096, kBufLen));
	s.secret = static_cast<unsigned char *>(aligned_alloc(4096, kSecretLen));
	memset(s.buf, 0, kBufLen);
	memset(s.secret, 0x5a, kSecretLen);
	s.mr = ibv_reg_mr(s.pd, s.buf, kBufLen, kAllAccess | IBV_ACCESS_MW_BIND);
	s.secret_mr = ibv_reg_mr(s.pd, s.secret, kSecretLen, IBV_ACCESS_LOCAL_WRITE);
	if (!s.mr || !s.secret_mr)
		die("reg mr");
	if (ibv_query_gid(s.ctx, 1, kGidIndex, &s.gid))
		die("query gid");
	Info me{};
	for (int i = 0; i < kRcPairs; ++i) {
		s.rc[i] = make_qp(s, IBV_QPT_RC);
		to_init(s.rc[i]);
		me.rc_qpn[i] = s.rc[i]->qp_num;
	}
	s.ud = make_qp(s, IBV_QPT_UD);
	to_init(s.ud);
	ud_ready(s.ud);
	me.ud_qpn = s.ud->qp_num;
	memcpy(me.gid, s.gid.raw, 16);
	me.buf = ptr(s.buf);
	me.rkey = s.mr->rkey;
	me.secret_rkey = s.secret_mr->rkey;
	me.secret = ptr(s.secret);
	me.uid = getuid();
	return me;
}

// The next completion (bounded wait).
bool poll_one(Side &s, ibv_wc &wc)
{
	auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
	while (std::chrono::steady_clock::now() < until) {
		int n = ibv_poll_cq(s.cq, 1, &wc);
		if (n == 1)
			return true;
		if (n < 0)
			return false;
		std::this_thread::yield();
	}
	return false;
}

void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; ++i)
		p[i] = static_cast<unsigned char>(seed * 31 + i * 7 + (i >> 8));
}

bool same(const unsigned char *p, size_t n, unsigned seed)
{
	std::vector<unsigned char> want(n);
	fill(want.data(), n, seed);
	return memcmp(p, want.data(), n) == 0;
}

int post(ibv_qp *qp, ibv_wr_opcode op, ibv_sge sge, uint64_t raddr = 0, uint32_t rkey = 0,
	 uint64_t cmp = 0, uint64_t swap = 0, ibv_ah *ah = nullptr, uint32_t qpn = 0)
{
	ibv_send_wr wr{}, *bad;
	wr.wr_id = op;
	wr.opcode = op;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = cmp;
		wr.wr.atomic.swap = swap;
	} else if (ah) {
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = qpn;
		wr.wr.ud.remote_qkey = kQkey;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	return ibv_post_send(qp, &wr, &bad);
}

void post_recv(ibv_qp *qp, Side &s, size_t off, size_t len)
{
	ibv_sge sge{ptr(s.buf + off), static_cast<uint32_t>(len), s.mr->lkey};
	ibv_recv_wr wr{}, *bad;
	wr.wr_id = off;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (ibv_post_recv(qp, &wr, &bad))
		die("post recv");
}

// One operation as the requester: post it and wait for its completion.
ibv_wc_status run_op(Side &s, ibv_qp *qp, ibv_wr_opcode op, ibv_sge sge, uint64_t raddr = 0, uint32_t rkey = 0,
		     uint64_t cmp = 0, uint64_t swap = 0, ibv_ah *ah = nullptr, uint32_t qpn = 0)
{
	if (post(qp, op, sge, raddr, rkey, cmp, swap, ah, qpn))
		return IBV_WC_GENERAL_ERR;
	ibv_wc wc{};
	if (!poll_one(s, wc))
		return IBV_WC_GENERAL_ERR;
	return wc.status;
}

const char *who(const Info &i) { return i.uid == 0 ? "root" : "uid 65534"; }

// A type 2 window over [kWinOff, +kWinLen) of our buffer, bound on rc[0]
// with remote write; its rkey (0 when it failed).
uint32_t bind_window(Side &s)
{
	s.mw = ibv_alloc_mw(s.pd, IBV_MW_TYPE_2);
	check(s.mw != nullptr, "ibv_alloc_mw type 2");
	if (!s.mw)
		return 0;
	ibv_send_wr wr{}, *bad;
	wr.wr_id = 0xb1;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = s.mw;
	wr.bind_mw.rkey = ibv_inc_rkey(s.mw->rkey);
	wr.bind_mw.bind_info = {s.mr, ptr(s.buf + kWinOff), kWinLen, IBV_ACCESS_REMOTE_WRITE};
	ibv_wc wc{};
	bool ok = ibv_post_send(s.rc[0], &wr, &bad) == 0 && poll_one(s, wc) && wc.status == IBV_WC_SUCCESS &&
		  wc.opcode == IBV_WC_BIND_MW;
	check(ok, "a type 2 window bound on the traffic QP");
	return ok ? wr.bind_mw.rkey : 0;
}

void requester(Side &s, const Info &me, const Info &peer, unsigned phase, int err_base)
{
	unsigned char *local = s.buf + kLocalOff;
	uint32_t lkey = s.mr->lkey;
	sync_point(phase);  // the responder's receives are posted
	uint32_t window_rkey = 0;
	link_recv(&window_rkey);
	printf("-- %s -> %s\n", who(me), who(peer));

	fill(local, kBig, phase + 1);
	check(run_op(s, s.rc[0], IBV_WR_SEND, {ptr(local), kBig, lkey}) == IBV_WC_SUCCESS, "RC SEND 64 KiB");
	fill(local + kBig, kSmall, phase + 2);
	check(run_op(s, s.rc[0], IBV_WR_SEND, {ptr(local + kBig), kSmall, lkey}) == IBV_WC_SUCCESS,
	      "RC SEND 100 B");
	fill(local, kBig, phase + 3);
	check(run_op(s, s.rc[0], IBV_WR_RDMA_WRITE, {ptr(local), kBig, lkey}, peer.buf + kRdmaOff, peer.rkey) ==
		      IBV_WC_SUCCESS,
	      "RDMA WRITE 64 KiB");
	memset(local, 0, kBig);
	check(run_op(s, s.rc[0], IBV_WR_RDMA_READ, {ptr(local), kBig, lkey}, peer.buf + kRdmaOff + kBig, peer.rkey) ==
			      IBV_WC_SUCCESS &&
		      same(local, kBig, phase + 4),
	      "RDMA READ 64 KiB, data as the peer wrote it");
	uint64_t *result = reinterpret_cast<uint64_t *>(local);
	*result = 0;
	ibv_wc_status st = run_op(s, s.rc[0], IBV_WR_ATOMIC_FETCH_AND_ADD, {ptr(result), 8, lkey},
				  peer.buf + kCounterOff, peer.rkey, 5);
	unsigned long long old = *result;
	check(st == IBV_WC_SUCCESS && old == 100, "FETCH_ADD +5 returned %llu (want 100)", old);
	*result = 0;
	st = run_op(s, s.rc[0], IBV_WR_ATOMIC_CMP_AND_SWP, {ptr(result), 8, lkey}, peer.buf + kCounterOff,
		    peer.rkey, 105, 7);
	old = *result;
	check(st == IBV_WC_SUCCESS && old == 105, "CMP_SWAP 105->7 returned %llu (want 105)", old);
	fill(local, kUd, phase + 5);
	ibv_ah_attr ah{};
	ah.is_global = 1;
	ah.port_num = 1;
	ah.grh.sgid_index = kGidIndex;
	ah.grh.hop_limit = 64;
	memcpy(ah.grh.dgid.raw, peer.gid, 16);
	s.ah = ibv_create_ah(s.pd, &ah);
	check(s.ah && run_op(s, s.ud, IBV_WR_SEND, {ptr(local), kUd, lkey}, 0, 0, 0, 0, s.ah, peer.ud_qpn) ==
				      IBV_WC_SUCCESS,
	      "UD SEND 512 B");
	fill(local, kWinLen, phase + 7);
	check(run_op(s, s.rc[0], IBV_WR_RDMA_WRITE, {ptr(local), kWinLen, lkey}, peer.buf + kWinOff, window_rkey) ==
		      IBV_WC_SUCCESS,
	      "RDMA WRITE through the peer's type 2 window");
	sync_point(10 + phase);  // the peer checks what arrived

	// Access errors, each on a fresh connection (the first error ends one).
	// The window answers only the QP it was bound on (type 2B). The
	// unprivileged end first rewrites the window's arena entry to "bound to
	// no QP", so that only the device's own record refuses it.
	std::optional<xsrc::harness::MappedArena> warena;
	if (me.uid != 0)
		warena.emplace(test_device());
	xsrc_mr_entry *forged = nullptr;
	if (warena && warena->ok()) {
		forged = warena->mr_table() + (window_rkey >> 8);
		check(forged->key == window_rkey && forged->bound_qpn == peer.rc_qpn[0],
		      "the window's arena entry names the QP it was bound on");
		forged->bound_qpn = 0;
	}
	fill(local, kWinLen, phase + 8);
	st = run_op(s, s.rc[err_base == 1 ? 7 : 8], IBV_WR_RDMA_WRITE, {ptr(local), kWinLen, lkey},
		    peer.buf + kWinOff, window_rkey);
	check(st == IBV_WC_REM_ACCESS_ERR, "RDMA WRITE through the window on another QP%s: %s",
	      forged ? " (its arena entry forged)" : "", ibv_wc_status_str(st));
	if (forged)
		forged->bound_qpn = peer.rc_qpn[0];
	warena.reset();
	fill(local, 64, phase + 6);
	st = run_op(s, s.rc[err_base], IBV_WR_RDMA_WRITE, {ptr(local), 64, lkey}, peer.secret,
				  peer.secret_rkey);
	check(st == IBV_WC_REM_ACCESS_ERR, "RDMA WRITE with an rkey without remote access: %s",
	      ibv_wc_status_str(st));
	uint32_t bogus = (peer.rkey & ~0xffu) + 0x7f00;  // an index nobody registered
	st = run_op(s, s.rc[err_base + 1], IBV_WR_RDMA_WRITE, {ptr(local), 64, lkey}, peer.secret, bogus);
	check(st == IBV_WC_REM_ACCESS_ERR, "RDMA WRITE with an unregistered rkey: %s", ibv_wc_status_str(st));
	if (me.uid != 0) {
		// Forge an MR entry in the arena (which anyone may write) that
		// grants remote write on the peer's secret: the device must not
		// believe it.
		xsrc::harness::MappedArena arena(test_device());
		check(arena.ok(), "the arena is writable by uid %u", me.uid);
		if (arena.ok()) {
			xsrc_mr_entry *mrs = arena.mr_table();
			const xsrc_qp_entry &target = arena.qp_entry(peer.rc_qpn[err_base + 2]);
			uint32_t index = XSRC_MR_TABLE_LEN - 2;
			xsrc_mr_entry &e = mrs[index];
			e.pd_id = target.pd_id;
			e.access = kAllAccess;
			e.owner_pid = target.owner_pid;
			e.addr = e.iova = peer.secret;
			e.length = kSecretLen;
			uint32_t key = index << 8 | 0x42;
			std::atomic_ref<uint32_t>(e.key).store(key, std::memory_order_release);
			st = run_op(s, s.rc[err_base + 2], IBV_WR_RDMA_WRITE, {ptr(local), 64, lkey}, peer.secret, key);
			check(st == IBV_WC_REM_ACCESS_ERR, "RDMA WRITE through a forged arena MR entry: %s",
			      ibv_wc_status_str(st));
			std::atomic_ref<uint32_t>(e.key).store(0, std::memory_order_release);
			e = xsrc_mr_entry{};
		}
	}
	sync_point(20 + phase);
}

void responder(Side &s, const Info &me, const Info &peer, unsigned phase)
{
	fill(s.buf + kRdmaOff + kBig, kBig, phase + 4);
	*reinterpret_cast<uint64_t *>(s.buf + kCounterOff) = 100;
	memset(s.buf + kRecvOff, 0, kBig + kSmall);
	memset(s.buf + kRdmaOff, 0, kBig);
	post_recv(s.rc[0], s, kRecvOff, kBig);
	post_recv(s.rc[0], s, kRecvOff + kBig, kSmall);
	post_recv(s.ud, s, kUdOff, 40 + kUd);
	memset(s.buf + kWinOff, 0x5a, 2 * kWinLen);
	uint32_t window_rkey = bind_window(s);
	sync_point(phase);  // ready
	link_send(window_rkey);

	sync_point(10 + phase);  // the requester is done
	printf("-- %s <- %s\n", who(me), who(peer));
	int got = 0;
	ibv_wc wc;
	bool ok = true;
	while (got < 3 && poll_one(s, wc)) {
		ok &= wc.status == IBV_WC_SUCCESS;
		++got;
	}
	check(got == 3 && ok, "3 receives completed successfully (%d)", got);
	check(same(s.buf + kRecvOff, kBig, phase + 1), "RC SEND 64 KiB arrived intact");
	check(same(s.buf + kRecvOff + kBig, kSmall, phase + 2), "RC SEND 100 B arrived intact");
	check(same(s.buf + kRdmaOff, kBig, phase + 3), "RDMA WRITE 64 KiB arrived intact");
	unsigned long long counter = *reinterpret_cast<uint64_t *>(s.buf + kCounterOff);
	check(counter == 7, "atomics left 7 in the counter (%llu)", counter);
	check(same(s.buf + kUdOff + 40, kUd, phase + 5), "UD SEND arrived intact after the GRH");
	check(same(s.buf + kWinOff, kWinLen, phase + 7), "RDMA WRITE through the window arrived intact");

	sync_point(20 + phase);  // the error cases are done
	bool untouched = true;
	for (size_t i = 0; i < kSecretLen; ++i)
		untouched &= s.secret[i] == 0x5a;
	check(untouched, "nothing was written to the memory without remote access");
	untouched = true;
	for (size_t i = kWinOff + kWinLen; i < kWinOff + 2 * kWinLen; ++i)
		untouched &= s.buf[i] == 0x5a;
	check(untouched, "nothing was written past the window");
	check(same(s.buf + kWinOff, kWinLen, phase + 7), "the window holds what came through its own QP");
	ibv_dealloc_mw(s.mw);
	s.mw = nullptr;
	// Drain the flushes of the error connections.
	while (ibv_poll_cq(s.cq, 1, &wc) > 0) {
	}
}

// A receive WQE forged in the arena: the process of the second user pushes
// one into root's receive ring, pointing into root's LOCAL_WRITE MR where
// root posted nothing, and SENDs into it. The device checks the copy against
// the receive root posted (its private record), so the SEND fails and root's
// memory is untouched.
void forged_receive(Side &s, const Info &me, const Info &peer)
{
	ibv_qp *qp = make_qp(s, IBV_QPT_RC);
	to_init(qp);
	uint32_t qpn = qp->qp_num, peer_qpn = 0;
	link_send(qpn);
	link_recv(&peer_qpn);
	rc_connect(qp, peer_qpn, peer.gid);
	bool forger = me.uid != 0;
	if (!forger)
		memset(s.buf + kForgeOff, 0x33, kForgeLen);
	sync_point(30);  // root's QP is ready, its receive queue empty
	if (forger) {
		xsrc::harness::MappedArena arena(test_device());
		check(arena.ok(), "the second user maps the arena writable");
		if (arena.ok())
			check(arena.forge_receive(peer_qpn, 0xf0f0, {peer.buf + kForgeOff, uint32_t(kForgeLen), peer.rkey}),
			      "a receive forged into root's ring");
		unsigned char *local = s.buf + kLocalOff;
		memset(local, 0xee, kForgeLen);
		ibv_wc_status st = run_op(s, qp, IBV_WR_SEND, {ptr(local), uint32_t(kForgeLen), s.mr->lkey});
		check(st != IBV_WC_SUCCESS, "SEND into a receive forged in the arena fails (%s)", ibv_wc_status_str(st));
	}
	sync_point(31);
	if (!forger) {
		bool untouched = true;
		for (size_t i = 0; i < kForgeLen; ++i)
			untouched &= s.buf[kForgeOff + i] == 0x33;
		check(untouched, "nothing was written where root posted no receive");
	}
	ibv_wc wc;
	while (ibv_poll_cq(s.cq, 1, &wc) > 0) {
	}
	ibv_destroy_qp(qp);
}

int traffic(const char *host, const char *port)
{
	bool server = host == nullptr;
	connect_link(host, port);
	Side s;
	Info me = setup(s), peer{};
	link_send(me);
	link_recv(&peer);
	printf("-- %s (pid %d) with %s\n", who(me), getpid(), who(peer));
	for (int i = 0; i < kRcPairs; ++i)
		rc_connect(s.rc[i], peer.rc_qpn[i], peer.gid);
	sync_point(1);
	// Phase 100: the client requests; phase 200: the server does.
	if (server) {
		responder(s, me, peer, 100);
		sync_point(2);
		requester(s, me, peer, 200, 4);
	} else {
		requester(s, me, peer, 100, 1);
		sync_point(2);
		responder(s, me, peer, 200);
	}
	sync_point(3);
#if XSRC_DRIVER_ABI_REVISION >= 9
	forged_receive(s, me, peer);
#endif
	return failures ? 1 : 0;
}

// --- handles ------------------------------------------------------------------------

int raw_query_qp(int fd, uint32_t handle)
{
	ib_uverbs_query_qp_resp resp{};
	ib_uverbs_query_qp cmd{};
	cmd.response = ptr(&resp);
	cmd.qp_handle = handle;
	cmd.attr_mask = IBV_QP_STATE;
	return raw_write(fd, legacy_cmd(IB_USER_VERBS_CMD_QUERY_QP, cmd, sizeof(resp)));
}

int raw_destroy_qp(int fd, uint32_t handle)
{
	ib_uverbs_destroy_qp_resp resp{};
	ib_uverbs_destroy_qp cmd{};
	cmd.response = ptr(&resp);
	cmd.qp_handle = handle;
	return raw_write(fd, legacy_cmd(IB_USER_VERBS_CMD_DESTROY_QP, cmd, sizeof(resp)));
}

int raw_modify_qp_to_err(int fd, uint32_t handle)
{
	ib_uverbs_modify_qp cmd{};
	cmd.qp_handle = handle;
	cmd.attr_mask = IBV_QP_STATE;
	cmd.qp_state = IBV_QPS_ERR;
	return raw_write(fd, legacy_cmd(IB_USER_VERBS_CMD_MODIFY_QP, cmd, 0));
}

#if XSRC_DRIVER_ABI_REVISION >= 2
int raw_copy(int fd, uint32_t qp_handle, uint32_t peer_qpn, uint32_t rkey, uint64_t addr, void *local, size_t len)
{
	xsrc_copy_resp resp{};
	iovec iov{local, len};
	xsrc_copy cmd{};
	cmd.response = ptr(&resp);
	cmd.op = XSRC_COPY_READ;
	cmd.key_kind = XSRC_COPY_RKEY;
	cmd.key = rkey;
	cmd.qp_handle = qp_handle;
	cmd.peer_qpn = peer_qpn;
	cmd.peer_addr = addr;
	cmd.length = len;
	cmd.local_iov = ptr(&iov);
	cmd.num_local = 1;
	int err = raw_write(fd, legacy_cmd(XSRC_CMD_COPY, cmd, sizeof(resp)));
	return err ? err : -static_cast<int>(resp.status);
}
#endif

// The second user's side: argv = pd cq qp mr qpn rkey addr root_pid cmd_fd locked_file readable_file
int probe(char **argv)
{
	uint32_t pd = std::stoul(argv[0]), cq = std::stoul(argv[1]), qp = std::stoul(argv[2]);
	uint32_t mr = std::stoul(argv[3]), qpn = std::stoul(argv[4]), rkey = std::stoul(argv[5]);
	uint64_t addr = std::stoull(argv[6]);
	std::string root_pid = argv[7], root_fd = argv[8], locked = argv[9], readable = argv[10];
	printf("-- uid %u probes root's objects\n", getuid());
	ibv_context *ctx = open_device(test_device());
	if (!ctx)
		die("open device as the second user");
	int fd = ctx->cmd_fd;
	// Handles name objects of the caller's own context: this one has none.
	check(raw_query_qp(fd, qp) == EINVAL, "QUERY_QP on root's QP handle: EINVAL");
	check(raw_modify_qp_to_err(fd, qp) == EINVAL, "MODIFY_QP on root's QP handle: EINVAL");
	check(raw_destroy_qp(fd, qp) == EINVAL, "DESTROY_QP on root's QP handle: EINVAL");
	check(raw_destroy_cq(fd, cq) == EINVAL, "DESTROY_CQ on root's CQ handle: EINVAL");
	check(raw_dereg_mr(fd, mr) == EINVAL, "DEREG_MR on root's MR handle: EINVAL");
	check(raw_dealloc_pd(fd, pd) == EINVAL, "DEALLOC_PD on root's PD handle: EINVAL");
	char scratch[64];
	check(raw_reg_mr(fd, pd, scratch, sizeof(scratch), IB_UVERBS_ACCESS_LOCAL_WRITE) == EINVAL,
	      "REG_MR on root's PD handle: EINVAL");
#if XSRC_DRIVER_ABI_REVISION >= 2
	int cr = raw_copy(fd, qp, qpn, rkey, addr, scratch, 8);
	check(cr == EINVAL, "COPY through root's QP handle: EINVAL (%d)", cr);
#endif
	// Its own objects get handles of its own context, independent of root's.
	ibv_pd *own = ibv_alloc_pd(ctx);
	check(own != nullptr, "its own PD (handle %u)", own ? own->handle : 0);

	// Memory it has not mapped, or may not write.
	long page = sysconf(_SC_PAGESIZE);
	void *gone = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(gone, page);
	// The errno of a registration that must fail (0 if it did not).
	auto reg_errno = [&](void *p, size_t len, int access) {
		errno = 0;
		ibv_mr *m = own ? ibv_reg_mr(own, p, len, access) : nullptr;
		int err = m ? 0 : errno;
		if (m)
			ibv_dereg_mr(m);
		return err;
	};
	int err = reg_errno(gone, page, IBV_ACCESS_LOCAL_WRITE);
	check(err == EFAULT, "REG_MR of unmapped memory: EFAULT (%s)", strerror(err));
	// Root's buffer address: another process's memory, normally not mapped
	// here at all (mincore says ENOMEM for an unmapped range).
	unsigned char vec[1];
	if (mincore(reinterpret_cast<void *>(addr & ~uint64_t(page - 1)), page, vec) != 0 && errno == ENOMEM) {
		err = reg_errno(reinterpret_cast<void *>(addr), 4096, 0);
		check(err == EFAULT, "REG_MR of root's buffer address (not mapped here): EFAULT (%s)",
		      strerror(err));
	} else {
		printf("skipped: root's buffer address happens to be mapped here too\n");
	}
	void *ro = mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	err = reg_errno(ro, page, IBV_ACCESS_LOCAL_WRITE);
	check(err == EFAULT, "REG_MR with LOCAL_WRITE of a read-only mapping: EFAULT (%s)", strerror(err));
	ibv_mr *ro_mr = own ? ibv_reg_mr(own, ro, page, 0) : nullptr;
	check(ro_mr != nullptr, "REG_MR read-only of a read-only mapping works");
	if (ro_mr)
		ibv_dereg_mr(ro_mr);

	// Root's command file is out of reach.
	std::string link = "/proc/" + root_pid + "/fd/" + root_fd;
	int stolen = open(link.c_str(), O_RDWR | O_CLOEXEC);
	err = stolen < 0 ? errno : 0;
	check(err == EACCES || err == EPERM, "open(%s): %s", link.c_str(), strerror(err));
	if (stolen >= 0)
		close(stolen);

	// XRC domains: the file's permissions decide, as with the kernel.
	int lf = open(locked.c_str(), O_RDONLY | O_CLOEXEC);
	err = lf < 0 ? errno : 0;
	check(err == EACCES, "open of a 0600 root file: EACCES (%s)", strerror(err));
	ibv_xrcd_init_attr xa{};
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	xa.fd = 1000;  // not open here
	xa.oflags = O_CREAT;
	ibv_xrcd *x = ibv_open_xrcd(ctx, &xa);
	err = x ? 0 : errno;
	check(err == EBADF, "OPEN_XRCD with an fd it does not have: EBADF (%s)", strerror(err));
	int rf = open(readable.c_str(), O_RDONLY | O_CLOEXEC);
	xa.fd = rf;
	x = rf >= 0 ? ibv_open_xrcd(ctx, &xa) : nullptr;
	check(x != nullptr, "OPEN_XRCD on a file it may read (O_RDONLY fd) works, as with the kernel");
	if (x)
		ibv_close_xrcd(x);
	if (rf >= 0)
		close(rf);
	if (own)
		ibv_dealloc_pd(own);
	ibv_close_device(ctx);
	return failures ? 1 : 0;
}

int handles(const char *self)
{
	Side s;
	setup(s);
	ibv_qp *qp = s.rc[0];
	char dir[] = "/tmp/xsrc-iso-XXXXXX";
	if (!mkdtemp(dir) || chmod(dir, 0755))
		die("mkdtemp");
	std::string locked = std::string(dir) + "/locked", readable = std::string(dir) + "/readable";
	int lf = open(locked.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	int rf = open(readable.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
	if (lf < 0 || rf < 0 || fchmod(lf, 0600) || fchmod(rf, 0644))
		die("xrc files");
	close(lf);
	close(rf);
	std::vector<std::string> args = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
					 self, "probe",
					 std::to_string(s.pd->handle), std::to_string(s.cq->handle),
					 std::to_string(qp->handle), std::to_string(s.mr->handle),
					 std::to_string(qp->qp_num), std::to_string(s.mr->rkey),
					 std::to_string(ptr(s.buf)), std::to_string(getpid()),
					 std::to_string(s.ctx->cmd_fd), locked, readable};
	pid_t child = fork();
	if (child == 0) {
		std::vector<char *> argv;
		for (auto &a : args)
			argv.push_back(a.data());
		argv.push_back(nullptr);
		execvp("setpriv", argv.data());
		_exit(127);
	}
	int status = 0;
	waitpid(child, &status, 0);
	check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the second user's probe passed (status %d)", status);
	unlink(locked.c_str());
	unlink(readable.c_str());
	rmdir(dir);

	printf("-- root's objects after the probe\n");
	ibv_qp_attr attr{};
	ibv_qp_init_attr init{};
	check(ibv_query_qp(qp, &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state == IBV_QPS_INIT,
	      "root's QP is still there, still in INIT");
	for (auto *q : s.rc)
		check(ibv_destroy_qp(q) == 0, "destroy root's QP");
	check(ibv_destroy_qp(s.ud) == 0, "destroy root's UD QP");
	check(ibv_dereg_mr(s.mr) == 0 && ibv_dereg_mr(s.secret_mr) == 0, "deregister root's MRs");
	check(ibv_destroy_cq(s.cq) == 0, "destroy root's CQ");
	check(ibv_dealloc_pd(s.pd) == 0, "free root's PD");
	ibv_close_device(s.ctx);
	return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv)
{
	setvbuf(stdout, nullptr, _IOLBF, 0);
	std::string mode = argc > 1 ? argv[1] : "";
	if (mode == "server" && argc == 3)
		return traffic(nullptr, argv[2]);
	if (mode == "client" && argc == 4)
		return traffic(argv[2], argv[3]);
	if (mode == "handles" && argc == 2) {
		char self[4096] = {};
		if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0)
			die("readlink /proc/self/exe");
		return handles(self);
	}
	if (mode == "probe" && argc == 13)
		return probe(argv + 2);
	fprintf(stderr, "usage: %s server PORT | client HOST PORT | handles\n", argv[0]);
	return 2;
}
