// The error-path tests' view of librdmacm: events taken with a deadline (never
// a hang), addresses of xsrc0, and one side of a connection with a QP that can
// exchange a message. Everything runs under `xsrc run` (the interposer gives
// librdmacm the daemon's cm files).
#pragma once

#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <chrono>
#include <optional>
#include <string>

namespace xsrc_cm_test {

using ms = std::chrono::milliseconds;

// What an event said (the event itself is acked at once).
struct Event {
	rdma_cm_event_type type{};
	int status = 0;
	rdma_cm_id *id = nullptr;
	rdma_cm_id *listen_id = nullptr;
};

// The next event on `ch` within `timeout` (poll() on its fd, then
// rdma_get_cm_event); nullopt when none came.
std::optional<Event> next_event(rdma_event_channel *ch, ms timeout);
// Is an event waiting on `ch` within `timeout`?
bool channel_readable(rdma_event_channel *ch, ms timeout);

// An IPv4 address with `port`: "netdev" (xsrc0's netdev's first IPv4
// address), "loopback" (127.0.0.1) or a literal.
sockaddr_in ipv4(const std::string &which, uint16_t port);
// The daemon's rdma_cm directory ($SYSFS_PATH/class/infiniband_ucma/xsrc_cm_dir).
std::string cm_dir();
// The objects= of the rdma_cm line of `xsrc status`, -1 when there is none.
long cm_objects();

// One end of an RC connection made through rdma_cm: its channel, id and QP
// (librdmacm's own PD and CQs) and a registered buffer.
class Endpoint {
public:
	Endpoint();
	~Endpoint();
	Endpoint(const Endpoint &) = delete;
	Endpoint &operator=(const Endpoint &) = delete;

	rdma_event_channel *channel() const { return ch_; }
	rdma_cm_id *id() const { return id_; }
	rdma_cm_id *listener() const { return listener_; }
	// The connection id, now the caller's to destroy (with its QP; its MR is ours).
	rdma_cm_id *take_id()
	{
		rdma_cm_id *id = id_;
		id_ = nullptr;
		return id;
	}

	// Active side: resolve, create the QP, connect; true once ESTABLISHED.
	bool connect(const sockaddr_in &dst, ms timeout);
	// Active side up to CONNECT (no wait for the answer).
	bool start_connect(const sockaddr_in &dst, ms timeout);
	// Passive side: listen on `addr`.
	bool listen(const sockaddr_in &addr);
	// Passive side: the next CONNECT_REQUEST (the id is kept, not accepted).
	bool wait_request(ms timeout);
	// Passive side: accept the request taken, true once ESTABLISHED.
	bool accept(ms timeout);

	// One message each way: `first` sends then receives, the other the reverse.
	bool exchange(bool first, ms timeout);
	// Posts a send and waits for its completion: its status, or -1 without one.
	int send_status(ms timeout);
	// The QP's state (ibv_query_qp), or -1.
	int qp_state();

private:
	bool create_qp(rdma_cm_id *id);
	bool poll_one(ibv_cq *cq, ibv_wc &wc, ms timeout);

	rdma_event_channel *ch_ = nullptr;
	rdma_cm_id *listener_ = nullptr;
	rdma_cm_id *id_ = nullptr;
	ibv_mr *mr_ = nullptr;
	char buf_[256] = {};
};

}  // namespace xsrc_cm_test
