# Helpers shared by the python device tests (run with Debian's /usr/bin/python3,
# which has pyverbs). Everything here only reads the environment the CTest
# `device` fixture sets: XSRC (the CLI), SYSFS_PATH, RDMAV_DRIVERS, XSRC_RUNDIR.
import errno
import ipaddress
import json
import os
import re
import subprocess
import time

XSRC = os.environ.get("XSRC", "xsrc")
DEVICE = os.environ.get("XSRC_TEST_DEVICE", "xsrc0")


def run(args, check=True, env=None, timeout=60):
    """Runs a command, returns CompletedProcess with text stdout/stderr."""
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}\nstdout:\n{proc.stdout}\n"
                             f"stderr:\n{proc.stderr}")
    return proc


def xsrc(*args, check=True):
    return run([XSRC, *args], check=check)


_STATUS_RE = re.compile(r"^(\S+) uverbs(\d+) netdev=(\S+) port=(\S+) contexts=(\d+) objects=(\d+)(?: \S+)*$")


def status(device=DEVICE):
    """The `xsrc status` line of `device` as a dict, or None if it is not listed."""
    out = xsrc("status", check=False).stdout
    for line in out.splitlines():
        m = _STATUS_RE.match(line.strip())
        if m and m.group(1) == device:
            return {"name": m.group(1), "uverbs": int(m.group(2)), "netdev": m.group(3),
                    "port": m.group(4), "contexts": int(m.group(5)), "objects": int(m.group(6))}
    return None


class PrivateDevice:
    """A device of the test's own (`xsrc up --name NAME`) on the netdev xsrc0
    uses, so that `xsrc status` counts on it are the test's alone, whoever
    else uses xsrc0 meanwhile. Taken down on exit, also after a failure."""

    def __init__(self, name):
        assert "xsrc" in name  # the provider matches device names containing "xsrc"
        self.name = name

    def __enter__(self):
        xsrc("down", "--name", self.name, check=False)  # left over from an interrupted run
        main = status(DEVICE)
        netdev = main["netdev"] if main else None
        xsrc("up", "--name", self.name, *(["--netdev", netdev] if netdev else []))
        st = status(self.name)
        assert st is not None, f"{self.name} not listed after xsrc up"
        assert st["contexts"] == 0 and st["objects"] == 0, st
        return self

    def __exit__(self, *exc):
        xsrc("down", "--name", self.name, check=False)
        return False

    def status(self):
        return status(self.name)


def wait_for(predicate, timeout, interval=0.05):
    """Polls predicate() until it returns a truthy value or timeout seconds pass;
    returns the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def netdev_addrs(netdev):
    """(ifindex, [ipaddress objects]) of a netdev, from `ip -j addr show`."""
    info = json.loads(run(["ip", "-j", "addr", "show", "dev", netdev]).stdout)
    assert len(info) == 1, info
    addrs = [ipaddress.ip_address(a["local"]) for a in info[0].get("addr_info", [])]
    return info[0]["ifindex"], addrs


def gid_of_addr(addr):
    """The RoCE v2 GID (an IPv6Address) of an interface address."""
    if addr.version == 4:
        return ipaddress.IPv6Address("::ffff:" + str(addr))
    return addr


def parse_devinfo_gids(text):
    """{index: (IPv6Address, type string)} from `ibv_devinfo -v` output."""
    gids = {}
    for m in re.finditer(r"GID\[\s*(\d+)\]:\s*(\S+?),?\s+(RoCE v2|RoCE v1|IB/RoCE v1)?\s*$", text, re.M):
        gids[int(m.group(1))] = (ipaddress.IPv6Address(m.group(2).rstrip(",")), m.group(3))
    return gids


def pyverbs_gid(gid):
    """pyverbs GID (has .gid) or GIDEntry (has .gid_str()) -> IPv6Address."""
    if hasattr(gid, "gid_str"):
        text = gid.gid_str()
    else:
        text = gid.gid
    return ipaddress.IPv6Address(text)


def errno_of(exc):
    """errno carried by a pyverbs exception (error_code), else -1."""
    return getattr(exc, "error_code", -1)


ERRNO_NAMES = {v: k for k, v in errno.errorcode.items()}
