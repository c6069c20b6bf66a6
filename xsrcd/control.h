// The control socket server (see control_protocol.h): `xsrc up/down/status`.
#pragma once

#include <pthread.h>

#include <atomic>
#include <string>
#include <thread>

namespace xsrc {

class Daemon;

class ControlServer {
public:
	// `on_shutdown` is called (from the server thread) after a shutdown
	// request was answered.
	ControlServer(Daemon &daemon, std::string socket_path, void (*on_shutdown)());
	~ControlServer();  // stops the thread and removes the socket
	int start();       // binds and starts serving; 0 or an errno

private:
	void serve();
	std::string handle(const std::string &request, bool &shutdown);

	Daemon &daemon_;
	std::string path_;
	void (*on_shutdown_)();
	int listen_fd_ = -1;
	int stop_fd_ = -1;  // eventfd that wakes the server thread to stop
	std::thread thread_;
};

}  // namespace xsrc
