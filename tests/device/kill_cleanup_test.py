#!/usr/bin/python3
# kill_cleanup: a verbs process that dies by SIGKILL leaves nothing behind in
# xsrcd: its contexts and objects go within a bounded time, whether it died
# idle, in the middle of a stream of commands, or with several contexts open.
# These run on a device of the test's own, where "contexts=0 objects=0" must
# hold exactly whoever else uses xsrc0; test_on_xsrc0 repeats the basic case
# on xsrc0 itself, relative to its counts before.
import os
import select
import signal
import subprocess
import sys
import time
import unittest

from xsrc_testlib import PrivateDevice, status, wait_for

PRIVATE = "xsrckill"
_device = PrivateDevice(PRIVATE)


def setUpModule():
    _device.__enter__()


def tearDownModule():
    _device.__exit__(None, None, None)


# The child: allocates objects on `contexts` contexts, prints "ready", then
# sleeps, or (busy) keeps creating and destroying objects until killed.
CHILD = r"""
import sys, time
import pyverbs.device as d, pyverbs.pd as p, pyverbs.mr as m, pyverbs.cq as c
import pyverbs.enums as e
name, contexts, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
keep = []
for _ in range(contexts):
    ctx = d.Context(name=name)
    pd = p.PD(ctx)
    mr = m.MR(pd, 65536, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ)
    cq = c.CQ(ctx, 64)
    ch = c.CompChannel(ctx)
    cq2 = c.CQ(ctx, 16, None, ch, 0)
    cq2.req_notify()
    keep += [ctx, pd, mr, cq, ch, cq2]
print("ready", flush=True)
if mode == "busy":
    ctx, pd = keep[0], keep[1]
    while True:
        mr = m.MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
        cq = c.CQ(ctx, 8)
        ctx.query_port(1)
        cq.close()
        mr.close()
else:
    time.sleep(600)
"""

READY_TIMEOUT = 30
CLEANUP_TIMEOUT = 10


class KillCleanupTest(unittest.TestCase):
    device = PRIVATE

    def setUp(self):
        self.child = None
        self.assertIsNotNone(status(self.device), f"{self.device} is not up")

    def tearDown(self):
        self.reap()

    def reap(self):
        if self.child:
            if self.child.poll() is None:
                self.child.kill()
            self.child.wait(timeout=10)
            self.child.stdout.close()
            self.child.stderr.close()
        self.child = None

    def start_child(self, contexts=1, mode="idle"):
        self.reap()
        self.child = subprocess.Popen([sys.executable, "-c", CHILD, self.device, str(contexts), mode],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.child.stdout], [], [], READY_TIMEOUT)
        line = self.child.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.child.kill()
            _, err = self.child.communicate(timeout=10)
            self.fail(f"child not ready within {READY_TIMEOUT} s: {line!r}\n{err}")

    def kill_and_check(self, contexts, expect=(0, 0)):
        """SIGKILLs the child (which has `contexts` contexts open) and waits for
        the device's (contexts, objects) to become `expect`."""
        base_contexts, base_objects = expect

        def child_visible():
            s = status(self.device)
            return s if s and s["contexts"] >= base_contexts + contexts \
                and s["objects"] > base_objects else None
        st = wait_for(child_visible, 5)
        self.assertTrue(st, f"child's contexts/objects not in xsrc status: {status(self.device)}")
        os.kill(self.child.pid, signal.SIGKILL)
        self.child.wait(timeout=CLEANUP_TIMEOUT)
        self.assertEqual(self.child.returncode, -signal.SIGKILL)
        self.reap()

        def cleaned():
            s = status(self.device)
            return s if s and (s["contexts"], s["objects"]) == expect else None
        st = wait_for(cleaned, CLEANUP_TIMEOUT)
        self.assertTrue(st, f"{CLEANUP_TIMEOUT} s after SIGKILL: {status(self.device)}, "
                            f"expected contexts={base_contexts} objects={base_objects}")

    def test_idle_child(self):
        self.start_child()
        self.kill_and_check(1)

    def test_child_with_several_contexts(self):
        self.start_child(contexts=3)
        self.kill_and_check(3)

    def test_child_killed_mid_commands(self):
        self.start_child(mode="busy")
        time.sleep(0.5)  # let it loop through commands for a while
        if self.child.poll() is not None:
            self.fail("busy child died on its own: " + self.child.communicate(timeout=10)[1])
        self.kill_and_check(1)
        # The daemon still serves new contexts afterwards.
        self.start_child()
        self.kill_and_check(1)

    def test_repeated_kills(self):
        for _ in range(5):
            self.start_child()
            self.kill_and_check(1)
        self.assertEqual(status(self.device)["port"], "ACTIVE")


class KillCleanupOnXsrc0Test(KillCleanupTest):
    """The basic case on xsrc0; others' contexts there are left alone."""
    device = "xsrc0"

    def test_idle_child(self):
        before = status(self.device)
        self.start_child()
        self.kill_and_check(1, expect=(before["contexts"], before["objects"]))

    test_child_with_several_contexts = None
    test_child_killed_mid_commands = None
    test_repeated_kills = None


if __name__ == "__main__":
    unittest.main()
