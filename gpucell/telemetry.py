"""Engine telemetry behind one interface: what each engine's device is doing now.

Every source implements :class:`TelemetrySource` (``sample() -> list[DeviceSample]``);
the widget, the text display and the Lab extension read only :class:`DeviceSample`
or its JSON form, never NVML or psutil.  Telemetry observes: it never blocks, slows
or fails the loop, so every ``sample()`` returns samples (saying ``state="error"``
or ``"dead"`` and ``None`` metrics when it cannot measure) instead of raising.

Two ways a sample is taken, chosen per engine by :func:`for_cluster`:

* **Local engines** (same host as the kernel, the common case) are measured from the
  kernel, without touching the engine: psutil on the engine's pid and NVML on its
  GPU (:class:`LocalTelemetry`).  The engines pay nothing, and the samples are as
  fresh as the caller wants them.
* **Remote engines** measure themselves in a sampler thread
  (:mod:`gpucell.telemetry_engine`) that publishes with ipyparallel's
  ``publish_data`` while a task runs, so samples arrive in the running task's
  ``AsyncResult.data``; :class:`RemoteTelemetry` collects them as the dispatcher
  polls its in-flight tasks.

How the dispatcher uses it (``gpucell/dispatch.py``, :func:`run_chunks`)::

    tele = telemetry.for_cluster(gc, alive)   # once per cell, before load_ars
    tele.start_remote()                       # no-op without remote engines
    ...                                       # in the wait loop, every ~50 ms:
    tele.poll(inflight)                       # keys of inflight are AsyncResults
    ...                                       # in report(), at 2-4 Hz:
    samples = tele.sample()                   # list[DeviceSample], never raises

``start_remote`` queues one tiny task per remote engine ahead of its chunks and
does not wait for it; ``poll`` only reads ``ar.data`` (cost: a few µs per task).

The JSON form (:meth:`DeviceSample.to_dict`; ``to_json`` is its ``json.dumps``),
one object per engine and sample, what the Lab extension reads::

    {"v": 1,                      # schema version
     "engine": 0,                 # ipyparallel engine id
     "host": "node1", "pid": 4242,
     "kind": "gpu",               # "gpu" or "cpu"
     "index": 0,                  # GPU index on its host (NVML's); -1 for a CPU
     "name": "NVIDIA A100-SXM4-80GB",
     "timestamp": 1718000000.25,  # Unix time on the measuring host
     "utilization": 97.0,         # %: GPU busy for GPU engines; the engine
                                  #   process's CPU% (of one core, may exceed
                                  #   100 with threads) for CPU engines
     "memory_used": 123456789,    # bytes: GPU memory used; process RSS for CPU
     "memory_total": 85899345920, # bytes: GPU memory; host memory for CPU
     "power_w": 301.5,            # GPU board power; null for CPU or unknown
     "temperature_c": 61.0,       # GPU temperature; null for CPU or unknown
     "process_cpu": 99.0,         # engine process CPU% (both kinds)
     "process_rss": 2147483648,   # engine process RSS bytes (both kinds)
     "host_cpu": 55.0,            # % of all the host's cores busy
     "state": "ok",               # ok | dead | error | unknown
     "error": "",                 # why a metric is missing, when one is
     "source": "local",           # local: measured by the kernel; engine:
                                  #   published by the engine itself
     "seq": 0}                    # per-engine sequence of engine-published samples

Unknown keys are ignored and missing ones default, so readers and writers of
neighbouring versions agree.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .cluster import GpuCluster
    from .devices import NvmlApi

__all__ = [
    "DATA_KEY",
    "SCHEMA",
    "ClusterTelemetry",
    "DeviceSample",
    "LocalTelemetry",
    "RemoteTelemetry",
    "Target",
    "TelemetrySource",
    "for_cluster",
]

#: version of the JSON form
SCHEMA = 1
#: the key engine samples are published under in ``AsyncResult.data``
DATA_KEY = "gpucell_telemetry"

OK, DEAD, ERROR, UNKNOWN = "ok", "dead", "error", "unknown"


@dataclass(frozen=True)
class DeviceSample:
    """One engine's device at one moment; see the module docstring for the JSON.

    Metrics are ``None`` when unknown (a dead engine, NVML missing, a metric the
    GPU does not report): a display must show "unknown", never a made-up zero.
    """

    engine: int
    host: str
    kind: str  # "gpu" or "cpu"
    index: int  # GPU index on its host; -1 for the CPU
    name: str
    timestamp: float  # time.time() on the measuring host
    utilization: float | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    process_cpu: float | None = None
    process_rss: int | None = None
    host_cpu: float | None = None
    pid: int = 0
    state: str = OK
    error: str = ""
    source: str = "local"
    seq: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready object (plain ints, floats, strings and nulls)."""
        # not dataclasses.asdict: it deep-copies, 10x slower for flat fields
        d = {name: getattr(self, name) for name in _FIELDS}
        d["v"] = SCHEMA
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceSample:
        """Inverse of :meth:`to_dict`; unknown keys ignored, missing ones default."""
        return cls(**{k: v for k, v in d.items() if k in _FIELD_SET})

    @classmethod
    def from_json(cls, text: str | bytes) -> DeviceSample:
        return cls.from_dict(json.loads(text))


