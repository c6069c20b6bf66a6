// Helpers shared by the C++ device tests: opening a device through the stock
// libibverbs, reading `xsrc status`, running commands, and building raw
// uverbs write-ABI commands (<rdma/ib_user_verbs.h>) for ibv_context::cmd_fd.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/ib_user_verbs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness/device_stats.h"

namespace xsrc_test {

inline std::string env_or(const char *name, const char *fallback)
{
	const char *v = getenv(name);
	return v && *v ? v : fallback;
}

inline std::string xsrc_cli() { return env_or("XSRC", "xsrc"); }
inline std::string test_device() { return env_or("XSRC_TEST_DEVICE", "xsrc0"); }

// Runs a shell command; returns its stdout, sets *status to the exit status.
inline std::string run(const std::string &cmd, int *status = nullptr)
{
	std::string out;
	FILE *p = popen((cmd + " 2>&1").c_str(), "r");
	if (!p) {
		if (status)
			*status = -1;
		return out;
	}
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof(buf), p)) > 0)
		out.append(buf, n);
	int rc = pclose(p);
	if (status)
		*status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
	return out;
}

using xsrc::harness::device_status;
using xsrc::harness::DeviceStatus;

// Polls pred() every 20 ms until it is true or `timeout` passes.
template <typename Pred>
bool wait_until(std::chrono::milliseconds timeout, Pred pred)
{
	auto deadline = std::chrono::steady_clock::now() + timeout;
	for (;;) {
		if (pred())
			return true;
		if (std::chrono::steady_clock::now() >= deadline)
			return false;
		std::this_thread::sleep_for(std::chrono::milliseconds(20));
	}
}

// A device of the test's own (`xsrc up --name NAME`) on xsrc0's netdev, so
// that `xsrc status` counts on it are the test's alone whoever else uses
// xsrc0. Taken down by the destructor (and first, if an interrupted run left it).
class PrivateDevice {
public:
	explicit PrivateDevice(std::string name) : name_(std::move(name))
	{
		run(xsrc_cli() + " down --name " + name_);
		auto main = device_status(test_device());
		std::string netdev = main ? " --netdev " + main->netdev : "";
		int status = -1;
		output_ = run(xsrc_cli() + " up --name " + name_ + netdev, &status);
		up_ = status == 0 && device_status(name_).has_value();
	}
	~PrivateDevice() { run(xsrc_cli() + " down --name " + name_); }
	PrivateDevice(const PrivateDevice &) = delete;
	PrivateDevice &operator=(const PrivateDevice &) = delete;

	bool up() const { return up_; }
	const std::string &name() const { return name_; }
	const std::string &output() const { return output_; }  // of `xsrc up`
	std::optional<DeviceStatus> status() const { return device_status(name_); }

private:
	std::string name_;
	std::string output_;
	bool up_ = false;
};

// Opens device `name`; nullptr (errno set) if absent or it fails.
inline ibv_context *open_device(const std::string &name)
{
	int n = 0;
	ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		return nullptr;
	ibv_context *ctx = nullptr;
	errno = ENODEV;
	for (int i = 0; i < n; ++i)
		if (name == ibv_get_device_name(list[i])) {
			ctx = ibv_open_device(list[i]);
			break;
		}
	int saved = errno;
	ibv_free_device_list(list);
	errno = saved;
	return ctx;
}

// --- raw commands ---------------------------------------------------------

// write() of `bytes` to fd: 0 when all was written, else errno (EIO for a
// short write, which the ABI never produces).
inline int raw_write(int fd, const void *bytes, size_t len)
{
	errno = 0;
	ssize_t n = write(fd, bytes, len);
	if (n < 0)
		return errno;
	return static_cast<size_t>(n) == len ? 0 : EIO;
}

inline int raw_write(int fd, const std::vector<std::byte> &bytes)
{
	return raw_write(fd, bytes.data(), bytes.size());
}

template <typename T>
void append(std::vector<std::byte> &out, const T &v)
{
	auto p = reinterpret_cast<const std::byte *>(&v);
	out.insert(out.end(), p, p + sizeof(T));
}

