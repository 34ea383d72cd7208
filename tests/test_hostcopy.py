"""One copy of an input per host (gpucell.engine.hostcopy), the failure paths
driven directly: a leader that cannot publish, a leader that died, and the files
gone after the cell.  The cluster path is in test_memory.py."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from gpucell.engine import hostcopy
from gpucell.protocol import shm, wire


@pytest.fixture
def channel(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "room", lambda directory: 1 << 40)
    return shm.Channel(token="t" + os.urandom(4).hex(), directory=str(tmp_path))


def _frames():
    return wire.dumps({"x": np.arange(300_000, dtype=np.float64)})


def test_the_leader_publishes_and_a_follower_maps_the_same_file(channel, tmp_path):
    lead = shm.lead(_frames(), channel, "host-a-0")
    mine = hostcopy.receive(lead, "cell1", "k1")
    assert shm.spilled(mine)
    follow = shm.follow(channel, "host-a-0", os.getpid(), 0)
    theirs = hostcopy.receive(follow, "cell1", "k2")
    a = wire.loads(shm.unspill(mine, shared=True))["x"]
    b = wire.loads(shm.unspill(theirs, shared=True))["x"]
    assert np.array_equal(a, b) and a[-1] == 299_999
    assert sorted(os.listdir(tmp_path)) == sorted(
        [f"gpucell-{channel.token}-host-a-0", f"gpucell-{channel.token}-host-a-0.ready"]
    )
    hostcopy.unpublish("k1")
    hostcopy.unpublish("k2")
    assert os.listdir(tmp_path) == []


def test_a_follower_says_why_its_leader_could_not_publish(channel, monkeypatch):
    monkeypatch.setattr(shm, "spill", lambda frames, ch, tag, **kw: frames)
    lead = shm.lead(_frames(), channel, "host-b-0")
    mine = hostcopy.receive(lead, "cell1", "k1")
    assert not shm.spilled(mine)  # the leader keeps what it received
    with pytest.raises(RuntimeError, match="engine 3 was to share an input") as e:
        hostcopy.receive(shm.follow(channel, "host-b-0", os.getpid(), 3), "c", "k2")
    assert "could not write the input" in str(e.value)
    assert "shared_memory = False" in str(e.value)
    hostcopy.unpublish("k1")
    hostcopy.unpublish("k2")


def test_a_follower_whose_leader_died_does_not_wait(channel):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with pytest.raises(RuntimeError, match="engine 5.*died before publishing"):
        hostcopy.receive(shm.follow(channel, "host-c-0", dead.pid, 5), "c", "k")
    hostcopy.unpublish("k")


def test_a_failed_cells_files_go_at_the_next_cell(channel, tmp_path):
    hostcopy.receive(shm.lead(_frames(), channel, "host-d-0"), "cell1", "k")
    assert os.listdir(tmp_path)
    # no tidy came (the cell failed): the next cell's publication removes them
    hostcopy.receive(shm.lead(_frames(), channel, "host-d-1"), "cell2", "k")
    assert all("host-d-1" in f for f in os.listdir(tmp_path))
    hostcopy.unpublish("k")
    assert os.listdir(tmp_path) == []
