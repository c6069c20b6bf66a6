#include "commands.h"

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/ib_user_verbs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <endian.h>
#include <vector>

#include "device.h"
#include "xsrc-abi.h"

namespace xsrc {
namespace {

// One decoded write(): the core payload (the kernel struct of the command),
// the driver data after it, and where the response goes.
struct Request {
	std::span<const std::byte> core;    // at least the command's core size
	std::span<const std::byte> driver;  // everything after the core struct
	uint64_t response = 0;              // caller address, 0 for none
	size_t core_resp_len = 0;           // room for the core response
	size_t resp_len = 0;                // room for core + driver response
};

template <typename T>
T load(std::span<const std::byte> bytes)
{
	T v{};
	std::memcpy(&v, bytes.data(), std::min(sizeof(T), bytes.size()));
	return v;
}

bool all_zero(std::span<const std::byte> bytes)
{
	return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

template <typename T>
std::span<const std::byte> as_bytes_of(const T &v)
{
	return {reinterpret_cast<const std::byte *>(&v), sizeof(T)};
}

// Writes core response (and driver response after it) into the caller's
// buffer, zero-filling whatever room is left, as the kernel does.
int respond(Caller &caller, const Request &req, std::span<const std::byte> core,
	    std::span<const std::byte> driver = {})
{
	if (!req.response)
		return EFAULT;
	if (req.core_resp_len < core.size())
		return ENOSPC;
	std::vector<std::byte> out(req.resp_len);
	std::memcpy(out.data(), core.data(), core.size());
	size_t drv = std::min(driver.size(), req.resp_len - core.size());
	std::memcpy(out.data() + core.size(), driver.data(), drv);
	return caller.write_memory(req.response, out);
}

// Rejects driver data a command does not define: the kernel's
// ib_is_udata_cleared discipline.
int check_no_driver_data(const Request &req)
{
	return all_zero(req.driver) ? 0 : EOPNOTSUPP;
}

template <typename T>
T *lookup(Context &ctx, uint32_t handle)
{
	auto it = ctx.objects.find(handle);
	return it == ctx.objects.end() ? nullptr : std::get_if<T>(&it->second);
}

int insert_object(Context &ctx, Object obj, uint32_t &handle)
{
	if (ctx.objects.size() >= (1u << 20))
		return ENOMEM;
	while (ctx.objects.count(ctx.next_handle))
		++ctx.next_handle;
	handle = ctx.next_handle++;
	ctx.objects.emplace(handle, std::move(obj));
	return 0;
}

size_t count_objects(const Device &dev, size_t index)
{
	size_t n = 0;
	for (const Context *c : dev.contexts)
		for (const auto &[h, o] : c->objects)
			n += o.index() == index;
	return n;
}

// Takes the daemon's copy of a pipe's write end after checking that `fds`
// names the two ends of one pipe in the caller.
int take_pipe(Caller &caller, const xsrc_fd_pair &fds, OwnedFd &wr)
{
	if (fds.rd_fd > INT32_MAX || fds.wr_fd > INT32_MAX || fds.rd_fd == fds.wr_fd)
		return EINVAL;
	OwnedFd w(caller.take_fd(static_cast<int>(fds.wr_fd)));
	if (!w)
		return EBADF;
	OwnedFd r(caller.take_fd(static_cast<int>(fds.rd_fd)));
	if (!r)
		return EBADF;
	struct stat ws, rs;
	if (fstat(w.get(), &ws) || fstat(r.get(), &rs) || !S_ISFIFO(ws.st_mode) ||
	    ws.st_ino != rs.st_ino || ws.st_dev != rs.st_dev)
		return EINVAL;
	if ((fcntl(w.get(), F_GETFL) & O_ACCMODE) != O_WRONLY ||
	    (fcntl(r.get(), F_GETFL) & O_ACCMODE) != O_RDONLY)
		return EINVAL;
	// Never let a full pipe block the daemon.
	fcntl(w.get(), F_SETFL, O_WRONLY | O_NONBLOCK);
	wr = std::move(w);
	return 0;
}

int cmd_get_context(Context &ctx, Caller &caller, const Request &req)
{
	if (ctx.initialised)
		return EINVAL;
	if (req.driver.size() < sizeof(xsrc_get_context_req))
		return EINVAL;
	auto drv = load<xsrc_get_context_req>(req.driver);
	if (drv.comp_mask)
		return EOPNOTSUPP;
	if (!all_zero(req.driver.subspan(sizeof(drv))))
		return EOPNOTSUPP;
	if (drv.num_channel_fds > XSRC_MAX_CHANNEL_FDS)
		return EINVAL;

	OwnedFd async_wr;
	if (int err = take_pipe(caller, drv.async_fds, async_wr))
		return err;
	std::deque<std::pair<int, OwnedFd>> pool;
	for (uint32_t i = 0; i < drv.num_channel_fds; ++i) {
		OwnedFd wr;
		if (int err = take_pipe(caller, drv.channel_fds[i], wr))
			return err;
		pool.emplace_back(static_cast<int>(drv.channel_fds[i].rd_fd), std::move(wr));
	}

	ib_uverbs_get_context_resp resp{};
	resp.async_fd = drv.async_fds.rd_fd;
	resp.num_comp_vectors = DeviceLimits::num_comp_vectors;
	xsrc_get_context_resp dresp{};
	dresp.driver_abi = XSRC_DRIVER_ABI_VERSION;
	dresp.context_id = ctx.id;
	dresp.max_inline_data = DeviceLimits::max_inline_data;
	dresp.channel_pool_free = static_cast<uint32_t>(pool.size());
	if (int err = respond(caller, req, as_bytes_of(resp), as_bytes_of(dresp)))
		return err;

	ctx.async_wr = std::move(async_wr);
	ctx.channel_pool = std::move(pool);
	ctx.initialised = true;
	return 0;
}

int cmd_query_device(Context &ctx, Caller &caller, const Request &req)
{
	if (int err = check_no_driver_data(req))
		return err;
	ib_uverbs_query_device_resp resp{};
	fill_query_device(*ctx.device, resp);
	return respond(caller, req, as_bytes_of(resp));
}

int cmd_ex_query_device(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_ex_query_device>(req.core);
	if (cmd.comp_mask || cmd.reserved)
		return EINVAL;
	if (int err = check_no_driver_data(req))
		return err;
	ib_uverbs_ex_query_device_resp resp{};
	fill_query_device(*ctx.device, resp.base);
	resp.device_cap_flags_ex = resp.base.device_cap_flags;
	// Older callers have less room; response_length says how much is valid.
	constexpr size_t min_len = offsetof(ib_uverbs_ex_query_device_resp, odp_caps);
	if (req.core_resp_len < min_len)
		return ENOSPC;
	resp.response_length = static_cast<uint32_t>(std::min(sizeof(resp), req.core_resp_len));
	return respond(caller, req, as_bytes_of(resp).first(resp.response_length));
}

int cmd_query_port(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_query_port>(req.core);
	if (cmd.port_num != 1)
		return EINVAL;
	if (int err = check_no_driver_data(req))
		return err;
	ib_uverbs_query_port_resp resp{};
	fill_query_port(*ctx.device, resp);
	return respond(caller, req, as_bytes_of(resp));
}

int cmd_alloc_pd(Context &ctx, Caller &caller, const Request &req)
{
	if (int err = check_no_driver_data(req))
		return err;
	if (count_objects(*ctx.device, 0) >= DeviceLimits::max_pd)
		return ENOMEM;
	ib_uverbs_alloc_pd_resp resp{};
	if (int err = insert_object(ctx, Pd{}, resp.pd_handle))
		return err;
	if (int err = respond(caller, req, as_bytes_of(resp))) {
		ctx.objects.erase(resp.pd_handle);
		return err;
	}
	return 0;
}

int cmd_dealloc_pd(Context &ctx, Caller &, const Request &req)
{
	auto cmd = load<ib_uverbs_dealloc_pd>(req.core);
	Pd *pd = lookup<Pd>(ctx, cmd.pd_handle);
	if (!pd)
		return EINVAL;
	if (pd->use_count)
		return EBUSY;
	ctx.objects.erase(cmd.pd_handle);
	return 0;
}

constexpr uint32_t kSupportedAccess =
	IB_UVERBS_ACCESS_LOCAL_WRITE | IB_UVERBS_ACCESS_REMOTE_WRITE |
	IB_UVERBS_ACCESS_REMOTE_READ | IB_UVERBS_ACCESS_REMOTE_ATOMIC |
	IB_UVERBS_ACCESS_ZERO_BASED | IB_UVERBS_ACCESS_HUGETLB |
	IB_UVERBS_ACCESS_OPTIONAL_RANGE;

int cmd_reg_mr(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_reg_mr>(req.core);
	if (int err = check_no_driver_data(req))
		return err;
	Pd *pd = lookup<Pd>(ctx, cmd.pd_handle);
	if (!pd)
		return EINVAL;
	if (cmd.access_flags & ~kSupportedAccess)
		return EOPNOTSUPP;  // memory windows, on-demand paging
	// IBTA o10-37: remote write or atomic access requires local write.
	if ((cmd.access_flags & (IB_UVERBS_ACCESS_REMOTE_WRITE | IB_UVERBS_ACCESS_REMOTE_ATOMIC)) &&
	    !(cmd.access_flags & IB_UVERBS_ACCESS_LOCAL_WRITE))
		return EINVAL;
	if (cmd.length == 0 || cmd.start + cmd.length < cmd.start)
		return EINVAL;
	Device &dev = *ctx.device;
	if (dev.mrs_by_index.size() >= DeviceLimits::max_mr)
		return ENOMEM;
	bool writable = cmd.access_flags & (IB_UVERBS_ACCESS_LOCAL_WRITE |
					    IB_UVERBS_ACCESS_REMOTE_WRITE |
					    IB_UVERBS_ACCESS_REMOTE_ATOMIC);
	if (int err = caller.check_mapped(cmd.start, cmd.length, writable))
		return err;

	// Keys are (index << 8 | salt), as HCAs build them: a stale key whose
	// index was reused by a later MR still misses.
	uint32_t index = dev.next_mr_index;
	while (dev.mrs_by_index.count(index) || index == 0 || index >= (1u << 24))
		index = index >= (1u << 24) - 1 ? 1 : index + 1;
	dev.next_mr_index = index + 1;
	uint32_t key = index << 8 | dev.key_salt++;

	Mr mr{cmd.pd_handle, cmd.start, cmd.length, cmd.hca_va, cmd.access_flags, key, key};
	ib_uverbs_reg_mr_resp resp{};
	if (int err = insert_object(ctx, mr, resp.mr_handle))
		return err;
	resp.lkey = key;
	resp.rkey = key;
	if (int err = respond(caller, req, as_bytes_of(resp))) {
		ctx.objects.erase(resp.mr_handle);
		return err;
	}
	dev.mrs_by_index[index] = lookup<Mr>(ctx, resp.mr_handle);
	++pd->use_count;
	return 0;
}

void release_mr(Context &ctx, const Mr &mr)
{
	if (ctx.device)
		ctx.device->mrs_by_index.erase(mr.lkey >> 8);
	if (Pd *pd = lookup<Pd>(ctx, mr.pd_handle))
		--pd->use_count;
}

int cmd_dereg_mr(Context &ctx, Caller &, const Request &req)
{
	auto cmd = load<ib_uverbs_dereg_mr>(req.core);
	Mr *mr = lookup<Mr>(ctx, cmd.mr_handle);
	if (!mr)
		return EINVAL;
	release_mr(ctx, *mr);
	ctx.objects.erase(cmd.mr_handle);
	return 0;
}

int cmd_create_comp_channel(Context &ctx, Caller &caller, const Request &req)
{
	if (ctx.channel_pool.empty() || ctx.channels.size() >= DeviceLimits::max_comp_channels_per_context)
		return EMFILE;
	ib_uverbs_create_comp_channel_resp resp{};
	resp.fd = static_cast<uint32_t>(ctx.channel_pool.front().first);
	if (int err = respond(caller, req, as_bytes_of(resp)))
		return err;
	auto [rd, wr] = std::move(ctx.channel_pool.front());
	ctx.channel_pool.pop_front();
	ctx.channels[rd] = Channel{std::move(wr)};
	return 0;
}

// Shared by CREATE_CQ and EX_CREATE_CQ.
int create_cq(Context &ctx, Caller &caller, const Request &req, uint64_t user_handle,
	      uint32_t cqe, uint32_t comp_vector, int32_t comp_channel, bool extended)
{
	if (cqe == 0 || cqe > DeviceLimits::max_cqe)
		return EINVAL;
	if (comp_vector >= DeviceLimits::num_comp_vectors)
		return EINVAL;
	if (comp_channel >= 0 && !ctx.channels.count(comp_channel))
		return EINVAL;
	if (comp_channel < -1)
		return EINVAL;
	if (int err = check_no_driver_data(req))
		return err;
	if (count_objects(*ctx.device, 2) >= DeviceLimits::max_cq)
		return ENOMEM;

	Cq cq{user_handle, cqe, comp_channel};
	ib_uverbs_ex_create_cq_resp resp{};
	if (int err = insert_object(ctx, cq, resp.base.cq_handle))
		return err;
	resp.base.cqe = cqe;
	xsrc_create_cq_resp dresp{};
	dresp.channel_pool_free = static_cast<uint32_t>(ctx.channel_pool.size());
	int err;
	if (extended) {
		resp.response_length = sizeof(resp);
		err = respond(caller, req, as_bytes_of(resp), as_bytes_of(dresp));
	} else {
		err = respond(caller, req, as_bytes_of(resp.base), as_bytes_of(dresp));
	}
	if (err)
		ctx.objects.erase(resp.base.cq_handle);
	return err;
}

int cmd_create_cq(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_create_cq>(req.core);
	if (cmd.reserved)
		return EINVAL;
	return create_cq(ctx, caller, req, cmd.user_handle, cmd.cqe, cmd.comp_vector,
			 cmd.comp_channel, false);
}

int cmd_ex_create_cq(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_ex_create_cq>(req.core);
	if (cmd.comp_mask || cmd.reserved)
		return EINVAL;
	if (cmd.flags & IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION)
		return EOPNOTSUPP;
	if (cmd.flags & ~static_cast<uint32_t>(IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN))
		return EOPNOTSUPP;
	return create_cq(ctx, caller, req, cmd.user_handle, cmd.cqe, cmd.comp_vector,
			 cmd.comp_channel, true);
}

int cmd_resize_cq(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_resize_cq>(req.core);
	if (int err = check_no_driver_data(req))
		return err;
	Cq *cq = lookup<Cq>(ctx, cmd.cq_handle);
	if (!cq)
		return EINVAL;
	if (cmd.cqe == 0 || cmd.cqe > DeviceLimits::max_cqe)
		return EINVAL;
	ib_uverbs_resize_cq_resp resp{};
	resp.cqe = cmd.cqe;
	if (int err = respond(caller, req, as_bytes_of(resp)))
		return err;
	cq->cqe = cmd.cqe;
	return 0;
}

int cmd_destroy_cq(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_destroy_cq>(req.core);
	Cq *cq = lookup<Cq>(ctx, cmd.cq_handle);
	if (!cq)
		return EINVAL;
	ib_uverbs_destroy_cq_resp resp{};
	resp.comp_events_reported = cq->comp_events_reported;
	resp.async_events_reported = cq->async_events_reported;
	if (int err = respond(caller, req, as_bytes_of(resp)))
		return err;
	ctx.objects.erase(cmd.cq_handle);
	return 0;
}

int cmd_req_notify_cq(Context &ctx, Caller &, const Request &req)
{
	auto cmd = load<ib_uverbs_req_notify_cq>(req.core);
	Cq *cq = lookup<Cq>(ctx, cmd.cq_handle);
	if (!cq)
		return EINVAL;
	cq->armed = true;
	cq->solicited_only = cmd.solicited_only != 0;
	return 0;
}

int cmd_channel_pool(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<xsrc_channel_pool>(req.core);
	if (cmd.comp_mask)
		return EOPNOTSUPP;
	if (cmd.reserved)
		return EINVAL;
	if (int err = check_no_driver_data(req))
		return err;
	bool query_only = cmd.fds.rd_fd == XSRC_NO_FD && cmd.fds.wr_fd == XSRC_NO_FD;
	OwnedFd wr;
	if (!query_only) {
		if (ctx.channel_pool.size() >= 4 * XSRC_MAX_CHANNEL_FDS)
			return EMFILE;
		if (int err = take_pipe(caller, cmd.fds, wr))
			return err;
	}
	xsrc_channel_pool_resp resp{};
	resp.channel_pool_free = static_cast<uint32_t>(ctx.channel_pool.size() + !query_only);
	if (int err = respond(caller, req, as_bytes_of(resp)))
		return err;
	if (!query_only)
		ctx.channel_pool.emplace_back(static_cast<int>(cmd.fds.rd_fd), std::move(wr));
	return 0;
}

using Handler = int (*)(Context &, Caller &, const Request &);

struct CommandSpec {
	Handler handler = nullptr;
	size_t core_size = 0;      // size of the command's kernel struct
	bool has_response = false; // core struct starts with the response pointer
};

template <typename T>
constexpr CommandSpec spec(Handler h, bool has_response)
{
	return {h, sizeof(T), has_response};
}

// Indexed by command number; a null handler is an unknown command.
const std::array<CommandSpec, 256> &write_commands()
{
	static const auto table = [] {
		std::array<CommandSpec, 256> t{};
		t[IB_USER_VERBS_CMD_GET_CONTEXT] = spec<ib_uverbs_get_context>(cmd_get_context, true);
		t[IB_USER_VERBS_CMD_QUERY_DEVICE] = spec<ib_uverbs_query_device>(cmd_query_device, true);
		t[IB_USER_VERBS_CMD_QUERY_PORT] = spec<ib_uverbs_query_port>(cmd_query_port, true);
		t[IB_USER_VERBS_CMD_ALLOC_PD] = spec<ib_uverbs_alloc_pd>(cmd_alloc_pd, true);
		t[IB_USER_VERBS_CMD_DEALLOC_PD] = spec<ib_uverbs_dealloc_pd>(cmd_dealloc_pd, false);
		t[IB_USER_VERBS_CMD_REG_MR] = spec<ib_uverbs_reg_mr>(cmd_reg_mr, true);
		t[IB_USER_VERBS_CMD_DEREG_MR] = spec<ib_uverbs_dereg_mr>(cmd_dereg_mr, false);
		t[IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL] =
			spec<ib_uverbs_create_comp_channel>(cmd_create_comp_channel, true);
		t[IB_USER_VERBS_CMD_CREATE_CQ] = spec<ib_uverbs_create_cq>(cmd_create_cq, true);
		t[IB_USER_VERBS_CMD_RESIZE_CQ] = spec<ib_uverbs_resize_cq>(cmd_resize_cq, true);
		t[IB_USER_VERBS_CMD_DESTROY_CQ] = spec<ib_uverbs_destroy_cq>(cmd_destroy_cq, true);
		t[IB_USER_VERBS_CMD_REQ_NOTIFY_CQ] = spec<ib_uverbs_req_notify_cq>(cmd_req_notify_cq, false);
		t[XSRC_CMD_CHANNEL_POOL] = spec<xsrc_channel_pool>(cmd_channel_pool, true);
		return t;
	}();
	return table;
}

const std::array<CommandSpec, 256> &ex_commands()
{
	static const auto table = [] {
		std::array<CommandSpec, 256> t{};
		t[IB_USER_VERBS_EX_CMD_QUERY_DEVICE] = spec<ib_uverbs_ex_query_device>(cmd_ex_query_device, true);
		t[IB_USER_VERBS_EX_CMD_CREATE_CQ] = spec<ib_uverbs_ex_create_cq>(cmd_ex_create_cq, true);
		return t;
	}();
	return table;
}

}  // namespace

int execute_command(Context &ctx, Caller &caller, std::span<const std::byte> bytes)
{
	if (bytes.size() < sizeof(ib_uverbs_cmd_hdr))
		return EINVAL;
	auto hdr = load<ib_uverbs_cmd_hdr>(bytes);
	if (hdr.command & ~(IB_USER_VERBS_CMD_FLAG_EXTENDED | IB_USER_VERBS_CMD_COMMAND_MASK))
		return EINVAL;
	uint32_t num = hdr.command & IB_USER_VERBS_CMD_COMMAND_MASK;
	bool extended = hdr.command & IB_USER_VERBS_CMD_FLAG_EXTENDED;

	Request req;
	const CommandSpec *spec;
	if (!extended) {
		if (hdr.in_words * 4u != bytes.size())
			return EINVAL;
		spec = &write_commands()[num];
		if (!spec->handler)
			return EOPNOTSUPP;
		auto payload = bytes.subspan(sizeof(hdr));
		if (payload.size() < spec->core_size)
			return EINVAL;
		req.core = payload.first(spec->core_size);
		req.driver = payload.subspan(spec->core_size);
		req.resp_len = hdr.out_words * 4u;
		req.core_resp_len = req.resp_len;
		if (spec->has_response)
			req.response = load<uint64_t>(payload);
		else if (hdr.out_words)
			return EINVAL;
	} else {
		if (bytes.size() < sizeof(hdr) + sizeof(ib_uverbs_ex_cmd_hdr))
			return EINVAL;
		auto ex = load<ib_uverbs_ex_cmd_hdr>(bytes.subspan(sizeof(hdr)));
		if (ex.cmd_hdr_reserved)
			return EINVAL;
		auto payload = bytes.subspan(sizeof(hdr) + sizeof(ex));
		size_t core_in = hdr.in_words * 8u, drv_in = ex.provider_in_words * 8u;
		if (core_in + drv_in != payload.size())
			return EINVAL;
		spec = &ex_commands()[num];
		if (!spec->handler)
			return EOPNOTSUPP;
		if (core_in < spec->core_size)
			return EINVAL;
		// A newer caller's longer core struct must be zero past what we know.
		if (!all_zero(payload.subspan(spec->core_size, core_in - spec->core_size)))
			return EOPNOTSUPP;
		req.core = payload.first(spec->core_size);
		req.driver = payload.subspan(core_in);
		req.response = ex.response;
		req.core_resp_len = hdr.out_words * 8u;
		req.resp_len = req.core_resp_len + ex.provider_out_words * 8u;
	}

	if (!ctx.device)
		return EIO;  // the device was removed under this context
	if (!ctx.initialised && !(num == IB_USER_VERBS_CMD_GET_CONTEXT && !extended))
		return EINVAL;
	return spec->handler(ctx, caller, req);
}

void destroy_context_objects(Context &ctx)
{
	for (auto &[handle, obj] : ctx.objects)
		if (auto *mr = std::get_if<Mr>(&obj); mr && ctx.device)
			ctx.device->mrs_by_index.erase(mr->lkey >> 8);
	ctx.objects.clear();
	ctx.channels.clear();
	ctx.channel_pool.clear();
	ctx.async_wr = OwnedFd();
}

void Context::post_async_event(uint64_t element, uint32_t event_type)
{
	if (!async_wr)
		return;
	ib_uverbs_async_event_desc ev{};
	ev.element = element;
	ev.event_type = event_type;
	if (write(async_wr.get(), &ev, sizeof(ev)) != sizeof(ev))
		++async_events_dropped;
}

OwnedFd &OwnedFd::operator=(OwnedFd &&o) noexcept
{
	if (this != &o) {
		if (fd_ >= 0)
			close(fd_);
		fd_ = o.release();
	}
	return *this;
}

OwnedFd::~OwnedFd()
{
	if (fd_ >= 0)
		close(fd_);
}

}  // namespace xsrc
