// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The libibverbs provider interface, version IBVERBS_PRIVATE_34 (rdma-core 44).
//
// libibverbs exports these symbols to its providers but Debian installs no
// header for them, so xsrc declares the part it uses here. Nothing checks the
// layouts when the provider is loaded: a wrong member order silently calls the
// wrong function. Every struct below is therefore pinned with static_asserts,
// the numbers taken from rdma-core 44's own headers on x86_64.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/ib_user_verbs.h>

#include <sys/types.h>
#include <time.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

// --- devices and matching -----------------------------------------------

// ccan's intrusive list link, used by libibverbs' device lists.
struct list_node {
	list_node *next;
	list_node *prev;
};

enum {
	VERBS_MATCH_SENTINEL = 0,
	VERBS_MATCH_PCI = 1,
	VERBS_MATCH_MODALIAS = 2,
	VERBS_MATCH_DRIVER_ID = 3,
};

struct verbs_match_ent {
	void *driver_data;
	union {
		const char *modalias;
		uint64_t driver_id;
	} u;
	uint16_t vendor;
	uint16_t device;
	uint8_t kind;
};

// One uverbs device found in sysfs; owned by libibverbs.
struct verbs_sysfs_dev {
	list_node entry;
	void *provider_data;
	const verbs_match_ent *match;
	unsigned int flags;
	char sysfs_name[IBV_SYSFS_NAME_MAX];
	dev_t sysfs_cdev;
	char ibdev_name[IBV_SYSFS_NAME_MAX];
	char ibdev_path[IBV_SYSFS_PATH_MAX];
	char modalias[512];
	uint64_t node_guid;
	uint32_t driver_id;
	enum ibv_node_type node_type;
	int ibdev_idx;
	uint32_t num_ports;
	uint32_t abi_ver;
	struct timespec time_created;
};

struct verbs_device;

struct verbs_device_ops {
	const char *name;
	uint32_t match_min_abi_version;
	uint32_t match_max_abi_version;
	const verbs_match_ent *match_table;
	const verbs_device_ops **static_providers;
	bool (*match_device)(verbs_sysfs_dev *sysfs_dev);
	verbs_context *(*alloc_context)(ibv_device *device, int cmd_fd,
					void *private_data);
	verbs_context *(*import_context)(ibv_device *device, int cmd_fd);
	verbs_device *(*alloc_device)(verbs_sysfs_dev *sysfs_dev);
	void (*uninit_device)(verbs_device *device);
};

struct verbs_device {
	ibv_device device;
	const verbs_device_ops *ops;
	int refcount; // atomic_int in libibverbs; providers never touch it
	list_node entry;
	verbs_sysfs_dev *sysfs;
	uint64_t core_support;
};

// --- objects that embed the public verbs structs ------------------------

enum ibv_mr_type {
	IBV_MR_TYPE_MR,
	IBV_MR_TYPE_NULL_MR,
	IBV_MR_TYPE_IMPORTED_MR,
	IBV_MR_TYPE_DMABUF_MR,
};

struct verbs_mr {
	struct ibv_mr ibv_mr;
	enum ibv_mr_type mr_type;
	int access;
};

struct verbs_cq {
	union {
		ibv_cq cq;
		ibv_cq_ex cq_ex;
	};
};

struct verbs_xrcd {
	ibv_xrcd xrcd;
	uint32_t comp_mask;
	uint32_t handle;
};

struct verbs_srq {
	ibv_srq srq;
	enum ibv_srq_type srq_type;
	verbs_xrcd *xrcd;
	ibv_cq *cq;
	uint32_t srq_num;
};

enum verbs_qp_mask {
	VERBS_QP_XRCD = 1 << 0,
	VERBS_QP_EX = 1 << 1,
};

struct verbs_qp {
	union {
		ibv_qp qp;
		ibv_qp_ex qp_ex;
	};
	uint32_t comp_mask;
	verbs_xrcd *xrcd;
};

// --- the ops table: every op a provider may implement, sorted by name ---

