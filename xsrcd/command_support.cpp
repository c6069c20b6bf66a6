#include "command_support.h"

#include <algorithm>
#include <vector>

namespace xsrc {

int respond(Caller &caller, const Request &req, std::span<const std::byte> core,
	    std::span<const std::byte> driver)
{
	if (!req.response)
		return EFAULT;
	if (req.core_resp_len < core.size())
		return ENOSPC;
	std::vector<std::byte> out(req.resp_len);
	std::copy(core.begin(), core.end(), out.begin());
	size_t driver_at = req.extended ? req.core_resp_len : core.size();
	if (driver_at < out.size()) {
		size_t n = std::min(driver.size(), out.size() - driver_at);
		std::copy_n(driver.begin(), n, out.begin() + static_cast<ptrdiff_t>(driver_at));
	}
	return caller.write_memory(req.response, out);
}

int insert_object(Context &ctx, Object obj, uint32_t &handle)
{
	if (ctx.objects.size() >= (1u << 20))
		return ENOMEM;
	while (ctx.objects.count(ctx.next_handle))
		++ctx.next_handle;
	handle = ctx.next_handle++;
	if (ctx.device)
		++ctx.device->object_counts[obj.index()];
	ctx.objects.emplace(handle, std::move(obj));
	return 0;
}

void erase_object(Context &ctx, uint32_t handle)
{
	auto it = ctx.objects.find(handle);
	if (it == ctx.objects.end())
		return;
	if (ctx.device)
		--ctx.device->object_counts[it->second.index()];
	ctx.objects.erase(it);
}

}  // namespace xsrc
