#!/usr/bin/python3
# import: ibv_import_device of a dup of a context's command fd, then
# ibv_import_pd, _mr and _dm (driver ABI r6) through pyverbs, under
# `xsrc run` (its interposer makes fstat call the command fd a character
# device, which ibv_import_device insists on).
import errno
import os
import subprocess
import sys
import unittest

import pyverbs.cq as c
import pyverbs.device as d
import pyverbs.enums as e
import pyverbs.mr as m
import pyverbs.pd as p
import pyverbs.qp as q
import pyverbs.srq as srq
from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError

from xsrc_testlib import errno_of

DEVICE = "xsrc0"


class Import(unittest.TestCase):
    def setUp(self):
        self.ctx = d.Context(name=DEVICE)
        self.imported = d.Context(cmd_fd=os.dup(self.ctx.cmd_fd))

    def tearDown(self):
        self.imported.close()
        self.ctx.close()

    def test_the_imported_context_is_the_same_device(self):
        self.assertEqual(self.imported.query_device().node_guid, self.ctx.query_device().node_guid)
        self.assertEqual(self.imported.query_port(1).state, e.IBV_PORT_ACTIVE)
        self.imported.close()
        # The original lives on: its command file is still open.
        with p.PD(self.ctx) as pd:
            m.MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE).close()

    def test_pd_and_mr_import_by_handle(self):
        pd = p.PD(self.ctx)
        mr = m.MR(pd, 8192, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
        ipd = p.PD(self.imported, handle=pd.handle)
        imr = m.MR(ipd, handle=mr.handle, address=mr.buf)
        self.assertEqual((imr.lkey, imr.rkey, imr.length), (mr.lkey, mr.rkey, mr.length))
        imr.unimport()
        ipd.unimport()
        # The device's objects are still there for the original.
        self.assertEqual(p.PD(self.imported, handle=pd.handle).handle, pd.handle)
        mr.close()
        pd.close()

    def test_bad_handles_are_einval(self):
        pd = p.PD(self.ctx)
        mr = m.MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
        other = p.PD(self.ctx)
        for make in (lambda: p.PD(self.imported, handle=mr.handle),     # an MR is no PD
                     lambda: p.PD(self.imported, handle=4000),
                     lambda: m.MR(p.PD(self.imported, handle=pd.handle), handle=pd.handle),
                     # the MR is on another PD
                     lambda: m.MR(p.PD(self.imported, handle=other.handle), handle=mr.handle)):
            with self.assertRaises(PyverbsRDMAError) as caught:
                make()
            self.assertEqual(errno_of(caught.exception), errno.EINVAL)
        mr.close()
        pd.close()
        other.close()

    def test_dm_import_sees_the_same_memory(self):
        with d.DM(self.ctx, d.AllocDmAttr(length=4096)) as dm:
            handle = dm.handle  # pyverbs cannot read it once the DM is closed
            idm = d.DM(self.imported, handle=handle)
            dm.copy_to_dm(0, b'\xa5' * 256, 256)
            self.assertEqual(idm.copy_from_dm(0, 256), b'\xa5' * 256)
            idm.copy_to_dm(256, b'\x3c' * 64, 64)
            self.assertEqual(dm.copy_from_dm(256, 64), b'\x3c' * 64)
        # The allocation is freed: the import keeps the memory it names.
        self.assertEqual(idm.copy_from_dm(0, 4), b'\xa5' * 4)
        idm.unimport()
        with self.assertRaises(PyverbsRDMAError) as caught:
            d.DM(self.imported, handle=handle)  # freed: no longer importable
        self.assertEqual(errno_of(caught.exception), errno.EINVAL)

    def test_queues_on_an_imported_context(self):
        # libibverbs creates CQs and QPs of an imported context only through
        # the uverbs ioctl (CQ_CREATE, QP_CREATE), which xsrcd serves.
        pd = p.PD(self.ctx)  # kept: the import names the device's PD, which dies with it
        ipd = p.PD(self.imported, handle=pd.handle)
        cq = c.CQ(self.imported, 8, None, None, 0)
        cap = q.QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
        qp = q.QP(ipd, q.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
        self.assertGreaterEqual(qp.qp_num, 1)
        self.assertEqual(qp.query(e.IBV_QP_STATE)[0].qp_state, e.IBV_QPS_RESET)
        # Refused as the write ABI refuses it, with the same errno.
        huge = q.QPCap(max_send_wr=1 << 24, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
        errnos = []
        for context, on_pd in ((self.ctx, pd), (self.imported, ipd)):
            ccq = c.CQ(context, 8, None, None, 0)
            with self.assertRaises(PyverbsRDMAError) as caught:
                q.QP(on_pd, q.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=ccq, rcq=ccq, cap=huge))
            errnos.append(errno_of(caught.exception))
            ccq.close()
        self.assertEqual(errnos[0], errnos[1])
        self.assertIn(errnos[0], (errno.EINVAL, errno.ENOMEM))
        qp.close()
        cq.close()
        ipd.unimport()
        pd.close()

    def test_srqs_and_wqs_of_an_imported_context_are_not_served(self):
        # Their ioctl methods are not served: libibverbs gets EOPNOTSUPP.
        pd = p.PD(self.ctx)
        ipd = p.PD(self.imported, handle=pd.handle)
        with self.assertRaises(PyverbsRDMAError) as caught:
            srq.SRQ(ipd, srq.SrqInitAttr(srq.SrqAttr(max_wr=4, max_sge=1)))
        self.assertEqual(errno_of(caught.exception), errno.EOPNOTSUPP)
        ipd.unimport()
        pd.close()


class ImportWithoutInterposer(unittest.TestCase):
    def test_a_fuse_file_is_no_character_device(self):
        # Without `xsrc run`'s interposer the command fd is a FUSE file and
        # libibverbs refuses it, as it refuses any file that is not a uverbs node.
        code = ("import os, pyverbs.device as d\n"
                "ctx = d.Context(name='%s')\n"
                "try:\n"
                "    d.Context(cmd_fd=os.dup(ctx.cmd_fd))\n"
                "except Exception as ex:\n"
                "    print(getattr(ex, 'error_code', -1))\n" % DEVICE)
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.stdout.strip(), str(errno.EINVAL), out.stderr)


if __name__ == "__main__":
    unittest.main()
