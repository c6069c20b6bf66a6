#define FUSE_USE_VERSION 312
#include "cm_standin.h"

#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <rdma/rdma_user_cm.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>

namespace xsrc::test {
namespace {

constexpr fuse_ino_t kStatsIno = 2;
constexpr fuse_ino_t kFirstChannelIno = 1000;  // channel c: even ino, its event file ino + 1

struct Waiter {
	fuse_req_t req;
	size_t size;
};

struct Channel {
	int open_files = 0;  // the channel file and its event files
	unsigned queued_events = 0;
	std::deque<Waiter> waiting;
};

struct Standin {
	std::mutex mu;
	std::map<fuse_ino_t, Channel> channels;  // by channel ino
	fuse_ino_t next_ino = kFirstChannelIno;
	unsigned channel_files = 0, event_files = 0, commands = 0;
};

Standin g_standin;

bool is_event_ino(fuse_ino_t ino)
{
	return ino >= kFirstChannelIno && ino % 2 == 1;
}

fuse_ino_t channel_of(fuse_ino_t ino)
{
	return is_event_ino(ino) ? ino - 1 : ino;
}

struct stat attr_of(fuse_ino_t ino)
{
	struct stat st{};
	st.st_ino = ino;
	st.st_nlink = 1;
	st.st_uid = getuid();
	st.st_gid = getgid();
	st.st_mode = ino == FUSE_ROOT_ID ? S_IFDIR | 01777 : ino == kStatsIno ? S_IFREG | 0444 : S_IFREG | 0600;
	return st;
}

bool exists_locked(fuse_ino_t ino)
{
	return ino == FUSE_ROOT_ID || ino == kStatsIno || g_standin.channels.contains(channel_of(ino));
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	fuse_entry_param e{};
	std::lock_guard lock(g_standin.mu);
	unsigned long long n = 0;
	if (parent == FUSE_ROOT_ID && std::strcmp(name, "stats") == 0) {
		e.ino = kStatsIno;
	} else if (parent == FUSE_ROOT_ID && std::sscanf(name, "event-%llu", &n) == 1 &&
		   std::string(name) == "event-" + std::to_string(n) && n % 2 == 0 && g_standin.channels.contains(n)) {
		e.ino = n + 1;
	} else {
		fuse_reply_err(req, ENOENT);  // "channel" too: only create() makes one
		return;
	}
	e.attr = attr_of(e.ino);
	e.attr_timeout = 60;  // inode numbers never change
	fuse_reply_entry(req, &e);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info *)
{
	std::unique_lock lock(g_standin.mu);
	if (!exists_locked(ino)) {
		lock.unlock();
		fuse_reply_err(req, ENOENT);
		return;
	}
	lock.unlock();
	struct stat st = attr_of(ino);
	fuse_reply_attr(req, &st, 60);
}

void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t, fuse_file_info *fi)
{
	if (parent != FUSE_ROOT_ID || std::strcmp(name, "channel") != 0) {
		fuse_reply_err(req, EACCES);
		return;
	}
	fuse_entry_param e{};
	{
		std::lock_guard lock(g_standin.mu);
		e.ino = g_standin.next_ino;
		g_standin.next_ino += 2;
		g_standin.channels[e.ino].open_files = 1;
		++g_standin.channel_files;
	}
	e.attr = attr_of(e.ino);
	e.attr_timeout = 60;
	fi->fh = e.ino;
	fi->direct_io = 1;
	fi->nonseekable = 1;
	fuse_reply_create(req, &e, fi);
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info *fi)
{
	std::unique_lock lock(g_standin.mu);
	if (ino == kStatsIno) {
		lock.unlock();
		fi->direct_io = 1;
		fuse_reply_open(req, fi);
		return;
	}
	auto it = g_standin.channels.find(channel_of(ino));
	if (!is_event_ino(ino) || it == g_standin.channels.end()) {
		lock.unlock();
		fuse_reply_err(req, ino == FUSE_ROOT_ID ? EISDIR : EPERM);
		return;
	}
	++it->second.open_files;
	++g_standin.event_files;
	lock.unlock();
	fi->fh = ino;
	fi->direct_io = 1;
	fi->nonseekable = 1;
	fuse_reply_open(req, fi);
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info *)
{
	if (ino != kStatsIno) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	std::string text;
	{
		std::lock_guard lock(g_standin.mu);
		unsigned waiting = 0;
		for (auto &[n, c] : g_standin.channels)
			waiting += static_cast<unsigned>(c.waiting.size());
		text = "channels=" + std::to_string(g_standin.channel_files) + " events=" +
		       std::to_string(g_standin.event_files) + " waiting=" + std::to_string(waiting) +
		       " commands=" + std::to_string(g_standin.commands) + "\n";
	}
	if (off >= static_cast<off_t>(text.size()))
		text.clear();
	else
		text = text.substr(static_cast<size_t>(off), size);
	fuse_reply_buf(req, text.data(), text.size());
}

void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t, fuse_file_info *fi)
{
	rdma_ucm_cmd_hdr hdr;
	if (size < sizeof(hdr)) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	std::memcpy(&hdr, buf, sizeof(hdr));
	std::unique_lock lock(g_standin.mu);
	++g_standin.commands;
	auto it = g_standin.channels.find(channel_of(ino));
	if (it == g_standin.channels.end()) {
		lock.unlock();
		fuse_reply_err(req, EBADF);
		return;
	}
	Channel &c = it->second;
	switch (hdr.cmd) {
	case RDMA_USER_CM_CMD_CREATE_ID:
		lock.unlock();
		fuse_reply_err(req, ENOSYS);
		return;
	case RDMA_USER_CM_CMD_GET_EVENT:
		if (c.queued_events) {
			--c.queued_events;
			break;
		}
		if (fi->flags & O_NONBLOCK) {  // the file's flags at the time of this write
			lock.unlock();
			fuse_reply_err(req, EAGAIN);
			return;
		}
		c.waiting.push_back({req, size});
		return;  // answered by a NOTIFY
	case RDMA_USER_CM_CMD_NOTIFY:
		if (c.waiting.empty()) {
			++c.queued_events;
		} else {
			Waiter w = c.waiting.front();
			c.waiting.pop_front();
			fuse_reply_write(w.req, w.size);
		}
		break;
	default:
		break;
	}
	lock.unlock();
	fuse_reply_write(req, size);
}

