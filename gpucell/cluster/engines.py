"""The cluster's engines as the kernel knows them: what each one is, how one
is launched (its environment) and asked to describe itself, and the heavy
libraries it imports ahead of the first cell, and the status table.

Shared by starting (``starting``), connecting (``connecting``) and restarting a
dead engine (``restart``), which is why it is apart from all three (lifecycle
and restart imported each other's private names before).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucell.core.states import IDLE, EngineState
from gpucell.core.topology import EngineSpec, slice_text
from gpucell.devices.host import identity, shares_pids
from gpucell.errors import ClusterError

if TYPE_CHECKING:  # imported lazily at run time: ipyparallel costs ~0.3 s
    import ipyparallel as ipp

    from gpucell.cluster.model import GpuCluster

__all__ = [
    "HEAVY_MODULES",
    "EngineInfo",
    "answers",
    "describe_async",
    "describe_engines",
    "engine_env",
    "format_status",
    "heavy_modules_in_kernel",
    "info_from",
    "preimport",
    "summary",
]


@dataclass(frozen=True)
class EngineInfo:
    """One engine as the status table shows it."""

    id: int
    host: str
    pid: int
    kind: str  # "gpu" or "cpu"
    index: int  # GPU index on its host, -1 for CPU
    name: str
    memory_total: int
    label: str = ""
    threads: int | None = None
    cpu_affinity: tuple[int, ...] = ()
    cuda_visible_devices: str | None = None
    state: EngineState = IDLE
    shm: bool = False  # maps files in the kernel's /dev/shm (gpucell.protocol.shm)
    # its pids are the kernel's (same machine and pid namespace): the kernel may
    # read its /proc entry and signal it; else it goes through the controller
    local: bool = False
    restarts: int = 0  # times this device's engine was restarted after dying
    # dead and being restarted now (status says "dead (restarting)"); cells
    # route around it and take the new engine when it is back
    restarting: bool = False

    @property
    def device(self) -> str:
        """``GPU 0``, ``GPU 0 MIG-c6d4f1ef`` (a MIG slice of GPU 0) or ``CPU``."""
        if self.kind != "gpu":
            return "CPU"
        mig = slice_text(self.cuda_visible_devices)
        return f"GPU {self.index} {mig}" if mig else f"GPU {self.index}"


#: libraries that take seconds to import: engines import those the kernel has
HEAVY_MODULES = (
    "torch",
    "pandas",
    "sklearn",
    "scipy",
    "jax",
    "tensorflow",
    "transformers",
)


def preimport(client: Any, ids: Sequence[int]) -> None:
    """Engines import the kernel's heavy libraries as a task of their own once
    they are up (not in a thread while they boot: ipykernel's start-up iterates
    sys.modules, and torch imported from two threads at once can be left half
    initialised); the kernel does not wait for it.  The task is gpucell's own
    chunk runner (``worker.warm``: importing it cost each engine ~50 ms of CPU
    on the first cell, and a chunk's first pass ~1.6 ms more); then
    numpy.random where the kernel has numpy (the seed check imports it on the
    first cell: ~5 ms an engine)."""
    if ids:
        import sys

        from gpucell.engine.worker import ByName

        names = [*heavy_modules_in_kernel()]
        if "numpy" in sys.modules:
            names.insert(0, "numpy.random")
        with contextlib.suppress(Exception):  # a head start, never a failure
            client.direct_view(list(ids)).apply_async(ByName("warm"), names)


def heavy_modules_in_kernel() -> list[str]:
    """The heavy libraries this kernel has imported (a cell will likely use them)."""
    import sys

    return [m for m in HEAVY_MODULES if m in sys.modules]


def engine_env(spec: EngineSpec) -> dict[str, str]:
    env = dict(spec.env)
    env.update(
        {
            "GPUCELL_PARENT_PID": str(os.getpid()),
            "GPUCELL_ENGINE_LABEL": spec.label,
            "GPUCELL_DEVICE_KIND": spec.device.kind,
            "GPUCELL_DEVICE_INDEX": str(spec.device.index),
            "GPUCELL_DEVICE_NAME": spec.device.name,
            "GPUCELL_DEVICE_MEMORY": str(spec.device.memory_total),
            # imported while the engine waits for the controller anyway; the first
            # message it deserialises would import it otherwise
            "GPUCELL_PREIMPORT": "numpy",
        }
    )
    if spec.cpu_affinity:
        env["GPUCELL_CPU_AFFINITY"] = ",".join(map(str, spec.cpu_affinity))
    return env


def describe_async(gc: GpuCluster, eid: int) -> Any:
    """Tune and describe one new engine (a restart) without waiting."""
    from gpucell.engine.runtime import describe
    from gpucell.engine.tuning import tune

    view = gc.client.direct_view([eid])
    view.apply_async(tune)
    return view.apply_async(describe, gc._channel)


def describe_engines(
    client: ipp.Client, ids: Sequence[int], timeout: float, channel: Any = None
) -> dict[int, dict[str, Any]]:
    """Tune and describe the engines of a cluster we started."""
    from gpucell.engine.runtime import describe
    from gpucell.engine.tuning import tune

    view = client.direct_view(list(ids))
    # engines we started are ours to tune (see engine_tuning); same round trip
    view.apply_async(tune)
    infos = answers(view.apply_async(describe, channel), timeout, "describe")
    return dict(zip(ids, infos, strict=True))


def answers(ar: Any, timeout: float, what: str) -> Any:
    """``ar``'s result, or a :class:`ClusterError` that says what went wrong: no
    answer in time, gpucell missing on the engines, or the engines' own error."""
    import ipyparallel as ipp

    try:
        return ar.get(timeout=timeout)
    except ipp.error.TimeoutError as e:
        raise ClusterError(
            f"Engines did not answer within {timeout:.0f} s when asked to {what} "
            "themselves; they may be busy with another client's work or hung. "
            "Check their logs, or raise GpuCell.start_timeout."
        ) from e
    except ipp.error.RemoteError as e:
        if e.ename in ("ModuleNotFoundError", "ImportError") and "gpucell" in str(
            e.evalue
        ):
            from gpucell import __version__

            raise ClusterError(
                f"The engines cannot import gpucell ({e.evalue}). Install gpucell "
                f"{__version__} on the engines' hosts, in the Python the engines run "
                f"(`pip install gpucell=={__version__}`), then connect again."
            ) from None
        raise ClusterError(
            f"Engines failed when asked to {what} themselves: {e.ename}: {e.evalue}"
        ) from None
    except Exception as e:
        raise ClusterError(
            f"Engines could not be asked to {what} themselves: {e!r}"
        ) from e


#: the kernel's own machine and pid namespace, to compare engines' with
_KERNEL = identity()


def info_from(eid: int, d: dict[str, Any]) -> EngineInfo:
    threads = d.get("threads", {}).get("GPUCELL_NUM_THREADS")
    return EngineInfo(
        id=eid,
        host=d["host"],
        pid=d["pid"],
        kind=d["kind"],
        index=d["index"],
        name=d["name"] or ("CPU" if d["kind"] == "cpu" else "GPU"),
        memory_total=d["memory_total"],
        label=d["label"],
        threads=int(threads) if threads else d.get("torch_threads"),
        cpu_affinity=tuple(d.get("cpu_affinity", ())),
        cuda_visible_devices=d.get("cuda_visible_devices"),
        shm=bool(d.get("shm")),
        local=shares_pids(d.get("identity") or {"host": d["host"]}, _KERNEL),
    )


def summary(engines: dict[int, EngineInfo]) -> str:
    """``2 × GPU 0 (A100), CPU``: what a cluster is made of, in one line."""
    counts: dict[str, int] = {}
    for e in engines.values():
        key = f"{e.device} ({e.name})" if e.kind == "gpu" else "CPU"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} × {k}" if n > 1 else k for k, n in counts.items())


