// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// fault_rounds' rdma_cm kind: the two participants connect an RC QP with
// librdmacm over 127.0.0.1 (the server listens on the round's port), then
// run the verbs workload on it. After the fault the survivor's channel is
// checked too: a peer's death must bring RDMA_CM_EVENT_DISCONNECTED, the
// daemon's death must wake a reader of the channel.
#include <arpa/inet.h>
#include <poll.h>

#include "rdmacm/cm_util.h"
#include "round.h"

namespace xsrc::fault {
namespace {

using xsrc_cm_test::next_event;

constexpr ms kStep{5000};

// The event channel and ids of one participant, destroyed in reverse order.
struct CmEnd {
	rdma_event_channel *ch = nullptr;
	rdma_cm_id *listener = nullptr;
	rdma_cm_id *id = nullptr;
	~CmEnd()
	{
		if (id)
			rdma_destroy_id(id);
		if (listener)
			rdma_destroy_id(listener);
		if (ch)
			rdma_destroy_event_channel(ch);
	}
};

bool expect(rdma_event_channel *ch, rdma_cm_event_type type, rdma_cm_id **id = nullptr)
{
	auto ev = next_event(ch, kStep);
	if (!ev || ev->type != type || ev->status) {
		std::fprintf(stderr, "rdma_cm: wanted %s, got %s (status %d)\n", rdma_event_str(type),
			     ev ? rdma_event_str(ev->type) : "nothing", ev ? ev->status : 0);
		return false;
	}
	if (id)
		*id = ev->id;
	return true;
}

// Connected, with receives posted, as the server or the client.
bool connect(CmEnd &end, Side &s, const Setup &setup, harness::Link &link)
{
	sockaddr_in addr = xsrc_cm_test::ipv4("loopback", setup.port);
	if (!(end.ch = rdma_create_event_channel()))
		return false;
	rdma_conn_param param{};
	param.responder_resources = param.initiator_depth = 1;
	param.retry_count = 7;
	param.rnr_retry_count = 7;
	auto ready = [&] {
		for (int i = 0; i < Side::kRecvs; ++i)
			if (s.post_recv(i))
				return false;
		return true;
	};
	if (setup.server) {
		if (rdma_create_id(end.ch, &end.listener, nullptr, RDMA_PS_TCP) ||
		    rdma_bind_addr(end.listener, reinterpret_cast<sockaddr *>(&addr)) || rdma_listen(end.listener, 4) ||
		    !link.send_value('l') || !expect(end.ch, RDMA_CM_EVENT_CONNECT_REQUEST, &end.id))
			return false;
		return s.open_on(end.id) && ready() && rdma_accept(end.id, &param) == 0 &&
		       expect(end.ch, RDMA_CM_EVENT_ESTABLISHED);
	}
	char listening = 0;
	return link.recv_value(&listening, kStep) && rdma_create_id(end.ch, &end.id, nullptr, RDMA_PS_TCP) == 0 &&
	       rdma_resolve_addr(end.id, nullptr, reinterpret_cast<sockaddr *>(&addr), 2000) == 0 &&
	       expect(end.ch, RDMA_CM_EVENT_ADDR_RESOLVED) && rdma_resolve_route(end.id, 2000) == 0 &&
	       expect(end.ch, RDMA_CM_EVENT_ROUTE_RESOLVED) && s.open_on(end.id) && ready() &&
	       rdma_connect(end.id, &param) == 0 && expect(end.ch, RDMA_CM_EVENT_ESTABLISHED);
}

// What the channel says within the bound: an event's type, -2 when
// rdma_get_cm_event failed, -1 when the channel stayed asleep.
int channel_after_fault(rdma_event_channel *ch)
{
	pollfd p{ch->fd, POLLIN, 0};
	if (poll(&p, 1, static_cast<int>(kBound.count())) != 1)
		return -1;
	rdma_cm_event *ev = nullptr;
	if (rdma_get_cm_event(ch, &ev))
		return -2;
	int type = ev->event;
	rdma_ack_cm_event(ev);
	return type;
}

}  // namespace

int cm_participant(harness::Link &link, const Setup &setup)
{
	Report rep;
	CmEnd end;
	int fds_before;
	{
		Side s;
		Info peer;
		if (!connect(end, s, setup, link))
			return 10;
		// librdmacm keeps the device it opened until exit: count from here.
		fds_before = open_fd_count();
		if (!link.send_value(s.info()) || !link.recv_value(&peer, kStep))
			return 11;
		// The channel after the fault, before the teardown.
		if (int err = verbs_run(link, s, setup.op, peer, rep, [&](Victim) { rep.cm_event = channel_after_fault(end.ch); }))
			return err;
	}
	rep.fd_leak = open_fd_count() - fds_before;
	return link.send_value(rep) ? 0 : 14;
}

}  // namespace xsrc::fault
