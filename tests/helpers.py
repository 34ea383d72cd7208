"""Plain helpers the tests share (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import threading
import time

import psutil

__all__ = [
    "children",
    "needs_shared_shm",
    "shares_shm",
    "wait_for_ipcluster",
    "wait_gone",
]


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


def press_stop(after: float) -> threading.Event:
    """Press the stop button (SIGINT to the main thread) ``after`` seconds into
    the running cell, and again every 0.5 s while it still runs: an interrupt
    that lands in a C finaliser (pyzmq's ``Frame.__dealloc__``) is swallowed
    there, as a user's first press occasionally is.  Set the returned event
    once the cell is over."""
    import _thread

    import gpucell

    done = threading.Event()
    before = gpucell.last_run

    def press() -> None:
        if done.wait(after):
            return
        while True:
            r = gpucell.last_run
            if r is not before and r is not None and r.status != "running":
                return
            _thread.interrupt_main()
            if done.wait(0.5):
                return

    threading.Thread(target=press, daemon=True).start()
    return done


def shares_shm(cluster) -> bool:
    """Every live engine maps files in the kernel's /dev/shm (so it hears the
    verdict on trials, and inputs go through shared memory)."""
    return all(cluster.sees_shm(e) for e in cluster.live_ids())


def needs_shared_shm(cluster) -> None:
    """Skip a test that needs :func:`shares_shm`."""
    import pytest

    if not shares_shm(cluster):
        pytest.skip("no shared /dev/shm between the kernel and its engines here")


#: Code for a subprocess kernel whose remote engines (ssh, Slurm) give a silent
#: controller up after 5 missed checks instead of the product's 30 (about 3 s,
#: not 18): the killed-kernel tests prove the engines end with their
#: controller without waiting the product's whole grace;
#: test_remote_engines_give_a_silent_controller_up_after_30_checks pins the
#: product's own setting.  Fails the kernel if that setting is not there.
QUICK_GIVE_UP = """\
from gpucell.cluster import starting as _starting
_product_args = _starting.remote_engine_args
def _quick_give_up(engine_args):
    args = _product_args(engine_args)
    assert "--IPEngine.max_heartbeat_misses=30" in args, args
    return [a.replace("misses=30", "misses=5") for a in args]
_starting.remote_engine_args = _quick_give_up
"""
