// The widths of the IBTA fields commands check or mask: the largest value
// each may take. Values past them are refused (or masked, where the kernel
// masks) before anything changes.
#pragma once

#include <cstdint>

namespace xsrc::ib {

inline constexpr uint8_t kMaxServiceLevel = 15;      // SL: 4 bits
inline constexpr uint8_t kMaxAckTimeout = 31;        // local ACK timeout exponent: 5 bits
inline constexpr uint8_t kMaxRetryCount = 7;         // retry_cnt: 3 bits
inline constexpr uint8_t kMaxRnrRetry = 7;           // rnr_retry: 3 bits; 7 is "retry forever"
inline constexpr uint8_t kMaxMinRnrTimer = 31;       // RNR NAK timer code: 5 bits
inline constexpr uint32_t kMaxQpn = 0xffffff;        // QP numbers: 24 bits
inline constexpr uint32_t kPsnMask = 0xffffff;       // packet sequence numbers: 24 bits
inline constexpr uint32_t kFlowLabelMask = 0xfffff;  // GRH flow label: 20 bits

}  // namespace xsrc::ib
