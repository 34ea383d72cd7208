"""The cluster lifecycle: start, connect, describe, stop, and the active cluster.

Everything goes through ipyparallel's own ``Cluster``, launchers and ``Client``;
gpucell only decides which engines to start (:mod:`gpucell.core.topology`) and pins
them through its launch hook (:mod:`gpucell.cluster.launcher`).  The magics call
these functions; the work is in :mod:`.starting`, :mod:`.connecting`,
:mod:`.profiles`, :mod:`.engines` and :mod:`.model`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpucell.cluster import connecting, restart_watch, starting
from gpucell.cluster.engines import EngineInfo, format_status
from gpucell.cluster.model import GpuCluster
from gpucell.cluster.starting import (  # noqa: F401 (tests/test_slurm.py uses it)
    remote_engine_args as _remote_engine_args,
)
from gpucell.errors import ClusterError, NoCluster

if TYPE_CHECKING:
    from gpucell.devices.nvml import NvmlApi

__all__ = [
    "EngineInfo",
    "GpuCluster",
    "connect",
    "current",
    "current_or_none",
    "format_status",
    "start_cluster",
    "status",
    "stop",
]

_current: GpuCluster | None = None


def current() -> GpuCluster:
    """The active cluster, or :class:`NoCluster` with the command to start one."""
    if _current is None:
        raise NoCluster()
    return _current


def current_or_none() -> GpuCluster | None:
    """The active cluster, or ``None``: for displays and checks that must not raise."""
    return _current


def start_cluster(
    n: int | None = None,
    *,
    gpus: str | Sequence[int] | None = None,
    per_gpu: int | None = None,
    cpu_engines: int | None = None,
    profile: str | None = None,
    timeout: float | None = None,
    nvml: NvmlApi | None = None,
    echo: Callable[[str], None] | None = None,
    ssh: str | None = None,
    ssh_key: str | None = None,
    python: str | None = None,
    controller_ip: str | None = None,
    slurm: Any = None,
    encrypt: bool | None = None,
) -> GpuCluster:
    """Start a cluster with one engine per GPU (or per core without GPUs), here
    and on the ``ssh`` hosts; it becomes the active cluster.

    ``n``: CPU engines when there is no GPU (default: one per core); with GPUs,
    the first ``n`` selected GPUs.  ``gpus``: ``"all"`` (default), ``"none"``,
    or indices (``"0,2"``, ``[0, 2]``).  ``per_gpu``, ``cpu_engines``: engines
    per GPU; CPU engines beside them.  ``profile``: an IPython profile whose
    ipyparallel config to use (it keeps where engines ran).  ``timeout``: seconds
    to wait for every engine; on expiry everything started is stopped.
    ``nvml``: tests pass a fake.  ``echo``: where the "ready" line goes.
    ``ssh``: other hosts, ``host1[:n],user@host2[:n]``, whose engines start
    over ssh; ``ssh_key``, ``python``: the key for those logins and the Python
    with gpucell there.  ``controller_ip``: where the controller listens
    (default: with ``ssh`` the address the hosts saw, with ``slurm`` this
    host's, else loopback).  ``slurm``: a :class:`gpucell.cluster.slurm.
    SlurmRequest`: the engines are one Slurm job instead of this host's.
    ``encrypt``: ``False`` sends the messages in clear (default:
    ``GpuCell.encrypt``; a Slurm cluster's are never encrypted).
    """
    global _current
    t0 = time.perf_counter()
    p = starting.plan(n, gpus, per_gpu, cpu_engines, nvml, slurm, ssh)
    if _current is not None:
        if (
            slurm is None
            and _current.owned
            and [x.label for x in _current.specs] == [x.label for x in p.specs]
        ):
            if echo:
                echo(f"gpucell: cluster already running: {_current.description}")
            restart_watch.watch(_current)
            return _current
        raise ClusterError(
            f"A cluster is already running ({len(_current.engines)} engines). "
            "Stop it first with `%gpu_cluster stop` (or `gpucell.stop()`)."
        )
    _current = starting.launch(
        p,
        profile=profile,
        timeout=timeout,
        where=(ssh, ssh_key, python, controller_ip, slurm),
        per_gpu=per_gpu,
        echo=echo,
        t0=t0,
        encrypt=encrypt,
    )
    restart_watch.watch(_current)  # engines dying between cells come back
    return _current


def connect(
    *,
    profile: str | None = None,
    cluster_id: str | None = None,
    file: str | None = None,
    ssh: str | None = None,
    ssh_key: str | None = None,
    timeout: float | None = None,
    min_engines: int = 1,
    echo: Callable[[str], None] | None = None,
) -> GpuCluster:
    """Attach to a cluster started elsewhere (``ipcluster start``, another host).

    Engines are assigned devices by their local rank on each host: the r-th engine
    of a host with G GPUs gets GPU ``r % G``.  ``ssh`` (``user@host[:port]``)
    tunnels every connection through that server with the ``ssh`` command, using
    ``ssh_key`` or the user's ssh configuration; key-based login is needed (no
    password prompt can reach a notebook).
    """
    global _current
    if _current is not None:
        raise ClusterError(
            f"A cluster is already active ({len(_current.engines)} engines). "
            "Stop or leave it first with `%gpu_cluster stop`."
        )
    _current = connecting.connect_to(
        profile=profile,
        cluster_id=cluster_id,
        file=file,
        ssh=ssh,
        ssh_key=ssh_key,
        timeout=timeout,
        min_engines=min_engines,
        echo=echo,
    )
    restart_watch.watch(_current)
    return _current


def stop(echo: Callable[[str], None] | None = None) -> None:
    """Stop the cluster gpucell started (or disconnect from one it joined)."""
    global _current
    gc, _current = _current, None
    restart_watch.forget()
    if gc is None:
        if echo:
            echo("gpucell: no cluster to stop.")
        return
    t0 = time.perf_counter()
    gc.stop()
    if echo:
        what = "stopped" if gc.owned else "disconnected from"
        echo(f"gpucell: {what} {gc.description} in {time.perf_counter() - t0:.1f} s")


def status() -> list[EngineInfo]:
    """Rows of the status table for the active cluster."""
    gc = current()
    restart_watch.watch(gc)  # (a cluster started before the kernel's loop ran)
    return gc.refresh()
