#define FUSE_USE_VERSION 312
#include "fuse_fs.h"

#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <rdma/rdma_user_ioctl.h>
#include <poll.h>
#include <sys/mount.h>
#include <sys/sysmacros.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <map>
#include <span>
#include <sstream>

#include "caller.h"
#include "cm.h"
#include "command_capture.h"
#include "common/fd.h"
#include "daemon.h"

namespace xsrc {
namespace {

// Inodes: 1 is the root, device directories get numbers from a counter,
// context files are kContextInoBase + context id; the rdma_cm directory is
// kCmDirIno, a cm channel's file kCmChannelInoBase + channel and its event
// file kCmEventInoBase + channel.
constexpr fuse_ino_t kContextInoBase = 1ull << 40;
constexpr fuse_ino_t kCmDirIno = 1ull << 39;
constexpr fuse_ino_t kCmChannelInoBase = 1ull << 41;
constexpr fuse_ino_t kCmEventInoBase = 1ull << 42;
constexpr const char *kCmDirName = "rdma_cm";
constexpr const char *kCmChannelName = "channel";
constexpr const char *kCmEventPrefix = "event-";
// A file handle of a cm file: the channel with this bit (context files: the context id).
constexpr uint64_t kCmFh = 1ull << 63;

bool is_cm_file(fuse_ino_t ino) { return ino >= kCmChannelInoBase && ino < (kCmEventInoBase << 1); }
uint64_t cm_channel_of(fuse_ino_t ino)
{
	return ino >= kCmEventInoBase ? ino - kCmEventInoBase : ino - kCmChannelInoBase;
}

// The cm's front end: held GET_EVENTs waiting for an event, and the poll
// handles of channels someone polls. Leaf locks: the cm calls in with its
// own lock held.
class CmFiles final : public CmFrontEnd {
public:
	struct Pending {
		fuse_req_t req;
		size_t size;
		bool registering = true;  // the interrupt callback is not installed yet: hold the answer
		std::optional<int> answer;
	};

	uint64_t hold(fuse_req_t req, size_t size)
	{
		std::lock_guard lock(mu_);
		uint64_t token = next_token_++;
		pending_.emplace(token, Pending{req, size});
		return token;
	}
	// The request was answered at once, or is now held with its interrupt
	// callback in place: reply if its answer came meanwhile.
	void settle(uint64_t token, std::optional<int> now)
	{
		std::unique_lock lock(mu_);
		auto it = pending_.find(token);
		if (it == pending_.end())
			return;
		if (now)
			it->second.answer = now;
		it->second.registering = false;
		if (it->second.answer)
			finish(lock, it, *it->second.answer);
	}
	void answer(uint64_t token, int err) override
	{
		std::unique_lock lock(mu_);
		auto it = pending_.find(token);
		if (it == pending_.end())
			return;
		if (it->second.registering)
			it->second.answer = err;
		else
			finish(lock, it, err);
	}
	void readable(uint64_t channel) override
	{
		std::lock_guard lock(mu_);
		auto it = polls_.find(channel);
		if (it == polls_.end())
			return;
		fuse_lowlevel_notify_poll(it->second);
		fuse_pollhandle_destroy(it->second);
		polls_.erase(it);
	}
	void set_poll(uint64_t channel, fuse_pollhandle *ph)
	{
		std::lock_guard lock(mu_);
		auto [it, fresh] = polls_.emplace(channel, ph);
		if (!fresh) {
			fuse_pollhandle_destroy(it->second);
			it->second = ph;
		}
	}
	void forget_poll(uint64_t channel)
	{
		std::lock_guard lock(mu_);
		if (auto it = polls_.find(channel); it != polls_.end()) {
			fuse_pollhandle_destroy(it->second);
			polls_.erase(it);
		}
	}

private:
	// Forgets the request and replies to it, outside our lock.
	void finish(std::unique_lock<std::mutex> &lock, std::map<uint64_t, Pending>::iterator it, int err)
	{
		Pending p = it->second;
		pending_.erase(it);
		lock.unlock();
		reply(p, err);
	}
	static void reply(const Pending &p, int err)
	{
		if (err)
			fuse_reply_err(p.req, err);
		else
			fuse_reply_write(p.req, p.size);
	}
	std::mutex mu_;
	uint64_t next_token_ = 1;
	std::map<uint64_t, Pending> pending_;
	std::map<uint64_t, fuse_pollhandle *> polls_;
};

struct FsState {
	Daemon *daemon;
	CmService *cm;
	CmFiles cm_files;
	dev_t fs_dev = 0;  // st_dev of the mount, to recognise our files by fd
	std::mutex mu;
	std::map<std::string, fuse_ino_t> dir_ino;   // device name -> inode
	std::map<fuse_ino_t, std::string> dir_name;
	fuse_ino_t next_dir_ino = 2;

