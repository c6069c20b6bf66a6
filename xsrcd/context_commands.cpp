// Context-level commands: GET_CONTEXT, device and port queries, completion
// channels and the channel-pipe pool.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>

#include "common/ring_ops.h"
#include "dispatcher_handlers.h"
#include "device.h"
#include "rings.h"
#include "xsrc-abi.h"

namespace xsrc {
namespace {

// Channel pipes a context may register ahead (XSRC_CMD_CHANNEL_POOL).
constexpr size_t kMaxPooledChannels = 4 * XSRC_MAX_CHANNEL_FDS;

// Takes the daemon's copy of a pipe's write end after checking that `fds`
// names the two ends of one pipe in the caller.
int take_pipe(Caller &caller, const xsrc_fd_pair &fds, unique_fd &wr, unique_fd *rd = nullptr)
{
	if (fds.rd_fd > INT32_MAX || fds.wr_fd > INT32_MAX || fds.rd_fd == fds.wr_fd)
		return refuse(EINVAL, "bad fd numbers of a pipe");
	unique_fd w(caller.take_fd(static_cast<int>(fds.wr_fd)));
	if (!w)
		return refuse(EBADF, "the caller has no such pipe write fd");
	unique_fd r(caller.take_fd(static_cast<int>(fds.rd_fd)));
	if (!r)
		return refuse(EBADF, "the caller has no such pipe read fd");
	struct stat ws, rs;
	if (fstat(w.get(), &ws) || fstat(r.get(), &rs) || !S_ISFIFO(ws.st_mode) ||
	    ws.st_ino != rs.st_ino || ws.st_dev != rs.st_dev)
		return refuse(EINVAL, "the two fds are not the ends of one pipe");
	if ((fcntl(w.get(), F_GETFL) & O_ACCMODE) != O_WRONLY ||
	    (fcntl(r.get(), F_GETFL) & O_ACCMODE) != O_RDONLY)
		return refuse(EINVAL, "the pipe's fds are not open for reading and writing");
	// Never let a full pipe block the daemon.
	fcntl(w.get(), F_SETFL, O_WRONLY | O_NONBLOCK);
	wr = std::move(w);
	if (rd)
		*rd = std::move(r);  // never O_NONBLOCK: that flag is shared with the application
	return 0;
}

// What a device serving the context's revision writes of the driver
// response: an r1 daemon knew nothing past channel_pool_free. (respond()
// zero-fills the rest of the caller's room, as an r1 daemon did.)
std::span<const std::byte> get_context_resp_bytes(const Context &ctx, xsrc_get_context_resp &dresp)
{
	if (abi_revision(ctx) >= 10)
		return as_bytes_of(dresp);
	dresp.cq_head_mode = XSRC_CQ_HEAD_EXACT;
	if (abi_revision(ctx) >= 2)
		return as_bytes_of(dresp).first(offsetof(xsrc_get_context_resp, cq_head_mode));
	dresp.comp_mask &= ~static_cast<uint32_t>(XSRC_GET_CONTEXT_RESP_MASK_CALLER);
	return as_bytes_of(dresp).first(offsetof(xsrc_get_context_resp, caller_pid));
}

// What GET_CONTEXT (and IMPORT_CONTEXT) tell the provider of the context.
xsrc_get_context_resp context_resp(const Context &ctx, const Caller &caller)
{
	xsrc_get_context_resp dresp{};
	dresp.driver_abi = abi_revision(ctx);
	dresp.context_id = ctx.id;
	dresp.max_inline_data = DeviceLimits::max_inline_data;
	dresp.channel_pool_free = static_cast<uint32_t>(ctx.channel_pool.size());
	// r2: who the caller is to the device (a provider in another PID
	// namespace sees another pid) and that XSRC_CMD_COPY moves bytes for it.
	dresp.comp_mask = XSRC_GET_CONTEXT_RESP_MASK_CALLER;
	dresp.caller_pid = static_cast<uint32_t>(caller.pid());
	dresp.caller_uid = static_cast<uint32_t>(ctx.uid);
	dresp.caps = XSRC_CAP_COPY;
	dresp.cq_head_mode = XSRC_CQ_HEAD_LAZY;  // r10
	return dresp;
}

// Does the provider behind a GET_CONTEXT or IMPORT_CONTEXT check a CQ that
// looks full against its slots (r10)? It says so by the room it gives for
// the driver response: an older one has none for cq_head_mode.
bool reads_lazy_cq_heads(const Context &ctx, size_t driver_resp_room)
{
	return abi_revision(ctx) >= 10 && driver_resp_room >= sizeof(xsrc_get_context_resp);
}

// The arena header's count of contexts that trust CQ heads (r10).
std::atomic_ref<uint32_t> eager_heads(Arena &arena)
{
	return atomic(arena.at<xsrc_arena_header>(0).eager_heads);
}

// A context whose provider trusts CQ heads: counted in the arena header
// (every consumer then publishes its head at every poll), and when the
// count leaves 0 every ring's head is first brought up to what its slots
// say (xsrc-queues.h, xsrc_cq_ring).
void count_eager_cq_heads(Context &ctx)
{
	if (ctx.eager_cq_heads || !ctx.device || !ctx.device->arena)
		return;
	ctx.eager_cq_heads = true;
	Arena &arena = *ctx.device->arena;
	if (eager_heads(arena).fetch_add(1, std::memory_order_seq_cst) != 0)
		return;
	std::atomic_thread_fence(std::memory_order_seq_cst);
	// By the shapes we made the rings with (their headers are anyone's to write).
	auto catch_up = [&arena](uint64_t off, uint32_t entries) {
		cq_catch_up_head(&arena.at<xsrc_cq_ring>(off), cq_ring_shape(entries, 0));
	};
	for (Context *c : ctx.device->contexts) {
		for (auto &entry : c->objects) {
			if (auto *cq = std::get_if<Cq>(&entry.second)) {
				catch_up(cq->ring_off, cq->ring_entries);
				for (const Cq::Retired &r : cq->retired_rings)
					catch_up(r.off, r.entries);
			}
		}
	}
}

// A private command's comp_mask (none defined), reserved word and driver
// data (none): EOPNOTSUPP, EINVAL, EOPNOTSUPP when set.
int check_private_command(uint32_t comp_mask, uint32_t reserved, const Request &req)
{
	if (int err = check_comp_mask(comp_mask, 0))
		return err;
	if (reserved)
		return refuse(EINVAL, "non-zero reserved field");
	return check_no_driver_data(req);
}

}  // namespace

void uncount_eager_cq_heads(Context &ctx)
{
	if (ctx.eager_cq_heads && ctx.device && ctx.device->arena)
		eager_heads(*ctx.device->arena).fetch_sub(1, std::memory_order_release);
	ctx.eager_cq_heads = false;
}

int cmd_get_context(Context &ctx, Caller &caller, const Request &req)
{
	if (ctx.initialised)
		return refuse(EINVAL, "GET_CONTEXT again on an initialised context");
	xsrc_get_context_req drv;
	if (int err = load_driver_request(req, drv))
		return err;
	if (int err = check_comp_mask(drv.comp_mask, XSRC_GET_CONTEXT_REQ_MASK_ALL))
		return err;
	if (drv.num_channel_fds > XSRC_MAX_CHANNEL_FDS)
		return refuse(EINVAL, "limit: more than XSRC_MAX_CHANNEL_FDS channel pipes");

	unique_fd async_wr, async_rd;
	if (int err = take_pipe(caller, drv.async_fds, async_wr, &async_rd))
		return err;
	std::deque<std::pair<int, Channel>> pool;
	for (uint32_t i = 0; i < drv.num_channel_fds; ++i) {
		unique_fd wr;
		unique_fd rd;
		if (int err = take_pipe(caller, drv.channel_fds[i], wr, &rd))
			return err;
		pool.emplace_back(static_cast<int>(drv.channel_fds[i].rd_fd), Channel{std::move(wr), std::move(rd)});
	}

	ib_uverbs_get_context_resp resp{};
	resp.async_fd = drv.async_fds.rd_fd;
	resp.num_comp_vectors = DeviceLimits::num_comp_vectors;
	xsrc_get_context_resp dresp = context_resp(ctx, caller);
	dresp.channel_pool_free = static_cast<uint32_t>(pool.size());
	if (int err = respond(caller, req, as_bytes_of(resp), get_context_resp_bytes(ctx, dresp)))
		return err;
	size_t core_room = sizeof(resp);
	if (!reads_lazy_cq_heads(ctx, req.resp_len > core_room ? req.resp_len - core_room : 0))
		count_eager_cq_heads(ctx);

	ctx.async_wr = std::move(async_wr);
	ctx.async_rd = std::move(async_rd);
	ctx.channel_pool = std::move(pool);
	ctx.initialised = true;
	return 0;
}

int cmd_import_context(Context &ctx, Caller &caller, const Request &req)
{
	if (!ctx.initialised)
		return refuse(EINVAL, "IMPORT_CONTEXT before GET_CONTEXT");
	auto cmd = load<xsrc_import_context>(req.core);
	if (int err = check_private_command(cmd.comp_mask, cmd.reserved, req))
		return err;
	// The response as revision 6 knew it; cq_head_mode (r10) is optional.
	if (req.resp_len < offsetof(xsrc_get_context_resp, cq_head_mode))
		return refuse(ENOSPC, "no room for the response");
	// Checked as GET_CONTEXT checks its pipe; the caller keeps both ends
	// (it raises its own DEVICE_FATAL there), so our copies go again.
	unique_fd wr, rd;
	if (int err = take_pipe(caller, cmd.async_fds, wr, &rd))
		return err;
	xsrc_get_context_resp dresp = context_resp(ctx, caller);
	if (int err = respond(caller, req, get_context_resp_bytes(ctx, dresp)))
		return err;
	// The importer may run another provider than the context's creator.
	if (!reads_lazy_cq_heads(ctx, req.resp_len))
		count_eager_cq_heads(ctx);
	ctx.import_async = Context::ImportedAsync{caller.pid(), static_cast<int>(cmd.async_fds.rd_fd)};
	ctx.imported = true;
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
		return refuse(EINVAL, "non-zero comp_mask or reserved field");
	if (int err = check_no_driver_data(req))
		return err;
	ib_uverbs_ex_query_device_resp resp{};
	fill_query_device(*ctx.device, resp.base);
	resp.device_cap_flags_ex = resp.base.device_cap_flags;
	// IBV_WR_ATOMIC_WRITE came with revision 4's providers. The bit is the
	// kernel's IB_UVERBS_DEVICE_ATOMIC_WRITE (Linux 6.2; newer than Debian's header).
	constexpr uint64_t kDeviceAtomicWrite = 1ULL << 40;
	if (abi_revision(ctx) >= 4)
		resp.device_cap_flags_ex |= kDeviceAtomicWrite;
	resp.timestamp_mask = UINT64_MAX;  // a 64-bit nanosecond count
	resp.hca_core_clock = XSRC_CORE_CLOCK_KHZ;
	fill_odp_caps(*ctx.device, resp);
	fill_tm_caps(*ctx.device, resp);
	// Older callers have less room; response_length says how much is valid.
	constexpr size_t min_len = offsetof(ib_uverbs_ex_query_device_resp, odp_caps);
	if (req.core_resp_len < min_len)
		return refuse(ENOSPC, "no room for the response");
	resp.response_length = static_cast<uint32_t>(std::min(sizeof(resp), req.core_resp_len));
	return respond(caller, req, as_bytes_of(resp).first(resp.response_length));
}

int cmd_query_port(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_query_port>(req.core);
	if (cmd.port_num != 1)
		return refuse(EINVAL, "no such port");
	if (int err = check_no_driver_data(req))
		return err;
	ib_uverbs_query_port_resp resp{};
	fill_query_port(*ctx.device, resp);
	return respond(caller, req, as_bytes_of(resp));
}

int cmd_create_comp_channel(Context &ctx, Caller &caller, const Request &req)
{
	if (ctx.channel_pool.empty() || ctx.channels.size() >= DeviceLimits::max_comp_channels_per_context)
		return refuse(EMFILE, "limit: no channel pipe left, or max_comp_channels_per_context reached");
	ib_uverbs_create_comp_channel_resp resp{};
	resp.fd = static_cast<uint32_t>(ctx.channel_pool.front().first);
	if (int err = respond(caller, req, as_bytes_of(resp)))
		return err;
	auto [rd, channel] = std::move(ctx.channel_pool.front());
	ctx.channel_pool.pop_front();
	ctx.channels[rd] = std::move(channel);
	return 0;
}

int cmd_channel_pool(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<xsrc_channel_pool>(req.core);
	if (int err = check_private_command(cmd.comp_mask, cmd.reserved, req))
		return err;
	bool query_only = cmd.fds.rd_fd == XSRC_NO_FD && cmd.fds.wr_fd == XSRC_NO_FD;
	unique_fd wr, rd;
	if (!query_only) {
		if (ctx.channel_pool.size() >= kMaxPooledChannels)
			return refuse(EMFILE, "limit: the channel pipe pool is full");
		if (int err = take_pipe(caller, cmd.fds, wr, &rd))
			return err;
	}
	xsrc_channel_pool_resp resp{};
	resp.channel_pool_free = static_cast<uint32_t>(ctx.channel_pool.size() + !query_only);
	if (int err = respond(caller, req, as_bytes_of(resp)))
		return err;
	if (!query_only)
		ctx.channel_pool.emplace_back(static_cast<int>(cmd.fds.rd_fd), Channel{std::move(wr), std::move(rd)});
	return 0;
}

constexpr int kWireResponseBufferBytes = 16 << 20;

int cmd_wire_responses(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<xsrc_wire_responses>(req.core);
	// Batches came within revision 10: a daemon serving an older one
	// refuses the bit, as the daemons of those revisions did.
	// The ACK board came later within revision 10, without a new revision.
	if (int err = check_comp_mask(cmd.comp_mask, abi_revision(ctx) >= 10 ? XSRC_WIRE_RESPONSES_BATCHED |
										  XSRC_WIRE_RESPONSES_ACK_BOARD
									: 0))
		return err;
	if (int err = check_no_driver_data(req))
		return err;
	if (cmd.fd > INT32_MAX)
		return refuse(EINVAL, "bad fd number of the response socket");
	if (!(cmd.comp_mask & XSRC_WIRE_RESPONSES_ACK_BOARD) && (cmd.board_fd || cmd.board_entries))
		return refuse(EINVAL, "board fields without XSRC_WIRE_RESPONSES_ACK_BOARD");
	unique_fd fd(caller.take_fd(static_cast<int>(cmd.fd)));
	if (!fd)
		return refuse(EBADF, "the caller has no such fd");
	std::shared_ptr<AckBoard> board;
	if (cmd.comp_mask & XSRC_WIRE_RESPONSES_ACK_BOARD) {
		uint32_t n = cmd.board_entries;
		if (cmd.board_fd > INT32_MAX || !n || (n & (n - 1)) || n > XSRC_ACK_BOARD_MAX)
			return refuse(EINVAL, "bad ACK board: fd number, or entries not a power of two up to the maximum");
		unique_fd board_fd(caller.take_fd(static_cast<int>(cmd.board_fd)));
		if (!board_fd)
			return refuse(EBADF, "the caller has no such fd (ACK board)");
		int err = 0;
		if (!(board = AckBoard::map(board_fd.get(), n, err)))
			return refuse(err, "the ACK board is not a memfd sealed against shrinking, of its entries' size");
	}
	int type = 0, domain = 0;
	socklen_t len = sizeof(type);
	if (getsockopt(fd.get(), SOL_SOCKET, SO_TYPE, &type, &len) || type != SOCK_SEQPACKET ||
	    (len = sizeof(domain), getsockopt(fd.get(), SOL_SOCKET, SO_DOMAIN, &domain, &len)) || domain != AF_UNIX)
		return refuse(EINVAL, "the response fd is not an AF_UNIX SOCK_SEQPACKET socket");
	// Room for the READ responses of a requester's window (a response that
	// does not fit is lost, and costs the requester its ACK timeout): past
	// wmem_max, which caps what the provider could ask for our end.
	int bytes = kWireResponseBufferBytes;
	(void)setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof(bytes));
	ctx.wire_responses = std::move(fd);
	ctx.wire_batched = cmd.comp_mask & XSRC_WIRE_RESPONSES_BATCHED;
	ctx.ack_board = std::move(board);
	return 0;
}

}  // namespace xsrc
