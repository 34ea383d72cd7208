"""Which machine and process space this code runs in: is an engine "local"?

A pid means the same process to the kernel and to an engine only when both run on
the same kernel (boot id) in the same pid namespace.  Hostnames are not enough: an
engine in a container with host networking shares the hostname but not the pids
(the kernel would read the wrong /proc entry and declare it dead, or SIGINT an
unrelated process).  Each side reports :func:`identity`, and
:func:`shares_pids` compares two reports.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

__all__ = ["identity", "kernel_key", "pid_running", "process_state", "shares_pids"]

_TOKEN = os.urandom(4).hex()


_KEY: tuple[int, str] = (0, "")


def kernel_key() -> str:
    """This kernel's key for its state on engines (its programs and cached
    inputs), which several notebooks' kernels may share: unique per process
    (sent with every chunk: computed once per process)."""
    global _KEY
    pid = os.getpid()
    if _KEY[0] != pid:
        _KEY = (pid, f"{socket.gethostname()}-{pid}-{_TOKEN}")
    return _KEY[1]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def identity() -> dict[str, str]:
    """This process's host name, machine boot id and pid namespace ('' if unknown)."""
    return {
        "host": socket.gethostname(),
        "boot_id": _read("/proc/sys/kernel/random/boot_id"),
        "pidns": _link("/proc/self/ns/pid"),
    }


def shares_pids(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """Whether a pid reported by ``a`` names the same process for ``b``.

    Decided by boot id and pid namespace where both are known (Linux); elsewhere
    the host name is all there is.
    """
    if a.get("boot_id") and b.get("boot_id") and a.get("pidns") and b.get("pidns"):
        return a["boot_id"] == b["boot_id"] and a["pidns"] == b["pidns"]
    return bool(a.get("host")) and a.get("host") == b.get("host")


def pid_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (one /proc read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] != b"Z"
    except FileNotFoundError:
        return False
    except (OSError, ValueError):  # no /proc (macOS): ask the OS
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def process_state(pid: int) -> str | None:
    """The one-letter state of a process (``R``, ``S``, ``T`` when stopped,
    ``Z``...) from /proc, or ``None`` when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3].decode()
    except (OSError, ValueError):
        return None
