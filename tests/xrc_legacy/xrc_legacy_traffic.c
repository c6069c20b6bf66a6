// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// xrc_legacy_traffic: XRC traffic between two processes, written against the
// legacy OFED XRC API only (libibverbs-ext), in plain C.
//
//   A (receiver): opens the domain through a shared temp file (O_CREAT),
//      creates an XRC SRQ + CQ and an XRC receive QP, registers with it.
//   B (sender): opens the same domain, registers with A's receive QP,
//      creates a legacy XRC send QP; both connect over a socketpair;
//      B sends messages to A's SRQ number, A checks every one.
//   Then the legacy lifetime: after A unregisters, the receive QP lives on
//   for B (B queries it and sends more through it); after B unregisters it
//   is gone (query -> ENOENT) in both processes.
// Then process exit as an implicit unregister: X creates a receive QP, Y
// registers, Z only opens the domain; X exits without unregistering and the
// QP lives on (Z queries it); Y exits and the QP is gone (Z: ENOENT).
//
// Every wait (peer message, completion) is bounded; the parent kills both
// processes if they overrun the overall deadline.
//   xrc_legacy_traffic [-d DEVICE] [-g GID_INDEX]
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <infiniband/verbs_ext.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum {
	FIRST_BATCH = 64,	/* messages while both processes are registered */
	LATE_BATCH = 8,		/* messages after A has unregistered */
	TOTAL = FIRST_BATCH + LATE_BATCH,
	SLOT_SIZE = 512,	/* receive buffer per message */
	STEP_TIMEOUT_MS = 10000,
	OVERALL_TIMEOUT_MS = 60000,
	PORT = 1,
};

static const char *role = "main";
static const char *dev_name = "xsrc0";
static int gid_index = 1;

static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "%s: FAIL: ", role);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

static void step(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "%s: ", role);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* ---- the out-of-band channel: fixed-size tagged messages ---- */

enum tag {
	A_READY = 1,	/* qpn = receive QP, srqn, psn, gid */
	B_READY,	/* qpn = send QP, psn, gid */
	A_RTR,
	B_SENT,
	A_RECEIVED,
	A_UNREGISTERED,
	B_LATE_SENT,
	A_LATE_RECEIVED,
	B_UNREGISTERED,
	/* the exit scenario: commands from the parent to a worker, echoed back */
	OP_OPEN_CREATE = 100,	/* open the domain with O_CREAT */
	OP_OPEN,		/* open the existing domain */
	OP_CREATE_RCV_QP,	/* -> qpn */
	OP_REG,			/* qpn */
	OP_QUERY,		/* qpn */
	OP_EXIT,		/* exit without unregistering or closing anything */
};

struct oob {
	uint32_t tag;
	uint32_t qpn;
	uint32_t srqn;
	uint32_t psn;
	int32_t result;		/* a worker's answer: 0 or an errno value */
	union ibv_gid gid;
};

static void oob_send(int sock, struct oob m)
{
	if (write(sock, &m, sizeof(m)) != (ssize_t)sizeof(m))
		fail("sending message %u to the peer: %s", m.tag, strerror(errno));
}

/* The next message, which must carry tag want (0: any tag). */
static struct oob oob_recv(int sock, enum tag want)
{
	struct oob m;
	size_t got = 0;
	long long deadline = now_ms() + STEP_TIMEOUT_MS;
	while (got < sizeof(m)) {
		long long left = deadline - now_ms();
		struct pollfd p = { .fd = sock, .events = POLLIN };
		if (left <= 0 || poll(&p, 1, (int)left) == 0)
			fail("no message %d from the peer within %d ms", want, STEP_TIMEOUT_MS);
		ssize_t n = read(sock, (char *)&m + got, sizeof(m) - got);
		if (n <= 0)
			fail("peer closed the channel while waiting for message %d", want);
		got += (size_t)n;
	}
	if (want && m.tag != (uint32_t)want)
		fail("expected message %d from the peer, got %u", want, m.tag);
	return m;
}

/* ---- verbs helpers ---- */

struct device {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	enum ibv_mtu mtu;
	union ibv_gid gid;
};