// A legacy (non-extended) command: header + core struct + driver bytes;
// in_words covers everything, out_words = resp_bytes / 4.
template <typename T>
std::vector<std::byte> legacy_cmd(uint32_t command, const T &core, size_t resp_bytes,
				  size_t driver_bytes = 0)
{
	std::vector<std::byte> out;
	ib_uverbs_cmd_hdr hdr{};
	hdr.command = command;
	hdr.in_words = static_cast<uint16_t>((sizeof(hdr) + sizeof(T) + driver_bytes) / 4);
	hdr.out_words = static_cast<uint16_t>(resp_bytes / 4);
	append(out, hdr);
	append(out, core);
	out.resize(out.size() + driver_bytes);
	return out;
}

// An extended command: header + ex header + core + driver bytes.
template <typename T>
std::vector<std::byte> ex_cmd(uint32_t ex_command, const T &core, uint64_t response,
			      size_t core_resp_bytes, size_t driver_in_bytes = 0,
			      size_t driver_resp_bytes = 0)
{
	std::vector<std::byte> out;
	ib_uverbs_cmd_hdr hdr{};
	hdr.command = IB_USER_VERBS_CMD_FLAG_EXTENDED | ex_command;
	hdr.in_words = static_cast<uint16_t>(sizeof(T) / 8);
	hdr.out_words = static_cast<uint16_t>(core_resp_bytes / 8);
	ib_uverbs_ex_cmd_hdr ex{};
	ex.response = response;
	ex.provider_in_words = static_cast<uint16_t>(driver_in_bytes / 8);
	ex.provider_out_words = static_cast<uint16_t>(driver_resp_bytes / 8);
	append(out, hdr);
	append(out, ex);
	append(out, core);
	out.resize(out.size() + driver_in_bytes);
	return out;
}

inline uint64_t ptr(const void *p) { return reinterpret_cast<uintptr_t>(p); }

inline int raw_dealloc_pd(int fd, uint32_t handle)
{
	ib_uverbs_dealloc_pd cmd{};
	cmd.pd_handle = handle;
	return raw_write(fd, legacy_cmd(IB_USER_VERBS_CMD_DEALLOC_PD, cmd, 0));
}

inline int raw_dereg_mr(int fd, uint32_t handle)
{
	ib_uverbs_dereg_mr cmd{};
	cmd.mr_handle = handle;
	return raw_write(fd, legacy_cmd(IB_USER_VERBS_CMD_DEREG_MR, cmd, 0));
}

inline int raw_destroy_cq(int fd, uint32_t handle)
{
	ib_uverbs_destroy_cq_resp resp{};
	ib_uverbs_destroy_cq cmd{};
	cmd.response = ptr(&resp);
	cmd.cq_handle = handle;
	return raw_write(fd, legacy_cmd(IB_USER_VERBS_CMD_DESTROY_CQ, cmd, sizeof(resp)));
}

inline int raw_alloc_pd(int fd, uint32_t *handle)
{
	ib_uverbs_alloc_pd_resp resp{};
	ib_uverbs_alloc_pd cmd{};
	cmd.response = ptr(&resp);
	int err = raw_write(fd, legacy_cmd(IB_USER_VERBS_CMD_ALLOC_PD, cmd, sizeof(resp)));
	if (!err && handle)
		*handle = resp.pd_handle;
	return err;
}

inline int raw_reg_mr(int fd, uint32_t pd_handle, const void *addr, size_t len, uint32_t access,
		      ib_uverbs_reg_mr_resp *out = nullptr)
{
	ib_uverbs_reg_mr_resp resp{};
	ib_uverbs_reg_mr cmd{};
	cmd.response = ptr(&resp);
	cmd.start = ptr(addr);
	cmd.length = len;
	cmd.hca_va = ptr(addr);
	cmd.pd_handle = pd_handle;
	cmd.access_flags = access;
	int err = raw_write(fd, legacy_cmd(IB_USER_VERBS_CMD_REG_MR, cmd, sizeof(resp)));
	if (!err && out)
		*out = resp;
	return err;
}

}  // namespace xsrc_test
