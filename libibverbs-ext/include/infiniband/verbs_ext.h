/* SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB) */
/*
 * libibverbs-ext: the legacy OFED 1.x XRC verbs (and the names of the original
 * OpenFabrics SRC proposal) for programs written against them, implemented on
 * the upstream XRC verbs only, so that they run on any XRC-capable provider.
 *
 * Upstream libibverbs' own structs cannot grow the legacy fields
 * (ibv_qp_init_attr::xrc_domain, ibv_send_wr::xrc_remote_srq_num,
 * ibv_srq::xrc_srq_num), so this header defines the few types that carry them
 * and keeps the legacy function names and argument order.
 *
 * Legacy call                          Upstream equivalent used here
 * ------------------------------------ -----------------------------------------
 * ibv_open_xrc_domain(ctx, fd, oflag)  ibv_open_xrcd(ctx, {fd, oflags})
 * ibv_close_xrc_domain(d)              ibv_destroy_qp() on this process's
 *                                      receive-QP handles, then ibv_close_xrcd()
 * ibv_create_xrc_srq(pd, d, cq, attr)  ibv_create_srq_ex(IBV_SRQT_XRC, pd, xrcd, cq)
 * srq->xrc_srq_num                     ibv_xrc_srq_num(srq) -> ibv_get_srq_num()
 * ibv_create_qp(pd, {IBV_QPT_XRC,      ibv_create_xrc_qp(pd, attr) ->
 *   xrc_domain})                         ibv_create_qp_ex(IBV_QPT_XRC_SEND, pd)
 * wr.xrc_remote_srq_num + ibv_post_send ibv_post_xrc_send(qp, wr, bad, srqn) ->
 *                                      wr.qp_type.xrc.remote_srqn + ibv_post_send()
 * ibv_create_xrc_rcv_qp(attr, &qpn)    ibv_create_qp_ex(IBV_QPT_XRC_RECV, xrcd);
 *                                      the handle is this process's registration
 * ibv_reg_xrc_rcv_qp(d, qpn)           ibv_open_qp(xrcd, qpn, IBV_QPT_XRC_RECV)
 * ibv_unreg_xrc_rcv_qp(d, qpn)         ibv_destroy_qp() on this process's handle
 * ibv_modify_xrc_rcv_qp(d, qpn, a, m)  ibv_modify_qp() on this process's handle,
 *                                      or on a temporary ibv_open_qp() handle
 * ibv_query_xrc_rcv_qp(d, qpn, ...)    ibv_query_qp(), handle as for modify
 * ibv_open_src_domain                  = ibv_open_xrc_domain
 * ibv_close_src_domain                 = ibv_close_xrc_domain
 * ibv_create_src_srq                   = ibv_create_xrc_srq
 *
 * Receive-QP lifetime (the legacy contract): an XRC receive QP belongs to the
 * domain, not to the process that created it. Every process that created or
 * registered it holds one registration (registering twice is a no-op); the QP
 * lives while any process holds one and is destroyed with the last
 * ibv_unreg_xrc_rcv_qp(), ibv_close_xrc_domain() or process exit. Upstream
 * gives exactly this: one ibv_qp handle per registration, and an XRC TGT QP
 * dies with its last handle.
 *
 * Errors: calls returning a pointer return NULL and set errno. Calls returning
 * int return 0, or a positive errno value (also stored in errno), as the
 * legacy calls and libibverbs' int verbs do. Beyond what the provider
 * reports, the library itself returns:
 *   EINVAL  a NULL or unknown (never opened, or already closed) domain; a
 *           NULL required argument; a QP number wider than 24 bits; objects
 *           of different device contexts; fd == -1 with oflag other than
 *           O_CREAT; IBV_QPT_XRC_RECV passed to ibv_create_xrc_qp().
 *   ENOENT  ibv_reg/modify/query_xrc_rcv_qp: the domain has no XRC receive
 *           QP with that number (the provider's EINVAL/ENOENT from
 *           ibv_open_qp); ibv_unreg_xrc_rcv_qp: this process holds no
 *           registration of that QP in this domain.
 *   ENOMEM  out of memory.
 *
 * Thread safety: all calls may be made from any thread; each domain's
 * registration table has its own lock. Closing a domain while another thread
 * still passes it to a call is the caller's error, as with any verbs object.
 *
 * Link with -libverbs-ext -libverbs (pkg-config: libibverbs-ext).
 */
#ifndef INFINIBAND_VERBS_EXT_H
#define INFINIBAND_VERBS_EXT_H

#include <stdint.h>
#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The legacy XRC QP type: the send side of an XRC connection (XRC INI). */
#define IBV_QPT_XRC IBV_QPT_XRC_SEND

/* ibv_xrc_srq_num()'s answer for "not an XRC SRQ": SRQ numbers are 24-bit. */
#define IBV_XRC_INVALID_SRQ_NUM 0xffffffffu

/* An opened XRC domain. One per ibv_open_xrc_domain() call. */
struct ibv_xrc_domain {
	struct ibv_context *context;
	struct ibv_xrcd *xrcd;		/* the upstream domain, for upstream verbs */
};

