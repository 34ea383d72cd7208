"""What a batch system says of jobs: ``squeue``'s states (ended jobs
included) and ``scontrol``'s end state of a job still completing, Slurm's
compressed node lists, and the wait for a start's engines that watches its
job (pending said once, an ended job or the timeout a ClusterError).
PBS/LSF/SGE jobs are asked through :mod:`gpucell.cluster.batch`.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpucell.errors import ClusterError

__all__ = [
    "ENDED",
    "REQUEUED",
    "SCHEDULER_OF",
    "end_state",
    "hostnames",
    "job_state",
    "job_states",
    "kind",
    "wait_for_job",
]

#: squeue for given jobs in every state: an ended job is listed (for MinJobAge)
#: with its end state (TIMEOUT, PREEMPTED...), not dropped from the answer
SQUEUE = ("squeue", "-h", "-t", "all", "-j")
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


#: states of a job Slurm put back in the queue (PreemptMode=REQUEUE, a node
#: failure): its engines are gone, and it runs again from its script
REQUEUED = {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}


def end_state(
    job_id: str, reason: str, requeues: int = 0, patience: float = 1.0
) -> Any:
    """A completing job's end state (TIMEOUT, PREEMPTED...) and reason:
    ``scontrol show job`` has it a moment before squeue (asked for up to
    ``patience`` s), a requeue by its count of restarts above ``requeues``,
    a preemption by its PreemptTime, a time limit by squeue's reason."""
    deadline = time.monotonic() + patience
    while True:
        try:
            p = subprocess.run(
                ["scontrol", "show", "job", "-o", job_id],
                capture_output=True,
                text=True,
                timeout=10,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        fields = dict(x.partition("=")[::2] for x in p.stdout.split())
        state = fields.get("JobState", "")
        if p.returncode == 0 and state in ENDED and state != "COMPLETING":
            return state, fields.get("Reason", "")
        again = fields.get("Restarts", "0")
        if p.returncode == 0 and (
            state in REQUEUED
            or state == "PENDING"
            or (again.isdigit() and int(again) > requeues)
        ):
            return "REQUEUED", fields.get("Reason", "")  # (pending again)
        if fields.get("PreemptTime", "None") not in ("None", "Unknown", ""):
            return "PREEMPTED", f"preempted at {fields['PreemptTime']}"
        if reason == "TimeLimit":
            return "TIMEOUT", reason
        if p.returncode != 0 or time.monotonic() > deadline:
            return None
        time.sleep(0.2)


def hostnames(nodelist: str) -> list[str]:
    """Slurm's compressed node list as names: ``gpu[01-03,7],vm`` ->
    ``gpu01 gpu02 gpu03 gpu7 vm`` (what ``scontrol show hostnames`` gives)."""
    out: list[str] = []
    depth, start = 0, 0
    parts = []
    for i, c in enumerate(nodelist + ","):
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            parts.append(nodelist[start:i].strip())
            start = i + 1
    for part in filter(None, parts):
        head, sep, rest = part.partition("[")
        if not sep:
            out.append(part)
            continue
        ranges, _, tail = rest.partition("]")
        for r in ranges.split(","):
            lo, dash, hi = r.partition("-")
            if not dash:
                out.append(f"{head}{lo}{tail}")
                continue
            for k in range(int(lo), int(hi) + 1):
                out.append(f"{head}{k:0{len(lo)}d}{tail}")
    return out


def short(host: str) -> str:
    return host.split(".")[0]


#: job id -> its batch system, for jobs not Slurm's (PBS, LSF, SGE: asked
#: with their own qstat/bjobs, gpucell.cluster.batch.job_state)
SCHEDULER_OF: dict[str, str] = {}


def kind(job_id: str) -> str:
    """``Slurm job``, ``PBS job``... as messages name a job."""
    first = job_id.split(",")[0]
    return f"{SCHEDULER_OF.get(first, 'slurm').upper().replace('SLURM', 'Slurm')} job"


def job_states(jobs: Sequence[str], nodes: bool = False) -> dict[str, tuple[str, ...]]:
    """(state, reason) of each of ``jobs`` its scheduler still lists (with
    ``nodes``, Slurm's: (state, reason, node list))."""
    others = [j for j in jobs if j in SCHEDULER_OF]
    out: dict[str, tuple[str, ...]] = {}
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
            [*SQUEUE, ",".join(jobs), "-o", "%i|%T|%r" + ("|%N" if nodes else "")],
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
        job, *rest = line.split("|")
        out[job.strip()] = tuple(x.strip() for x in (rest + ["", ""])[: 2 + nodes])
    return out


def job_state(job_id: str) -> tuple[str, str] | None:
    """(state, reason) of a job squeue still lists, or None; of several
    (``a,b``: ``--jobs``): running if one runs, else pending if one is
    (the first one's reason), else ended."""
    got = job_states(job_id.split(",")).values()
    for want in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING"):
        for st in got:
            if st[0] == want:
                return st[0], st[1]
    first = next(iter(got), None)
    return (first[0], first[1]) if first else None


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
