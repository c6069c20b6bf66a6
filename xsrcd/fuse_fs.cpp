#define FUSE_USE_VERSION 312
#include "fuse_fs.h"

#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <map>
#include <span>
#include <sstream>

#include "command_capture.h"
#include "common/fd.h"
#include "daemon.h"

namespace xsrc {
namespace {

// Inodes: 1 is the root, device directories get numbers from a counter,
// context files are kContextInoBase + context id.
constexpr fuse_ino_t kContextInoBase = 1ull << 40;

struct FsState {
	Daemon *daemon;
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
	if (parent == FUSE_ROOT_ID && fs.daemon->device_exists(name)) {
		e.ino = fs.ino_for(name);
		if (device_dir_attr(fs, e.ino, e.attr)) {
			fuse_reply_entry(req, &e);
			return;
		}
	}
	// Context files are never found by name: only their creator holds one.
	e.ino = 0;  // negative entry, not cached (timeouts 0)
	fuse_reply_entry(req, &e);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info *)
{
	FsState &fs = state(req);
	struct stat st{};
	if (ino == FUSE_ROOT_ID) {
		fill_dir_attr(st, ino, 0755);
	} else if (ino >= kContextInoBase) {
		uid_t uid;
		if (!fs.daemon->context_owner(ino - kContextInoBase, uid)) {
			fuse_reply_err(req, ENOENT);
			return;
		}
		st.st_ino = ino;
		st.st_mode = S_IFREG | 0600;
		st.st_nlink = 1;
		st.st_uid = uid;
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
	if (ino == FUSE_ROOT_ID)
		for (auto &name : fs.daemon->device_names())
			entries.emplace_back(name, fs.ino_for(name));
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

void op_create(fuse_req_t req, fuse_ino_t parent, const char *, mode_t, fuse_file_info *fi)
{
	FsState &fs = state(req);
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
	e.attr.st_ino = e.ino;
	e.attr.st_mode = S_IFREG | 0600;
	e.attr.st_nlink = 1;
	e.attr.st_uid = caller->uid;
	e.attr.st_gid = caller->gid;
	fi->fh = id;
	fi->direct_io = 1;    // every write() reaches us whole, nothing cached
	fi->nonseekable = 1;
	fi->noflush = 1;      // close() of a dup must not cost a round trip
	if (fuse_reply_create(req, &e, fi) != 0)
		fs.daemon->release_context(id);  // the creator is gone already
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info *)
{
	// Reopening a context file (/proc/PID/fd/N) would share a context
	// across opens; only create() makes one.
	fuse_reply_err(req, ino >= kContextInoBase ? EPERM : EISDIR);
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

void op_write(fuse_req_t req, fuse_ino_t, const char *buf, size_t size, off_t, fuse_file_info *fi)
{
	FsState &fs = state(req);
	std::span<const std::byte> bytes(reinterpret_cast<const std::byte *>(buf), size);
	capture_command(fi->fh, bytes);
	int err = fs.daemon->execute(fi->fh, fuse_req_ctx(req)->pid, bytes);
	if (err)
		fuse_reply_err(req, err);
	else
		fuse_reply_write(req, size);
}

void op_ioctl(fuse_req_t req, fuse_ino_t, unsigned int, void *, fuse_file_info *, unsigned,
	      const void *, size_t, size_t)
{
	// No ioctl ABI: ENOTTY makes libibverbs use the write ABI for everything.
	fuse_reply_err(req, ENOTTY);
}

void op_release(fuse_req_t req, fuse_ino_t, fuse_file_info *fi)
{
	state(req).daemon->release_context(fi->fh);
	fuse_reply_err(req, 0);
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
	return ops;
}();

FsState *g_state = nullptr;

}  // namespace

FuseFs::FuseFs(Daemon &daemon, std::string mountpoint)
	: daemon_(daemon), mountpoint_(std::move(mountpoint))
{
}

FuseFs::~FuseFs()
{
	unmount();
	if (session_) {
		fuse_remove_signal_handlers(session_);
		fuse_session_destroy(session_);
	}
	delete g_state;
	g_state = nullptr;
}

int FuseFs::mount()
{
	g_state = new FsState{&daemon_, {}, {}, {}, 2};
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
