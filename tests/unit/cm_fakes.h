// The connection manager without FUSE or a second process: a host with one
// fake device (netdev addresses and the RoCE v2 GIDs they give), a caller
// whose memory is a buffer, and a front end that records what it is told.
// Shared by the unit tests (cm_service_test.cpp) and the cm fuzzer
// (tests/fuzz/fuzz_cm.cpp). No GoogleTest here.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cm.h"
#include "netdev.h"

namespace xsrc::cmtest {

inline constexpr const char *kDeviceIpv4 = "10.0.0.1";
inline constexpr const char *kDeviceIpv6 = "fd00::1";

// One device, xsrcfake0 (uverbs0), on netdev fake0 with kDeviceIpv4 and kDeviceIpv6.
class FakeHost final : public CmHost {
public:
	FakeHost()
	{
		CmDevice d;
		d.name = "xsrcfake0";
		d.index = 0;
		d.node_guid = 0x0002c9fffe000001ull;
		d.active_mtu = 3;
		d.netdev.name = "fake0";
		d.netdev.ifindex = 7;
		d.netdev.mac = {0x02, 0, 0, 0, 0, 1};
		d.netdev.mtu = 1500;
		d.netdev.oper_up = true;
		in_addr v4{};
		inet_pton(AF_INET, kDeviceIpv4, &v4);
		d.netdev.ipv4.push_back(v4);
		in6_addr v6{};
		inet_pton(AF_INET6, kDeviceIpv6, &v6);
		d.netdev.ipv6.push_back(v6);
		d.gids = roce_v2_gids(d.netdev);
		devices_.push_back(std::move(d));
	}

	std::vector<CmDevice> cm_devices() override
	{
		std::lock_guard lock(mu_);
		return devices_;
	}
	// What the next hop toward another host is; tests set it.
	Neighbour neighbour = Neighbour::known;
	Neighbour cm_neighbour(int, const sockaddr_storage &) override { return neighbour; }
	void cm_peer_gone(const std::string &device, uint32_t qpn) override
	{
		std::lock_guard lock(mu_);
		gone_.emplace_back(device, qpn);
	}
	std::vector<std::pair<std::string, uint32_t>> gone()
	{
		std::lock_guard lock(mu_);
		return gone_;
	}

private:
	std::mutex mu_;
	std::vector<CmDevice> devices_;
	std::vector<std::pair<std::string, uint32_t>> gone_;
};

// A caller whose memory is [kBase, kBase + size): anything else is EFAULT.
// take_fd() hands out a copy of /dev/null (MIGRATE_ID closes it).
class BufferCaller final : public Caller {
public:
	static constexpr uint64_t kBase = 0x10000000;
	explicit BufferCaller(size_t size = 1 << 16) : mem_(size) {}

	int write_memory(uint64_t addr, std::span<const std::byte> bytes) override
	{
		if (!inside(addr, bytes.size()))
			return EFAULT;
		std::copy(bytes.begin(), bytes.end(), mem_.begin() + static_cast<ptrdiff_t>(addr - kBase));
		return 0;
	}
	int read_memory(uint64_t addr, std::span<std::byte> bytes) override
	{
		if (!inside(addr, bytes.size()))
			return EFAULT;
		std::copy_n(mem_.begin() + static_cast<ptrdiff_t>(addr - kBase), bytes.size(), bytes.begin());
		return 0;
	}
	int take_fd(int fd) override
	{
		if (fd < 0 || fd > 1024)
			return -EBADF;
		int ours = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
		return ours < 0 ? -errno : ours;
	}
	int check_mapped(uint64_t addr, uint64_t length, bool) override { return inside(addr, length) ? 0 : EFAULT; }
	pid_t pid() const override { return 4242; }

	template <typename T>
	T read(uint64_t addr) const
	{
		T v{};
		if (inside(addr, sizeof(T)))
			std::memcpy(&v, mem_.data() + (addr - kBase), sizeof(T));
		return v;
	}
	template <typename T>
	void write(uint64_t addr, const T &v)
	{
		if (inside(addr, sizeof(T)))
			std::memcpy(mem_.data() + (addr - kBase), &v, sizeof(T));
	}
	size_t size() const { return mem_.size(); }

private:
	bool inside(uint64_t addr, uint64_t len) const
	{
		return addr >= kBase && len <= mem_.size() && addr - kBase <= mem_.size() - len;
	}
	std::vector<std::byte> mem_;
};

// What a held GET_EVENT keeps: the same memory as `target`, which outlives it.
class ForwardingCaller final : public Caller {
public:
	explicit ForwardingCaller(Caller &target) : target_(target) {}
	int write_memory(uint64_t addr, std::span<const std::byte> bytes) override
	{
		return target_.write_memory(addr, bytes);
	}
	int read_memory(uint64_t addr, std::span<std::byte> bytes) override { return target_.read_memory(addr, bytes); }
	int take_fd(int fd) override { return target_.take_fd(fd); }
	int check_mapped(uint64_t addr, uint64_t length, bool writable) override
	{
		return target_.check_mapped(addr, length, writable);
	}
	pid_t pid() const override { return target_.pid(); }

private:
	Caller &target_;
};

// Records answers to held GET_EVENTs and readable() calls. Called with the
// CM's lock held (also from its timer thread).
class RecordingFrontEnd final : public CmFrontEnd {
public:
	void answer(uint64_t token, int err) override
	{
		std::lock_guard lock(mu_);
		answers_.emplace_back(token, err);
	}
	void readable(uint64_t channel) override
	{
		std::lock_guard lock(mu_);
		readable_.push_back(channel);
	}
	std::vector<std::pair<uint64_t, int>> answers()
	{
		std::lock_guard lock(mu_);
		return answers_;
	}
	std::vector<uint64_t> readable_calls()
	{
		std::lock_guard lock(mu_);
		return readable_;
	}

private:
	std::mutex mu_;
	std::vector<std::pair<uint64_t, int>> answers_;
	std::vector<uint64_t> readable_;
};

}  // namespace xsrc::cmtest