	fuse_ino_t ino_for(const std::string &name)
	{
		std::lock_guard lock(mu);
		auto [it, fresh] = dir_ino.emplace(name, 0);
		if (fresh) {
			it->second = next_dir_ino++;
			dir_name[it->second] = name;
		}
		return it->second;
	}
	bool name_for(fuse_ino_t ino, std::string &name)
	{
		std::lock_guard lock(mu);
		auto it = dir_name.find(ino);
		if (it == dir_name.end())
			return false;
		name = it->second;
		return true;
	}
};

FsState &state(fuse_req_t req)
{
	return *static_cast<FsState *>(fuse_req_userdata(req));
}

// A command file (a context's or a cm channel's): only its owner's.
void fill_file_attr(struct stat &st, fuse_ino_t ino, uid_t uid)
{
	st.st_ino = ino;
	st.st_mode = S_IFREG | 0600;
	st.st_nlink = 1;
	st.st_uid = uid;
}

void fill_dir_attr(struct stat &st, fuse_ino_t ino, mode_t mode)
{
	st = {};
	st.st_ino = ino;
	st.st_mode = S_IFDIR | mode;
	st.st_nlink = 2;
}

// A device directory exists while its device does. Anyone may create
// command files in it (sticky, like /tmp): access to the device is not
// restricted, as on a real HCA's uverbs node (mode 0666).
bool device_dir_attr(FsState &fs, fuse_ino_t ino, struct stat &st, std::string *name = nullptr)
{
	std::string n;
	if (!fs.name_for(ino, n) || !fs.daemon->device_exists(n))
		return false;
	fill_dir_attr(st, ino, 01777);
	if (name)
		*name = n;
	return true;
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	FsState &fs = state(req);
	fuse_entry_param e{};
	if (parent == FUSE_ROOT_ID && std::string_view(name) == kCmDirName) {
		e.ino = kCmDirIno;
		fill_dir_attr(e.attr, e.ino, 01777);
		fuse_reply_entry(req, &e);
		return;
	}
	if (parent == FUSE_ROOT_ID && fs.daemon->device_exists(name)) {
		e.ino = fs.ino_for(name);
		if (device_dir_attr(fs, e.ino, e.attr)) {
			fuse_reply_entry(req, &e);
			return;
		}
	}
	// Context and cm files are never found by name: only their creator holds one.
	e.ino = 0;  // negative entry, not cached (timeouts 0)
	fuse_reply_entry(req, &e);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info *)
{
	FsState &fs = state(req);
	struct stat st{};
	if (ino == FUSE_ROOT_ID) {
		fill_dir_attr(st, ino, 0755);
	} else if (ino == kCmDirIno) {
		fill_dir_attr(st, ino, 01777);
	} else if (is_cm_file(ino)) {
		uid_t uid;
		if (!fs.cm->channel_owner(cm_channel_of(ino), uid)) {
			fuse_reply_err(req, ENOENT);
			return;
		}
		fill_file_attr(st, ino, uid);
	} else if (ino >= kContextInoBase) {
		uid_t uid;
		if (!fs.daemon->context_owner(ino - kContextInoBase, uid)) {
			fuse_reply_err(req, ENOENT);
			return;
		}
		fill_file_attr(st, ino, uid);
	} else if (!device_dir_attr(fs, ino, st)) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fuse_reply_attr(req, &st, 0);
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info *)
{
	FsState &fs = state(req);
	std::vector<std::pair<std::string, fuse_ino_t>> entries{{".", ino}, {"..", FUSE_ROOT_ID}};
	if (ino == FUSE_ROOT_ID) {
		entries.emplace_back(kCmDirName, kCmDirIno);
		for (auto &name : fs.daemon->device_names())
			entries.emplace_back(name, fs.ino_for(name));
	}
	std::string buf(size, '\0');
	size_t used = 0;
	for (size_t i = static_cast<size_t>(off); i < entries.size(); ++i) {
		struct stat st{};
		st.st_ino = entries[i].second;
		st.st_mode = S_IFDIR;
		size_t n = fuse_add_direntry(req, buf.data() + used, size - used,
					     entries[i].first.c_str(), &st, static_cast<off_t>(i + 1));
		if (n > size - used)
			break;
		used += n;
	}
	fuse_reply_buf(req, buf.data(), used);
}

void command_file_options(fuse_file_info *fi)
{
	fi->direct_io = 1;    // every write() reaches us whole, nothing cached
	fi->nonseekable = 1;
	fi->noflush = 1;      // close() of a dup must not cost a round trip
}

// rdma_cm/channel makes a new cm channel; rdma_cm/event-<inode of a
// channel file> opens that channel's event file (GET_EVENT blocks there
// without holding the channel file's inode lock: see tools/preload).
void create_cm_file(FsState &fs, fuse_req_t req, const char *name, fuse_file_info *fi)
{
	const fuse_ctx *caller = fuse_req_ctx(req);
	std::string_view n(name);
	fuse_entry_param e{};
	uint64_t channel = 0;
	if (n == kCmChannelName) {
		fs.cm->open_channel(caller->uid, channel);
		e.ino = kCmChannelInoBase + channel;
	} else if (n.starts_with(kCmEventPrefix)) {
		std::string digits(n.substr(std::strlen(kCmEventPrefix)));
		char *end = nullptr;
		errno = 0;
		unsigned long long ino = std::strtoull(digits.c_str(), &end, 10);
		if (digits.empty() || *end || errno || ino < kCmChannelInoBase || ino >= kCmEventInoBase) {
			fuse_reply_err(req, EINVAL);
			return;
		}
		channel = ino - kCmChannelInoBase;
		if (int err = fs.cm->open_event_file(channel, caller->uid)) {
			fuse_reply_err(req, err);
			return;
		}
		e.ino = kCmEventInoBase + channel;
	} else {
		fuse_reply_err(req, EINVAL);
		return;
	}
	fill_file_attr(e.attr, e.ino, caller->uid);
	e.attr.st_gid = caller->gid;
	fi->fh = kCmFh | channel;
	command_file_options(fi);
	if (fuse_reply_create(req, &e, fi) != 0)
		fs.cm->release_file(channel);
}

void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t, fuse_file_info *fi)
{
	FsState &fs = state(req);
	if (parent == kCmDirIno) {
		create_cm_file(fs, req, name, fi);
		return;
	}
	std::string device;
	struct stat dir{};
	if (!device_dir_attr(fs, parent, dir, &device)) {
		fuse_reply_err(req, parent == FUSE_ROOT_ID ? EACCES : ENOENT);
		return;
	}
	const fuse_ctx *caller = fuse_req_ctx(req);
	uint64_t id;
	if (int err = fs.daemon->open_context(device, caller->pid, caller->uid, id)) {
		fuse_reply_err(req, err);
		return;
	}
	fuse_entry_param e{};
	e.ino = kContextInoBase + id;
	fill_file_attr(e.attr, e.ino, caller->uid);
	e.attr.st_gid = caller->gid;
	fi->fh = id;
	command_file_options(fi);
	if (fuse_reply_create(req, &e, fi) != 0)
		fs.daemon->release_context(id);  // the creator is gone already
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info *)
{
	// Reopening a context file (/proc/PID/fd/N) would share a context
	// across opens; only create() makes one.
	fuse_reply_err(req, ino >= kContextInoBase || is_cm_file(ino) ? EPERM : EISDIR);
}

// XSRC_CAPTURE_DIR=DIR: every command as delivered, appended to
// DIR/ctx-<daemon pid>-<context id> and, with all contexts in arrival order,
// to DIR/all-<daemon pid>, in the record format of command_capture.h (the
// fuzz corpus: tests/fuzz/capture_corpus.sh). Off by default.
void capture_command(uint64_t context, std::span<const std::byte> bytes)
{
	static const char *dir = getenv("XSRC_CAPTURE_DIR");
	static std::mutex mu;  // commands of different contexts arrive on several threads
	if (!dir || !*dir || bytes.size() > capture::kMaxRecordLength)
		return;
	auto record = capture::encode_record(
		bytes, capture::kResponseInScratch | capture::kCallerMapsAll | capture::kFreshFds);
	const std::string prefix = std::string(dir) + "/";
	const std::string pid = std::to_string(getpid());
	std::lock_guard lock(mu);
	for (const std::string &path : {prefix + "ctx-" + pid + "-" + std::to_string(context), prefix + "all-" + pid}) {
		unique_fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
		if (!fd)
			continue;
		if (::write(fd.get(), record.data(), record.size()) < 0) {
			// best effort: capturing never changes what the command does
		}
	}
}

void on_cm_interrupt(fuse_req_t req, void *token)
{
	state(req).cm->cancel(reinterpret_cast<uintptr_t>(token));
}

// One rdma_cm command. A GET_EVENT with nothing to take is held: the cm
// answers it later through CmFiles, or EINTR when a signal interrupts it.
void cm_write(FsState &fs, fuse_req_t req, std::span<const std::byte> bytes, fuse_file_info *fi)
{
	const pid_t tid = fuse_req_ctx(req)->pid;
	ThreadCaller caller(tid);
	const uint64_t token = fs.cm_files.hold(req, bytes.size());
	int err = fs.cm->execute(fi->fh & ~kCmFh, caller, std::make_unique<ThreadCaller>(tid), bytes,
				 (fi->flags & O_NONBLOCK) != 0, token);
	if (err != CmService::kHeld) {
		fs.cm_files.settle(token, err);
		return;
	}
	fuse_req_interrupt_func(req, on_cm_interrupt, reinterpret_cast<void *>(static_cast<uintptr_t>(token)));
	fs.cm_files.settle(token, std::nullopt);
}

void op_write(fuse_req_t req, fuse_ino_t, const char *buf, size_t size, off_t, fuse_file_info *fi)
{
	FsState &fs = state(req);
	if (fi->fh & kCmFh) {
		cm_write(fs, req, std::span(reinterpret_cast<const std::byte *>(buf), size), fi);
		return;
	}
	std::span<const std::byte> bytes(reinterpret_cast<const std::byte *>(buf), size);
	capture_command(fi->fh, bytes);
	int err = fs.daemon->execute(fi->fh, fuse_req_ctx(req)->pid, bytes);
	if (err)
		fuse_reply_err(req, err);
	else
		fuse_reply_write(req, size);
}

// RDMA_VERBS_IOCTL on a command file: its header is what FUSE copies in and
// out (the size the command number encodes); dispatch_ioctl serves the one
// method libibverbs cannot do without. Anything else is ENOTTY, which makes
// libibverbs use the write ABI.
void op_ioctl(fuse_req_t req, fuse_ino_t, unsigned int cmd, void *arg, fuse_file_info *fi, unsigned flags,
	      const void *in_buf, size_t in_bufsz, size_t out_bufsz)
{
	if ((fi->fh & kCmFh) || cmd != RDMA_VERBS_IOCTL || (flags & FUSE_IOCTL_COMPAT) ||
	    in_bufsz != sizeof(ib_uverbs_ioctl_hdr) || out_bufsz != sizeof(ib_uverbs_ioctl_hdr)) {
		fuse_reply_err(req, ENOTTY);
		return;
	}
	std::span<const std::byte> header(static_cast<const std::byte *>(in_buf), in_bufsz);
	int err = state(req).daemon->execute_ioctl(fi->fh, fuse_req_ctx(req)->pid, header,
						   reinterpret_cast<uintptr_t>(arg));
	if (err)
		fuse_reply_err(req, err);
	else
		fuse_reply_ioctl(req, 0, in_buf, in_bufsz);
}

void op_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info *fi)
{
	FsState &fs = state(req);
	if (fi->fh & kCmFh) {
		if (ino < kCmEventInoBase)
			fs.cm_files.forget_poll(fi->fh & ~kCmFh);
		fs.cm->release_file(fi->fh & ~kCmFh);
	} else {
		fs.daemon->release_context(fi->fh);
	}
	fuse_reply_err(req, 0);
}

