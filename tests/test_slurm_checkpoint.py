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
import tempfile
import threading
import time
from pathlib import Path

import pytest
import slurm_cluster
from helpers import QUICK_GIVE_UP

import gpucell.cluster.lifecycle as gc_mod

pytestmark = pytest.mark.cluster

slurm = slurm_cluster.slurm  # the module-scoped fixture: a real Slurm


#: seconds an iteration takes where it does not wait for its job's end: long
#: enough that a job's engines are mid-cell when it ends, short enough that the
#: new job's engines soon run the rest
ITER_S = 0.05


def _tagger(ended: str, folder: str, at: int):
    """``tag(i)``: which job ran iteration ``i``, and when.  On the engines of
    job ``ended``, once ``at`` of its iterations are done, an iteration waits
    for Slurm to end the job (so the job ends mid-cell, however long Slurm
    takes); elsewhere each takes ``ITER_S``."""

    def tag(i: int) -> tuple:
        import os
        import time

        job = os.environ.get("SLURM_JOB_ID")
        again = os.environ.get("SLURM_RESTART_COUNT")  # (requeued by Slurm)
        # (listed from another thread: the harness's polling is not the
        # loop's own listing, which the engines' file watch notes)
        import threading

        names: list = []
        t = threading.Thread(target=lambda: names.extend(os.listdir(folder)))
        t.start()
        t.join()
        done = sum(1 for f in names if f.startswith(f"{job}-"))
        time.sleep(300 if job == ended and not again and done >= at else ITER_S)
        return (f"{job}+{again}" if again else job), time.time()

    return tag


def _wait_no_jobs(slurm, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.1)
    return slurm.jobs()


def _end_when(folder: Path, job: str, end, done: list, at: int) -> threading.Thread:
    """``end(job)`` once ``at`` of the job's iterations finished on its engines
    (their marker files in ``folder``); the job and when, in ``done``."""

    def go() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _iterations_done(folder, job) < at:
            time.sleep(0.1)
        done.append((job, time.time()))
        end(job)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def _iterations_done(folder: Path, job: str) -> int:
    """Iterations the job's engines logged as done (the test's marker files)."""
    return sum(1 for p in folder.glob(f"{job}-*")) if folder.exists() else 0


CELL = "for i in range(n):\n    out.append((i * i, tag(i)))\n    mark(i)\n"


def _marker(folder: str):
    def mark(i: int) -> None:
        import os

        open(os.path.join(folder, f"{os.environ.get('SLURM_JOB_ID')}-{i}"), "w").close()

    return mark


def _run_ended(ip, slurm, options: str, n: int = 60, end=None, job_set="slurm", job=""):
    """Run CELL; Slurm ends the job of engine set ``job_set`` (or job ``job``)
    by ``end(job)`` (scancel by default) once 8 of its iterations are done."""
    # a folder of this run's own: a job's marks of an earlier cell do not count
    marks = Path(tempfile.mkdtemp(prefix="marks-", dir=slurm.root))
    os.chmod(marks, 0o777)
    gc = gc_mod.current()
    job = job or str(gc.cluster.engines[job_set].job_id)
    done: list = []
    tag = _tagger(job, str(marks), at=8)
    ip.user_ns.update(out=[], n=n, tag=tag, mark=_marker(str(marks)))
    end = end or (lambda j: slurm.run("scancel", j))
    killer = _end_when(marks, job, end, done, at=8)
    try:
        ip.run_cell_magic("gpu_parallel", options, CELL)
    finally:
        killer.join(70)
    return done


def _preempt(slurm, blockers: list[str]):
    """Ends a job as a preemption does: a job of the higher tier partition
    takes its node's GPUs (its id kept in ``blockers``, to cancel)."""

    def end(job: str) -> None:
        node = slurm.run("squeue", "-h", "-j", job, "-o", "%N").strip()
        blockers.append(_hold_gpus(slurm, node, "urgent"))

    return end


def _hold_gpus(slurm, node: str, partition: str = "debug") -> str:
    return subprocess.run(
        ["sbatch", "--parsable", f"--partition={partition}", f"--nodelist={node}"]
        + ["--gpus-per-node=2", "--exclusive", "--output=/dev/null"]
        + ["--wrap", "sleep 300"],
        capture_output=True,
        text=True,
        env=slurm.env,
        check=True,
    ).stdout.strip()


def _time_limit(slurm):
    """Ends a job as its time limit does: the limit is cut to 0 while it runs;
    slurmctld ends it (TIMEOUT) at its next time-limit check (every 30 s:
    Slurm's granularity), as a job that reaches its --time."""

    def end(job: str) -> None:
        slurm.run("scontrol", "update", f"JobId={job}", "TimeLimit=0")

    return end


