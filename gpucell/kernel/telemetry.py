"""Kernel-side telemetry: one source for every engine of a cluster.

Engines on this host are measured from the kernel, without touching the engine
(:class:`gpucell.devices.sampling.LocalTelemetry`).  Engines on other hosts
measure themselves in a sampler thread (:mod:`gpucell.engine.telemetry`) that
publishes with ipyparallel's ``publish_data`` while a task runs, so samples arrive
in the running task's ``AsyncResult.data``; :class:`RemoteTelemetry` collects
them as the dispatcher polls its in-flight tasks.  Telemetry observes: every
``sample()`` returns samples (``state="error"`` or ``"dead"`` and ``None``
metrics when it cannot measure) instead of raising.  The JSON form is
:mod:`gpucell.protocol.telemetry`.

How the dispatcher uses it (:mod:`gpucell.kernel.dispatch`)::

    tele = telemetry.for_cluster(gc, alive)   # once per cell, before load_ars
    tele.start_remote()                       # no-op without remote engines
    ...                                       # in the wait loop, every ~50 ms:
    tele.poll(inflight)                       # keys of inflight are AsyncResults
    ...                                       # in report(), at 2-4 Hz:
    samples = tele.sample()                   # list[DeviceSample], never raises
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpucell.devices.sampling import LocalTelemetry
from gpucell.protocol.telemetry import (
    DATA_KEY,
    UNKNOWN,
    DeviceSample,
    failed_sample,
    target_of,
)

if TYPE_CHECKING:
    from gpucell.cluster.lifecycle import GpuCluster
    from gpucell.devices.nvml import NvmlApi

__all__ = ["ClusterTelemetry", "LoadHistory", "RemoteTelemetry", "for_cluster"]


class RemoteTelemetry:
    """Samples that engines published about themselves, kept as they arrive.

    ``AsyncResult.data`` holds only the latest published dict, so the engine
    publishes its last few samples each time (``window`` in
    :func:`gpucell.engine.telemetry.start`) with sequence numbers, and this keeps a
    bounded per-engine history without duplicates: a poll may be late by
    ``window`` periods (1 s by default) without losing a sample.

    Parameters
    ----------
    targets
        The remote engines (rows before their first sample say ``unknown``).
    history
        Samples kept per engine.
    """

    def __init__(self, targets: Iterable[Any] = (), *, history: int = 1024) -> None:
        self.targets = {t.engine: t for t in map(target_of, targets)}
        self._maxlen = history
        self._history: dict[int, deque[DeviceSample]] = {}
        self._seq: dict[int, int] = {}
        self._lock = threading.Lock()

    def feed(self, data: Mapping[str, Any] | None) -> int:
        """Take what one task's ``ar.data`` holds; return how many samples were new."""
        try:
            msg = data.get(DATA_KEY) if data else None
            if not msg:
                return 0
            new = 0
            with self._lock:
                for d in msg.get("samples", ()):
                    s = DeviceSample.from_dict(d)
                    if s.seq <= self._seq.get(s.engine, -1):
                        continue
                    self._seq[s.engine] = s.seq
                    h = self._history.get(s.engine)
                    if h is None:
                        h = self._history[s.engine] = deque(maxlen=self._maxlen)
                    h.append(s)
                    new += 1
            return new
        except Exception:  # a malformed publication is dropped, never raised
            return 0

    def poll(self, ars: Iterable[Any]) -> int:
        """:meth:`feed` every task's ``ar.data`` (the dispatcher's in-flight set)."""
        new = 0
        for ar in list(ars):
            try:
                data = ar.data
            except Exception:
                continue
            if isinstance(data, Mapping):
                new += self.feed(data)
            elif isinstance(data, list):  # a multi-engine AsyncResult
                new += sum(self.feed(d) for d in data if isinstance(d, Mapping))
        return new

    def history(self, engine: int) -> list[DeviceSample]:
        with self._lock:
            return list(self._history.get(engine, ()))

    def latest(self, engine: int) -> DeviceSample | None:
        with self._lock:
            h = self._history.get(engine)
            return h[-1] if h else None

    def sample(self) -> list[DeviceSample]:
        out = []
        for eid in sorted(set(self.targets) | set(self._history)):
            s = self.latest(eid)
            if s is None:
                t = self.targets[eid]
                s = failed_sample(t, "engine", "no sample from the engine yet", UNKNOWN)
            out.append(s)
        return out


