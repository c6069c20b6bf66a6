// What the two halves of the layout test share: one row per struct and per
// field, as a translation unit compiled against some revision of the driver
// ABI sees it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace xsrc::abi_test {

struct LayoutRow {
	const char *type;
	const char *field;  // nullptr: the struct itself
	size_t offset;      // 0 for the struct itself
	size_t size;
};

// Every struct and field of kernel-abi/history/r1/xsrc-abi.h, as built
// against that header (abi_layout_r1_test.cpp).
std::span<const LayoutRow> r1_layout();

// The arena structs of kernel-abi/history/r2/xsrc-queues.h, and every field
// of its header (abi_layout_r2_arena_test.cpp); its XSRC_ARENA_VERSION.
std::span<const LayoutRow> r2_arena_layout();
uint32_t r2_arena_version();

}  // namespace xsrc::abi_test
