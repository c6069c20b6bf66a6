// SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB)
// One round of fault_rounds (rounds.cpp): two participants (forked children)
// run a workload of one kind between them, a victim is killed, and each
// survivor reports what it saw. The kinds: verbs on RC or XRC QPs, the UCT
// shim (uct/), and RC QPs connected through rdma_cm.
#pragma once

#include <cstdint>
#include <functional>

#include "harness/link.h"
#include "side.h"

namespace xsrc::fault {

enum class Kind : int { rc, xrc, uct, cm, count };
const char *kind_name(Kind k);

enum class Victim : int { client, server, daemon, count };

// What a participant is told first.
struct Setup {
	Kind kind = Kind::rc;
	Op op = Op::send;
	bool server = false;
	uint16_t port = 0;  // rdma_cm: the server's port on 127.0.0.1
};

// What a survivor saw; -1 where nothing happened. A verbs completion status
// for verbs and rdma_cm, a ucs_status_t for UCT.
struct Report {
	int first_status = -1;  // the completion (or UCT status) that ended the workload (-1: a post did)
	int post_err = 0;       // the post that ended it
	int fatal = -1;         // the async event that came (-1: none)
	int bad_status = -1;    // a completion status no rule allows
	int later_post = 0;     // a post after the fault
	int later_status = -1;  // its completion
	int qp_state = -1;      // ibv_query_qp after a peer's death
	int cm_event = -1;      // rdma_cm: the channel's event after the fault (-2: rdma_get_cm_event failed)
	int ep_error = 0;       // UCT: the status the iface's error handler got (0: not called)
	int uct_end = 0;        // UCT: the status that ended the workload
	int uct_later = 0;      // UCT: an op's status after the fault
	int teardown = 0;
	int fd_leak = 0;        // open fds after teardown less those before
	long slowest_ms = 0;    // the longest wait or teardown after the fault
	int hung = 0;           // a completion that never came
};

// Notes in `rep` how long since `since`, if the longest yet.
void note_slowest(Report &rep, Clock::time_point since);

// The steps every participant takes with the parent: ready, then the go;
// the workload ended, then which victim was killed.
bool ready_and_go(harness::Link &link);
bool ended_and_told(harness::Link &link, Victim &victim);

// Verbs on `s`: `op` until a post fails or a completion is not a success.
void verbs_workload(Side &s, Op op, const Info &peer, Report &rep);
// After the fault: the async event, the QP's state, a later post, and the
// completions left (each against what the victim allows).
void verbs_after_fault(Side &s, Op op, const Info &peer, Victim v, Report &rep);

// The rest of a verbs participant once connected: ready, the workload,
// told the victim, verbs_after_fault, `also` (with the teardown's time), the
// teardown. 0, or the exit code of a step that failed.
int verbs_run(harness::Link &link, Side &s, Op op, const Info &peer, Report &rep,
	      const std::function<void(Victim)> &also = {});

// The participants: each connects through the parent (which relays one
// frame each way), says 'r', waits for a go, runs the workload until it
// fails, says 'e', is told the victim, checks, sends its Report. 0 when it
// could report.
int verbs_participant(harness::Link &link, const Setup &setup);
int uct_participant(harness::Link &link, const Setup &setup);
int cm_participant(harness::Link &link, const Setup &setup);

}  // namespace xsrc::fault