_FIELDS = tuple(f.name for f in fields(DeviceSample))
_FIELD_SET = frozenset(_FIELDS)


class TelemetrySource(Protocol):
    """Anything that can say what the engines' devices are doing now."""

    def sample(self) -> list[DeviceSample]:
        """One sample per engine, in engine order; never raises."""
        ...


@dataclass(frozen=True)
class Target:
    """What a sampler needs to know about an engine (see :func:`target_of`)."""

    engine: int
    pid: int
    host: str = ""
    kind: str = "cpu"
    index: int = -1
    name: str = "CPU"


def target_of(obj: Any) -> Target:
    """A :class:`Target` from an ``EngineInfo``, ``EngineProgress`` or ``Target``.

    Both engine records carry pid, host, kind, index and name; they differ only in
    what they call the engine id (``id`` or ``engine``).
    """
    if isinstance(obj, Target):
        return obj
    eid = obj.id if hasattr(obj, "id") else obj.engine
    return Target(
        engine=int(eid),
        pid=int(obj.pid),
        host=str(obj.host),
        kind=str(obj.kind),
        index=int(obj.index),
        name=str(obj.name),
    )


class _HostCpu:
    """Host CPU% from our own ``cpu_times`` baseline.

    ``psutil.cpu_percent(None)`` keeps one module-wide baseline that any other
    caller in the kernel would reset; this keeps ours private.
    """

    def __init__(self) -> None:
        self._last: Any = None
        self._value: float | None = None
        self.percent()

    def percent(self) -> float | None:
        import psutil

        try:
            t = psutil.cpu_times()
        except Exception:
            return None
        last = self._last
        if last is None:
            self._last = t
            return None
        total = sum(t) - sum(last)
        if total <= 0:  # within one clock tick: keep the last value and baseline
            return self._value
        self._last = t
        idle = (t.idle + getattr(t, "iowait", 0.0)) - (
            last.idle + getattr(last, "iowait", 0.0)
        )
        self._value = round(max(0.0, min(100.0, 100.0 * (1.0 - idle / total))), 1)
        return self._value


