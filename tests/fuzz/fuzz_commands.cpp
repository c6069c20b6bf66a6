// libFuzzer target over xsrcd's command decoder and dispatcher.
//
// An input is a command stream in the capture record format
// (xsrcd/command_capture.h): every record is one write() on a context's
// command file, or (kIoctl) one RDMA_VERBS_IOCTL on it. Each input runs against a fresh in-process device (its own
// arena) and one context, so create -> use -> destroy sequences and handle
// reuse are explored and nothing carries over to the next input.
//
// The caller is simulated (FuzzCaller), which keeps runs fast and
// reproducible: its memory is a response area and a data area at fixed fake
// addresses, its fds are pipes (and a few regular files) made on first use.
// Findings, besides what ASan/UBSan/LSan report:
//  - a response byte written outside the room the command offered;
//  - an errno outside 1..4095 from dispatch_command;
//  - an fd, object, id, slot, multicast membership or arena page left behind
//    once the context is destroyed.
#include <dirent.h>
#include <rdma/rdma_user_ioctl_cmds.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "arena.h"
#include "command_capture.h"
#include "dispatcher.h"
#include "device.h"
#include "fuzz_findings.h"
#include "log.h"
#include "netdev.h"
#include "objects.h"

namespace {

using namespace xsrc;
using xsrc::fuzz::finding;
using xsrc::fuzz::open_fd_count;

// The caller's address space. Response pointers of records with
// kResponseInScratch point into the response area, slot * kSlotSize in.
constexpr uint64_t kResponseBase = 0x7e0000000000;
constexpr size_t kSlotSize = 256;
constexpr size_t kResponseSize = 256 * kSlotSize;
constexpr uint64_t kDataBase = 0x7e0100000000;     // read-write data
constexpr uint64_t kReadOnlyBase = 0x7e0200000000; // read-only data
constexpr size_t kDataSize = 1 << 20;

// No such process: nothing may reach this process's memory through its pid.
constexpr pid_t kCallerPid = 0x3fffffff;

// Fake fd numbers: [kFirstFd, kFirstFileFd) become pipe ends on first use,
// [kFirstFileFd, kFdLimit) regular files; anything else is not open.
constexpr int kFirstFd = 3;
constexpr int kFirstFileFd = 960;
constexpr int kFdLimit = 1024;

constexpr size_t kMaxRecords = 512;

bool inside(uint64_t addr, uint64_t len, uint64_t base, uint64_t size)
{
	return addr >= base && len <= size && addr - base <= size - len;
}

bool overlaps(uint64_t addr, uint64_t len, uint64_t base, uint64_t size)
{
	return len && addr < base + size && base < addr + len;
}

class FuzzCaller final : public Caller {
public:
	FuzzCaller() : response_(kResponseSize), data_(kDataSize) {}
	~FuzzCaller() override { close_all(); }

	// Before each command: the response room it offers and whether the
	// caller maps whatever the command names.
	void begin(uint64_t room, uint64_t room_len, bool maps_all, bool fresh_fds)
	{
		room_ = room;
		room_len_ = room_len;
		more_rooms_.clear();
		maps_all_ = maps_all;
		pending_rd_ = -1;
		if (fresh_fds)
			forget_fds();
	}

	// More room a call offers: an ioctl attribute's buffer (after begin()).
	void allow(uint64_t addr, uint64_t len) { more_rooms_.emplace_back(addr, len); }

	// What the caller holds at `addr` of its response area before a call.
	void place(uint64_t addr, std::span<const std::byte> bytes)
	{
		if (inside(addr, bytes.size(), kResponseBase, kResponseSize))
			std::memcpy(response_.data() + (addr - kResponseBase), bytes.data(), bytes.size());
	}

	int write_memory(uint64_t addr, std::span<const std::byte> bytes) override
	{
		uint64_t len = bytes.size();
		if (len == 0)
			return 0;
		if (addr + len < addr)
			return EFAULT;
		// Only the room the command offered may receive response bytes.
		if (overlaps(addr, len, kResponseBase, kResponseSize) && !inside(addr, len, room_, room_len_) &&
		    std::none_of(more_rooms_.begin(), more_rooms_.end(),
				 [&](const auto &r) { return inside(addr, len, r.first, r.second); }))
			finding("response written outside the room the command offered");
		if (inside(addr, len, kResponseBase, kResponseSize)) {
			std::memcpy(response_.data() + (addr - kResponseBase), bytes.data(), len);
			return 0;
		}
		if (inside(addr, len, kDataBase, kDataSize)) {
			std::memcpy(data_.data() + (addr - kDataBase), bytes.data(), len);
			return 0;
		}
		return EFAULT;
	}