def _resubmitted_equals_serial(ip, slurm, capsys, end, state: str) -> None:
    """A cell on the --checkpoint cluster whose current job Slurm ends by
    ``end`` mid-cell: the job is noticed ended in ``state``, submitted again,
    and the cell equals the serial run on the new job's engines."""
    gc = gc_mod.current()
    watch = gc.cluster.gpucell_jobs
    (current,) = watch.ids()
    capsys.readouterr()
    done = _run_ended(ip, slurm, "--quiet", n=40, end=end, job=current)
    said = capsys.readouterr().out
    ((old, t_end),) = done
    out = ip.user_ns["out"]
    assert [x[0] for x in out] == [i * i for i in range(40)], said
    jobs = {x[1][0] for x in out}
    assert old == current and old in jobs and len(jobs) == 2, (jobs, said)
    (new,) = jobs - {old}
    assert f"Slurm job {old} ended ({state}" in said, said
    assert f"submitted again as job {new}" in said, said
    assert watch.ids() == [new], (watch.ids(), said)
    first_new = min(x[1][1] for x in out if x[1][0] == new)
    (renewed, seen) = watch.noticed[-1]  # (time.monotonic)
    assert renewed == new, watch.noticed
    noticed = time.time() - (time.monotonic() - seen)
    print(
        f"\n{state or 'scancel'}: the job was seen ended {noticed - t_end:.1f} s "
        f"after it was asked to; noticed -> the new job's first iteration: "
        f"{first_new - noticed:.1f} s"
    )
    assert len(gc.engines) == 2 and not gc.dead  # the new job's, in their place


def test_a_job_slurm_ends_is_submitted_again_and_each_cell_equals_serial(
    ip, slurm, no_active_cluster, capsys
):
    """One one-job --checkpoint 3 cluster, its job ended mid-cell three ways,
    a cell each: scancel (COMPLETING, or CANCELLED when squeue shows the final
    state first), a preemption (PREEMPTED: a job of the higher tier partition
    takes the node's GPUs, PreemptMode=CANCEL; the job submitted again runs
    on the other node) and the time limit (TIMEOUT).  Each time the job
    running the cell is submitted again and the cell equals the serial run."""
    blockers: list[str] = []
    ip.run_line_magic(
        "gpu_cluster", "start --slurm --gpus-per-node 2 --checkpoint 3 --timeout 90"
    )
    try:
        _resubmitted_equals_serial(ip, slurm, capsys, None, "")
        _resubmitted_equals_serial(
            ip, slurm, capsys, _preempt(slurm, blockers), "PREEMPTED"
        )
        for b in blockers:  # (the node's GPUs back for the next job)
            slurm.run("scancel", b)
        _resubmitted_equals_serial(ip, slurm, capsys, _time_limit(slurm), "TIMEOUT")
    finally:
        for b in blockers:
            slurm.run("scancel", b)
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
            _run_ended(ip, slurm, "--quiet", n=200)
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


def test_a_requeued_job_is_its_own_resubmission_and_the_cell_equals_serial(
    ip, slurm, no_active_cluster, capsys
):
    """PreemptMode=REQUEUE (the test Slurm's partition ``requeue``): the
    preempted job goes back to pending by itself; with --checkpoint nothing is
    submitted, the job's engines take the unfinished work when it runs again
    (on the other node; its begin time, which Slurm sets some minutes ahead
    for a requeued job, brought to now by the test), and the cell equals the
    serial run."""
    blockers: list[str] = []
    preempt = _preempt(slurm, blockers)

    def end_and_release(job: str) -> None:
        preempt(job)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if slurm.run("squeue", "-h", "-j", job, "-o", "%T").strip() == "PENDING":
                break
            time.sleep(0.1)
        slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")

    ip.run_line_magic(
        "gpu_cluster",
        "start --slurm --partition requeue --gpus-per-node 2 --checkpoint --timeout 90",
    )
    capsys.readouterr()
    gc = gc_mod.current()
    try:
        ((job, _),) = _run_ended(ip, slurm, "--quiet", n=40, end=end_and_release)
        said = capsys.readouterr().out
        out = ip.user_ns["out"]
        assert [x[0] for x in out] == [i * i for i in range(40)], said
        assert {x[1][0] for x in out} == {job, f"{job}+1"}, said
        assert f"Slurm job {job} was requeued by Slurm (" in said, said
        assert "when it runs again (--checkpoint, 1 of 1)" in said, said
        assert "submitted again" not in said, said
        assert [j.split()[0] for j in slurm.jobs()].count(job) == 1
        assert len(gc.engines) == 2 and not gc.dead  # its engines, back
    finally:
        for b in blockers:
            slurm.run("scancel", b)
        ip.run_line_magic("gpu_cluster", "stop")
    assert _wait_no_jobs(slurm, 20) == []


