"""Shared fixtures: a real 2-engine cluster per session and a real IPython shell."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

# the browser tests' fixtures (module-scoped: a Lab server and a browser per module)
from lab_browser import chromium, lab, page  # noqa: E402, F401

# fails the session when a test leaves a process behind (on import it marks the
# environment that every process the tests start inherits)
from process_leftovers import pytest_sessionfinish  # noqa: F401

import gpucell
import gpucell.cluster.lifecycle as gc_mod

# Engines unpickle functions defined in test modules by importing those modules:
# let every engine the tests start find them.
_TESTS = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_TESTS, os.environ.get("PYTHONPATH", "")) if p
)


def _has_nvidia() -> bool:
    try:
        from gpucell.devices.nvml import PynvmlApi

        return bool(PynvmlApi().gpus())
    except Exception:
        return False


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    if _has_nvidia():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU and driver (NVML found none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ip():
    """A real IPython shell with gpucell loaded."""
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "gpucell")
    return shell


@pytest.fixture(scope="session")
def cluster() -> Iterator[gc_mod.GpuCluster]:
    """One real 2-engine CPU cluster for the whole session (starting one costs s)."""
    c = gpucell.start_cluster(2, gpus="none")
    yield c
    gpucell.stop()


@pytest.fixture(scope="module")
def private_cluster(cluster) -> Iterator[gc_mod.GpuCluster]:
    """A 2-engine cluster of a test module's own, active while its tests run.

    For modules whose cells fail on purpose: each failure cancels the other
    engine's chunk with SIGINT, which lands anywhere in the engine (an
    interrupt between worker.run's stream swap and its restore once left every
    later output of that engine filed under the interrupted request:
    tests/test_cancel_output.py), so such modules keep it off the shared
    session cluster.
    """
    saved = gc_mod._current
    gc_mod._current = None
    try:
        own = gpucell.start_cluster(2, gpus="none")
        yield own
    finally:
        if gc_mod._current is not None:
            gpucell.stop()
        gc_mod._current = saved


@pytest.fixture
def own_cluster(cluster) -> Iterator[gc_mod.GpuCluster]:
    """A fresh 2-engine cluster for one test, active while it runs: for tests
    that kill its engines (the session cluster must stay whole)."""
    saved = gc_mod._current
    gc_mod._current = None
    try:
        yield gpucell.start_cluster(2, gpus="none")
    finally:
        if gc_mod._current is not None:
            gpucell.stop()
        gc_mod._current = saved


@pytest.fixture
def no_active_cluster() -> Iterator[None]:
    """Set the session cluster aside so a test can start or connect its own."""
    saved = gc_mod._current
    gc_mod._current = None
    try:
        yield
    finally:
        leftover = gc_mod._current
        if leftover is not None and leftover is not saved:
            gpucell.stop()
        gc_mod._current = saved


@pytest.fixture
def ipcluster(tmp_path):
    """A cluster started by `ipcluster start --profile X` in another process."""
    ipdir = tmp_path / "ipython"
    env = dict(os.environ, IPYTHONDIR=str(ipdir))
    exe = os.path.join(os.path.dirname(sys.executable), "ipcluster")
    subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "ipython"),
            "profile",
            "create",
            "X",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    proc = subprocess.Popen(
        [exe, "start", "--profile=X", "-n", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    old = os.environ.get("IPYTHONDIR")
    os.environ["IPYTHONDIR"] = str(ipdir)
    try:
        yield proc
    finally:
        subprocess.run(
            [exe, "stop", "--profile=X"], env=env, capture_output=True, timeout=60
        )
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        if old is None:
            os.environ.pop("IPYTHONDIR", None)
        else:
            os.environ["IPYTHONDIR"] = old


@pytest.fixture
def channel(tmp_path):
    """A kernel's /dev/shm channel in a folder of the test's own."""
    from gpucell.cluster import shm_channel

    ch = shm_channel.open_channel(str(tmp_path))
    assert ch is not None
    yield ch
    shm_channel.close_channel(ch)
