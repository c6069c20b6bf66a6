// The verbs interface base: what every verbs transport of the shim shares (device, PD,
// CQs, completion channel, QP creation), with its own ops table as UCX's IB transports
// have. The RC/XRC interface (rc_iface.h) builds on it.
#pragma once

#include "internal.h"

#include <infiniband/verbs.h>
#include <uct/api/uct.h>

#include <cstddef>
#include <cstdint>

namespace xsrc::uct {

// --- UCX 1.13.1's uct_base_iface_t (src/uct/base/uct_iface.h), re-declared ---------------
// libuct's uct_iface_set_am_handler / uct_iface_set_am_tracer / uct_iface_estimate_perf
// cast any uct_iface_h to uct_base_iface_t; starting our iface with this layout lets them
// work on our objects unchanged. The offsets are pinned below.
struct UcxAmHandler {
	uct_am_callback_t cb;
	void *arg;
	uint32_t flags;
};

struct UcxIfaceInternalOps {
	ucs_status_t (*iface_estimate_perf)(uct_iface_h, struct uct_perf_attr *);  // uct_v2.h (not shipped by Debian)
	void (*iface_vfs_refresh)(uct_iface_h);
	ucs_status_t (*ep_query)(uct_ep_h, uct_ep_attr_t *);
	ucs_status_t (*ep_invalidate)(uct_ep_h, unsigned);
};

struct UcxWorkerProgress {
	uct_worker_cb_id_t id;
	uint32_t refcount;
};

struct UcxBaseIface {
	uct_iface_t super;
	const UcxIfaceInternalOps *internal_ops;
	uct_md_h md;
	uct_worker_h worker;
	UcxAmHandler am[UCT_AM_ID_MAX];
	uct_am_tracer_t am_tracer;
	void *am_tracer_arg;
	uct_error_handler_t err_handler;
	void *err_handler_arg;
	uint32_t err_handler_flags;
	UcxWorkerProgress prog;
	unsigned progress_flags;
	struct {
		unsigned num_alloc_methods;
		uct_alloc_method_t alloc_methods[UCT_ALLOC_METHOD_LAST];
		ucs_log_level_t failure_level;
		size_t max_num_eps;
	} config;
	void *stats;  // UCS_STATS_NODE_DECLARE: present only in stats builds; never touched by libuct's setters
};

// Offsets in UCX 1.13.1 on LP64 (50 ops pointers, 32 AM ids of 24 bytes).
static_assert(sizeof(uct_iface_ops_t) == 50 * sizeof(void *), "uct_iface_ops_t is not UCX 1.13's");
static_assert(UCT_AM_ID_MAX == 32);
static_assert(sizeof(UcxAmHandler) == 24);
static_assert(sizeof(uct_worker_cb_id_t) == 4);
static_assert(offsetof(UcxBaseIface, internal_ops) == 400);
static_assert(offsetof(UcxBaseIface, md) == 408);
static_assert(offsetof(UcxBaseIface, worker) == 416);
static_assert(offsetof(UcxBaseIface, am) == 424);
static_assert(offsetof(UcxBaseIface, am_tracer) == 424 + 32 * 24);
static_assert(offsetof(UcxBaseIface, am_tracer_arg) == 1200);
static_assert(offsetof(UcxBaseIface, err_handler) == 1208);
static_assert(offsetof(UcxBaseIface, err_handler_arg) == 1216);
static_assert(offsetof(UcxBaseIface, err_handler_flags) == 1224);
static_assert(offsetof(UcxBaseIface, prog) == 1228);
static_assert(offsetof(UcxBaseIface, progress_flags) == 1236);
static_assert(offsetof(UcxBaseIface, config) == 1240);

// libuct's default estimate (exported by libuct.so.0, declared in UCX's uct_v2.h / uct_iface.h).
extern "C" ucs_status_t uct_base_iface_estimate_perf(uct_iface_h, struct uct_perf_attr *);

// --- Memory domain ------------------------------------------------------------------------
struct Md {
	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	ibv_device_attr dev_attr{};
	char name[UCT_MD_NAME_MAX]{};
};
Md *to_md(uct_md_h);
// The UCX status for a verbs errno.
ucs_status_t uct_xsrc_md_errno_status(int e);

struct Mr {
	ibv_mr *mr;
};

// Packed remote key: the verbs rkey (and a marker so garbage is refused).
struct PackedRkey {
	uint32_t magic;
	uint32_t rkey;
};
inline constexpr uint32_t packed_rkey_magic = 0x78737263;  // "xsrc"
inline constexpr size_t packed_rkey_size = sizeof(PackedRkey);

// --- The verbs interface --------------------------------------------------------------------
enum class CqDir { tx, rx };

struct VerbsIface;

// The verbs interface's own operations (UCX's uct_ib_iface_ops_t has the same roles).
struct VerbsIfaceOps {
	ucs_status_t (*create_cq)(VerbsIface *, CqDir, unsigned cqe, ibv_cq **cq);
	ucs_status_t (*arm_cq)(VerbsIface *, CqDir, int solicited_only);
	void (*event_cq)(VerbsIface *, CqDir);                            // a CQ event was consumed
	void (*handle_failure)(VerbsIface *, const ibv_wc &wc);           // a failed work completion
	ucs_status_t (*set_ep_failed)(VerbsIface *, uct_ep_h, ucs_status_t);
	ucs_status_t (*create_qp)(VerbsIface *, ibv_qp_init_attr *, ibv_qp **);
	ucs_status_t (*rd_init)(VerbsIface *);     // resource domain (here: the completion channel)
	void (*rd_cleanup)(VerbsIface *);
};

struct VerbsIface;
void uct_xsrc_verbs_iface_cleanup(VerbsIface *);

// Owns its completion channel and CQs (made through vops): the destructor frees them.
struct VerbsIface {
	VerbsIface() = default;
	VerbsIface(const VerbsIface &) = delete;
	VerbsIface &operator=(const VerbsIface &) = delete;
	~VerbsIface() { uct_xsrc_verbs_iface_cleanup(this); }
	UcxBaseIface base;  // must stay first
	const VerbsIfaceOps *vops = nullptr;
	Md *md = nullptr;
	uint8_t port = 1;
	ibv_port_attr port_attr{};
	int gid_index = 0;
	ibv_gid gid{};
	ibv_comp_channel *channel = nullptr;
	ibv_cq *cq[2]{};  // [CqDir]
	unsigned cq_events_unacked[2]{};
	uct_iface_params_t params{};
	uct_worker_h worker = nullptr;
};

extern const VerbsIfaceOps uct_xsrc_verbs_iface_default_ops;

ucs_status_t uct_xsrc_verbs_iface_init(VerbsIface *, const VerbsIfaceOps *, Md *, uct_worker_h, const uct_iface_params_t *,
			      const char *dev_name, unsigned tx_cqe, unsigned rx_cqe);
// Move a fresh RC QP to INIT (receives may then be posted).
ucs_status_t uct_xsrc_verbs_qp_init(VerbsIface *, ibv_qp *);
// Move an INIT RC QP to RTS against the remote (qpn, gid).
ucs_status_t uct_xsrc_verbs_qp_connect(VerbsIface *, ibv_qp *, uint32_t remote_qpn, const ibv_gid &remote_gid, uint16_t remote_lid,
			      bool to_rts = true);
// Reads and acknowledges every pending channel event without blocking; returns how many.
unsigned uct_xsrc_verbs_iface_drain_events(VerbsIface *);
ucs_status_t uct_xsrc_verbs_wc_status(ibv_wc_status);

}  // namespace xsrc::uct
