/* SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB) */
/*
 * The "hardware" side of xsrc: what lives in a device's shared-memory arena.
 * This plays the role of efa_io_defs.h: queue and table formats shared by
 * the daemon (which creates and destroys everything) and every provider
 * instance (which moves data and completions without entering the daemon).
 *
 * The arena is one file per device (XSRC_SYSFS_SHM_FILE in the device's sysfs
 * directory names it), mapped MAP_SHARED by the daemon and by every context.
 * Offsets, never pointers, link its parts. Fields marked "atomic" are only
 * accessed with atomic operations (acquire/release as documented).
 *
 * Version history: XSRC_ARENA_VERSION 1 (driver ABI 1) — initial layout.
 * Driver ABI revision 3 appended the multicast table (mcast_table_off, in
 * what was the header's first reserved word): still version 1, since a
 * provider that predates it never reads that word and the table is only
 * found through it. Revision 4 gave the MR entry's reserved word to memory
 * windows (mw_type, bound_qpn): an older provider never reads it and sees a
 * window as an MR with remote access only. Revision 5 gave the CQ ring's
 * reserved words to a pool of big payload slots (big_slots, big_stride,
 * big_polled) and the CQE's reserved byte to the slot a completion uses
 * (big_slot): an older provider never reads them, never marks its rings
 * big_polled, and so is never sent XSRC_CQE_DEFERRED_BIG. Revision 6 put a
 * tag table (xsrc_tm_table) after the ring of an SRQ of srq_type IBV_SRQT_TM
 * and gave the CQE flag XSRC_CQE_TM_INFO: an older provider never creates
 * such an SRQ and delivers any message into its ring's receives (plain
 * IBV_WC_RECV completions). Frozen earlier formats: history/rN/xsrc-queues.h.
 */
#ifndef XSRC_QUEUES_H
#define XSRC_QUEUES_H

#include <linux/types.h>

#define XSRC_SYSFS_SHM_FILE "xsrc_shm_path"

#define XSRC_ARENA_MAGIC 0x78737263617265ULL /* "xsrcare" */
#define XSRC_ARENA_VERSION 1
#define XSRC_ARENA_SIZE (1ULL << 30)          /* sparse: only used pages cost memory */

#define XSRC_QP_TABLE_LEN 16384   /* == max_qp */
#define XSRC_MR_TABLE_LEN 65536   /* MRs and windows; key >> 8 indexes it */
#define XSRC_SRQ_TABLE_LEN 16384  /* == max_srq */
#define XSRC_ATOMIC_LOCKS 4096    /* device-wide lock table for IBV_ATOMIC_HCA */
#define XSRC_MAX_RECV_SGE 32      /* == max_sge; bounds xsrc_recv_wqe */
#define XSRC_MAX_MSG_SIZE (1U << 31) /* == port max_msg_sz */
#define XSRC_MCAST_GROUPS 1024    /* == max_mcast_grp (revision 3) */
#define XSRC_MCAST_GROUP_QPS 64   /* == max_mcast_qp_attach (revision 3) */
/* The QPN a UD send names to reach a multicast group (IBTA 10.5.2.1). */
#define XSRC_MCAST_QPN 0xFFFFFF

/* QPN = XSRC_QPN_BASE + QP table index; QP0/QP1 do not exist on RoCE here. */
#define XSRC_QPN_BASE 0x100
/* SRQN = XSRC_SRQN_BASE + SRQ table index. */
#define XSRC_SRQN_BASE 0x40

struct xsrc_arena_header {
	__u64 magic;
	__u32 version;
	__u32 eager_heads;       /* r10 (was reserved, always 0 before); atomic: the open contexts
				  * whose provider reads a CQ ring's head as exact (see xsrc_cq_ring) */
	__u64 size;
	__u64 qp_table_off;      /* struct xsrc_qp_entry[XSRC_QP_TABLE_LEN] */
	__u64 mr_table_off;      /* struct xsrc_mr_entry[XSRC_MR_TABLE_LEN] */
	__u64 srq_table_off;     /* struct xsrc_srq_entry[XSRC_SRQ_TABLE_LEN] */
	__u64 atomic_locks_off;  /* __u32[XSRC_ATOMIC_LOCKS], atomic spin locks */
	__u64 mcast_table_off;   /* r3: struct xsrc_mcast_table; 0 (older daemons): none */
	__u64 reserved2;
};

