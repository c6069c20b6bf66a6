// What the dispatcher hands every command handler: the decoded request, and
// the checks and response writing all handlers share (the kernel's udata
// discipline). Internal to the dispatcher and the <object>_commands.cpp files.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "caller.h"
#include "log.h"
#include "objects.h"
#include "xsrc-abi.h"

namespace xsrc {

// One decoded write(): the core payload (the kernel struct of the command),
// the driver data after it, and where the response goes.
struct Request {
	std::span<const std::byte> core;    // the core struct (an older extended caller's may be shorter)
	std::span<const std::byte> driver;  // everything after the core struct
	uint64_t response = 0;              // caller address, 0 for none
	size_t core_resp_len = 0;           // room for the core response
	size_t resp_len = 0;                // room for core + driver response
	bool extended = false;              // IB_USER_VERBS_CMD_FLAG_EXTENDED
};

using Handler = int (*)(Context &, Caller &, const Request &);


template <typename T>
T load(std::span<const std::byte> bytes)
{
	T v{};
	std::memcpy(&v, bytes.data(), std::min(sizeof(T), bytes.size()));
	return v;
}

inline bool all_zero(std::span<const std::byte> bytes)
{
	return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

template <typename T>
std::span<const std::byte> as_bytes_of(const T &v)
{
	return {reinterpret_cast<const std::byte *>(&v), sizeof(T)};
}

// Writes the core response (and the driver response after it) into the
// caller's buffer, zero-filling whatever room is left, as the kernel does.
// The driver response follows the kernel's core struct, or for extended
// commands the room the caller gave the core response.
int respond(Caller &caller, const Request &req, std::span<const std::byte> core,
	    std::span<const std::byte> driver = {});

// Rejects driver data a command does not define: the kernel's
// ib_is_udata_cleared discipline.
inline int check_no_driver_data(const Request &req)
{
	return all_zero(req.driver) ? 0 : refuse(EOPNOTSUPP, "driver data where the command defines none");
}

// The driver ABI discipline (kernel-abi/README.md), as the kernel applies it
// to udata. Reads the driver request T: fewer than `min_size` bytes (what
// revision 1 defined) -> EINVAL; fields an older caller did not send read as
// zero; bytes past T (a newer caller's fields) must be zero -> EOPNOTSUPP.
template <typename T>
int load_driver_request(const Request &req, T &out, size_t min_size = sizeof(T))
{
	if (req.driver.size() < min_size)
		return refuse(EINVAL, "short driver request");
	if (req.driver.size() > sizeof(T) && !all_zero(req.driver.subspan(sizeof(T))))
		return refuse(EOPNOTSUPP, "non-zero driver bytes past what this daemon knows");
	out = load<T>(req.driver);
	return 0;
}

// comp_mask bits this daemon does not know -> EOPNOTSUPP.
inline int check_comp_mask(uint32_t comp_mask, uint32_t known)
{
	return (comp_mask & ~known) ? refuse(EOPNOTSUPP, "unknown comp_mask bits") : 0;
}

// The driver ABI revision the context's device serves (xsrcd --abi).
inline uint32_t abi_revision(const Context &ctx)
{
	return ctx.device ? ctx.device->abi_revision : XSRC_DRIVER_ABI_REVISION;
}

}  // namespace xsrc
