"""A Slurm cluster's jobs while it lives: a job Slurm ends (its time limit,
preemption, ``scancel``) is noticed from ``squeue`` within about a second, not
after the controller's heartbeat gives its engines up (30 s), and its engines
are marked dead at once.  With ``--checkpoint N`` (``GpuCell.slurm_resubmit``)
the job is submitted again, up to N times, and each dead engine waits for one
of the new job's engines (a restart in :class:`gpucell.cluster.restart.Restarts`
that takes any engine): a running cell keeps its finished chunks, re-runs the
lost ones on the new engines and ends as the serial run would.  Without it the
cell fails saying which job ended, squeue's state and reason, and how to go on.

Driven from :meth:`Restarts.step` (the run's engine check, ``%gpu_cluster
status``): one non-blocking ``squeue`` at a time, never a wait.  Also here:
the job states squeue gives, and the wait for a start's engines that watches
its job (pending said once, an ended job or the timeout a ClusterError).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpucell.cluster.restart import ANY_ENGINE
from gpucell.errors import ClusterError

__all__ = [
    "ANY_ENGINE",
    "Job",
    "JobWatch",
    "Resubmitter",
    "job_state",
    "job_states",
    "wait_for_job",
]

#: seconds between squeue calls
POLL = 1.0
#: job states after which none of its engines runs
ENDED = {
    "BOOT_FAIL",
    "CANCELLED",
    # its processes being ended: after RUNNING, the job is over for its engines
    "COMPLETING",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
}


def _job_id_here() -> str | None:
    import os

    return os.environ.get("SLURM_JOB_ID")


@dataclass
class Job:
    """One submitted job: its engine set and how to submit it again."""

    set_id: str
    job_id: str
    engines: int
    #: the engine set's settings (script, environment, arguments)
    kw: dict[str, Any]
    resubmitted: int = 0
    ended: str | None = None  # "CANCELLED (reason)" once Slurm ended it


@dataclass
class JobWatch:
    """The jobs of one cluster, watched through ``squeue``."""

    cluster: Any  # ipyparallel's Cluster, which submits again
    jobs: list[Job]
    resubmit: int = 0
    #: engine id -> its job's id (asked of each engine once)
    job_of: dict[int, str] = field(default_factory=dict)
    _asked: dict[int, Any] = field(default_factory=dict)
    #: engines that went with a job Slurm ended
    ended_engines: set[int] = field(default_factory=set)
    _squeue: Any = None
    _asked_jobs: list[str] = field(default_factory=list)
    #: jobs squeue has listed (one not listed yet is not taken for ended)
    seen: set[str] = field(default_factory=set)
    _next_poll: float = 0.0
    _seen_at: float = field(default_factory=time.monotonic)
    #: (resubmitted job id, when its predecessor was noticed ended)
    noticed: list[tuple[str, float]] = field(default_factory=list)

    def ids(self) -> list[str]:
        return [j.job_id for j in self.jobs if j.ended is None]

    def step(self, gc: Any, restarts: Any) -> None:
        """Learn each new engine's job, read squeue's answer if there is one,
        and act on a job that ended (never waits)."""
        if gc.stopping:
            return
        self._ask_engines(gc)
        got = self._poll()
        if got is not None:
            self._act(gc, restarts, *got)

    def lost(self, gc: Any, restarts: Any, eid: int) -> bool:
        """Whether engine ``eid``, just found gone, went with a job Slurm
        ended (asked of squeue now: the engines' nannies report them gone
        before the next poll would).  Such a loss is no iteration's fault."""
        if eid in self.ended_engines:
            return True
        active = self.ids()
        if not active or gc.stopping:
            return False
        states = job_states(active)
        if not states:  # squeue failed: the next poll decides
            return False
        self._act(gc, restarts, states, active)
        return eid in self.ended_engines

    def _act(
        self,
        gc: Any,
        restarts: Any,
        states: dict[str, tuple[str, str]],
        asked: list[str],
    ) -> None:
        """Act on squeue's ``states`` of the jobs ``asked`` about (a job
        submitted since is not in the answer, and has not ended)."""
        self.seen.update(states)
        for job in list(self.jobs):
            if job.ended is not None or job.job_id not in asked:
                continue
            st = states.get(job.job_id)
            if st is None and job.job_id not in self.seen:
                continue  # (not listed yet)
            if st is None or st[0] in ENDED:
                # (squeue lists an ended job for MinJobAge, 300 s by default)
                state, reason = st or ("ENDED", "no longer in squeue")
                self._ended(gc, restarts, job, state, reason)

    def _poll(self) -> tuple[dict[str, tuple[str, str]], list[str]] | None:
        """squeue's answer once it is there (None before: it runs meanwhile)."""
        p = self._squeue
        if p is None:
            now = time.monotonic()
            if now < self._next_poll or not self.ids():
                return None
            self._next_poll = now + POLL
            self._asked_jobs = self.ids()
            try:
                self._squeue = subprocess.Popen(
                    ["squeue", "-h", "-j", ",".join(self._asked_jobs)]
                    + ["-o", "%i|%T|%r"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    stdin=subprocess.DEVNULL,
                    text=True,
                )
            except OSError:
                pass
            return None
        if p.poll() is None:
            return None
        self._squeue = None
        out = p.stdout.read() if p.stdout else ""
        if p.stdout:
            p.stdout.close()
        if p.returncode != 0:  # the controller busy or down: nothing learnt
            return None
        states = {}
        for line in out.strip().splitlines():
            job, _, rest = line.partition("|")
            state, _, reason = rest.partition("|")
            states[job.strip()] = (state.strip(), reason.strip())
        return states, self._asked_jobs

    def _ask_engines(self, gc: Any) -> None:
        """Each engine's SLURM_JOB_ID, asked once (queued behind its work)."""
        for eid in gc.engines:
            if eid in self.job_of or eid in gc.dead:
                continue
            if eid not in self._asked:
                with contextlib.suppress(Exception):
                    self._asked[eid] = gc.view(eid).apply_async(_job_id_here)
                continue
            ar = self._asked[eid]
            if ar.ready():
                del self._asked[eid]
                with contextlib.suppress(Exception):
                    self.job_of[eid] = str(ar.get(timeout=0))

    def engines_of(self, gc: Any, job: Job) -> list[int]:
        """The live engines of ``job``: those that said so; with one job left,
        every engine whose job is not known yet too."""
        alive = [e for e in gc.engines if e not in gc.dead]
        mine = [e for e in alive if self.job_of.get(e) == job.job_id]
        if len(self.ids()) == 1:
            mine += [e for e in alive if e not in self.job_of]
        return mine

    def _ended(self, gc: Any, restarts: Any, job: Job, state: str, reason: str) -> None:
        engines = self.engines_of(gc, job)
        self.ended_engines.update(engines)
        job.ended = f"{state}, {reason or 'no reason given'}"
        if state == "COMPLETING":  # Slurm shows the final state only after
            job.ended = (
                "COMPLETING: ended by Slurm before its work was done, by its time "
                f"limit, a preemption or scancel; `sacct -j {job.job_id}` says which"
            )
        noticed = time.monotonic()
        if job.resubmitted < self.resubmit:
            new = self._submit_again(gc, job, restarts, engines)
            if new is not None:
                self.noticed.append((new.job_id, noticed))
                restarts._tell(
                    gc,
                    f"Slurm job {job.job_id} ended ({job.ended}); submitted "
                    f"again as job {new.job_id} (--checkpoint, "
                    f"{new.resubmitted} of {self.resubmit}): its engines take "
                    "the unfinished work as they start",
                )
        else:
            for r in _waiting_for(restarts, job):
                r.gave_up = (
                    f"engine {r.dead} waited for Slurm job {job.job_id}, which "
                    f"ended ({job.ended}) before its engines registered"
                )
            again = (
                f"it was submitted again {job.resubmitted} time(s), the "
                "--checkpoint limit; "
                if self.resubmit
                else ""
            )
            restarts._tell(
                gc,
                f"Slurm job {job.job_id} ended ({job.ended}) and its "
                f"{len(engines)} engine(s) with it; {again}a running cell's "
                "finished chunks are kept: `%gpu_cluster stop`, `%gpu_cluster "
                "start` and `%%gpu_parallel --resume` run only the rest "
                "(`start --checkpoint` submits an ended job again by itself)",
            )
        for eid in engines:  # the run notices them in its next check
            gc.mark_dead(eid)
            restarts.begin(gc, eid)

    def _submit_again(
        self, gc: Any, job: Job, restarts: Any, engines: list[int]
    ) -> Job | None:
        """Submit ``job`` once more; each of its dead engines (and each still
        waiting for ``job``'s) waits for one of the new job's: restarts that
        take any engine."""
        from gpucell.cluster.restart import Restart

        k = job.resubmitted + 1
        set_id = f"{job.set_id}-c{k}"
        try:
            got = self.cluster.start_engines_sync(
                job.engines, engine_set_id=set_id, **job.kw
            )
            job_id = str(self.cluster.engines[got].job_id)
        except Exception as e:
            restarts._tell(
                gc, f"Slurm job {job.job_id} could not be submitted again: {e}"
            )
            return None
        new = Job(set_id, job_id, job.engines, job.kw, resubmitted=k)
        self.jobs.append(new)
        waiting = _waiting_for(restarts, job)
        for r in waiting:  # its own engines never came: the new job's instead
            r.engine_set = set_id
        for eid in engines:
            info = gc.engines.get(eid)
            r = Restart(
                label=ANY_ENGINE,
                dead=eid,
                restarts=getattr(info, "restarts", 0),
                launched=True,
            )
            r.engine_set, r.deadline = set_id, float("inf")
            restarts.pending.append(r)
        restarts.joining += max(0, job.engines - len(engines) - len(waiting))
        return new


def _waiting_for(restarts: Any, job: Job) -> list[Any]:
    """The restarts still waiting for an engine of ``job``."""
    return [
        r
        for r in restarts.pending
        if r.label == ANY_ENGINE and r.engine_set == job.set_id and r.new_id is None
    ]


class Resubmitter:
    """Submits a job again through the cluster with its batch launcher (the
    cluster's own launcher class starts local engines)."""

    def __init__(self, cluster: Any, launcher: type) -> None:
        self.cluster, self.launcher = cluster, launcher

    @property
    def engines(self) -> Any:
        return self.cluster.engines

    def start_engines_sync(self, n: int, **kw: Any) -> Any:
        saved = self.cluster.engine_launcher_class
        self.cluster.engine_launcher_class = self.launcher
        try:
            return self.cluster.start_engines_sync(n, **kw)
        finally:
            self.cluster.engine_launcher_class = saved


#: job id -> its batch system, for jobs not Slurm's (PBS, LSF, SGE: asked
#: with their own qstat/bjobs, gpucell.cluster.batch.job_state)
SCHEDULER_OF: dict[str, str] = {}


def kind(job_id: str) -> str:
    """``Slurm job``, ``PBS job``... as messages name a job."""
    first = job_id.split(",")[0]
    return f"{SCHEDULER_OF.get(first, 'slurm').upper().replace('SLURM', 'Slurm')} job"


def job_states(jobs: Sequence[str]) -> dict[str, tuple[str, str]]:
    """(state, reason) of each of ``jobs`` its scheduler still lists."""
    others = [j for j in jobs if j in SCHEDULER_OF]
    out: dict[str, tuple[str, str]] = {}
    if others:
        from gpucell.cluster import batch

        for j in others:
            if (st := batch.job_state(SCHEDULER_OF[j], j)) is not None:
                out[j] = st
        jobs = [j for j in jobs if j not in SCHEDULER_OF]
        if not jobs:
            return out
    try:
        p = subprocess.run(
            ["squeue", "-h", "-j", ",".join(jobs), "-o", "%i|%T|%r"],
            capture_output=True,
            text=True,
            timeout=15,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if p.returncode != 0:
        return out
    for line in p.stdout.strip().splitlines():
        job, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        out[job.strip()] = (state, reason)
    return out


def job_state(job_id: str) -> tuple[str, str] | None:
    """(state, reason) of a job squeue still lists, or None; of several
    (``a,b``: ``--jobs``): running if one runs, else pending if one is
    (the first one's reason), else ended."""
    got = job_states(job_id.split(",")).values()
    for want in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING"):
        for st in got:
            if st[0] == want:
                return st
    return next(iter(got), None)


_ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
}


def wait_for_job(
    client: Any,
    job_id: str,
    total: int,
    timeout: float,
    echo: Callable[[str], None] | None,
    state: Callable[[str], tuple[str, str] | None] = job_state,
) -> None:
    """Wait for the job's engines, watching the job: pending is said once, an
    ended job or the timeout is a ClusterError (the caller stops the cluster)."""
    t0 = time.monotonic()
    said = False
    what = f"{kind(job_id)} {job_id}"
    last: tuple[str, str] | None = None
    while True:
        try:
            client.wait_for_engines(total, timeout=1.0, interactive=False)
            return
        except TimeoutError:
            pass
        last = state(job_id) or last
        waited = time.monotonic() - t0
        if last is not None and last[0] in _ENDED:
            raise ClusterError(
                f"{what} ended ({last[0]}: {last[1]}) before its engines "
                "registered; its output is in the cluster's log directory."
            )
        if last is not None and last[0] == "PENDING" and not said and echo:
            echo(
                f"gpucell: {what} is pending ({last[1]}); waiting up to {timeout:.0f} s"
            )
            said = True
        if waited > timeout:
            if last is not None and last[0] == "PENDING":
                raise ClusterError(
                    f"{what} was still pending after {timeout:.0f} s "
                    f"({last[1]}); it was cancelled. Ask for fewer nodes or GPUs, "
                    "another --partition, or a longer --timeout."
                )
            raise ClusterError(
                f"Only {len(client.ids)} of {total} engines of batch job {job_id} "
                f"registered within {timeout:.0f} s; the job was cancelled. The "
                "engines' output is in the cluster's log directory."
            )
