"""What telemetry says about a device, defined once for every reader and writer.

The kernel measures local engines, engines on other hosts measure themselves, and
the widget, the text display and the Lab extension read the result: all of them
exchange :class:`DeviceSample` or its JSON form, never NVML or psutil.

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
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol

__all__ = [
    "DATA_KEY",
    "DEAD",
    "ERROR",
    "OK",
    "SCHEMA",
    "UNKNOWN",
    "DeviceSample",
    "Target",
    "TelemetrySource",
    "failed_sample",
    "target_of",
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


def failed_sample(
    t: Target, source: str, error: str, state: str = ERROR
) -> DeviceSample:
    """A sample that says why nothing could be measured (metrics unknown)."""
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
