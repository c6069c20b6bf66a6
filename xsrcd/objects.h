// The daemon's object model: devices, the contexts opened on them (one per
// command file), and the verbs objects each context owns. All of it is
// guarded by Daemon::mutex(); nothing here locks on its own.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "caller.h"
#include "netdev.h"
#include "sysfs_view.h"

namespace xsrc {

// An fd the daemon owns; closes on destruction.
class OwnedFd {
public:
	OwnedFd() = default;
	explicit OwnedFd(int fd) : fd_(fd) {}
	OwnedFd(OwnedFd &&o) noexcept : fd_(o.release()) {}
	OwnedFd &operator=(OwnedFd &&o) noexcept;
	~OwnedFd();
	int get() const { return fd_; }
	int release() { int f = fd_; fd_ = -1; return f; }
	explicit operator bool() const { return fd_ >= 0; }

private:
	int fd_ = -1;
};

// Limits the device advertises and every command honours.
struct DeviceLimits {
	static constexpr uint32_t max_qp = 16384;
	static constexpr uint32_t max_qp_wr = 16384;
	static constexpr uint32_t max_sge = 32;
	static constexpr uint32_t max_inline_data = 512;
	static constexpr uint32_t max_cq = 16384;
	static constexpr uint32_t max_cqe = 65535;
	static constexpr uint32_t max_mr = 65536;
	static constexpr uint32_t max_pd = 16384;
	static constexpr uint32_t max_qp_rd_atom = 16;
	static constexpr uint32_t max_srq = 16384;
	static constexpr uint32_t max_srq_wr = 16384;
	static constexpr uint32_t max_ah = 65536;
	static constexpr uint32_t max_comp_channels_per_context = 1024;
	static constexpr uint32_t max_msg_size = 1u << 31;
	static constexpr uint32_t gid_tbl_len = 16;
	static constexpr uint32_t num_comp_vectors = 1;
};

struct Pd {
	uint32_t use_count = 0;  // MRs (and later QPs, SRQs, AHs) on this PD
};

struct Mr {
	uint32_t pd_handle = 0;
	uint64_t addr = 0;
	uint64_t length = 0;
	uint64_t iova = 0;
	uint32_t access = 0;
	uint32_t lkey = 0;
	uint32_t rkey = 0;
};

struct Cq {
	uint64_t user_handle = 0;  // the provider's ibv_cq pointer; events carry it
	uint32_t cqe = 0;
	int channel_fd = -1;       // the caller's channel fd number, -1 for none
	bool armed = false;
	bool solicited_only = false;
	uint32_t comp_events_reported = 0;
	uint32_t async_events_reported = 0;
};

using Object = std::variant<Pd, Mr, Cq>;

struct Channel {
	OwnedFd wr;                // daemon's copy of the pipe's write end
};

struct Device;

struct Context {
	uint64_t id = 0;
	Device *device = nullptr;   // null once the device was removed
	pid_t owner = -1;           // thread group that created the command file
	uid_t uid = 0;
	std::unique_ptr<ProcessCaller> caller;
	bool initialised = false;   // GET_CONTEXT done
	OwnedFd async_wr;
	uint64_t async_events_dropped = 0;

	// Registered channel pipes not yet handed out, FIFO: {caller rd fd, our wr}.
	std::deque<std::pair<int, OwnedFd>> channel_pool;
	std::map<int, Channel> channels;  // by the caller's fd number

	uint32_t next_handle = 0;
	std::map<uint32_t, Object> objects;

	// Writes one async event; drops it (and counts) if the pipe is full.
	void post_async_event(uint64_t element, uint32_t event_type);
	size_t object_count() const { return objects.size() + channels.size(); }
};

struct Device {
	std::string name;
	unsigned uverbs_index = 0;
	NetdevInfo netdev;
	DeviceView view;
	std::vector<Context *> contexts;
	uint32_t next_mr_index = 1;
	uint8_t key_salt = 0;
	std::map<uint32_t, Mr *> mrs_by_index;  // device-wide MR table (lkey/rkey >> 8)
};

}  // namespace xsrc
