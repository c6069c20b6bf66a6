// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
#include "harness/device_stats.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace xsrc::harness {

std::optional<DeviceStatus> device_status(const std::string &device)
{
	const char *xsrc = getenv("XSRC");
	std::string cmd = std::string(xsrc && *xsrc ? xsrc : "xsrc") + " status 2>/dev/null";
	FILE *p = popen(cmd.c_str(), "r");
	if (!p)
		return std::nullopt;
	std::optional<DeviceStatus> found;
	char line[512];
	while (fgets(line, sizeof(line), p)) {
		std::istringstream fields(line);
		std::string field;
		if (found || !(fields >> field) || field != device)
			continue;
		DeviceStatus &st = found.emplace();
		while (fields >> field) {
			auto value = field.substr(field.find('=') + 1);
			if (field.starts_with("netdev="))
				st.netdev = value;
			else if (field.starts_with("port="))
				st.port = value;
			else if (field.starts_with("contexts="))
				st.contexts = std::stoi(value);
			else if (field.starts_with("objects="))
				st.objects = std::stoi(value);
		}
	}
	pclose(p);
	return found;
}

long device_objects(const std::string &device)
{
	auto st = device_status(device);
	return st ? st->objects : -1;
}

long proc_status_kb(pid_t pid, const std::string &field)
{
	std::ifstream in("/proc/" + std::to_string(pid) + "/status");
	std::string line;
	std::string key = field + ":";
	while (std::getline(in, line))
		if (line.rfind(key, 0) == 0)
			return std::stol(line.substr(key.size()));
	return -1;
}

pid_t daemon_pid(const std::string &rundir)
{
	std::ifstream in(rundir + "/xsrcd.pid");
	pid_t pid = -1;
	in >> pid;
	return pid;
}

std::string device_arena_path(const std::string &device)
{
	const char *sysfs = getenv("SYSFS_PATH");
	std::ifstream in(std::string(sysfs ? sysfs : "/sys") + "/class/infiniband/" + device + "/xsrc_shm_path");
	std::string path;
	std::getline(in, path);
	return path;
}

long allocated_kb(const std::string &path)
{
	struct stat st;
	return !path.empty() && stat(path.c_str(), &st) == 0 ? st.st_blocks / 2 : -1;
}

}  // namespace xsrc::harness
