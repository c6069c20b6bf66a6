// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// RC across two hosts on the wire, what the pingpongs do not exercise: RDMA
// WRITE and WRITE with immediate from 1 byte to 1 MiB (FIRST/MIDDLE/LAST at
// the path MTU, the data checked on the responder), SEND with immediate,
// RDMA READ (checked at the requester), FetchAdd and CmpSwap (originals and
// the final value exact), ATOMIC WRITE, XRC (a SEND of 3 packets into the
// server's XRC SRQ, an RDMA WRITE, an RDMA READ and atomics through an XRC
// send QP to the server's XRC receive QP), SEND with Invalidate of a type 2 window bound on
// the responder's QP (the completion names the rkey; a WRITE through the
// window then fails with IBV_WC_REM_ACCESS_ERR),
// and the errors: an rkey the responder does not know (IBV_WC_REM_ACCESS_ERR,
// both QPs in ERR, the next request flushed), a write past the MR's end, a
// 1 MiB write whose middle packets meet a hole in the responder's ODP MR
// (those payloads land in batches, xsrcd/wire_deliver.cpp: the hole must
// still be IBV_WC_REM_ACCESS_ERR with both QPs in ERR, and the bytes before
// it in place), an
// RNR NAK that exhausts rnr_retry (IBV_WC_RNR_RETRY_EXC_ERR) and one that a
// late receive ends, and a receive forged in the responder's arena ring
// (never posted): the SEND finds no receive (RNR, then
// IBV_WC_RNR_RETRY_EXC_ERR) and the memory it named stays untouched. The two sides talk over TCP; each scenario gets a fresh
// QP pair.
//   rc_wire_verbs server PORT GID_INDEX [data|readgap|tailloss]
//   rc_wire_verbs client SERVER_ADDRESS PORT GID_INDEX [data|readgap|tailloss]
// "data": the transfers only; "readgap": client_read_gap only; "tailloss":
// client_tail_loss only.
// Exit status 0 when every check passed; each failure is printed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <xsrc-queues.h>

#include "harness/arena.h"
#include "harness/completions.h"
#include "harness/qp_connect.h"

namespace h = xsrc::harness;
using namespace std::chrono_literals;

namespace {

int failures = 0;

void check(bool ok, const std::string &what)
{
	if (!ok) {
		std::printf("FAIL: %s\n", what.c_str());
		++failures;
	}
}

// --- TCP control channel ------------------------------------------------------

bool write_all(int fd, const void *p, size_t n)
{
	auto *b = static_cast<const char *>(p);
	while (n) {
		ssize_t k = write(fd, b, n);
		if (k <= 0)
			return false;
		b += k;
		n -= size_t(k);
	}
	return true;
}

bool read_all(int fd, void *p, size_t n)
{
	auto *b = static_cast<char *>(p);
	while (n) {
		ssize_t k = read(fd, b, n);
		if (k <= 0)
			return false;
		b += k;
		n -= size_t(k);
	}
	return true;
}

template <typename T>
void send_msg(int fd, const T &v)
{
	if (!write_all(fd, &v, sizeof(v))) {
		std::printf("FAIL: control channel write\n");
		std::exit(1);
	}
}

template <typename T>
T recv_msg(int fd)
{
	T v{};
	if (!read_all(fd, &v, sizeof(v))) {
		std::printf("FAIL: control channel read\n");
		std::exit(1);
	}
	return v;
}

int listen_once(const char *port)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	sockaddr_in a{};
	a.sin_family = AF_INET;
	a.sin_port = htons(static_cast<uint16_t>(std::atoi(port)));
	if (bind(s, reinterpret_cast<sockaddr *>(&a), sizeof(a)) || listen(s, 1))
		return -1;
	int c = accept(s, nullptr, nullptr);
	close(s);
	return c;
}

int connect_to(const char *host, const char *port)
{
	addrinfo hints{}, *res = nullptr;
	hints.ai_family = AF_INET;
	hints.ai_socktype = SOCK_STREAM;
	if (getaddrinfo(host, port, &hints, &res))
		return -1;
	int s = socket(res->ai_family, res->ai_socktype, 0);
	for (int i = 0; i < 100; ++i) {
		if (connect(s, res->ai_addr, res->ai_addrlen) == 0) {
			freeaddrinfo(res);
			return s;
		}
		std::this_thread::sleep_for(100ms);
	}
	freeaddrinfo(res);
	return -1;
}

// --- verbs --------------------------------------------------------------------

constexpr size_t kBuf = (1u << 20) + 4096;
// The atomics' counter: past the largest transfer.
constexpr size_t kCounterOffset = (1u << 20) + 64;

// What each side tells the other about a fresh QP.
struct Endpoint {
	uint32_t qpn;
	uint8_t gid[16];
	uint64_t addr;
	uint32_t rkey;
	uint32_t length;
};

struct Side {
	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	ibv_cq *cq = nullptr;
	ibv_qp *qp = nullptr;
	ibv_mr *mr = nullptr;
	std::vector<uint8_t> buf = std::vector<uint8_t>(kBuf);
	uint8_t gid_index = 1;
};

void open_side(Side &s, uint8_t gid_index)
{
	int n = 0;
	ibv_device **list = ibv_get_device_list(&n);
	for (int i = 0; i < n && !s.ctx; ++i)
		if (std::strcmp(ibv_get_device_name(list[i]), "xsrc0") == 0)
			s.ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!s.ctx) {
		std::printf("FAIL: no xsrc0\n");
		std::exit(1);
	}
	s.gid_index = gid_index;
	s.pd = ibv_alloc_pd(s.ctx);
	s.cq = ibv_create_cq(s.ctx, 256, nullptr, nullptr, 0);
	s.mr = ibv_reg_mr(s.pd, s.buf.data(), s.buf.size(),
			  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				  IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND);
	if (!s.pd || !s.cq || !s.mr) {
		std::printf("FAIL: PD/CQ/MR\n");
		std::exit(1);
	}
}