/* The SRC proposal's name for the same object. */
#define ibv_src_domain ibv_xrc_domain

/*
 * struct ibv_qp_init_attr as the legacy verbs had it: the upstream fields in
 * the upstream order, then the XRC domain.
 */
struct ibv_xrc_qp_init_attr {
	void *qp_context;
	struct ibv_cq *send_cq;
	struct ibv_cq *recv_cq;
	struct ibv_srq *srq;
	struct ibv_qp_cap cap;
	enum ibv_qp_type qp_type;
	int sq_sig_all;
	struct ibv_xrc_domain *xrc_domain;
};

/*
 * Opens the XRC domain associated with the inode of fd on context's device,
 * creating it if oflag has O_CREAT; with O_CREAT | O_EXCL, fails if it exists
 * (upstream: EINVAL); without O_CREAT, fails if it does not (upstream:
 * EAGAIN). fd == -1: a private domain; oflag must then be O_CREAT.
 */
struct ibv_xrc_domain *ibv_open_xrc_domain(struct ibv_context *context, int fd, int oflag);

/*
 * Drops this process's receive-QP registrations in d, then closes d; the
 * domain itself is destroyed with its last opener. Fails (EBUSY from the
 * provider) while SRQs or QPs of this process still use the domain; d stays
 * open then, but the registrations are already dropped.
 */
int ibv_close_xrc_domain(struct ibv_xrc_domain *d);

/*
 * An XRC SRQ of xrc_domain whose completions go to xrc_cq. srq_init_attr->attr
 * is updated with the actual sizes. Destroy with ibv_destroy_srq(); post with
 * ibv_post_srq_recv().
 */
struct ibv_srq *ibv_create_xrc_srq(struct ibv_pd *pd, struct ibv_xrc_domain *xrc_domain,
				   struct ibv_cq *xrc_cq, struct ibv_srq_init_attr *srq_init_attr);

/*
 * The legacy srq->xrc_srq_num: the number a sender puts in its work request.
 * IBV_XRC_INVALID_SRQ_NUM (errno set) if srq is NULL or ibv_get_srq_num()
 * fails (what it says of a non-XRC SRQ is the provider's choice).
 */
uint32_t ibv_xrc_srq_num(struct ibv_srq *srq);

/*
 * The legacy ibv_create_qp() with a domain in the init attributes. For
 * IBV_QPT_XRC: an XRC send QP (receive queue sizes, recv_cq and srq are
 * ignored; xrc_domain may be NULL, or must be a domain of pd's device). Other
 * types except IBV_QPT_XRC_RECV are passed to ibv_create_qp(). Updates
 * qp_init_attr->cap. Destroy with ibv_destroy_qp(); modify with ibv_modify_qp().
 */
struct ibv_qp *ibv_create_xrc_qp(struct ibv_pd *pd, struct ibv_xrc_qp_init_attr *qp_init_attr);

/*
 * ibv_post_send() of the wr list to an XRC send QP, every work request going
 * to the remote XRC SRQ xrc_remote_srq_num (stored in each wr's
 * qp_type.xrc.remote_srqn, the upstream home of the legacy field).
 */
int ibv_post_xrc_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr,
		      uint32_t xrc_remote_srq_num);

/*
 * Creates an XRC receive QP in init_attr->xrc_domain (every other field is
 * ignored but qp_context) and registers this process with it. *xrc_rcv_qpn is
 * the number senders connect to.
 */
int ibv_create_xrc_rcv_qp(struct ibv_xrc_qp_init_attr *init_attr, uint32_t *xrc_rcv_qpn);

/* ibv_modify_qp() of the receive QP xrc_qp_num of xrc_domain. */
int ibv_modify_xrc_rcv_qp(struct ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num,
			  struct ibv_qp_attr *attr, int attr_mask);

/*
 * ibv_query_qp() of the receive QP xrc_qp_num of xrc_domain. init_attr may be
 * NULL; if given, its qp_type is IBV_QPT_XRC_RECV and xrc_domain is
 * xrc_domain.
 */
int ibv_query_xrc_rcv_qp(struct ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num,
			 struct ibv_qp_attr *attr, int attr_mask,
			 struct ibv_xrc_qp_init_attr *init_attr);

/*
 * Registers this process with the receive QP xrc_qp_num of xrc_domain, so that
 * it outlives the other processes' registrations. No-op if already registered.
 */
int ibv_reg_xrc_rcv_qp(struct ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num);

/*
 * Drops this process's registration; the QP is destroyed if it was the last
 * one in any process.
 */
int ibv_unreg_xrc_rcv_qp(struct ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num);

/* The SRC proposal's names: the same calls. */
struct ibv_xrc_domain *ibv_open_src_domain(struct ibv_context *context, int fd, int oflag);
int ibv_close_src_domain(struct ibv_xrc_domain *d);
struct ibv_srq *ibv_create_src_srq(struct ibv_pd *pd, struct ibv_xrc_domain *src_domain,
				   struct ibv_cq *src_cq, struct ibv_srq_init_attr *srq_init_attr);

#ifdef __cplusplus
}
#endif

#endif /* INFINIBAND_VERBS_EXT_H */
