// libFuzzer target over the connection manager's commands (CmService::execute):
// each input (cm_input.h) drives a fresh CmService on a fake host with one
// device, over two channels, with GET_EVENTs held and cancelled, channel
// files closed and reopened. Findings, besides what ASan/UBSan/LSan report:
//  - execute() returning anything but 0, an errno (1..4095) or kHeld, or
//    kHeld where no GET_EVENT may wait;
//  - a held GET_EVENT answered twice, answered without being held, or never
//    answered once its channel is gone;
//  - an event waiting on a channel that has a GET_EVENT waiting too;
//  - an object (channel, id, multicast join) left once every channel is released;
//  - an fd left open (MIGRATE_ID closes the fd it takes).
#include <dirent.h>
#include <rdma/rdma_user_cm.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "cm_fakes.h"
#include "cm_input.h"
#include "fuzz_findings.h"
#include "log.h"

namespace {

using namespace xsrc;
using xsrc::fuzz::finding;
using xsrc::fuzz::open_fd_count;
using namespace xsrc::cmfuzz;

static_assert(kMemBase == cmtest::BufferCaller::kBase);

constexpr size_t kMaxSteps = 256;

bool g_trace;  // XSRC_FUZZ_TRACE=1: one line per step

// MIGRATE_ID's fd names the other channel of the pair.
uint64_t g_migrate_from;
uint64_t channel_of_fd(int) { return g_migrate_from; }

void debug_sink(std::string_view line)
{
	if (g_trace)
		fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
}

class Run {
public:
	Run() : caller_(kMemSize)
	{
		cm_.set_front_end(&fe_);
		cm_.set_channel_of_fd(channel_of_fd);
		// Option values: every int there is 1 (REUSEADDR, AFONLY on; a TOS of 1).
		for (uint64_t at = kOptionArea; at + 4 <= kMemBase + kMemSize; at += 4)
			caller_.write(at, int32_t{1});
		for (uint64_t &ch : channels_)
			open(ch);
	}
	~Run() { cm_.set_front_end(nullptr); }

	void step(std::span<const uint8_t> &in)
	{
		uint8_t op = in[0] % kOpCount;
		in = in.subspan(1);
		if (op == kExecute) {
			if (in.size() < 3)
				return void(in = {});
			uint8_t flags = in[0];
			size_t len = in[1] | (size_t(in[2]) << 8);
			in = in.subspan(3);
			len = std::min(len, in.size());
			execute(flags, in.first(len));
			in = in.subspan(len);
			return;
		}
		if (in.empty())
			return;
		uint8_t arg = in[0];
		in = in.subspan(1);
		if (op == kCancel) {
			if (!held_.empty()) {
				uint64_t token = std::next(held_.begin(), arg % held_.size())->first;
				if (g_trace)
					fprintf(stderr, "cancel %llu\n", static_cast<unsigned long long>(token));
				cm_.cancel(token);
			}
		} else if (op == kRelease) {
			uint64_t &ch = channels_[arg & 1];
			release(ch);
			open(ch);
		} else if (op == kEventFile) {
			uint64_t ch = channels_[arg & 1];
			if (cm_.open_event_file(ch, kUid) == 0)
				files_[ch]++;
		}
	}

	// Every channel's files close: nothing may be left.
	void finish()
	{
		for (uint64_t &ch : channels_)
			release(ch);
		if (cm_.object_count())
			finding("objects outlived every channel");
		std::map<uint64_t, int> answered;
		for (auto &[token, err] : fe_.answers()) {
			if (!ever_held_.count(token))
				finding("an answer for a GET_EVENT that was not held");
			if (++answered[token] > 1)
				finding("a held GET_EVENT answered twice");
			if (err < 0 || err >= 4096)
				finding("a held GET_EVENT answered with no errno");
		}
		if (answered.size() != ever_held_.size())
			finding("a held GET_EVENT was never answered");
	}

private:
	static constexpr uid_t kUid = 1000;

