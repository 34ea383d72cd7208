"""Engines through Slurm: one job, one task per engine, by ipyparallel's own Slurm
launcher (``sbatch`` of a batch script whose ``srun`` starts the engines).

Each task starts through gpucell.cluster.boot, which pins it by its rank on its node
(``SLURM_LOCALID``: its GPU first in ``CUDA_VISIBLE_DEVICES``).  The job is
cancelled on ``stop`` (the launcher's ``scancel``); if the kernel dies, the engines
end once their controller is silent, and the job with them.  While the engines are
awaited the job is watched: a job that stays pending says so once (with
``squeue``'s reason), and one still pending at the timeout fails the start with
that reason, cancelled.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpucell.errors import ClusterError
from gpucell.protocol.devices import THREAD_ENV_VARS

__all__ = ["SlurmRequest", "batch_template", "start_slurm_engines", "wait_for_job"]


@dataclass(frozen=True)
class SlurmRequest:
    """What ``--slurm`` asks Slurm for: one engine per GPU on each node."""

    nodes: int = 1
    gpus_per_node: int = 1
    partition: str | None = None
    time: str | None = None
    account: str | None = None

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ClusterError(f"--nodes {self.nodes}: a job needs at least 1 node.")
        if self.gpus_per_node < 1:
            raise ClusterError(
                f"--gpus-per-node {self.gpus_per_node}: gpucell starts one engine "
                "per GPU, so at least 1."
            )

    @property
    def engines(self) -> int:
        return self.nodes * self.gpus_per_node


def batch_template(req: SlurmRequest) -> str:
    """The job script (ipyparallel fills ``{program_and_args}`` and the rest)."""
    lines = [
        "#!/bin/sh",
        "#SBATCH --export=ALL",
        "#SBATCH --job-name=gpucell-{cluster_id}",
        f"#SBATCH --nodes={req.nodes}",
        f"#SBATCH --ntasks={req.engines}",
        f"#SBATCH --ntasks-per-node={req.gpus_per_node}",
        f"#SBATCH --gpus-per-node={req.gpus_per_node}",
        "#SBATCH --output={output_file}",
    ]
    if req.partition:
        lines.append(f"#SBATCH --partition={_plain(req.partition, '--partition')}")
    if req.time:
        lines.append(f"#SBATCH --time={_plain(req.time, '--time')}")
    if req.account:
        lines.append(f"#SBATCH --account={_plain(req.account, '--account')}")
    return "\n".join([*lines, "srun {program_and_args}", ""])


def _plain(value: str, flag: str) -> str:
    if not value or any(c.isspace() or c in "{}'\"\\;$`" for c in value):
        raise ClusterError(f"{flag} {value!r}: expected a plain Slurm value.")
    return value


def start_slurm_engines(
    cluster: Any, req: SlurmRequest, engine_args: Sequence[str], python: str | None
) -> str:
    """Submit the engines' job; its id."""
    from gpucell.cluster.launcher import SlurmGpuEngineSetLauncher

    env = {
        "GPUCELL_PIN_BY_RANK": "1",
        "GPUCELL_THREAD_VARS": ",".join(THREAD_ENV_VARS),
        "GPUCELL_PREIMPORT": "numpy",
        # the task's parent is slurmstepd, which lives as long as the job step
    }
    kw: dict[str, Any] = {}
    if python:
        kw["engine_cmd"] = [python, "-m", "gpucell.cluster.boot", "ipyparallel.engine"]
    saved = cluster.engine_launcher_class
    cluster.engine_launcher_class = SlurmGpuEngineSetLauncher
    try:
        set_id = cluster.start_engines_sync(
            req.engines,
            engine_set_id="slurm",
            environment=env,
            engine_args=list(engine_args),
            batch_template=batch_template(req),
            # the script goes beside the cluster's logs, not the notebook's folder
            batch_file_name=os.path.join(cluster.profile_dir, "log", "gpucell.sbatch"),
            **kw,
        )
    finally:
        cluster.engine_launcher_class = saved
    return str(cluster.engines[set_id].job_id)


def job_state(job_id: str) -> tuple[str, str] | None:
    """(state, reason) of a job squeue still lists, or None."""
    try:
        p = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T|%r"],
            capture_output=True,
            text=True,
            timeout=15,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = p.stdout.strip().splitlines()
    if p.returncode != 0 or not line:
        return None
    state, _, reason = line[0].partition("|")
    return state, reason


_ENDED = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}


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
                f"Slurm job {job_id} ended ({last[0]}: {last[1]}) before its engines "
                "registered; its output is in the cluster's log directory."
            )
        if last is not None and last[0] == "PENDING" and not said and echo:
            echo(
                f"gpucell: Slurm job {job_id} is pending ({last[1]}); waiting up to "
                f"{timeout:.0f} s"
            )
            said = True
        if waited > timeout:
            if last is not None and last[0] == "PENDING":
                raise ClusterError(
                    f"Slurm job {job_id} was still pending after {timeout:.0f} s "
                    f"({last[1]}); it was cancelled. Ask for fewer nodes or GPUs, "
                    "another --partition, or a longer --timeout."
                )
            raise ClusterError(
                f"Only {len(client.ids)} of {total} engines of Slurm job {job_id} "
                f"registered within {timeout:.0f} s; the job was cancelled. The "
                "engines' output is in the cluster's log directory."
            )