// A fresh QP connected to the other side's, with `attrs`.
void fresh_qp(Side &s, int fd, const h::QpConnectAttrs &attrs)
{
	if (s.qp)
		ibv_destroy_qp(s.qp);
	ibv_qp_init_attr init{};
	init.send_cq = init.recv_cq = s.cq;
	init.qp_type = IBV_QPT_RC;
	init.cap = {64, 64, 4, 4, 64};
	s.qp = ibv_create_qp(s.pd, &init);
	if (!s.qp) {
		std::printf("FAIL: create_qp\n");
		std::exit(1);
	}
	h::QpStep step = h::qp_to_init(s.qp, attrs);
	check(!step, "INIT: " + step.text());
	ibv_gid gid{};
	ibv_query_gid(s.ctx, 1, s.gid_index, &gid);
	Endpoint mine{s.qp->qp_num, {}, reinterpret_cast<uintptr_t>(s.buf.data()), s.mr->rkey, uint32_t(kBuf)};
	std::memcpy(mine.gid, gid.raw, 16);
	send_msg(fd, mine);
	Endpoint theirs = recv_msg<Endpoint>(fd);
	h::QpRemote remote{theirs.qpn, {}};
	std::memcpy(remote.gid.raw, theirs.gid, 16);
	step = h::qp_to_rtr(s.qp, remote, attrs);
	check(!step, "RTR: " + step.text());
	step = h::qp_to_rts(s.qp, attrs);
	check(!step, "RTS: " + step.text());
	// Both RTS before either sends.
	send_msg(fd, uint32_t(1));
	(void)recv_msg<uint32_t>(fd);
	s.buf.assign(kBuf, 0);
}

Endpoint peer;  // the server's endpoint as the client last learned it

void fill(uint8_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; ++i)
		p[i] = static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) & 0xFF);
}

bool matches(const uint8_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; ++i)
		if (p[i] != static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) & 0xFF))
			return false;
	return true;
}

int post_recv(Side &s, uint64_t wr_id)
{
	ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf.data()), uint32_t(kBuf), s.mr->lkey};
	ibv_recv_wr wr{}, *bad = nullptr;
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return ibv_post_recv(s.qp, &wr, &bad);
}

int post_atomic(Side &s, ibv_wr_opcode opcode, uint64_t remote_addr, uint32_t rkey, uint64_t compare_add,
		uint64_t swap, uint64_t wr_id)
{
	ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf.data()), 8, s.mr->lkey};
	ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = wr_id;
	wr.opcode = opcode;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.atomic.remote_addr = remote_addr;
	wr.wr.atomic.rkey = rkey;
	wr.wr.atomic.compare_add = compare_add;
	wr.wr.atomic.swap = swap;
	return ibv_post_send(s.qp, &wr, &bad);
}

int post_send(Side &s, ibv_wr_opcode opcode, size_t len, uint64_t remote_addr, uint32_t rkey, uint32_t imm,
	      uint64_t wr_id)
{
	ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf.data()), uint32_t(len), s.mr->lkey};
	ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = wr_id;
	wr.opcode = opcode;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.imm_data = htonl(imm);
	wr.wr.rdma.remote_addr = remote_addr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(s.qp, &wr, &bad);
}

// One completion within `timeout`, or a status of -1.
ibv_wc one(Side &s, std::chrono::milliseconds timeout = 20s)
{
	auto wcs = h::poll_completions(s.cq, 1, timeout);
	if (wcs.empty()) {
		ibv_wc none{};
		none.status = static_cast<ibv_wc_status>(-1);
		return none;
	}
	return wcs[0];
}

std::string status_text(const ibv_wc &wc)
{
	return int(wc.status) == -1 ? "no completion" : ibv_wc_status_str(wc.status);
}

const std::vector<uint32_t> kSizes = {1, 3, 1023, 1024, 1025, 4096, 65536 + 7, 1u << 20};

// Messages of the control channel after the connection.
enum Step : uint32_t { kCheckWrite = 1, kCheckImm, kCheckSend, kFill, kCheckCounter, kDone };

struct Order {
	uint32_t step;
	uint32_t size;
	uint32_t seed;
};

// --- the client (requester) ------------------------------------------------

void client_writes(Side &s, int fd)
{
	fresh_qp(s, fd, {.sgid_index = s.gid_index});
	peer = recv_msg<Endpoint>(fd);
	uint32_t seed = 1;
	for (uint32_t size : kSizes) {
		fill(s.buf.data(), size, ++seed);
		check(post_send(s, IBV_WR_RDMA_WRITE, size, peer.addr, peer.rkey, 0, 1) == 0, "post RDMA WRITE");
		ibv_wc wc = one(s);
		check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE,
		      "RDMA WRITE " + std::to_string(size) + ": " + status_text(wc));
		send_msg(fd, Order{kCheckWrite, size, seed});
		check(recv_msg<uint32_t>(fd) == 1, "RDMA WRITE " + std::to_string(size) + ": data differs at the responder");

		fill(s.buf.data(), size, ++seed);
		send_msg(fd, Order{kCheckImm, size, seed});  // the responder posts a receive first
		(void)recv_msg<uint32_t>(fd);
		check(post_send(s, IBV_WR_RDMA_WRITE_WITH_IMM, size, peer.addr, peer.rkey, size, 2) == 0,
		      "post RDMA WRITE with immediate");
		wc = one(s);
		check(wc.status == IBV_WC_SUCCESS, "RDMA WRITE with immediate " + std::to_string(size) + ": " + status_text(wc));
		check(recv_msg<uint32_t>(fd) == 1, "RDMA WRITE with immediate " + std::to_string(size) + ": responder saw wrong data");

		fill(s.buf.data(), size, ++seed);
		send_msg(fd, Order{kCheckSend, size, seed});
		(void)recv_msg<uint32_t>(fd);
		check(post_send(s, IBV_WR_SEND_WITH_IMM, size, 0, 0, size ^ 0xABCD, 3) == 0, "post SEND with immediate");
		wc = one(s);
		check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND,
		      "SEND with immediate " + std::to_string(size) + ": " + status_text(wc));
		check(recv_msg<uint32_t>(fd) == 1, "SEND with immediate " + std::to_string(size) + ": responder saw wrong data");
		std::printf("ok: RDMA WRITE, WRITE with immediate, SEND with immediate of %u bytes\n", size);
	}
	send_msg(fd, Order{kDone, 0, 0});
}

