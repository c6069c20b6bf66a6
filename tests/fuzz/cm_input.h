// The input format of the cm fuzzer (fuzz_cm.cpp), shared with its seed
// writer (make_cm_seeds.cpp): a sequence of steps, each an op byte and its
// operands, over two channels of one CmService.
//   kExecute FLAGS LEN(u16 LE) BYTES   one write() of BYTES on channel FLAGS&1
//   kCancel  K                         the K-th held GET_EVENT is interrupted
//   kRelease I                         channel I's file closes; a new channel takes its place
//   kEventFile I                       channel I's event file opens (and closes when I does)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace xsrc::cmfuzz {

enum Op : uint8_t { kExecute = 0, kCancel = 1, kRelease = 2, kEventFile = 3, kOpCount = 4 };

// kExecute flags.
enum : uint8_t {
	kOther = 1 << 0,      // channel 1 (else 0)
	kNonblock = 1 << 1,   // the file is O_NONBLOCK
	kHoldable = 1 << 2,   // a GET_EVENT may wait (a caller is kept for it)
	kPatchResponse = 1 << 3,  // the command's response (its first u64; CREATE_ID's second) is slot FLAGS>>4
};

// The caller's memory: 16 response slots, then an option area whose every
// int is 1.
inline constexpr uint64_t kMemBase = 0x10000000;
inline constexpr size_t kSlotSize = 512;
inline constexpr size_t kSlots = 16;
inline constexpr uint64_t kOptionArea = kMemBase + kSlots * kSlotSize;
inline constexpr size_t kMemSize = kSlots * kSlotSize + 4096;

class Writer {
public:
	// One command: header {cmd, sizeof body, out} then the body.
	template <typename T>
	Writer &execute(uint8_t flags, uint32_t cmd, const T &body, uint16_t out)
	{
		uint8_t hdr[8];
		uint16_t in = sizeof(T);
		std::memcpy(hdr, &cmd, 4);
		std::memcpy(hdr + 4, &in, 2);
		std::memcpy(hdr + 6, &out, 2);
		uint16_t len = static_cast<uint16_t>(sizeof(hdr) + sizeof(T));
		bytes_.push_back(kExecute);
		bytes_.push_back(flags);
		bytes_.push_back(static_cast<uint8_t>(len & 0xff));
		bytes_.push_back(static_cast<uint8_t>(len >> 8));
		bytes_.insert(bytes_.end(), hdr, hdr + sizeof(hdr));
		auto *p = reinterpret_cast<const uint8_t *>(&body);
		bytes_.insert(bytes_.end(), p, p + sizeof(T));
		return *this;
	}
	Writer &op(Op o, uint8_t arg)
	{
		bytes_.push_back(o);
		bytes_.push_back(arg);
		return *this;
	}
	const std::vector<uint8_t> &bytes() const { return bytes_; }

private:
	std::vector<uint8_t> bytes_;
};

}  // namespace xsrc::cmfuzz
