#!/usr/bin/python3
# cm_run: what `xsrc run` and `xsrc env` give rdma_cm programs on xsrc0: the
# rdma_cm class files and device/net/<netdev> in the sysfs view, and
# libxsrc-preload.so in LD_PRELOAD, first, once, after which whatever the
# caller had there is kept.
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "device"))
from xsrc_testlib import DEVICE, XSRC, run, status  # noqa: E402

RUNDIR = os.environ.get("XSRC_RUNDIR", "/run/xsrc")
SYSFS = os.environ["SYSFS_PATH"]
PRELOAD = os.path.realpath(os.path.join(os.path.dirname(os.path.realpath(XSRC)), "..", "lib",
                                        "libxsrc-preload.so"))
# A preload the user already had (rsockets' librspreload.so, say); ld.so warns
# that it cannot load it and goes on.
USER_PRELOAD = "/nonexistent/librspreload.so"
RSPRELOAD = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so"  # librdmacm1's, on amd64


def env_with(**changes):
    env = dict(os.environ)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def in_run(*command, env=None):
    return run([XSRC, "run", "--", *command], env=env).stdout


class CmViewTest(unittest.TestCase):
    def test_run_shows_the_rdma_cm_class(self):
        env = env_with(SYSFS_PATH=None)
        self.assertEqual(in_run("cat", "/sys/class/infiniband_ucma/abi_version", env=env), "4\n")
        self.assertEqual(in_run("cat", "/sys/class/infiniband_ucma/xsrc_cm_dir", env=env),
                         os.path.join(RUNDIR, "fs", "rdma_cm") + "\n")
        # The real misc class stays (librdmacm reads class/misc/rdma_cm first).
        self.assertEqual(in_run("ls", "/sys/class/misc", env=env).split(),
                         sorted(os.listdir("/sys/class/misc")))

    def test_sysfs_path_view_has_the_rdma_cm_class(self):
        with open(os.path.join(SYSFS, "class/infiniband_ucma/abi_version")) as f:
            self.assertEqual(f.read(), "4\n")

    def test_device_net_names_the_netdev(self):
        st = status(DEVICE)
        self.assertIsNotNone(st, f"{DEVICE} is not up")
        # As pyverbs' tests/base.py finds it: the first name `ls` prints.
        out = in_run("ls", f"/sys/class/infiniband/{DEVICE}/device/net/", env=env_with(SYSFS_PATH=None))
        self.assertEqual(out.split(), [st["netdev"]])
        self.assertEqual(os.listdir(os.path.join(SYSFS, "class/infiniband", DEVICE, "device/net")),
                         [st["netdev"]])
        self.assertTrue(os.path.isdir(f"/sys/class/net/{st['netdev']}"))


class PreloadEnvTest(unittest.TestCase):
    def test_run_preloads_the_interposer(self):
        self.assertTrue(os.path.exists(PRELOAD), PRELOAD)
        self.assertEqual(in_run("sh", "-c", 'printf %s "$LD_PRELOAD"', env=env_with(LD_PRELOAD=None)),
                         PRELOAD)
        maps = in_run("cat", "/proc/self/maps", env=env_with(LD_PRELOAD=None))
        self.assertIn(PRELOAD, maps, "the program run does not have the interposer loaded")

    @unittest.skipUnless(os.path.exists(RSPRELOAD), f"no {RSPRELOAD}")
    def test_run_loads_rsockets_preload_beside_it(self):
        maps = in_run("cat", "/proc/self/maps", env=env_with(LD_PRELOAD=RSPRELOAD))
        self.assertIn(PRELOAD, maps)
        self.assertIn(os.path.realpath(RSPRELOAD), maps)

    def test_run_keeps_the_users_preload_and_never_adds_twice(self):
        for before, after in [(USER_PRELOAD, f"{PRELOAD} {USER_PRELOAD}"),
                              (f"{USER_PRELOAD}:{PRELOAD}", f"{PRELOAD} {USER_PRELOAD}"),
                              (f"{PRELOAD} /a.so /b.so", f"{PRELOAD} /a.so /b.so")]:
            out = in_run("sh", "-c", 'printf %s "$LD_PRELOAD"', env=env_with(LD_PRELOAD=before))
            self.assertEqual(out, after, f"LD_PRELOAD={before!r}")

    def test_run_lets_asan_programs_start_behind_the_preload(self):
        for before, after in [(None, "verify_asan_link_order=0"),
                              ("detect_leaks=0", "detect_leaks=0:verify_asan_link_order=0"),
                              ("verify_asan_link_order=1", "verify_asan_link_order=1")]:
            out = in_run("sh", "-c", 'printf %s "$ASAN_OPTIONS"', env=env_with(ASAN_OPTIONS=before))
            self.assertEqual(out, after, f"ASAN_OPTIONS={before!r}")

    def test_env_keeps_the_users_preload_and_never_adds_twice(self):
        script = 'eval "$("$XSRC" env)" && eval "$("$XSRC" env)" && printf %s "$LD_PRELOAD"'
        for shell in ("sh", "bash"):
            for before, after in [(None, PRELOAD), ("", PRELOAD),
                                  (USER_PRELOAD, f"{PRELOAD} {USER_PRELOAD}"),
                                  (f"/a.so:{PRELOAD}", f"/a.so:{PRELOAD}")]:
                proc = subprocess.run([shell, "-c", script], capture_output=True, text=True,
                                      env=env_with(LD_PRELOAD=before, XSRC=XSRC), timeout=30)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertEqual(proc.stdout, after, f"{shell}, LD_PRELOAD={before!r}")


# librdmacm's own open of the channel (rdma_create_event_channel): needs the
# daemon to serve its rdma_cm directory.
@unittest.skipUnless(os.path.isdir(os.path.join(RUNDIR, "fs", "rdma_cm")),
                     "xsrcd serves no rdma_cm directory")
class EventChannelTest(unittest.TestCase):
    CODE = "from pyverbs.cmid import CMEventChannel; CMEventChannel().close(); print('ok')"

    def test_run_creates_an_event_channel(self):
        self.assertEqual(in_run(sys.executable, "-c", self.CODE, env=env_with(LD_PRELOAD=None)), "ok\n")

    def test_env_creates_an_event_channel(self):
        proc = subprocess.run(["sh", "-c", f'eval "$("$XSRC" env)" && exec "{sys.executable}" -c "{self.CODE}"'],
                              capture_output=True, text=True, env=env_with(XSRC=XSRC), timeout=60)
        self.assertEqual(proc.stdout, "ok\n", proc.stderr)

    def test_without_the_interposer_there_is_no_channel(self):
        proc = subprocess.run([XSRC, "run", "--", "env", "-u", "LD_PRELOAD", sys.executable, "-c", self.CODE],
                              capture_output=True, text=True, timeout=60)
        self.assertNotEqual(proc.returncode, 0, "an event channel without the interposer: is there kernel rdma_cm?")


if __name__ == "__main__":
    unittest.main()