static void device_open(struct device *d)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		fail("ibv_get_device_list: %s", strerror(errno));
	for (int i = 0; i < n && !d->ctx; i++)
		if (!strcmp(ibv_get_device_name(list[i]), dev_name))
			d->ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!d->ctx)
		fail("cannot open device %s", dev_name);

	struct ibv_port_attr port;
	if (ibv_query_port(d->ctx, PORT, &port))
		fail("ibv_query_port");
	d->mtu = port.active_mtu;
	if (ibv_query_gid(d->ctx, PORT, gid_index, &d->gid))
		fail("ibv_query_gid %d", gid_index);
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd)
		fail("ibv_alloc_pd: %s", strerror(errno));
	d->cq = ibv_create_cq(d->ctx, TOTAL + 1, NULL, NULL, 0);
	if (!d->cq)
		fail("ibv_create_cq: %s", strerror(errno));
}

static void device_close(struct device *d)
{
	if (ibv_destroy_cq(d->cq) || ibv_dealloc_pd(d->pd) || ibv_close_device(d->ctx))
		fail("tearing down the device objects");
}

static void modify_to_init(struct ibv_qp_attr *attr, int *mask)
{
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = IBV_QPS_INIT;
	attr->pkey_index = 0;
	attr->port_num = PORT;
	attr->qp_access_flags = 0;
	*mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
}

static void set_path(struct ibv_qp_attr *attr, const struct device *d, const union ibv_gid *dgid)
{
	attr->path_mtu = d->mtu;
	attr->ah_attr.is_global = 1;
	attr->ah_attr.grh.dgid = *dgid;
	attr->ah_attr.grh.sgid_index = (uint8_t)gid_index;
	attr->ah_attr.grh.hop_limit = 1;
	attr->ah_attr.port_num = PORT;
}

/* Message seq: its length and its bytes, so that the receiver can check each. */
static uint32_t msg_len(uint32_t seq)
{
	return 8 + (seq * 37) % (SLOT_SIZE - 8);
}

static void msg_fill(uint8_t *p, uint32_t seq)
{
	uint32_t len = msg_len(seq);
	memcpy(p, &seq, sizeof(seq));
	memcpy(p + 4, &len, sizeof(len));
	for (uint32_t i = 8; i < len; i++)
		p[i] = (uint8_t)(seq * 131 + i);
}

static bool msg_check(const uint8_t *p, uint32_t byte_len, uint32_t *seq_out)
{
	uint32_t seq, len;
	if (byte_len < 8)
		return false;
	memcpy(&seq, p, sizeof(seq));
	memcpy(&len, p + 4, sizeof(len));
	if (seq >= TOTAL || len != msg_len(seq) || byte_len != len)
		return false;
	for (uint32_t i = 8; i < len; i++)
		if (p[i] != (uint8_t)(seq * 131 + i))
			return false;
	*seq_out = seq;
	return true;
}

/* Polls n completions into wc within the step timeout. */
static void poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n, const char *what)
{
	int got = 0;
	long long deadline = now_ms() + STEP_TIMEOUT_MS;
	while (got < n) {
		int r = ibv_poll_cq(cq, n - got, wc + got);
		if (r < 0)
			fail("ibv_poll_cq (%s): %d", what, r);
		got += r;
		if (got < n && now_ms() > deadline)
			fail("%s: %d of %d completions within %d ms", what, got, n, STEP_TIMEOUT_MS);
	}
}

static void expect_errno(int ret, int want, const char *call)
{
	if (ret != want || (want && errno != want))
		fail("%s returned %d (errno %d: %s), expected %d", call, ret, errno, strerror(errno),
		     want);
}

/* ---- A: the receiver ---- */

static void receive_batch(struct device *d, uint8_t *buf, uint32_t rqpn, uint32_t first,
			  int count)
{
	struct ibv_wc wc[TOTAL];
	bool seen[TOTAL] = { false };
	poll_n(d->cq, wc, count, "receives");
	for (int i = 0; i < count; i++) {
		uint32_t seq;
		if (wc[i].status != IBV_WC_SUCCESS)
			fail("receive completion %d: %s", i, ibv_wc_status_str(wc[i].status));
		if (wc[i].opcode != IBV_WC_RECV)
			fail("receive completion %d: opcode %d", i, wc[i].opcode);
		if (wc[i].qp_num != rqpn)
			fail("receive completion %d: qp_num %u, expected the receive QP %u", i,
			     wc[i].qp_num, rqpn);
		if (wc[i].wr_id >= TOTAL)
			fail("receive completion %d: unknown wr_id %llu", i,
			     (unsigned long long)wc[i].wr_id);
		if (!msg_check(buf + wc[i].wr_id * SLOT_SIZE, wc[i].byte_len, &seq))
			fail("receive completion %d (slot %llu, %u bytes): wrong data", i,
			     (unsigned long long)wc[i].wr_id, wc[i].byte_len);
		if (seq < first || seq >= first + (uint32_t)count || seen[seq])
			fail("message %u unexpected or duplicated", seq);
		seen[seq] = true;
	}
	struct ibv_wc extra;
	if (ibv_poll_cq(d->cq, 1, &extra) != 0)
		fail("a completion beyond the %d expected", count);
	step("received messages %u..%u, all correct", first, first + count - 1);
}