def _state_text(r: EngineInfo) -> str:
    text = r.state + (" (restarting)" if r.restarting and r.state == "dead" else "")
    return text + (f" (restarted {r.restarts}x)" if r.restarts else "")


def format_status(
    rows: Sequence[EngineInfo], selected: Sequence[int] | None = None
) -> str:
    """The status table as text (pure): this host's engines first, then each
    other host's together."""
    head = ("engine", "host", "pid", "device", "name", "memory", "threads", "state")
    body = []
    for r in sorted(rows, key=lambda r: (not r.local, r.host, r.id)):
        mem = f"{r.memory_total / 2**30:.1f} GiB" if r.memory_total else "-"
        mark = "*" if selected is not None and r.id in selected else ""
        body.append(
            (
                f"{r.id}{mark}",
                r.host,
                str(r.pid),
                r.device,
                r.name,
                mem,
                str(r.threads or "-"),
                _state_text(r),
            )
        )
    widths = [
        max(len(h), *(len(b[i]) for b in body)) if body else len(h)
        for i, h in enumerate(head)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    for b in body:
        lines.append("  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)


def encryption_note(gc: Any) -> str | None:
    """``encrypted: no`` and what that means, for a cluster whose messages
    travel in clear (``None`` when they are encrypted: a CurveZMQ cluster's
    client holds the controller's server key)."""
    if getattr(gc.client, "curve_serverkey", None):
        return None
    return (
        "encrypted: no (anyone who reaches the controller's ports can read the "
        "cells' inputs and output; clusters gpucell starts are encrypted unless "
        "GpuCell.encrypt = False or --no-encrypt)"
    )
