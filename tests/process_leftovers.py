"""A pytest plugin that fails the session when a test leaves a process behind.

Every process the tests start (clusters, controllers, engines, sshd, Slurm daemons,
Lab servers, kernels) inherits this session's marker in its environment, even when it
daemonizes; at the end of the session any marked process still alive is a leftover:
it is listed, killed, and the session fails. Marking by environment, not by parentage,
is what finds daemonized controllers and keeps other pytest sessions on the same
machine (each with its own marker) out of the count.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass

import pytest

MARKER = "GPUCELL_TEST_SESSION"

# Processes get this long after the last test to finish exiting on their own
# (a controller stopped by the last fixture may still be flushing).
GRACE_S = float(os.environ.get("GPUCELL_LEFTOVER_GRACE_S", "15"))


@dataclass(frozen=True)
class Leftover:
    pid: int
    command: str


def mark_session() -> str:
    """Put this session's marker in the environment every child inherits.

    Always a new one: a pytest run inside a test must not count the outer session's
    processes as its own leftovers.
    """
    token = uuid.uuid4().hex
    os.environ[MARKER] = token
    return token


def _ancestors() -> set[int]:
    """This process and its ancestors: they carry the marker but are not leftovers."""
    pids = set()
    pid = os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                # a command may hold ')': the ppid follows the last one
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def processes_with(
    entry: bytes, skip: set[int] | frozenset[int] = frozenset()
) -> list[tuple[int, str, list[bytes]]]:
    """``(pid, command, environment)`` of each live process (not a zombie, not
    this one or its ancestors, not in ``skip``) whose environment holds
    ``entry`` (``NAME=value``)."""
    mine = _ancestors() | set(skip)
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in mine:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            if entry not in env:
                continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
        found.append((int(pid), command, env))
    return found


def marked_processes(token: str) -> list[Leftover]:
    """Live processes (not zombies) whose environment holds ``MARKER=token``."""
    needle = f"{MARKER}={token}".encode()
    return [Leftover(pid, command[:200]) for pid, command, _ in processes_with(needle)]


def wait_for_leftovers(token: str, grace_s: float = GRACE_S) -> list[Leftover]:
    deadline = time.monotonic() + grace_s
    while True:
        left = marked_processes(token)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def kill(leftovers: list[Leftover]) -> None:
    for proc in leftovers:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except OSError:
            pass


_TOKEN = mark_session()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # under pytest-xdist only the controlling process judges the whole session
    if hasattr(session.config, "workerinput"):
        return
    left = wait_for_leftovers(_TOKEN)
    if not left:
        return
    kill(left)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(left)} process(es) left behind by the tests (killed now):"]
    lines += [f"  pid {p.pid}: {p.command}" for p in left]
    if reporter is not None:
        reporter.write_sep("=", "leftover processes", red=True)
        for line in lines:
            reporter.write_line(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