	int read_memory(uint64_t addr, std::span<std::byte> bytes) override
	{
		uint64_t len = bytes.size();
		if (len == 0)
			return 0;
		if (inside(addr, len, kResponseBase, kResponseSize)) {
			std::memcpy(bytes.data(), response_.data() + (addr - kResponseBase), len);
			return 0;
		}
		if (inside(addr, len, kDataBase, kDataSize)) {
			std::memcpy(bytes.data(), data_.data() + (addr - kDataBase), len);
			return 0;
		}
		return EFAULT;
	}

	int take_fd(int fd) override
	{
		pending_rd_after_this_call();
		int real = bind(fd);
		if (real < 0)
			return -EBADF;
		int ours = fcntl(real, F_DUPFD_CLOEXEC, 0);
		if (ours < 0)
			return -errno;
		taken_.push_back(ours);
		return ours;
	}

	int check_mapped(uint64_t addr, uint64_t length, bool writable) override
	{
		if (length == 0 || addr + length < addr)
			return EFAULT;
		if (maps_all_ || inside(addr, length, kDataBase, kDataSize) ||
		    inside(addr, length, kResponseBase, kResponseSize))
			return 0;
		if (!writable && inside(addr, length, kReadOnlyBase, kDataSize))
			return 0;
		return EFAULT;
	}

	pid_t pid() const override { return kCallerPid; }

	// After teardown every fd the daemon took must be closed again.
	void check_taken_fds_closed()
	{
		for (int fd : taken_) {
			bool ours = false;
			for (auto &[fake, real] : fds_)
				ours = ours || real == fd;
			for (int extra : unbound_)
				ours = ours || extra == fd;
			if (!ours && fcntl(fd, F_GETFD) >= 0)
				finding("the daemon kept an fd after the context was destroyed");
		}
	}

	// The caller closes every fd it has (the daemon's copies stay valid).
	void forget_fds()
	{
		for (auto &[fake, real] : fds_)
			close(real);
		for (int fd : unbound_)
			close(fd);
		fds_.clear();
		unbound_.clear();
	}

	void close_all()
	{
		forget_fds();
		taken_.clear();
	}

	std::vector<std::byte> &response() { return response_; }

private:
	// A pipe's read end waits for the very next take_fd of an unknown fd:
	// take_pipe() asks for the write end and then the read end.
	void pending_rd_after_this_call() { offer_rd_ = pending_rd_; pending_rd_ = -1; }

	int bind(int fd)
	{
		if (fd < kFirstFd || fd >= kFdLimit)
			return -1;
		if (auto it = fds_.find(fd); it != fds_.end())
			return it->second;
		int real = -1;
		if (fd >= kFirstFileFd) {
			real = memfd_create("xsrc-fuzz-file", MFD_CLOEXEC);
		} else if (offer_rd_ >= 0) {
			real = offer_rd_;
			std::erase(unbound_, offer_rd_);
			offer_rd_ = -1;
		} else {
			int p[2];
			if (pipe2(p, O_CLOEXEC) == 0) {
				real = p[1];
				pending_rd_ = p[0];
				unbound_.push_back(p[0]);
			}
		}
		if (real < 0)
			finding("the harness ran out of fds");
		fds_[fd] = real;
		return real;
	}