// A cm channel polls readable while an event waits. Every other file answers
// the kernel's default mask: an ENOSYS would turn poll off for the whole mount.
void op_poll(fuse_req_t req, fuse_ino_t, fuse_file_info *fi, fuse_pollhandle *ph)
{
	FsState &fs = state(req);
	if (!(fi->fh & kCmFh)) {
		if (ph)
			fuse_pollhandle_destroy(ph);
		fuse_reply_poll(req, POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM);
		return;
	}
	const uint64_t channel = fi->fh & ~kCmFh;
	if (ph)
		fs.cm_files.set_poll(channel, ph);
	fuse_reply_poll(req, fs.cm->readable(channel) ? POLLIN | POLLRDNORM : 0);
}

const fuse_lowlevel_ops kOps = [] {
	fuse_lowlevel_ops ops{};
	ops.lookup = op_lookup;
	ops.getattr = op_getattr;
	ops.readdir = op_readdir;
	ops.create = op_create;
	ops.open = op_open;
	ops.write = op_write;
	ops.ioctl = op_ioctl;
	ops.release = op_release;
	ops.poll = op_poll;
	return ops;
}();

FsState *g_state = nullptr;

}  // namespace

FuseFs::FuseFs(Daemon &daemon, CmService &cm, std::string mountpoint)
	: daemon_(daemon), cm_(cm), mountpoint_(std::move(mountpoint))
{
}

