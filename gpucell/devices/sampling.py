"""Measure engines of this host from outside them: psutil on their pids, NVML on
their GPUs (on their MIG slices, where an engine is pinned to one: memory is the
slice's, utilisation unknown, as NVML does not report it per slice).

The kernel uses it for engines on its own host; an engine on another host uses
it on itself (:mod:`gpucell.engine.telemetry`).  Standard library, psutil and
(for GPU engines) pynvml only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gpucell.protocol.telemetry import (
    DEAD,
    ERROR,
    OK,
    DeviceSample,
    Target,
    failed_sample,
    target_of,
)

if TYPE_CHECKING:
    from gpucell.devices.nvml import NvmlApi

__all__ = ["LocalTelemetry"]


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
        samples itself, see :mod:`gpucell.engine.telemetry`).
    """

    def __init__(
        self,
        targets: Iterable[Any],
        *,
        nvml: NvmlApi | None = None,
        source: str = "local",
    ) -> None:
        import psutil

        given = list(targets)
        self.targets = [target_of(t) for t in given]
        # engines on MIG slices: NVML is asked about the slice, not its GPU
        self._mig = {
            t.engine: m
            for t, m in ((target_of(x), _mig_of(x)) for x in given)
            if m and t.kind == "gpu"
        }
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
        self._own_nvml = False
        if nvml is None and any(t.kind == "gpu" for t in self.targets):
            from gpucell.devices.nvml import PynvmlApi

            self._nvml = PynvmlApi()
            self._own_nvml = True
        self._lock = threading.Lock()  # a widget thread and the dispatcher may share

    def close(self) -> None:
        """Release the NVML session this source opened (one passed in is the
        caller's to close)."""
        close = getattr(self._nvml, "close", None)
        if self._own_nvml and close is not None:
            close()

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
            return [failed_sample(t, self._source, why) for t in self.targets]

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
                mig = self._mig.get(t.engine)
                u = self._nvml.mig_usage(mig) if mig else self._nvml.usage(t.index)
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


def _mig_of(obj: Any) -> str:
    """The MIG slice an engine is pinned to (``MIG-...``), or ``""``: from its
    ``cuda_visible_devices`` (the kernel's ``EngineInfo``), else, for this very
    process (an engine measuring itself), from its own environment."""
    import os

    visible = getattr(obj, "cuda_visible_devices", None)
    if visible is None and getattr(obj, "pid", None) == os.getpid():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = (visible or "").split(",")[0].strip()
    return first if first.startswith("MIG-") else ""


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
