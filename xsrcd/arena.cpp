#include "arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

namespace xsrc {
namespace {

constexpr uint64_t round_up(uint64_t v, uint64_t to)
{
	return (v + to - 1) / to * to;
}

struct Layout {
	uint64_t qp_table_off, mr_table_off, srq_table_off, atomic_locks_off, mcast_table_off, rings_off;
};

constexpr Layout arena_layout()
{
	Layout l{};
	l.qp_table_off = round_up(sizeof(xsrc_arena_header), kArenaPage);
	l.mr_table_off = round_up(l.qp_table_off + XSRC_QP_TABLE_LEN * sizeof(xsrc_qp_entry), kArenaPage);
	l.srq_table_off = round_up(l.mr_table_off + XSRC_MR_TABLE_LEN * sizeof(xsrc_mr_entry), kArenaPage);
	l.atomic_locks_off =
		round_up(l.srq_table_off + XSRC_SRQ_TABLE_LEN * sizeof(xsrc_srq_entry), kArenaPage);
	l.mcast_table_off = round_up(l.atomic_locks_off + XSRC_ATOMIC_LOCKS * sizeof(__u32), kArenaPage);
	l.rings_off = round_up(l.mcast_table_off + sizeof(xsrc_mcast_table) +
				       XSRC_MCAST_GROUPS * sizeof(xsrc_mcast_group),
			       kArenaPage);
	return l;
}

constexpr Layout kLayout = arena_layout();
static_assert(kLayout.rings_off < XSRC_ARENA_SIZE / 2, "the tables leave room for rings");

}  // namespace

// --- PageAllocator ---------------------------------------------------------

PageAllocator::PageAllocator(uint64_t first_page, uint64_t page_count, Clock::duration quarantine)
	: quarantine_time_(quarantine)
{
	if (page_count)
		free_.emplace(first_page, page_count);
}

void PageAllocator::insert_free(Range range)
{
	auto next = free_.lower_bound(range.first);
	if (next != free_.begin()) {
		auto prev = std::prev(next);
		if (prev->first + prev->second == range.first) {
			range.first = prev->first;
			range.count += prev->second;
			free_.erase(prev);
		}
	}
	if (next != free_.end() && range.first + range.count == next->first) {
		range.count += next->second;
		free_.erase(next);
	}
	free_.emplace(range.first, range.count);
}

std::optional<uint64_t> PageAllocator::allocate(uint64_t count, Clock::time_point now)
{
	expire(now);
	if (count == 0)
		return std::nullopt;
	for (auto it = free_.begin(); it != free_.end(); ++it) {
		if (it->second < count)
			continue;
		uint64_t first = it->first, left = it->second - count;
		free_.erase(it);
		if (left)
			free_.emplace(first + count, left);
		return first;
	}
	return std::nullopt;
}

void PageAllocator::release(Range range, Clock::time_point now)
{
	if (range.count)
		quarantine_.push_back({now + quarantine_time_, range});
}

std::vector<PageAllocator::Range> PageAllocator::expire(Clock::time_point now)
{
	std::vector<Range> done;
	while (!quarantine_.empty() && quarantine_.front().until <= now) {
		done.push_back(quarantine_.front().range);
		insert_free(quarantine_.front().range);
		quarantine_.pop_front();
	}
	// Adjacent ranges as one run: a context that makes and destroys QPs
	// in a loop releases hundreds of one-page rings side by side, and
	// punching each alone held the daemon's lock (isolation_copy_stall:
	// 1049 of them, 9 ms of fallocate in one CREATE_CQ; none over 0.5 ms
	// merged).
	std::sort(done.begin(), done.end(), [](const Range &a, const Range &b) { return a.first < b.first; });
	std::vector<Range> runs;
	for (const Range &r : done) {
		if (!runs.empty() && runs.back().first + runs.back().count == r.first)
			runs.back().count += r.count;
		else
			runs.push_back(r);
	}
	return runs;
}

uint64_t PageAllocator::free_pages() const
{
	uint64_t n = 0;
	for (const auto &[first, count] : free_)
		n += count;
	return n;
}

uint64_t PageAllocator::quarantined_pages() const
{
	uint64_t n = 0;
	for (const Quarantined &q : quarantine_)
		n += q.range.count;
	return n;
}

// --- Arena -----------------------------------------------------------------

int Arena::create(const std::string &path, std::unique_ptr<Arena> &out, Clock::duration quarantine)
{
	// A file left by a daemon that died: peers that still map it keep their
	// (dead) copy; new contexts get a fresh inode.
	::unlink(path.c_str());
	unique_fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
	if (!fd)
		return errno;
	int err = 0;
	void *base = MAP_FAILED;
	if (::fchmod(fd.get(), 0666) < 0 || ::ftruncate(fd.get(), XSRC_ARENA_SIZE) < 0)
		err = errno;
	if (!err) {
		base = ::mmap(nullptr, XSRC_ARENA_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd.get(), 0);
		if (base == MAP_FAILED)
			err = errno;
	}
	if (err) {
		fd.reset();
		::unlink(path.c_str());
		return err;
	}

	auto *header = static_cast<xsrc_arena_header *>(base);
	header->version = XSRC_ARENA_VERSION;
	header->size = XSRC_ARENA_SIZE;
	header->qp_table_off = kLayout.qp_table_off;
	header->mr_table_off = kLayout.mr_table_off;
	header->srq_table_off = kLayout.srq_table_off;
	header->atomic_locks_off = kLayout.atomic_locks_off;
	auto *mcast = reinterpret_cast<xsrc_mcast_table *>(static_cast<unsigned char *>(base) + kLayout.mcast_table_off);
	mcast->num_groups = XSRC_MCAST_GROUPS;
	header->mcast_table_off = kLayout.mcast_table_off;
	header->magic = XSRC_ARENA_MAGIC;  // last: a mapped header with a magic is complete
	out.reset(new Arena(path, std::move(fd), static_cast<unsigned char *>(base), kLayout.rings_off / kArenaPage,
			    quarantine));
	return 0;
}

Arena::Arena(std::string path, unique_fd fd, unsigned char *base, uint64_t first_ring_page,
	     Clock::duration quarantine)
	: path_(std::move(path)),
	  fd_(std::move(fd)),
	  base_(base),
	  pages_(first_ring_page, XSRC_ARENA_SIZE / kArenaPage - first_ring_page, quarantine)
{
}

Arena::~Arena()
{
	::munmap(base_, XSRC_ARENA_SIZE);
	fd_.reset();
	::unlink(path_.c_str());
}

xsrc_qp_entry &Arena::qp_entry(uint32_t index)
{
	return reinterpret_cast<xsrc_qp_entry *>(base_ + kLayout.qp_table_off)[index % XSRC_QP_TABLE_LEN];
}

xsrc_mr_entry &Arena::mr_entry(uint32_t index)
{
	return reinterpret_cast<xsrc_mr_entry *>(base_ + kLayout.mr_table_off)[index % XSRC_MR_TABLE_LEN];
}

xsrc_srq_entry &Arena::srq_entry(uint32_t index)
{
	return reinterpret_cast<xsrc_srq_entry *>(base_ + kLayout.srq_table_off)[index % XSRC_SRQ_TABLE_LEN];
}

uint32_t &Arena::atomic_lock(uint32_t index)
{
	return reinterpret_cast<uint32_t *>(base_ + kLayout.atomic_locks_off)[index % XSRC_ATOMIC_LOCKS];
}

xsrc_mcast_table &Arena::mcast_table()
{
	return *reinterpret_cast<xsrc_mcast_table *>(base_ + kLayout.mcast_table_off);
}

xsrc_mcast_group &Arena::mcast_group(uint32_t index)
{
	return reinterpret_cast<xsrc_mcast_group *>(&mcast_table() + 1)[index % XSRC_MCAST_GROUPS];
}

// Punching a hole frees the pages and makes every mapping read zeros.
void Arena::zero(uint64_t off, uint64_t bytes)
{
	if (::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(off),
			static_cast<off_t>(bytes)) < 0)
		std::memset(base_ + off, 0, bytes);
}

uint64_t Arena::allocate(uint64_t bytes)
{
	if (bytes == 0 || bytes > XSRC_ARENA_SIZE)
		return 0;
	auto now = Clock::now();
	for (const PageAllocator::Range &r : pages_.expire(now))
		zero(r.first * kArenaPage, r.count * kArenaPage);  // give the memory back early
	uint64_t count = round_up(bytes, kArenaPage) / kArenaPage;
	std::optional<uint64_t> first = pages_.allocate(count, now);
	if (!first)
		return 0;
	uint64_t off = *first * kArenaPage;
	zero(off, count * kArenaPage);
	allocations_.emplace(off, count);
	return off;
}

void Arena::release(uint64_t off)
{
	auto it = allocations_.find(off);
	if (it == allocations_.end())
		return;
	pages_.release({off / kArenaPage, it->second}, Clock::now());
	allocations_.erase(it);
}

}  // namespace xsrc