// RDMA READ from 1 byte to 1 MiB (the responder fills its buffer first),
// then atomics: FetchAdds whose originals count up, CmpSwaps that do and do
// not swap, and the responder's counter at the end.
void client_reads_and_atomics(Side &s, int fd)
{
	fresh_qp(s, fd, {.sgid_index = s.gid_index});
	peer = recv_msg<Endpoint>(fd);
	uint32_t seed = 100;
	for (uint32_t size : kSizes) {
		send_msg(fd, Order{kFill, size, ++seed});
		(void)recv_msg<uint32_t>(fd);
		std::memset(s.buf.data(), 0, size);
		check(post_send(s, IBV_WR_RDMA_READ, size, peer.addr, peer.rkey, 0, 4) == 0, "post RDMA READ");
		ibv_wc wc = one(s);
		check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ && wc.byte_len == size,
		      "RDMA READ " + std::to_string(size) + ": " + status_text(wc));
		check(matches(s.buf.data(), size, seed), "RDMA READ " + std::to_string(size) + ": wrong data");
		std::printf("ok: RDMA READ of %u bytes\n", size);
	}
	send_msg(fd, Order{kFill, 8, 0});  // the counter starts at 0
	(void)recv_msg<uint32_t>(fd);
	uint64_t counter = peer.addr + kCounterOffset;
	constexpr int kAdds = 200;
	bool originals_ok = true;
	for (int i = 0; i < kAdds; ++i) {
		check(post_atomic(s, IBV_WR_ATOMIC_FETCH_AND_ADD, counter, peer.rkey, 3, 0, 5) == 0, "post FetchAdd");
		ibv_wc wc = one(s);
		uint64_t original;
		std::memcpy(&original, s.buf.data(), 8);
		check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_FETCH_ADD, "FetchAdd: " + status_text(wc));
		originals_ok = originals_ok && original == uint64_t(3 * i);
	}
	check(originals_ok, "FetchAdd originals do not count up by 3");
	auto cmp_swap = [&](uint64_t compare, uint64_t swap) {
		check(post_atomic(s, IBV_WR_ATOMIC_CMP_AND_SWP, counter, peer.rkey, compare, swap, 6) == 0, "post CmpSwap");
		ibv_wc wc = one(s);
		check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_COMP_SWAP, "CmpSwap: " + status_text(wc));
		uint64_t original;
		std::memcpy(&original, s.buf.data(), 8);
		return original;
	};
	check(cmp_swap(3 * kAdds, 42) == 3 * kAdds, "CmpSwap that swaps: wrong original");
	check(cmp_swap(1, 7) == 42, "CmpSwap that does not swap: wrong original");
	send_msg(fd, Order{kCheckCounter, 0, 42});
	check(recv_msg<uint32_t>(fd) == 1, "the responder's counter is not 42");
	std::printf("ok: %d FetchAdds, 2 CmpSwaps, the counter exact\n", kAdds);
	// ATOMIC WRITE (IBTA 1.5): the 8 bytes of the gather list, at once.
	uint64_t value = 0x5a5a5a5;
	std::memcpy(s.buf.data(), &value, 8);
	check(post_send(s, IBV_WR_ATOMIC_WRITE, 8, counter, peer.rkey, 0, 15) == 0, "post ATOMIC WRITE");
	ibv_wc wc = one(s);
	check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_ATOMIC_WRITE, "ATOMIC WRITE: " + status_text(wc));
	send_msg(fd, Order{kCheckCounter, 0, 0x5a5a5a5});
	check(recv_msg<uint32_t>(fd) == 1, "ATOMIC WRITE: the responder's counter is not the value written");
	std::printf("ok: ATOMIC WRITE, the counter exact\n");
	send_msg(fd, Order{kDone, 0, 0});
}

// A local ACK timeout of 4.3 s (timeout 20): what a test of recovery from
// loss must finish within, the recovery not being the timer's.
constexpr uint8_t kLongTimeout = 20;
constexpr auto kLongAckTimeout = std::chrono::milliseconds((uint64_t(4096) << kLongTimeout) / 1000000);

// Posts `op` of `size` bytes at the peer's buffer, then waits up to 60 s
// for its completion; `took`: how long that was.
ibv_wc post_timed(Side &s, ibv_wr_opcode op, uint32_t size, uint64_t wr_id, std::chrono::milliseconds &took)
{
	auto start = std::chrono::steady_clock::now();
	check(post_send(s, op, size, peer.addr, peer.rkey, 0, wr_id) == 0, "post " + std::to_string(op));
	ibv_wc wc = one(s, 60s);
	took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
	return wc;
}

// RDMA READs of 1 MiB with a local ACK timeout of 4.3 s (timeout 20), on a
// link that loses some READ Response MIDDLE packets (rc_wire_read_gap.sh).
// Each must complete, data intact, before its first ACK timeout could have
// run out: the requester asks again from a lost response as soon as a
// later one shows the gap, as rxe does, not when the timer expires. (A
// READ takes some 10-50 ms here; the bound is the timer, not a speed.)
void client_read_gap(Side &s, int fd)
{
	fresh_qp(s, fd, {.sgid_index = s.gid_index, .timeout = kLongTimeout});
	peer = recv_msg<Endpoint>(fd);
	constexpr uint32_t kSize = 1u << 20;
	for (uint32_t seed = 200; seed < 204; ++seed) {
		send_msg(fd, Order{kFill, kSize, seed});
		(void)recv_msg<uint32_t>(fd);
		std::memset(s.buf.data(), 0, kSize);
		std::chrono::milliseconds took;
		ibv_wc wc = post_timed(s, IBV_WR_RDMA_READ, kSize, 16, took);
		auto ms = took.count();
		int before = failures;
		check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ && wc.byte_len == kSize,
		      "RDMA READ past lost responses: " + status_text(wc));
		check(matches(s.buf.data(), kSize, seed), "RDMA READ past lost responses: wrong data");
		check(took < kLongAckTimeout, "RDMA READ past lost responses took " + std::to_string(ms) +
						  " ms: it waited for the ACK timer");
		if (failures == before)
			std::printf("ok: RDMA READ of 1 MiB past lost responses in %lld ms\n", (long long)ms);
	}
	send_msg(fd, Order{kDone, 0, 0});
}

