// The record format of a captured command stream: what xsrcd writes with
// XSRC_CAPTURE_DIR set (one file per context) and what the fuzz target
// (tests/fuzz) reads. A stream is a sequence of records, each a 4-byte
// little-endian header and then the bytes of one write() on the command file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace xsrc::capture {

struct RecordHeader {
	uint16_t length;  // bytes of the command that follow
	uint8_t flags;    // RecordFlags
	uint8_t slot;     // with kResponseInScratch: which response slot
};
static_assert(sizeof(RecordHeader) == 4);

enum RecordFlags : uint8_t {
	// The command's response pointer (bytes 8..15: the first field of the
	// core struct, or ib_uverbs_ex_cmd_hdr::response), if the header offers
	// room for a response, is an address in the capturing process; a replay
	// points it at its own response area.
	kResponseInScratch = 1u << 0,
	// Memory the command names (REG_MR) was mapped in the capturing process.
	kCallerMapsAll = 1u << 1,
	// The caller's fds this command names may have been closed and reopened
	// since the previous command (a capture cannot tell): a replay gives
	// every fd number it meets here a new file.
	kFreshFds = 1u << 2,
	// A replay makes the header's input lengths (in_words, and for extended
	// commands provider_in_words if it no longer fits) match the record's
	// length, so that mutated records still reach the handlers. Never set by
	// a capture: what the caller wrote is what it wrote.
	kFixLengths = 1u << 3,
	// The record is an RDMA_VERBS_IOCTL (driver ABI r6): the header and the
	// attributes the caller's pointer names; a replay places them in its
	// response area (at the record's slot) and passes that address.
	kIoctl = 1u << 4,
};

inline constexpr size_t kMaxRecordLength = UINT16_MAX;

// One record for `command` (longer than kMaxRecordLength: cut there).
inline std::vector<std::byte> encode_record(std::span<const std::byte> command, uint8_t flags, uint8_t slot = 0)
{
	size_t n = command.size() < kMaxRecordLength ? command.size() : kMaxRecordLength;
	std::vector<std::byte> out(sizeof(RecordHeader) + n);
	out[0] = std::byte(n & 0xff);
	out[1] = std::byte(n >> 8);
	out[2] = std::byte(flags);
	out[3] = std::byte(slot);
	for (size_t i = 0; i < n; ++i)
		out[sizeof(RecordHeader) + i] = command[i];
	return out;
}

// Splits `stream` into records; a record cut short by the end of the stream
// keeps what is there. Calls fn(header, command bytes) for each, until it
// returns false.
template <typename Fn>
void for_each_record(std::span<const std::byte> stream, Fn fn)
{
	while (stream.size() >= sizeof(RecordHeader)) {
		RecordHeader h{};
		h.length = static_cast<uint16_t>(std::to_integer<unsigned>(stream[0]) |
						 std::to_integer<unsigned>(stream[1]) << 8);
		h.flags = std::to_integer<uint8_t>(stream[2]);
		h.slot = std::to_integer<uint8_t>(stream[3]);
		stream = stream.subspan(sizeof(RecordHeader));
		size_t n = h.length < stream.size() ? h.length : stream.size();
		if (!fn(h, stream.first(n)))
			return;
		stream = stream.subspan(n);
	}
}

}  // namespace xsrc::capture
