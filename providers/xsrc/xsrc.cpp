// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// The xsrc device: matching and registration, device and context lifetime, and
// the pool of completion-channel pipes.
#include "xsrc.h"

#include <pthread.h>
#include <signal.h>
#include "progress.h"
#include "raw_packet.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>

int xsrc_make_pipe(pipe_fds &pipe)
{
	int fds[2];

	if (pipe2(fds, O_CLOEXEC) < 0)
		return errno;
	pipe.rd.reset(fds[0]);
	pipe.wr.reset(fds[1]);
	return 0;
}

// --- the channel pool ------------------------------------------------------

namespace {

// XSRC_CMD_CHANNEL_POOL: registers `fds` (unless both are XSRC_NO_FD) and
// learns how many registered pipes the daemon has not handed out yet.
// Returns 0 or errno.
int channel_pool_cmd(int cmd_fd, xsrc_fd_pair fds, uint32_t &free_count)
{
	xsrc_channel_pool cmd{};
	cmd.fds = fds;
	xsrc_channel_pool_resp resp{};
	if (int err = xsrc_private_command(cmd_fd, XSRC_CMD_CHANNEL_POOL, cmd, resp))
		return err;
	free_count = resp.channel_pool_free;
	return 0;
}

xsrc_fd_pair pipe_fd_pair(const pipe_fds &pipe)
{
	return {static_cast<uint32_t>(pipe.rd.get()),
		static_cast<uint32_t>(pipe.wr.get())};
}

ino_t pipe_inode(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode) ? st.st_ino : 0;
}

// Remembers a read end registered with the daemon.
void channel_pool_add(xsrc_comp_channels &channels, int fd)
{
	channels.pipes.push_back(pipe_inode(fd));
	channels.read_fds.push_back(fd);
}

// The daemon is gone, and with it the count of pipes it handed out. A
// channel the application made is destroyed before its context (libibverbs
// needs the context for that), so a registered fd that still holds the pipe
// we registered on it is one never handed out: ours to close.
void channel_pool_drain_dead(xsrc_comp_channels &channels)
{
	for (size_t i = 0; i < channels.read_fds.size(); ++i)
		if (channels.pipes[i] && pipe_inode(channels.read_fds[i]) == channels.pipes[i])
			close(channels.read_fds[i]);
	channels.read_fds.clear();
	channels.pipes.clear();
}

// Closes the registered read ends the daemon never handed out.
void channel_pool_drain(xsrc_context *ctx)
{
	std::lock_guard guard(ctx->channels.lock);
	std::vector<int> &fds = ctx->channels.read_fds;
	uint32_t free_count;

	// Without the daemon's count ours and the application's are
	// indistinguishable: leak rather than close someone else's fd, unless
	// the daemon is gone (then the pipes tell).
	if (int err = channel_pool_cmd(ctx->ibv_ctx.context.cmd_fd, {XSRC_NO_FD, XSRC_NO_FD}, free_count)) {
		if (err == ENOTCONN || err == ECONNABORTED || xsrc_device_gone(ctx))
			channel_pool_drain_dead(ctx->channels);
		return;
	}
	size_t unused = std::min<size_t>(free_count, fds.size());
	for (size_t i = fds.size() - unused; i < fds.size(); ++i)
		close(fds[i]);
	fds.resize(fds.size() - unused);
	ctx->channels.pipes.resize(fds.size());
}

} // namespace

int xsrc_channel_pool_query(int cmd_fd, uint32_t &free_count)
{
	return channel_pool_cmd(cmd_fd, {XSRC_NO_FD, XSRC_NO_FD}, free_count);
}

void xsrc_channel_pool_refill(xsrc_context *ctx, uint32_t free_now)
{
	std::lock_guard guard(ctx->channels.lock);
	std::vector<int> &fds = ctx->channels.read_fds;

	// One registration per missing pipe at most, whatever the daemon says.
	for (uint32_t count = free_now; count < XSRC_CHANNEL_POOL_TARGET;
	     ++count) {
		pipe_fds pipe;
		uint32_t free_count;

		if (xsrc_make_pipe(pipe))
			return;
		try {
			// so push_back cannot fail
			fds.reserve(fds.size() + 1);
			ctx->channels.pipes.reserve(fds.size() + 1);
		} catch (const std::bad_alloc &) {
			return;
		}
		if (channel_pool_cmd(ctx->ibv_ctx.context.cmd_fd, pipe_fd_pair(pipe),
				     free_count))
			return;
		channel_pool_add(ctx->channels, pipe.rd.release()); // the daemon took the write end
		if (free_count >= XSRC_CHANNEL_POOL_TARGET)
			return;
	}
}