// RDMA WRITEs of 64 KiB with a local ACK timeout of 4.3 s (timeout 20) and
// retry_cnt 0, on a link that drops the last packet of some of them
// (rc_wire_tail_loss.sh). The requester waits for each WRITE before the
// next, so nothing follows a lost last packet and the responder has no gap
// to NAK. Each WRITE must complete, its data in place, before its first
// ACK timeout could have run out, and without spending a retry (there is
// none to spend): after a few milliseconds without news the requester
// sends its last packet again, asking for an ACK (wire_rc.cpp: kStallNs).
void client_tail_loss(Side &s, int fd)
{
	fresh_qp(s, fd, {.sgid_index = s.gid_index, .timeout = kLongTimeout, .retry_cnt = 0});
	peer = recv_msg<Endpoint>(fd);
	constexpr uint32_t kSize = 64u << 10;
	for (uint32_t seed = 300; seed < 312; ++seed) {
		fill(s.buf.data(), kSize, seed);
		std::chrono::milliseconds took;
		ibv_wc wc = post_timed(s, IBV_WR_RDMA_WRITE, kSize, 17, took);
		auto ms = took.count();
		int before = failures;
		check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE,
		      "RDMA WRITE whose last packet may be lost: " + status_text(wc));
		if (wc.status != IBV_WC_SUCCESS)
			break;  // the QP is in error: the rest would be flushed
		send_msg(fd, Order{kCheckWrite, kSize, seed});
		check(recv_msg<uint32_t>(fd) == 1, "RDMA WRITE whose last packet may be lost: data differs at the responder");
		check(took < kLongAckTimeout, "RDMA WRITE whose last packet may be lost took " + std::to_string(ms) +
						  " ms: it waited for the ACK timer");
		if (failures == before)
			std::printf("ok: RDMA WRITE of 64 KiB in %lld ms\n", (long long)ms);
	}
	send_msg(fd, Order{kDone, 0, 0});
}

// A WRITE the responder must refuse: `rkey_delta` off the key or `past` bytes past the MR.
void client_access_error(Side &s, int fd, uint32_t rkey_delta, uint64_t past, const char *what)
{
	fresh_qp(s, fd, {.sgid_index = s.gid_index});
	peer = recv_msg<Endpoint>(fd);
	uint64_t addr = past ? peer.addr + peer.length + past - 100 : peer.addr;
	check(post_send(s, IBV_WR_RDMA_WRITE, 100, addr, peer.rkey + rkey_delta, 0, 7) == 0, "post bad WRITE");
	check(post_send(s, IBV_WR_RDMA_WRITE, 100, peer.addr, peer.rkey, 0, 8) == 0, "post WRITE behind it");
	ibv_wc wc = one(s);
	check(wc.status == IBV_WC_REM_ACCESS_ERR && wc.wr_id == 7,
	      std::string(what) + ": want IBV_WC_REM_ACCESS_ERR, got " + status_text(wc));
	wc = one(s);
	check(wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 8,
	      std::string(what) + ": the next request: want IBV_WC_WR_FLUSH_ERR, got " + status_text(wc));
	check(h::qp_state(s.qp) == IBV_QPS_ERR, std::string(what) + ": requester QP not in ERR");
	send_msg(fd, uint32_t(1));
	check(recv_msg<uint32_t>(fd) == 1, std::string(what) + ": responder QP not in ERR");
	std::printf("ok: %s: IBV_WC_REM_ACCESS_ERR, the next flushed, both QPs in ERR\n", what);
}

// A 1 MiB WRITE into the server's ODP MR with 16 KiB unmapped in its
// middle: refused when its packets reach the hole, never completed.
void client_write_hole(Side &s, int fd)
{
	fresh_qp(s, fd, {.sgid_index = s.gid_index});
	peer = recv_msg<Endpoint>(fd);
	for (size_t i = 0; i < peer.length; ++i)
		s.buf[i] = static_cast<uint8_t>(i * 13 + 5);
	check(post_send(s, IBV_WR_RDMA_WRITE, peer.length, peer.addr, peer.rkey, 0, 9) == 0, "post WRITE into a hole");
	ibv_wc wc = one(s, 60s);
	check(wc.status == IBV_WC_REM_ACCESS_ERR && wc.wr_id == 9,
	      "WRITE into a hole of the responder's MR: want IBV_WC_REM_ACCESS_ERR, got " + status_text(wc));
	check(h::qp_state(s.qp) == IBV_QPS_ERR, "WRITE into a hole: requester QP not in ERR");
	send_msg(fd, uint32_t(1));
	check(recv_msg<uint32_t>(fd) == 1, "WRITE into a hole: responder QP not in ERR");
	check(recv_msg<uint32_t>(fd) == 1, "WRITE into a hole: the bytes before the hole did not land");
	std::printf("ok: WRITE of 1 MiB into a hole of an ODP MR: IBV_WC_REM_ACCESS_ERR, both QPs in ERR\n");
}

