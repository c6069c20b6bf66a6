// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// RC and UC requesters on the wire (wire_rc.h), IBTA 9.7 as RoCE v2 carries
// it: a message is cut into packets of the path MTU (FIRST, MIDDLE, LAST,
// ONLY), numbered with PSNs. UC sends them and is done. RC keeps each
// message until the responder acknowledges its last PSN, with a window of
// packets in flight; ACKs complete messages in order; a PSN sequence NAK
// or the local ACK timeout (4.096 us * 2^timeout) resends from the oldest
// unacknowledged PSN (go-back-N), the two together retry_cnt times without
// progress (one NAK per try, as rxe counts them), and a requester left
// without news goes back early, uncounted (kStallNs); an RNR NAK waits its
// timer (rnr_retry times, 7 = forever); error NAKs and exhausted retries
// complete with the error and move the QP to ERR. An XRC send QP is RC with
// the XRC opcodes and an XRCETH naming the remote SRQ in every request.
//
// Why here and not in the daemon: the send engine needs the send queue and
// the local buffers, which are this process's; ACKs are small and few (one
// per message, and every kAckEvery packets), so handing them over from the
// daemon costs one datagram each, while a daemon-side requester would cost
// a command per post and a copy of every byte through the daemon.
#include "wire_rc.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <vector>

#include "common/clock.h"
#include "common/iov.h"
#include "peer_memory.h"
#include "wire/headers.h"
#include "wire/sender.h"
#include "xsrc.h"

namespace w = xsrc::wire;
namespace op = xsrc::wire::op;

namespace {

// Bytes in flight before the requester waits for an ACK, and how often
// within a long message it asks for one (so the window keeps moving); in
// packets of the QP's path MTU (xsrc_wire_qp::window, ::ack_every). Every
// ACK costs both daemons a wake-up and a datagram, and the requester one
// more: measured across the harness (ib_write_bw 1 MiB, 1500-byte link),
// 256 packets and an ACK every 64 gave 1.0-1.1 GB/s, 4 MiB and one every
// 1 MiB 2.1-2.3 GB/s.
constexpr uint32_t kWindowBytes = 4u << 20;
constexpr uint32_t kAckEveryBytes = 1u << 20;
// The window after go-backs: never below this many packets.
constexpr uint32_t kMinWindow = 8;
constexpr uint32_t kPsnHalf = 1u << 23;
// While the application polls its CQs (which reads the responses itself)
// and has armed none, the response thread does not wait on the socket: it
// looks every kQuietNs whether polling went on. A wake-up per response
// costs the polling thread a context switch: across the harness
// (ib_send_lat 8 B, A/B alternating) typical one-way 49-75 us with it,
// 42-61 us without.
constexpr uint64_t kQuietNs = 1000000;
constexpr int kRnrRetryForever = 7;
// A requester that got neither an ACK that moves it on nor a sequence NAK
// for this long, since its last progress or go-back, while messages are in
// flight, does not wait out the local ACK timeout (67 ms at perftest's
// timeout 14): a lost tail, a lost NAK or a go-back whose first packet was
// lost again leaves the responder nothing to NAK, and on a lossy link those
// waits were most of the time (ib_write_bw 64 KiB at 3 % loss: 43
// timeouts, about 2.9 s of 3.5 s). First it sends its last packet again,
// asking for an ACK: a responder that has everything acknowledges it (the
// ACK was only late: this VM can keep a daemon off the CPU for
// milliseconds, and a 4 MiB window went back for nothing about once in
// 2 GB), one that misses a packet before it NAKs that one (a sequence NAK,
// which counts). Still nothing after as long again: it goes back to the
// oldest unacknowledged PSN, without counting a retry. Each such go-back
// waits twice as long as the one before until the next progress, and only
// while twice the wait is within the ACK timeout. A responder that NAKs the
// same PSN again is left to the NAK and the timer, which count retries (a
// peer that NAKs everything still sees retry_cnt + 1 transmissions);
// duplicate ACKs (of late, duplicated or resent packets) are no news.
constexpr uint64_t kStallNs = 4'000'000;
// The response socket's buffer: a window of responses and more.
constexpr int kResponseBufferBytes = 1 << 20;
// Words of a context's ACK board: one per QPN modulo this (32 KiB).
constexpr uint32_t kAckBoardEntries = 4096;
constexpr size_t kAckBoardBytes = kAckBoardEntries * sizeof(uint64_t);
// Largest response handed to us: headers and a path MTU of payload.
constexpr size_t kMaxResponse = 4096 + 64;
// Largest message of the response socket: a batch, where the daemon sends them.
#ifdef XSRC_WIRE_RESPONSE_BATCH_BYTES
constexpr size_t kMaxResponseMessage = std::max<size_t>(XSRC_WIRE_RESPONSE_BATCH_BYTES, kMaxResponse);
#else
constexpr size_t kMaxResponseMessage = kMaxResponse;
#endif

uint32_t psn_diff(uint32_t a, uint32_t b)
{
	return (a - b) & w::kPsnMask;
}

uint32_t psn_add(uint32_t a, uint32_t n)
{
	return (a + n) & w::kPsnMask;
}

}  // namespace

// One message sent and not yet acknowledged.
struct xsrc_wire_msg {
	uint64_t wr_id = 0;
	ibv_wr_opcode opcode = IBV_WR_SEND;
	bool signaled = false;
	bool solicited = false;
	uint32_t imm = 0;                // immediate data, or the rkey SEND with Invalidate names
	uint64_t remote_addr = 0;
	uint32_t rkey = 0;
	uint64_t length = 0;
	uint64_t compare = 0, swap = 0;  // atomics (swap: the add value of a FetchAdd;
					 // ATOMIC WRITE: its 8 bytes as in memory)
	uint32_t remote_srqn = 0;        // XRC: the SRQ every packet's XRCETH names
	uint32_t first_psn = 0;
	uint32_t packets = 0;            // PSNs it takes (a READ: its responses)
	uint32_t received = 0;           // READ responses / ATOMIC ACK taken in
	size_t count = 0;        // iovecs at iov
	iovec *iov = nullptr;    // the local buffers (storage of the ring)
	unsigned char *inline_copy = nullptr;
};

struct xsrc_wire_qp {
	bool reliable = false;
	bool xrc = false;  // an XRC send QP: XRC opcodes, an XRCETH after the BTH
	ibv_gid sgid{};
	uint8_t sgid_index = 0;
	uint8_t port_num = 1;
	std::array<uint8_t, 16> dgid{};
	uint32_t dest_qpn = 0;
	uint32_t mtu = 1024;
	uint32_t window = 0;     // packets in flight at most (set_mtu)
	uint32_t ack_every = 0;  // an ACK asked for every so many packets
	// Packets in flight now: the window, halved by each go-back (a lost
	// packet costs everything sent after it), grown back by what ACKs
	// acknowledge.
	uint32_t cwnd = 0;
	const xsrc_wire_socket *socket = nullptr;
	// RC: messages in flight, oldest first (a ring of max_send_wr + 1).
	std::vector<xsrc_wire_msg> msgs;
	std::vector<iovec> iov_store;
	std::vector<unsigned char> inline_store;
	size_t head = 0, size = 0;
	size_t send_index = 0;      // the message send_psn is in (relative to head)
	uint32_t next_psn = 0;      // where the next new message starts
	uint32_t send_psn = 0;      // the next PSN to (re)transmit
	uint32_t una_psn = 0;       // the oldest unacknowledged
	uint32_t sent_high = 0;     // one past the highest PSN ever sent (ACKs up to it count)
	uint64_t deadline_ns = 0;   // the local ACK timeout; 0: nothing in flight
	uint64_t stall_ns = 0;      // still no news by then: probe, then go back (kStallNs); 0: not armed
	uint32_t stalls = 0;        // early go-backs since the last progress
	bool heard = false;         // a sequence NAK for una came since stall_ns was armed
	bool probed = false;        // the last packet went again since stall_ns was armed
	uint64_t rnr_until_ns = 0;  // an RNR NAK holds the sending until then
	int retries_left = -1;      // -1: not counting yet
	int rnr_retries_left = -1;
	// A PSN sequence NAK sent us back and nothing was acknowledged since:
	// a NAK for the same PSN (duplicated on the way, or a peer that NAKs
	// again) starts no second go-back; the ACK timer's next try does.
	bool nak_retry = false;
	// The una_psn from which a response past a lost one had the request
	// sent again at once; not again for that gap (the timer's, if lost too).
	std::optional<uint32_t> asked_again_from;
	// An RC QP's word of the context's ACK board (null: none): an ACK our
	// xsrcd owes the peer for a request of theirs waits there a moment for
	// us to send it in front of our next request (take_owed_ack).
	uint64_t *ack_word = nullptr;

