"""A controller that loses one of its ports to another process as it starts.

ipyparallel picks the controller's ports by binding port 0 and closing the
socket; the controller binds them a moment later, and a process choosing its
ports meanwhile (a kernel started beside it) can take one: the controller exits
"Address already in use".  Here the test holds the port the profile gives the
controller's registration socket, which is the same exit without the luck.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
from helpers import children, wait_gone

import gpucell
import gpucell.cluster.lifecycle as gc_mod
from gpucell.cluster import starting
from gpucell.errors import ClusterError

pytestmark = pytest.mark.cluster


def _held_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def _profile(ipython_dir: Path, port: int) -> None:
    folder = ipython_dir / "profile_busy"
    folder.mkdir(parents=True)
    (folder / "ipcontroller_config.py").write_text(f"c.IPController.regport = {port}\n")


def _controllers_of(ipython_dir: Path) -> set[int]:
    """The pids of the controllers this process started with ``ipython_dir``'s
    profiles (not the processes a controller forks itself)."""
    found = set()
    me = str(os.getpid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{pid}/stat") as f:
                parent = f.read().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        if (
            parent == me
            and b"gpucell.cluster.controller" in cmd
            and (b"IPYTHONDIR=" + str(ipython_dir).encode()) in env.split(b"\0")
        ):
            found.add(int(pid))
    return found


class _ControllerWatch:
    """Counts the controllers started; ``release`` is called once the first
    has exited (the port is free for the next try)."""

    def __init__(self, ipython_dir: Path, release=None) -> None:
        self.seen: set[int] = set()
        self._dir, self._release = ipython_dir, release
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            now = _controllers_of(self._dir)
            if self._release and self.seen - now:  # one has exited
                self._release()
                self._release = None
            self.seen |= now
            time.sleep(0.01)

    def stop(self) -> set[int]:
        self._done.set()
        self._thread.join()
        return self.seen


@pytest.fixture
def busy_profile(tmp_path, monkeypatch, no_active_cluster):
    ipython_dir = tmp_path / "ipython"
    held = _held_port()
    _profile(ipython_dir, held.getsockname()[1])
    monkeypatch.setenv("IPYTHONDIR", str(ipython_dir))
    try:
        yield ipython_dir, held
    finally:
        held.close()


def test_a_controller_that_lost_its_port_is_started_again(busy_profile):
    ipython_dir, held = busy_profile
    watch = _ControllerWatch(ipython_dir, release=held.close)
    try:
        c = gpucell.start_cluster(1, gpus="none", profile="busy")
    finally:
        seen = watch.stop()
    try:
        assert len(c.live_ids()) == 1
        assert c.client[:].apply_sync(lambda: 6 * 7) == [42]
        assert len(seen) == 2, "one controller lost the port, the next one started"
    finally:
        gpucell.stop()


def test_a_port_taken_for_good_fails_the_start_saying_why(busy_profile):
    ipython_dir, held = busy_profile
    port = held.getsockname()[1]
    before = children()
    watch = _ControllerWatch(ipython_dir)
    try:
        with pytest.raises(ClusterError) as err:
            gpucell.start_cluster(1, gpus="none", profile="busy")
    finally:
        seen = watch.stop()
    said = str(err.value)
    assert "The controller exited" in said and "Address already in use" in said
    assert f":{port}" in said, said
    assert "Nothing is left running" in said
    assert len(seen) == starting.CONTROLLER_TRIES
    assert gc_mod._current is None
    assert not wait_gone(children() - before, timeout=5)