struct verbs_context_ops {
	int (*advise_mr)(ibv_pd *pd, enum ibv_advise_mr_advice advice,
			 uint32_t flags, ibv_sge *sg_list, uint32_t num_sges);
	ibv_dm *(*alloc_dm)(ibv_context *context, ibv_alloc_dm_attr *attr);
	ibv_mw *(*alloc_mw)(ibv_pd *pd, enum ibv_mw_type type);
	ibv_mr *(*alloc_null_mr)(ibv_pd *pd);
	ibv_pd *(*alloc_parent_domain)(ibv_context *context,
				       ibv_parent_domain_init_attr *attr);
	ibv_pd *(*alloc_pd)(ibv_context *context);
	ibv_td *(*alloc_td)(ibv_context *context, ibv_td_init_attr *init_attr);
	void (*async_event)(ibv_context *context, ibv_async_event *event);
	int (*attach_counters_point_flow)(ibv_counters *counters,
					  ibv_counter_attach_attr *attr,
					  ibv_flow *flow);
	int (*attach_mcast)(ibv_qp *qp, const ibv_gid *gid, uint16_t lid);
	int (*bind_mw)(ibv_qp *qp, ibv_mw *mw, ibv_mw_bind *mw_bind);
	int (*close_xrcd)(ibv_xrcd *xrcd);
	void (*cq_event)(ibv_cq *cq);
	ibv_ah *(*create_ah)(ibv_pd *pd, ibv_ah_attr *attr);
	ibv_counters *(*create_counters)(ibv_context *context,
					 ibv_counters_init_attr *init_attr);
	ibv_cq *(*create_cq)(ibv_context *context, int cqe,
			     ibv_comp_channel *channel, int comp_vector);
	ibv_cq_ex *(*create_cq_ex)(ibv_context *context,
				   ibv_cq_init_attr_ex *init_attr);
	ibv_flow *(*create_flow)(ibv_qp *qp, ibv_flow_attr *flow_attr);
	ibv_flow_action *(*create_flow_action_esp)(
		ibv_context *context, ibv_flow_action_esp_attr *attr);
	ibv_qp *(*create_qp)(ibv_pd *pd, ibv_qp_init_attr *attr);
	ibv_qp *(*create_qp_ex)(ibv_context *context,
				ibv_qp_init_attr_ex *qp_init_attr_ex);
	ibv_rwq_ind_table *(*create_rwq_ind_table)(
		ibv_context *context, ibv_rwq_ind_table_init_attr *init_attr);
	ibv_srq *(*create_srq)(ibv_pd *pd, ibv_srq_init_attr *srq_init_attr);
	ibv_srq *(*create_srq_ex)(ibv_context *context,
				  ibv_srq_init_attr_ex *srq_init_attr_ex);
	ibv_wq *(*create_wq)(ibv_context *context,
			     ibv_wq_init_attr *wq_init_attr);
	int (*dealloc_mw)(ibv_mw *mw);
	int (*dealloc_pd)(ibv_pd *pd);
	int (*dealloc_td)(ibv_td *td);
	int (*dereg_mr)(verbs_mr *vmr);
	int (*destroy_ah)(ibv_ah *ah);
	int (*destroy_counters)(ibv_counters *counters);
	int (*destroy_cq)(ibv_cq *cq);
	int (*destroy_flow)(ibv_flow *flow);
	int (*destroy_flow_action)(ibv_flow_action *action);
	int (*destroy_qp)(ibv_qp *qp);
	int (*destroy_rwq_ind_table)(ibv_rwq_ind_table *rwq_ind_table);
	int (*destroy_srq)(ibv_srq *srq);
	int (*destroy_wq)(ibv_wq *wq);
	int (*detach_mcast)(ibv_qp *qp, const ibv_gid *gid, uint16_t lid);
	void (*free_context)(ibv_context *context);
	int (*free_dm)(ibv_dm *dm);
	int (*get_srq_num)(ibv_srq *srq, uint32_t *srq_num);
	ibv_dm *(*import_dm)(ibv_context *context, uint32_t dm_handle);
	ibv_mr *(*import_mr)(ibv_pd *pd, uint32_t mr_handle);
	ibv_pd *(*import_pd)(ibv_context *context, uint32_t pd_handle);
	int (*modify_cq)(ibv_cq *cq, ibv_modify_cq_attr *attr);
	int (*modify_flow_action_esp)(ibv_flow_action *action,
				      ibv_flow_action_esp_attr *attr);
	int (*modify_qp)(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask);
	int (*modify_qp_rate_limit)(ibv_qp *qp, ibv_qp_rate_limit_attr *attr);
	int (*modify_srq)(ibv_srq *srq, ibv_srq_attr *srq_attr,
			  int srq_attr_mask);
	int (*modify_wq)(ibv_wq *wq, ibv_wq_attr *wq_attr);
	ibv_qp *(*open_qp)(ibv_context *context, ibv_qp_open_attr *attr);
	ibv_xrcd *(*open_xrcd)(ibv_context *context,
			       ibv_xrcd_init_attr *xrcd_init_attr);
	int (*poll_cq)(ibv_cq *cq, int num_entries, ibv_wc *wc);
	int (*post_recv)(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr);
	int (*post_send)(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr);
	int (*post_srq_ops)(ibv_srq *srq, ibv_ops_wr *op, ibv_ops_wr **bad_op);
	int (*post_srq_recv)(ibv_srq *srq, ibv_recv_wr *recv_wr,
			     ibv_recv_wr **bad_recv_wr);
	int (*query_device_ex)(ibv_context *context,
			       const ibv_query_device_ex_input *input,
			       ibv_device_attr_ex *attr, size_t attr_size);
	int (*query_ece)(ibv_qp *qp, ibv_ece *ece);
	int (*query_port)(ibv_context *context, uint8_t port_num,
			  ibv_port_attr *port_attr);
	int (*query_qp)(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask,
			ibv_qp_init_attr *init_attr);
	int (*query_qp_data_in_order)(ibv_qp *qp, enum ibv_wr_opcode op,
				      uint32_t flags);
	int (*query_rt_values)(ibv_context *context, ibv_values_ex *values);
	int (*query_srq)(ibv_srq *srq, ibv_srq_attr *srq_attr);
	int (*read_counters)(ibv_counters *counters, uint64_t *counters_value,
			     uint32_t ncounters, uint32_t flags);
	ibv_mr *(*reg_dm_mr)(ibv_pd *pd, ibv_dm *dm, uint64_t dm_offset,
			     size_t length, unsigned int access);
	ibv_mr *(*reg_dmabuf_mr)(ibv_pd *pd, uint64_t offset, size_t length,
				 uint64_t iova, int fd, int access);
	ibv_mr *(*reg_mr)(ibv_pd *pd, void *addr, size_t length,
			  uint64_t hca_va, int access);
	int (*req_notify_cq)(ibv_cq *cq, int solicited_only);
	int (*rereg_mr)(verbs_mr *vmr, int flags, ibv_pd *pd, void *addr,
			size_t length, int access);
	int (*resize_cq)(ibv_cq *cq, int cqe);
	int (*set_ece)(ibv_qp *qp, ibv_ece *ece);
	void (*unimport_dm)(ibv_dm *dm);
	void (*unimport_mr)(ibv_mr *mr);
	void (*unimport_pd)(ibv_pd *pd);
};