static int run_a(int sock, const char *path)
{
	role = "A";
	struct device d = { 0 };
	device_open(&d);

	int fd = open(path, O_RDONLY);
	if (fd < 0)
		fail("open %s: %s", path, strerror(errno));
	struct ibv_xrc_domain *dom = ibv_open_xrc_domain(d.ctx, fd, O_CREAT);
	if (!dom)
		fail("ibv_open_xrc_domain(O_CREAT): %s", strerror(errno));

	struct ibv_srq_init_attr srq_attr = { .attr = { .max_wr = TOTAL, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_xrc_srq(d.pd, dom, d.cq, &srq_attr);
	if (!srq)
		fail("ibv_create_xrc_srq: %s", strerror(errno));
	uint32_t srqn = ibv_xrc_srq_num(srq);
	if (srqn == IBV_XRC_INVALID_SRQ_NUM)
		fail("ibv_xrc_srq_num: %s", strerror(errno));

	uint8_t *buf = calloc(TOTAL, SLOT_SIZE);
	struct ibv_mr *mr = buf ? ibv_reg_mr(d.pd, buf, TOTAL * SLOT_SIZE, IBV_ACCESS_LOCAL_WRITE)
				: NULL;
	if (!mr)
		fail("ibv_reg_mr: %s", strerror(errno));
	for (uint32_t i = 0; i < TOTAL; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)(buf + i * SLOT_SIZE),
				       .length = SLOT_SIZE, .lkey = mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
		if (ibv_post_srq_recv(srq, &wr, &bad))
			fail("ibv_post_srq_recv %u", i);
	}

	struct ibv_xrc_qp_init_attr init = { .xrc_domain = dom };
	uint32_t rqpn = 0;
	if (ibv_create_xrc_rcv_qp(&init, &rqpn))
		fail("ibv_create_xrc_rcv_qp: %s", strerror(errno));
	/* The creator is registered already; a second registration is a no-op. */
	expect_errno(ibv_reg_xrc_rcv_qp(dom, rqpn), 0, "ibv_reg_xrc_rcv_qp (creator)");

	struct ibv_qp_attr attr;
	int mask;
	modify_to_init(&attr, &mask);
	if (ibv_modify_xrc_rcv_qp(dom, rqpn, &attr, mask))
		fail("ibv_modify_xrc_rcv_qp INIT: %s", strerror(errno));
	uint32_t psn = (uint32_t)lrand48() & 0xffffff;
	step("receive QP %u, XRC SRQ %u", rqpn, srqn);
	oob_send(sock, (struct oob){ .tag = A_READY, .qpn = rqpn, .srqn = srqn, .psn = psn,
				     .gid = d.gid });

	struct oob b = oob_recv(sock, B_READY);
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTR;
	attr.dest_qp_num = b.qpn;
	attr.rq_psn = b.psn;
	attr.max_dest_rd_atomic = 1;
	attr.min_rnr_timer = 12;
	set_path(&attr, &d, &b.gid);
	if (ibv_modify_xrc_rcv_qp(dom, rqpn, &attr,
				  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		fail("ibv_modify_xrc_rcv_qp RTR: %s", strerror(errno));
	step("receive QP RTR, connected to send QP %u", b.qpn);
	oob_send(sock, (struct oob){ .tag = A_RTR });

	oob_recv(sock, B_SENT);
	receive_batch(&d, buf, rqpn, 0, FIRST_BATCH);
	oob_send(sock, (struct oob){ .tag = A_RECEIVED });

	/* A drops its registration: B's keeps the QP alive. */
	expect_errno(ibv_unreg_xrc_rcv_qp(dom, rqpn), 0, "ibv_unreg_xrc_rcv_qp (A)");
	expect_errno(ibv_unreg_xrc_rcv_qp(dom, rqpn), ENOENT, "second ibv_unreg_xrc_rcv_qp (A)");
	struct ibv_xrc_qp_init_attr qinit;
	memset(&attr, 0, sizeof(attr));
	expect_errno(ibv_query_xrc_rcv_qp(dom, rqpn, &attr, IBV_QP_STATE, &qinit), 0,
		     "ibv_query_xrc_rcv_qp by A after A's unreg");
	if (attr.qp_state != IBV_QPS_RTR)
		fail("receive QP in state %d after A's unreg, expected RTR", attr.qp_state);
	step("unregistered; the receive QP lives on (state RTR)");
	oob_send(sock, (struct oob){ .tag = A_UNREGISTERED });

	oob_recv(sock, B_LATE_SENT);
	receive_batch(&d, buf, rqpn, FIRST_BATCH, LATE_BATCH);
	oob_send(sock, (struct oob){ .tag = A_LATE_RECEIVED });

	/* B's unreg was the last registration: the QP is gone. */
	oob_recv(sock, B_UNREGISTERED);
	expect_errno(ibv_query_xrc_rcv_qp(dom, rqpn, &attr, IBV_QP_STATE, NULL), ENOENT,
		     "ibv_query_xrc_rcv_qp by A after the last unreg");
	expect_errno(ibv_reg_xrc_rcv_qp(dom, rqpn), ENOENT,
		     "ibv_reg_xrc_rcv_qp by A after the last unreg");
	step("after the last unreg the receive QP is gone (ENOENT)");

	if (ibv_destroy_srq(srq) || ibv_dereg_mr(mr))
		fail("destroying the SRQ / MR");
	expect_errno(ibv_close_xrc_domain(dom), 0, "ibv_close_xrc_domain (A)");
	close(fd);
	free(buf);
	device_close(&d);
	step("done");
	return 0;
}

/* ---- B: the sender ---- */

static void send_batch(struct device *d, struct ibv_qp *qp, uint8_t *buf, struct ibv_mr *mr,
		       uint32_t srqn, uint32_t first, int count)
{
	for (uint32_t seq = first; seq < first + (uint32_t)count; seq++) {
		uint8_t *slot = buf + seq * SLOT_SIZE;
		msg_fill(slot, seq);
		struct ibv_sge sge = { .addr = (uintptr_t)slot, .length = msg_len(seq),
				       .lkey = mr->lkey };
		struct ibv_send_wr wr = { .wr_id = seq, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
		struct ibv_send_wr *bad = NULL;
		int err = ibv_post_xrc_send(qp, &wr, &bad, srqn);
		if (err)
			fail("ibv_post_xrc_send message %u: %s", seq, strerror(err));
	}
	struct ibv_wc wc[TOTAL];
	poll_n(d->cq, wc, count, "sends");
	for (int i = 0; i < count; i++)
		if (wc[i].status != IBV_WC_SUCCESS || wc[i].opcode != IBV_WC_SEND)
			fail("send completion %d (wr_id %llu): %s, opcode %d", i,
			     (unsigned long long)wc[i].wr_id, ibv_wc_status_str(wc[i].status),
			     wc[i].opcode);
	step("sent messages %u..%u to XRC SRQ %u", first, first + count - 1, srqn);
}

static int run_b(int sock, const char *path)
{
	role = "B";
	struct device d = { 0 };
	device_open(&d);

	/* A creates the domain; B opens the existing one (no O_CREAT). */
	struct oob a = oob_recv(sock, A_READY);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		fail("open %s: %s", path, strerror(errno));
	struct ibv_xrc_domain *dom = ibv_open_xrc_domain(d.ctx, fd, 0);
	if (!dom)
		fail("ibv_open_xrc_domain(existing): %s", strerror(errno));
	expect_errno(ibv_reg_xrc_rcv_qp(dom, a.qpn), 0, "ibv_reg_xrc_rcv_qp (B)");
	step("registered with receive QP %u", a.qpn);

	struct ibv_xrc_qp_init_attr init = {
		.send_cq = d.cq, .recv_cq = d.cq, .qp_type = IBV_QPT_XRC,
		.cap = { .max_send_wr = TOTAL, .max_send_sge = 1 },
		.xrc_domain = dom,
	};
	struct ibv_qp *qp = ibv_create_xrc_qp(d.pd, &init);
	if (!qp)
		fail("ibv_create_xrc_qp(IBV_QPT_XRC): %s", strerror(errno));

	uint8_t *buf = calloc(TOTAL, SLOT_SIZE);
	struct ibv_mr *mr = buf ? ibv_reg_mr(d.pd, buf, TOTAL * SLOT_SIZE, 0) : NULL;
	if (!mr)
		fail("ibv_reg_mr: %s", strerror(errno));

	struct ibv_qp_attr attr;
	int mask;
	modify_to_init(&attr, &mask);
	if (ibv_modify_qp(qp, &attr, mask))
		fail("ibv_modify_qp INIT (send QP)");
	uint32_t psn = (uint32_t)lrand48() & 0xffffff;
	oob_send(sock, (struct oob){ .tag = B_READY, .qpn = qp->qp_num, .psn = psn, .gid = d.gid });

	oob_recv(sock, A_RTR);
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTR;
	attr.dest_qp_num = a.qpn;
	attr.rq_psn = a.psn;
	set_path(&attr, &d, &a.gid);
	if (ibv_modify_qp(qp, &attr,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN))
		fail("ibv_modify_qp RTR (send QP)");
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTS;
	attr.sq_psn = psn;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &attr,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		fail("ibv_modify_qp RTS (send QP)");
	step("send QP %u RTS, connected to receive QP %u", qp->qp_num, a.qpn);

	send_batch(&d, qp, buf, mr, a.srqn, 0, FIRST_BATCH);
	oob_send(sock, (struct oob){ .tag = B_SENT });
	oob_recv(sock, A_RECEIVED);

	/* A has unregistered: B's registration keeps the receive QP. */
	oob_recv(sock, A_UNREGISTERED);
	struct ibv_xrc_qp_init_attr qinit;
	memset(&attr, 0, sizeof(attr));
	memset(&qinit, 0, sizeof(qinit));
	expect_errno(ibv_query_xrc_rcv_qp(dom, a.qpn, &attr, IBV_QP_STATE, &qinit), 0,
		     "ibv_query_xrc_rcv_qp by B after A's unreg");
	if (attr.qp_state != IBV_QPS_RTR)
		fail("receive QP in state %d after A's unreg, expected RTR", attr.qp_state);
	if (qinit.qp_type != IBV_QPT_XRC_RECV || qinit.xrc_domain != dom)
		fail("query init_attr: qp_type %d, xrc_domain %p", qinit.qp_type,
		     (void *)qinit.xrc_domain);
	step("after A's unreg the receive QP lives (state RTR)");
	send_batch(&d, qp, buf, mr, a.srqn, FIRST_BATCH, LATE_BATCH);
	oob_send(sock, (struct oob){ .tag = B_LATE_SENT });
	oob_recv(sock, A_LATE_RECEIVED);

	/* The last registration: the receive QP is destroyed. */
	expect_errno(ibv_unreg_xrc_rcv_qp(dom, a.qpn), 0, "ibv_unreg_xrc_rcv_qp (B)");
	expect_errno(ibv_query_xrc_rcv_qp(dom, a.qpn, &attr, IBV_QP_STATE, NULL), ENOENT,
		     "ibv_query_xrc_rcv_qp by B after the last unreg");
	expect_errno(ibv_unreg_xrc_rcv_qp(dom, a.qpn), ENOENT, "second ibv_unreg_xrc_rcv_qp (B)");
	step("after the last unreg the receive QP is gone (ENOENT)");
	oob_send(sock, (struct oob){ .tag = B_UNREGISTERED });

	if (ibv_destroy_qp(qp) || ibv_dereg_mr(mr))
		fail("destroying the send QP / MR");
	expect_errno(ibv_close_xrc_domain(dom), 0, "ibv_close_xrc_domain (B)");
	close(fd);
	free(buf);
	device_close(&d);
	step("done");
	return 0;
}

/* ---- the exit scenario: workers driven by the parent ---- */

static int run_worker(int sock, const char *path, const char *name)
{
	role = name;
	struct device d = { 0 };
	device_open(&d);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		fail("open %s: %s", path, strerror(errno));
	struct ibv_xrc_domain *dom = NULL;
	for (;;) {
		struct oob cmd = oob_recv(sock, 0);
		struct oob reply = { .tag = cmd.tag };
		struct ibv_qp_attr attr;
		struct ibv_xrc_qp_init_attr init = { 0 };
		switch (cmd.tag) {
		case OP_OPEN_CREATE:
		case OP_OPEN:
			dom = ibv_open_xrc_domain(d.ctx, fd, cmd.tag == OP_OPEN_CREATE ? O_CREAT : 0);
			reply.result = dom ? 0 : errno;
			break;
		case OP_CREATE_RCV_QP:
			init.xrc_domain = dom;
			reply.result = ibv_create_xrc_rcv_qp(&init, &reply.qpn);
			break;
		case OP_REG:
			reply.result = ibv_reg_xrc_rcv_qp(dom, cmd.qpn);
			break;
		case OP_QUERY:
			reply.result = ibv_query_xrc_rcv_qp(dom, cmd.qpn, &attr, IBV_QP_STATE, NULL);
			break;
		case OP_EXIT:
			step("exiting without unregistering or closing anything");
			exit(0);
		default:
			fail("unknown command %u", cmd.tag);
		}
		oob_send(sock, reply);
	}
}

/* ---- the parent: children, one deadline ---- */

static pid_t main_pid;
static pid_t children[3];
static int nchildren;
static char domain_files[2][32];

/* The parent's exit (also by fail()) takes the children and files with it. */
static void parent_cleanup(void)
{
	if (getpid() != main_pid)
		return;
	for (int i = 0; i < nchildren; i++)
		if (children[i] > 0)
			kill(children[i], SIGKILL);
	for (int i = 0; i < 2; i++)
		if (domain_files[i][0])
			unlink(domain_files[i]);
}

/* A new empty file whose inode names an XRC domain. */
static const char *make_domain_file(int i)
{
	strcpy(domain_files[i], "/tmp/xrc_legacy_domain.XXXXXX");
	int fd = mkstemp(domain_files[i]);
	if (fd < 0)
		fail("mkstemp: %s", strerror(errno));
	close(fd);
	return domain_files[i];
}

static pid_t spawn(int (*body)(int, const char *, const char *), int sock, int other,
		   const char *path, const char *name)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		fail("fork: %s", strerror(errno));
	if (pid == 0) {
		close(other);
		srand48(getpid() ^ time(NULL));
		exit(body(sock, path, name));
	}
	children[nchildren++] = pid;
	return pid;
}

/* Waits for pid to exit within the step timeout; true if it exited 0. */
static bool wait_child(pid_t pid, const char *name)
{
	long long deadline = now_ms() + STEP_TIMEOUT_MS;
	int st;
	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			break;
		if (r < 0 || now_ms() > deadline) {
			fprintf(stderr, "main: %s did not exit within %d ms\n", name, STEP_TIMEOUT_MS);
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return false;
		}
		usleep(10000);
	}
	for (int i = 0; i < nchildren; i++)
		if (children[i] == pid)
			children[i] = 0;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return true;
	fprintf(stderr, "main: %s %s %d\n", name,
		WIFEXITED(st) ? "exited with" : "killed by signal",
		WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	return false;
}

static int traffic_a(int sock, const char *path, const char *name)
{
	(void)name;
	return run_a(sock, path);
}

static int traffic_b(int sock, const char *path, const char *name)
{
	(void)name;
	return run_b(sock, path);
}

/* A and B, connected to each other; one failing (or the deadline) ends both. */
static bool traffic_scenario(const char *path)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		fail("socketpair: %s", strerror(errno));
	pid_t pids[2];
	pids[0] = spawn(traffic_a, sv[0], sv[1], path, "A");
	pids[1] = spawn(traffic_b, sv[1], sv[0], path, "B");
	close(sv[0]);
	close(sv[1]);

	const char *names[2] = { "A", "B" };
	int status[2] = { -1, -1 };
	int left = 2;
	bool ok = true;
	long long deadline = now_ms() + OVERALL_TIMEOUT_MS;
	while (left) {
		int st;
		pid_t pid = waitpid(-1, &st, WNOHANG);
		if (pid == pids[0] || pid == pids[1]) {
			int i = pid == pids[0] ? 0 : 1;
			status[i] = st;
			left--;
			if (!WIFEXITED(st) || WEXITSTATUS(st)) {
				ok = false;
				if (left)
					kill(pids[1 - i], SIGKILL);
			}
			continue;
		}
		if (now_ms() > deadline) {
			fprintf(stderr, "main: FAIL: no result within %d ms; killing both\n",
				OVERALL_TIMEOUT_MS);
			ok = false;
			for (int i = 0; i < 2; i++)
				if (status[i] == -1)
					kill(pids[i], SIGKILL);
			deadline = now_ms() + 5000;
		}
		usleep(20000);
	}
	for (int i = 0; i < 2; i++)
		if (!WIFEXITED(status[i]) || WEXITSTATUS(status[i]))
			fprintf(stderr, "main: process %s %s %d\n", names[i],
				WIFEXITED(status[i]) ? "exited with" : "killed by signal",
				WIFEXITED(status[i]) ? WEXITSTATUS(status[i]) : WTERMSIG(status[i]));
	nchildren = 0;
	return ok;
}

struct worker {
	const char *name;
	pid_t pid;
	int sock;
};

static struct worker start_worker(const char *path, const char *name)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		fail("socketpair: %s", strerror(errno));
	struct worker w = { .name = name };
	w.pid = spawn(run_worker, sv[1], sv[0], path, name);
	close(sv[1]);
	w.sock = sv[0];
	return w;
}

/* Sends a command to a worker; returns its result (and *qpn_out). */
static int ask(struct worker *w, enum tag op, uint32_t qpn, uint32_t *qpn_out)
{
	oob_send(w->sock, (struct oob){ .tag = op, .qpn = qpn });
	struct oob reply = oob_recv(w->sock, op);
	if (qpn_out)
		*qpn_out = reply.qpn;
	return reply.result;
}

static void expect_result(struct worker *w, enum tag op, uint32_t qpn, int want,
			  const char *what)
{
	int got = ask(w, op, qpn, NULL);
	if (got != want)
		fail("%s: %s answered %d (%s), expected %d", what, w->name, got, strerror(got),
		     want);
}

static void stop_worker(struct worker *w)
{
	oob_send(w->sock, (struct oob){ .tag = OP_EXIT });
	if (!wait_child(w->pid, w->name))
		fail("%s did not exit cleanly", w->name);
	close(w->sock);
}

static bool exit_scenario(const char *path)
{
	struct worker x = start_worker(path, "X");
	struct worker y = start_worker(path, "Y");
	struct worker z = start_worker(path, "Z");
	uint32_t qpn = 0;

	expect_result(&x, OP_OPEN_CREATE, 0, 0, "open the domain (O_CREAT)");
	if (ask(&x, OP_CREATE_RCV_QP, 0, &qpn))
		fail("X: ibv_create_xrc_rcv_qp failed");
	expect_result(&y, OP_OPEN, 0, 0, "open the domain");
	expect_result(&y, OP_REG, qpn, 0, "ibv_reg_xrc_rcv_qp");
	expect_result(&z, OP_OPEN, 0, 0, "open the domain");
	step("X created receive QP %u, Y registered, Z opened the domain", qpn);

	stop_worker(&x);
	expect_result(&z, OP_QUERY, qpn, 0, "query after the creator's exit");
	step("the creator exited; Y's registration keeps the receive QP");

	stop_worker(&y);
	/* The exit's release reaches the provider/daemon asynchronously. */
	long long deadline = now_ms() + STEP_TIMEOUT_MS;
	int got;
	while ((got = ask(&z, OP_QUERY, qpn, NULL)) == 0 && now_ms() < deadline)
		usleep(10000);
	if (got != ENOENT)
		fail("query after the last registered process exited: %d (%s), expected ENOENT",
		     got, strerror(got));
	step("the last registered process exited; the receive QP is gone (ENOENT)");
	stop_worker(&z);
	nchildren = 0;
	return true;
}

int main(int argc, char **argv)
{
	int opt;
	while ((opt = getopt(argc, argv, "d:g:")) != -1) {
		if (opt == 'd')
			dev_name = optarg;
		else if (opt == 'g')
			gid_index = atoi(optarg);
		else {
			fprintf(stderr, "usage: %s [-d DEVICE] [-g GID_INDEX]\n", argv[0]);
			return 2;
		}
	}
	main_pid = getpid();
	atexit(parent_cleanup);

	bool ok = traffic_scenario(make_domain_file(0));
	if (ok)
		ok = exit_scenario(make_domain_file(1));
	printf("xrc_legacy_traffic: %s\n", ok ? "PASS" : "FAIL");
	return ok ? 0 : 1;
}
