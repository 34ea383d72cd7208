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
    SSHEngineSetLauncher,
)
from traitlets import List, default

__all__ = [
    "PinnedControllerLauncher",
    "PinnedEngineSetLauncher",
    "RemoteEngineSetLauncher",
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
    """A local controller that dies with the process that started it."""

    controller_cmd = List(
        [*_BOOT, "ipyparallel.controller"],
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