// --- write-ABI command buffers the ibv_cmd_* helpers take ---------------

// Each is the uverbs header followed by the core request. libibverbs places a
// provider's request data right after sizeof() of these, so the sizes must be
// libibverbs' own. Several names are also libibverbs functions: write them
// as `struct ibv_reg_mr` etc.
struct ex_hdr {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_ex_cmd_hdr ex_hdr;
};

struct ibv_get_context {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_get_context core_payload;
};

struct ibv_query_port {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_query_port core_payload;
};

struct ibv_alloc_pd {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_alloc_pd core_payload;
};

struct ibv_reg_mr {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_reg_mr core_payload;
};

struct ibv_rereg_mr {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_rereg_mr core_payload;
};

struct ibv_alloc_mw {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_alloc_mw core_payload;
};

struct ibv_create_cq {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_create_cq core_payload;
};

struct ibv_resize_cq {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_resize_cq core_payload;
};

struct ibv_create_cq_ex {
	ex_hdr hdr;
	ib_uverbs_ex_create_cq core_payload;
};

struct ibv_create_qp {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_create_qp core_payload;
};

struct ibv_create_qp_ex {
	ex_hdr hdr;
	ib_uverbs_ex_create_qp core_payload;
};

struct ibv_modify_qp {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_modify_qp core_payload;
};

struct ibv_query_qp {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_query_qp core_payload;
};

struct ibv_open_qp {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_open_qp core_payload;
};

struct ibv_create_srq {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_create_srq core_payload;
};

struct ibv_create_xsrq {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_create_xsrq core_payload;
};

struct ibv_modify_srq {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_modify_srq core_payload;
};

struct ibv_query_srq {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_query_srq core_payload;
};