void server_write_hole(Side &s, int fd)
{
	fresh_qp(s, fd, {.sgid_index = s.gid_index});
	// The hole lies between the packets that ask for an ACK (every 64th), so
	// only payloads that wait for their batch meet it.
	constexpr size_t kLen = 1u << 20, kHoleAt = (512u + 8u) << 10, kHole = 16u << 10;
	void *mem = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	check(mem != MAP_FAILED, "mmap 1 MiB");
	auto *base = static_cast<uint8_t *>(mem);
	ibv_mr *mr = mem != MAP_FAILED ? ibv_reg_mr(s.pd, mem, kLen,
						    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
							    IBV_ACCESS_ON_DEMAND)
				       : nullptr;
	check(mr != nullptr, "register an ODP MR");
	if (mr)
		check(munmap(base + kHoleAt, kHole) == 0, "unmap the middle of the MR");
	send_msg(fd, Endpoint{s.qp->qp_num, {}, reinterpret_cast<uintptr_t>(mem), mr ? mr->rkey : 0, uint32_t(kLen)});
	(void)recv_msg<uint32_t>(fd);
	send_msg(fd, uint32_t(h::qp_state(s.qp) == IBV_QPS_ERR));
	bool landed = mr != nullptr;
	for (size_t i = 0; landed && i < 4096; ++i)  // the first packets came before the hole
		landed = base[i] == static_cast<uint8_t>(i * 13 + 5);
	send_msg(fd, uint32_t(landed));
	if (mr)
		ibv_dereg_mr(mr);
	if (mem != MAP_FAILED) {
		munmap(base, kHoleAt);
		munmap(base + kHoleAt + kHole, kLen - kHoleAt - kHole);
	}
}

// SEND with Invalidate naming the responder's type 2 window: the message
// lands and invalidates it; a WRITE through the window is then refused.
void client_send_with_invalidate(Side &s, int fd)
{
	fresh_qp(s, fd, {.sgid_index = s.gid_index});
	peer = recv_msg<Endpoint>(fd);  // rkey: the window's
	fill(s.buf.data(), 100, 77);
	ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf.data()), 100, s.mr->lkey};
	ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = 13;
	wr.opcode = IBV_WR_SEND_WITH_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.invalidate_rkey = peer.rkey;
	check(ibv_post_send(s.qp, &wr, &bad) == 0, "post SEND with Invalidate");
	ibv_wc wc = one(s);
	check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND, "SEND with Invalidate: " + status_text(wc));
	check(recv_msg<uint32_t>(fd) == 1, "SEND with Invalidate: the responder's completion or data is wrong");
	check(post_send(s, IBV_WR_RDMA_WRITE, 8, peer.addr, peer.rkey, 0, 14) == 0, "post WRITE through the window");
	wc = one(s);
	check(wc.status == IBV_WC_REM_ACCESS_ERR,
	      "WRITE through the invalidated window: want IBV_WC_REM_ACCESS_ERR, got " + status_text(wc));
	send_msg(fd, uint32_t(1));
	check(recv_msg<uint32_t>(fd) == 1, "SEND with Invalidate: responder QP not in ERR after the refused WRITE");
	std::printf("ok: SEND with Invalidate: the window went, a WRITE through it IBV_WC_REM_ACCESS_ERR\n");
}

void client_rnr(Side &s, int fd, uint8_t rnr_retry, bool late_receive)
{
	fresh_qp(s, fd, {.sgid_index = s.gid_index, .rnr_retry = rnr_retry});
	peer = recv_msg<Endpoint>(fd);
	fill(s.buf.data(), 5000, 99);
	auto start = std::chrono::steady_clock::now();
	check(post_send(s, IBV_WR_SEND, 5000, 0, 0, 0, 9) == 0, "post SEND");
	ibv_wc wc = one(s, 30s);
	auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
	if (late_receive) {
		check(wc.status == IBV_WC_SUCCESS, "RNR then a receive: want success, got " + status_text(wc));
		check(took >= 150ms, "RNR then a receive: completed before the receive was posted");
		check(recv_msg<uint32_t>(fd) == 1, "RNR then a receive: responder saw wrong data");
		std::printf("ok: RNR NAKs until a receive came (%lld ms), data intact\n", (long long)took.count());
	} else {
		check(wc.status == IBV_WC_RNR_RETRY_EXC_ERR, "RNR: want IBV_WC_RNR_RETRY_EXC_ERR, got " + status_text(wc));
		check(h::qp_state(s.qp) == IBV_QPS_ERR, "RNR: requester QP not in ERR");
		send_msg(fd, uint32_t(1));
		std::printf("ok: rnr_retry %u exhausted: IBV_WC_RNR_RETRY_EXC_ERR\n", rnr_retry);
	}
}

// The SEND of client_rnr into a receive the server forged: no receive.
void client_forged_receive(Side &s, int fd)
{
	fresh_qp(s, fd, {.sgid_index = s.gid_index, .rnr_retry = 0});
	(void)recv_msg<uint32_t>(fd);  // forged
	fill(s.buf.data(), 4096, 77);
	check(post_send(s, IBV_WR_SEND, 4096, 0, 0, 0, 11) == 0, "post SEND");
	ibv_wc wc = one(s, 30s);
	check(wc.status == IBV_WC_RNR_RETRY_EXC_ERR,
	      "SEND into a forged receive: want IBV_WC_RNR_RETRY_EXC_ERR, got " + status_text(wc));
	send_msg(fd, uint32_t(1));
	bool untouched = recv_msg<uint32_t>(fd) == 1;
	check(untouched, "SEND into a forged receive: the memory it named was written");
	if (wc.status == IBV_WC_RNR_RETRY_EXC_ERR && untouched)
		std::printf("ok: a receive forged in the arena is no receive (%s), its memory untouched\n",
			    ibv_wc_status_str(wc.status));
}

// XRC: the server's XRC receive QP and SRQ, our XRC send QP.
struct XrcPeer {
	uint32_t qpn;
	uint8_t gid[16];
	uint32_t srqn;
	uint64_t addr;
	uint32_t rkey;
};

