// The control socket server (see control_protocol.h): `xsrc up/down/status`.
#pragma once

#include <pthread.h>

#include <atomic>
#include <string>
#include <thread>

#include "common/fd.h"

namespace xsrc {

class CmService;
class Daemon;

class ControlServer {
public:
	// `on_shutdown` is called (from the server thread) after a shutdown
	// request was answered.
	ControlServer(Daemon &daemon, std::string socket_path, void (*on_shutdown)());
	~ControlServer();  // stops the thread and removes the socket
	int start();       // binds and starts serving; 0 or an errno
	// `status` also counts the connection manager's objects (before start()).
	void set_cm(CmService *cm) { cm_ = cm; }

private:
	void serve();
	std::string handle(const std::string &request, bool &shutdown);

	Daemon &daemon_;
	CmService *cm_ = nullptr;
	std::string path_;
	void (*on_shutdown_)();
	unique_fd listen_fd_;
	unique_fd stop_fd_;  // eventfd that wakes the server thread to stop
	std::thread thread_;
};

}  // namespace xsrc