struct ibv_open_xrcd {
	ib_uverbs_cmd_hdr hdr;
	ib_uverbs_open_xrcd core_payload;
};

// A core command or response immediately followed by the driver's struct, as
// rdma-core's DECLARE_DRV_CMD lays them out. The core structs end in flexible
// arrays, which C++ will not place before another member, so the pair shares
// one byte buffer (which implicitly creates both objects, C++20).
template <typename Core, typename Driver>
class verbs_drv_buf {
public:
	static constexpr size_t size = sizeof(Core) + sizeof(Driver);
	static_assert(sizeof(Core) % alignof(Driver) == 0,
		      "no padding between core and driver data");

	Core *core() { return reinterpret_cast<Core *>(bytes_); }
	Driver &driver()
	{
		return *reinterpret_cast<Driver *>(bytes_ + sizeof(Core));
	}

private:
	alignas(Core) alignas(Driver) unsigned char bytes_[size] = {};
};

// --- functions libibverbs exports at IBVERBS_PRIVATE_34 -----------------

extern "C" {

void verbs_register_driver_34(const verbs_device_ops *ops);

void *_verbs_init_and_alloc_context(ibv_device *device, int cmd_fd,
				    size_t alloc_size,
				    verbs_context *context_offset,
				    uint32_t driver_id);
void verbs_uninit_context(verbs_context *context);
void verbs_set_ops(verbs_context *vctx, const verbs_context_ops *ops);

int ibv_read_ibdev_sysfs_file(char *buf, size_t size,
			      verbs_sysfs_dev *sysfs_dev, const char *fnfmt,
			      ...) __attribute__((format(printf, 4, 5)));

// The ibv_cmd_* helpers return 0 or a positive errno.
int ibv_cmd_get_context(verbs_context *context, struct ibv_get_context *cmd,
			size_t cmd_size, ib_uverbs_get_context_resp *resp,
			size_t resp_size);
int ibv_cmd_query_device_any(ibv_context *context,
			     const ibv_query_device_ex_input *input,
			     ibv_device_attr_ex *attr, size_t attr_size,
			     ib_uverbs_ex_query_device_resp *resp,
			     size_t *resp_size);
int ibv_cmd_query_port(ibv_context *context, uint8_t port_num,
		       ibv_port_attr *port_attr, struct ibv_query_port *cmd,
		       size_t cmd_size);
int ibv_cmd_alloc_pd(ibv_context *context, ibv_pd *pd,
		     struct ibv_alloc_pd *cmd, size_t cmd_size,
		     ib_uverbs_alloc_pd_resp *resp, size_t resp_size);
int ibv_cmd_dealloc_pd(ibv_pd *pd);
int ibv_cmd_reg_mr(ibv_pd *pd, void *addr, size_t length, uint64_t hca_va,
		   int access, verbs_mr *vmr, struct ibv_reg_mr *cmd,
		   size_t cmd_size, ib_uverbs_reg_mr_resp *resp,
		   size_t resp_size);
int ibv_cmd_dereg_mr(verbs_mr *vmr);
int ibv_cmd_alloc_mw(ibv_pd *pd, enum ibv_mw_type type, ibv_mw *mw, struct ibv_alloc_mw *cmd, size_t cmd_size,
		     ib_uverbs_alloc_mw_resp *resp, size_t resp_size);
int ibv_cmd_dealloc_mw(ibv_mw *mw);
int ibv_cmd_rereg_mr(verbs_mr *vmr, uint32_t flags, void *addr, size_t length, uint64_t hca_va, int access,
		     ibv_pd *pd, struct ibv_rereg_mr *cmd, size_t cmd_sz, ib_uverbs_rereg_mr_resp *resp,
		     size_t resp_sz);
int ibv_cmd_create_cq(ibv_context *context, int cqe, ibv_comp_channel *channel,
		      int comp_vector, ibv_cq *cq, struct ibv_create_cq *cmd,
		      size_t cmd_size, ib_uverbs_create_cq_resp *resp,
		      size_t resp_size);
int ibv_cmd_create_cq_ex(ibv_context *context,
			 const ibv_cq_init_attr_ex *cq_attr, verbs_cq *cq,
			 struct ibv_create_cq_ex *cmd, size_t cmd_size,
			 ib_uverbs_ex_create_cq_resp *resp, size_t resp_size,
			 uint32_t cmd_flags);
int ibv_cmd_destroy_cq(ibv_cq *cq);
int ibv_cmd_resize_cq(ibv_cq *cq, int cqe, struct ibv_resize_cq *cmd,
		      size_t cmd_size, ib_uverbs_resize_cq_resp *resp,
		      size_t resp_size);

int ibv_cmd_create_qp_ex2(ibv_context *context, verbs_qp *qp,
			  ibv_qp_init_attr_ex *qp_attr,
			  struct ibv_create_qp_ex *cmd, size_t cmd_size,
			  ib_uverbs_ex_create_qp_resp *resp, size_t resp_size);
int ibv_cmd_open_qp(ibv_context *context, verbs_qp *qp, int vqp_sz,
		    ibv_qp_open_attr *attr, struct ibv_open_qp *cmd,
		    size_t cmd_size, ib_uverbs_create_qp_resp *resp,
		    size_t resp_size);
int ibv_cmd_query_qp(ibv_qp *qp, ibv_qp_attr *qp_attr, int attr_mask,
		     ibv_qp_init_attr *qp_init_attr, struct ibv_query_qp *cmd,
		     size_t cmd_size);
int ibv_cmd_modify_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask,
		      struct ibv_modify_qp *cmd, size_t cmd_size);
