#!/usr/bin/python3
# objects: the verbs objects of the device foundation through pyverbs (the
# real libibverbs + provider + daemon): PD, MR, CQ, CQ_EX, completion channels.
import ctypes
import ctypes.util
import errno
import mmap
import os
import select
import stat
import unittest

import pyverbs.cq as c
import pyverbs.device as d
import pyverbs.enums as e
import pyverbs.mr as m
import pyverbs.pd as p

from xsrc_testlib import PrivateDevice, errno_of, status

# A device of this test's own, so that object counts are ours alone.
DEVICE = "xsrcobj"
_device = PrivateDevice(DEVICE)


def setUpModule():
    _device.__enter__()


def tearDownModule():
    _device.__exit__(None, None, None)

PAGE = mmap.PAGESIZE
LW = e.IBV_ACCESS_LOCAL_WRITE
RW = e.IBV_ACCESS_REMOTE_WRITE
RR = e.IBV_ACCESS_REMOTE_READ
RA = e.IBV_ACCESS_REMOTE_ATOMIC

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MAP_FAILED = ctypes.c_void_p(-1).value


def anon_map(length, prot=mmap.PROT_READ | mmap.PROT_WRITE):
    addr = libc.mmap(None, length, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert addr not in (None, MAP_FAILED), os.strerror(ctypes.get_errno())
    return addr


def objects():
    st = status(DEVICE)
    assert st is not None, f"{DEVICE} is not up"
    return st["objects"]


# --- raw libibverbs through ctypes, for what pyverbs hides (the channel fd) ---

class IbvContext(ctypes.Structure):
    # struct ibv_context (verbs.h): device, 32 ops pointers, cmd_fd, async_fd, ...
    _fields_ = [("device", ctypes.c_void_p), ("ops", ctypes.c_void_p * 32),
                ("cmd_fd", ctypes.c_int), ("async_fd", ctypes.c_int),
                ("num_comp_vectors", ctypes.c_int)]


REQ_NOTIFY_CQ_OP = 12  # index of req_notify_cq in struct ibv_context_ops


class IbvCompChannel(ctypes.Structure):
    _fields_ = [("context", ctypes.c_void_p), ("fd", ctypes.c_int), ("refcnt", ctypes.c_int)]


class IbvCq(ctypes.Structure):
    _fields_ = [("context", ctypes.c_void_p), ("channel", ctypes.c_void_p),
                ("cq_context", ctypes.c_void_p), ("handle", ctypes.c_uint32), ("cqe", ctypes.c_int)]


def load_ibverbs():
    lib = ctypes.CDLL("libibverbs.so.1", use_errno=True)
    lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
    lib.ibv_get_device_list.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.ibv_free_device_list.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.ibv_get_device_name.restype = ctypes.c_char_p
    lib.ibv_get_device_name.argtypes = [ctypes.c_void_p]
    lib.ibv_open_device.restype = ctypes.POINTER(IbvContext)
    lib.ibv_open_device.argtypes = [ctypes.c_void_p]
    lib.ibv_close_device.argtypes = [ctypes.POINTER(IbvContext)]
    lib.ibv_create_comp_channel.restype = ctypes.POINTER(IbvCompChannel)
    lib.ibv_create_comp_channel.argtypes = [ctypes.POINTER(IbvContext)]
    lib.ibv_destroy_comp_channel.argtypes = [ctypes.POINTER(IbvCompChannel)]
    lib.ibv_create_cq.restype = ctypes.POINTER(IbvCq)
    lib.ibv_create_cq.argtypes = [ctypes.POINTER(IbvContext), ctypes.c_int, ctypes.c_void_p,
                                  ctypes.POINTER(IbvCompChannel), ctypes.c_int]
    lib.ibv_destroy_cq.argtypes = [ctypes.POINTER(IbvCq)]
    return lib


def ctypes_open(lib, name):
    n = ctypes.c_int()
    devs = lib.ibv_get_device_list(ctypes.byref(n))
    assert devs, "ibv_get_device_list failed"
    try:
        for i in range(n.value):
            if lib.ibv_get_device_name(devs[i]).decode() == name:
                ctx = lib.ibv_open_device(devs[i])
                assert ctx, f"ibv_open_device: {os.strerror(ctypes.get_errno())}"
                return ctx
        raise AssertionError(f"no device {name}")
    finally:
        lib.ibv_free_device_list(devs)


def readable_now(fd):
    r, _, _ = select.select([fd], [], [], 0)
    return bool(r)


class ObjectsTest(unittest.TestCase):
    def setUp(self):
        self.ctx = d.Context(name=DEVICE)
        self.base = objects()

    def tearDown(self):
        self.ctx.close()

    def assertErrno(self, exc, expected):
        self.assertEqual(errno_of(exc), expected,
                         f"expected {errno.errorcode[expected]}, got {exc}")

    # --- PD and MR --------------------------------------------------------

    def test_pd_and_mr_access_combinations(self):
        pd = p.PD(self.ctx)
        combos = [0, LW, RR, LW | RR, LW | RW, LW | RW | RR, LW | RW | RR | RA, LW | RA]
        mrs = []
        for access in combos:
            mr = m.MR(pd, 3 * PAGE + 17, access)
            self.assertEqual(mr.length, 3 * PAGE + 17)
            self.assertNotEqual(mr.lkey, 0, f"access {access:#x}")
            mrs.append(mr)
        lkeys = [mr.lkey for mr in mrs]
        self.assertEqual(len(set(lkeys)), len(lkeys), f"duplicate lkeys {lkeys}")
        remote = [mr.rkey for mr, a in zip(mrs, combos) if a & (RW | RR | RA)]
        self.assertEqual(len(set(remote)), len(remote), f"duplicate rkeys {remote}")
        # The MR's memory is the caller's: still usable after registration.
        mrs[1].write(b"xsrc", 4)
        self.assertEqual(mrs[1].read(4, 0), b"xsrc")
        self.assertEqual(objects(), self.base + 1 + len(combos))
        for mr in mrs:
            mr.close()
        self.assertEqual(objects(), self.base + 1)
        pd.close()
        self.assertEqual(objects(), self.base)

    def test_mr_on_caller_memory(self):
        pd = p.PD(self.ctx)
        addr = anon_map(4 * PAGE)
        try:
            mr = m.MR(pd, 4 * PAGE, LW | RW | RR, address=addr)
            self.assertNotEqual(mr.lkey, 0)
            mr.close()
            # An unaligned sub-range.
            mr = m.MR(pd, PAGE, LW, address=addr + 100)
            mr.close()
        finally:
            libc.munmap(addr, 4 * PAGE)
        pd.close()

    def test_mr_on_unmapped_memory_is_efault(self):
        pd = p.PD(self.ctx)
        addr = anon_map(2 * PAGE)
        libc.munmap(addr, 2 * PAGE)
        with self.assertRaises(Exception) as cm:
            m.MR(pd, 2 * PAGE, LW, address=addr)
        self.assertErrno(cm.exception, errno.EFAULT)
        # Only the second page unmapped: the whole range must be mapped.
        addr = anon_map(2 * PAGE)
        libc.munmap(addr + PAGE, PAGE)
        try:
            with self.assertRaises(Exception) as cm:
                m.MR(pd, 2 * PAGE, RR, address=addr)
            self.assertErrno(cm.exception, errno.EFAULT)
            m.MR(pd, PAGE, RR, address=addr).close()  # the mapped page alone is fine
        finally:
            libc.munmap(addr, PAGE)
        self.assertEqual(objects(), self.base + 1, "a failed reg_mr left an object behind")
        pd.close()

    def test_writable_mr_on_read_only_memory_is_efault(self):
        pd = p.PD(self.ctx)
        addr = anon_map(PAGE, mmap.PROT_READ)
        try:
            for access in (LW, LW | RW, LW | RA):
                with self.assertRaises(Exception) as cm:
                    m.MR(pd, PAGE, access, address=addr)
                self.assertErrno(cm.exception, errno.EFAULT)
            m.MR(pd, PAGE, RR, address=addr).close()  # read-only access is fine
        finally:
            libc.munmap(addr, PAGE)
        pd.close()

    def test_remote_write_or_atomic_needs_local_write(self):
        pd = p.PD(self.ctx)
        for access in (RW, RA, RW | RR, RW | RA | RR):
            with self.assertRaises(Exception) as cm:
                m.MR(pd, PAGE, access)
            self.assertErrno(cm.exception, errno.EINVAL)
        self.assertEqual(objects(), self.base + 1)
        pd.close()

    def test_zero_length_mr_is_einval(self):
        pd = p.PD(self.ctx)
        addr = anon_map(PAGE)
        try:
            with self.assertRaises(Exception) as cm:
                m.MR(pd, 0, LW, address=addr)
            self.assertErrno(cm.exception, errno.EINVAL)
        finally:
            libc.munmap(addr, PAGE)
        pd.close()

    def test_many_pds(self):
        pds = [p.PD(self.ctx) for _ in range(64)]
        self.assertEqual(objects(), self.base + 64)
        for pd in pds:
            pd.close()
        self.assertEqual(objects(), self.base)

    # --- CQ and CQ_EX -----------------------------------------------------

    def test_cq_create_poll_resize_destroy(self):
        cq = c.CQ(self.ctx, 16)
        self.assertGreaterEqual(cq.cqe, 16)
        self.assertEqual(cq.poll(), (0, []))
        cq.resize(128)
        self.assertGreaterEqual(cq.cqe, 128)
        cq.resize(4)
        self.assertGreaterEqual(cq.cqe, 4)
        for bad in (0, 1 << 30):
            with self.assertRaises(Exception) as cm:
                cq.resize(bad)
            self.assertErrno(cm.exception, errno.EINVAL)
        self.assertEqual(objects(), self.base + 1)
        cq.close()
        self.assertEqual(objects(), self.base)

    def test_cq_bad_attributes(self):
        max_cqe = self.ctx.query_device().max_cqe
        with self.assertRaises(Exception) as cm:
            c.CQ(self.ctx, max_cqe + 1)
        self.assertErrno(cm.exception, errno.EINVAL)
        with self.assertRaises(Exception) as cm:
            c.CQ(self.ctx, 8, None, None, self.ctx.num_comp_vectors)
        self.assertErrno(cm.exception, errno.EINVAL)
        self.assertEqual(objects(), self.base)

    def test_cq_req_notify(self):
        ch = c.CompChannel(self.ctx)
        cq = c.CQ(self.ctx, 8, None, ch, 0)
        cq.req_notify()
        cq.req_notify(1)
        self.assertEqual(cq.poll(), (0, []))
        cq.close()
        ch.close()
        plain = c.CQ(self.ctx, 8)
        plain.req_notify()  # arming a CQ without a channel is allowed
        plain.close()

    def test_cqex(self):
        attr = c.CqInitAttrEx(cqe=32, wc_flags=e.IBV_WC_STANDARD_FLAGS)
        cqex = c.CQEX(self.ctx, attr)
        self.assertEqual(cqex.start_poll(c.PollCqAttr()), errno.ENOENT)  # empty
        self.assertEqual(objects(), self.base + 1)
        # (pyverbs 44 cannot attach a CQEX to a CompChannel: its CQEX calls
        # a cdef method of CompChannel; the C tests cover that path.)
        cqex2 = c.CQEX(self.ctx, c.CqInitAttrEx(cqe=8, wc_flags=e.IBV_WC_STANDARD_FLAGS,
                                                 comp_mask=e.IBV_CQ_INIT_ATTR_MASK_FLAGS,
                                                 flags=e.IBV_CREATE_CQ_ATTR_SINGLE_THREADED))
        self.assertEqual(objects(), self.base + 2)
        cqex2.close()
        cqex.close()
        self.assertEqual(objects(), self.base)

    def test_cqex_unsupported_wc_flags(self):
        # CVLAN is for raw packet QPs, which xsrc lacks (timestamps it has).
        attr = c.CqInitAttrEx(cqe=8, wc_flags=e.IBV_WC_EX_WITH_CVLAN)
        with self.assertRaises(Exception) as cm:
            c.CQEX(self.ctx, attr)
        self.assertErrno(cm.exception, errno.EOPNOTSUPP)
        self.assertEqual(objects(), self.base)

    # --- completion channels ----------------------------------------------

    def test_eight_channels_each_followed_by_a_cq(self):
        # The provider's channel pool (4 pipes) is refilled by CREATE_CQ:
        # creating a CQ after each channel must never run it dry (EMFILE).
        made = []
        for i in range(8):
            try:
                ch = c.CompChannel(self.ctx)
            except Exception as exc:  # noqa: BLE001
                self.fail(f"channel {i}: {exc}")
            cq = c.CQ(self.ctx, 4, None, ch, 0)
            cq.req_notify()
            made.append((ch, cq))
        for ch, cq in made:
            cq.close()
            ch.close()

    def test_destroy_in_order(self):
        pd = p.PD(self.ctx)
        mr = m.MR(pd, PAGE, LW | RR)
        ch = c.CompChannel(self.ctx)
        cq = c.CQ(self.ctx, 8, None, ch, 0)
        cq2 = c.CQ(self.ctx, 8)
        cq.req_notify()
        self.assertEqual(objects(), self.base + 5)
        mr.close()
        pd.close()
        cq.close()
        cq2.close()
        self.assertEqual(objects(), self.base + 1)  # the channel
        ch.close()

    def test_status_counts_only_live_objects_after_channel_destroy(self):
        """KNOWN BUG (reported): a destroyed completion channel stays counted
        (and held) by xsrcd until the context closes."""
        for _ in range(3):
            ch = c.CompChannel(self.ctx)
            ch.close()
        self.assertEqual(objects(), self.base,
                         "destroyed completion channels are still counted by `xsrc status`")

    def test_channel_fd_is_valid_and_not_readable(self):
        lib = load_ibverbs()
        ctx = ctypes_open(lib, DEVICE)
        try:
            self.assertTrue(os.readlink(f"/proc/self/fd/{ctx.contents.cmd_fd}").startswith(
                os.environ.get("XSRC_RUNDIR", "/run/xsrc")), "ctypes struct layout check")
            ch = lib.ibv_create_comp_channel(ctx)
            self.assertTrue(ch, os.strerror(ctypes.get_errno()))
            fd = ch.contents.fd
            st = os.fstat(fd)  # a valid fd in this process
            self.assertTrue(stat.S_ISFIFO(st.st_mode), "channel fd is not a pipe")
            self.assertEqual(os.get_blocking(fd), True)
            self.assertFalse(readable_now(fd), "fresh channel is readable")
            cq = lib.ibv_create_cq(ctx, 8, None, ch, 0)
            self.assertTrue(cq, os.strerror(ctypes.get_errno()))
            self.assertEqual(cq.contents.channel, ctypes.addressof(ch.contents))
            req_notify = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(IbvCq), ctypes.c_int)(
                ctx.contents.ops[REQ_NOTIFY_CQ_OP])
            self.assertEqual(req_notify(cq, 0), 0)
            self.assertFalse(readable_now(fd), "channel readable though nothing completed")
            # Destroying the channel while a CQ uses it is refused by libibverbs.
            self.assertEqual(lib.ibv_destroy_comp_channel(ch), errno.EBUSY)
            self.assertEqual(lib.ibv_destroy_cq(cq), 0)
            self.assertFalse(readable_now(fd))
            self.assertEqual(lib.ibv_destroy_comp_channel(ch), 0)
            with self.assertRaises(OSError):
                os.fstat(fd)  # closed by ibv_destroy_comp_channel
        finally:
            lib.ibv_close_device(ctx)

    def test_async_fd_not_readable(self):
        lib = load_ibverbs()
        ctx = ctypes_open(lib, DEVICE)
        try:
            fd = ctx.contents.async_fd
            self.assertTrue(stat.S_ISFIFO(os.fstat(fd).st_mode))
            self.assertFalse(readable_now(fd), "async fd readable though no event happened")
        finally:
            lib.ibv_close_device(ctx)


if __name__ == "__main__":
    unittest.main()