/* QP states in xsrc_qp_entry.state: enum ibv_qp_state + 1, so 0 = free. */
#define XSRC_QP_STATE_FREE 0

/*
 * One QP as every process on the device sees it. Written by the daemon on
 * create/modify/destroy; `state` may also be set to ERR (+1) by a provider
 * that detects an error on the data path (atomic).
 *
 * XRC: an XRC send QP (IBV_QPT_XRC_SEND) has pd_id and send_cq_off and no
 * receive side (rq_off, recv_cq_off, srqn all 0). An XRC receive QP
 * (IBV_QPT_XRC_RECV) has xrcd_id and nothing else to receive into (pd_id,
 * rq_off, send_cq_off, recv_cq_off, srqn all 0): each message names an SRQ
 * whose entry must be IBV_SRQT_XRC with the same xrcd_id, and the SRQ
 * supplies the ring, the CQ, the PD and the owner. A receive QP is shared
 * by every context that opened it; owner_pid/owner_context name the oldest
 * remaining handle's context and may change while the QP lives.
 */
struct xsrc_qp_entry {
	__u32 state;          /* atomic; enum ibv_qp_state + 1, 0 = free */
	__u32 qpn;
	__u32 generation;     /* bumped on every create of this slot */
	__u32 owner_pid;      /* thread group that owns the QP's memory */
	__u64 owner_context;  /* daemon context id of the owner */
	__u8 qp_type;         /* enum ibv_qp_type */
	__u8 port_num;
	__u8 path_mtu;        /* enum ibv_mtu */
	__u8 min_rnr_timer;   /* IBTA encoding, 0..31 */
	__u8 rnr_retry;       /* 7 = infinite */
	__u8 retry_cnt;
	__u8 timeout;
	__u8 sq_sig_all;
	__u32 pd_id;          /* device-wide PD id; 0 for XRC receive QPs */
	__u32 qkey;
	__u32 access_flags;   /* IBV_ACCESS_REMOTE_{WRITE,READ,ATOMIC} */
	__u32 dest_qpn;       /* RC/UC: the connected peer */
	__u32 rq_psn;
	__u32 sq_psn;
	__u32 srqn;           /* 0 = the QP has its own receive queue */
	__u32 xrcd_id;        /* XRC receive QPs: the domain (0 = none) */
	__u64 rq_off;         /* struct xsrc_recv_ring, 0 if none */
	__u64 send_cq_off;    /* struct xsrc_cq_ring, 0 for XRC receive QPs */
	__u64 recv_cq_off;    /* struct xsrc_cq_ring, 0 if none */
	__u32 max_send_wr;
	__u32 max_recv_wr;
	__u32 max_send_sge;
	__u32 max_recv_sge;
	__u32 max_inline_data;
	__u32 max_rd_atomic;
	__u32 max_dest_rd_atomic;
	__u32 reserved;
	__u8 dgid[16];        /* RC/UC: the peer's GID (from the RTR AH) */
	__u8 reserved2[48];
};

/* One memory region, or (revision 4) one bound memory window. Valid when
 * key != 0; the daemon writes every field before publishing `key` (release)
 * and clears `key` first on deregistration, unbinding or invalidation.
 * A window's entry describes the bound range: addr/length/iova are the
 * window's (inside its MR), access its remote rights, pd_id its PD; an
 * unbound window has no entry (key 0), so every rkey check misses it. */
struct xsrc_mr_entry {
	__u32 key;            /* atomic; lkey == rkey == index << 8 | salt */
	__u32 pd_id;
	__u32 access;         /* IBV_ACCESS_* */
	__u32 owner_pid;
	__u64 addr;           /* where the bytes are in the owner */
	__u64 length;
	__u64 iova;           /* what remote keys address (== addr unless ZERO_BASED/iova) */
	/* r4 (was a reserved word, always 0 before): */
	__u32 mw_type;        /* 0: an MR; 1 or 2: a memory window (an rkey only, never an lkey) */
	__u32 bound_qpn;      /* a type 2 window: the QP it was bound on, the only one it
			       * is reached through (IBTA type 2B); else 0 */
};

