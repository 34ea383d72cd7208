"""Restarts converge (issue 29), on real clusters whose engines are killed with
signals: two engines restarted at once are two engines; a device whose engine
dies after every start stops being restarted, said at once; a restart that
cannot start says so at once; a kernel connected to a cluster whose owning
kernel died fails ``%gpu_cluster status`` at once instead of hanging."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import gpucell
import gpucell.cluster.lifecycle as gc_mod
from gpucell.cluster import engines as engines_mod
from gpucell.cluster import restart
from gpucell.errors import ControllerLost

pytestmark = pytest.mark.cluster


def _until(cond, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, what
        gc_mod.status()  # status steps the restarts (never blocking)
        time.sleep(0.1)


def test_two_engines_killed_at_once_come_back_as_two(own_cluster):
    labels = sorted(e.label for e in own_cluster.engines.values())
    for info in list(own_cluster.engines.values()):
        os.kill(info.pid, signal.SIGKILL)
    _until(
        lambda: (
            len(own_cluster.live_ids()) == 2 and not {0, 1} & set(own_cluster.engines)
        ),
        40,
        "both engines back",
    )
    time.sleep(1.0)  # nothing else registers late
    gc_mod.status()
    # (the controller lists the dead until it misses their heart)
    assert set(own_cluster.client.ids) - set(own_cluster.engines) <= {0, 1}
    assert len(own_cluster.engines) == 2  # one engine per device, not "engine 2" twice
    assert sorted(e.label for e in own_cluster.engines.values()) == labels
    assert all(e.restarts == 1 for e in own_cluster.engines.values())


def test_a_cell_sent_while_an_engine_restarts_routes_around_it(ip, own_cluster):
    """No raw KeyError: the restart is a state the cell runs beside, and the
    status table says so."""
    os.kill(own_cluster.engines[1].pid, signal.SIGKILL)
    time.sleep(0.3)
    table = gc_mod.format_status(gc_mod.status())  # the restart begins here
    assert "dead (restarting)" in table
    ip.user_ns["out"] = []
    result = ip.run_cell(
        "%%gpu_parallel --quiet --schedule dynamic --chunksize 1\n"
        "import time\nfor i in range(30):\n    time.sleep(0.05)\n    out.append(i)\n"
    )
    assert result.error_in_exec is None, result.error_in_exec
    assert ip.user_ns["out"] == list(range(30))
    _until(lambda: not own_cluster.restarts.pending, 40, "the restart ends")
    assert len(own_cluster.live_ids()) == 2


def test_an_engine_that_dies_after_every_start_stops_being_restarted(
    own_cluster, capsys
):
    label = own_cluster.engines[1].label
    deaths = 0
    killed: set[int] = set()

    def current():
        return next(
            (
                e
                for eid, e in own_cluster.engines.items()
                if e.label == label
                and eid in own_cluster.live_ids()
                and e.pid not in killed
            ),
            None,
        )

    while deaths <= restart.BUDGET:  # killed a moment after every start
        _until(lambda: current() is not None, 40, f"restart {deaths} of {label}")
        pid = current().pid
        os.kill(pid, signal.SIGKILL)
        killed.add(pid)
        deaths += 1
        time.sleep(0.3)
    _until(lambda: label in own_cluster.restarts.retired, 10, "retired")
    said = capsys.readouterr().out
    assert f"died {restart.BUDGET + 1} times within" in said
    assert "stops restarting it" in said
    time.sleep(2.0)
    gc_mod.status()
    assert current() is None and not own_cluster.restarts.pending
    # nothing else runs for that device: only the other engine answers
    assert own_cluster.client.ids and set(own_cluster.live_ids()) == {
        e for e in own_cluster.engines if own_cluster.engines[e].label != label
    }
    # the cluster goes on with the engine left
    assert own_cluster.live_ids() and len(own_cluster.live_ids()) == 1


def test_a_restart_that_cannot_start_says_so_at_once(
    ip, own_cluster, monkeypatch, capsys
):
    real = engines_mod.engine_env

    def broken(spec):  # every new engine's Python exits at once
        return {**real(spec), "PYTHONHOME": "/nonexistent"}

    monkeypatch.setattr(engines_mod, "engine_env", broken)
    for info in list(own_cluster.engines.values()):
        os.kill(info.pid, signal.SIGKILL)
    time.sleep(0.3)
    ip.user_ns["out"] = []
    t0 = time.monotonic()
    result = ip.run_cell(
        "%%gpu_parallel --quiet\nfor i in range(4):\n    out.append(i)\n"
    )
    took = time.monotonic() - t0
    said = capsys.readouterr().out
    assert result.error_in_exec is not None
    assert took < 30, (took, said)  # was 35-185 s without a word
    assert "could not be restarted after 3 attempts (its process exited" in said
    assert ip.user_ns["out"] == []
    assert not own_cluster.restarts.pending


OWNER = r"""
import time
import gpucell
gpucell.start_cluster(1, gpus="none", profile="P")
print("up", flush=True)
time.sleep(600)
"""


def test_a_connected_kernel_whose_owner_died_fails_status_at_once(
    no_active_cluster, tmp_path, monkeypatch
):
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ),
    )
    try:
        line = owner.stdout.readline()
        assert line.startswith("up"), line + owner.stdout.read()
        gc = gpucell.connect(profile="P", timeout=30)
        assert gc.controller_pid is not None  # watched: it runs on this host
        ctl = gc.controller_pid
        owner.kill()  # the owning kernel dies; its controller dies with it
        owner.wait(timeout=10)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{ctl}") and time.monotonic() < deadline:
            time.sleep(0.1)
        t0 = time.monotonic()
        with pytest.raises(ControllerLost, match="controller .* is gone"):
            gc_mod.status()
        assert time.monotonic() - t0 < 2
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if gc_mod._current is not None:
            gpucell.stop()
        from gpucell.cluster import shm_channel

        shm_channel.sweep_stale()  # the killed owner's /dev/shm probe