	xsrc_wire_msg &msg(size_t i) { return msgs[(head + i) % msgs.size()]; }
};

namespace {

void set_mtu(xsrc_wire_qp &wq, uint32_t mtu)
{
	wq.mtu = mtu;
	wq.window = std::max<uint32_t>(kWindowBytes / mtu, 2);
	wq.ack_every = std::max<uint32_t>(kAckEveryBytes / mtu, 1);
	wq.cwnd = wq.window;
}

// When the QP's timers are next due: the RNR wait, else the sooner of the
// ACK timeout and the stall; 0: none.
uint64_t next_due(const xsrc_wire_qp &wq)
{
	if (wq.rnr_until_ns)
		return wq.rnr_until_ns;
	if (wq.stall_ns && wq.deadline_ns)
		return std::min(wq.stall_ns, wq.deadline_ns);
	return wq.deadline_ns;
}

}  // namespace

namespace xsrc {

// The context's response socket and the thread that reads it and runs the
// RC timers of its QPs.
class WireEngine {
public:
	explicit WireEngine(xsrc_context *ctx) : ctx_(ctx) {}
	~WireEngine();
	// Registers the response socket and starts the thread. Returns 0 or errno.
	int start() noexcept;
	int add(xsrc_qp *qp) noexcept;
	void remove(xsrc_qp *qp) noexcept;
	// A deadline at `at_ns` was set: wake the thread if it sleeps past it.
	void poke(uint64_t at_ns) noexcept;
	// From poll_cq: responses that arrived, handled by the caller's
	// thread (an application that spins on its CQ need not wait for ours
	// to be scheduled), and the thread may stay off the socket.
	void poll() noexcept;
	// A CQ of the context was armed: the thread goes back to waiting on
	// the socket at once.
	void armed() noexcept;
	// Messages in flight over all our QPs.
	std::atomic<uint64_t> in_flight{0};
	// QP `qpn`'s word of our ACK board, or null (the device keeps none).
	uint64_t *ack_word(xsrc::Qpn qpn) const
	{
		return board_ ? &board_[qpn.value() & (kAckBoardEntries - 1)] : nullptr;
	}

private:
	void drain(bool wait_for_lock) noexcept;
	static void *thread_main(void *self) noexcept;
	void run() noexcept;
	void handle(const uint8_t *bytes, size_t len) noexcept;
	uint64_t timers(uint64_t now) noexcept;

	xsrc_context *ctx_;
	std::mutex lock_;              // qps_, and each QP's life while handled
	std::mutex recv_lock_;         // one reader of responses_ at a time
	std::vector<xsrc_qp *> qps_;   // our RC QPs on the wire
	unique_fd responses_;          // our end of the pair
	bool batched_ = false;         // the daemon sends batches of responses
	uint64_t *board_ = nullptr;    // our ACK board (kAckBoardEntries words), shared with xsrcd
	std::vector<uint8_t> received_;  // one message of responses_ (recv_lock_)
	unique_fd wake_;               // eventfd: a deadline sooner than our sleep
	std::atomic<uint64_t> sleep_until_{0};
	std::atomic<bool> polled_{false};  // poll() ran since the thread last looked
	std::atomic<bool> armed_{false};   // armed() ran since the thread last looked
	std::atomic<bool> watching_{true};  // the thread waits on responses_
	std::atomic<bool> stop_{false};
	bool started_ = false;
	pthread_t thread_{};
};

void WireEngineDeleter::operator()(WireEngine *engine) const noexcept
{
	delete engine;
}

}  // namespace xsrc