// Moves an XRC QP to RTS (send) or RTR (receive) towards `qpn` at `gid`.
void xrc_connect(Side &s, ibv_qp *qp, uint32_t qpn, const uint8_t *gid)
{
	h::QpConnectAttrs attrs{.sgid_index = s.gid_index, .max_dest_rd_atomic = 4, .max_rd_atomic = 4};
	h::QpRemote remote{qpn, {}};
	std::memcpy(remote.gid.raw, gid, 16);
	h::QpStep step = h::qp_to_init(qp, attrs);
	check(!step, "XRC INIT: " + step.text());
	step = h::qp_to_rtr(qp, remote, attrs);
	check(!step, "XRC RTR: " + step.text());
	if (qp->qp_type == IBV_QPT_XRC_SEND) {
		step = h::qp_to_rts(qp, attrs);
		check(!step, "XRC RTS: " + step.text());
	}
}

void client_xrc(Side &s, int fd)
{
	ibv_qp_init_attr_ex init{};
	init.qp_type = IBV_QPT_XRC_SEND;
	init.send_cq = init.recv_cq = s.cq;
	init.cap = {64, 0, 4, 0, 64};
	init.comp_mask = IBV_QP_INIT_ATTR_PD;
	init.pd = s.pd;
	ibv_qp *qp = ibv_create_qp_ex(s.ctx, &init);
	if (!qp) {
		check(false, "create an XRC send QP");
		return;
	}
	XrcPeer mine{qp->qp_num, {}, 0, 0, 0};
	ibv_gid gid{};
	ibv_query_gid(s.ctx, 1, s.gid_index, &gid);
	std::memcpy(mine.gid, gid.raw, 16);
	send_msg(fd, mine);
	XrcPeer srv = recv_msg<XrcPeer>(fd);
	xrc_connect(s, qp, srv.qpn, srv.gid);
	send_msg(fd, uint32_t(1));
	(void)recv_msg<uint32_t>(fd);  // the server's receive QP is at RTR, a receive posted

	auto post = [&](ibv_wr_opcode opcode, uint32_t len, uint64_t addr, uint64_t compare_add, uint64_t swap) {
		ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf.data()), len, s.mr->lkey};
		ibv_send_wr wr{}, *bad = nullptr;
		wr.opcode = opcode;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.qp_type.xrc.remote_srqn = srv.srqn;
		if (opcode == IBV_WR_ATOMIC_FETCH_AND_ADD || opcode == IBV_WR_ATOMIC_CMP_AND_SWP) {
			wr.wr.atomic.remote_addr = addr;
			wr.wr.atomic.rkey = srv.rkey;
			wr.wr.atomic.compare_add = compare_add;
			wr.wr.atomic.swap = swap;
		} else {
			wr.wr.rdma.remote_addr = addr;
			wr.wr.rdma.rkey = srv.rkey;
		}
		check(ibv_post_send(qp, &wr, &bad) == 0, "XRC post_send");
		ibv_wc wc = one(s);
		check(wc.status == IBV_WC_SUCCESS, "XRC opcode " + std::to_string(opcode) + ": " + status_text(wc));
	};
	fill(s.buf.data(), 2500, 31);
	post(IBV_WR_SEND, 2500, 0, 0, 0);  // FIRST, MIDDLE, LAST at 1024
	check(recv_msg<uint32_t>(fd) == 1, "XRC SEND: the SRQ's receive is wrong");
	fill(s.buf.data(), 3000, 32);
	post(IBV_WR_RDMA_WRITE, 3000, srv.addr, 0, 0);
	send_msg(fd, uint32_t(1));
	check(recv_msg<uint32_t>(fd) == 1, "XRC RDMA WRITE: data differs at the responder");
	(void)recv_msg<uint32_t>(fd);  // the server filled its buffer (seed 33)
	std::memset(s.buf.data(), 0, 3000);
	post(IBV_WR_RDMA_READ, 3000, srv.addr, 0, 0);
	check(matches(s.buf.data(), 3000, 33), "XRC RDMA READ: wrong data");
	uint64_t counter = srv.addr + kCounterOffset;
	bool originals_ok = true;
	for (int i = 0; i < 20; ++i) {
		post(IBV_WR_ATOMIC_FETCH_AND_ADD, 8, counter, 5, 0);
		uint64_t original;
		std::memcpy(&original, s.buf.data(), 8);
		originals_ok = originals_ok && original == uint64_t(5 * i);
	}
	check(originals_ok, "XRC FetchAdd originals do not count up by 5");
	post(IBV_WR_ATOMIC_CMP_AND_SWP, 8, counter, 100, 7);
	send_msg(fd, uint32_t(1));
	check(recv_msg<uint32_t>(fd) == 1, "XRC atomics: the responder's counter is not 7");
	std::printf("ok: XRC SEND into the SRQ, RDMA WRITE, RDMA READ, 20 FetchAdds and a CmpSwap\n");
	ibv_destroy_qp(qp);
}

// --- the server (responder) ------------------------------------------------

