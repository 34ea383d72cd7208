"""How a cell ends when the cluster changes under it (issue 14's drills), on
clusters of the test's own: a stop from another thread, an engine killed
between cells."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import gpucell
import gpucell.cluster.lifecycle as gc_mod
from gpucell.errors import ClusterStopped

pytestmark = pytest.mark.cluster


def test_a_stop_from_another_thread_is_reported_as_a_stop(ip, own_cluster):
    ip.user_ns["out"] = []
    cell = "import time\nfor i in range(60):\n    time.sleep(0.05)\n    out.append(i)\n"
    threading.Timer(1.0, gpucell.stop).start()
    t0 = time.monotonic()
    with pytest.raises(ClusterStopped, match="the cluster was stopped while the cell"):
        ip.run_cell_magic("gpu_parallel", "--quiet --schedule dynamic", cell)
    assert time.monotonic() - t0 < 15
    assert ip.user_ns["out"] == []
    assert "Every engine died" not in str(gpucell.last_run.errors)


def test_an_engine_killed_between_cells_is_dead_at_once_and_said(
    ip, own_cluster, capsys
):
    victim = own_cluster.engines[1]
    os.kill(victim.pid, signal.SIGKILL)
    time.sleep(0.2)
    ip.user_ns["out"] = []
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "for i in range(6):\n    out.append(i * 2)\n"
    )
    assert ip.user_ns["out"] == [i * 2 for i in range(6)]
    said = capsys.readouterr().out
    assert "engine 1 died since the last cell; running on 1 of 2" in said
    # the survivor ran it (and the replacement, if it came back in time)
    assert 0 in gpucell.last_run.engines and 1 not in gpucell.last_run.engines
    dead = own_cluster.engines.get(1)
    assert dead is None or dead.state == "dead"  # (None: already restarted)


def test_an_iteration_that_ends_its_engine_twice_is_named_and_not_retried(ip, cluster):
    saved = gc_mod._current
    gc_mod._current = None
    try:
        c = gpucell.start_cluster(3, gpus="none")
        ip.user_ns["out"] = []
        cell = (
            "import os, time\nfor i in range(12):\n    time.sleep(0.02)\n"
            "    if i == 7:\n        os._exit(3)\n    out.append(i)\n"
        )
        with pytest.raises(
            gpucell.errors.EnginesLost,
            match=r"iteration 7 ended engine \d and then engine \d: it is not retried",
        ) as info:
            ip.run_cell_magic(
                "gpu_parallel", "--quiet --chunksize 3 --schedule dynamic", cell
            )
        assert "--resume" in str(info.value)
        assert ip.user_ns["out"] == []
        lost7 = [
            ch
            for ch in gpucell.last_run.chunks
            if ch.state == "lost" and ch.start <= 7 < ch.stop
        ]
        assert len(lost7) == 2  # not retried on a third engine
        assert c.live_ids()  # the others are alive (and the dead being restarted)
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "for i in range(4):\n    out.append(i)\n"
        )
        assert ip.user_ns["out"] == [0, 1, 2, 3]
    finally:
        if gc_mod._current is not None:
            gpucell.stop()
        gc_mod._current = saved


def test_a_killed_controller_fails_the_cell_fast_and_status_answers(
    ip, own_cluster, capsys
):
    from IPython.core.error import UsageError

    ip.user_ns["out"] = []
    pid = own_cluster.controller_pid
    assert pid is not None
    threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()
    cell = (
        "import time\nfor i in range(200):\n    time.sleep(0.05)\n    out.append(i)\n"
    )
    t0 = time.monotonic()
    with pytest.raises(UsageError, match="controller .* is gone"):
        ip.run_cell_magic("gpu_parallel", "--quiet --schedule dynamic", cell)
    assert time.monotonic() - t0 < 10
    assert ip.user_ns["out"] == []
    # between cells: status answers at once, saying what happened
    t0 = time.monotonic()
    with pytest.raises(Exception, match="controller .* is gone"):
        ip.run_line_magic("gpu_cluster", "status")
    assert time.monotonic() - t0 < 2
    # and a new cluster recovers
    t0 = time.monotonic()
    gpucell.stop()
    assert time.monotonic() - t0 < 15
    gpucell.start_cluster(2, gpus="none")
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "for i in range(4):\n    out.append(i)\n"
    )
    assert ip.user_ns["out"] == [0, 1, 2, 3]


def test_a_stopped_engine_is_noticed_ended_and_its_chunk_run_elsewhere(
    ip, own_cluster, capsys
):
    ip.user_ns["out"] = []
    victim = own_cluster.engines[1].pid
    threading.Timer(0.8, os.kill, (victim, signal.SIGSTOP)).start()
    cell = "import time\nfor i in range(40):\n    time.sleep(0.05)\n    out.append(i)\n"
    t0 = time.monotonic()
    ip.run_cell_magic("gpu_parallel", "--quiet --schedule dynamic --chunksize 2", cell)
    assert time.monotonic() - t0 < 10
    assert ip.user_ns["out"] == list(range(40))
    said = capsys.readouterr().out
    assert "engine 1 stopped answering (its process is stopped" in said
    assert 1 not in own_cluster.live_ids()  # ended (a new engine replaces it)
    time.sleep(0.5)
    assert "stale" not in capsys.readouterr().out + capsys.readouterr().err


def test_a_killed_engine_is_restarted_and_takes_work_in_the_same_cell(
    ip, own_cluster, capsys
):
    ip.user_ns["out"] = []
    victim = own_cluster.engines[1]
    threading.Timer(0.6, os.kill, (victim.pid, signal.SIGKILL)).start()
    cell = "import time\nfor i in range(80):\n    time.sleep(0.08)\n    out.append(i)\n"
    ip.run_cell_magic("gpu_parallel", "--quiet --schedule dynamic --chunksize 2", cell)
    assert ip.user_ns["out"] == list(range(80))
    said = capsys.readouterr().out
    assert "engine 1 died" in said
    assert "engine 1 was restarted as engine" in said
    new = [e for e in own_cluster.engines if e not in (0, 1)]
    assert len(new) == 1
    ran_on = {c.engine for c in gpucell.last_run.chunks if c.state == "done"}
    assert new[0] in ran_on  # it took work in the same cell
    info = own_cluster.engines[new[0]]
    assert info.restarts == 1 and info.label == victim.label
    assert "restarted 1x" in gc_mod.format_status(gc_mod.status())
    assert "was restarted as engine" in str(gpucell.last_run.timeline())


def test_an_engine_killed_between_cells_comes_back(ip, own_cluster):
    os.kill(own_cluster.engines[0].pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while len(own_cluster.live_ids()) < 2 or 0 in own_cluster.engines:
        assert time.monotonic() < deadline
        gc_mod.status()  # status steps the restart (never blocking)
        time.sleep(0.2)
    ip.user_ns["out"] = []
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet --schedule static",
        "for i in range(8):\n    out.append(i)\n",
    )
    assert ip.user_ns["out"] == list(range(8))
    assert len(gpucell.last_run.engines) == 2


def test_a_cell_after_every_engine_died_waits_for_their_restarts(
    ip, own_cluster, capsys
):
    for info in list(own_cluster.engines.values()):
        os.kill(info.pid, signal.SIGKILL)
    time.sleep(0.3)
    ip.user_ns["out"] = []
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "for i in range(6):\n    out.append(i * 3)\n"
    )
    assert ip.user_ns["out"] == [i * 3 for i in range(6)]
    assert "waiting for their restarts" in capsys.readouterr().out
    assert not {0, 1} & set(gpucell.last_run.engines)
