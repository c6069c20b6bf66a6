// The daemon's object model: devices, the contexts opened on them (one per
// command file), and the verbs objects each context owns. All of it is
// guarded by Daemon::mutex(); nothing here locks on its own.
#pragma once

#include <rdma/ib_user_verbs.h>
#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "arena.h"
#include "common/fd.h"
#include "common/ids.h"
#include "caller.h"
#include "common/ring_ops.h"
#include "netdev.h"
#include "sysfs_view.h"
#include "wire/sender.h"
#include "xsrc-abi.h"
#include "xsrc-queues.h"

namespace xsrc {

// Limits the device advertises and every command honours.
struct DeviceLimits {
	static constexpr uint32_t max_qp = 16384;
	static constexpr uint32_t max_qp_wr = 16384;
	static constexpr uint32_t max_sge = 32;
	static constexpr uint32_t max_inline_data = 512;
	static constexpr uint32_t max_cq = 16384;
	static constexpr uint32_t max_cqe = 65535;
	static constexpr uint32_t max_mr = XSRC_MR_TABLE_LEN - 1;  // index 0 makes no key
	// Memory windows (driver ABI r4) share the MR table's key space.
	static constexpr uint32_t max_mw = 16384;
	static constexpr uint32_t max_pd = 16384;
	static constexpr uint32_t max_qp_rd_atom = 16;
	static constexpr uint32_t max_srq = 16384;
	static constexpr uint32_t max_srq_wr = 16384;
	static constexpr uint32_t max_ah = 65536;
	static constexpr uint32_t max_xrcd = 16384;  // XRC domains on the device
	static constexpr uint32_t max_comp_channels_per_context = 1024;
	static constexpr uint32_t max_objects_per_context = 1u << 20;  // handles in one context
	static constexpr uint32_t max_msg_size = 1u << 31;
	static constexpr uint32_t gid_tbl_len = 16;
	static constexpr uint32_t num_comp_vectors = 1;
	// Multicast (driver ABI r3): groups with members, members of one group,
	// and group memberships over the whole device.
	static constexpr uint32_t max_mcast_grp = XSRC_MCAST_GROUPS;
	static constexpr uint32_t max_mcast_qp_attach = XSRC_MCAST_GROUP_QPS;
	static constexpr uint32_t max_total_mcast_qp_attach = 8192;
	// Tag matching (driver ABI r7): tagged buffers in one TM-SRQ's table;
	// list operations execute as they are posted, none stays outstanding,
	// so max_ops is what one ibv_post_srq_ops call may carry in a WQE's sense.
	static constexpr uint32_t max_num_tags = XSRC_TM_MAX_TAGS;
	static constexpr uint32_t max_tm_ops = XSRC_TM_MAX_OPS;
	static constexpr uint32_t max_rndv_hdr_size = XSRC_TM_RNDV_HDR_MAX;
};

// The arena's tables and WQE format are sized for these limits.
static_assert(DeviceLimits::max_qp == XSRC_QP_TABLE_LEN);
static_assert(DeviceLimits::max_srq == XSRC_SRQ_TABLE_LEN);
static_assert(DeviceLimits::max_mr < XSRC_MR_TABLE_LEN);
static_assert(DeviceLimits::max_sge <= XSRC_MAX_RECV_SGE);
static_assert(DeviceLimits::max_msg_size == XSRC_MAX_MSG_SIZE);
static_assert(DeviceLimits::max_total_mcast_qp_attach < DeviceLimits::max_mcast_grp * DeviceLimits::max_mcast_qp_attach,
	      "the device-wide limit binds before the table is full");

// Per-object bookkeeping. Handles (uint32_t, as on the wire; PdHandle where
// an object keeps its PD's) name objects of the same context; the ids
// (common/ids.h) are device-wide. The arena holds what other processes need
// to see.

struct Pd {
	PdId pd_id;              // device-wide, as in the arena tables
	uint32_t use_count = 0;  // MRs, QPs, SRQs, AHs on this PD
};

struct Mr {
	PdHandle pd_handle;
	uint64_t addr = 0;
	uint64_t length = 0;
	uint64_t iova = 0;
	uint32_t access = 0;
	Lkey lkey;
	Rkey rkey;
	uint32_t index() const { return lkey.value() >> 8; }  // in the MR table (the key's salt is below)
};

// A memory window (driver ABI r4). Its rkey names an MR table index of its
// own; while bound (length != 0) the arena's entry at that index describes
// the window's range, so that every rkey check of the data path covers it.
struct Mw {
	PdHandle pd_handle;
	uint8_t type = 0;            // IBV_MW_TYPE_1 or IBV_MW_TYPE_2
	Rkey rkey;                   // index << 8 | the key byte of the last bind
	// The binding; length 0: unbound (a type 2 window is then free to bind).
	uint32_t mr_index = 0;       // the MR it is bound to (Device::mrs_by_index)
	Qpn qpn;                     // type 2: the QP it was bound on
	uint64_t addr = 0;           // where the window starts in the owner
	uint64_t iova = 0;           // what its rkey addresses (0 when zero based)
	uint64_t length = 0;
	uint32_t access = 0;         // IB_UVERBS_ACCESS_* it grants
	uint32_t index() const { return rkey.value() >> 8; }
	bool bound() const { return length != 0; }
};

struct Cq {
	uint64_t user_handle = 0;  // the provider's ibv_cq pointer; events carry it
	uint32_t cqe = 0;
	int channel_fd = -1;       // the caller's channel fd number, -1 for none
	uint32_t comp_events_reported = 0;
	uint32_t async_events_reported = 0;
	uint64_t ring_off = 0;     // the current xsrc_cq_ring
	uint32_t ring_entries = 0; // its size (ours: the header is anyone's to write)
	// Rings a RESIZE_CQ replaced: the owner may still drain them, so they live
	// (and stay known to RAISE_EVENT) as long as the CQ.
	struct Retired {
		uint64_t off = 0;
		uint32_t entries = 0;
	};
	std::vector<Retired> retired_rings;
	uint32_t use_count = 0;    // QPs completing into it
};

// The attributes MODIFY_QP sets and QUERY_QP reports.
struct QpAttributes {
	ib_uverbs_qp_dest dest{};  // the primary path (RC/UC), from IBV_QP_AV
	uint32_t qkey = 0;
	uint32_t rq_psn = 0;
	uint32_t sq_psn = 0;
	uint32_t dest_qp_num = 0;
	uint32_t access_flags = 0;
	uint16_t pkey_index = 0;
	uint8_t port_num = 0;
	uint8_t path_mtu = 0;
	uint8_t path_mig_state = 0;
	uint8_t en_sqd_async_notify = 0;
	uint8_t max_rd_atomic = 0;
	uint8_t max_dest_rd_atomic = 0;
	uint8_t min_rnr_timer = 0;
	uint8_t timeout = 0;
	uint8_t retry_cnt = 0;
	uint8_t rnr_retry = 0;
};

struct QpCaps {
	uint32_t max_send_wr = 0;
	uint32_t max_recv_wr = 0;
	uint32_t max_send_sge = 0;
	uint32_t max_recv_sge = 0;
	uint32_t max_inline_data = 0;
};

struct Context;

// Names an object of some context of a device (device-wide tables).
struct ObjectRef {
	Context *ctx = nullptr;
	ObjHandle handle;
	explicit operator bool() const { return ctx != nullptr; }
	bool operator==(const ObjectRef &) const = default;
};

// An XRC receive QP (IB_QPT_XRC_TGT) is shared: the creator and every
// context that opens it by QPN (OPEN_QP) hold a handle of their own, and the
// QP lives until the last of them goes. What belongs to the QP rather than
// to a handle lives here.
struct WireResponderState;
struct XrcTgtQp {
	XrcdId xrcd_id;                  // its domain
	QpAttributes attr;               // MODIFY_QP through any handle sets them
	std::vector<ObjectRef> holders;  // every handle, oldest first
	std::shared_ptr<WireResponderState> wire_responder;  // its requests from the wire
};

// RC and UC on the wire: the responder's place in the request stream
// (wire_deliver.cpp). Made at the QP's first packet, reset when the QP
// gets a new receive PSN or goes back to RESET.
struct WireResponderState {
	uint32_t epsn = 0;           // the PSN expected next
	bool write_failed = false;   // payload placed with a batch did not land (WirePending)
	uint32_t msn = 0;            // messages completed (AETH)
	bool nak_sent = false;       // RC: a sequence NAK is out for epsn
	bool discarding = false;     // UC: a packet was lost, up to the next FIRST/ONLY
	// A SEND under way (FIRST .. LAST) and the receive it fills; a
	// receive taken for a message that then failed is kept for the next.
	bool in_send = false;
	bool have_receive = false;
	RecvWqe receive;
	uint32_t receive_srqn = 0;   // XRC: the SRQ `receive` came from
	uint64_t offset = 0;
	// An RDMA WRITE under way: where its next byte goes in the owner.
	bool in_write = false;
	uint64_t write_va = 0;
	uint64_t write_left = 0;
	uint64_t write_length = 0;
	// READ and atomic requests executed, newest last: a duplicate is
	// answered from here (a READ's checked range is read again, an
	// atomic's original value resent), never executed again.
	struct Replay {
		bool used = false;
		bool atomic = false;
		uint32_t psn = 0;
		uint32_t packets = 0;   // PSNs the request consumed
		pid_t pid = -1;         // READ: the process whose memory it reads
		uint64_t va = 0;        // READ: the checked address in the owner
		uint64_t length = 0;
		uint64_t original = 0;  // atomic: the value before
	};
	static constexpr size_t kReplaySlots = DeviceLimits::max_qp_rd_atom;
	std::array<Replay, kReplaySlots> replay{};  // the first max_dest_rd_atomic are used
	size_t replay_next = 0;
	// What the last in-order request consumed and whether it answered itself.
	uint32_t consumed = 1;
	bool answered = false;
};

// An ACK board (XSRC_WIRE_RESPONSES_ACK_BOARD): a context's memfd, mapped
// here, where an acknowledgement the responder owes a peer of one of its RC
// QPs waits a moment for the owner to send it in front of its next request
// on that QP (wire_deliver.cpp, wire_owe_ack). The words are the owner's to
// change too: nothing but "the word is still what we wrote" is trusted.
class AckBoard {
public:
	// Maps `entries` words of the memfd `fd` (sealed against shrinking: a
	// file cut short under our mapping would fault us). Null with `err`.
	static std::shared_ptr<AckBoard> map(int fd, uint32_t entries, int &err);
	~AckBoard();
	AckBoard(const AckBoard &) = delete;
	AckBoard &operator=(const AckBoard &) = delete;