int ibv_cmd_destroy_qp(ibv_qp *qp);

int ibv_cmd_create_srq(ibv_pd *pd, ibv_srq *srq, ibv_srq_init_attr *attr,
		       struct ibv_create_srq *cmd, size_t cmd_size,
		       ib_uverbs_create_srq_resp *resp, size_t resp_size);
int ibv_cmd_create_srq_ex(ibv_context *context, verbs_srq *srq,
			  ibv_srq_init_attr_ex *attr_ex,
			  struct ibv_create_xsrq *cmd, size_t cmd_size,
			  ib_uverbs_create_srq_resp *resp, size_t resp_size);
int ibv_cmd_modify_srq(ibv_srq *srq, ibv_srq_attr *srq_attr,
		       int srq_attr_mask, struct ibv_modify_srq *cmd,
		       size_t cmd_size);
int ibv_cmd_query_srq(ibv_srq *srq, ibv_srq_attr *srq_attr,
		      struct ibv_query_srq *cmd, size_t cmd_size);
int ibv_cmd_destroy_srq(ibv_srq *srq);

int ibv_cmd_create_ah(ibv_pd *pd, ibv_ah *ah, ibv_ah_attr *attr,
		      ib_uverbs_create_ah_resp *resp, size_t resp_size);
int ibv_cmd_destroy_ah(ibv_ah *ah);

int ibv_cmd_attach_mcast(ibv_qp *qp, const ibv_gid *gid, uint16_t lid);
int ibv_cmd_detach_mcast(ibv_qp *qp, const ibv_gid *gid, uint16_t lid);

// libibverbs' log (VERBS_LOG_LEVEL, VERBS_LOG_FILE): a message at `level`
// or below the one the user asked for goes to the file. Keeps errno.
void __verbs_log(verbs_context *ctx, uint32_t level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

int ibv_cmd_open_xrcd(ibv_context *context, verbs_xrcd *xrcd, int vxrcd_size,
		      ibv_xrcd_init_attr *attr, struct ibv_open_xrcd *cmd,
		      size_t cmd_size, ib_uverbs_open_xrcd_resp *resp,
		      size_t resp_size);
int ibv_cmd_close_xrcd(verbs_xrcd *xrcd);

} // extern "C"

// --- logging: libibverbs' levels and the driver.h macros over __verbs_log --

enum {
	VERBS_LOG_LEVEL_NONE,
	VERBS_LOG_ERR,
	VERBS_LOG_WARN,
	VERBS_LOG_INFO,
	VERBS_LOG_DEBUG,
};

// "<device>: <function>:<line>: <message>", as rdma-core's providers log.
// `vctx` is the verbs_context of the object the verb was called on.
#define verbs_log(vctx, level, fmt, ...)                                            \
	do {                                                                        \
		int verbs_log_errno_ = errno;                                       \
		__verbs_log(vctx, level, "%s: %s:%d: " fmt, (vctx)->context.device->name, \
			    __func__, __LINE__ __VA_OPT__(, ) __VA_ARGS__);          \
		errno = verbs_log_errno_;                                           \
	} while (0)