	void open(uint64_t &ch)
	{
		cm_.open_channel(kUid, ch);
		files_[ch] = 1;
	}
	void release(uint64_t ch)
	{
		for (int n = files_[ch]; n > 0; --n)
			cm_.release_file(ch);
		files_.erase(ch);
		prune_held();
	}
	// Tokens answered since are no longer held; a channel with a GET_EVENT
	// still waiting has no event waiting (a new event goes to the waiter).
	void prune_held()
	{
		for (auto &[token, err] : fe_.answers())
			held_.erase(token);
		for (auto &[token, ch] : held_) {
			uid_t owner;
			if (!cm_.channel_owner(ch, owner) || owner != kUid)
				finding("a GET_EVENT held on a channel that is gone");
			if (cm_.readable(ch))
				finding("an event waits beside a waiting GET_EVENT");
		}
	}

	void execute(uint8_t flags, std::span<const uint8_t> bytes)
	{
		// An exact-size heap copy: ASan sees any read past the write().
		auto copy = std::make_unique<std::byte[]>(bytes.size());
		std::memcpy(copy.get(), bytes.data(), bytes.size());
		std::span<std::byte> cmd(copy.get(), bytes.size());
		if (flags & kPatchResponse) {
			rdma_ucm_cmd_hdr hdr{};
			if (cmd.size() >= sizeof(hdr))
				std::memcpy(&hdr, cmd.data(), sizeof(hdr));
			// CREATE_ID's response follows its uid; every other command's comes first.
			size_t at = sizeof(hdr) + (hdr.cmd == RDMA_USER_CM_CMD_CREATE_ID ? 8 : 0);
			uint64_t slot = kMemBase + uint64_t(flags >> 4) * kSlotSize;
			if (cmd.size() >= at + 8)
				std::memcpy(cmd.data() + at, &slot, 8);
		}
		const uint64_t ch = channels_[flags & kOther];
		g_migrate_from = channels_[(flags & kOther) ^ 1];
		const uint64_t token = next_token_++;
		const bool nonblock = flags & kNonblock, holdable = flags & kHoldable;
		std::unique_ptr<Caller> held;
		if (holdable)
			held = std::make_unique<cmtest::ForwardingCaller>(caller_);
		int err = cm_.execute(ch, caller_, std::move(held), cmd, nonblock, token);
		if (g_trace) {
			uint32_t c = 0;
			if (cmd.size() >= 4)
				std::memcpy(&c, cmd.data(), 4);
			fprintf(stderr, "channel %llu: command %u, %zu bytes%s%s: %s\n", static_cast<unsigned long long>(ch),
				c, cmd.size(), nonblock ? ", nonblock" : "", holdable ? ", holdable" : "",
				err == CmService::kHeld ? "held" : err ? strerror(err) : "ok");
		}
		if (err == CmService::kHeld) {
			if (!holdable || nonblock)
				finding("held a GET_EVENT that could not wait");
			held_[token] = ch;
			ever_held_.insert(token);
		} else if (err < 0 || err >= 4096) {
			finding("execute returned no errno");
		}
		prune_held();
	}

	// The service goes first: its held GET_EVENTs keep callers of caller_.
	cmtest::FakeHost host_;
	cmtest::RecordingFrontEnd fe_;
	cmtest::BufferCaller caller_;
	CmService cm_{host_};
	uint64_t channels_[2] = {};
	std::map<uint64_t, int> files_;
	std::map<uint64_t, uint64_t> held_;  // token -> channel, until answered
	std::set<uint64_t> ever_held_;
	uint64_t next_token_ = 1;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***)
{
	const char *trace_env = getenv("XSRC_FUZZ_TRACE");
	g_trace = trace_env && *trace_env == '1';
	set_log_sink(debug_sink);
	set_debug_enabled(true);  // the refusal lines are built (and fuzzed) too
	return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const size_t fds_before = open_fd_count();
	{
		Run run;
		std::span<const uint8_t> in(data, size);
		for (size_t steps = 0; !in.empty() && steps < kMaxSteps; ++steps)
			run.step(in);
		run.finish();
	}
	if (open_fd_count() != fds_before)
		finding("an fd stayed open");
	return 0;
}
