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
status``): one non-blocking ``squeue`` at a time, never a wait.  A job Slurm
requeues (PreemptMode=REQUEUE) is, with ``--checkpoint``, its own resubmission;
a job submitted again that pends past ``GpuCell.slurm_pending_timeout`` is
cancelled.  What squeue and scontrol say: :mod:`gpucell.cluster.slurm_queue`.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from gpucell.cluster.restart import ANY_ENGINE
from gpucell.cluster.slurm_queue import (
    ENDED,
    REQUEUED,
    SCHEDULER_OF,
    SQUEUE,
    end_state,
    hostnames,
    job_state,
    job_states,
    kind,
    short,
    wait_for_job,
)

__all__ = [
    "ANY_ENGINE",
    "SCHEDULER_OF",
    "Job",
    "JobWatch",
    "Resubmitter",
    "hostnames",
    "job_state",
    "job_states",
    "kind",
    "wait_for_job",
]

#: seconds between squeue calls
POLL = 1.0


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
    #: its nodes as squeue names them (once it runs): whose engines are whose
    nodes: tuple[str, ...] = ()
    #: when it was submitted (time.monotonic): a resubmission pends so long
    submitted: float = field(default_factory=time.monotonic)
    #: seen running: pending again after that, Slurm requeued it
    ran: bool = False


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
    #: seconds a resubmitted job may pend (None: GpuCell.slurm_pending_timeout)
    pending_timeout: float | None = None

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
        states = job_states(active, nodes=True)
        if not states:  # squeue failed: the next poll decides
            return False
        self._act(gc, restarts, states, active)
        return eid in self.ended_engines

    def _act(
        self,
        gc: Any,
        restarts: Any,
        states: dict[str, tuple[str, ...]],
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
            if st is not None and len(st) > 2 and st[2] and not job.nodes:
                job.nodes = tuple(hostnames(st[2]))
            if st is not None and st[0] == "COMPLETING" and self._requeues(job):
                continue  # (the run Slurm requeued, still being ended)
            if st is None or st[0] in ENDED:
                # (squeue lists an ended job for MinJobAge, 300 s by default)
                state, reason = (st or ("ENDED", "no longer in squeue"))[:2]
                self._ended(gc, restarts, job, state, reason)
            elif st[0] == "RUNNING":
                job.ran = True
            elif st[0] in REQUEUED or (st[0] == "PENDING" and self._ran(job)):
                self._requeued(gc, restarts, job, st[0], st[1])
            elif st[0] == "PENDING" and job.resubmitted:
                limit = self._pending_limit()
                if limit > 0 and time.monotonic() - job.submitted > limit:
                    self._pending_too_long(gc, restarts, job, st[1], limit)

    def _pending_limit(self) -> float:
        """Seconds a resubmitted job may pend (0: no limit)."""
        if self.pending_timeout is not None:
            return self.pending_timeout
        from gpucell.config import settings

        return float(getattr(settings(), "slurm_pending_timeout", 0) or 0)

    def _pending_too_long(
        self, gc: Any, restarts: Any, job: Job, reason: str, limit: float
    ) -> None:
        """A resubmitted job still pending at the limit: cancelled, and the
        engines waiting for it give up (a cell with no other engine fails,
        its finished chunks kept for ``--resume``)."""
        job.ended = f"PENDING, {reason or 'no reason given'}"
        _scancel(job.job_id)
        text = (
            f"Slurm job {job.job_id} (submitted again by --checkpoint) was still "
            f"pending after {limit:g} s ({reason or 'no reason given'}); it was "
            "cancelled (GpuCell.slurm_pending_timeout). A running cell's finished "
            "chunks are kept: `%gpu_cluster stop`, `%gpu_cluster start` and "
            "`%%gpu_parallel --resume` run only the rest"
        )
        restarts._tell(gc, text)
        for r in _waiting_for(restarts, job):
            r.gave_up = (
                f"engine {r.dead} waited for Slurm job {job.job_id}, which was "
                "cancelled still pending"
            )

    def _poll(self) -> tuple[dict[str, tuple[str, ...]], list[str]] | None:
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
                    [*SQUEUE, ",".join(self._asked_jobs), "-o", "%i|%T|%r|%N"],
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
        states: dict[str, tuple[str, ...]] = {}
        for line in out.strip().splitlines():
            job, state, reason, nodes = (line.split("|") + ["", "", ""])[:4]
            states[job.strip()] = (state.strip(), reason.strip(), nodes.strip())
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
        """The live engines of ``job``: those that said so; of those whose job
        is not known yet (their answer queued behind a chunk), with one job
        left every one, else those on a node of ``job``'s alone."""
        alive = [e for e in gc.engines if e not in gc.dead]
        mine = [e for e in alive if self.job_of.get(e) == job.job_id]
        unknown = [e for e in alive if e not in self.job_of]
        if len(self.ids()) == 1:
            return mine + unknown
        others = {
            n for j in self.jobs if j is not job and j.ended is None for n in j.nodes
        }
        only = {short(n) for n in job.nodes} - {short(n) for n in others}
        hosts = {e: short(str(getattr(gc.engines[e], "host", ""))) for e in unknown}
        return mine + [e for e in unknown if hosts[e] in only]

    def _ended(self, gc: Any, restarts: Any, job: Job, state: str, reason: str) -> None:
        if state == "COMPLETING":  # squeue shows the end state only after
            got = end_state(job.job_id, reason, self._requeues(job))
            state, reason = got or (state, reason)
        if state in REQUEUED:
            self._requeued(gc, restarts, job, state, reason)
            return
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
        _gone(gc, restarts, engines)

    def _submit_again(
        self, gc: Any, job: Job, restarts: Any, engines: list[int]
    ) -> Job | None:
        """Submit ``job`` once more; each of its dead engines (and each still
        waiting for ``job``'s) waits for one of the new job's: restarts that
        take any engine."""
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
        self._await(gc, restarts, job, new, engines)
        return new

    def _await(
        self, gc: Any, restarts: Any, job: Job, new: Job, engines: list[int]
    ) -> None:
        """Watch ``new`` (``job`` again): each of ``job``'s dead engines (and
        each still waiting for ``job``'s) waits for one of ``new``'s, a restart
        that takes any engine."""
        from gpucell.cluster.restart import Restart

        self.jobs.append(new)
        waiting = _waiting_for(restarts, job)
        for r in waiting:  # its own engines never came: the new job's instead
            r.engine_set = new.set_id
        for eid in engines:
            info = gc.engines.get(eid)
            r = Restart(
                label=ANY_ENGINE,
                dead=eid,
                restarts=getattr(info, "restarts", 0),
                launched=True,
            )
            r.engine_set, r.deadline = new.set_id, float("inf")
            restarts.pending.append(r)
        restarts.joining += max(0, job.engines - len(engines) - len(waiting))

    def _requeues(self, job: Job) -> int:
        """Times Slurm requeued ``job`` before (its earlier runs watched)."""
        return sum(1 for j in self.jobs if j.job_id == job.job_id) - 1

    def _ran(self, job: Job) -> bool:
        """Whether ``job`` ran: seen running, or an engine said it is its."""
        job.ran = job.ran or job.job_id in self.job_of.values()
        return job.ran

    def _requeued(
        self, gc: Any, restarts: Any, job: Job, state: str, reason: str
    ) -> None:
        """Slurm put ``job`` back in the queue (a preemption with
        PreemptMode=REQUEUE): its engines are gone, and it runs again by
        itself.  With --checkpoint that is the resubmission (its engines take
        the unfinished work when it runs, within the pending limit); without,
        it is cancelled and the cell fails as for an ended job."""
        engines = self.engines_of(gc, job)
        self.ended_engines.update(engines)
        # The run that ended is forgotten: its engines said this job id, and
        # the requeued job pending under the same id has not run yet (were it
        # taken for run, its PENDING would count as a second requeue).
        for eid in [e for e, j in self.job_of.items() if j == job.job_id]:
            del self.job_of[eid]
        job.ended = state + (f", {reason}" if reason not in ("", "None") else "")
        what = f"Slurm job {job.job_id} was requeued by Slurm ({job.ended})"
        if job.resubmitted < self.resubmit:
            new = Job(job.set_id, job.job_id, job.engines, job.kw)
            new.resubmitted = job.resubmitted + 1
            self._await(gc, restarts, job, new, engines)
            self.noticed.append((new.job_id, time.monotonic()))
            restarts._tell(
                gc,
                f"{what}: its engines take the unfinished work when it runs "
                f"again (--checkpoint, {new.resubmitted} of {self.resubmit})",
            )
        else:
            _scancel(job.job_id)
            for r in _waiting_for(restarts, job):
                r.gave_up = f"engine {r.dead} waited for Slurm job {job.job_id}"
            restarts._tell(
                gc,
                f"{what} and is cancelled, its {len(engines)} engine(s) gone; a "
                "running cell's finished chunks are kept: `%gpu_cluster stop`, "
                "`%gpu_cluster start` and `%%gpu_parallel --resume` run only the "
                "rest (`start --checkpoint` waits for a requeued job by itself)",
            )
        _gone(gc, restarts, engines)


def _gone(gc: Any, restarts: Any, engines: list[int]) -> None:
    """Mark a job's engines dead (the run notices them in its next check) and
    gone for the restarts: none starts them again (their job's engines, if
    any, take their places), so none says it would not."""
    for eid in engines:
        gc.mark_dead(eid)
        restarts.gone.add(eid)


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


def _scancel(job_id: str) -> None:
    """Cancel a job, whatever Slurm answers (it may have ended meanwhile)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            ["scancel", job_id],
            capture_output=True,
            timeout=15,
            stdin=subprocess.DEVNULL,
        )
