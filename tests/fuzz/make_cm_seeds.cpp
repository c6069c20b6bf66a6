// Writes the cm fuzzer's seeds (tests/fuzz/corpus-cm/cm-*): command sequences
// as librdmacm issues them, over the fuzzer's two channels (0: the passive
// side, 1: the active side) on its fake device (10.0.0.1, fd00::1). Handles
// are what a fresh CmService gives: 1, 2, 3... in order of creation.
//   build-fuzz/bin/xsrcd_fuzz_cm_seeds tests/fuzz/corpus-cm
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <rdma/rdma_user_cm.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "cm_input.h"

using namespace xsrc::cmfuzz;

namespace {

constexpr uint8_t kServer = 0, kClient = kOther;
constexpr uint8_t kEv = kNonblock | kPatchResponse | (15 << 4);  // GET_EVENT into slot 15

uint8_t slot(unsigned n) { return static_cast<uint8_t>(kPatchResponse | (n << 4)); }

sockaddr_storage v4(const char *a, uint16_t port)
{
	sockaddr_storage s{};
	auto &in = reinterpret_cast<sockaddr_in &>(s);
	in.sin_family = AF_INET;
	in.sin_port = htons(port);
	inet_pton(AF_INET, a, &in.sin_addr);
	return s;
}

sockaddr_storage v6(const char *a, uint16_t port)
{
	sockaddr_storage s{};
	auto &in = reinterpret_cast<sockaddr_in6 &>(s);
	in.sin6_family = AF_INET6;
	in.sin6_port = htons(port);
	inet_pton(AF_INET6, a, &in.sin6_addr);
	return s;
}

struct Seq : Writer {
	Seq &create(uint8_t ch, uint16_t ps)
	{
		rdma_ucm_create_id c{};
		c.uid = 0x1000 + ps;
		c.ps = ps;
		execute(ch | slot(0), RDMA_USER_CM_CMD_CREATE_ID, c, sizeof(rdma_ucm_create_id_resp));
		return *this;
	}
	Seq &destroy(uint8_t ch, uint32_t id)
	{
		rdma_ucm_destroy_id c{0, id, 0};
		execute(ch | slot(1), RDMA_USER_CM_CMD_DESTROY_ID, c, sizeof(rdma_ucm_destroy_id_resp));
		return *this;
	}
	Seq &bind(uint8_t ch, uint32_t id, const sockaddr_storage &a)
	{
		rdma_ucm_bind c{};
		c.id = id;
		c.addr_size = a.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
		std::memcpy(&c.addr, &a, sizeof(a));
		execute(ch, RDMA_USER_CM_CMD_BIND, c, 0);
		return *this;
	}
	Seq &listen(uint8_t ch, uint32_t id)
	{
		rdma_ucm_listen c{id, 4};
		execute(ch, RDMA_USER_CM_CMD_LISTEN, c, 0);
		return *this;
	}
	Seq &resolve(uint8_t ch, uint32_t id, const sockaddr_storage &dst)
	{
		rdma_ucm_resolve_addr c{};
		c.id = id;
		c.timeout_ms = 2000;
		c.dst_size = dst.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
		std::memcpy(&c.dst_addr, &dst, sizeof(dst));
		execute(ch, RDMA_USER_CM_CMD_RESOLVE_ADDR, c, 0);
		rdma_ucm_get_event e{};
		execute(ch | kEv, RDMA_USER_CM_CMD_GET_EVENT, e, sizeof(rdma_ucm_event_resp));
		rdma_ucm_resolve_route r{id, 2000};
		execute(ch, RDMA_USER_CM_CMD_RESOLVE_ROUTE, r, 0);
		execute(ch | kEv, RDMA_USER_CM_CMD_GET_EVENT, e, sizeof(rdma_ucm_event_resp));
		return *this;
	}
	Seq &event(uint8_t ch)
	{
		rdma_ucm_get_event e{};
		execute(ch | kEv, RDMA_USER_CM_CMD_GET_EVENT, e, sizeof(rdma_ucm_event_resp));
		return *this;
	}
	Seq &held_event(uint8_t ch)
	{
		rdma_ucm_get_event e{};
		execute(ch | kHoldable | slot(14), RDMA_USER_CM_CMD_GET_EVENT, e, sizeof(rdma_ucm_event_resp));
		return *this;
	}
	static rdma_ucm_conn_param conn(uint32_t qpn, const char *priv)
	{
		rdma_ucm_conn_param p{};
		p.qp_num = qpn;
		p.private_data_len = static_cast<uint8_t>(std::strlen(priv));
		std::memcpy(p.private_data, priv, p.private_data_len);
		p.responder_resources = p.initiator_depth = 1;
		p.retry_count = p.rnr_retry_count = 7;
		p.valid = 1;
		return p;
	}
	Seq &connect(uint8_t ch, uint32_t id, uint32_t qpn)
	{
		rdma_ucm_connect c{};
		c.id = id;
		c.conn_param = conn(qpn, "request");
		execute(ch, RDMA_USER_CM_CMD_CONNECT, c, 0);
		return *this;
	}
	Seq &accept(uint8_t ch, uint32_t id, uint32_t qpn)
	{
		rdma_ucm_accept c{};
		c.id = id;
		c.uid = 0x2000;
		if (qpn)
			c.conn_param = conn(qpn, "reply");
		execute(ch, RDMA_USER_CM_CMD_ACCEPT, c, 0);
		return *this;
	}
	Seq &qp_attr(uint8_t ch, uint32_t id, uint32_t state)
	{
		rdma_ucm_init_qp_attr c{0, id, state};
		execute(ch | slot(2), RDMA_USER_CM_CMD_INIT_QP_ATTR, c, sizeof(ib_uverbs_qp_attr));
		return *this;
	}
	Seq &disconnect(uint8_t ch, uint32_t id)
	{
		rdma_ucm_disconnect c{id};
		execute(ch, RDMA_USER_CM_CMD_DISCONNECT, c, 0);
		return *this;
	}
	Seq &query(uint8_t ch, uint32_t id, uint32_t option)
	{
		rdma_ucm_query c{0, id, option};
		execute(ch | slot(3), RDMA_USER_CM_CMD_QUERY, c, 512);
		execute(ch | slot(4), RDMA_USER_CM_CMD_QUERY_ROUTE, c, 512);
		return *this;
	}
	Seq &option(uint8_t ch, uint32_t id, uint32_t level, uint32_t name, uint32_t len)
	{
		rdma_ucm_set_option c{kOptionArea, id, level, name, len};
		execute(ch, RDMA_USER_CM_CMD_SET_OPTION, c, 0);
		return *this;
	}
};

// Listener 1 on channel 0, client 2 on channel 1 routed to it.
Seq routed(uint16_t ps, uint16_t port)
{
	Seq s;
	s.create(kServer, ps).bind(kServer, 1, v4("10.0.0.1", port)).listen(kServer, 1);
	s.create(kClient, ps).resolve(kClient, 2, v4("10.0.0.1", port));
	return s;
}

void write(const std::string &dir, const std::string &name, const Writer &w)
{
	std::ofstream out(dir + "/cm-" + name, std::ios::binary);
	out.write(reinterpret_cast<const char *>(w.bytes().data()), static_cast<std::streamsize>(w.bytes().size()));
}

}  // namespace

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return 2;
	}
	const std::string dir = argv[1];

	// The whole RC life: REQ, REP, RTU, DREQ, DREP; request id 3.
	Seq rc = routed(RDMA_PS_TCP, 5000);
	rc.qp_attr(kClient, 2, IBV_QPS_INIT).connect(kClient, 2, 0x100).event(kServer);
	rc.qp_attr(kServer, 3, IBV_QPS_RTR).accept(kServer, 3, 0x200).event(kClient);
	rc.qp_attr(kClient, 2, IBV_QPS_RTR).qp_attr(kClient, 2, IBV_QPS_RTS).accept(kClient, 2, 0).event(kServer);
	rc.query(kClient, 2, RDMA_USER_CM_QUERY_ADDR).query(kClient, 2, RDMA_USER_CM_QUERY_PATH);
	rc.query(kServer, 3, RDMA_USER_CM_QUERY_GID);
	rc.disconnect(kClient, 2).event(kServer).disconnect(kServer, 3).event(kClient).destroy(kServer, 3);
	write(dir, "rc-connect", rc);

	// Rejected, and destroyed while connected (the peer's QP goes to error).
	Seq rej = routed(RDMA_PS_TCP, 5001);
	rej.connect(kClient, 2, 0x100).event(kServer);
	rdma_ucm_reject r{};
	r.id = 3;
	r.reason = 28;
	r.private_data_len = 4;
	std::memcpy(r.private_data, "nope", 4);
	rej.execute(kServer, RDMA_USER_CM_CMD_REJECT, r, 0);
	rej.event(kClient).destroy(kClient, 2);
	rej.create(kClient, RDMA_PS_TCP).resolve(kClient, 4, v4("10.0.0.1", 5001)).connect(kClient, 4, 0x101);
	rej.event(kServer).accept(kServer, 5, 0x201).event(kClient).accept(kClient, 4, 0).destroy(kClient, 4);
	rej.event(kServer).op(kRelease, 0);
	write(dir, "rc-reject-destroy", rej);

	// Held GET_EVENTs: answered by an event, cancelled, and answered by a release.
	Seq held;
	held.held_event(kClient).create(kClient, RDMA_PS_TCP).resolve(kClient, 1, v4("127.0.0.1", 5002));
	held.held_event(kClient).held_event(kClient).op(kCancel, 0).op(kEventFile, 1);
	held.held_event(kServer).op(kRelease, 0).op(kRelease, 1);
	write(dir, "held-events", held);

	// UD through SIDR, then a multicast join and leave.
	Seq ud = routed(RDMA_PS_UDP, 5003);
	ud.connect(kClient, 2, 0x300).event(kServer).accept(kServer, 3, 0x400).event(kClient);
	ud.qp_attr(kClient, 2, IBV_QPS_RTS);
	ud.create(kClient, RDMA_PS_UDP).bind(kClient, 4, v4("10.0.0.1", 0));  // joins 5 and 6
	rdma_ucm_join_ip_mcast j{};
	j.uid = 0x3000;
	j.id = 4;
	sockaddr_storage group = v4("224.1.2.3", 0);
	std::memcpy(&j.addr, &group, sizeof(sockaddr_in));
	ud.execute(kClient | slot(5), RDMA_USER_CM_CMD_JOIN_IP_MCAST, j, sizeof(rdma_ucm_create_id_resp));
	ud.event(kClient);
	rdma_ucm_join_mcast jm{};
	jm.uid = 0x3001;
	jm.id = 4;
	jm.addr_size = sizeof(sockaddr_in6);
	jm.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
	sockaddr_storage group6 = v6("ff0e::1234", 0);
	std::memcpy(&jm.addr, &group6, sizeof(sockaddr_in6));
	ud.execute(kClient | slot(6), RDMA_USER_CM_CMD_JOIN_MCAST, jm, sizeof(rdma_ucm_create_id_resp));
	rdma_ucm_destroy_id leave{0, 5, 0};
	ud.execute(kClient | slot(7), RDMA_USER_CM_CMD_LEAVE_MCAST, leave, sizeof(rdma_ucm_destroy_id_resp));
	write(dir, "ud-sidr-mcast", ud);

	// Options and ports: REUSEADDR, AFONLY, TOS, ACK_TIMEOUT, an unknown option, binds.
	Seq opt;
	opt.create(kServer, RDMA_PS_TCP).create(kServer, RDMA_PS_TCP).create(kServer, RDMA_PS_IB);
	opt.option(kServer, 1, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, 4);
	opt.option(kServer, 2, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, 4);
	opt.option(kServer, 1, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, 1);
	opt.option(kServer, 1, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, 1);
	opt.option(kServer, 3, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, 4);
	opt.option(kServer, 3, RDMA_OPTION_ID, 99, 4);
	opt.bind(kServer, 1, v4("10.0.0.1", 6000)).bind(kServer, 2, v4("10.0.0.1", 6000)).listen(kServer, 1);
	opt.bind(kServer, 3, v6("::", 6000)).listen(kServer, 3);
	opt.create(kClient, RDMA_PS_TCP).resolve(kClient, 4, v6("fd00::1", 6000)).connect(kClient, 4, 0x500);
	opt.event(kServer);
	rdma_ucm_notify n{5, IBV_EVENT_COMM_EST};
	opt.accept(kServer, 5, 0x600);
	opt.execute(kServer, RDMA_USER_CM_CMD_NOTIFY, n, 0);
	opt.event(kServer);
	write(dir, "options-ports", opt);

	// MIGRATE_ID: an id and its events move to the other channel.
	Seq mig;
	mig.create(kClient, RDMA_PS_TCP).resolve(kClient, 1, v4("10.0.0.1", 6001));
	rdma_ucm_migrate_id m{0, 1, 5};
	mig.execute(kServer | slot(8), RDMA_USER_CM_CMD_MIGRATE_ID, m, sizeof(rdma_ucm_migrate_resp));
	mig.event(kServer).destroy(kServer, 1);
	write(dir, "migrate", mig);
	return 0;
}