/* One shared receive queue. Valid when srqn != 0. */
struct xsrc_srq_entry {
	__u32 srqn;           /* atomic */
	__u32 owner_pid;
	__u64 owner_context;
	__u64 ring_off;       /* struct xsrc_recv_ring */
	__u64 cq_off;         /* XRC SRQs: the completion queue (follows RESIZE_CQ); r7 TM SRQs: the
			       * CQ of their list operations (a receive completes on its QP's); else 0 */
	__u32 pd_id;
	__u32 xrcd_id;        /* XRC SRQs: the domain (>= 1); else 0 */
	__u32 srq_type;       /* enum ibv_srq_type */
	__u32 reserved;
};

/*
 * Completion queue ring: multi-producer (any process completing work on a
 * QP that uses this CQ), single consumer (the owner's poll_cq). A bounded
 * queue with a sequence number per slot: a producer claims slot `tail` by CAS
 * when slot.seq == tail, fills it and publishes seq = tail + 1 (release); the
 * consumer takes slot `head` when seq == head + 1 and frees it with
 * seq = head + num_entries.
 */
/*
 * Revision 10: the head may lag. A consumer whose daemon answered
 * XSRC_CQ_HEAD_LAZY publishes `head` only every so often (at least every
 * cqe / 2 completions) while the arena header's eager_heads is 0, so that the
 * line producers write stays theirs. A producer of revision 10 that finds
 * tail - head >= cqe looks at the slot of position tail - cqe: if the
 * consumer took it (its seq is position + num_entries or more), the CQ has
 * room. A provider of revision 1 to 9 trusts head; the daemon counts its
 * contexts in eager_heads, and while that is not 0 every consumer publishes
 * head at every poll. When the count leaves 0 the daemon first brings every
 * ring's head up to the slots' truth (consumers: store the freed slots, a
 * full fence, then read eager_heads; the daemon: raise eager_heads, a full
 * fence, then read the slots).
 */
/*
 * Revision 11: when to read `armed`. A producer appends, then reads `armed`
 * to learn whether its completion raises the CQ's event; the consumer arms,
 * then polls. Each side's write must be seen by the other side's read, or
 * an event is lost. Before revision 11 (and while arm_sees_tail is 0) the
 * producer publishes its completion, makes a full fence, then reads
 * `armed`; that fence waits for every store before it, the payload too. A
 * consumer that sets arm_sees_tail stores `armed` (seq_cst), then reads
 * `tail` and looks at the slots from its position to there: a slot claimed
 * but not published (seq == its position) is a producer that may have read
 * `armed` before the arm. It waits a little for such a slot; one still not
 * published then fires the arm itself (it consumes it and raises the
 * event). So a producer that finds arm_sees_tail set reads `armed` right
 * after the CAS that claims its slot (seq_cst: the CAS is its full fence)
 * and publishes with no fence behind.
 */
struct xsrc_cq_ring {
	__u32 num_entries;    /* power of two, >= cqe + 1 */
	__u32 cqe;            /* the CQ's size as the application asked for it */
	__u64 head;           /* atomic; consumer position */
	__u64 tail;           /* atomic; producer reservation */
	__u32 armed;          /* atomic; XSRC_CQ_ARMED_* */
	__u32 overflow;       /* atomic; set when a completion found the ring full */
	__u32 owner_pid;
	__u32 payload_stride; /* bytes of payload slot per entry (0: none) */
	/* r5 (were reserved words, always 0 before): */
	__u32 big_slots;      /* big payload slots (0: no pool), a multiple of 64 */
	__u32 big_stride;     /* bytes per big payload slot */
	__u32 big_polled;     /* atomic; the owner's provider sets it: it places
			       * XSRC_CQE_DEFERRED_BIG payloads. Never set: no one sends them */
	__u32 arm_sees_tail;  /* r11 (was reserved, always 0 before); atomic; the
			       * owner's provider sets it: its arming looks at the
			       * completions claimed but not yet published (below) */
	__u64 reserved3;
	/* struct xsrc_cqe entries[num_entries] follow (64-byte aligned), then
	 * num_entries payload slots of payload_stride bytes each, then (r5) the
	 * big pool: __u64 busy[big_slots / 64] (bit i: slot i is taken; atomic)
	 * padded to 64 bytes, then big_slots slots of big_stride bytes each */
};

/* Small SENDs travel in the CQ ring: the initiator copies the payload into
 * the payload slot of the completion it writes and marks it
 * XSRC_CQE_DEFERRED; the owner's poll copies it to deferred_va (a receive
 * buffer the initiator has validated) before the completion is reported.
 * No system call on either side. */
#define XSRC_CQ_PAYLOAD_STRIDE 256

