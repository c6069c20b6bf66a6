// A RoCE v2 packet from the wire, its ICRC checked (wire_receiver.cpp),
// delivered into the device as the responder of an HCA would: today UD
// SEND Only (with Immediate) into a posted receive of the UD QP the BTH
// names, with the Q_Key check and the GRH built from the IP header.
#pragma once

#include <cstdint>
#include <span>

#include "objects.h"
#include "wire_receiver.h"

namespace xsrc {

// Called under the daemon's lock. `ip_packet`: IP header .. ICRC.
WireOutcome wire_deliver(Device &dev, std::span<const uint8_t> ip_packet);

}  // namespace xsrc