FuseFs::~FuseFs()
{
	unmount();
	cm_.set_front_end(nullptr);
	cm_.set_channel_of_fd(nullptr);
	if (session_) {
		fuse_remove_signal_handlers(session_);
		fuse_session_destroy(session_);
	}
	delete g_state;
	g_state = nullptr;
}

int FuseFs::mount()
{
	g_state = new FsState{&daemon_, &cm_, {}, 0, {}, {}, {}, 2};
	const char *argv[] = {"xsrcd", "-o", "allow_other,default_permissions,fsname=xsrc,subtype=xsrc"};
	fuse_args args = FUSE_ARGS_INIT(3, const_cast<char **>(argv));
	session_ = fuse_session_new(&args, &kOps, sizeof(kOps), g_state);
	fuse_opt_free_args(&args);
	if (!session_)
		return EIO;
	if (fuse_set_signal_handlers(session_) != 0)
		return EIO;
	if (fuse_session_mount(session_, mountpoint_.c_str()) != 0)
		return EIO;
	mounted_ = true;
	// Not stat(): nothing serves this mount until run(). The mount table knows its device.
	g_state->fs_dev = mount_device(mountpoint_);
	cm_.set_front_end(&g_state->cm_files);
	cm_.set_channel_of_fd([](int fd) -> uint64_t {
		// Cached attributes only: asking this file system would wait for the
		// cm, whose lock the caller holds.
		struct statx stx{};
		if (!g_state || statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_INO, &stx) != 0 ||
		    makedev(stx.stx_dev_major, stx.stx_dev_minor) != g_state->fs_dev || !is_cm_file(stx.stx_ino))
			return 0;
		return cm_channel_of(stx.stx_ino);
	});
	return 0;
}

