"""Nothing left behind: what a SIGKILLed kernel leaves is swept at the next start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucell.cluster.leftovers import KEEP_LOGS, ORPHANS_AFTER, sweep_profile


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


KILL_CONTROLLER = """
import glob, os, signal, sys, time, gpucell
import gpucell.cluster.lifecycle as lc
c = gpucell.start_cluster(1, gpus="none")
security = os.path.join(c.cluster.profile_dir, "security")
print("CID", c.cluster.cluster_id, flush=True)
assert glob.glob(os.path.join(security, "ipcontroller-*-client.json"))
pid = c.cluster.controller.process.pid
os.kill(pid, signal.SIGKILL)  # the controller alone: the kernel lives on
time.sleep(1)  # gone (ipyparallel's launcher reaps it)
if sys.argv[1] == "stop":
    gpucell.stop()  # gpucell's stop
else:
    c.cluster.stop_cluster_sync()  # what ipyparallel alone leaves behind
    lc._current = None
print("LEFT", sorted(os.listdir(security)), flush=True)
"""


def _run(script: str, env: dict[str, str], *args: str) -> str:
    p = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@pytest.mark.cluster
def test_a_sigkilled_controllers_connection_files_go_at_stop(tmp_path):
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}
    out = _run(KILL_CONTROLLER, env, "stop")
    left = [line for line in out.splitlines() if line.startswith("LEFT")]
    assert left == ["LEFT []"], out  # neither the key files nor the cluster file


@pytest.mark.cluster
def test_a_sigkilled_controllers_connection_files_go_at_the_next_start(tmp_path):
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}
    out = _run(KILL_CONTROLLER, env, "ipyparallel")
    cid = next(x.split()[1] for x in out.splitlines() if x.startswith("CID"))
    security = tmp_path / "ipython" / "profile_default" / "security"
    keys = sorted(security.glob(f"ipcontroller-{cid}-*.json"))
    assert [p.name for p in keys] == [
        f"ipcontroller-{cid}-client.json",
        f"ipcontroller-{cid}-engine.json",
    ]
    assert not list(security.glob("cluster-*.json"))  # nothing names its pid
    # younger than ORPHANS_AFTER: a controller starting now may own them
    sweep_profile(tmp_path / "ipython" / "profile_default")
    assert all(p.exists() for p in keys)
    old = time.time() - ORPHANS_AFTER - 1
    for p in keys:
        os.utime(p, (old, old))
    _run(SCRIPT, env, "stop")  # the next start (and its stop)
    assert not any(p.exists() for p in keys)
    assert not list(security.glob("ipcontroller-*.json"))


@pytest.mark.cluster
def test_a_running_clusters_old_connection_files_are_kept(tmp_path, no_active_cluster):
    """The orphan sweep never takes the files of a cluster whose processes
    run, even without its cluster file."""
    import gpucell

    env_dir = tmp_path / "ipython"
    os.environ["IPYTHONDIR"] = str(env_dir)
    try:
        c = gpucell.start_cluster(1, gpus="none")
        security = Path(c.cluster.profile_dir) / "security"
        keys = sorted(security.glob("ipcontroller-*.json"))
        assert keys
        aside = tmp_path / "cluster-file"
        os.rename(c.cluster.cluster_file, aside)
        old = time.time() - ORPHANS_AFTER - 1
        for p in keys:
            os.utime(p, (old, old))
        sweep_profile(c.cluster.profile_dir)
        assert all(p.exists() for p in keys)
        os.rename(aside, c.cluster.cluster_file)
    finally:
        gpucell.stop()
        del os.environ["IPYTHONDIR"]
