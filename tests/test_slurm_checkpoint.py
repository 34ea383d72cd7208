"""A Slurm job that Slurm ends during a run (``scancel`` here; a time limit or a
preemption ends it the same way): with ``--checkpoint`` it is submitted again
and the cell goes on on the new job's engines, its result the serial one;
without, the cell fails naming the job, squeue's state and how to go on.

The real slurmctld/slurmd of tests/slurm_cluster.py; skipped with the reason
where root or Slurm's packages are missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import slurm_cluster

import gpucell.cluster.lifecycle as gc_mod

pytestmark = pytest.mark.cluster

slurm = slurm_cluster.slurm  # the module-scoped fixture: a real Slurm


def _tag(i: int) -> tuple:
    """Which job ran iteration ``i``, and when."""
    import os
    import time

    time.sleep(0.25)
    return os.environ.get("SLURM_JOB_ID"), time.time()


def _wait_no_jobs(slurm, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    return slurm.jobs()


def _cancel_when(slurm, gc, done: list, at: int) -> threading.Thread:
    """scancel the cluster's job once ``at`` iterations finished on the
    engines (their marker files); the job and when, in ``done``."""

    def go() -> None:
        job = str(gc.cluster.engines["slurm"].job_id)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _iterations_done(slurm, job) < at:
            time.sleep(0.1)
        done.append((job, time.time()))
        subprocess.run(["scancel", job], env=slurm.env, check=False)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def _iterations_done(slurm, job: str) -> int:
    """Iterations the job's engines logged as done (the test's marker files)."""
    folder = Path(slurm.root) / "marks"
    return sum(1 for p in folder.glob(f"{job}-*")) if folder.exists() else 0


CELL = "for i in range(n):\n    out.append((i * i, tag(i)))\n    mark(i)\n"


def _marker(folder: str):
    def mark(i: int) -> None:
        import os

        open(os.path.join(folder, f"{os.environ.get('SLURM_JOB_ID')}-{i}"), "w").close()

    return mark


def _run_cancelled(ip, slurm, options: str, n: int = 60):
    marks = Path(slurm.root) / "marks"
    marks.mkdir(exist_ok=True)
    os.chmod(marks, 0o777)
    gc = gc_mod.current()
    done: list = []
    ip.user_ns.update(out=[], n=n, tag=_tag, mark=_marker(str(marks)))
    killer = _cancel_when(slurm, gc, done, at=8)
    try:
        ip.run_cell_magic("gpu_parallel", options, CELL)
    finally:
        killer.join(70)
    return done


def test_a_cancelled_job_is_submitted_again_and_the_cell_equals_serial(
    ip, slurm, no_active_cluster, capsys
):
    ip.run_line_magic(
        "gpu_cluster", "start --slurm --gpus-per-node 2 --checkpoint --timeout 90"
    )
    capsys.readouterr()
    gc = gc_mod.current()
    try:
        done = _run_cancelled(ip, slurm, "--quiet")
        said = capsys.readouterr().out
        ((old, t_cancel),) = done
        out = ip.user_ns["out"]
        assert [x[0] for x in out] == [i * i for i in range(60)], said
        jobs = {x[1][0] for x in out}
        assert old in jobs and len(jobs) == 2, (jobs, said)
        (new,) = jobs - {old}
        assert f"Slurm job {old} ended (" in said, said  # (COMPLETING or CANCELLED)
        assert f"submitted again as job {new}" in said, said
        first_new = min(x[1][1] for x in out if x[1][0] == new)
        print(
            f"\nscancel -> first iteration on the new job: {first_new - t_cancel:.1f} s"
        )
        assert len(gc.engines) == 2 and not gc.dead  # the new job's, in their place
    finally:
        ip.run_line_magic("gpu_cluster", "stop")
    assert _wait_no_jobs(slurm, 20) == []


def test_without_checkpoint_the_cell_fails_naming_the_job_and_resume(
    ip, slurm, no_active_cluster, capsys
):
    ip.run_line_magic("gpu_cluster", "start --slurm --gpus-per-node 2 --timeout 90")
    capsys.readouterr()
    gc = gc_mod.current()
    t0 = time.monotonic()
    try:
        with pytest.raises(Exception) as info:
            _run_cancelled(ip, slurm, "--quiet", n=200)
        failed_after = time.monotonic() - t0
        said = capsys.readouterr().out
        job = str(gc.cluster.engines["slurm"].job_id)
        assert f"Slurm job {job} ended (" in said, said
        assert "%%gpu_parallel --resume" in said
        assert "Every engine died" in str(info.value)
        assert ip.user_ns["out"] == []  # nothing merged
        assert failed_after < 25, failed_after  # not the heartbeat's 30 s
    finally:
        ip.run_line_magic("gpu_cluster", "stop")
    assert _wait_no_jobs(slurm, 20) == []


def _engines_of_job(job: str) -> list[int]:
    """Engine processes of Slurm job ``job`` on this machine."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "ipyparallel.engine" in " ".join(p.info["cmdline"] or []) and (
                p.environ().get("SLURM_JOB_ID") == job
            ):
                out.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


KERNEL = """
import time
import gpucell
from gpucell.cluster.slurm import SlurmRequest
gc = gpucell.start_cluster(
    slurm=SlurmRequest(nodes=2, gpus_per_node=2, jobs=2), timeout=90
)
print(gc.cluster.engines["slurm-2"].job_id, flush=True)
time.sleep(600)
"""


def test_a_pending_job_of_a_killed_kernel_cancels_itself_when_it_starts(
    slurm, tmp_path
):
    """--jobs 2, the second job held pending; the kernel is killed; released,
    the job finds no controller, cancels itself and starts no engine."""
    blocker = subprocess.run(  # node2's GPUs taken: the second job pends
        ["sbatch", "--parsable", "--nodelist=node2", "--gpus-per-node=2"]
        + ["--exclusive", "--output=/dev/null", "--wrap", "sleep 300"],
        capture_output=True,
        text=True,
        env=slurm.env,
        check=True,
    ).stdout.strip()
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**slurm.env, "IPYTHONDIR": str(tmp_path / "ipython")},
    )
    try:
        second = kernel.stdout.readline().strip()
        assert second, "the kernel did not start its cluster"
        subprocess.run(["scontrol", "hold", second], env=slurm.env, check=True)
        kernel.kill()
        kernel.wait(10)
        subprocess.run(["scancel", blocker], env=slurm.env)
        assert any(j.startswith(f"{second} ") for j in slurm.jobs())  # still held
        subprocess.run(["scontrol", "release", second], env=slurm.env, check=True)
        deadline = time.monotonic() + 60  # (the check waits 30 s for the file)
        engines_seen = []
        while any(j.startswith(f"{second} ") for j in slurm.jobs()):
            engines_seen += _engines_of_job(second)
            assert time.monotonic() < deadline, slurm.jobs()
            time.sleep(0.2)
        assert engines_seen == []
        assert _wait_no_jobs(slurm, 30) == []
        logs = list((tmp_path / "ipython").rglob("*slurm-2*.log"))
        said = "".join(p.read_text() for p in logs)
        assert "(its kernel is gone); no engine is started" in said, (logs, said)
    finally:
        kernel.kill()
        subprocess.run(["scancel", blocker], env=slurm.env)