int FuseFs::run()
{
	fuse_loop_config *cfg = fuse_loop_cfg_create();
	fuse_loop_cfg_set_clone_fd(cfg, 0);
	fuse_loop_cfg_set_idle_threads(cfg, 4);
	int ret = fuse_session_loop_mt(session_, cfg);
	fuse_loop_cfg_destroy(cfg);
	return ret;
}

void FuseFs::unmount()
{
	if (mounted_ && session_)
		fuse_session_unmount(session_);
	mounted_ = false;
}

dev_t mount_device(const std::string &mountpoint)
{
	std::ifstream info("/proc/self/mountinfo");
	std::string line;
	dev_t dev = 0;
	while (std::getline(info, line)) {
		std::istringstream fields(line);
		std::string id, parent, devno, root, point;
		fields >> id >> parent >> devno >> root >> point;
		unsigned major = 0, minor = 0;
		if (point == mountpoint && std::sscanf(devno.c_str(), "%u:%u", &major, &minor) == 2)
			dev = makedev(major, minor);  // the last one: the mount on top
	}
	return dev;
}

bool unmount_stale(const std::string &mountpoint)
{
	std::ifstream info("/proc/self/mountinfo");
	std::string line;
	while (std::getline(info, line)) {
		std::istringstream fields(line);
		std::string id, parent, devno, root, point;
		fields >> id >> parent >> devno >> root >> point;
		if (point == mountpoint)
			return umount2(mountpoint.c_str(), MNT_DETACH) == 0;
	}
	return false;
}

}  // namespace xsrc
