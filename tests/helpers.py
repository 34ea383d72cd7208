"""Plain helpers the tests share (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import time

import psutil

__all__ = ["children", "wait_for_ipcluster", "wait_gone"]


def children() -> set[int]:
    """PIDs of this process's live descendants (engines, controllers)."""
    out = set()
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: set[int] | list[int], timeout: float = 10.0) -> set[int]:
    """Wait until none of ``pids`` runs; return those still running."""
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if _running(p)}
        if alive:
            time.sleep(0.1)
    return alive


def wait_for_ipcluster(n: int = 2, profile: str = "X") -> None:
    """Until the ``ipcluster`` fixture's cluster answers with ``n`` engines (its
    connection file appears once the controller is up)."""
    import ipyparallel as ipp

    deadline = time.monotonic() + 60
    while True:
        try:
            client = ipp.Client(profile=profile, timeout=10)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    try:
        client.wait_for_engines(n, timeout=60, interactive=False)
    finally:
        client.close()
