"""ipyparallel launch hooks that tie engines and controllers to their kernel.

Registered under ipyparallel's ``ipyparallel.engine_launchers`` and
``ipyparallel.controller_launchers`` entry points as ``gpucell``, so
``Cluster(engines="gpucell")`` and ``ipcluster start --engines=gpucell`` use them too.
They change only the command line: the process starts through
:mod:`gpucell.cluster.boot`, which sets the parent-death signal and the CPU affinity
before
the real ipyparallel module loads.  Everything else is ipyparallel's own launcher,
except that the processes' log files in the profile are made 0600 before they are
opened (ipyparallel opens them with the umask's mode, 0644: what a loop prints
would be readable by every local user), and the controller runs with umask 077
(its connection files, with their key, and its state are 0600 from the start).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ipyparallel.cluster.launcher import (
    LocalControllerLauncher,
    LocalEngineLauncher,
    LocalEngineSetLauncher,
    SlurmEngineSetLauncher,
    SSHEngineSetLauncher,
)
from traitlets import List, default

from gpucell.protocol import private

__all__ = [
    "PinnedControllerLauncher",
    "PinnedEngineLauncher",
    "PinnedEngineSetLauncher",
    "RemoteEngineSetLauncher",
    "SlurmGpuEngineSetLauncher",
]

_BOOT = [sys.executable, "-m", "gpucell.cluster.boot"]


def _private_log(path: str) -> None:
    """The log file ``path``, made 0600 (and its folder 0700) before
    ipyparallel opens it to append: never through a link planted there."""
    if path:
        private.tighten_folder(os.path.dirname(path))
        private.touch(path)


class PinnedEngineLauncher(LocalEngineLauncher):
    """One local engine, its log 0600."""

    def start(self) -> Any:
        _private_log(self.output_file)
        return super().start()


class PinnedEngineSetLauncher(LocalEngineSetLauncher):
    """Local engines that die with the process that started them."""

    launcher_class = PinnedEngineLauncher

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

    def start(self) -> Any:
        _private_log(self.output_file)
        return super().start()

    @default("environment")
    def _default_environment(self) -> dict[str, str]:
        # SIGTERM lets the controller remove its connection files as it goes.
        return {
            "GPUCELL_PARENT_PID": str(os.getpid()),
            "GPUCELL_DEATH_SIGNAL": "SIGTERM",
            # what the controller writes (connection files with their key, the
            # engines' state in the log folder) is 0600 from the first byte
            "GPUCELL_UMASK": "077",
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

    def render_batch_script(self, n: int = 1) -> str:
        """The job script for ``n`` engines, as :meth:`write_batch_script`
        writes it (ipyparallel's steps, less the file): what ``--dry-run``
        shows is what is submitted."""
        import json

        self.n = n
        self.context["environment_json"] = json.dumps(self.get_env())
        ns: dict[str, Any] = {}
        ns.update(self.context)
        ns.update(self.namespace)
        return str(self.formatter.format(self.batch_template, **ns))

    def write_batch_script(self, n: int = 1) -> None:
        if not self.batch_template:  # configured otherwise: ipyparallel's way
            super().write_batch_script(n)
            return
        import stat

        script = self.render_batch_script(n)
        with open(self.batch_file, "w") as f:
            f.write(script)
        os.chmod(self.batch_file, stat.S_IRUSR | stat.S_IWUSR | stat.S_IXUSR)

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
