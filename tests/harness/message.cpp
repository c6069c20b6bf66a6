// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
#include "harness/message.h"

#include <stdexcept>

namespace xsrc::harness {

const std::string &Msg::str(const std::string &key) const
{
	auto it = kv_.find(key);
	if (it == kv_.end())
		throw std::runtime_error("message has no '" + key + "': " + encode());
	return it->second;
}

std::string Msg::encode() const
{
	std::string out;
	for (const auto &[k, v] : kv_)
		out += k + "=" + v + "\n";
	return out;
}

Msg Msg::decode(const std::string &text)
{
	Msg m;
	size_t pos = 0;
	while (pos < text.size()) {
		size_t nl = text.find('\n', pos);
		if (nl == std::string::npos)
			nl = text.size();
		std::string line = text.substr(pos, nl - pos);
		size_t eq = line.find('=');
		if (eq != std::string::npos)
			m.kv_[line.substr(0, eq)] = line.substr(eq + 1);
		pos = nl + 1;
	}
	return m;
}

}  // namespace xsrc::harness