	std::vector<std::byte> response_;
	std::vector<std::byte> data_;
	uint64_t room_ = 0, room_len_ = 0;
	std::vector<std::pair<uint64_t, uint64_t>> more_rooms_;
	bool maps_all_ = false;
	std::map<int, int> fds_;   // fake fd -> our fd
	std::vector<int> unbound_; // read ends not (yet) given a fake number
	int pending_rd_ = -1, offer_rd_ = -1;
	std::vector<int> taken_;   // every fd handed to the daemon
};

uint64_t load_u64(std::span<const std::byte> b, size_t at)
{
	uint64_t v = 0;
	if (b.size() >= at + 8)
		std::memcpy(&v, b.data() + at, 8);
	return v;
}

// The response room as the caller declares it in the headers (not the
// command table: the decoder is what is under test).
void response_room(std::span<const std::byte> cmd, uint64_t &room, uint64_t &len)
{
	room = len = 0;
	if (cmd.size() < sizeof(ib_uverbs_cmd_hdr))
		return;
	ib_uverbs_cmd_hdr hdr;
	std::memcpy(&hdr, cmd.data(), sizeof(hdr));
	room = load_u64(cmd, sizeof(hdr));  // core struct's response, or ex_hdr.response
	if (!(hdr.command & IB_USER_VERBS_CMD_FLAG_EXTENDED)) {
		len = hdr.out_words * 4ull;
	} else if (cmd.size() >= sizeof(hdr) + sizeof(ib_uverbs_ex_cmd_hdr)) {
		ib_uverbs_ex_cmd_hdr ex;
		std::memcpy(&ex, cmd.data() + sizeof(hdr), sizeof(ex));
		len = (hdr.out_words + uint64_t(ex.provider_out_words)) * 8;
	}
}

NetdevInfo g_netdev;
std::string g_arena_path;
bool g_trace;  // XSRC_FUZZ_TRACE=1: one line per command (to read a reproducer)

// With the response (up to 64 bytes of it) when it landed in the response area.
void trace(std::span<const std::byte> cmd, int err, const std::vector<std::byte> &area)
{
	uint32_t command = 0;
	if (cmd.size() >= 4)
		std::memcpy(&command, cmd.data(), 4);
	fprintf(stderr, "command 0x%x%s, %zu bytes: %s", command & IB_USER_VERBS_CMD_COMMAND_MASK,
		command & IB_USER_VERBS_CMD_FLAG_EXTENDED ? " (ex)" : "", cmd.size(), err ? strerror(err) : "ok");
	uint64_t room, room_len;
	response_room(cmd, room, room_len);
	if (!err && room_len && inside(room, std::min<uint64_t>(room_len, 64), kResponseBase, kResponseSize)) {
		fprintf(stderr, ", response");
		for (uint64_t i = 0; i < std::min<uint64_t>(room_len, 64); ++i)
			fprintf(stderr, "%s%02x", i % 8 ? "" : " ", std::to_integer<unsigned>(area[room - kResponseBase + i]));
	}
	fprintf(stderr, "\n");
}

void check_device_empty(const Device &dev)
{
	for (uint32_t n : dev.object_counts)
		if (n)
			finding("an object count stayed above zero after the context was destroyed");
	if (!dev.pd_ids.empty())
		finding("a PD id stayed in use after the context was destroyed");
	if (!dev.mrs_by_index.empty())
		finding("an MR stayed in the device table after the context was destroyed");
	if (dev.qp_slots.used() || dev.srq_slots.used())
		finding("a QP or SRQ number stayed in use after the context was destroyed");
	if (!dev.cqs_by_ring.empty())
		finding("a CQ ring stayed known after the context was destroyed");
	if (!dev.xrcds.empty() || !dev.xrcds_by_inode.empty())
		finding("an XRC domain outlived its last handle");
	if (dev.arena->allocation_count())
		finding("arena memory stayed allocated after the context was destroyed");
	if (!dev.mcast_groups.empty() || dev.mcast_attachments || dev.arena->mcast_table().scan_end)
		finding("a multicast group kept members after the context was destroyed");
}

// kFixLengths: the header's input lengths made to match the command's size.
void fix_lengths(std::span<std::byte> cmd)
{
	ib_uverbs_cmd_hdr hdr;
	if (cmd.size() < sizeof(hdr))
		return;
	std::memcpy(&hdr, cmd.data(), sizeof(hdr));
	if (!(hdr.command & IB_USER_VERBS_CMD_FLAG_EXTENDED)) {
		if (cmd.size() % 4 == 0 && cmd.size() / 4 <= UINT16_MAX)
			hdr.in_words = uint16_t(cmd.size() / 4);
	} else {
		ib_uverbs_ex_cmd_hdr ex;
		size_t at = sizeof(hdr) + sizeof(ex);
		if (cmd.size() < at || (cmd.size() - at) % 8)
			return;
		std::memcpy(&ex, cmd.data() + sizeof(hdr), sizeof(ex));
		size_t words = (cmd.size() - at) / 8;
		if (ex.provider_in_words > words)
			ex.provider_in_words = 0;
		if (words - ex.provider_in_words > UINT16_MAX)
			return;
		hdr.in_words = uint16_t(words - ex.provider_in_words);
		std::memcpy(cmd.data() + sizeof(hdr), &ex, sizeof(ex));
	}
	std::memcpy(cmd.data(), &hdr, sizeof(hdr));
}

// An RDMA_VERBS_IOCTL record: the bytes the caller's pointer names (header,
// attributes) sit in its response area at the record's slot, which is the
// room the daemon may write (the attributes' out data).
void run_ioctl(Context &ctx, FuzzCaller &caller, const capture::RecordHeader &h, std::span<const std::byte> ioctl)
{
	const uint64_t at = kResponseBase + uint64_t(h.slot) * kSlotSize;
	const size_t n = std::min<size_t>(ioctl.size(), kResponseSize - (at - kResponseBase));
	caller.place(at, ioctl.first(n));
	// The room: the bytes the header says the call has (the attributes'
	// out words live there), which a short record may not all hold.
	uint64_t room = n;
	if (n >= sizeof(ib_uverbs_ioctl_hdr)) {
		ib_uverbs_ioctl_hdr hdr;
		std::memcpy(&hdr, ioctl.data(), sizeof(hdr));
		room = std::max<uint64_t>(n, std::min<uint64_t>(hdr.length, kResponseSize - (at - kResponseBase)));
	}
	caller.begin(at, room, h.flags & capture::kCallerMapsAll, h.flags & capture::kFreshFds);
	// Every attribute's buffer is room too: output pointers name where
	// the caller wants its outputs.
	for (size_t off = sizeof(ib_uverbs_ioctl_hdr); off + sizeof(ib_uverbs_attr) <= n; off += sizeof(ib_uverbs_attr)) {
		ib_uverbs_attr a;
		std::memcpy(&a, ioctl.data() + off, sizeof(a));
		caller.allow(a.data, a.len);
	}
	// FUSE copies in exactly the header's size; a shorter record is what a
	// caller with a shorter struct would send: not an RDMA_VERBS_IOCTL.
	int err = dispatch_ioctl(ctx, caller, ioctl.first(std::min<size_t>(n, sizeof(ib_uverbs_ioctl_hdr))), at);
	if (g_trace)
		fprintf(stderr, "ioctl, %zu bytes: %s\n", n, err ? strerror(err) : "ok");
	if (err < 0 || err >= 4096)
		finding("dispatch_ioctl returned no errno");
}

// Runs the input's commands, in order, on a new context of `dev`; then
// destroys the context as when its process closes the command file.
void run_commands(Device &dev, FuzzCaller &caller, std::span<const std::byte> input)
{
	Context ctx;
	ctx.id = 1;
	ctx.device = &dev;
	ctx.owner = kCallerPid;
	dev.contexts.push_back(&ctx);

	size_t records = 0;
	capture::for_each_record(input, [&](const capture::RecordHeader &h, std::span<const std::byte> bytes) {
		// An exact-size heap copy: ASan sees any read past the write().
		auto copy = std::make_unique<std::byte[]>(bytes.size());
		std::copy(bytes.begin(), bytes.end(), copy.get());
		std::span<std::byte> command(copy.get(), bytes.size());
		if (h.flags & capture::kIoctl) {
			run_ioctl(ctx, caller, h, command);
			return ++records < kMaxRecords;
		}
		if (h.flags & capture::kFixLengths)
			fix_lengths(command);
		uint64_t room, room_len;
		response_room(command, room, room_len);
		// Only a command that offers room for a response has its pointer there.
		if ((h.flags & capture::kResponseInScratch) && room_len && command.size() >= 16) {
			room = kResponseBase + uint64_t(h.slot) * kSlotSize;
			std::memcpy(command.data() + 8, &room, 8);
		}
		caller.begin(room, room_len, h.flags & capture::kCallerMapsAll, h.flags & capture::kFreshFds);
		int err = dispatch_command(ctx, caller, command);
		if (g_trace)
			trace(command, err, caller.response());
		if (err < 0 || err >= 4096)
			finding("dispatch_command returned no errno");
		return ++records < kMaxRecords;
	});

	destroy_context_objects(ctx);
	if (!ctx.objects.empty() || !ctx.channels.empty() || !ctx.channel_pool.empty())
		finding("destroy_context_objects left objects in the context");
	std::erase(dev.contexts, &ctx);
}

// The debug line of every refusal is built, so that its code is fuzzed too;
// with XSRC_FUZZ_TRACE=1 it is printed (it says which check refused).
void debug_sink(std::string_view line)
{
	if (g_trace)
		fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***)
{
	signal(SIGPIPE, SIG_IGN);  // as xsrcd runs: a pipe without readers is EPIPE
	if (int err = netdev_read("lo", g_netdev)) {
		fprintf(stderr, "xsrcd_fuzz_commands: cannot read netdev lo: %s\n", strerror(err));
		exit(1);
	}
	const char *trace_env = getenv("XSRC_FUZZ_TRACE");
	g_trace = trace_env && *trace_env == '1';
	set_log_sink(debug_sink);
	set_debug_enabled(true);
	const char *dir = getenv("XSRC_FUZZ_SHM_DIR");
	g_arena_path = std::string(dir && *dir ? dir : "/dev/shm") + "/xsrc-fuzz-" + std::to_string(getpid());
	return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static FuzzCaller caller;
	const size_t fds_before = open_fd_count();
	{
		Device dev;
		dev.name = "xsrcfuzz0";
		dev.netdev = g_netdev;
		refresh_device_view(dev);
		// A quarantine longer than any input: allocation never depends on time.
		if (int err = Arena::create(g_arena_path, dev.arena, std::chrono::hours(1))) {
			fprintf(stderr, "xsrcd_fuzz_commands: cannot create %s: %s\n", g_arena_path.c_str(),
				strerror(err));
			abort();
		}
		run_commands(dev, caller, std::as_bytes(std::span(data, size)));
		check_device_empty(dev);
		caller.check_taken_fds_closed();
		caller.close_all();
	}
	if (open_fd_count() != fds_before)
		finding("an fd stayed open after the context and its device were destroyed");
	return 0;
}
