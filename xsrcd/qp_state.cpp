#include "qp_state.h"

#include <iterator>

namespace xsrc {
namespace {

constexpr uint32_t state_bit(ibv_qp_state s)
{
	return 1u << s;
}

constexpr uint32_t type_bit(ibv_qp_type t)
{
	return t < 32 ? 1u << t : 0;
}

// QP types, as bit sets.
constexpr uint32_t RC = type_bit(IBV_QPT_RC);
constexpr uint32_t UC = type_bit(IBV_QPT_UC);
constexpr uint32_t UD = type_bit(IBV_QPT_UD);
constexpr uint32_t XRC_SEND = type_bit(IBV_QPT_XRC_SEND);
constexpr uint32_t XRC_RECV = type_bit(IBV_QPT_XRC_RECV);
constexpr uint32_t RAW = type_bit(IBV_QPT_RAW_PACKET);
constexpr uint32_t ALL_TYPES = RC | UC | UD | XRC_SEND | XRC_RECV | RAW;

// States, as bit sets.
constexpr uint32_t RESET = state_bit(IBV_QPS_RESET);
constexpr uint32_t INIT = state_bit(IBV_QPS_INIT);
constexpr uint32_t RTR = state_bit(IBV_QPS_RTR);
constexpr uint32_t RTS = state_bit(IBV_QPS_RTS);
constexpr uint32_t SQD = state_bit(IBV_QPS_SQD);
constexpr uint32_t SQE = state_bit(IBV_QPS_SQE);
constexpr uint32_t ERR = state_bit(IBV_QPS_ERR);
constexpr uint32_t ANY_STATE = RESET | INIT | RTR | RTS | SQD | SQE | ERR;

// Attribute groups that several rules share.
constexpr uint32_t PKEY = IBV_QP_PKEY_INDEX;
constexpr uint32_t PORT = IBV_QP_PORT;
constexpr uint32_t ACCESS = IBV_QP_ACCESS_FLAGS;
constexpr uint32_t QKEY = IBV_QP_QKEY;
constexpr uint32_t CUR = IBV_QP_CUR_STATE;
constexpr uint32_t ALT = IBV_QP_ALT_PATH;
constexpr uint32_t MIG = IBV_QP_PATH_MIG_STATE;
constexpr uint32_t RNR_TIMER = IBV_QP_MIN_RNR_TIMER;
constexpr uint32_t CONNECT = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
constexpr uint32_t RESPONDER = IBV_QP_MAX_DEST_RD_ATOMIC | RNR_TIMER;
constexpr uint32_t REQUESTER = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;

// One line of the table: the transitions from any state in `from` to `to`,
// for any QP type in `types`.
struct Rule {
	uint32_t from;
	ibv_qp_state to;
	uint32_t types;
	uint32_t required;
	uint32_t optional;
};

// clang-format off
constexpr Rule kRules[] = {
	// Reset is reachable from everywhere; Error from everywhere but Reset.
	{ANY_STATE,          IBV_QPS_RESET, ALL_TYPES, 0, 0},
	{ANY_STATE & ~RESET, IBV_QPS_ERR,   ALL_TYPES, 0, 0},

	{RESET, IBV_QPS_INIT, RC | UC | XRC_SEND | XRC_RECV, PKEY | PORT | ACCESS, 0},
	{RESET, IBV_QPS_INIT, UD,                            PKEY | PORT | QKEY,   0},
	{RESET, IBV_QPS_INIT, RAW,                           PORT,                 0},

	{INIT, IBV_QPS_INIT, RC | UC | XRC_SEND | XRC_RECV, 0, PKEY | PORT | ACCESS},
	{INIT, IBV_QPS_INIT, UD,                            0, PKEY | PORT | QKEY},
	{INIT, IBV_QPS_INIT, RAW,                           0, PORT},

	{INIT, IBV_QPS_RTR, RC | XRC_RECV, CONNECT | RESPONDER, ALT | ACCESS | PKEY},
	{INIT, IBV_QPS_RTR, UC | XRC_SEND, CONNECT,             ALT | ACCESS | PKEY},
	{INIT, IBV_QPS_RTR, UD,            0,                   PKEY | QKEY},
	{INIT, IBV_QPS_RTR, RAW,           0,                   0},

	{RTR, IBV_QPS_RTS, RC,       REQUESTER,                      CUR | ALT | ACCESS | RNR_TIMER | MIG},
	{RTR, IBV_QPS_RTS, XRC_SEND, REQUESTER,                      CUR | ALT | ACCESS | MIG},
	{RTR, IBV_QPS_RTS, XRC_RECV, IBV_QP_TIMEOUT | IBV_QP_SQ_PSN, CUR | ALT | ACCESS | RNR_TIMER | MIG},
	{RTR, IBV_QPS_RTS, UC,       IBV_QP_SQ_PSN,                  CUR | ALT | ACCESS | MIG},
	{RTR, IBV_QPS_RTS, UD,       IBV_QP_SQ_PSN,                  CUR | QKEY},
	{RTR, IBV_QPS_RTS, RAW,      0,                              0},

	// Running (and resuming from drained) changes only a few attributes.
	{RTS | SQD, IBV_QPS_RTS, RC | XRC_RECV, 0, CUR | ACCESS | ALT | MIG | RNR_TIMER},
	{RTS | SQD, IBV_QPS_RTS, UC | XRC_SEND, 0, CUR | ACCESS | ALT | MIG},
	{RTS | SQD, IBV_QPS_RTS, UD,            0, CUR | QKEY},
	{RTS | SQD, IBV_QPS_RTS, RAW,           0, CUR},

	{RTS, IBV_QPS_SQD, ALL_TYPES, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},

	// A drained send queue may take new path and requester attributes.
	{SQD, IBV_QPS_SQD, RC,       0, PORT | IBV_QP_AV | (REQUESTER & ~IBV_QP_SQ_PSN) | RESPONDER |
					ALT | ACCESS | PKEY | MIG},
	{SQD, IBV_QPS_SQD, XRC_SEND, 0, PORT | IBV_QP_AV | (REQUESTER & ~IBV_QP_SQ_PSN) |
					ALT | ACCESS | PKEY | MIG},
	{SQD, IBV_QPS_SQD, XRC_RECV, 0, PORT | IBV_QP_AV | IBV_QP_TIMEOUT | RESPONDER |
					ALT | ACCESS | PKEY | MIG},
	{SQD, IBV_QPS_SQD, UC,       0, IBV_QP_AV | ALT | ACCESS | PKEY | MIG},
	{SQD, IBV_QPS_SQD, UD,       0, PKEY | QKEY},

	// Only unreliable send queues stop in Send Queue Error; RC goes to Error.
	{SQE, IBV_QPS_RTS, UC, 0, CUR | ACCESS},
	{SQE, IBV_QPS_RTS, UD, 0, CUR | QKEY},
};
// clang-format on

}  // namespace

std::optional<QpTransitionMasks> qp_transition(ibv_qp_state cur, ibv_qp_state next, ibv_qp_type type)
{
	if (cur > IBV_QPS_ERR || next > IBV_QPS_ERR)
		return std::nullopt;
	for (const Rule &r : kRules)
		if ((r.from & state_bit(cur)) && r.to == next && (r.types & type_bit(type)))
			return QpTransitionMasks{r.required, r.optional};
	return std::nullopt;
}

bool qp_modify_allowed(ibv_qp_state cur, ibv_qp_state next, ibv_qp_type type, uint32_t mask)
{
	std::optional<QpTransitionMasks> t = qp_transition(cur, next, type);
	if (!t)
		return false;
	if ((mask & t->required) != t->required)
		return false;
	return (mask & ~(t->required | t->optional | IBV_QP_STATE)) == 0;
}

}  // namespace xsrc