void server_xrc(Side &s, int fd)
{
	ibv_xrcd_init_attr xa{};
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	xa.fd = -1;
	xa.oflags = O_CREAT;
	ibv_xrcd *xrcd = ibv_open_xrcd(s.ctx, &xa);
	ibv_srq_init_attr_ex sa{};
	sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD;
	sa.srq_type = IBV_SRQT_XRC;
	sa.attr.max_wr = 16;
	sa.attr.max_sge = 1;
	sa.xrcd = xrcd;
	sa.cq = s.cq;
	sa.pd = s.pd;
	ibv_srq *srq = xrcd ? ibv_create_srq_ex(s.ctx, &sa) : nullptr;
	ibv_qp_init_attr_ex qa{};
	qa.qp_type = IBV_QPT_XRC_RECV;
	qa.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	qa.xrcd = xrcd;
	ibv_qp *qp = srq ? ibv_create_qp_ex(s.ctx, &qa) : nullptr;
	uint32_t srqn = 0;
	if (!qp || ibv_get_srq_num(srq, &srqn)) {
		std::printf("FAIL: XRC domain, SRQ or receive QP\n");
		std::exit(1);
	}
	XrcPeer mine{qp->qp_num, {}, srqn, reinterpret_cast<uintptr_t>(s.buf.data()), s.mr->rkey};
	ibv_gid gid{};
	ibv_query_gid(s.ctx, 1, s.gid_index, &gid);
	std::memcpy(mine.gid, gid.raw, 16);
	send_msg(fd, mine);
	XrcPeer cli = recv_msg<XrcPeer>(fd);
	xrc_connect(s, qp, cli.qpn, cli.gid);
	s.buf.assign(kBuf, 0);
	ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf.data()), uint32_t(kBuf), s.mr->lkey};
	ibv_recv_wr rwr{}, *bad = nullptr;
	rwr.wr_id = 40;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	check(ibv_post_srq_recv(srq, &rwr, &bad) == 0, "post an XRC SRQ receive");
	(void)recv_msg<uint32_t>(fd);
	send_msg(fd, uint32_t(1));
	ibv_wc wc = one(s);
	bool ok = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 40 && wc.byte_len == 2500 &&
		  wc.qp_num == qp->qp_num && matches(s.buf.data(), 2500, 31);
	check(ok, "XRC SEND at the SRQ: " + status_text(wc) + " byte_len " + std::to_string(wc.byte_len));
	send_msg(fd, uint32_t(ok));
	(void)recv_msg<uint32_t>(fd);
	send_msg(fd, uint32_t(matches(s.buf.data(), 3000, 32)));
	fill(s.buf.data(), 3000, 33);
	std::memset(s.buf.data() + kCounterOffset, 0, 8);
	send_msg(fd, uint32_t(1));
	(void)recv_msg<uint32_t>(fd);
	uint64_t v;
	std::memcpy(&v, s.buf.data() + kCounterOffset, 8);
	send_msg(fd, uint32_t(v == 7));
	check(h::qp_state(qp) == IBV_QPS_RTR, "XRC receive QP left RTR");
	ibv_destroy_qp(qp);
	ibv_destroy_srq(srq);
	ibv_close_xrcd(xrcd);
}

void server_writes(Side &s, int fd)
{
	fresh_qp(s, fd, {.sgid_index = s.gid_index});
	send_msg(fd, Endpoint{s.qp->qp_num, {}, reinterpret_cast<uintptr_t>(s.buf.data()), s.mr->rkey, uint32_t(kBuf)});
	for (;;) {
		Order o = recv_msg<Order>(fd);
		if (o.step == kDone)
			return;
		if (o.step == kCheckWrite) {
			send_msg(fd, uint32_t(matches(s.buf.data(), o.size, o.seed)));
			continue;
		}
		if (o.step == kFill) {
			fill(s.buf.data(), o.size, o.seed);
			std::memset(s.buf.data() + kCounterOffset, 0, 8);
			send_msg(fd, uint32_t(1));
			continue;
		}
		if (o.step == kCheckCounter) {
			uint64_t v;
			std::memcpy(&v, s.buf.data() + kCounterOffset, 8);
			send_msg(fd, uint32_t(v == o.seed));
			continue;
		}
		std::memset(s.buf.data(), 0, o.size);
		check(post_recv(s, o.step) == 0, "post_recv");
		send_msg(fd, uint32_t(1));
		ibv_wc wc = one(s);
		bool ok = wc.status == IBV_WC_SUCCESS && wc.byte_len == o.size;
		if (o.step == kCheckImm)
			ok = ok && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && (wc.wc_flags & IBV_WC_WITH_IMM) &&
			     ntohl(wc.imm_data) == o.size;
		else
			ok = ok && wc.opcode == IBV_WC_RECV && (wc.wc_flags & IBV_WC_WITH_IMM) &&
			     ntohl(wc.imm_data) == (o.size ^ 0xABCD);
		check(ok, "responder completion of step " + std::to_string(o.step) + " size " + std::to_string(o.size) +
				  ": " + status_text(wc) + " opcode " + std::to_string(wc.opcode) + " byte_len " +
				  std::to_string(wc.byte_len));
		send_msg(fd, uint32_t(ok && matches(s.buf.data(), o.size, o.seed)));
	}
}

void server_access_error(Side &s, int fd)
{
	fresh_qp(s, fd, {.sgid_index = s.gid_index});
	send_msg(fd, Endpoint{s.qp->qp_num, {}, reinterpret_cast<uintptr_t>(s.buf.data()), s.mr->rkey, uint32_t(kBuf)});
	(void)recv_msg<uint32_t>(fd);
	send_msg(fd, uint32_t(h::qp_state(s.qp) == IBV_QPS_ERR));
}

void server_send_with_invalidate(Side &s, int fd)
{
	fresh_qp(s, fd, {.sgid_index = s.gid_index});
	ibv_mw *mw = ibv_alloc_mw(s.pd, IBV_MW_TYPE_2);
	check(mw != nullptr, "alloc a type 2 window");
	uint32_t rkey = 0;
	if (mw) {
		ibv_send_wr wr{}, *bad = nullptr;
		wr.wr_id = 11;
		wr.opcode = IBV_WR_BIND_MW;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.bind_mw.mw = mw;
		wr.bind_mw.rkey = rkey = ibv_inc_rkey(mw->rkey);
		wr.bind_mw.bind_info = {s.mr, reinterpret_cast<uintptr_t>(s.buf.data()), 4096, IBV_ACCESS_REMOTE_WRITE};
		check(ibv_post_send(s.qp, &wr, &bad) == 0, "post the bind");
		ibv_wc wc = one(s);
		check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW, "bind the window: " + status_text(wc));
	}
	check(post_recv(s, 12) == 0, "post_recv");
	send_msg(fd, Endpoint{s.qp->qp_num, {}, reinterpret_cast<uintptr_t>(s.buf.data()), rkey, 4096});
	ibv_wc wc = one(s);
	bool ok = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && (wc.wc_flags & IBV_WC_WITH_INV) &&
		  wc.invalidated_rkey == rkey && wc.byte_len == 100 && matches(s.buf.data(), 100, 77);
	check(ok, "SEND with Invalidate at the responder: " + status_text(wc) + " flags " + std::to_string(wc.wc_flags) +
			  " invalidated " + std::to_string(wc.invalidated_rkey) + " of " + std::to_string(rkey));
	send_msg(fd, uint32_t(ok));
	(void)recv_msg<uint32_t>(fd);
	send_msg(fd, uint32_t(h::qp_state(s.qp) == IBV_QPS_ERR));
	ibv_destroy_qp(s.qp);
	s.qp = nullptr;
	if (mw)
		check(ibv_dealloc_mw(mw) == 0, "dealloc the window");
}

