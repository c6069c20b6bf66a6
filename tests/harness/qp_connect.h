// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Bringing a verbs QP from RESET to RTS: INIT, RTR (towards a remote QP number and GID)
// and RTS, for RC, UC, UD and both XRC QP types, with the attributes the tests vary.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>

namespace xsrc::harness {

constexpr uint32_t kRemoteAccessAll = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// The attributes of each step. The defaults are those of ibv_rc_pingpong -g 1 on xsrc0.
struct QpConnectAttrs {
	// INIT
	uint8_t port = 1;
	uint32_t access = kRemoteAccessAll;  // RC, UC, XRC
	uint32_t qkey = 0;                   // UD
	// RTR: the address vector (a GRH with this source GID index) and the receive side.
	uint8_t sgid_index = 1;
	uint8_t hop_limit = 1;
	ibv_mtu path_mtu = IBV_MTU_1024;
	uint32_t rq_psn = 0;
	bool responder = true;  // RC: also set max_dest_rd_atomic and min_rnr_timer
	uint8_t max_dest_rd_atomic = 1;
	uint8_t min_rnr_timer = 1;  // 10 us
	// RTS
	uint32_t sq_psn = 0;
	uint8_t timeout = 14;  // 4.096 us << 14 = 67 ms per try
	uint8_t retry_cnt = 7;
	uint8_t rnr_retry = 7;  // 7: retry forever
	uint8_t max_rd_atomic = 1;
};

// Where the QP sends: the remote QP number and the GID of its port.
struct QpRemote {
	uint32_t qpn = 0;
	ibv_gid gid{};
};

// The outcome of a transition: 0, or the errno of ibv_modify_qp and the step it failed in.
struct QpStep {
	int err = 0;
	const char *step = "";
	explicit operator bool() const { return err != 0; }  // true: it failed
	std::string text() const;                             // "RTR: Invalid argument (22)"
};

// Each step on its own; the QP's type says which attributes it takes.
QpStep qp_to_init(ibv_qp *qp, const QpConnectAttrs &a = {});
QpStep qp_to_rtr(ibv_qp *qp, const QpRemote &remote, const QpConnectAttrs &a = {});
QpStep qp_to_rts(ibv_qp *qp, const QpConnectAttrs &a = {});
// INIT, RTR, RTS; the first failure stops it.
QpStep qp_connect(ibv_qp *qp, const QpRemote &remote, const QpConnectAttrs &a = {});
QpStep qp_to_error(ibv_qp *qp);

// The QP's current state (IBV_QPS_UNKNOWN if it cannot be queried).
ibv_qp_state qp_state(ibv_qp *qp);

// The address vector qp_to_rtr() uses: a GRH towards `dgid` from the port's GID `sgid_index`.
ibv_ah_attr grh_ah_attr(const ibv_gid &dgid, const QpConnectAttrs &a = {});

}  // namespace xsrc::harness
