// A RoCE v2 packet from the wire, its ICRC checked (wire_receiver.cpp),
// delivered into the device as the responder of an HCA would: UD SEND
// into a posted receive, RC and UC SEND and RDMA WRITE executed into the
// QP owner's memory (RC answered with ACK/NAK), RC responses handed to the
// requester in the QP owner's provider.
#pragma once

#include <cstdint>
#include <span>

#include "objects.h"
#include "wire_receiver.h"

namespace xsrc {

// Called under the daemon's lock. `ip_packet`: IP header .. ICRC. UD is
// delivered, RC/UC requests executed (and answered), RC responses handed
// to the requester's context.
WireOutcome wire_deliver(Device &dev, std::span<const uint8_t> ip_packet);

}  // namespace xsrc