namespace {

using Result = xsrc_attempt_result;

bool wqe_has_imm(ibv_wr_opcode o)
{
	return o == IBV_WR_SEND_WITH_IMM || o == IBV_WR_RDMA_WRITE_WITH_IMM;
}

bool wqe_is_write(ibv_wr_opcode o)
{
	return o == IBV_WR_RDMA_WRITE || o == IBV_WR_RDMA_WRITE_WITH_IMM;
}

bool wqe_is_atomic(ibv_wr_opcode o)
{
	return o == IBV_WR_ATOMIC_CMP_AND_SWP || o == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

// Requests the responder answers with data: READ responses, ATOMIC ACK.
bool wqe_wants_data(ibv_wr_opcode o)
{
	return o == IBV_WR_RDMA_READ || wqe_is_atomic(o);
}

uint32_t packets_of(uint64_t length, uint32_t mtu)
{
	return length ? static_cast<uint32_t>((length + mtu - 1) / mtu) : 1;
}

// The transport bits of a QP's opcodes.
uint8_t transport_of(const xsrc_wire_qp &wq)
{
	w::Transport t = wq.xrc ? w::Transport::xrc : wq.reliable ? w::Transport::rc : w::Transport::uc;
	return static_cast<uint8_t>(t);
}

// The BTH, then (XRC) the XRCETH naming the message's SRQ: the bytes used.
size_t put_bth(const xsrc_wire_qp &wq, const xsrc_wire_msg &m, const w::Bth &bth, std::span<uint8_t> hdr)
{
	w::encode(bth, hdr.first<w::kBthBytes>());
	if (!wq.xrc)
		return w::kBthBytes;
	w::encode(w::XrcEth{m.remote_srqn}, hdr.subspan(w::kBthBytes).first<w::kXrcEthBytes>());
	return w::kBthBytes + w::kXrcEthBytes;
}

// The opcode of packet `k` of `packets` of a message.
uint8_t packet_opcode(const xsrc_wire_qp &wq, ibv_wr_opcode o, uint32_t k, uint32_t packets)
{
	bool first = k == 0, last = k + 1 == packets, imm = wqe_has_imm(o);
	uint8_t code;
	bool inv = o == IBV_WR_SEND_WITH_INV;
	if (wqe_is_write(o))
		code = first && last ? (imm ? op::kWriteOnlyImm : op::kWriteOnly)
		       : first       ? op::kWriteFirst
		       : last        ? (imm ? op::kWriteLastImm : op::kWriteLast)
				     : op::kWriteMiddle;
	else
		code = first && last ? (imm ? op::kSendOnlyImm : inv ? op::kSendOnlyInv : op::kSendOnly)
		       : first       ? op::kSendFirst
		       : last        ? (imm ? op::kSendLastImm : inv ? op::kSendLastInv : op::kSendLast)
				     : op::kSendMiddle;
	return transport_of(wq) | code;
}

// A READ request for the responses from `k` on, or an atomic request.
void send_request(w::PacketBatch &out, xsrc_wire_qp &wq, const xsrc_wire_msg &m, uint32_t k, uint32_t psn)
{
	std::array<uint8_t, w::kBthBytes + w::kXrcEthBytes + w::kAtomicEthBytes> hdr{};
	w::Bth bth;
	bth.dest_qpn = wq.dest_qpn;
	bth.ack_req = true;
	bth.psn = psn;
	size_t n = wq.xrc ? w::kBthBytes + w::kXrcEthBytes : w::kBthBytes;
	if (m.opcode == IBV_WR_RDMA_READ) {
		bth.opcode = transport_of(wq) | op::kReadRequest;
		uint64_t offset = std::min<uint64_t>(uint64_t(k) * wq.mtu, m.length);
		w::encode(w::Reth{m.remote_addr + offset, m.rkey, static_cast<uint32_t>(m.length - offset)},
			  std::span<uint8_t, w::kRethBytes>(hdr.data() + n, w::kRethBytes));
		n += w::kRethBytes;
	} else {
		bool cmp = m.opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
		bth.opcode = transport_of(wq) | (cmp ? op::kCmpSwap : op::kFetchAdd);
		w::encode(w::AtomicEth{m.remote_addr, m.rkey, cmp ? m.swap : m.compare, cmp ? m.compare : 0},
			  std::span<uint8_t, w::kAtomicEthBytes>(hdr.data() + n, w::kAtomicEthBytes));
		n += w::kAtomicEthBytes;
	}
	put_bth(wq, m, bth, hdr);
	(void)out.add({hdr.data(), n}, nullptr, 0, 0);
}

// An ATOMIC WRITE (IBTA 1.5): RETH and its 8 bytes in one packet.
void send_atomic_write(w::PacketBatch &out, xsrc_wire_qp &wq, const xsrc_wire_msg &m, uint32_t psn)
{
	std::array<uint8_t, w::kBthBytes + w::kRethBytes> hdr{};
	w::Bth bth;
	bth.opcode = transport_of(wq) | op::kAtomicWrite;
	bth.dest_qpn = wq.dest_qpn;
	bth.ack_req = true;
	bth.psn = psn;
	size_t n = put_bth(wq, m, bth, hdr);
	w::encode(w::Reth{m.remote_addr, m.rkey, 8}, std::span<uint8_t, w::kRethBytes>(hdr.data() + n, w::kRethBytes));
	n += w::kRethBytes;
	iovec value{const_cast<uint64_t *>(&m.swap), sizeof(m.swap)};
	(void)out.add({hdr.data(), n}, &value, 1, sizeof(m.swap));
}

// Sends packet `k` of message `m` with PSN `psn` (into `out`); with
// `ack_req`, asking for an ACK whatever its place.
void send_one(w::PacketBatch &out, xsrc_wire_qp &wq, const xsrc_wire_msg &m, uint32_t k, uint32_t psn,
	      bool ack_req = false)
{
	if (m.opcode == IBV_WR_ATOMIC_WRITE) {
		send_atomic_write(out, wq, m, psn);
		return;
	}
	uint64_t offset = uint64_t(k) * wq.mtu;
	uint64_t len = std::min<uint64_t>(wq.mtu, m.length - std::min(m.length, offset));
	bool first = k == 0, last = k + 1 == m.packets;
	std::array<uint8_t, w::kBthBytes + w::kXrcEthBytes + w::kRethBytes + w::kImmDtBytes> hdr{};
	w::Bth bth;
	bth.opcode = packet_opcode(wq, m.opcode, k, m.packets);
	bth.solicited = last && m.solicited;
	bth.pad = w::pad_of(len);
	bth.dest_qpn = wq.dest_qpn;
	// A smaller window wants its ACKs sooner: at least four per window.
	uint32_t every = std::max<uint32_t>(std::min(wq.ack_every, wq.cwnd / 4), 1);
	bth.ack_req = wq.reliable && (ack_req || last || psn % every == every - 1);
	bth.psn = psn;
	size_t n = put_bth(wq, m, bth, hdr);
	if (first && wqe_is_write(m.opcode)) {
		w::encode(w::Reth{m.remote_addr, m.rkey, static_cast<uint32_t>(m.length)},
			  std::span<uint8_t, w::kRethBytes>(hdr.data() + n, w::kRethBytes));
		n += w::kRethBytes;
	}
	if (last && wqe_has_imm(m.opcode)) {
		w::encode(w::ImmDt{m.imm}, std::span<uint8_t, w::kImmDtBytes>(hdr.data() + n, w::kImmDtBytes));
		n += w::kImmDtBytes;
	} else if (last && m.opcode == IBV_WR_SEND_WITH_INV) {
		w::encode(w::Ieth{m.imm}, std::span<uint8_t, w::kIethBytes>(hdr.data() + n, w::kIethBytes));
		n += w::kIethBytes;
	}
	std::array<iovec, XSRC_MAX_RECV_SGE> payload;
	size_t np = len ? xsrc::iov_slice({m.iov, m.count}, offset, len, payload.data()) : 0;
	// A packet the network cannot take is lost: RC's timer resends it.
	(void)out.add({hdr.data(), n}, payload.data(), np, len);
}

uint64_t ack_timeout_ns(const xsrc_qp *qp)
{
	return xsrc_requester_ack_timeout_ns(qp->entry->timeout);
}

// Progress, a go-back, or the first send after none was in flight: the
// responder's silence is counted from now.
void arm_stall(const xsrc_qp *qp, xsrc_wire_qp &wq, uint64_t now, bool probed = false)
{
	uint64_t wait = kStallNs << std::min<uint32_t>(wq.stalls, 16);
	wq.stall_ns = wq.size && 2 * wait <= ack_timeout_ns(qp) ? now + wait : 0;
	wq.heard = false;
	wq.probed = probed;
}

// READ and atomic requests sent and not answered yet (messages before send_index).
uint32_t reads_outstanding(xsrc_wire_qp &wq)
{
	uint32_t n = 0;
	for (size_t i = 0; i < wq.send_index; ++i)
		n += wqe_wants_data(wq.msg(i).opcode);
	return n;
}

// How many of them the QP may have (max_rd_atomic; 0 lets one through,
// else a READ would wait for ever).
uint32_t reads_allowed(const xsrc_qp *qp)
{
	return std::max<uint32_t>(qp->entry->max_rd_atomic, 1);
}

// The ACK our xsrcd left on the board for this QP's peer, if it is still
// there: sent last in the batch of our requests (XSRC_WIRE_RESPONSES_ACK_BOARD),
// so the peer's xsrcd takes them in one wake-up: shorter than the packet
// before it, it rides as the last segment of that packet's UDP GSO
// datagram (a datagram of its own could be sent after a wake-up of the
// peer's xsrcd took our CPU). The word is taken by
// compare-and-swap; one our xsrcd already sent, or that another QP of ours
// sharing the entry owns (its tag), stays.
void take_owed_ack(const xsrc_qp *qp, xsrc_wire_qp &wq, w::PacketBatch &out)
{
#ifndef XSRC_ACK_OWED
	// A provider built against headers from before the board has none.
	(void)qp;
	(void)wq;
	(void)out;
#else
	std::atomic_ref<uint64_t> entry(*wq.ack_word);
	uint64_t word = entry.load(std::memory_order_acquire);
	if ((word & XSRC_ACK_OWNER_MASK) != XSRC_ACK_OWNER(qp->qpn.value()) ||
	    !entry.compare_exchange_strong(word, 0, std::memory_order_acq_rel))
		return;
	auto hdr = w::acknowledge_headers(static_cast<uint8_t>(w::Transport::rc), wq.dest_qpn, XSRC_ACK_PSN(word),
					  w::aeth::kAck, XSRC_ACK_MSN(word));
	(void)out.add(hdr, nullptr, 0, 0);
#endif
}

// Sends what the window allows from send_psn on (a batch of packets per
// system call); arms the ACK timer.
// A READ or atomic past max_rd_atomic outstanding waits, and everything
// behind it (the send queue is in order), until a response retires one.
void pump(xsrc_qp *qp, xsrc_wire_qp &wq, uint64_t now)
{
	if (wq.rnr_until_ns && now < wq.rnr_until_ns)
		return;
	wq.rnr_until_ns = 0;
	w::PacketBatch out(*wq.socket, wq.dgid);
	const uint32_t first_psn = wq.send_psn;
	while (wq.send_psn != wq.next_psn && psn_diff(wq.send_psn, wq.una_psn) < wq.cwnd &&
	       wq.send_index < wq.size) {
		xsrc_wire_msg &m = wq.msg(wq.send_index);
		uint32_t k = psn_diff(wq.send_psn, m.first_psn);
		if (wqe_wants_data(m.opcode)) {
			if (reads_outstanding(wq) >= reads_allowed(qp))
				break;
			// One request covers the responses still missing.
			send_request(out, wq, m, k, wq.send_psn);
			wq.send_psn = psn_add(m.first_psn, m.packets);
			++wq.send_index;
			if (psn_diff(wq.send_psn, wq.una_psn) > psn_diff(wq.sent_high, wq.una_psn))
				wq.sent_high = wq.send_psn;
			continue;
		}
		send_one(out, wq, m, k, wq.send_psn);
		wq.send_psn = psn_add(wq.send_psn, 1);
		if (psn_diff(wq.send_psn, wq.una_psn) > psn_diff(wq.sent_high, wq.una_psn))
			wq.sent_high = wq.send_psn;
		if (k + 1 == m.packets)
			++wq.send_index;
	}
	if (wq.size && !wq.deadline_ns) {
		wq.deadline_ns = now + ack_timeout_ns(qp);
		arm_stall(qp, wq, now);
	}
	if (wq.ack_word && wq.send_psn != first_psn)
		take_owed_ack(qp, wq, out);
}

// The last packet sent, again, asking for an ACK (kStallNs). False when
// it belongs to a READ or atomic, whose request asks for every response
// again: that is a go-back.
bool probe(xsrc_wire_qp &wq)
{
	uint32_t last = psn_add(wq.sent_high, w::kPsnMask);
	for (size_t i = 0; i < wq.size; ++i) {
		const xsrc_wire_msg &m = wq.msg(i);
		uint32_t k = psn_diff(last, m.first_psn);
		if (k >= m.packets)
			continue;
		if (wqe_wants_data(m.opcode))
			return false;
		w::PacketBatch out(*wq.socket, wq.dgid);
		send_one(out, wq, m, k, last, true);
		return true;
	}
	return false;
}

// Back to the oldest unacknowledged PSN (go-back-N).
void rewind(xsrc_wire_qp &wq)
{
	wq.send_psn = wq.una_psn;
	wq.send_index = 0;
}

// A go-back because the link lost something (a sequence NAK, the ACK
// timeout, a stall): the window halves, and sending starts over from una.
void go_back(xsrc_wire_qp &wq)
{
	wq.cwnd = std::max(wq.cwnd / 2, kMinWindow);
	rewind(wq);
}

// The oldest message leaves the ring.
void pop_msg(xsrc_context *ctx, xsrc_wire_qp &wq)
{
	wq.head = (wq.head + 1) % wq.msgs.size();
	--wq.size;
	ctx->wire_engine->in_flight.fetch_sub(1, std::memory_order_relaxed);
}

void complete_msg(xsrc_context *ctx, xsrc_qp *qp, const xsrc_wire_msg &m, ibv_wc_status status)
{
	xsrc_requester_complete_later(ctx, qp, m.wr_id, m.opcode, m.signaled, status,
				      status == IBV_WC_SUCCESS ? static_cast<uint32_t>(m.length) : 0);
}

// Progress: the ACK timer starts over (nothing in flight: off), the retry
// count too. Whoever changed the state sends more or returns; the timer
// stays armed either way, so a QP with messages in flight is never left
// without one.
void rearm(xsrc_context *ctx, xsrc_qp *qp, xsrc_wire_qp &wq)
{
	wq.retries_left = -1;
	wq.nak_retry = false;
	wq.stalls = 0;
	uint64_t now = xsrc_requester_now_ns();
	wq.deadline_ns = wq.size ? now + ack_timeout_ns(qp) : 0;
	arm_stall(qp, wq, now);
	if (uint64_t due = next_due(wq))
		ctx->wire_engine->poke(due);
}

// Every message whose last PSN is at or before `psn` is done.
void ack_through(xsrc_context *ctx, xsrc_qp *qp, xsrc_wire_qp &wq, uint32_t psn)
{
	// Only a PSN we sent counts: [una, sent_high); after a go-back the
	// first sends may still be acknowledged.
	uint32_t ahead = psn_diff(psn, wq.una_psn);
	if (ahead >= psn_diff(wq.sent_high, wq.una_psn))
		return;
	bool progressed = false;
	while (wq.size) {
		xsrc_wire_msg &m = wq.msg(0);
		uint32_t last = psn_add(m.first_psn, m.packets - 1);
		if (psn_diff(psn, last) >= kPsnHalf)
			break;
		if (wqe_wants_data(m.opcode)) {
			// The responder went past a READ or atomic whose answer we did
			// not get (lost): ask again from the first missing response.
			wq.una_psn = psn_add(m.first_psn, m.received);
			rewind(wq);
			rearm(ctx, qp, wq);
			return;
		}
		complete_msg(ctx, qp, m, IBV_WC_SUCCESS);
		pop_msg(ctx, wq);
		if (wq.send_index)
			--wq.send_index;
		progressed = true;
	}
	wq.cwnd = std::min(wq.window, wq.cwnd + psn_diff(psn_add(psn, 1), wq.una_psn));
	wq.una_psn = psn_add(psn, 1);
	// Never past the first response a READ or atomic still waits for: the
	// responses after a lost one are not acknowledgements of it.
	if (wq.size && wqe_wants_data(wq.msg(0).opcode)) {
		const xsrc_wire_msg &m = wq.msg(0);
		uint32_t missing = psn_add(m.first_psn, m.received);
		if (psn_diff(wq.una_psn, m.first_psn) > m.received)
			wq.una_psn = missing;
	}
	if (psn_diff(wq.send_psn, wq.una_psn) >= kPsnHalf)
		rewind(wq);
	// Progress: the timer starts over, and so do the retry counts.
	rearm(ctx, qp, wq);
	if (progressed)
		wq.rnr_retries_left = -1;
}

// The head message ends with `status`; the QP goes to error; every other
// message and queued WQE is flushed.
void fail_head(xsrc_context *ctx, xsrc_qp *qp, xsrc_wire_qp &wq, ibv_wc_status status)
{
	xsrc::qp_state_store(*qp->entry, IBV_QPS_ERR);
	if (wq.size) {
		complete_msg(ctx, qp, wq.msg(0), status);
		pop_msg(ctx, wq);
	}
	xsrc_wire_qp_flush(qp, false);
	xsrc_requester_flush(qp);
}

// One more try of what is unacknowledged, counted against retry_cnt as
// rxe and the IBTA count them (a local ACK timeout, or a PSN sequence NAK
// with no progress since the last try). False, with the head message
// completed as IBV_WC_RETRY_EXC_ERR and the QP in error, once retry_cnt
// tries were spent.
bool spend_retry(xsrc_context *ctx, xsrc_qp *qp, xsrc_wire_qp &wq)
{
	if (wq.retries_left < 0)
		wq.retries_left = qp->entry->retry_cnt;
	if (wq.retries_left-- == 0) {
		fail_head(ctx, qp, wq, IBV_WC_RETRY_EXC_ERR);
		return false;
	}
	return true;
}

// A response from the responder (under sq_lock).
void on_response(xsrc_context *ctx, xsrc_qp *qp, xsrc_wire_qp &wq, const w::Bth &bth, const w::Aeth &aeth,
		 uint64_t now)
{
	if (xsrc::qp_state_load(*qp->entry) == IBV_QPS_ERR || !wq.size)
		return;
	uint32_t psn = bth.psn;
	switch (aeth.syndrome >> 5) {
	case 0:  // ACK
		ack_through(ctx, qp, wq, psn);
		break;
	case 1: {  // RNR NAK: the packet at psn found no receive
		ack_through(ctx, qp, wq, psn_add(psn, w::kPsnMask));  // psn - 1
		if (psn != wq.una_psn)
			return;  // stale
		if (wq.rnr_retries_left < 0)
			wq.rnr_retries_left = qp->entry->rnr_retry;
		if (wq.rnr_retries_left != kRnrRetryForever && wq.rnr_retries_left-- == 0) {
			fail_head(ctx, qp, wq, IBV_WC_RNR_RETRY_EXC_ERR);
			return;
		}
		rewind(wq);
		wq.rnr_until_ns = now + xsrc_requester_rnr_delay_ns(aeth.syndrome & 0x1F);
		wq.deadline_ns = wq.rnr_until_ns + ack_timeout_ns(qp);
		wq.stall_ns = 0;  // the responder said why it is silent
		return;
	}
	case 3: {  // NAK
		ack_through(ctx, qp, wq, psn_add(psn, w::kPsnMask));
		if (psn != wq.una_psn)
			return;  // stale
		switch (aeth.syndrome & 0x1F) {
		case 0:  // PSN sequence error: go back, once per try
			wq.heard = true;
			if (wq.nak_retry || !spend_retry(ctx, qp, wq))
				return;
			wq.nak_retry = true;
			go_back(wq);
			arm_stall(qp, wq, now);
			if (wq.stall_ns)
				ctx->wire_engine->poke(wq.stall_ns);
			break;
		case 1:
			fail_head(ctx, qp, wq, IBV_WC_REM_INV_REQ_ERR);
			return;
		case 2:
			fail_head(ctx, qp, wq, IBV_WC_REM_ACCESS_ERR);
			return;
		default:
			fail_head(ctx, qp, wq, IBV_WC_REM_OP_ERR);
			return;
		}
		break;
	}
	default:
		return;  // reserved
	}
	pump(qp, wq, now);
}

// Bytes of a response after its headers, before its pad.
std::span<const uint8_t> response_payload(const uint8_t *bytes, size_t len, const w::Bth &bth)
{
	size_t headers = w::header_bytes(bth.opcode);
	if (!headers || len < headers + bth.pad)
		return {};
	return {bytes + headers, len - headers - bth.pad};
}

// Copies `data` into the message's local buffers at `offset`.
void place(const xsrc_wire_msg &m, uint64_t offset, std::span<const uint8_t> data)
{
	std::array<iovec, XSRC_MAX_RECV_SGE> out;
	size_t n = xsrc::iov_slice({m.iov, m.count}, offset, data.size(), out.data());
	size_t at = 0;
	for (size_t i = 0; i < n; ++i) {
		std::memcpy(out[i].iov_base, data.data() + at, out[i].iov_len);
		at += out[i].iov_len;
	}
}

// A response at `psn`, past una_psn, which is missing: lost on the way (or
// overtaken). The READ is asked again from the first missing response at
// once, as rxe does, instead of after the ACK timeout: a long READ on a link
// that loses a packet in a hundred would otherwise wait out the timer for
// each loss. Once per gap: the responses already in flight behind the lost
// one land here too. A duplicate (before una_psn) changes nothing.
void ask_again_past_gap(xsrc_qp *qp, xsrc_wire_qp &wq, uint32_t psn, uint64_t now)
{
	uint32_t ahead = psn_diff(psn, wq.una_psn);
	if (ahead >= psn_diff(wq.sent_high, wq.una_psn))
		return;
	if (wq.asked_again_from == wq.una_psn)
		return;
	wq.asked_again_from = wq.una_psn;
	rewind(wq);
	pump(qp, wq, now);
}

// A READ response or ATOMIC ACK (under sq_lock): the data lands in the
// head message's buffers, in PSN order; anything else is dropped.
void on_data_response(xsrc_context *ctx, xsrc_qp *qp, xsrc_wire_qp &wq, const w::Bth &bth,
		      std::span<const uint8_t> bytes, uint64_t now)
{
	if (xsrc::qp_state_load(*qp->entry) == IBV_QPS_ERR || !wq.size)
		return;
	// Responses imply the ACK of every earlier request.
	ack_through(ctx, qp, wq, psn_add(bth.psn, w::kPsnMask));
	if (!wq.size)
		return;
	if (bth.psn != wq.una_psn) {
		ask_again_past_gap(qp, wq, bth.psn, now);
		return;
	}
	xsrc_wire_msg &m = wq.msg(0);
	uint32_t k = psn_diff(bth.psn, m.first_psn);
	uint8_t o = bth.opcode & 0x1F;
	bool is_read = o >= op::kReadResponseFirst && o <= op::kReadResponseOnly;
	if (!wqe_wants_data(m.opcode) || k >= m.packets || is_read != (m.opcode == IBV_WR_RDMA_READ) ||
	    k != m.received)
		return;
	std::span<const uint8_t> payload = response_payload(bytes.data(), bytes.size(), bth);
	if (is_read) {
		uint64_t offset = uint64_t(k) * wq.mtu;
		if (offset > m.length || payload.size() > m.length - offset)
			return;
		place(m, offset, payload);
	} else {
		size_t at = w::kBthBytes + w::kAethBytes;
		if (bytes.size() < at + w::kAtomicAckEthBytes)
			return;
		uint64_t original =
			w::decode_atomic_ack_eth(std::span<const uint8_t, w::kAtomicAckEthBytes>(bytes.data() + at,
											   w::kAtomicAckEthBytes))
				.original;
		place(m, 0, {reinterpret_cast<const uint8_t *>(&original), sizeof(original)});
	}
	++m.received;
	wq.una_psn = psn_add(bth.psn, 1);
	rearm(ctx, qp, wq);
	if (m.received == m.packets) {
		complete_msg(ctx, qp, m, IBV_WC_SUCCESS);
		pop_msg(ctx, wq);
		if (wq.send_index)
			--wq.send_index;
	}
	if (psn_diff(wq.send_psn, wq.una_psn) >= kPsnHalf)
		rewind(wq);
	pump(qp, wq, now);
}

// The local ACK timer (under sq_lock). Returns the next time it is due, 0: none.
uint64_t on_timer(xsrc_context *ctx, xsrc_qp *qp, xsrc_wire_qp &wq, uint64_t now)
{
	if (!wq.size || xsrc::qp_state_load(*qp->entry) == IBV_QPS_ERR) {
		wq.deadline_ns = wq.stall_ns = 0;
		return 0;
	}
	if (wq.rnr_until_ns) {
		if (now < wq.rnr_until_ns)
			return wq.rnr_until_ns;
		pump(qp, wq, now);  // the RNR wait is over: resend
		return wq.deadline_ns;
	}
	if (!wq.deadline_ns)
		pump(qp, wq, now);
	if (now < wq.deadline_ns) {
		if (wq.stall_ns && now >= wq.stall_ns) {
			if (wq.heard) {
				wq.stall_ns = 0;  // it answers: the NAK and the timer decide
			} else if (!wq.probed && probe(wq)) {
				arm_stall(qp, wq, now, true);
			} else {
				++wq.stalls;
				go_back(wq);
				pump(qp, wq, now);
				arm_stall(qp, wq, now);
			}
		}
		return next_due(wq);
	}
	if (!spend_retry(ctx, qp, wq))
		return 0;
	wq.nak_retry = false;  // a NAK for this try goes back again
	go_back(wq);
	wq.deadline_ns = 0;
	pump(qp, wq, now);
	return next_due(wq);
}

// The GID at `index` of the QP's port and the interface it is on.
bool source_gid(ibv_context *ibctx, uint8_t port, uint8_t index, ibv_gid &gid, uint32_t &ifindex)
{
	ibv_gid_entry entry{};
	if (ibv_query_gid_ex(ibctx, port, index, &entry, 0))
		return false;
	gid = entry.gid;
	ifindex = entry.ndev_ifindex;
	return true;
}

// XSRC_CMD_WIRE_RESPONSES: the daemon takes `fd`, sending a batch of
// responses per message where it can (`batched`). Returns 0 or errno.
// A memfd for the ACK board, sealed against any change of size (xsrcd maps
// it too, and refuses a file that could shrink under it).
xsrc::unique_fd ack_board_memfd()
{
	xsrc::unique_fd fd(memfd_create("xsrc-ack-board", MFD_CLOEXEC | MFD_ALLOW_SEALING));
	if (!fd || ftruncate(fd.get(), kAckBoardBytes) ||
	    fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
		return xsrc::unique_fd();
	return fd;
}

// Registers the response socket `fd` (and, where the daemon takes one, the
// ACK board `board_fd`, -1: none): the newest form the daemon knows.
int register_responses(xsrc_context *ctx, int fd, int board_fd, bool &batched, bool &board)
{
	batched = board = false;
#if XSRC_DRIVER_ABI_REVISION >= 8
	struct {
		ib_uverbs_cmd_hdr hdr;
		xsrc_wire_responses body;
	} cmd{};
	cmd.body.fd = static_cast<uint32_t>(fd);
#ifdef XSRC_ACK_OWED
	// Without the board the command is as long as it was before it.
	constexpr size_t kShort = sizeof(cmd.hdr) + offsetof(xsrc_wire_responses, board_fd);
#else
	constexpr size_t kShort = sizeof(cmd);
#endif
	auto send = [&](uint32_t comp_mask, size_t len) {
		cmd.body.comp_mask = comp_mask;
		xsrc_cmd_header(cmd.hdr, XSRC_CMD_WIRE_RESPONSES, len, 0);
		ssize_t n = write(ctx->ibv_ctx.context.cmd_fd, &cmd, len);
		if (n == static_cast<ssize_t>(len))
			return 0;
		return n < 0 ? errno : EIO;
	};
	// A daemon that predates a form refuses it (EOPNOTSUPP, or EINVAL for
	// a command longer than it knows): the next older one.
	auto older = [](int err) { return err == EOPNOTSUPP || err == EINVAL; };
	int err = EOPNOTSUPP;
#ifdef XSRC_ACK_OWED
	if (board_fd >= 0) {
		cmd.body.board_fd = static_cast<uint32_t>(board_fd);
		cmd.body.board_entries = kAckBoardEntries;
		if (!(err = send(XSRC_WIRE_RESPONSES_BATCHED | XSRC_WIRE_RESPONSES_ACK_BOARD, sizeof(cmd)))) {
			batched = board = true;
			return 0;
		}
		cmd.body.board_fd = cmd.body.board_entries = 0;
	}
#else
	(void)board_fd;
#endif
#ifdef XSRC_WIRE_RESPONSE_BATCH_BYTES
	if (older(err) && !(err = send(XSRC_WIRE_RESPONSES_BATCHED, kShort)))
		batched = true;
#endif
	if (older(err))
		err = send(0, kShort);  // a daemon that sends one response per message
	return err;
#else
	// A provider built against an older driver ABI: no RC on the wire.
	(void)ctx;
	(void)fd;
	(void)board_fd;
	return EOPNOTSUPP;
#endif
}

}  // namespace

namespace xsrc {

WireEngine::~WireEngine()
{
	if (started_) {
		stop_ = true;
		uint64_t one = 1;
		if (write(wake_.get(), &one, sizeof(one)) < 0) {
			// Only an overflowing counter fails; the thread wakes anyway.
		}
		pthread_join(thread_, nullptr);
	}
	// After the thread: its timers send requests, and with them owed ACKs.
	if (board_)
		munmap(board_, kAckBoardBytes);
}

int WireEngine::start() noexcept
{
	std::lock_guard guard(lock_);
	if (started_)
		return 0;
	int sv[2];
	// Sequenced packets: a response is one message, and the daemon's
	// non-blocking send fails (the response is lost) rather than waits
	// when we fall behind.
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv))
		return errno;
	unique_fd ours(sv[0]), theirs(sv[1]);
	int bytes = kResponseBufferBytes;
	setsockopt(ours.get(), SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
	setsockopt(theirs.get(), SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
	wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
	if (!wake_)
		return errno;
	try {
		received_.resize(kMaxResponseMessage);
	} catch (const std::bad_alloc &) {
		return ENOMEM;
	}
	// The ACK board is an optimisation: without a memfd, or with a daemon
	// that takes none, every ACK is the daemon's to send at once.
	unique_fd board = ack_board_memfd();
	void *words = board ? mmap(nullptr, kAckBoardBytes, PROT_READ | PROT_WRITE, MAP_SHARED, board.get(), 0)
			    : MAP_FAILED;
	bool have_board = false;  // only on success
	int err = register_responses(ctx_, theirs.get(), words != MAP_FAILED ? board.get() : -1, batched_,
				     have_board);
	if (have_board)
		board_ = static_cast<uint64_t *>(words);
	else if (words != MAP_FAILED)
		munmap(words, kAckBoardBytes);
	if (err) {
		verbs_err(&ctx_->ibv_ctx, "the device refused our RoCE response socket: %s\n", strerror(err));
		return err;
	}
	responses_ = std::move(ours);
	err = xsrc_start_thread(thread_, thread_main, this);
	if (err) {
		verbs_err(&ctx_->ibv_ctx, "cannot start the RoCE response thread: %s\n", strerror(err));
		return err;
	}
	started_ = true;
	return 0;
}

int WireEngine::add(xsrc_qp *qp) noexcept
{
	std::lock_guard guard(lock_);
	if (std::find(qps_.begin(), qps_.end(), qp) != qps_.end())
		return 0;
	try {
		qps_.push_back(qp);
	} catch (const std::bad_alloc &) {
		return ENOMEM;
	}
	return 0;
}

void WireEngine::remove(xsrc_qp *qp) noexcept
{
	std::lock_guard guard(lock_);
	std::erase(qps_, qp);
}

void WireEngine::poke(uint64_t at_ns) noexcept
{
	if (at_ns >= sleep_until_.load(std::memory_order_acquire))
		return;
	uint64_t one = 1;
	if (write(wake_.get(), &one, sizeof(one)) < 0) {
		// Full counter: a wake is pending already.
	}
}

void WireEngine::poll() noexcept
{
	polled_.store(true, std::memory_order_relaxed);
	drain(false);
}

void WireEngine::armed() noexcept
{
	armed_.store(true);
	if (watching_.load())
		return;
	uint64_t one = 1;
	if (write(wake_.get(), &one, sizeof(one)) < 0) {
		// Full counter: a wake is pending already.
	}
}

void WireEngine::drain(bool wait_for_lock) noexcept
{
	std::unique_lock guard(recv_lock_, std::defer_lock);
	if (wait_for_lock)
		guard.lock();
	else if (!guard.try_lock())
		return;  // someone is at it
	for (;;) {
		ssize_t got = recv(responses_.get(), received_.data(), received_.size(), MSG_DONTWAIT);
		if (got <= 0)
			return;
		if (!batched_) {
			handle(received_.data(), static_cast<size_t>(got));
			continue;
		}
		// A batch: each response behind its __u16 length (little-endian).
		for (size_t at = 0; at + 2 <= static_cast<size_t>(got);) {
			size_t len = size_t(received_[at]) | size_t(received_[at + 1]) << 8;
			at += 2;
			if (len > static_cast<size_t>(got) - at)
				break;  // a torn batch: what is left is lost, the timer recovers
			handle(received_.data() + at, len);
			at += len;
		}
	}
}

void *WireEngine::thread_main(void *self) noexcept
{
	static_cast<WireEngine *>(self)->run();
	return nullptr;
}

void WireEngine::handle(const uint8_t *bytes, size_t len) noexcept
{
	if (len < w::kBthBytes + w::kAethBytes)
		return;
	w::Bth bth = w::decode_bth(std::span<const uint8_t, w::kBthBytes>(bytes, w::kBthBytes));
	uint8_t o = bth.opcode & 0x1F;
	if (o < op::kReadResponseFirst || o > op::kAtomicAcknowledge)
		return;
	w::Aeth aeth = w::decode_aeth(std::span<const uint8_t, w::kAethBytes>(bytes + w::kBthBytes, w::kAethBytes));
	std::lock_guard guard(lock_);
	for (xsrc_qp *qp : qps_) {
		if (qp->qpn.value() != bth.dest_qpn || !qp->wire)
			continue;
		std::lock_guard sq(qp->sq_lock);
		// A READ response with a NAK syndrome is a NAK (IBTA 9.7.5.2).
		bool nak = o != op::kReadResponseMiddle && (aeth.syndrome >> 5) != 0;
		if (o == op::kAcknowledge || nak)
			on_response(ctx_, qp, *qp->wire, bth, aeth, xsrc_requester_now_ns());
		else
			on_data_response(ctx_, qp, *qp->wire, bth, {bytes, len}, xsrc_requester_now_ns());
		return;
	}
}

uint64_t WireEngine::timers(uint64_t now) noexcept
{
	uint64_t next = UINT64_MAX;
	std::lock_guard guard(lock_);
	for (xsrc_qp *qp : qps_) {
		std::lock_guard sq(qp->sq_lock);
		if (!qp->wire)
			continue;
		uint64_t due = next_due(*qp->wire);
		if (!due)
			continue;
		if (due <= now)
			due = on_timer(ctx_, qp, *qp->wire, now);
		if (due)
			next = std::min(next, due);
	}
	return next;
}

void WireEngine::run() noexcept
{
	while (!stop_.load()) {
		// What came while we did not wait on the socket, before any timer
		// takes its silence for a loss.
		drain(true);
		// Quiet while the application polls and has armed no CQ; armed()
		// sees watching_ false, or we see armed_.
		watching_.store(false);
		bool watch = !polled_.exchange(false, std::memory_order_relaxed);
		if (armed_.exchange(false))
			watch = true;
		watching_.store(watch);
		uint64_t now = xsrc_requester_now_ns();
		uint64_t next = timers(now);
		if (!watch)
			next = std::min(next, now + kQuietNs);
		// Deadlines set from now on that are sooner than `next` wake us.
		sleep_until_.store(next, std::memory_order_release);
		now = xsrc_requester_now_ns();
		if (next != UINT64_MAX) {
			// A deadline set between timers() and the store: look again.
			next = std::min(next, timers(now));
			sleep_until_.store(next, std::memory_order_release);
		}
		timespec ts{}, *timeout = nullptr;
		if (next != UINT64_MAX) {
			ts = xsrc::timespec_of_ns(next > now ? next - now : 0);
			timeout = &ts;
		}
		pollfd fds[2] = {{watch ? responses_.get() : -1, POLLIN, 0}, {wake_.get(), POLLIN, 0}};
		int n = ppoll(fds, 2, timeout, nullptr);
		sleep_until_.store(0, std::memory_order_release);
		if (n < 0 && errno != EINTR)
			return;
		if (fds[1].revents & POLLIN) {
			uint64_t count;
			if (read(wake_.get(), &count, sizeof(count)) < 0) {
				// Already drained.
			}
		}
		if (fds[0].revents & (POLLHUP | POLLERR))
			return;  // the daemon is gone: device_death.cpp fails the QPs
	}
}

}  // namespace xsrc

int xsrc_wire_prepare(xsrc_qp *qp) noexcept
{
	if (qp->type != IBV_QPT_RC && qp->type != IBV_QPT_XRC_SEND)
		return 0;
	xsrc_context *ctx = to_xsrc_ctx(qp->vqp.qp.context);
	{
		std::lock_guard guard(ctx->progress_lock);
		if (!ctx->wire_engine)
			ctx->wire_engine.reset(new (std::nothrow) xsrc::WireEngine(ctx));
	}
	if (!ctx->wire_engine)
		return ENOMEM;
	return ctx->wire_engine->start();
}

int xsrc_wire_qp_modify(xsrc_qp *qp, const ibv_qp_attr &attr, int attr_mask) noexcept
{
	xsrc_context *ctx = to_xsrc_ctx(qp->vqp.qp.context);
	if (qp->type != IBV_QPT_RC && qp->type != IBV_QPT_UC && qp->type != IBV_QPT_XRC_SEND)
		return 0;
	if (attr_mask & IBV_QP_AV) {
		if (!qp->wire) {
			qp->wire = new (std::nothrow) xsrc_wire_qp;
			if (!qp->wire)
				return ENOMEM;
			set_mtu(*qp->wire, qp->wire->mtu);
		}
		xsrc_wire_qp &wq = *qp->wire;
		wq.reliable = qp->type == IBV_QPT_RC || qp->type == IBV_QPT_XRC_SEND;
		wq.xrc = qp->type == IBV_QPT_XRC_SEND;
		uint32_t ifindex = 0;
		wq.port_num = attr.ah_attr.port_num ? attr.ah_attr.port_num : 1;
		wq.sgid_index = attr.ah_attr.grh.sgid_index;
		std::memcpy(wq.dgid.data(), attr.ah_attr.grh.dgid.raw, wq.dgid.size());
		std::array<uint8_t, 16> sgid{};
		// A path no packet can take (no such source GID, an IPv4 source and
		// an IPv6 destination, an address gone) is a peer nobody reaches:
		// RC retries, then IBV_WC_RETRY_EXC_ERR; UC loses its messages.
		wq.socket = nullptr;
		if (!source_gid(&ctx->ibv_ctx.context, wq.port_num, wq.sgid_index, wq.sgid, ifindex)) {
			verbs_warn(&ctx->ibv_ctx, "modify_qp: QP %u: no source GID at index %u: its peer is unreachable\n",
				   qp->qpn.value(), wq.sgid_index);
		} else if (std::memcpy(sgid.data(), wq.sgid.raw, sgid.size());
			   w::gid_is_ipv4_mapped(sgid) != w::gid_is_ipv4_mapped(wq.dgid)) {
			verbs_warn(&ctx->ibv_ctx,
				   "modify_qp: QP %u: source and destination GIDs are of different IP families: its peer is unreachable\n",
				   qp->qpn.value());
		} else if (!(wq.socket = ctx->wire.socket_for(
				     sgid, ifindex,
				     w::udp_source_port(qp->qpn.value(), (attr_mask & IBV_QP_DEST_QPN) ? attr.dest_qp_num
												: wq.dest_qpn)))) {
			verbs_warn(&ctx->ibv_ctx, "modify_qp: QP %u: no UDP socket for the source GID (%s): its peer is unreachable\n",
				   qp->qpn.value(), strerror(errno));
		}
		if (wq.reliable) {
			size_t slots = size_t(qp->max_send_wr) + 1;
			size_t inline_bytes = std::max<uint32_t>(qp->max_inline_data, 1);
			try {
				wq.msgs.assign(slots, {});
				wq.iov_store.assign(slots * XSRC_MAX_RECV_SGE, {});
				wq.inline_store.assign(slots * inline_bytes, 0);
			} catch (const std::bad_alloc &) {
				return ENOMEM;
			}
			for (size_t i = 0; i < slots; ++i) {
				wq.msgs[i].iov = &wq.iov_store[i * XSRC_MAX_RECV_SGE];
				wq.msgs[i].inline_copy = &wq.inline_store[i * inline_bytes];
			}
			if (int err = xsrc_wire_prepare(qp))
				return err;
			if (int err = ctx->wire_engine->add(qp))
				return err;
			if (!wq.xrc)
				wq.ack_word = ctx->wire_engine->ack_word(qp->qpn);
			ctx->wire_live.store(ctx->wire_engine.get(), std::memory_order_release);
		}
	}
	if (!qp->wire)
		return 0;
	std::lock_guard sq(qp->sq_lock);
	xsrc_wire_qp &wq = *qp->wire;
	if (attr_mask & IBV_QP_DEST_QPN)
		wq.dest_qpn = attr.dest_qp_num & w::kQpnMask;
	if (attr_mask & IBV_QP_PATH_MTU)
		set_mtu(wq, std::min<uint32_t>(128u << attr.path_mtu, ctx->port_mtu_bytes));
	if (attr_mask & IBV_QP_SQ_PSN)
		wq.next_psn = wq.send_psn = wq.una_psn = wq.sent_high = attr.sq_psn & w::kPsnMask;
	return 0;
}

xsrc_attempt_result xsrc_wire_connected_execute(xsrc_context *ctx, xsrc_qp *qp, const xsrc_send_wqe &wqe) noexcept
{
	if (!qp->wire || !qp->wire->socket)
		return qp->type == IBV_QPT_UC ? Result::dropped() : Result::unreachable();
	xsrc_wire_qp &wq = *qp->wire;
	switch (wqe.opcode) {
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		break;
	case IBV_WR_RDMA_READ:
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
	case IBV_WR_SEND_WITH_INV:  // IBTA defines it for RC and XRC, not UC
		if (wq.reliable)
			break;
		[[fallthrough]];
	case IBV_WR_ATOMIC_WRITE:  // RC only here
		if (wq.reliable && !wq.xrc)
			break;
		[[fallthrough]];
	default:
		verbs_err(&ctx->ibv_ctx, "post_send: QP %u: opcode %d does not cross hosts yet\n", qp->qpn.value(),
			  wqe.opcode);
		return Result::failed(IBV_WC_LOC_QP_OP_ERR);
	}
	xsrc_local_buffers local;
	// READ and atomics write into the local buffers.
	if (!xsrc_peer_local_buffers(ctx, qp, wqe, wqe_wants_data(wqe.opcode), local))
		return Result::failed(IBV_WC_LOC_PROT_ERR);
	if (local.total > UINT32_MAX || (wqe_is_atomic(wqe.opcode) && local.total != 8))
		return Result::failed(IBV_WC_LOC_LEN_ERR);
	// ATOMIC WRITE: its 8 bytes travel in the message (ibv_wr_atomic_write's
	// value, or the gather list's), not from the buffers at send time.
	bool atomic_write = wqe.opcode == IBV_WR_ATOMIC_WRITE;
	uint64_t atomic_value = wqe.swap;
	if (atomic_write && !wqe.atomic_value_inline) {
		if (local.total != sizeof(atomic_value))
			return Result::failed(IBV_WC_LOC_LEN_ERR);
		auto *to = reinterpret_cast<unsigned char *>(&atomic_value);
		for (size_t i = 0; i < local.count; ++i) {
			std::memcpy(to, local.iov[i].iov_base, local.iov[i].iov_len);
			to += local.iov[i].iov_len;
		}
	}

	xsrc_wire_msg m;
	m.wr_id = wqe.wr_id;
	m.opcode = wqe.opcode;
	m.signaled = qp->sq_sig_all || (wqe.flags & IBV_SEND_SIGNALED);
	m.solicited = wqe.flags & IBV_SEND_SOLICITED;
	m.imm = wqe.opcode == IBV_WR_SEND_WITH_INV ? wqe.invalidate_rkey : wqe.imm_data;
	m.remote_addr = wqe.remote_addr;
	m.rkey = wqe.rkey.value();
	m.length = local.total;
	m.compare = wqe.compare_add;
	m.swap = wqe.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ? wqe.compare_add : atomic_write ? atomic_value : wqe.swap;
	if (atomic_write)
		m.length = sizeof(atomic_value);
	m.packets = wqe_is_atomic(wqe.opcode) ? 1 : packets_of(local.total, wq.mtu);
	m.first_psn = wq.next_psn;
	m.remote_srqn = wqe.remote_srqn.value() & w::kQpnMask;

	if (!wq.reliable) {
		// UC: out it goes; nobody acknowledges it.
		m.iov = local.iov.data();
		m.count = local.count;
		w::PacketBatch out(*wq.socket, wq.dgid);
		for (uint32_t k = 0; k < m.packets; ++k)
			send_one(out, wq, m, k, psn_add(m.first_psn, k));
		wq.next_psn = psn_add(wq.next_psn, m.packets);
		return Result::done(local.total);
	}

	if (wq.size + 1 >= wq.msgs.size()) {
		verbs_err(&ctx->ibv_ctx, "post_send: QP %u: more messages in flight than max_send_wr\n",
			  qp->qpn.value());
		return Result::failed(IBV_WC_LOC_QP_OP_ERR);
	}
	xsrc_wire_msg &slot = wq.msg(wq.size);
	iovec *iov = slot.iov;
	unsigned char *inline_copy = slot.inline_copy;
	slot = m;
	slot.iov = iov;
	slot.inline_copy = inline_copy;
	if (atomic_write) {
		slot.count = 0;  // the value is in the message
	} else if (wqe.flags & IBV_SEND_INLINE) {
		// The inline bytes live in the send queue's slot, which the next
		// post reuses: keep our own copy until the ACK.
		size_t at = 0;
		for (size_t i = 0; i < local.count; ++i) {
			std::memcpy(inline_copy + at, local.iov[i].iov_base, local.iov[i].iov_len);
			at += local.iov[i].iov_len;
		}
		iov[0] = {inline_copy, at};
		slot.count = at ? 1 : 0;
	} else {
		std::copy_n(local.iov.begin(), local.count, iov);
		slot.count = local.count;
	}
	++wq.size;
	ctx->wire_engine->in_flight.fetch_add(1, std::memory_order_relaxed);
	wq.next_psn = psn_add(wq.next_psn, m.packets);
	bool was_idle = !wq.deadline_ns;
	pump(qp, wq, xsrc_requester_now_ns());
	if (was_idle && wq.deadline_ns)
		ctx->wire_engine->poke(next_due(wq));
	return Result::posted();
}

void xsrc_wire_qp_flush(xsrc_qp *qp, bool forget) noexcept
{
	if (!qp->wire)
		return;
	xsrc_context *ctx = to_xsrc_ctx(qp->vqp.qp.context);
	xsrc_wire_qp &wq = *qp->wire;
	while (wq.size) {
		if (!forget)
			complete_msg(ctx, qp, wq.msg(0), IBV_WC_WR_FLUSH_ERR);
		pop_msg(ctx, wq);
	}
	wq.send_index = 0;
	wq.send_psn = wq.una_psn = wq.sent_high = wq.next_psn;
	wq.deadline_ns = wq.rnr_until_ns = wq.stall_ns = 0;
	wq.stalls = 0;
	wq.retries_left = wq.rnr_retries_left = -1;
	wq.nak_retry = false;
}

void xsrc_wire_qp_destroy(xsrc_context *ctx, xsrc_qp *qp) noexcept
{
	if (ctx->wire_engine)
		ctx->wire_engine->remove(qp);
	delete qp->wire;
	qp->wire = nullptr;
}

void xsrc_wire_poll(xsrc_context *ctx) noexcept
{
	xsrc::WireEngine *engine = ctx->wire_live.load(std::memory_order_acquire);
	if (engine && engine->in_flight.load(std::memory_order_relaxed))
		engine->poll();
}

void xsrc_wire_armed(xsrc_context *ctx) noexcept
{
	if (xsrc::WireEngine *engine = ctx->wire_live.load(std::memory_order_acquire))
		engine->armed();
}
