"""ipyparallel launch hooks that tie engines and controllers to their kernel.

Registered under ipyparallel's ``ipyparallel.engine_launchers`` and
``ipyparallel.controller_launchers`` entry points as ``gpucell``, so
``Cluster(engines="gpucell")`` and ``ipcluster start --engines=gpucell`` use them too.
They change only the command line: the process starts through
:mod:`gpucell.cluster.boot`, which sets the parent-death signal and the CPU affinity
before
the real ipyparallel module loads.  Everything else is ipyparallel's own launcher.
"""

from __future__ import annotations

import os
import sys

from ipyparallel.cluster.launcher import (
    LocalControllerLauncher,
    LocalEngineSetLauncher,
    SlurmEngineSetLauncher,
    SSHEngineSetLauncher,
)
from traitlets import List, default

__all__ = [
    "PinnedControllerLauncher",
    "PinnedEngineSetLauncher",
    "RemoteEngineSetLauncher",
    "SlurmGpuEngineSetLauncher",
]

_BOOT = [sys.executable, "-m", "gpucell.cluster.boot"]


class PinnedEngineSetLauncher(LocalEngineSetLauncher):
    """Local engines that die with the process that started them."""

    engine_cmd = List(
        [*_BOOT, "ipyparallel.engine"],
        config=True,
        help="Command to launch an engine (through gpucell.cluster.boot).",
    )

    @default("environment")
    def _default_environment(self) -> dict[str, str]:
        return {"GPUCELL_PARENT_PID": str(os.getpid())}


class PinnedControllerLauncher(LocalControllerLauncher):
    """A local controller that dies with the process that started it; its direct
    queue tells the hub of each message without the buffers (lean_monitor)."""

    controller_cmd = List(
        [*_BOOT, "gpucell.cluster.controller"],
        config=True,
        help="Command to launch the controller (through gpucell.cluster.boot).",
    )

    @default("environment")
    def _default_environment(self) -> dict[str, str]:
        # SIGTERM lets the controller remove its connection files as it goes.
        return {
            "GPUCELL_PARENT_PID": str(os.getpid()),
            "GPUCELL_DEATH_SIGNAL": "SIGTERM",
            # every buffer of 1 MiB or more gets its own mapping, returned to
            # the system when freed: glibc's default threshold rises after big
            # frees, and the controller (which relays each input sent without
            # shared memory) then kept gigabytes after a cell
            "MALLOC_MMAP_THRESHOLD_": str(1 << 20),
        }


class RemoteEngineSetLauncher(SSHEngineSetLauncher):
    """Engines started over ssh, through gpucell.cluster.boot on their host.

    Not tied to their parent (ipyparallel's ssh receiver, which exits at once):
    they end when stopped, or when the controller falls silent (heartbeats).
    """

    @default("engine_cmd")
    def _remote_engine_cmd(self) -> list[str]:
        return [self.remote_python, "-m", "gpucell.cluster.boot", "ipyparallel.engine"]


class SlurmGpuEngineSetLauncher(SlurmEngineSetLauncher):
    """Engines as one Slurm job: ``srun`` starts one task per engine, each through
    gpucell.cluster.boot, which pins it by its rank on its node (``SLURM_LOCALID``).

    ``sbatch``'s own complaint (a partition that does not exist, more GPUs than a
    node has) becomes the error, rather than an exit status with no reason.
    """

    @default("engine_cmd")
    def _slurm_engine_cmd(self) -> list[str]:
        return [sys.executable, "-m", "gpucell.cluster.boot", "ipyparallel.engine"]

    def _run_command(self, command: list[str], **kwargs: object) -> str:
        import subprocess

        from gpucell.errors import ClusterError

        if list(command[: len(self.submit_command)]) != list(self.submit_command):
            if not getattr(self, "job_id", None):
                return ""  # nothing was submitted: nothing to cancel or signal
            return str(super()._run_command(command, **kwargs))

        p = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, text=True, **kwargs
        )  # type: ignore[call-overload]
        if p.returncode != 0:
            what = (p.stderr or p.stdout).strip().splitlines()
            raise ClusterError(
                f"Slurm refused the job (`{' '.join(command)}`): "
                f"{what[-1] if what else f'exit status {p.returncode}'}"
            )
        return str(p.stdout)