	std::atomic_ref<uint64_t> word(uint32_t qpn) const { return std::atomic_ref<uint64_t>(words_[index(qpn)]); }
	// ACKs of the QP's entry to send at once, not left on the board: the
	// owner let the last one wait out its delay (a peer that sends nothing
	// back), and it is tried again after these.
	uint8_t &at_once(uint32_t qpn) { return at_once_[index(qpn)]; }

private:
	AckBoard(uint64_t *words, uint32_t entries) : words_(words), entries_(entries), at_once_(entries) {}
	uint32_t index(uint32_t qpn) const { return qpn & (entries_ - 1); }
	uint64_t *words_;
	uint32_t entries_;
	std::vector<uint8_t> at_once_;
};

// An acknowledgement left on a board (Device::owed_acks): sent when its
// deadline passes unless the board's word changed by then (the owner took
// it, or a later ACK of the same QP, which covers it, replaced it).
struct OwedAck {
	std::shared_ptr<AckBoard> board;
	uint32_t qpn = 0;
	uint64_t word = 0;
	uint64_t deadline_ns = 0;             // CLOCK_MONOTONIC
	const xsrc_wire_socket *socket = nullptr;  // the device's wire_out keeps it
	std::array<uint8_t, 16> to{};         // the peer's GID
	std::array<uint8_t, 16> headers{};    // BTH and AETH
};

// A QP handle. The links are absent where the QP type has no such object:
// XRC send QPs have no receive side, XRC receive QPs no PD and no CQs.
// Where the owner keeps the private record of the receives it posts to a
// queue (driver ABI r9, XSRC_CMD_RECV_SHADOW); addr 0: none registered, and
// a copy into the queue is checked against the owner's MRs only.
struct RecvShadow {
	uint64_t addr = 0;          // entry[0] in the owner's memory
	uint32_t num_entries = 0;   // a power of two
	uint32_t stride = 0;
	// Per ring slot, 1 + the position of the receive the device took there
	// last (recv_shadow_take); allocated at the first take.
	std::vector<uint64_t> taken;
};

struct Qp {
	uint64_t user_handle = 0;
	uint8_t qp_type = 0;         // enum ibv_qp_type
	bool sq_sig_all = false;
	std::optional<PdHandle> pd_handle;
	std::optional<uint32_t> send_cq_handle;
	std::optional<uint32_t> recv_cq_handle;
	std::optional<uint32_t> srq_handle;
	std::optional<uint32_t> xrcd_handle;  // XRC receive QPs: the handle it was created/opened through
	std::shared_ptr<XrcTgtQp> shared;     // XRC receive QPs only
	uint32_t index = 0;          // QP table slot: qpn = XSRC_QPN_BASE + index
	uint64_t rq_off = 0;         // own receive ring, 0 with an SRQ or without a receive queue
	RecvShape rq_shape;          // its shape as we made it (the header is anyone's to write)
	QpCaps caps;
	QpAttributes attr;           // unused for XRC receive QPs (see attributes())
	uint32_t events_reported = 0;   // async events delivered to this handle (DESTROY_QP reports it)
	bool last_wqe_reported = false; // IBV_EVENT_QP_LAST_WQE_REACHED sent since entering ERR
	std::vector<Gid> mcast_groups;  // UD: the multicast groups it is attached to
	std::shared_ptr<WireResponderState> wire_responder;  // RC/UC from the wire
	RecvShadow recv_shadow;      // of its own receive ring (r9)
	Qpn qpn() const { return Qpn(XSRC_QPN_BASE + index); }
	QpAttributes &attributes() { return shared ? shared->attr : attr; }
	const QpAttributes &attributes() const { return shared ? shared->attr : attr; }
};

struct Srq {
	uint64_t user_handle = 0;
	PdHandle pd_handle;
	uint32_t srq_type = 0;       // enum ibv_srq_type
	std::optional<uint32_t> xrcd_handle;  // XRC SRQs: their domain
	std::optional<uint32_t> cq_handle;    // XRC SRQs: where their receives complete
	uint32_t index = 0;          // SRQ table slot: srqn = XSRC_SRQN_BASE + index
	uint64_t ring_off = 0;
	RecvShape ring_shape;        // as we made it (max_wr may shrink below it)
	uint32_t max_wr = 0;
	uint32_t max_sge = 0;
	uint32_t use_count = 0;      // QPs receiving through it
	uint32_t events_reported = 0;
	RecvShadow recv_shadow;      // of its receive ring (r9)
	Srqn srqn() const { return Srqn(XSRC_SRQN_BASE + index); }
};

struct Ah {
	uint64_t user_handle = 0;
	PdHandle pd_handle;
	ib_uverbs_ah_attr attr{};
};

// A context's handle on an XRC domain (OPEN_XRCD). Every OPEN gives a new
// handle, even on a domain the context already holds.
struct Xrcd {
	XrcdId xrcd_id;          // device-wide, as in the arena tables
	uint32_t use_count = 0;  // XRC SRQs and XRC receive QP handles through it
};

using Object = std::variant<Pd, Mr, Cq, Qp, Srq, Ah, Xrcd, Mw>;

struct Channel {
	unique_fd wr;                // daemon's copy of the pipe's write end
	unique_fd rd;                // and of its read end: to take back unread events
};

struct Device;

struct Context {
	uint64_t id = 0;
	Device *device = nullptr;   // null once the device was removed
	pid_t owner = -1;           // thread group that created the command file
	uid_t uid = 0;
	std::unique_ptr<ProcessCaller> caller;
	bool initialised = false;   // GET_CONTEXT done
	bool eager_cq_heads = false; // counted in the arena header's eager_heads (r10)
	unique_fd async_wr;
	unique_fd async_rd;            // to take back unread events of a destroyed object
	uint64_t async_events_dropped = 0;

