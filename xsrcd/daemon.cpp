#include "daemon.h"

#include <poll.h>
#include <sys/epoll.h>

#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "common/atomic.h"
#include "command_yield.h"
#include "dispatcher_handlers.h"
#include "dispatcher.h"
#include "device.h"
#include "rings.h"
#include "wire_deliver.h"
#include "xsrc-abi.h"

namespace xsrc {
namespace {

// IB_DEVICE_NAME_MAX (64) with its terminating NUL.
constexpr size_t kMaxDeviceNameLength = 63;
// Owner exits handled per wake-up of the control thread; more wait for the next.
constexpr int kOwnerExitsPerWake = 16;

// The provider claims devices by name ("rdma_device:*Nxsrc*" in its match
// table): a device that does not start with "xsrc" would have no provider.
bool valid_device_name(const std::string &name)
{
	if (name.size() > kMaxDeviceNameLength || !name.starts_with("xsrc"))
		return false;
	return std::all_of(name.begin(), name.end(), [](char c) {
		return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
	});
}

// How long a yielding command lets waiters run at most before it takes the
// lock back (new waiters may keep coming); and how it waits meanwhile.
constexpr auto kYieldAtMost = std::chrono::milliseconds(20);
constexpr auto kYieldPoll = std::chrono::microseconds(20);

// The lock of the command running on this thread, for command_yield().
struct YieldableLock {
	std::unique_lock<std::mutex> *lock;
	std::atomic<unsigned> *waiting;
};
thread_local YieldableLock *t_command_lock = nullptr;

class CommandLockScope {
public:
	explicit CommandLockScope(YieldableLock &l) { t_command_lock = &l; }
	~CommandLockScope() { t_command_lock = nullptr; }
	CommandLockScope(const CommandLockScope &) = delete;
	CommandLockScope &operator=(const CommandLockScope &) = delete;
};

// Is thread `tid` one of the threads of process `tgid`? One syscall.
bool thread_of(pid_t tid, pid_t tgid)
{
	if (tid == tgid)
		return true;
	std::string path = "/proc/" + std::to_string(tgid) + "/task/" + std::to_string(tid);
	return access(path.c_str(), F_OK) == 0;
}

// Whether the process that owns `ctx` has exited (its pidfd is readable).
bool owner_exited(const Context &ctx)
{
	if (!ctx.caller)
		return false;
	pollfd p{ctx.caller->pidfd(), POLLIN, 0};
	return ::poll(&p, 1, 0) == 1;
}

// Frees `word` if `pid` holds it.
void free_if_held_by(uint32_t &word, pid_t pid)
{
	uint32_t holder = static_cast<uint32_t>(pid);
	atomic(word).compare_exchange_strong(holder, 0u, std::memory_order_release);
}

}  // namespace

// The words `pid` held in `dev`'s arena, unless a live context has that pid
// again. The tables are found from our own records of the SRQs (laid out as
// cmd_create_srq does), not from the arena's ring headers.
void Daemon::free_lock_words(Device &dev, pid_t pid)
{
	if (!dev.arena || pid_in_use(pid))
		return;
	Arena &arena = *dev.arena;
	for (const Context *ctx : dev.contexts)
		for (const auto &[handle, obj] : ctx->objects) {
			const auto *srq = std::get_if<Srq>(&obj);
			if (!srq || srq->srq_type != IBV_SRQT_TM)
				continue;
			uint64_t table = srq->ring_off + recv_ring_bytes(srq->ring_shape);
			free_if_held_by(arena.at<xsrc_tm_table>(table).lock, pid);
		}
	for (uint32_t i = 0; i < XSRC_ATOMIC_LOCKS; ++i)
		free_if_held_by(arena.atomic_lock(i), pid);
}

bool Daemon::pid_in_use(pid_t pid) const
{
	for (const auto &[id, ctx] : contexts_)
		if (ctx->owner == pid && !owner_exited(*ctx))
			return true;
	return false;
}

// `ctx` is being released or its owner exited.
void Daemon::owner_gone(const Context &ctx)
{
	if (!ctx.device || !ctx.caller)
		return;
	if (owner_exited(ctx)) {
		free_lock_words(*ctx.device, ctx.owner);
		return;
	}
	// Released while the owner lives (or before its exit shows): its other
	// contexts, if any, are watched; else we watch on.
	for (const auto &[id, other] : contexts_)
		if (other.get() != &ctx && other->owner == ctx.owner && other->caller)
			return;
	for (const auto &[id, d] : departed_)
		if (d.caller->pid() == ctx.owner && d.device == ctx.device->name)
			return;
	auto caller = std::make_unique<ProcessCaller>(ctx.owner);
	if (!caller->valid())
		return;
	epoll_event ev{};
	ev.events = EPOLLIN;
	ev.data.u64 = ctx.id;
	if (epoll_ctl(owner_watch_.get(), EPOLL_CTL_ADD, caller->pidfd(), &ev) == 0)
		departed_[ctx.id] = Departed{std::move(caller), ctx.device->name};
}

void command_yield()
{
	YieldableLock *l = t_command_lock;
	if (!l || l->waiting->load(std::memory_order_relaxed) == 0)
		return;
	l->lock->unlock();
	// Unlocking wakes a waiter, but this thread would win the lock back
	// before it runs: wait until the waiters took it (and gave it back).
	auto until = std::chrono::steady_clock::now() + kYieldAtMost;
	while (l->waiting->load(std::memory_order_relaxed) != 0 && std::chrono::steady_clock::now() < until)
		std::this_thread::sleep_for(kYieldPoll);
	l->lock->lock();
}

std::unique_lock<std::mutex> Daemon::lock()
{
	waiting_.fetch_add(1, std::memory_order_relaxed);
	std::unique_lock lock(mu_);
	waiting_.fetch_sub(1, std::memory_order_relaxed);
	return lock;
}

Daemon::Daemon(std::string sysfs_root, std::string fuse_root, std::string shm_dir)
	: sysfs_root_(std::move(sysfs_root)), fuse_root_(std::move(fuse_root)), shm_dir_(std::move(shm_dir))
{
	owner_watch_ = unique_fd(epoll_create1(EPOLL_CLOEXEC));
}

Daemon::~Daemon()
{
	remove_all_devices();
}

void Daemon::start_wire_receiver(const std::string &name, int ifindex, int priority)
{
	int err = 0;
	// The daemon's lock is taken at the batch's first packet and held to its
	// end, so that payloads may wait for one another (WirePending) with no
	// command in between; it is let go, what waits landed, at the end and
	// before a CM MAD (the cm takes its own lock, then ours).
	// The device is looked up once per batch, under the lock that keeps it.
	struct Batch {
		std::unique_lock<std::mutex> lock;
		Device *dev = nullptr;
	};
	auto batch = std::make_shared<Batch>();
	auto finish = [batch] {
		if (!batch->lock)
			return;
		if (Device *dev = batch->dev) {
			wire_flush(*dev);
			wire_flush_responses(*dev);
			dev->wire_pending.open = false;
		}
		batch->dev = nullptr;
		batch->lock = {};
	};
	auto receiver = WireReceiver::start(
		ifindex,
		[this, name, ifindex, batch, finish](std::span<const uint8_t> packet) {
			if (gsi_hook_ && is_gsi_packet(packet)) {
				finish();
				gsi_hook_(ifindex, packet);
				return WireOutcome::delivered;
			}
			if (!batch->lock) {
				batch->lock = this->lock();
				batch->dev = find_device_locked(name);
			}
			Device *dev = batch->dev;
			if (!dev)
				return WireOutcome::dropped;
			dev->wire_pending.open = true;
			return wire_deliver(*dev, packet);
		},
		err, finish,
		[this, name]() -> uint64_t {
			// ACKs left on boards: forgotten once taken, sent once late.
			auto lock = this->lock();
			Device *dev = find_device_locked(name);
			return dev ? wire_acks_due(*dev) : 0;
		},
		priority);
	// Without CAP_NET_RAW (an unprivileged daemon, a unit test) the device
	// works on this host alone; `xsrc status` says so.
	std::lock_guard guard(wire_mu_);
	wire_receivers_[name] = std::move(receiver);
}

void Daemon::stop_wire_receiver(const std::string &name)
{
	std::unique_ptr<WireReceiver> receiver;
	{
		std::lock_guard guard(wire_mu_);
		auto it = wire_receivers_.find(name);
		if (it == wire_receivers_.end())
			return;
		receiver = std::move(it->second);
		wire_receivers_.erase(it);
	}
	// Joined here: its thread may be waiting for mu_, which we do not hold.
}

Device *Daemon::find_device_locked(const std::string &name)
{
	auto it = devices_.find(name);
	return it == devices_.end() ? nullptr : it->second.get();
}

int Daemon::add_device(const std::string &name, const std::string &netdev_name, std::string &error)
{
	if (!valid_device_name(name)) {
		error = "invalid device name '" + name + "' (xsrc followed by a-z, 0-9, '_', '-')";
		return EINVAL;
	}
	std::string ifname = netdev_name.empty() || netdev_name == "-" ? netdev_default() : netdev_name;
	NetdevInfo info;
	if (int err = netdev_read(ifname, info)) {
		error = "netdev '" + ifname + "': " + (err == ENODEV ? "no such network device" : strerror(err));
		return err;
	}

	auto lock = this->lock();
	if (Device *dev = find_device_locked(name)) {
		if (dev->netdev.name == ifname || netdev_name.empty() || netdev_name == "-")
			return EEXIST;
		error = "device " + name + " exists on netdev " + dev->netdev.name;
		return EBUSY;
	}
	std::vector<bool> used;
	for (auto &[n, d] : devices_) {
		if (used.size() <= d->uverbs_index)
			used.resize(d->uverbs_index + 1);
		used[d->uverbs_index] = true;
	}
	unsigned index = static_cast<unsigned>(std::find(used.begin(), used.end(), false) - used.begin());

	auto dev = std::make_unique<Device>();
	dev->name = name;
	dev->uverbs_index = index;
	dev->netdev = info;
	dev->view.driver_abi = XSRC_DRIVER_ABI_VERSION;  // the generation, whatever the revision
	dev->abi_revision = abi_revision_;
	dev->ack_delay_ns = ack_delay_ns_;
	dev->view.cmd_dir = fuse_root_ + "/" + name;
	refresh_device_view(*dev);
	const std::string shm_path = shm_dir_ + "/xsrc-" + name;
	if (int err = Arena::create(shm_path, dev->arena)) {
		error = "cannot create the device arena " + shm_path + ": " + strerror(err);
		return err;
	}
	dev->view.shm_path = shm_path;
	if (int err = devnode_create(index)) {
		error = std::string("cannot create /dev/infiniband/uverbs") + std::to_string(index) + ": " + strerror(err);
		return err;
	}
	if (int err = sysfs_view_write(sysfs_root_, dev->view)) {
		devnode_remove(index);
		error = std::string("cannot write the sysfs view: ") + strerror(err);
		return err;
	}
	// rdma_cm is one device for all (as the kernel's): up while any device is.
	if (int err = sysfs_view_write_cm(sysfs_root_, fuse_root_ + "/" + kCmDirName)) {
		sysfs_view_remove(sysfs_root_, dev->view);
		devnode_remove(index);
		error = std::string("cannot write the rdma_cm sysfs view: ") + strerror(err);
		return err;
	}
	int ifindex = dev->netdev.ifindex;
	devices_.emplace(name, std::move(dev));
	int priority = wire_priority_;
	lock.unlock();
	start_wire_receiver(name, ifindex, priority);
	return 0;
}

void Daemon::set_ack_delay(uint64_t ns)
{
	auto lock = this->lock();
	ack_delay_ns_ = ns;
}

void Daemon::set_wire_priority(int priority)
{
	auto lock = this->lock();
	wire_priority_ = priority;
}

int Daemon::set_abi_revision(uint32_t revision)
{
	if (revision < 1 || revision > XSRC_DRIVER_ABI_REVISION)
		return EINVAL;
	auto lock = this->lock();
	abi_revision_ = revision;
	return 0;
}

// Disassociates every context from a device that goes away, as the kernel does
// on hot-unplug: IBV_EVENT_DEVICE_FATAL, then every later command fails EIO.
void Daemon::detach_device_locked(Device &dev)
{
	for (Context *ctx : dev.contexts) {
		ctx->post_async_event(0, IBV_EVENT_DEVICE_FATAL);
		destroy_context_objects(*ctx);
		ctx->device = nullptr;
	}
	dev.contexts.clear();
	sysfs_view_remove(sysfs_root_, dev.view);
	devnode_remove(dev.uverbs_index);
}

int Daemon::remove_device(const std::string &name)
{
	std::function<void(const std::string &)> removed;
	{
		auto lock = this->lock();
		auto it = devices_.find(name);
		if (it == devices_.end())
			return ENODEV;
		detach_device_locked(*it->second);
		devices_.erase(it);
		if (devices_.empty())
			sysfs_view_remove_cm(sysfs_root_);
		removed = device_removed_;
	}
	stop_wire_receiver(name);
	if (removed)  // outside our lock: the cm asks for devices under its own
		removed(name);
	return 0;
}

void Daemon::remove_all_devices()
{
	std::vector<std::string> names;
	std::function<void(const std::string &)> removed;
	{
		auto lock = this->lock();
		for (auto &[name, dev] : devices_) {
			detach_device_locked(*dev);
			names.push_back(name);
		}
		devices_.clear();
		sysfs_view_remove_cm(sysfs_root_);
		removed = device_removed_;
	}
	for (const std::string &name : names)
		stop_wire_receiver(name);
	if (removed)
		for (const std::string &name : names)
			removed(name);
}

void Daemon::set_device_removed_hook(std::function<void(const std::string &)> hook)
{
	auto lock = this->lock();
	device_removed_ = std::move(hook);
}

std::string Daemon::status()
{
	auto lock = this->lock();
	std::ostringstream out;
	for (auto &[name, dev] : devices_) {
		size_t objects = 0;
		for (Context *ctx : dev->contexts) {
			ctx->prune_closed_channels();
			objects += ctx->object_count();
		}
		out << name << " uverbs" << dev->uverbs_index << " netdev=" << dev->netdev.name
		    << " port=" << (dev->view.port.active ? "ACTIVE" : "DOWN")
		    << " contexts=" << dev->contexts.size() << " objects=" << objects;
		std::lock_guard guard(wire_mu_);
		auto it = wire_receivers_.find(name);
		if (it != wire_receivers_.end() && it->second) {
			const WireCounters &c = it->second->counters();
			out << " wire_rx=" << c.received.load() << " wire_bad_icrc=" << c.bad_icrc.load()
			    << " wire_delivered=" << c.delivered.load() << " wire_dropped=" << c.dropped.load()
			    << " wire_gso=" << c.gso.load() << " wire_acks_left=" << dev->acks_left
			    << " wire_acks_late=" << dev->acks_late << " wire_priority=" << it->second->priority();
		} else {
			out << " wire=off";
		}
		out << "\n";
	}
	return out.str();
}

void Daemon::on_netdev_change(int ifindex)
{
	auto lock = this->lock();
	for (auto &[name, dev] : devices_) {
		if (dev->netdev.ifindex != ifindex)
			continue;
		NetdevInfo info;
		if (netdev_read(dev->netdev.name, info) || info.ifindex != ifindex) {
			info = dev->netdev;  // the netdev is gone: the port goes down
			info.oper_up = false;
		}
		bool was_active = dev->view.port.active;
		auto old_gids = dev->view.port.gids;
		dev->netdev = info;
		refresh_device_view(*dev);
		sysfs_view_write(sysfs_root_, dev->view);
		for (Context *ctx : dev->contexts) {
			if (was_active != dev->view.port.active)
				ctx->post_async_event(1, dev->view.port.active ? IBV_EVENT_PORT_ACTIVE
									       : IBV_EVENT_PORT_ERR);
			if (old_gids != dev->view.port.gids)
				ctx->post_async_event(1, IBV_EVENT_GID_CHANGE);
		}
	}
}

bool Daemon::device_exists(const std::string &name)
{
	auto lock = this->lock();
	return find_device_locked(name) != nullptr;
}

std::vector<std::string> Daemon::device_names()
{
	auto lock = this->lock();
	std::vector<std::string> names;
	for (auto &[name, dev] : devices_)
		names.push_back(name);
	return names;
}

int Daemon::open_context(const std::string &device, pid_t tid, uid_t uid, uint64_t &id)
{
	pid_t tgid = tgid_of(tid);
	if (tgid <= 0)
		return ESRCH;
	auto caller = std::make_unique<ProcessCaller>(tgid);
	if (!caller->valid())
		return ESRCH;

	auto lock = this->lock();
	Device *dev = find_device_locked(device);
	if (!dev)
		return ENODEV;
	auto ctx = std::make_unique<Context>();
	ctx->id = next_context_id_++;
	ctx->device = dev;
	ctx->owner = tgid;
	ctx->uid = uid;
	ctx->caller = std::move(caller);
	dev->contexts.push_back(ctx.get());
	id = ctx->id;
	epoll_event ev{};
	ev.events = EPOLLIN;
	ev.data.u64 = id;
	epoll_ctl(owner_watch_.get(), EPOLL_CTL_ADD, ctx->caller->pidfd(), &ev);
	contexts_.emplace(id, std::move(ctx));
	return 0;
}

int Daemon::execute(uint64_t id, pid_t tid, std::span<const std::byte> command)
{
	return run_on_context(id, tid, [&](Context &ctx, Caller &caller) { return dispatch_command(ctx, caller, command); });
}

int Daemon::execute_ioctl(uint64_t id, pid_t tid, std::span<const std::byte> header, uint64_t arg)
{
	return run_on_context(id, tid, [&](Context &ctx, Caller &caller) { return dispatch_ioctl(ctx, caller, header, arg); });
}

int Daemon::run_on_context(uint64_t id, pid_t tid, const std::function<int(Context &, Caller &)> &run)
{
	// A forked child may write to its parent's command file: it then gets
	// the responses in its own memory and its own fds are the ones taken.
	std::unique_ptr<ProcessCaller> other;
	pid_t owner;
	{
		auto lock = this->lock();
		auto it = contexts_.find(id);
		if (it == contexts_.end())
			return EBADF;
		owner = it->second->owner;
	}
	if (!thread_of(tid, owner)) {
		other = std::make_unique<ProcessCaller>(tgid_of(tid));
		if (!other->valid())
			return ESRCH;
	}

	auto lock = this->lock();
	auto it = contexts_.find(id);
	if (it == contexts_.end())
		return EBADF;
	Context &ctx = *it->second;
	// A context lives while a command on its file runs (its release waits
	// for the write), so `ctx` stays valid across command_yield().
	YieldableLock yieldable{&lock, &waiting_};
	CommandLockScope scope(yieldable);
	return run(ctx, other ? *other : *ctx.caller);
}

void Daemon::release_context(uint64_t id)
{
	auto lock = this->lock();
	auto it = contexts_.find(id);
	if (it == contexts_.end())
		return;
	Context &ctx = *it->second;
	stop_watching_owner(ctx);
	owner_gone(ctx);
	destroy_context_objects(ctx);
	if (ctx.device)
		std::erase(ctx.device->contexts, &ctx);
	contexts_.erase(it);
}

bool Daemon::context_owner(uint64_t id, uid_t &uid)
{
	auto lock = this->lock();
	auto it = contexts_.find(id);
	if (it == contexts_.end())
		return false;
	uid = it->second->uid;
	return true;
}

size_t Daemon::object_count()
{
	auto lock = this->lock();
	size_t n = 0;
	for (auto &[id, ctx] : contexts_) {
		ctx->prune_closed_channels();
		n += ctx->object_count();
	}
	return n;
}

void Daemon::stop_watching_owner(Context &ctx)
{
	if (ctx.caller)
		epoll_ctl(owner_watch_.get(), EPOLL_CTL_DEL, ctx.caller->pidfd(), nullptr);
}

void Daemon::owner_exits()
{
	epoll_event events[kOwnerExitsPerWake];
	int n = epoll_wait(owner_watch_.get(), events, kOwnerExitsPerWake, 0);
	for (int i = 0; i < n; ++i)
		on_owner_exit(events[i].data.u64);
}

void Daemon::on_owner_exit(uint64_t id)
{
	auto lock = this->lock();
	auto it = contexts_.find(id);
	if (it == contexts_.end()) {
		auto d = departed_.find(id);
		if (d == departed_.end())
			return;
		epoll_ctl(owner_watch_.get(), EPOLL_CTL_DEL, d->second.caller->pidfd(), nullptr);
		pid_t pid = d->second.caller->pid();
		Device *dev = find_device_locked(d->second.device);
		departed_.erase(d);
		if (dev)
			free_lock_words(*dev, pid);
		return;
	}
	Context &ctx = *it->second;
	stop_watching_owner(ctx);  // once: the pidfd stays readable
	if (!ctx.device)
		return;
	owner_gone(ctx);
	for (auto &[handle, obj] : ctx.objects)
		if (auto *qp = std::get_if<Qp>(&obj); qp && !qp->shared)
			qp_enter_error(ctx, *qp);
}

std::vector<CmDevice> Daemon::cm_devices()
{
	auto lock = this->lock();
	std::vector<CmDevice> out;
	for (auto &[name, dev] : devices_) {
		CmDevice d;
		d.name = name;
		d.index = dev->uverbs_index;
		d.node_guid = dev->view.node_guid;
		d.active_mtu = dev->view.port.active_mtu;
		d.netdev = dev->netdev;
		d.gids = dev->view.port.gids;
		out.push_back(std::move(d));
	}
	return out;
}

void Daemon::cm_peer_gone(const std::string &device, uint32_t qpn)
{
	auto lock = this->lock();
	Device *dev = find_device_locked(device);
	if (!dev || qpn < XSRC_QPN_BASE)
		return;
	ObjectRef ref = dev->qp_slots.find(qpn - XSRC_QPN_BASE);
	if (!ref || !ref.ctx->device)
		return;
	if (Qp *qp = lookup<Qp>(*ref.ctx, ref.handle))
		qp_enter_error(*ref.ctx, *qp);
}

}  // namespace xsrc