/* Revision 5: medium SENDs and UD datagrams (up to 4 KiB and the 40-byte GRH)
 * travel the same way in a big slot of the receiver's CQ ring: the initiator
 * claims a free slot (sets its busy bit), copies the payload there and marks
 * the completion XSRC_CQE_DEFERRED_BIG with the slot in big_slot; the owner's
 * poll places it as for XSRC_CQE_DEFERRED and clears the busy bit. With every
 * slot taken the initiator moves the bytes itself, as for larger messages. */
/* A ring gets one slot per requested CQ entry, rounded up to 64, and at most
 * XSRC_CQ_BIG_SLOTS (big_slot is one byte). */
#define XSRC_CQ_BIG_SLOTS 256
#define XSRC_CQ_BIG_STRIDE (4096 + 64)

enum {
	XSRC_CQ_ARMED_NONE = 0,
	XSRC_CQ_ARMED_NEXT = 1,       /* any completion raises an event */
	XSRC_CQ_ARMED_SOLICITED = 2,  /* solicited or error completions only */
};

enum {
	XSRC_CQE_SOLICITED = 1 << 0,  /* in xsrc_cqe.flags: raise a solicited event */
	XSRC_CQE_DEFERRED = 1 << 1,   /* byte_len bytes in the payload slot go to deferred_va */
	XSRC_CQE_DEFERRED_BIG = 1 << 2, /* r5: byte_len bytes in big slot big_slot go to deferred_va */
	/* r7: a tag-matching completion with IBV_WC_TM_MATCH: deferred_va holds
	 * the TMH's tag and vendor_err its app_ctx (host order). Never together
	 * with XSRC_CQE_DEFERRED(_BIG); the poll reports vendor_err 0. */
	XSRC_CQE_TM_INFO = 1 << 3,
};

struct xsrc_cqe {
	__u64 seq;            /* atomic */
	__u64 wr_id;
	__u32 status;         /* enum ibv_wc_status */
	__u32 opcode;         /* enum ibv_wc_opcode */
	__u32 vendor_err;
	__u32 byte_len;
	__u32 imm_data;       /* network order, or the invalidated rkey */
	__u32 qp_num;
	__u32 src_qp;
	__u32 wc_flags;       /* enum ibv_wc_flags */
	__u16 pkey_index;
	__u16 slid;
	__u8 sl;
	__u8 dlid_path_bits;
	__u8 flags;           /* XSRC_CQE_* */
	__u8 big_slot;        /* r5, XSRC_CQE_DEFERRED_BIG: the big payload slot (was reserved) */
	__u64 deferred_va;    /* XSRC_CQE_DEFERRED(_BIG): where the payload goes */
};

struct xsrc_sge {
	__u64 addr;
	__u32 length;
	__u32 lkey;
};

/*
 * Receive queue ring (a QP's RQ or an SRQ): single producer (the owner's
 * post_recv), multiple consumers (initiators in any process, claiming slot
 * `head` by CAS). Same per-slot sequence protocol as the CQ ring.
 */
struct xsrc_recv_ring {
	__u32 num_entries;    /* power of two */
	__u32 stride;         /* bytes per slot: sizeof(xsrc_recv_wqe) + max_sge * 16, 64-aligned */
	__u32 max_wr;         /* as the application asked for it */
	__u32 max_sge;
	__u64 head;           /* atomic; consumers */
	__u64 tail;           /* atomic; producer */
	__u32 srq_limit;      /* atomic; SRQ limit, armed while non-zero */
	__u32 owner_pid;
	__u64 reserved[3];
	/* slots follow (64-byte aligned) */
};

struct xsrc_recv_wqe {
	__u64 seq;            /* atomic */
	__u64 wr_id;
	__u32 num_sge;
	__u32 reserved;
	/* struct xsrc_sge sge[num_sge] follow */
};

/*
 * Tag matching (driver ABI revision 7). An SRQ of srq_type IBV_SRQT_TM has,
 * right after its receive ring (at ring_off + sizeof(xsrc_recv_ring) +
 * num_entries * stride, 64-byte aligned), a tag table: a header and
 * num_tags entries of `stride` bytes. The SRQ's owner adds and removes
 * tagged buffers (ibv_post_srq_ops); an initiator delivering a SEND to a QP
 * on the SRQ matches the message's TMH against the table, the earliest added
 * matching entry first. Both do so under `lock` (the holder's pid, 0 = free;
 * a dead holder's lock may be taken over), which also orders the unexpected
 * count against additions: the table is the SRQ's serialisation point, as a
 * TM-SRQ is in an HCA.
 *
 * Phase synchronisation: `unexpected` counts the tagged messages that found
 * no entry and went to the ring's receives; `sw_count` is the count the
 * owner last reported (IBV_OPS_TM_SYNC). An entry added while they differ is
 * XSRC_TM_STALE and matches nothing until an operation makes them equal.
 */
