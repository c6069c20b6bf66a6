// The IB QP state machine as a table: which transitions exist for which QP
// type, and which attributes (IBV_QP_* mask bits) each one requires and
// allows. Source: IBTA vol. 1 §11.2.5 "Modify QP" and the transition table
// Linux checks in ib_modify_qp_is_ok() (drivers/infiniband/core/verbs.c),
// which applications are written against.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <optional>

namespace xsrc {

struct QpTransitionMasks {
	uint32_t required = 0;  // beyond IBV_QP_STATE
	uint32_t optional = 0;
};

// The masks of cur -> next for `type`, or nothing when that transition does
// not exist for the type. next == cur is the "modify without a state change".
std::optional<QpTransitionMasks> qp_transition(ibv_qp_state cur, ibv_qp_state next, ibv_qp_type type);

// True when `mask` names every required and only required or optional
// attributes of cur -> next (IBV_QP_STATE is always allowed).
bool qp_modify_allowed(ibv_qp_state cur, ibv_qp_state next, ibv_qp_type type, uint32_t mask);

}  // namespace xsrc
