"""gpucell: run a notebook cell's loop on every GPU of a cluster.

``%load_ext gpucell`` registers ``%gpu_cluster`` and ``%%gpu_parallel``.  The same
operations are a Python API: :func:`start_cluster`, :func:`connect`, :func:`stop`,
:func:`status`, and :func:`device` on an engine.

Importing gpucell is cheap on purpose: ipyparallel, pynvml, ipywidgets and torch are
imported only when an operation needs them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gpucell.errors import (
    ClusterError,
    DeviceSelectionError,
    GpucellError,
    NoCluster,
    NotParallelizable,
)

__version__ = "0.1.0"

# gpucell's decisions go to loggers under "gpucell", heard only by a handler put on
# "gpucell" itself: they do not propagate, so a notebook's own logging (a
# basicConfig(level=INFO) file) holds exactly the lines a serial run writes, and
# the NullHandler keeps Python's last-resort stderr line away.
_log = logging.getLogger(__name__)
_log.addHandler(logging.NullHandler())
_log.propagate = False

__all__ = [
    "ClusterError",
    "DeviceSelectionError",
    "GpuCell",
    "GpucellError",
    "NoCluster",
    "NotParallelizable",
    "connect",
    "current",
    "ddp",
    "device",
    "last_run",
    "load_ipython_extension",
    "runs",
    "shard",
    "start_cluster",
    "status",
    "stop",
    "unload_ipython_extension",
]

# name -> module that defines it; resolved on first access (PEP 562).
_LAZY = {
    "start_cluster": "gpucell.cluster.lifecycle",
    "connect": "gpucell.cluster.lifecycle",
    "stop": "gpucell.cluster.lifecycle",
    "status": "gpucell.cluster.lifecycle",
    "current": "gpucell.cluster.lifecycle",
    "device": "gpucell.engine.runtime",
    "ddp": "gpucell.engine.ddp",
    "shard": "gpucell.engine.ddp",
    "GpuCell": "gpucell.config",
    "runs": "gpucell.kernel.background",
}

if TYPE_CHECKING:
    from gpucell.cluster.lifecycle import connect, current, start_cluster, status, stop
    from gpucell.config import GpuCell
    from gpucell.core.provenance import LastRun
    from gpucell.engine.ddp import ddp, shard
    from gpucell.engine.runtime import device
    from gpucell.kernel.background import runs

    #: The record of the last ``%%gpu_parallel`` cell (``None`` before the
    #: first): ``gpucell.last_run.timeline()``, ``.table()``, ``.summary()``.
    last_run: LastRun | None


def __getattr__(name: str) -> Any:
    if name == "last_run":  # the kernel's session holds it (never copied here)
        from gpucell.kernel.session import current

        return current().last_run
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'gpucell' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where JupyterLab finds the panel's prebuilt extension (``pip install``
    puts it in ``share/jupyter/labextensions/gpucell`` too)."""
    return [{"src": "labextension/prebuilt", "dest": "gpucell"}]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpucell``: register the magics (loading twice is harmless)."""
    from gpucell.kernel.magics import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext gpucell``: stop the cluster gpucell started, drop the magics."""
    from gpucell.kernel.magics import unload

    unload(ipython)
