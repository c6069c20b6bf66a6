// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// Strong id types for the numbers that cross module boundaries: a QPN cannot
// be passed where an rkey is expected, nor a PD handle where a PD id is.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace xsrc {

template <typename Tag, typename Rep = uint32_t>
class StrongId {
public:
	using rep = Rep;
	constexpr StrongId() noexcept = default;
	constexpr explicit StrongId(Rep value) noexcept : value_(value) {}
	constexpr Rep value() const noexcept { return value_; }
	constexpr auto operator<=>(const StrongId &) const noexcept = default;

private:
	Rep value_{};
};

using Qpn = StrongId<struct QpnTag>;            // QP number on the device
using Srqn = StrongId<struct SrqnTag>;          // SRQ number on the device
using Lkey = StrongId<struct LkeyTag>;          // local key of an MR
using Rkey = StrongId<struct RkeyTag>;          // remote key of an MR
using PdHandle = StrongId<struct PdHandleTag>;  // a context's handle for a PD
using PdId = StrongId<struct PdIdTag>;          // device-wide PD id (arena entries)
using XrcdId = StrongId<struct XrcdIdTag>;      // device-wide XRC domain id
using ObjHandle = StrongId<struct ObjHandleTag>; // a context's handle for any object

}  // namespace xsrc

template <typename Tag, typename Rep>
struct std::hash<xsrc::StrongId<Tag, Rep>> {
	std::size_t operator()(const xsrc::StrongId<Tag, Rep> &id) const noexcept
	{
		return std::hash<Rep>()(id.value());
	}
};
