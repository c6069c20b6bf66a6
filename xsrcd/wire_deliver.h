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
// With dev.wire_pending open, a middle packet's payload may wait there.
WireOutcome wire_deliver(Device &dev, std::span<const uint8_t> ip_packet);

// Lands the payloads waiting in dev.wire_pending (under the daemon's lock,
// before the packets' buffers are reused or the lock is let go). A run that
// does not land whole leaves its QP's responder to NAK the next packet with
// a remote access error.
void wire_flush(Device &dev);
// Sends the responses waiting for a requester that reads batches
// (WirePending::responses): at the end of each receive batch.
void wire_flush_responses(Device &dev);
// ACKs left on their owners' boards (XSRC_WIRE_RESPONSES_ACK_BOARD): those
// the owner took are forgotten, those whose delay passed are sent. Returns
// the CLOCK_MONOTONIC time at which the next one is due, 0 if none waits.
// Under the daemon's lock.
uint64_t wire_acks_due(Device &dev);

}  // namespace xsrc
