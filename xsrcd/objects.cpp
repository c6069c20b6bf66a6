#include "objects.h"

#include <sys/stat.h>

#include <unistd.h>

#include <cerrno>

#include "log.h"

namespace xsrc {

void Context::prune_closed_channels()
{
	if (!caller)
		return;
	for (auto it = channels.begin(); it != channels.end();) {
		unique_fd theirs(caller->take_fd(it->first));
		struct stat a, b;
		bool same = theirs && it->second.rd && fstat(theirs.get(), &a) == 0 &&
			    fstat(it->second.rd.get(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
		bool in_use = false;
		for (auto &[h, obj] : objects)
			if (auto *cq = std::get_if<Cq>(&obj); cq && cq->channel_fd == it->first)
				in_use = true;
		it = same || in_use ? std::next(it) : channels.erase(it);
	}
}

bool Context::post_async_event(uint64_t element, uint32_t event_type)
{
	ib_uverbs_async_event_desc ev{};
	ev.element = element;
	ev.event_type = event_type;
	if (!async_wr)
		return false;
	if (write(async_wr.get(), &ev, sizeof(ev)) == sizeof(ev))
		return true;
	++async_events_dropped;
	return false;
}

std::optional<uint32_t> SlotTable::allocate(ObjectRef ref)
{
	if (used_ >= size_)
		return std::nullopt;
	while (next_ < slots_.size() && slots_[next_])
		next_ = (next_ + 1) % size_;
	if (next_ == slots_.size())
		slots_.emplace_back();
	uint32_t index = next_;
	next_ = (next_ + 1) % size_;
	slots_[index] = ref;
	++used_;
	return index;
}

void SlotTable::release(uint32_t index)
{
	if (index < slots_.size() && slots_[index]) {
		slots_[index] = {};
		--used_;
	}
}

void SlotTable::rebind(uint32_t index, ObjectRef ref)
{
	if (index < slots_.size() && slots_[index] && ref)
		slots_[index] = ref;
}

int insert_object(Context &ctx, Object obj, uint32_t &handle)
{
	if (ctx.objects.size() >= DeviceLimits::max_objects_per_context)
		return refuse(ENOMEM, "limit: max_objects_per_context");
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