// --- the context -----------------------------------------------------------

namespace {

std::atomic<unsigned int> cmd_file_seq;

// enum ibv_mtu n is 128 << n bytes.
constexpr uint32_t kMtuUnitBytes = 128;

// Creates this context's command file in the directory the daemon publishes
// in sysfs. Returns the fd, or -1 with errno set.
int context_open_cmd_file(verbs_sysfs_dev *sysfs_dev)
{
	char dir[PATH_MAX];
	char path[PATH_MAX];

	int len = ibv_read_ibdev_sysfs_file(dir, sizeof(dir), sysfs_dev, "%s",
					    XSRC_SYSFS_CMD_DIR_FILE);
	if (len <= 0) {
		if (len == 0)
			errno = ENOENT;
		return -1;
	}
	while (len > 0 && dir[len - 1] == '\n')
		dir[--len] = '\0';

	int n = snprintf(path, sizeof(path), "%s/ctx-%d-%u", dir,
			 static_cast<int>(getpid()), cmd_file_seq++);
	if (n < 0 || static_cast<size_t>(n) >= sizeof(path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	return open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
}

// Maps the device's shared-memory arena, whose path the daemon publishes in
// sysfs next to the command directory. Returns 0 or errno.
int context_map_arena(verbs_sysfs_dev *sysfs_dev, xsrc::Arena &arena)
{
	char path[PATH_MAX];
	int len = ibv_read_ibdev_sysfs_file(path, sizeof(path), sysfs_dev, "%s", XSRC_SYSFS_SHM_FILE);
	if (len <= 0)
		return len == 0 ? ENOENT : errno;
	while (len > 0 && path[len - 1] == '\n')
		path[--len] = '\0';
	xsrc::unique_fd fd(open(path, O_RDWR | O_CLOEXEC));
	if (!fd)
		return errno;
	void *base = mmap(nullptr, XSRC_ARENA_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
	if (base == MAP_FAILED)
		return errno;
	auto *hdr = static_cast<const xsrc_arena_header *>(base);
	if (hdr->magic != XSRC_ARENA_MAGIC || hdr->version != XSRC_ARENA_VERSION ||
	    hdr->size != XSRC_ARENA_SIZE || !arena.adopt(static_cast<unsigned char *>(base), XSRC_ARENA_SIZE)) {
		munmap(base, XSRC_ARENA_SIZE);
		return EPROTO;
	}
	return 0;
}

// libibverbs callocs the context: its C++ members are made here, in place,
// and context_deleter destroys them. Nothing here throws.
void xsrc_context_construct(xsrc_context *ctx) noexcept
{
	std::construct_at(&ctx->channels);
	std::construct_at(&ctx->arena);
	std::construct_at(&ctx->denied);
	std::construct_at(&ctx->local_mrs);
	std::construct_at(&ctx->odp_mrs);
	std::construct_at(&ctx->shm_maps);
	std::construct_at(&ctx->progress_lock);
	std::construct_at(&ctx->progress);
	std::construct_at(&ctx->wire_engine);
	std::construct_at(&ctx->wire_live, nullptr);
	std::construct_at(&ctx->qps_lock);
	std::construct_at(&ctx->rnr_waiting, false);
	std::construct_at(&ctx->async_wr);
	std::construct_at(&ctx->device_dead, false);
	std::construct_at(&ctx->death_watch);
	std::construct_at(&ctx->raw_lock);
	std::construct_at(&ctx->raw);
	std::construct_at(&ctx->wire);
}

// Undoes the allocation by libibverbs and the in-place construction.
struct context_deleter {
	void operator()(xsrc_context *ctx) const noexcept
	{
		int saved = errno;

		// The watch, raw receive and progress threads use cmd_fd:
		// stop them first.
		std::destroy_at(&ctx->death_watch);
		std::destroy_at(&ctx->raw);
		std::destroy_at(&ctx->raw_lock);
		std::destroy_at(&ctx->progress);
		std::destroy_at(&ctx->wire_live);
		std::destroy_at(&ctx->wire_engine);
		std::destroy_at(&ctx->wire);
		std::destroy_at(&ctx->progress_lock);
		std::destroy_at(&ctx->shm_maps);
		std::destroy_at(&ctx->odp_mrs);
		std::destroy_at(&ctx->local_mrs);
		if (ctx->arena.base)
			munmap(ctx->arena.base, ctx->arena.size);
		std::destroy_at(&ctx->denied);
		std::destroy_at(&ctx->arena);
		std::destroy_at(&ctx->channels);
		std::destroy_at(&ctx->device_dead);
		std::destroy_at(&ctx->async_wr);
		std::destroy_at(&ctx->rnr_waiting);
		std::destroy_at(&ctx->qps_lock);
		verbs_uninit_context(&ctx->ibv_ctx); // closes cmd_fd, async_fd
		free(ctx);
		errno = saved;
	}
};
using context_ptr = std::unique_ptr<xsrc_context, context_deleter>;

// libibverbs' allocation of the context on `cmd_fd` (which it takes, also
// when it fails) with our members made in place. Returns 0 or errno.
int context_alloc(ibv_device *ibdev, int cmd_fd, context_ptr &out)
{
	void *mem = _verbs_init_and_alloc_context(ibdev, cmd_fd, sizeof(xsrc_context), nullptr, RDMA_DRIVER_UNKNOWN);
	if (!mem)
		return errno;
	auto *raw = static_cast<xsrc_context *>(mem);
	xsrc_context_construct(raw);
	out.reset(raw);
	return 0;
}

// What GET_CONTEXT (or IMPORT_CONTEXT) answered, taken; then the arena,
// the port, the watch thread and the ops. Returns 0 with the context in
// `out`, or errno (the context is then freed).
int context_finish(ibv_device *ibdev, context_ptr ctx, const xsrc_get_context_resp &dresp, xsrc_context **out)
{
	verbs_context *vctx = &ctx->ibv_ctx;
	ctx->max_inline_data = dresp.max_inline_data;
	ctx->context_id = dresp.context_id;
	ctx->pid = getpid();
	ctx->direct = true;  // an r1 device: same PID namespace, as always
	ctx->can_copy = false;
	ctx->driver_abi = dresp.driver_abi;
#if XSRC_DRIVER_ABI_REVISION >= 2
	if (dresp.driver_abi >= 2 && (dresp.comp_mask & XSRC_GET_CONTEXT_RESP_MASK_CALLER)) {
		// Arena owner_pid values are pids as the device sees them; in
		// another PID namespace they name other processes here, so we
		// never touch a peer's memory ourselves there.
		ctx->pid = static_cast<pid_t>(dresp.caller_pid);
		ctx->direct = ctx->pid == getpid();
		ctx->can_copy = dresp.caps & XSRC_CAP_COPY;
	}
#endif
	int err;
	if ((err = context_map_arena(to_xsrc_dev(ibdev)->sysfs_dev, ctx->arena))) {
		verbs_err(vctx, "cannot map the device arena (%s %s): %s\n",
			  XSRC_SYSFS_SHM_FILE, err == EPROTO ? "has another magic, version or size" : "failed",
			  strerror(err));
		return err;
	}
#if XSRC_DRIVER_ABI_REVISION >= 3
	// Multicast came with revision 3; an older daemon's arena has no table.
	if (dresp.driver_abi >= 3)
		ctx->mcast = ctx->arena.mcast_table();
#endif
#if XSRC_DRIVER_ABI_REVISION >= 10
	// Our room for cq_head_mode told the daemon we check a full-looking CQ
	// against its slots; an older daemon leaves it 0 (exact heads).
	if (dresp.driver_abi >= 10 && dresp.cq_head_mode == XSRC_CQ_HEAD_LAZY)
		ctx->cq_eager_heads = &ctx->arena.header().eager_heads;
#endif
	ibv_port_attr port{};
	struct ibv_query_port qcmd{};
	if ((err = ibv_cmd_query_port(&ctx->ibv_ctx.context, 1, &port, &qcmd, sizeof(qcmd)))) {
		verbs_err(vctx, "the device refused QUERY_PORT 1: %s\n", strerror(err));
		return err;
	}
	ctx->port_mtu_bytes = kMtuUnitBytes << port.active_mtu;
	ctx->transport = &xsrc_shm_transport;

	if ((err = xsrc_death_watch_start(ctx.get()))) {
		verbs_err(vctx, "cannot start the device watch thread: %s\n", strerror(err));
		return err;
	}
	verbs_set_ops(&ctx->ibv_ctx, &xsrc_ctx_ops);
	*out = ctx.release();
	return 0;
}

// Returns 0 or errno. Owns cmd_fd from the start: on failure it is closed.
int context_create(ibv_device *ibdev, int cmd_fd_arg, xsrc_context **out)
{
	xsrc::unique_fd cmd_fd(cmd_fd_arg);
	xsrc::unique_fd cmd_file(context_open_cmd_file(to_xsrc_dev(ibdev)->sysfs_dev));

	if (!cmd_file) {
		int err = errno;
		verbs_err_dev(ibdev, "cannot create a command file: %s\n", strerror(err));
		return err;
	}
	// Before the context exists: its ioctl probe must reach the daemon.
	if (dup3(cmd_file.get(), cmd_fd.get(), O_CLOEXEC) < 0) {
		int err = errno;
		verbs_err_dev(ibdev, "cannot put the command file on cmd_fd: %s\n", strerror(err));
		return err;
	}
	cmd_file.reset();

	context_ptr ctx;
	if (int err = context_alloc(ibdev, cmd_fd.release(), ctx))
		return err;
	verbs_context *vctx = &ctx->ibv_ctx;

	pipe_fds async_pipe;
	std::array<pipe_fds, XSRC_CHANNEL_POOL_TARGET> channel_pipes;
	int err = xsrc_make_pipe(async_pipe);
	for (size_t i = 0; !err && i < channel_pipes.size(); ++i)
		err = xsrc_make_pipe(channel_pipes[i]);
	if (err) {
		verbs_err(vctx, "cannot make the event pipes: %s\n", strerror(err));
		return err;
	}
	try {
		ctx->channels.read_fds.reserve(channel_pipes.size());
		ctx->channels.pipes.reserve(channel_pipes.size());
	} catch (const std::bad_alloc &) {
		verbs_err(vctx, "no memory for %zu channel fds\n", channel_pipes.size());
		return ENOMEM;
	}

	verbs_drv_buf<struct ibv_get_context, xsrc_get_context_req> cmd;
	verbs_drv_buf<ib_uverbs_get_context_resp, xsrc_get_context_resp> resp;
	xsrc_get_context_req &req = cmd.driver();
	req.num_channel_fds = channel_pipes.size();
	req.async_fds = pipe_fd_pair(async_pipe);
	for (size_t i = 0; i < channel_pipes.size(); ++i)
		req.channel_fds[i] = pipe_fd_pair(channel_pipes[i]);

	if ((err = ibv_cmd_get_context(&ctx->ibv_ctx, cmd.core(), cmd.size, resp.core(), resp.size))) {
		verbs_err(vctx, "the device refused GET_CONTEXT: %s\n", strerror(err));
		return err;
	}
	// libibverbs took async_fd from the response: it must be our pipe.
	if (ctx->ibv_ctx.context.async_fd != async_pipe.rd.get()) {
		verbs_err(vctx, "GET_CONTEXT answered async_fd %d, not our pipe %d\n",
			  ctx->ibv_ctx.context.async_fd, async_pipe.rd.get());
		ctx->ibv_ctx.context.async_fd = -1;
		return EPROTO;
	}
	async_pipe.rd.release();
	// The async pipe's write end stays ours too: when the daemon dies its
	// readers get DEVICE_FATAL from us, not an end of file. The channel
	// pipes' write ends close on return; the daemon has its own copies, and
	// their closing with it is what wakes a CQ event sleeper then.
	ctx->async_wr = std::move(async_pipe.wr);
	for (pipe_fds &pipe : channel_pipes)
		channel_pool_add(ctx->channels, pipe.rd.release());
	return context_finish(ibdev, std::move(ctx), resp.driver(), out);
}

#if XSRC_DRIVER_ABI_REVISION >= 6
// An imported context (ibv_import_device): a second context on a command
// file whose context exists. It takes the device's answer of GET_CONTEXT
// through XSRC_CMD_IMPORT_CONTEXT, and a pipe of its own for async events,
// which libibverbs' ASYNC_EVENT_ALLOC ioctl then hands back to it as
// async_fd. It registers no channel pipes: a completion channel made on it
// comes out of the pool of the context it shares the command file with.
int context_import(ibv_device *ibdev, int cmd_fd, xsrc_context **out)
{
	context_ptr ctx;
	if (int err = context_alloc(ibdev, cmd_fd, ctx))
		return err;
	verbs_context *vctx = &ctx->ibv_ctx;

	pipe_fds async_pipe;
	if (int err = xsrc_make_pipe(async_pipe)) {
		verbs_err(vctx, "import_context: cannot make the async pipe: %s\n", strerror(err));
		return err;
	}
	xsrc_import_context cmd{};
	cmd.async_fds = pipe_fd_pair(async_pipe);
	xsrc_get_context_resp dresp{};
	if (int err = xsrc_private_command(cmd_fd, XSRC_CMD_IMPORT_CONTEXT, cmd, dresp)) {
		// EOPNOTSUPP from a daemon older than revision 6: no import there.
		verbs_err(vctx, "import_context: the device refused: %s\n", strerror(err));
		return err;
	}
	ctx->ibv_ctx.context.async_fd = async_pipe.rd.release();
	ctx->async_wr = std::move(async_pipe.wr);
	return context_finish(ibdev, std::move(ctx), dresp, out);
}
#endif

// xsrc_boundary() before there is a context to log with.
template <typename Body>
int xsrc_boundary_dev(ibv_device *ibdev, Body &&body) noexcept
{
	try {
		return body();
	} catch (...) {
		int err = xsrc_errno_of_current_exception();
		verbs_err_dev(ibdev, "alloc_context: failed: %s\n", strerror(err));
		return err;
	}
}

verbs_context *xsrc_alloc_context(ibv_device *ibdev, int cmd_fd,
				  void * /* private_data */)
{
	xsrc_context *ctx = nullptr;

	if (int err = xsrc_boundary_dev(ibdev, [&] { return context_create(ibdev, cmd_fd, &ctx); })) {
		errno = err;
		return nullptr;
	}
	return &ctx->ibv_ctx;
}

#if XSRC_DRIVER_ABI_REVISION >= 6
verbs_context *xsrc_import_context(ibv_device *ibdev, int cmd_fd)
{
	xsrc_context *ctx = nullptr;
	if (int err = xsrc_boundary_dev(ibdev, [&] { return context_import(ibdev, cmd_fd, &ctx); })) {
		errno = err;
		return nullptr;
	}
	return &ctx->ibv_ctx;
}
#endif

} // namespace

void xsrc_free_context(ibv_context *ibctx)
{
	xsrc_context *ctx = to_xsrc_ctx(ibctx);

	channel_pool_drain(ctx);
	context_deleter{}(ctx);
}

int xsrc_start_thread(pthread_t &thread, void *(*main)(void *), void *arg) noexcept
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int err = pthread_create(&thread, nullptr, main, arg);
	pthread_sigmask(SIG_SETMASK, &old, nullptr);
	return err;
}

void xsrc_context_raise_event(xsrc_context *ctx, uint32_t kind, uint64_t object) noexcept
{
	struct {
		ib_uverbs_cmd_hdr hdr;
		xsrc_raise_event body;
	} cmd{};
	xsrc_cmd_header(cmd.hdr, XSRC_CMD_RAISE_EVENT, sizeof(cmd), 0);
	cmd.body.kind = kind;
	cmd.body.object = object;
	int saved = errno;
	if (write(ctx->ibv_ctx.context.cmd_fd, &cmd, sizeof(cmd)) < 0) {
		// The daemon is gone or refused: nothing more a data path can do.
	}
	errno = saved;
}

// --- the device ------------------------------------------------------------

namespace {

verbs_device *xsrc_alloc_device(verbs_sysfs_dev *sysfs_dev)
{
	auto *dev = new (std::nothrow) xsrc_device{};

	if (!dev)
		return nullptr;
	dev->sysfs_dev = sysfs_dev;
	return &dev->ibv_dev;
}

void xsrc_uninit_device(verbs_device *vdev)
{
	delete to_xsrc_dev(&vdev->device);
}

// xsrc devices have no parent bus device: match the device name.
const verbs_match_ent xsrc_match_table[] = {
	{.u = {.modalias = "rdma_device:*Nxsrc*"},
	 .kind = VERBS_MATCH_MODALIAS},
	{},
};

const verbs_device_ops xsrc_dev_ops = {
	.name = "xsrc",
	.match_min_abi_version = XSRC_DRIVER_ABI_MIN_VERSION,
	.match_max_abi_version = XSRC_DRIVER_ABI_VERSION,
	.match_table = xsrc_match_table,
	.alloc_context = xsrc_alloc_context,
#if XSRC_DRIVER_ABI_REVISION >= 6
	.import_context = xsrc_import_context,
#endif
	.alloc_device = xsrc_alloc_device,
	.uninit_device = xsrc_uninit_device,
};

// Runs at dlopen(); the library exports no symbols.
__attribute__((constructor)) void xsrc_register_driver()
{
	verbs_register_driver_34(&xsrc_dev_ops);
}

} // namespace