void server_rnr(Side &s, int fd, bool late_receive)
{
	// 10 us between RNR NAKs until they run out; 2.56 ms while a receive comes.
	fresh_qp(s, fd, {.sgid_index = s.gid_index, .min_rnr_timer = uint8_t(late_receive ? 16 : 1)});
	send_msg(fd, Endpoint{s.qp->qp_num, {}, reinterpret_cast<uintptr_t>(s.buf.data()), s.mr->rkey, uint32_t(kBuf)});
	if (!late_receive) {
		(void)recv_msg<uint32_t>(fd);
		return;
	}
	std::this_thread::sleep_for(200ms);
	check(post_recv(s, 10) == 0, "post_recv");
	ibv_wc wc = one(s);
	send_msg(fd, uint32_t(wc.status == IBV_WC_SUCCESS && wc.byte_len == 5000 && matches(s.buf.data(), 5000, 99)));
}

// Writes a receive WQE into our QP's ring in the device's arena, as a
// process that maps it could (any user's, today), pointing at
// [kForgeOffset, +4096) of our LOCAL_WRITE buffer, without posting it: the
// device must take its receives from what we posted (xsrcd's own record),
// not from the ring.
constexpr size_t kForgeOffset = 256 * 1024;

bool forge_receive(Side &s)
{
	h::MappedArena arena("xsrc0");
	xsrc_sge sge{reinterpret_cast<uintptr_t>(s.buf.data() + kForgeOffset), 4096, s.mr->lkey};
	return arena.ok() && arena.forge_receive(s.qp->qp_num, 0xf0f0, sge);
}

void server_forged_receive(Side &s, int fd)
{
	fresh_qp(s, fd, {.sgid_index = s.gid_index, .min_rnr_timer = 1});
	std::memset(s.buf.data() + kForgeOffset, 0x33, 4096);
	check(forge_receive(s), "map the device's arena and forge a receive in our ring");
	send_msg(fd, uint32_t(1));
	(void)recv_msg<uint32_t>(fd);  // the SEND completed
	bool untouched = true;
	for (size_t i = 0; i < 4096; ++i)
		untouched &= s.buf[kForgeOffset + i] == 0x33;
	check(untouched, "the memory a forged receive named was written");
	ibv_wc wc;
	check(ibv_poll_cq(s.cq, 1, &wc) == 0, "a completion for a receive that was never posted");
	send_msg(fd, uint32_t(untouched));
}

}  // namespace

int main(int argc, char **argv)
{
	setvbuf(stdout, nullptr, _IOLBF, 0);
	// "data": only the transfers (on a lossy link a lost NAK turns an
	// error's completion into a retry timeout, so the error cases need a
	// clean one).
	// "readgap": only client_read_gap; "tailloss": only client_tail_loss.
	bool data_only = std::strcmp(argv[argc - 1], "data") == 0;
	bool read_gap = std::strcmp(argv[argc - 1], "readgap") == 0;
	bool tail_loss = std::strcmp(argv[argc - 1], "tailloss") == 0;
	if (data_only || read_gap || tail_loss)
		--argc;
	bool server = argc == 4 && std::strcmp(argv[1], "server") == 0;
	bool client = argc == 5 && std::strcmp(argv[1], "client") == 0;
	if (!server && !client) {
		std::fprintf(stderr, "usage: rc_wire_verbs server PORT GID_INDEX [data|readgap|tailloss] | client ADDRESS PORT GID_INDEX [data|readgap|tailloss]\n");
		return 2;
	}
	int fd = server ? listen_once(argv[2]) : connect_to(argv[2], argv[3]);
	if (fd < 0) {
		std::printf("FAIL: control connection\n");
		return 1;
	}
	Side s;
	open_side(s, static_cast<uint8_t>(std::atoi(argv[server ? 3 : 4])));
	if (read_gap || tail_loss) {
		if (client && read_gap)
			client_read_gap(s, fd);
		else if (client)
			client_tail_loss(s, fd);
		else
			server_writes(s, fd);
	} else if (client) {
		client_writes(s, fd);
		client_reads_and_atomics(s, fd);
		client_xrc(s, fd);
		if (!data_only) {
			client_access_error(s, fd, 1, 0, "unknown rkey");
			client_access_error(s, fd, 0, 1, "write past the MR");
			client_write_hole(s, fd);
			client_send_with_invalidate(s, fd);
			client_rnr(s, fd, 2, false);
			client_rnr(s, fd, 7, true);
			client_forged_receive(s, fd);
		}
	} else {
		server_writes(s, fd);
		server_writes(s, fd);  // the same loop serves the reads and atomics
		server_xrc(s, fd);
		if (!data_only) {
			server_access_error(s, fd);
			server_access_error(s, fd);
			server_write_hole(s, fd);
			server_send_with_invalidate(s, fd);
			server_rnr(s, fd, false);
			server_rnr(s, fd, true);
			server_forged_receive(s, fd);
		}
	}
	ibv_destroy_qp(s.qp);
	ibv_dereg_mr(s.mr);
	ibv_destroy_cq(s.cq);
	ibv_dealloc_pd(s.pd);
	ibv_close_device(s.ctx);
	close(fd);
	if (failures == 0)
		std::printf("rc_wire_verbs %s: all checks passed\n", argv[1]);
	return failures ? 1 : 0;
}