#define XSRC_TM_MAX_TAGS 1024     /* == tm_caps.max_num_tags */
#define XSRC_TM_RNDV_HDR_MAX 64   /* == tm_caps.max_rndv_hdr_size: TMH + RVH + meta-data */
#define XSRC_TM_MAX_OPS 1024      /* == tm_caps.max_ops (list operations execute as posted) */

enum {
	XSRC_TM_FREE = 0,
	XSRC_TM_POSTED = 1,   /* matches */
	XSRC_TM_STALE = 2,    /* added out of phase: matches after a sync */
};

struct xsrc_tm_table {
	__u32 lock;           /* atomic; pid of the holder, 0 = free */
	__u32 num_tags;       /* entries */
	__u32 max_sge;        /* SGEs an entry holds */
	__u32 stride;         /* bytes per entry: sizeof(xsrc_tm_entry) + max_sge * 16, 64-aligned */
	__u32 unexpected;     /* under lock: tagged messages delivered unexpected */
	__u32 sw_count;       /* under lock: the count software last reported */
	__u64 next_order;     /* under lock: the order of the next entry added */
	__u64 reserved[4];
	/* entries follow (64-byte aligned) */
};

/* Under the table's lock. The handle ibv_post_srq_ops gives for an entry is
 * generation << 16 | index: a handle of an entry consumed or removed since
 * names nothing. */
struct xsrc_tm_entry {
	__u32 state;          /* XSRC_TM_* */
	__u32 num_sge;
	__u64 order;          /* earlier entries match first */
	__u64 tag;
	__u64 mask;           /* a message matches if (tmh.tag & mask) == (tag & mask) */
	__u64 wr_id;          /* recv_wr_id of the completion */
	__u32 generation;     /* bumped each time the entry is added (16 bits used) */
	__u32 reserved;
	/* struct xsrc_sge sge[num_sge] follow */
};

/*
 * Multicast groups (driver ABI revision 3): which QPs of the device a UD send
 * to a multicast GID (remote QPN XSRC_MCAST_QPN) reaches. Only the daemon
 * writes it (ATTACH_MCAST, DETACH_MCAST, a QP's destruction); a sender reads
 * it without a lock.
 *
 * Each group entry is a sequence lock: the daemon makes `seq` odd (release),
 * rewrites the entry, then makes `seq` even again (release). A reader loads
 * an even `seq` (acquire), copies the entry, and keeps the copy only if `seq`
 * is unchanged after an acquire fence; else it reads again. A free entry has
 * num_qps == 0. The daemon puts a new group in the lowest free entry.
 */
/* A GID that names a multicast group: IPv6 ff00::/8, or IPv4-mapped
 * ::ffff:224.0.0.0/4 (the GID RoCE v2 gives an IPv4 group), as the kernel's
 * rdma_is_multicast_addr() decides. `gid` is 16 bytes, as union ibv_gid. */
static inline int xsrc_is_multicast_gid(const __u8 *gid)
{
	int i;

	if (gid[0] == 0xff)
		return 1;
	for (i = 0; i < 10; ++i)
		if (gid[i])
			return 0;
	return gid[10] == 0xff && gid[11] == 0xff && (gid[12] & 0xf0) == 0xe0;
}

struct xsrc_mcast_group {
	__u32 seq;            /* atomic; odd while the entry changes */
	__u32 num_qps;        /* members: qpns[0, num_qps); 0 = a free entry */
	__u8 gid[16];         /* the group's multicast GID (as union ibv_gid) */
	__u32 qpns[XSRC_MCAST_GROUP_QPS]; /* each member once, in attach order */
	__u64 reserved[5];
};

struct xsrc_mcast_table {
	__u32 num_groups;     /* XSRC_MCAST_GROUPS */
	__u32 scan_end;       /* atomic; no entry at or past it is in use */
	__u64 reserved[7];
	/* struct xsrc_mcast_group groups[num_groups] follow */
};

#endif /* XSRC_QUEUES_H */
