#!/usr/bin/python3
# devinfo: unmodified ibverbs-utils programs find and describe xsrc0, both
# through `xsrc run` (private mount namespace, no SYSFS_PATH) and with the
# environment `xsrc env` prints (SYSFS_PATH + RDMAV_DRIVERS).
import os
import re
import unittest

from xsrc_testlib import DEVICE, XSRC, PrivateDevice, parse_devinfo_gids, run, status, wait_for


def env_without_sysfs_path():
    env = dict(os.environ)
    env.pop("SYSFS_PATH", None)
    return env


class DevinfoTest(unittest.TestCase):
    def check_devinfo_v(self, out):
        self.assertIn(f"hca_id:\t{DEVICE}", out)
        self.assertRegex(out, r"state:\s+PORT_ACTIVE \(4\)")
        self.assertRegex(out, r"link_layer:\s+Ethernet")
        self.assertRegex(out, r"phys_state:\s+LINK_UP")
        self.assertRegex(out, r"transport:\s+InfiniBand \(0\)")
        gids = parse_devinfo_gids(out)
        self.assertTrue(gids, "no GID lines in ibv_devinfo -v output:\n" + out)
        self.assertTrue(any(t == "RoCE v2" for _, t in gids.values()),
                        f"no RoCE v2 GID among {gids}")
        # Printed indices are exactly 0..n-1: the valid GIDs come first.
        self.assertEqual(sorted(gids), list(range(len(gids))))
        m = re.search(r"gid_tbl_len:\s+(\d+)", out)
        self.assertIsNotNone(m)
        self.assertLessEqual(len(gids), int(m.group(1)))
        # UD multicast (driver ABI r3): the limits the device enforces.
        self.assertRegex(out, r"max_mcast_grp:\s+1024\n")
        self.assertRegex(out, r"max_mcast_qp_attach:\s+64\n")
        self.assertRegex(out, r"max_total_mcast_qp_attach:\s+8192\n")
        # Memory windows (driver ABI r4): types 1 and 2B, the limit the device enforces.
        self.assertRegex(out, r"max_mw:\s+16384\n")
        self.assertRegex(out, r"device_cap_flags:.*\n(\t+[A-Z_0-9]+\n)*\t+MEM_WINDOW\n")
        self.assertRegex(out, r"\n\t+MEM_WINDOW_TYPE_2B\n")
        self.assertNotRegex(out, r"MEM_WINDOW_TYPE_2A")
        # On-demand paging (the data path never pins pages): every transport,
        # every operation it has; implicit MRs too.
        self.assertRegex(out, r"general_odp_caps:\n\s+ODP_SUPPORT\n\s+ODP_SUPPORT_IMPLICIT\n")
        everything = r"\s+SUPPORT_SEND\n\s+SUPPORT_RECV\n\s+SUPPORT_WRITE\n\s+SUPPORT_READ\n" \
                     r"\s+SUPPORT_ATOMIC\n\s+SUPPORT_SRQ\n"
        self.assertRegex(out, r"rc_odp_caps:\n" + everything)
        self.assertRegex(out, r"uc_odp_caps:\n\s+SUPPORT_SEND\n\s+SUPPORT_RECV\n\s+SUPPORT_WRITE\n"
                         r"\s+SUPPORT_SRQ\n")
        self.assertRegex(out, r"ud_odp_caps:\n\s+SUPPORT_SEND\n\s+SUPPORT_RECV\n\s+SUPPORT_SRQ\n")
        self.assertRegex(out, r"xrc_odp_caps:\n\s+SUPPORT_SEND\n\s+SUPPORT_WRITE\n\s+SUPPORT_READ\n"
                         r"\s+SUPPORT_ATOMIC\n\s+SUPPORT_SRQ\n")

    def test_run_ibv_devices(self):
        # Without SYSFS_PATH: `xsrc run` must make the device visible by itself.
        out = run([XSRC, "run", "--", "ibv_devices"], env=env_without_sysfs_path()).stdout
        names = [line.split()[0] for line in out.splitlines()[2:] if line.strip()]
        self.assertIn(DEVICE, names, out)

    def test_run_ibv_devinfo_v(self):
        proc = run([XSRC, "run", "--", "ibv_devinfo", "-v"], env=env_without_sysfs_path())
        self.check_devinfo_v(proc.stdout)

    def test_run_exit_status_is_the_programs(self):
        self.assertEqual(run([XSRC, "run", "--", "sh", "-c", "exit 7"], check=False).returncode, 7)
        # An unknown device: ibv_devinfo fails, and so does `xsrc run`.
        proc = run([XSRC, "run", "--", "ibv_devinfo", "-d", "no_such_dev0"], check=False)
        self.assertNotEqual(proc.returncode, 0)

    def test_run_does_not_leak_into_host_sysfs(self):
        run([XSRC, "run", "--", "ibv_devices"])
        self.assertFalse(os.path.exists(f"/sys/class/infiniband/{DEVICE}"),
                         "xsrc run left the device view in the host's /sys/class")

    def test_plain_env_ibv_devinfo_d(self):
        self.assertTrue(os.environ.get("SYSFS_PATH"), "the fixture must set SYSFS_PATH")
        self.assertTrue(os.environ.get("RDMAV_DRIVERS"), "the fixture must set RDMAV_DRIVERS")
        out = run(["ibv_devinfo", "-d", DEVICE]).stdout
        self.assertIn(f"hca_id:\t{DEVICE}", out)
        self.assertRegex(out, r"state:\s+PORT_ACTIVE \(4\)")
        self.assertRegex(out, r"link_layer:\s+Ethernet")
        out_v = run(["ibv_devinfo", "-v", "-d", DEVICE]).stdout
        self.check_devinfo_v(out_v)

    def test_plain_env_ibv_devices(self):
        out = run(["ibv_devices"]).stdout
        names = [line.split()[0] for line in out.splitlines()[2:] if line.strip()]
        self.assertIn(DEVICE, names, out)

    def test_node_guid_matches_status_and_devices(self):
        devices = run(["ibv_devices"]).stdout
        guid = None
        for line in devices.splitlines():
            fields = line.split()
            if fields and fields[0] == DEVICE:
                guid = fields[1]
        self.assertIsNotNone(guid)
        info = run(["ibv_devinfo", "-v", "-d", DEVICE]).stdout
        m = re.search(r"node_guid:\s+([0-9a-f:]+)", info)
        self.assertEqual(m.group(1).replace(":", ""), guid)

    def test_devinfo_leaves_no_context_behind(self):
        # On a device of our own: nobody else's contexts count there.
        with PrivateDevice("xsrcinfo") as dev:
            out = run(["ibv_devices"]).stdout
            self.assertIn("xsrcinfo", out)
            run(["ibv_devinfo", "-v", "-d", dev.name])
            # FUSE delivers the release asynchronously after the program exits.
            st = wait_for(lambda: (lambda s: s if s and s["contexts"] == 0 else None)(dev.status()), 5)
            st = st or dev.status()
            self.assertIsNotNone(st)
            self.assertEqual(st["port"], "ACTIVE")
            self.assertEqual(st["contexts"], 0, st)
            self.assertEqual(st["objects"], 0, st)
        self.assertIsNone(status("xsrcinfo"))
        self.assertNotIn("xsrcinfo", run(["ibv_devices"]).stdout)


if __name__ == "__main__":
    unittest.main()
