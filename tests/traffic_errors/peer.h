// The other process of every traffic_errors case. The test binary re-execs
// itself as `--peer LINK_FD SCRATCH_FD` (harness/child.h): a fresh process that shares nothing
// verbs-related with the test, opens its own context on the test device and
// then serves commands (Msg, "cmd=...") over the harness link (a socketpair):
// create CQs/SRQs/MRs/QPs, connect them, post receives, poll, check memory,
// wait for events, run a receive sink or an atomic hammer. SCRATCH_FD is a
// memfd both processes map, for results too big for a message.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "harness/child.h"
#include "traffic_util.h"

namespace xsrc_traffic {

// The peer side: runs until "exit" or until the test goes away.
int peer_main(Link &link, int scratch_fd);

// The test side: a running peer process.
class Peer {
public:
	Peer();               // spawns it and waits for its hello (gid, mtu)
	~Peer();              // kills it if it is still running
	Peer(const Peer &) = delete;
	Peer &operator=(const Peer &) = delete;

	// Sends a command and waits for its reply; throws on an error reply,
	// on timeout, or if the peer died.
	Msg call(const Msg &m, ms timeout = 10s);
	// The two halves, for commands that block in the peer while the test
	// acts.
	void send(const Msg &m);
	Msg reply(ms timeout);

	// SIGKILL and reap (a dead peer for the dead-peer cases).
	void kill();
	// Asks the peer to clean up and exit; returns its cleanup errors
	// ("" if none) and whether it exited with status 0.
	std::string finish(bool *exited_ok = nullptr);

	pid_t pid() const { return child_.pid(); }
	bool alive() const { return child_.running(); }
	ibv_gid gid{};
	uint32_t mtu_bytes = 0;
	uint64_t *scratch = nullptr;  // shared with the peer
	size_t scratch_size = 0;

private:
	xsrc::unique_fd scratch_fd_;
	xsrc::harness::Child child_;
};

}  // namespace xsrc_traffic
