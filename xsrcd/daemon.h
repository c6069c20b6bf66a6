// The daemon's state: devices, their contexts and objects, behind one lock.
// The FUSE front end, the control socket and the netdev monitor all call in
// here; nothing in here blocks on a client.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cm.h"
#include "objects.h"
#include "wire_receiver.h"

namespace xsrc {

inline constexpr const char *kDefaultShmDir = "/dev/shm";

class Daemon : public CmHost {
public:
	// Device arenas are created in `shm_dir` as xsrc-<device>.
	Daemon(std::string sysfs_root, std::string fuse_root, std::string shm_dir = kDefaultShmDir);
	~Daemon();

	// Devices (the control socket). add_device: 0 when created, EEXIST when a
	// device of that name is already bound to that netdev (harmless), another
	// errno with `error` set otherwise.
	int add_device(const std::string &name, const std::string &netdev, std::string &error);
	int remove_device(const std::string &name);
	void remove_all_devices();
	// The driver ABI revision devices added from now on serve (xsrcd --abi):
	// 1 ..XSRC_DRIVER_ABI_REVISION; EINVAL otherwise.
	int set_abi_revision(uint32_t revision);
	// How long an ACK may wait on its owner's board (devices made later).
	void set_ack_delay(uint64_t ns);
	// The SCHED_FIFO priority of the wire receivers started from now on
	// (xsrcd --wire-priority; 0: the normal policy).
	void set_wire_priority(int priority);
	static constexpr int kDefaultWirePriority = 1;
	std::string status();
	void on_netdev_change(int ifindex);

	// Contexts (the FUSE front end). `tid` is the calling thread.
	bool device_exists(const std::string &name);
	std::vector<std::string> device_names();
	int open_context(const std::string &device, pid_t tid, uid_t uid, uint64_t &id);
	int execute(uint64_t id, pid_t tid, std::span<const std::byte> command);
	// An RDMA_VERBS_IOCTL on the command file (dispatch_ioctl).
	int execute_ioctl(uint64_t id, pid_t tid, std::span<const std::byte> header, uint64_t arg);
	void release_context(uint64_t id);
	bool context_owner(uint64_t id, uid_t &uid);

	size_t object_count();  // every object of every context, for tests

	// Called with the device's name after it was removed (the cm tells its ids).
	void set_device_removed_hook(std::function<void(const std::string &)> hook);
	// Where the wire's QP1 (GSI) packets go: the cm, with the netdev they
	// came in on. Set before any device exists, cleared after the last.
	using GsiHook = std::function<void(int ifindex, std::span<const uint8_t> ip_packet)>;
	void set_gsi_hook(GsiHook hook) { gsi_hook_ = std::move(hook); }

	// The connection manager's view (CmHost).
	std::vector<CmDevice> cm_devices() override;
	void cm_peer_gone(const std::string &device, uint32_t qpn) override;
	Neighbour cm_neighbour(int ifindex, const sockaddr_storage &dst) override { return neighbour_of(ifindex, dst); }

	// The owner of a context exited while its command file lives on (a child
	// holds it): its memory is gone, so its QPs go to error and peers see
	// them unreachable. The owner watch calls this.
	void on_owner_exit(uint64_t id);
	// An epoll fd that becomes readable when some context's owner exits;
	// drain it with owner_exits().
	int owner_watch_fd() const { return owner_watch_.get(); }
	void owner_exits();

private:
	// Lock words in the arena (TM tag tables, atomics locks) hold pids that
	// a provider in another PID namespace cannot test (common/pid_lock.h):
	// once a context's owner exited we free the words it held. A context
	// released before its owner's exit shows (fds close first as a process
	// dies) leaves its owner's pidfd watched in departed_ until then.
	// Under the lock.
	void owner_gone(const Context &ctx);
	void free_lock_words(Device &dev, pid_t pid);
	bool pid_in_use(pid_t pid) const;  // by a context whose owner lives: reused
	struct Departed {
		std::unique_ptr<ProcessCaller> caller;
		std::string device;
	};
	std::map<uint64_t, Departed> departed_;  // by the released context's id
	// Runs `run` on context `id` for the calling thread `tid`, under the
	// daemon's lock (yieldable); the caller is the context's owner, or the
	// thread's own process (a forked child).
	int run_on_context(uint64_t id, pid_t tid, const std::function<int(Context &, Caller &)> &run);
	// mu_, counted while waited for (command_yield() lets waiters in).
	std::unique_lock<std::mutex> lock();
	Device *find_device_locked(const std::string &name);
	void stop_watching_owner(Context &ctx);
	void detach_device_locked(Device &dev);
	// RoCE v2 from the device's netdev (wire_receiver.h): started with the
	// device, stopped after it is gone (outside mu_: its thread takes mu_).
	void start_wire_receiver(const std::string &name, int ifindex, int priority);
	void stop_wire_receiver(const std::string &name);

	std::mutex mu_;
	std::atomic<unsigned> waiting_{0};  // threads blocked in lock()
	std::string sysfs_root_;
	std::string fuse_root_;
	std::string shm_dir_;
	std::map<std::string, std::unique_ptr<Device>> devices_;
	std::map<uint64_t, std::unique_ptr<Context>> contexts_;
	uint64_t next_context_id_ = 1;
	uint32_t abi_revision_ = XSRC_DRIVER_ABI_REVISION;
	uint64_t ack_delay_ns_ = Device::kDefaultAckDelayNs;
	int wire_priority_ = kDefaultWirePriority;
	unique_fd owner_watch_;  // epoll over the owners' pidfds
	std::function<void(const std::string &)> device_removed_;
	GsiHook gsi_hook_;
	std::mutex wire_mu_;  // taken after mu_, never before it
	std::map<std::string, std::unique_ptr<WireReceiver>> wire_receivers_;  // by device name
};

}  // namespace xsrc