	// Registered channel pipes not yet handed out, FIFO: {caller rd fd, ours}.
	std::deque<std::pair<int, Channel>> channel_pool;
	std::map<int, Channel> channels;  // by the caller's fd number
	unique_fd wire_responses;  // r8: where its RC QPs' responses from the wire go
	bool wire_batched = false;  // it reads them in batches (XSRC_WIRE_RESPONSES_BATCHED)
	std::shared_ptr<AckBoard> ack_board;  // XSRC_WIRE_RESPONSES_ACK_BOARD; null: none

	uint32_t next_handle = 0;
	std::map<uint32_t, Object> objects;

	// r6: the async pipe an IMPORT_CONTEXT named, which the ioctl
	// ASYNC_EVENT_ALLOC that follows hands out (its read end, in `pid`).
	struct ImportedAsync {
		pid_t pid = -1;
		int rd_fd = -1;
	};
	std::optional<ImportedAsync> import_async;
	bool imported = false;  // an IMPORT_CONTEXT was served: creates may come by ioctl

	// Writes one async event. False when it was not delivered (no pipe yet,
	// or the pipe is full: then it is counted as dropped).
	bool post_async_event(uint64_t element, uint32_t event_type);
	size_t object_count() const { return objects.size() + channels.size(); }
	// Forgets channels whose read end the application no longer holds
	// (ibv_destroy_comp_channel closes it without telling the device).
	void prune_closed_channels();
};

// A fixed-size table of device-wide slots (QP and SRQ numbers). Slots are
// handed out round robin, so that a number is not reused right away.
class SlotTable {
public:
	explicit SlotTable(uint32_t size) : size_(size) {}
	// A free slot for `ref`, or nothing when the table is full.
	std::optional<uint32_t> allocate(ObjectRef ref);
	void release(uint32_t index);
	// Points a used slot at another object (a shared QP changing hands).
	void rebind(uint32_t index, ObjectRef ref);
	ObjectRef find(uint64_t index) const { return index < slots_.size() ? slots_[index] : ObjectRef{}; }
	uint32_t used() const { return used_; }

private:
	// Grows as slots are first handed out: a device with a few QPs (or the
	// fuzzer's device of each input) does not pay for the whole table.
	std::vector<ObjectRef> slots_;
	uint32_t size_;
	uint32_t next_ = 0;  // never past slots_.size()
	uint32_t used_ = 0;
};

// Payloads of middle packets from the wire (SEND and RDMA WRITE FIRST or
// MIDDLE without AckReq: they complete and acknowledge nothing) that land
// together, with one process_vm_writev for a run of them into one QP's
// owner, rather than one system call per packet (wire_deliver.cpp). Open
// only while the wire receiver holds the daemon's lock over a batch of
// packets: the payloads are its buffers, and no command can change an MR,
// a QP or a process in between.
struct WirePending {
	bool open = false;
	WireResponderState *st = nullptr;  // whose payloads wait (nullptr: none)
	pid_t pid = 0;
	std::vector<iovec> local, remote;
	// Responses for a requester that reads batches, sent together at the
	// end of the receive batch (wire_flush_responses): each a __u16 length
	// and its bytes. The daemon's lock, held for the whole receive batch,
	// keeps `responses_to` alive.
	Context *responses_to = nullptr;
	std::vector<uint8_t> responses;
};

struct Device {
	std::string name;
	unsigned uverbs_index = 0;
	// The driver ABI revision served (xsrcd --abi): what GET_CONTEXT reports
	// and writes, which private commands exist (kernel-abi/README.md).
	uint32_t abi_revision = XSRC_DRIVER_ABI_REVISION;
	NetdevInfo netdev;
	DeviceView view;
	std::vector<Context *> contexts;
	std::unique_ptr<Arena> arena;  // created with the device, removed with it
	WirePending wire_pending;