void op_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info *)
{
	if (ino != kStatsIno) {
		std::lock_guard lock(g_standin.mu);
		--(is_event_ino(ino) ? g_standin.event_files : g_standin.channel_files);
		auto it = g_standin.channels.find(channel_of(ino));
		if (it != g_standin.channels.end() && --it->second.open_files == 0)
			g_standin.channels.erase(it);
	}
	fuse_reply_err(req, 0);
}

struct Command {
	rdma_ucm_cmd_hdr hdr;
	uint64_t payload[4];
};

}  // namespace

const uint32_t kCmGetEvent = RDMA_USER_CM_CMD_GET_EVENT;
const uint32_t kCmNotify = RDMA_USER_CM_CMD_NOTIFY;
const uint32_t kCmQuery = RDMA_USER_CM_CMD_QUERY;
const size_t kCmCommandSize = sizeof(Command);

ssize_t write_cm_command(int fd, uint32_t cmd)
{
	Command c{};
	c.hdr = {cmd, sizeof(c.payload), 0};
	return ::write(fd, &c, sizeof(c));
}

int cm_standin_serve(const char *mountpoint)
{
	fuse_lowlevel_ops ops{};
	ops.lookup = op_lookup;
	ops.getattr = op_getattr;
	ops.create = op_create;
	ops.open = op_open;
	ops.read = op_read;
	ops.write = op_write;
	ops.release = op_release;
	const char *argv[] = {"cm_standin", "-o", "fsname=xsrc-cm-standin,subtype=xsrc-cm-standin"};
	fuse_args args = FUSE_ARGS_INIT(3, const_cast<char **>(argv));
	fuse_session *se = fuse_session_new(&args, &ops, sizeof(ops), nullptr);
	fuse_opt_free_args(&args);
	if (!se || fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, mountpoint) != 0) {
		std::fprintf(stderr, "cm_standin: cannot mount %s\n", mountpoint);
		return 1;
	}
	fuse_loop_config *cfg = fuse_loop_cfg_create();
	fuse_loop_cfg_set_idle_threads(cfg, 4);
	int ret = fuse_session_loop_mt(se, cfg);
	fuse_loop_cfg_destroy(cfg);
	fuse_session_unmount(se);
	fuse_remove_signal_handlers(se);
	fuse_session_destroy(se);
	return ret ? 1 : 0;
}

}  // namespace xsrc::test
