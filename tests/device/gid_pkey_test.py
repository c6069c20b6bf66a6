#!/usr/bin/python3
# gid_pkey: the GID and P_Key tables libibverbs reads (sysfs view) agree with
# ibv_devinfo, with the netdev the device is bound to, and with RoCE v2 rules.
import errno
import ipaddress
import unittest

import pyverbs.device as d
import pyverbs.enums as e

from xsrc_testlib import (DEVICE, errno_of, gid_of_addr, netdev_addrs, parse_devinfo_gids,
                          pyverbs_gid, run, status)

ZERO_GID = ipaddress.IPv6Address("::")


class GidPkeyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        st = status()
        assert st is not None, f"{DEVICE} is not up"
        cls.netdev = st["netdev"]
        cls.ifindex, cls.addrs = netdev_addrs(cls.netdev)
        cls.devinfo = run(["ibv_devinfo", "-v", "-d", DEVICE]).stdout
        cls.devinfo_gids = parse_devinfo_gids(cls.devinfo)
        cls.ctx = d.Context(name=DEVICE)
        cls.port = cls.ctx.query_port(1)
        cls.gid_tbl_len = cls.port.gid_tbl_len
        # The valid entries: query_gid_ex succeeds on them.
        cls.entries = []
        for i in range(cls.gid_tbl_len):
            try:
                cls.entries.append(cls.ctx.query_gid_ex(1, i))
            except Exception:  # noqa: BLE001 - the first invalid index ends the table
                break

    @classmethod
    def tearDownClass(cls):
        cls.ctx.close()

    def test_port_is_roce(self):
        self.assertEqual(self.port.link_layer, e.IBV_LINK_LAYER_ETHERNET)
        self.assertEqual(self.port.state, e.IBV_PORT_ACTIVE)
        self.assertGreater(self.gid_tbl_len, 0)
        self.assertEqual(self.port.pkey_tbl_len, 1)
        self.assertIn(f"gid_tbl_len:\t\t{self.gid_tbl_len}", self.devinfo)

    def test_valid_entries_are_roce_v2_on_the_netdev(self):
        self.assertTrue(self.entries, "no valid GID")
        for i, ent in enumerate(self.entries):
            self.assertEqual(ent.gid_index, i)
            self.assertEqual(ent.port_num, 1)
            self.assertEqual(ent.gid_type, e.IBV_GID_TYPE_ROCE_V2, f"GID[{i}]")
            self.assertEqual(ent.ndev_ifindex, self.ifindex,
                             f"GID[{i}] ndev ifindex vs {self.netdev}")
            self.assertEqual(self.ctx.query_gid_type(1, i), e.IBV_GID_TYPE_SYSFS_ROCE_V2)

    def test_query_gid_and_query_gid_ex_agree(self):
        for i, ent in enumerate(self.entries):
            self.assertEqual(pyverbs_gid(self.ctx.query_gid(1, i)), pyverbs_gid(ent), f"GID[{i}]")

    def test_agrees_with_ibv_devinfo(self):
        ours = {i: pyverbs_gid(ent) for i, ent in enumerate(self.entries)}
        theirs = {i: gid for i, (gid, _) in self.devinfo_gids.items()}
        self.assertEqual(ours, theirs)
        for i, (_, gid_type) in self.devinfo_gids.items():
            self.assertEqual(gid_type, "RoCE v2", f"GID[{i}]")

    def test_agrees_with_netdev_addresses(self):
        gids = [pyverbs_gid(ent) for ent in self.entries]
        self.assertEqual(len(gids), len(set(gids)), f"duplicate GIDs {gids}")
        self.assertNotIn(ZERO_GID, gids)
        expected = {gid_of_addr(a) for a in self.addrs}
        # A link-local GID is always there (derived from the MAC when the
        # netdev has no link-local address).
        self.assertTrue(any(g.is_link_local for g in gids), gids)
        for a in self.addrs:
            if a.version == 4:
                self.assertIn(gid_of_addr(a), gids, f"IPv4-mapped GID of {a}")
                self.assertEqual(gid_of_addr(a).ipv4_mapped, a)
            else:
                self.assertIn(a, gids, f"GID of IPv6 address {a}")
        extra = set(gids) - expected
        self.assertTrue(all(g.is_link_local for g in extra),
                        f"GIDs not backed by an address of {self.netdev}: {extra}")

    def test_link_local_gid_first(self):
        # RoCE convention (rxe, mlx5): the default link-local GID is index 0.
        self.assertTrue(pyverbs_gid(self.entries[0]).is_link_local, pyverbs_gid(self.entries[0]))

    def test_query_gid_table(self):
        table = self.ctx.query_gid_table(self.gid_tbl_len)
        self.assertEqual(len(table), len(self.entries))
        for ent in table:
            self.assertEqual(ent.gid_type, e.IBV_GID_TYPE_ROCE_V2)
            self.assertEqual(ent.ndev_ifindex, self.ifindex)
            self.assertEqual(pyverbs_gid(ent), pyverbs_gid(self.entries[ent.gid_index]))

    def test_indices_past_valid_ones(self):
        n = len(self.entries)
        for i in range(n, self.gid_tbl_len):
            # Unused entries read as the zero GID ...
            self.assertEqual(pyverbs_gid(self.ctx.query_gid(1, i)), ZERO_GID, f"GID[{i}]")
            # ... which query_gid_ex reports as "no data" (libibverbs' own rule).
            with self.assertRaises(Exception) as cm:
                self.ctx.query_gid_ex(1, i)
            self.assertEqual(errno_of(cm.exception), errno.ENODATA, str(cm.exception))
        # Past the table: EINVAL, not a crash or a made-up entry.
        for i in (self.gid_tbl_len, self.gid_tbl_len + 1, 1000):
            with self.assertRaises(Exception) as cm:
                self.ctx.query_gid_ex(1, i)
            self.assertEqual(errno_of(cm.exception), errno.EINVAL, str(cm.exception))
            with self.assertRaises(Exception):
                self.ctx.query_gid(1, i)

    def test_wrong_port(self):
        for port in (0, 2):
            with self.assertRaises(Exception):
                self.ctx.query_gid_ex(port, 0)
            with self.assertRaises(Exception):
                self.ctx.query_pkey(port, 0)
            with self.assertRaises(Exception):
                self.ctx.query_port(port)

    def test_pkey(self):
        self.assertEqual(self.ctx.query_pkey(1, 0), 0xffff)  # default full-member P_Key
        with self.assertRaises(Exception):
            self.ctx.query_pkey(1, 1)  # pkey_tbl_len is 1

    def test_gid_of_each_ipv4_address_in_sysfs_order(self):
        # The IPv4-mapped GIDs follow the link-local one in the order the
        # kernel lists the addresses (netdev.h documents the table order).
        v4 = [gid_of_addr(a) for a in self.addrs if a.version == 4]
        gids = [pyverbs_gid(ent) for ent in self.entries]
        self.assertEqual(gids[1:1 + len(v4)], v4)


if __name__ == "__main__":
    unittest.main()