	uint32_t next_mr_index = 1;
	uint8_t key_salt = 0;
	std::map<uint32_t, Mr *> mrs_by_index;  // device-wide MR table (lkey/rkey >> 8)
	// Memory windows (r4), by their index in the same table, and the
	// context each lives in (its MR's: a window and its MR share a PD).
	std::map<uint32_t, std::pair<Context *, Mw *>> mws_by_index;

	uint32_t next_pd_id = 1;
	std::set<PdId> pd_ids;                  // in use
	SlotTable qp_slots{XSRC_QP_TABLE_LEN};
	SlotTable srq_slots{XSRC_SRQ_TABLE_LEN};
	std::map<uint64_t, ObjectRef> cqs_by_ring;  // every ring of every CQ -> its CQ

	// XRC domains: alive while any context holds a handle on them. A domain
	// opened through a file is named by that file's inode.
	struct XrcDomain {
		std::optional<std::pair<dev_t, ino_t>> inode;  // none: private (OPEN_XRCD with fd -1)
		std::shared_ptr<unique_fd> file;  // pins the inode: a new file cannot inherit its number
		uint32_t handles = 0;                          // Xrcd objects in all contexts
	};
	uint32_t next_xrcd_id = 1;
	std::map<XrcdId, XrcDomain> xrcds;                         // by xrcd_id
	std::map<std::pair<dev_t, ino_t>, XrcdId> xrcds_by_inode;
	// Multicast groups with members (ATTACH_MCAST), mirrored for the data
	// path in the arena's table (mcast_commands.cpp).
	struct McastGroup {
		uint32_t entry = 0;        // in the arena's xsrc_mcast_table
		std::vector<Qpn> members;  // attach order, each once
		// A UDP socket joined to the group's IP address on the netdev
		// (IP_ADD_MEMBERSHIP / IPV6_JOIN_GROUP) while the group has members:
		// the host reports the membership and its netdev takes the group's
		// frames, which the wire receiver delivers. Closing it leaves.
		unique_fd ip_member;
	};
	std::map<std::array<uint8_t, 16>, McastGroup> mcast_groups;  // by Gid::raw
	uint32_t mcast_attachments = 0;  // members over all groups
	// Live objects of each Object alternative, over all contexts (limits).
	std::array<uint32_t, std::variant_size_v<Object>> object_counts{};
	// The sockets the wire's responder sends ACKs from (made on first use).
	std::unique_ptr<xsrc_wire_sender> wire_out;
	// ACKs left on their owners' boards, oldest first, and how long one
	// waits there (xsrcd --ack-delay-us; 0: every ACK goes out at once).
	std::vector<OwedAck> owed_acks;
	uint64_t ack_delay_ns = kDefaultAckDelayNs;
	uint64_t acks_left = 0;  // ACKs left on a board (`xsrc status`: wire_acks_left)
	uint64_t acks_late = 0;  // of them, sent by us once their delay passed (wire_acks_late)
	static constexpr uint64_t kDefaultAckDelayNs = 200'000;
};

// --- a context's object table ---------------------------------------------

// The object of type T under `handle`, or null.
template <typename T>
T *lookup(Context &ctx, uint32_t handle)
{
	auto it = ctx.objects.find(handle);
	return it == ctx.objects.end() ? nullptr : std::get_if<T>(&it->second);
}

// The object a device-wide table names (ObjectRef::handle).
template <typename T>
T *lookup(Context &ctx, ObjHandle handle)
{
	return lookup<T>(ctx, handle.value());
}

// A PD through the handle another object keeps of it.
template <typename T>
	requires std::is_same_v<T, Pd>
T *lookup(Context &ctx, PdHandle handle)
{
	return lookup<T>(ctx, handle.value());
}

// The index of T among the Object alternatives.
template <typename T, typename Variant>
struct AlternativeIndex;
template <typename T, typename... Ts>
struct AlternativeIndex<T, std::variant<Ts...>> {
	static constexpr size_t value = [] {
		size_t i = 0;
		(void)((std::is_same_v<T, Ts> ? false : (++i, true)) && ...);
		return i;
	}();
};

template <typename T>
constexpr size_t object_index()
{
	return AlternativeIndex<T, Object>::value;
}

// Live objects of type T on the device (all contexts).
template <typename T>
uint32_t device_object_count(const Device &dev)
{
	return dev.object_counts[object_index<T>()];
}

// Adds an object to the context under a new handle. ENOMEM when full.
int insert_object(Context &ctx, Object obj, uint32_t &handle);
// Removes it (no other bookkeeping).
void erase_object(Context &ctx, uint32_t handle);

}  // namespace xsrc
