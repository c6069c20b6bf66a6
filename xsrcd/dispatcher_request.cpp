#include "dispatcher_request.h"

#include <algorithm>
#include <vector>

namespace xsrc {

int respond(Caller &caller, const Request &req, std::span<const std::byte> core,
	    std::span<const std::byte> driver)
{
	if (!req.response)
		return refuse(EFAULT, "no response pointer");
	if (req.core_resp_len < core.size())
		return refuse(ENOSPC, "no room for the response");
	std::vector<std::byte> out(req.resp_len);
	std::copy(core.begin(), core.end(), out.begin());
	size_t driver_at = req.extended ? req.core_resp_len : core.size();
	if (driver_at < out.size()) {
		size_t n = std::min(driver.size(), out.size() - driver_at);
		std::copy_n(driver.begin(), n, out.begin() + static_cast<ptrdiff_t>(driver_at));
	}
	if (int err = caller.write_memory(req.response, out))
		return refuse(err, "cannot write the response into the caller");
	return 0;
}

}  // namespace xsrc
