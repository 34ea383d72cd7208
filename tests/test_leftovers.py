"""Nothing left behind: what a SIGKILLed kernel leaves is swept at the next start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucell.cluster.leftovers import KEEP_LOGS, sweep_profile


def _cluster_json(security: Path, cid: str, pid: int) -> Path:
    p = security / f"cluster-{cid}.json"
    p.write_text(json.dumps({"controller": {"state": {"pid": pid}}}))
    return p


def test_dead_clusters_files_go_and_logs_are_bounded(tmp_path):
    security, log = tmp_path / "security", tmp_path / "log"
    security.mkdir()
    log.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = _cluster_json(security, "1700000000-dead", dead.pid)
    conn = security / "ipcontroller-1700000000-dead-client.json"
    conn.write_text("{}")
    live = _cluster_json(security, "1700000000-live", os.getpid())
    ids = [f"17000000{i:02d}-ab{i:02d}" for i in range(KEEP_LOGS + 3)]
    for age, cid in enumerate(ids):
        for name in (f"ipcontroller-{cid}-1.log", f"engines{cid}.json"):
            p = log / name
            p.write_text("x")
            os.utime(p, (time.time() - 1000 + age, time.time() - 1000 + age))
    (log / "ipengine-1700000000-live-cpu0-0.log").write_text("x")
    sweep_profile(tmp_path)
    assert not gone.exists() and not conn.exists() and live.exists()
    left = {p.name for p in log.iterdir()}
    assert "ipengine-1700000000-live-cpu0-0.log" in left  # a running cluster's
    kept = {cid for cid in ids if f"engines{cid}.json" in left}
    assert kept == set(ids[-KEEP_LOGS:])  # the newest stopped ones


SCRIPT = """
import os, sys, gpucell
gpucell.start_cluster(2, gpus="none")
if sys.argv[1] == "kill":
    os.kill(os.getpid(), 9)
gpucell.stop()
"""


@pytest.mark.cluster
def test_a_sigkilled_kernel_leaves_nothing_after_the_next_start(tmp_path):
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}

    def run(how: str) -> int:
        p = subprocess.Popen([sys.executable, "-c", SCRIPT, how], env=env)
        p.wait(120)
        return p.pid

    def files_of(pid: int) -> list[str]:
        return [n for n in os.listdir("/dev/shm") if n.startswith(f"gpucell-{pid}-")]

    killed = run("kill")
    profile = tmp_path / "ipython" / "profile_default"
    assert list((profile / "security").glob("cluster-*.json"))  # left behind
    assert files_of(killed)
    run("stop")
    assert not list((profile / "security").glob("cluster-*.json"))
    assert files_of(killed) == []  # its /dev/shm probe went at once
