// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// A same-user peer's SysV shared memory, attached here (peer_shm.h).
#include "peer_shm.h"

#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// Nothing here allocates with new: a context is made, and the data path
// runs, where no exception may be thrown (provider_alloc_fail).
namespace {

ino_t ipc_namespace_of(const char *pid)
{
	char path[64];
	std::snprintf(path, sizeof(path), "/proc/%s/ns/ipc", pid);
	struct stat st{};
	return stat(path, &st) == 0 ? st.st_ino : 0;
}

// The SysV segment behind [addr, addr + len) of process `pid`, as its
// /proc/PID/maps shows it: one shared mapping named /SYSVkkkkkkkk, whose
// inode number is the shmid. False when the range is anything else.
bool sysv_segment_of(uint32_t pid, uint64_t addr, uint64_t len, int &shmid, uint64_t &offset)
{
	char path[64];
	std::snprintf(path, sizeof(path), "/proc/%u/maps", pid);
	FILE *maps = std::fopen(path, "re");
	if (!maps)
		return false;
	char *line = nullptr;
	size_t room = 0;
	bool found = false;
	while (getline(&line, &room, maps) > 0) {
		uint64_t start, end, pgoff, inode;
		char perms[5];
		int name_at = 0;
		if (std::sscanf(line, "%" SCNx64 "-%" SCNx64 " %4s %" SCNx64 " %*s %" SCNu64 " %n", &start, &end, perms,
				&pgoff, &inode, &name_at) < 5)
			continue;
		if (addr < start || addr >= end)
			continue;
		// The whole range in this one mapping, shared, of a SysV segment.
		found = len <= end - addr && perms[3] == 's' && name_at > 0 &&
			std::strncmp(line + name_at, "/SYSV", 5) == 0 && inode <= INT32_MAX;
		if (found) {
			shmid = static_cast<int>(inode);
			offset = pgoff + (addr - start);
		}
		break;
	}
	std::free(line);
	std::fclose(maps);
	return found;
}

}  // namespace

xsrc_shm_maps::xsrc_shm_maps()
{
	const char *env = std::getenv("XSRC_SHM_MAPS");
	enabled_ = !(env && std::strcmp(env, "0") == 0);
	ipc_ns_ = ipc_namespace_of("self");
}

xsrc_shm_maps::~xsrc_shm_maps()
{
	for (size_t i = 0; i < attached_count_; ++i)
		shmdt(attached_[i].base);
}

unsigned char *xsrc_shm_maps::find(const xsrc_mr_entry &mr, uint32_t key, uint32_t pid, uint64_t va,
				   uint64_t len)
{
	if (!enabled_)
		return nullptr;
	// The entry as it is now: a re-registration that moved it (same key,
	// new range) is learnt again.
	uint64_t addr = mr.addr, length = mr.length;
	if (va < addr || len > length || va - addr > length - len)
		return nullptr;
	std::lock_guard guard(lock_);
	Known *hit = nullptr;
	for (size_t i = 0; i < known_count_ && !hit; ++i)
		if (known_[i].key == key && known_[i].pid == pid)
			hit = &known_[i];
	if (!hit || hit->addr != addr || hit->length != length) {
		if (!hit) {
			hit = &known_[known_count_ < kKnown ? known_count_++ : known_next_++ % kKnown];
		}
		*hit = resolve(mr, key, pid);
		hit->addr = addr;
		hit->length = length;
	}
	return hit->local ? hit->local + (va - addr) : nullptr;
}

xsrc_shm_maps::Known xsrc_shm_maps::resolve(const xsrc_mr_entry &mr, uint32_t key, uint32_t pid)
{
	Known k;
	k.pid = pid;
	k.key = key;
	char p[16];
	std::snprintf(p, sizeof(p), "%u", pid);
	int shmid = -1;
	uint64_t offset = 0;
	if (!ipc_ns_ || ipc_namespace_of(p) != ipc_ns_ ||
	    !sysv_segment_of(pid, mr.addr, mr.length, shmid, offset))
		return k;
	// Our user's segment only: another user's memory is reached through
	// the device, which checks the key on its own records.
	shmid_ds ds{};
	if (shmctl(shmid, IPC_STAT, &ds) != 0 || ds.shm_perm.uid != geteuid() || offset > ds.shm_segsz ||
	    mr.length > ds.shm_segsz - offset)
		return k;
	uint64_t size = ds.shm_segsz;
	if (void *base = attach(shmid, size); base && offset + mr.length <= size)
		k.local = static_cast<unsigned char *>(base) + offset;
	return k;
}

void *xsrc_shm_maps::attach(int shmid, uint64_t &size)
{
	for (size_t i = 0; i < attached_count_; ++i)
		if (attached_[i].shmid == shmid) {
			size = attached_[i].size;
			return attached_[i].base;
		}
	if (attached_count_ == kAttached)
		return nullptr;  // enough segments: the rest go the ordinary way
	void *base = shmat(shmid, nullptr, 0);
	if (base == reinterpret_cast<void *>(-1))
		return nullptr;
	attached_[attached_count_++] = {shmid, base, size};
	return base;
}