def test_a_resubmitted_job_held_pending_fails_the_cell_at_the_limit(
    ip, slurm, no_active_cluster, capsys, monkeypatch
):
    """The job submitted again stays pending (both nodes' GPUs taken, then
    held): at GpuCell.slurm_pending_timeout it is cancelled and the cell
    fails saying squeue's reason and --resume, its finished chunks kept;
    `--resume` on a new cluster then ends the cell as the serial run."""
    from gpucell.config import settings

    monkeypatch.setattr(settings(), "slurm_pending_timeout", 4.0)
    ip.run_line_magic(
        "gpu_cluster", "start --slurm --gpus-per-node 2 --checkpoint --timeout 90"
    )
    capsys.readouterr()
    gc = gc_mod.current()
    watch = gc.cluster.gpucell_jobs
    node = slurm.run("squeue", "-h", "-j", watch.jobs[0].job_id, "-o", "%N").strip()
    blockers = [_hold_gpus(slurm, *(n for n in slurm.nodes if n != node))]
    preempt = _preempt(slurm, blockers)

    def end_and_hold(job: str) -> None:
        preempt(job)
        deadline = time.monotonic() + 20
        while len(watch.jobs) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        slurm.run("scontrol", "hold", watch.jobs[-1].job_id)

    try:
        t0 = time.monotonic()
        with pytest.raises(Exception) as info:
            _run_ended(ip, slurm, "--quiet", n=40, end=end_and_hold)
        failed_after = time.monotonic() - t0
        said = capsys.readouterr().out
        new = watch.jobs[-1].job_id
        assert "still pending after 4 s (JobHeldAdmin)" in said, said
        assert f"Slurm job {new} (submitted again by --checkpoint)" in said
        assert "%%gpu_parallel --resume" in said, said
        assert not any(j.startswith(f"{new} ") for j in slurm.jobs())  # cancelled
        print(f"\nheld: the cell failed after {failed_after:.1f} s: {info.value}")
        for b in blockers:
            slurm.run("scancel", b)
        ip.run_line_magic("gpu_cluster", "stop")
        ip.run_line_magic("gpu_cluster", "start --slurm --gpus-per-node 2 --timeout 90")
        ip.run_cell_magic("gpu_parallel", "--quiet --resume", CELL)
        assert [x[0] for x in ip.user_ns["out"]] == [i * i for i in range(40)]
    finally:
        for b in blockers:
            slurm.run("scancel", b)
        ip.run_line_magic("gpu_cluster", "stop")
    assert _wait_no_jobs(slurm, 20) == []


def test_with_jobs_only_the_ended_job_is_submitted_again(
    ip, slurm, no_active_cluster, capsys
):
    """--jobs 2 --checkpoint, a job on each node: the second is cancelled
    mid-cell; it alone is submitted again, the first job's engines work on,
    and the cell equals the serial run."""
    ip.run_line_magic(
        "gpu_cluster",
        "start --slurm --nodes 2 --gpus-per-node 2 --jobs 2 --checkpoint --timeout 90",
    )
    gc = gc_mod.current()
    try:
        deadline = time.monotonic() + 60
        while len(gc.engines) < 4 and time.monotonic() < deadline:
            gc.refresh()  # the second job's engines join
            time.sleep(0.2)
        assert len(gc.engines) == 4
        first = str(gc.cluster.engines["slurm"].job_id)
        capsys.readouterr()
        done = _run_ended(ip, slurm, "--quiet", n=60, job_set="slurm-2")
        said = capsys.readouterr().out
        ((second, _),) = done
        out = ip.user_ns["out"]
        assert [x[0] for x in out] == [i * i for i in range(60)], said
        assert said.count("submitted again as job") == 1, said
        assert f"Slurm job {second} ended (" in said, said
        new = said.split("submitted again as job ")[1].split()[0]
        assert f"Slurm job {first} " not in said, said
        # (the first job's engines may finish the cell before the new ones join)
        assert {first, second} <= {x[1][0] for x in out} <= {first, second, new}
        deadline = time.monotonic() + 60
        while len(_live(gc)) < 4 and time.monotonic() < deadline:
            gc.refresh()  # (what status does: the new job's engines join)
            time.sleep(0.2)
        seen = gc.client[_live(gc)].apply_sync(_job_here)
        assert sorted(seen) == sorted([first, first, new, new]), seen
    finally:
        ip.run_line_magic("gpu_cluster", "stop")
    assert _wait_no_jobs(slurm, 20) == []


def _live(gc) -> list[int]:
    return [e for e in gc.engines if e not in gc.dead]


def _job_here() -> str | None:
    import os

    return os.environ.get("SLURM_JOB_ID")


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
{quick}
gc = gpucell.start_cluster(
    slurm=SlurmRequest(nodes=2, gpus_per_node=2, jobs=2), timeout=90
)
print(gc.cluster.engines["slurm-2"].job_id, flush=True)
time.sleep(600)
""".replace("{quick}", QUICK_GIVE_UP)


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
        # the released job's check waits this long (from its submission) for
        # the connection file its dead controller removed: 30 s by default
        env={
            **slurm.env,
            "IPYTHONDIR": str(tmp_path / "ipython"),
            "GPUCELL_SLURM_FILE_PATIENCE": "3",
        },
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
        deadline = time.monotonic() + 60
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
