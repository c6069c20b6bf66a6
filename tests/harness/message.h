// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// A message between the two processes of a test: "key=value" lines. "cmd" names a
// command; a reply that carries "error" says the command failed.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>

namespace xsrc::harness {

class Msg {
public:
	Msg() = default;
	explicit Msg(const std::string &cmd) { kv_["cmd"] = cmd; }

	// Numbers in decimal, bools as 1/0, enums as their value.
	template <typename T>
	Msg &set(const std::string &key, const T &value)
	{
		if constexpr (std::is_same_v<T, bool>)
			kv_[key] = value ? "1" : "0";
		else if constexpr (std::is_enum_v<T>)
			kv_[key] = std::to_string(static_cast<std::underlying_type_t<T>>(value));
		else if constexpr (std::is_arithmetic_v<T>)
			kv_[key] = std::to_string(value);
		else
			kv_[key] = std::string(value);
		return *this;
	}
	bool has(const std::string &key) const { return kv_.count(key) != 0; }
	// The value of `key`; throws std::runtime_error when there is none.
	const std::string &str(const std::string &key) const;
	std::string str(const std::string &key, const std::string &fallback) const
	{
		return has(key) ? str(key) : fallback;
	}
	// Numbers are read with base 0 (decimal, 0x..., 0...).
	uint64_t u64(const std::string &key) const { return std::stoull(str(key), nullptr, 0); }
	uint64_t u64(const std::string &key, uint64_t fallback) const { return has(key) ? u64(key) : fallback; }
	int64_t i64(const std::string &key) const { return std::stoll(str(key), nullptr, 0); }
	int64_t i64(const std::string &key, int64_t fallback) const { return has(key) ? i64(key) : fallback; }

	std::string encode() const;
	static Msg decode(const std::string &text);

private:
	std::map<std::string, std::string> kv_;
};

}  // namespace xsrc::harness