class LocalTelemetry:
    """Samples engines of this host from outside them: psutil on their pids, NVML
    on their GPUs.

    CPU% is measured since the previous sample, so the ``psutil.Process`` objects
    and their baselines are kept and primed here: the first :meth:`sample` already
    averages over the time since construction.

    Parameters
    ----------
    targets
        ``EngineInfo``, ``EngineProgress`` or :class:`Target` records.
    nvml
        NVML for GPU engines; the real one (created only if a GPU engine is among
        the targets, so CPU clusters never load pynvml), a fake in tests.
    source
        What the samples' ``source`` field says (``"engine"`` when an engine
        samples itself, see :mod:`gpucell.telemetry_engine`).
    """

    def __init__(
        self,
        targets: Iterable[Any],
        *,
        nvml: NvmlApi | None = None,
        source: str = "local",
    ) -> None:
        import psutil

        self.targets = [target_of(t) for t in targets]
        self._source = source
        self._procs: dict[int, Any] = {}
        self._gone: dict[int, str] = {}
        self._last: dict[int, tuple[float, float]] = {}  # CPU% baselines
        for t in self.targets:
            try:
                p = psutil.Process(t.pid)
                self._procs[t.engine] = p
                self._process(t.engine, p)  # prime the baseline
            except Exception as e:
                self._gone[t.engine] = _why(e, t.pid)
        self._host = _HostCpu()
        try:
            self._host_mem: int | None = int(psutil.virtual_memory().total)
        except Exception:
            self._host_mem = None
        self._nvml = nvml
        if nvml is None and any(t.kind == "gpu" for t in self.targets):
            from .devices import PynvmlApi

            self._nvml = PynvmlApi()
        self._lock = threading.Lock()  # a widget thread and the dispatcher may share

    def prime(self) -> None:
        """Restart the CPU% baselines now (the next sample averages from here)."""
        with self._lock:
            self._host.percent()
            for eid, p in list(self._procs.items()):
                try:
                    self._process(eid, p)
                except Exception:
                    pass

    def sample(self) -> list[DeviceSample]:
        try:
            with self._lock:
                now = time.time()
                host_cpu = self._host.percent()
                return [self._one(t, now, host_cpu) for t in self.targets]
        except Exception as e:  # pragma: no cover - defence in depth
            why = f"telemetry failed: {e!r}"
            return [_failed(t, self._source, why) for t in self.targets]

    def _one(self, t: Target, now: float, host_cpu: float | None) -> DeviceSample:
        # one constructor call, no dataclasses.replace: this runs 4x a second per
        # engine, and on a slow /proc every microsecond saved here is the loop's
        cpu: float | None = None
        rss: int | None = None
        state, errors = OK, []
        p = self._procs.get(t.engine)
        if p is None:
            state = DEAD
            errors.append(self._gone.get(t.engine, f"no process {t.pid}"))
        else:
            try:
                cpu, rss = self._process(t.engine, p)
                if rss == 0:  # a zombie: exited, not yet reaped
                    state, cpu, rss = DEAD, None, None
                    errors.append(f"process {t.pid} exited")
            except Exception as e:
                state = DEAD if _is_gone(e) else ERROR
                errors.append(_why(e, t.pid))
                if state == DEAD:
                    self._procs.pop(t.engine, None)
                    self._gone[t.engine] = errors[-1]
        kw: dict[str, Any] = {}
        if t.kind == "gpu":
            try:
                if self._nvml is None:  # pragma: no cover - set in __init__
                    raise RuntimeError("no NVML")
                u = self._nvml.usage(t.index)
                kw = {
                    "utilization": u.utilization,
                    "memory_used": u.memory_used,
                    "memory_total": u.memory_total,
                    "power_w": u.power_w,
                    "temperature_c": u.temperature_c,
                }
            except Exception as e:
                if state == OK:
                    state = ERROR
                errors.append(str(e) or repr(e))
        else:
            kw = {
                "utilization": cpu,
                "memory_used": rss,
                "memory_total": self._host_mem,
            }
        return DeviceSample(
            engine=t.engine,
            host=t.host,
            kind=t.kind,
            index=t.index,
            name=t.name,
            timestamp=now,
            process_cpu=cpu,
            process_rss=rss,
            host_cpu=host_cpu,
            pid=t.pid,
            state=state,
            error="; ".join(errors),
            source=self._source,
            **kw,
        )

    def _process(self, engine: int, p: Any) -> tuple[float | None, int]:
        """CPU% since the previous call (of one core, like ``top``) and RSS.

        Computed from ``cpu_times`` and our own clock rather than
        ``Process.cpu_percent``, which also asks for the CPU count on every call.
        """
        with p.oneshot():
            c = p.cpu_times()
            rss = int(p.memory_info().rss)
        busy, now = c.user + c.system, time.monotonic()
        last = self._last.get(engine)
        self._last[engine] = (busy, now)
        if last is None or now <= last[1]:
            return None, rss
        return round(max(0.0, 100.0 * (busy - last[0]) / (now - last[1])), 1), rss


def _is_gone(e: BaseException) -> bool:
    try:
        import psutil

        return isinstance(e, psutil.NoSuchProcess)  # ZombieProcess included
    except Exception:  # pragma: no cover
        return False


def _why(e: BaseException, pid: int) -> str:
    if _is_gone(e):
        return f"process {pid} is gone"
    return f"cannot read process {pid}: {type(e).__name__}: {e}"


def _failed(t: Target, source: str, error: str, state: str = ERROR) -> DeviceSample:
    return DeviceSample(
        engine=t.engine,
        host=t.host,
        kind=t.kind,
        index=t.index,
        name=t.name,
        timestamp=time.time(),
        pid=t.pid,
        state=state,
        error=error,
        source=source,
    )


class RemoteTelemetry:
    """Samples that engines published about themselves, kept as they arrive.

    ``AsyncResult.data`` holds only the latest published dict, so the engine
    publishes its last few samples each time (``window`` in
    :func:`gpucell.telemetry_engine.start`) with sequence numbers, and this keeps a
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
                s = _failed(t, "engine", "no sample from the engine yet", UNKNOWN)
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
        from . import telemetry_engine

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
    here = socket.gethostname()
    ids = list(gc.engines) if engine_ids is None else list(engine_ids)
    force = set(remote)
    local, far = [], []
    for eid in ids:
        info = gc.engines.get(eid)
        if info is None:
            continue
        (far if info.host != here or eid in force else local).append(info)
    return ClusterTelemetry(
        gc,
        LocalTelemetry(local, nvml=nvml),
        RemoteTelemetry(far),
        period=period,
        window=window,
    )
