#include "cm_util.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <poll.h>
#include <rdma/rdma_verbs.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace xsrc_cm_test {

namespace {

std::string sysfs_file(const std::string &rel)
{
	const char *root = getenv("SYSFS_PATH");
	std::ifstream in(std::string(root && *root ? root : "/sys") + "/" + rel);
	std::string line;
	std::getline(in, line);
	return line;
}

}  // namespace

bool channel_readable(rdma_event_channel *ch, ms timeout)
{
	pollfd p{ch->fd, POLLIN, 0};
	return poll(&p, 1, static_cast<int>(timeout.count())) == 1 && (p.revents & POLLIN);
}

std::optional<Event> next_event(rdma_event_channel *ch, ms timeout)
{
	if (!channel_readable(ch, timeout))
		return std::nullopt;
	rdma_cm_event *ev = nullptr;
	if (rdma_get_cm_event(ch, &ev))
		return std::nullopt;
	Event out{ev->event, ev->status, ev->id, ev->listen_id};
	rdma_ack_cm_event(ev);
	return out;
}

sockaddr_in ipv4(const std::string &which, uint16_t port)
{
	sockaddr_in a{};
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	if (which == "loopback") {
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	} else if (which == "netdev") {
		std::string netdev = sysfs_file("class/infiniband/xsrc0/ports/1/gid_attrs/ndevs/1");
		if (netdev.empty())
			netdev = sysfs_file("class/infiniband/xsrc0/ports/1/gid_attrs/ndevs/0");
		ifaddrs *all = nullptr;
		getifaddrs(&all);
		for (ifaddrs *i = all; i; i = i->ifa_next)
			if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && netdev == i->ifa_name) {
				a.sin_addr = reinterpret_cast<sockaddr_in *>(i->ifa_addr)->sin_addr;
				break;
			}
		freeifaddrs(all);
	} else {
		inet_pton(AF_INET, which.c_str(), &a.sin_addr);
	}
	return a;
}

std::string cm_dir()
{
	return sysfs_file("class/infiniband_ucma/xsrc_cm_dir");
}

long cm_objects()
{
	const char *xsrc = getenv("XSRC");
	std::string cmd = std::string(xsrc && *xsrc ? xsrc : "xsrc") + " status 2>/dev/null";
	FILE *p = popen(cmd.c_str(), "r");
	if (!p)
		return -1;
	long objects = -1;
	char line[512];
	while (fgets(line, sizeof(line), p)) {
		std::istringstream fields(line);
		std::string field;
		if (!(fields >> field) || field != "rdma_cm")
			continue;
		while (fields >> field)
			if (field.starts_with("objects="))
				objects = std::stol(field.substr(8));
	}
	pclose(p);
	return objects;
}

Endpoint::Endpoint() : ch_(rdma_create_event_channel()) {}

Endpoint::~Endpoint()
{
	if (mr_)
		rdma_dereg_mr(mr_);
	if (id_) {
		if (id_->qp)
			rdma_destroy_qp(id_);
		rdma_destroy_id(id_);
	}
	if (listener_)
		rdma_destroy_id(listener_);
	if (ch_)
		rdma_destroy_event_channel(ch_);
}

bool Endpoint::create_qp(rdma_cm_id *id)
{
	ibv_qp_init_attr attr{};
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 8;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 1;
	if (rdma_create_qp(id, nullptr, &attr))
		return false;
	mr_ = rdma_reg_msgs(id, buf_, sizeof(buf_));
	return mr_ && rdma_post_recv(id, nullptr, buf_, sizeof(buf_) / 2, mr_) == 0;
}

bool Endpoint::start_connect(const sockaddr_in &dst, ms timeout)
{
	if (!ch_ || rdma_create_id(ch_, &id_, this, RDMA_PS_TCP))
		return false;
	sockaddr_in d = dst;
	if (rdma_resolve_addr(id_, nullptr, reinterpret_cast<sockaddr *>(&d), 2000))
		return false;
	auto ev = next_event(ch_, timeout);
	if (!ev || ev->type != RDMA_CM_EVENT_ADDR_RESOLVED || rdma_resolve_route(id_, 2000))
		return false;
	ev = next_event(ch_, timeout);
	if (!ev || ev->type != RDMA_CM_EVENT_ROUTE_RESOLVED || !create_qp(id_))
		return false;
	rdma_conn_param param{};
	param.responder_resources = param.initiator_depth = 1;
	param.retry_count = 7;
	param.rnr_retry_count = 7;
	return rdma_connect(id_, &param) == 0;
}

bool Endpoint::connect(const sockaddr_in &dst, ms timeout)
{
	if (!start_connect(dst, timeout))
		return false;
	auto ev = next_event(ch_, timeout);
	return ev && ev->type == RDMA_CM_EVENT_ESTABLISHED && ev->status == 0;
}

bool Endpoint::listen(const sockaddr_in &addr)
{
	sockaddr_in a = addr;
	return ch_ && rdma_create_id(ch_, &listener_, this, RDMA_PS_TCP) == 0 &&
	       rdma_bind_addr(listener_, reinterpret_cast<sockaddr *>(&a)) == 0 && rdma_listen(listener_, 8) == 0;
}

bool Endpoint::wait_request(ms timeout)
{
	auto ev = next_event(ch_, timeout);
	if (!ev || ev->type != RDMA_CM_EVENT_CONNECT_REQUEST)
		return false;
	id_ = ev->id;
	return true;
}

bool Endpoint::accept(ms timeout)
{
	if (!id_ || !create_qp(id_))
		return false;
	rdma_conn_param param{};
	param.responder_resources = param.initiator_depth = 1;
	param.rnr_retry_count = 7;
	if (rdma_accept(id_, &param))
		return false;
	auto ev = next_event(ch_, timeout);
	return ev && ev->type == RDMA_CM_EVENT_ESTABLISHED && ev->status == 0;
}

bool Endpoint::poll_one(ibv_cq *cq, ibv_wc &wc, ms timeout)
{
	auto deadline = std::chrono::steady_clock::now() + timeout;
	while (std::chrono::steady_clock::now() < deadline) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			return false;
		if (n == 1)
			return true;
		std::this_thread::sleep_for(std::chrono::microseconds(200));
	}
	return false;
}

bool Endpoint::exchange(bool first, ms timeout)
{
	char *out = buf_ + sizeof(buf_) / 2;
	std::snprintf(out, sizeof(buf_) / 2, "hello from %s", first ? "the first" : "the second");
	ibv_wc wc{};
	auto send = [&] {
		return rdma_post_send(id_, nullptr, out, std::strlen(out) + 1, mr_, 0) == 0 &&
		       poll_one(id_->send_cq, wc, timeout) && wc.status == IBV_WC_SUCCESS;
	};
	auto recv = [&] {
		return poll_one(id_->recv_cq, wc, timeout) && wc.status == IBV_WC_SUCCESS &&
		       std::strncmp(buf_, "hello from ", 11) == 0;
	};
	return first ? send() && recv() : recv() && send();
}

int Endpoint::send_status(ms timeout)
{
	char *out = buf_ + sizeof(buf_) / 2;
	if (rdma_post_send(id_, nullptr, out, 8, mr_, 0))
		return -1;
	ibv_wc wc{};
	return poll_one(id_->send_cq, wc, timeout) ? wc.status : -1;
}

int Endpoint::qp_state()
{
	ibv_qp_attr attr{};
	ibv_qp_init_attr init{};
	if (!id_ || !id_->qp || ibv_query_qp(id_->qp, &attr, IBV_QP_STATE, &init))
		return -1;
	return attr.qp_state;
}

}  // namespace xsrc_cm_test