class ClusterTelemetry:
    """Local engines measured by the kernel, remote ones by themselves: one source.

    Build it with :func:`for_cluster`.
    """

    def __init__(
        self,
        gc: GpuCluster | None,
        local: LocalTelemetry,
        remote: RemoteTelemetry,
        *,
        period: float = 0.25,
        window: int = 4,
    ) -> None:
        self.gc = gc
        self.local = local
        self.remote = remote
        self.period = period
        self.window = window

    @property
    def remote_ids(self) -> list[int]:
        return sorted(self.remote.targets)

    def start_remote(self, client: Any = None) -> list[Any]:
        """Queue the engine-side sampler's start on each remote engine; don't wait.

        Idempotent on the engines (a running sampler is only reconfigured), so the
        dispatcher calls it once per cell.  Returns the AsyncResults (ignorable).
        """
        if not self.remote.targets:
            return []
        from gpucell.engine import telemetry as telemetry_engine

        client = client if client is not None else getattr(self.gc, "client", None)
        ars = []
        for t in self.remote.targets.values():
            try:
                ars.append(
                    client[t.engine].apply_async(
                        telemetry_engine.start,
                        engine=t.engine,
                        kind=t.kind,
                        index=t.index,
                        name=t.name,
                        period=self.period,
                        window=self.window,
                    )
                )
            except Exception:  # telemetry never stops a cell
                pass
        return ars

    def poll(self, ars: Iterable[Any]) -> int:
        return self.remote.poll(ars)

    def feed(self, data: Mapping[str, Any] | None) -> int:
        return self.remote.feed(data)

    def close(self) -> None:
        """Release what measuring opened (the kernel's NVML session)."""
        self.local.close()

    def sample(self) -> list[DeviceSample]:
        both = self.local.sample() + self.remote.sample()
        return sorted(both, key=lambda s: s.engine)


def for_cluster(
    gc: GpuCluster,
    engine_ids: Sequence[int] | None = None,
    nvml: NvmlApi | None = None,
    *,
    remote: Iterable[int] = (),
    period: float = 0.25,
    window: int = 4,
) -> ClusterTelemetry:
    """Telemetry for ``engine_ids`` of a cluster (all of its engines by default).

    Engines on this host are measured from the kernel; others publish their own
    samples once :meth:`ClusterTelemetry.start_remote` ran.

    Parameters
    ----------
    nvml
        NVML for the kernel-side GPU samples (a fake in tests).
    remote
        Engine ids to treat as remote even on this host (tests and benchmarks of
        the engine-side path).
    period, window
        Engine-side publishing period (s) and samples per publication.
    """
    ids = list(gc.engines) if engine_ids is None else list(engine_ids)
    force = set(remote)
    local, far = [], []
    for eid in ids:
        info = gc.engines.get(eid)
        if info is None:
            continue
        (local if info.local and eid not in force else far).append(info)
    return ClusterTelemetry(
        gc,
        LocalTelemetry(local, nvml=nvml),
        RemoteTelemetry(far),
        period=period,
        window=window,
    )


class LoadHistory:
    """Each engine's utilisation and memory over the last ``window`` seconds.

    The Lab panel draws it as charts over time (as jupyterlab-nvdashboard does),
    kept across cells.  At most one point per ``period``: ``record`` may be called
    as often as the panel looks (2 Hz), memory stays bounded (``window /
    period + 1`` points per engine; an engine unseen for a whole window is
    dropped).  Pure: callers pass the clock.

    Parameters
    ----------
    window
        Seconds of history kept (5 minutes by default).
    period
        Seconds between two points of one engine.
    """

    def __init__(self, window: float = 300.0, period: float = 1.0) -> None:
        if not (window > 0 and period > 0):
            raise ValueError(
                "LoadHistory needs a positive window and period, "
                f"not {window}, {period}"
            )
        self.window = float(window)
        self.period = float(period)
        self.maxlen = int(window / period) + 1
        # engine -> (time, util %, memory %) points, oldest first
        self._points: dict[int, deque[tuple[float, float | None, float | None]]] = {}
        self._last: float | None = None

    def record(self, now: float, samples: Iterable[DeviceSample]) -> bool:
        """Add a point per sampled engine, unless the last one is under
        ``period`` old (then nothing: the caller looks more often than we keep).
        Returns whether points were added."""
        # 10 % slack: a 2 Hz caller's jitter must not halve the rate
        if self._last is not None and now - self._last < 0.9 * self.period:
            return False
        self._last = now
        for s in samples:
            h = self._points.get(s.engine)
            if h is None:
                h = self._points[s.engine] = deque(maxlen=self.maxlen)
            h.append((now, _util(s), _mem(s)))
        for eid in [e for e, h in self._points.items() if h[-1][0] < now - self.window]:
            del self._points[eid]
        return True

    def view(self) -> dict[str, Any] | None:
        """The history as the state's ``history`` JSON (:mod:`gpucell.protocol.
        panel`), ages in seconds before the last point (so it only changes when
        a point is added), figures rounded to 0.1; ``None`` before any point."""
        last = self._last
        if last is None or not self._points:
            return None
        devices = []
        for eid in sorted(self._points):
            pts = [p for p in self._points[eid] if p[0] >= last - self.window]
            devices.append(
                {
                    "engine": eid,
                    "age": [round(t - last, 1) for t, _, _ in pts],
                    "util": [_round(u) for _, u, _ in pts],
                    "mem": [_round(m) for _, _, m in pts],
                }
            )
        return {"window": self.window, "period": self.period, "devices": devices}

    def __len__(self) -> int:
        """Points held, all engines together."""
        return sum(len(h) for h in self._points.values())


def _util(s: DeviceSample) -> float | None:
    u = s.utilization
    # a CPU engine may use several cores (350 %): the chart's scale is one device
    return None if u is None else min(100.0, max(0.0, float(u)))


def _mem(s: DeviceSample) -> float | None:
    used, total = s.memory_used, s.memory_total
    if used is None or not total:
        return None
    return min(100.0, max(0.0, 100.0 * used / total))


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)
