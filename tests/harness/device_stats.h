// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// What a device costs, read from outside: `xsrc status`, /proc and the device's arena
// file. Each returns -1 (or "") when the figure cannot be read.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace xsrc::harness {

// The `xsrc status` line of a device ($XSRC, else xsrc on PATH).
struct DeviceStatus {
	std::string netdev;
	std::string port;
	int contexts = -1;
	int objects = -1;
};
// nullopt when `device` is not listed.
std::optional<DeviceStatus> device_status(const std::string &device);
// Its objects= figure.
long device_objects(const std::string &device);
// A field of /proc/PID/status in kB ("VmRSS", "RssAnon").
long proc_status_kb(pid_t pid, const std::string &field);
// The pid in RUNDIR/xsrcd.pid.
pid_t daemon_pid(const std::string &rundir);
// The device's arena file (xsrc_shm_path under $SYSFS_PATH, else /sys).
std::string device_arena_path(const std::string &device);
// The kB of a (sparse) file that are allocated.
long allocated_kb(const std::string &path);

}  // namespace xsrc::harness