// Before a context exists: libibverbs 44's __verbs_log reads no more than
// the level and the format.
#define verbs_err_dev(ibdev, fmt, ...)                                              \
	do {                                                                        \
		int verbs_log_errno_ = errno;                                       \
		__verbs_log(nullptr, VERBS_LOG_ERR, "%s: %s:%d: " fmt, (ibdev)->name, \
			    __func__, __LINE__ __VA_OPT__(, ) __VA_ARGS__);          \
		errno = verbs_log_errno_;                                           \
	} while (0)
#define verbs_err(vctx, fmt, ...) verbs_log(vctx, VERBS_LOG_ERR, fmt __VA_OPT__(, ) __VA_ARGS__)
#define verbs_warn(vctx, fmt, ...) verbs_log(vctx, VERBS_LOG_WARN, fmt __VA_OPT__(, ) __VA_ARGS__)
#define verbs_info(vctx, fmt, ...) verbs_log(vctx, VERBS_LOG_INFO, fmt __VA_OPT__(, ) __VA_ARGS__)
#define verbs_debug(vctx, fmt, ...) verbs_log(vctx, VERBS_LOG_DEBUG, fmt __VA_OPT__(, ) __VA_ARGS__)

// --- layout pins (x86_64, from rdma-core 44's driver.h and kern-abi.h) ---

#if defined(__x86_64__)
#define XSRC_PIN_SIZE(type, bytes) \
	static_assert(sizeof(type) == (bytes), "layout of " #type)
#define XSRC_PIN_AT(type, member, at) \
	static_assert(offsetof(type, member) == (at), \
		      "offset of " #type "::" #member)

XSRC_PIN_SIZE(list_node, 16);

XSRC_PIN_SIZE(verbs_match_ent, 24);
XSRC_PIN_AT(verbs_match_ent, u, 8);
XSRC_PIN_AT(verbs_match_ent, vendor, 16);
XSRC_PIN_AT(verbs_match_ent, device, 18);
XSRC_PIN_AT(verbs_match_ent, kind, 20);

XSRC_PIN_SIZE(verbs_sysfs_dev, 992);
XSRC_PIN_AT(verbs_sysfs_dev, provider_data, 16);
XSRC_PIN_AT(verbs_sysfs_dev, match, 24);
XSRC_PIN_AT(verbs_sysfs_dev, flags, 32);
XSRC_PIN_AT(verbs_sysfs_dev, sysfs_name, 36);
XSRC_PIN_AT(verbs_sysfs_dev, sysfs_cdev, 104);
XSRC_PIN_AT(verbs_sysfs_dev, ibdev_name, 112);
XSRC_PIN_AT(verbs_sysfs_dev, ibdev_path, 176);
XSRC_PIN_AT(verbs_sysfs_dev, modalias, 432);
XSRC_PIN_AT(verbs_sysfs_dev, node_guid, 944);
XSRC_PIN_AT(verbs_sysfs_dev, driver_id, 952);
XSRC_PIN_AT(verbs_sysfs_dev, node_type, 956);
XSRC_PIN_AT(verbs_sysfs_dev, ibdev_idx, 960);
XSRC_PIN_AT(verbs_sysfs_dev, num_ports, 964);
XSRC_PIN_AT(verbs_sysfs_dev, abi_ver, 968);
XSRC_PIN_AT(verbs_sysfs_dev, time_created, 976);

XSRC_PIN_SIZE(verbs_device_ops, 72);
XSRC_PIN_AT(verbs_device_ops, match_min_abi_version, 8);
XSRC_PIN_AT(verbs_device_ops, match_max_abi_version, 12);
XSRC_PIN_AT(verbs_device_ops, match_table, 16);
XSRC_PIN_AT(verbs_device_ops, static_providers, 24);
XSRC_PIN_AT(verbs_device_ops, match_device, 32);
XSRC_PIN_AT(verbs_device_ops, alloc_context, 40);
XSRC_PIN_AT(verbs_device_ops, import_context, 48);
XSRC_PIN_AT(verbs_device_ops, alloc_device, 56);
XSRC_PIN_AT(verbs_device_ops, uninit_device, 64);

XSRC_PIN_SIZE(verbs_device, 712);
XSRC_PIN_AT(verbs_device, ops, 664);
XSRC_PIN_AT(verbs_device, refcount, 672);
XSRC_PIN_AT(verbs_device, entry, 680);
XSRC_PIN_AT(verbs_device, sysfs, 696);
XSRC_PIN_AT(verbs_device, core_support, 704);

XSRC_PIN_SIZE(verbs_mr, 56);
XSRC_PIN_AT(verbs_mr, mr_type, 48);
XSRC_PIN_AT(verbs_mr, access, 52);
XSRC_PIN_SIZE(verbs_cq, 288);
XSRC_PIN_AT(verbs_cq, cq_ex, 0);
XSRC_PIN_SIZE(verbs_xrcd, 16);
XSRC_PIN_AT(verbs_xrcd, comp_mask, 8);
XSRC_PIN_AT(verbs_xrcd, handle, 12);
XSRC_PIN_SIZE(verbs_srq, 160);
XSRC_PIN_AT(verbs_srq, srq_type, 128);
XSRC_PIN_AT(verbs_srq, xrcd, 136);
XSRC_PIN_AT(verbs_srq, cq, 144);
XSRC_PIN_AT(verbs_srq, srq_num, 152);
XSRC_PIN_SIZE(verbs_qp, 368);
XSRC_PIN_AT(verbs_qp, qp_ex, 0);
XSRC_PIN_AT(verbs_qp, comp_mask, 352);
XSRC_PIN_AT(verbs_qp, xrcd, 360);

XSRC_PIN_SIZE(ex_hdr, 24);
XSRC_PIN_AT(ex_hdr, ex_hdr, 8);
XSRC_PIN_SIZE(struct ibv_get_context, 16);
XSRC_PIN_AT(struct ibv_get_context, core_payload.response, 8);
XSRC_PIN_SIZE(struct ibv_query_port, 24);
XSRC_PIN_AT(struct ibv_query_port, core_payload.port_num, 16);
XSRC_PIN_SIZE(struct ibv_alloc_pd, 16);
XSRC_PIN_AT(struct ibv_alloc_pd, core_payload.response, 8);
XSRC_PIN_SIZE(struct ibv_reg_mr, 48);
XSRC_PIN_AT(struct ibv_reg_mr, core_payload.start, 16);
XSRC_PIN_AT(struct ibv_reg_mr, core_payload.access_flags, 44);
XSRC_PIN_SIZE(struct ibv_rereg_mr, 56);
XSRC_PIN_AT(struct ibv_rereg_mr, core_payload.start, 24);
XSRC_PIN_AT(struct ibv_rereg_mr, core_payload.access_flags, 52);
XSRC_PIN_SIZE(struct ibv_create_cq, 40);
XSRC_PIN_AT(struct ibv_create_cq, core_payload.user_handle, 16);
XSRC_PIN_AT(struct ibv_create_cq, core_payload.comp_channel, 32);
XSRC_PIN_SIZE(struct ibv_resize_cq, 24);
XSRC_PIN_AT(struct ibv_resize_cq, core_payload.cqe, 20);
XSRC_PIN_SIZE(struct ibv_create_cq_ex, 56);
XSRC_PIN_AT(struct ibv_create_cq_ex, core_payload.user_handle, 24);
XSRC_PIN_AT(struct ibv_create_cq_ex, core_payload.flags, 48);
XSRC_PIN_SIZE(struct ibv_create_qp, 64);
XSRC_PIN_SIZE(struct ibv_create_qp_ex, 88);
XSRC_PIN_SIZE(struct ibv_modify_qp, 120);
XSRC_PIN_SIZE(struct ibv_query_qp, 24);
XSRC_PIN_SIZE(struct ibv_open_qp, 40);
XSRC_PIN_SIZE(struct ibv_create_srq, 40);
XSRC_PIN_SIZE(struct ibv_create_xsrq, 56);
XSRC_PIN_SIZE(struct ibv_modify_srq, 24);
XSRC_PIN_SIZE(struct ibv_query_srq, 24);
XSRC_PIN_SIZE(struct ibv_open_xrcd, 24);

// 76 pointers; slot n must hold the op libibverbs calls through slot n.
XSRC_PIN_SIZE(verbs_context_ops, 76 * sizeof(void *));
#define XSRC_PIN_OP(op, slot) \
	XSRC_PIN_AT(verbs_context_ops, op, (slot) * sizeof(void *))
XSRC_PIN_OP(advise_mr, 0);              XSRC_PIN_OP(alloc_dm, 1);
XSRC_PIN_OP(alloc_mw, 2);               XSRC_PIN_OP(alloc_null_mr, 3);
XSRC_PIN_OP(alloc_parent_domain, 4);    XSRC_PIN_OP(alloc_pd, 5);
XSRC_PIN_OP(alloc_td, 6);               XSRC_PIN_OP(async_event, 7);
XSRC_PIN_OP(attach_counters_point_flow, 8);
XSRC_PIN_OP(attach_mcast, 9);           XSRC_PIN_OP(bind_mw, 10);
XSRC_PIN_OP(close_xrcd, 11);            XSRC_PIN_OP(cq_event, 12);
XSRC_PIN_OP(create_ah, 13);             XSRC_PIN_OP(create_counters, 14);
XSRC_PIN_OP(create_cq, 15);             XSRC_PIN_OP(create_cq_ex, 16);
XSRC_PIN_OP(create_flow, 17);           XSRC_PIN_OP(create_flow_action_esp, 18);
XSRC_PIN_OP(create_qp, 19);             XSRC_PIN_OP(create_qp_ex, 20);
XSRC_PIN_OP(create_rwq_ind_table, 21);  XSRC_PIN_OP(create_srq, 22);
XSRC_PIN_OP(create_srq_ex, 23);         XSRC_PIN_OP(create_wq, 24);
XSRC_PIN_OP(dealloc_mw, 25);            XSRC_PIN_OP(dealloc_pd, 26);
XSRC_PIN_OP(dealloc_td, 27);            XSRC_PIN_OP(dereg_mr, 28);
XSRC_PIN_OP(destroy_ah, 29);            XSRC_PIN_OP(destroy_counters, 30);
XSRC_PIN_OP(destroy_cq, 31);            XSRC_PIN_OP(destroy_flow, 32);
XSRC_PIN_OP(destroy_flow_action, 33);   XSRC_PIN_OP(destroy_qp, 34);
XSRC_PIN_OP(destroy_rwq_ind_table, 35); XSRC_PIN_OP(destroy_srq, 36);
XSRC_PIN_OP(destroy_wq, 37);            XSRC_PIN_OP(detach_mcast, 38);
XSRC_PIN_OP(free_context, 39);          XSRC_PIN_OP(free_dm, 40);
XSRC_PIN_OP(get_srq_num, 41);           XSRC_PIN_OP(import_dm, 42);
XSRC_PIN_OP(import_mr, 43);             XSRC_PIN_OP(import_pd, 44);
XSRC_PIN_OP(modify_cq, 45);             XSRC_PIN_OP(modify_flow_action_esp, 46);
XSRC_PIN_OP(modify_qp, 47);             XSRC_PIN_OP(modify_qp_rate_limit, 48);
XSRC_PIN_OP(modify_srq, 49);            XSRC_PIN_OP(modify_wq, 50);
XSRC_PIN_OP(open_qp, 51);               XSRC_PIN_OP(open_xrcd, 52);
XSRC_PIN_OP(poll_cq, 53);               XSRC_PIN_OP(post_recv, 54);
XSRC_PIN_OP(post_send, 55);             XSRC_PIN_OP(post_srq_ops, 56);
XSRC_PIN_OP(post_srq_recv, 57);         XSRC_PIN_OP(query_device_ex, 58);
XSRC_PIN_OP(query_ece, 59);             XSRC_PIN_OP(query_port, 60);
XSRC_PIN_OP(query_qp, 61);              XSRC_PIN_OP(query_qp_data_in_order, 62);
XSRC_PIN_OP(query_rt_values, 63);       XSRC_PIN_OP(query_srq, 64);
XSRC_PIN_OP(read_counters, 65);         XSRC_PIN_OP(reg_dm_mr, 66);
XSRC_PIN_OP(reg_dmabuf_mr, 67);         XSRC_PIN_OP(reg_mr, 68);
XSRC_PIN_OP(req_notify_cq, 69);         XSRC_PIN_OP(rereg_mr, 70);
XSRC_PIN_OP(resize_cq, 71);             XSRC_PIN_OP(set_ece, 72);
XSRC_PIN_OP(unimport_dm, 73);           XSRC_PIN_OP(unimport_mr, 74);
XSRC_PIN_OP(unimport_pd, 75);

#undef XSRC_PIN_OP
#undef XSRC_PIN_AT
#undef XSRC_PIN_SIZE
#endif // __x86_64__
