"""NVML behind one small interface: the only seam the tests replace.

There is no GPU on CI, so :class:`NvmlApi` is what ``tests/fake_nvml.py``
implements; the real implementation, :class:`PynvmlApi`, is a thin wrapper of
``pynvml``.  Discovery (kernel and engines) and telemetry both go through it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["GpuInfo", "GpuUsage", "NvmlApi", "NvmlUnavailable", "PynvmlApi"]


class NvmlUnavailable(RuntimeError):
    """NVML could not be loaded or initialised (no driver, no library)."""


@dataclass(frozen=True)
class GpuInfo:
    """What NVML reports about one GPU."""

    index: int
    name: str
    uuid: str
    memory_total: int  # bytes
    cpu_affinity: tuple[int, ...] = ()  # the GPU's near cores; () when unknown


@dataclass(frozen=True)
class GpuUsage:
    """One GPU's load right now, as NVML reports it (telemetry).

    A field is ``None`` when this GPU or driver does not report it (power on some
    consumer boards, temperature in some VMs): unknown is not zero.
    """

    utilization: float | None  # % of time a kernel ran in the last sample period
    memory_used: int | None  # bytes
    memory_total: int | None  # bytes
    power_w: float | None
    temperature_c: float | None


class NvmlApi(Protocol):
    """The part of NVML gpucell uses.  Real: :class:`PynvmlApi`; tests: a fake."""

    def gpus(self) -> list[GpuInfo]:
        """Every GPU NVML sees, or raise :class:`NvmlUnavailable`."""
        ...

    def usage(self, index: int) -> GpuUsage:
        """Load of GPU ``index`` (NVML's host index, not the CUDA one) now.

        Raise :class:`NvmlUnavailable` when NVML cannot answer at all; a metric
        this GPU does not report is ``None`` in the result instead.
        """
        ...


def _mask_to_cores(words: Sequence[int], bits_per_word: int = 64) -> tuple[int, ...]:
    """Decode NVML's CPU affinity bitmask (array of unsigned longs) to core ids."""
    cores = []
    for w, word in enumerate(words):
        for b in range(bits_per_word):
            if word >> b & 1:
                cores.append(w * bits_per_word + b)
    return tuple(cores)


class PynvmlApi:
    """NVML through ``pynvml`` (the ``nvidia-ml-py`` package), imported on use.

    :meth:`gpus` initialises and shuts NVML down around one discovery.  :meth:`usage`
    is called several times a second by telemetry, so it initialises NVML once,
    keeps the device handles, and holds NVML until :meth:`close` (NVML counts its
    initialisations, so the two uses do not disturb each other).  A failed
    initialisation is remembered for ``retry_after`` seconds rather than retried on
    every sample.
    """

    retry_after: float = 10.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nvml: Any = None  # the pynvml module once initialised
        self._handles: dict[int, Any] = {}
        self._failed: tuple[float, str] | None = None

    def _init(self) -> Any:
        """NVML initialised once (or :class:`NvmlUnavailable`, cached a while)."""
        if self._nvml is not None:
            return self._nvml
        now = time.monotonic()
        if self._failed is not None and now - self._failed[0] < self.retry_after:
            raise NvmlUnavailable(self._failed[1])
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, ...
            msg = f"NVML unavailable: {e}"
            self._failed = (now, msg)
            raise NvmlUnavailable(msg) from e
        self._failed = None
        self._nvml = pynvml
        return pynvml

    def usage(self, index: int) -> GpuUsage:
        with self._lock:  # handles are shared; NVML itself is thread-safe
            nv = self._init()
            h = self._handles.get(index)
            if h is None:
                try:
                    h = nv.nvmlDeviceGetHandleByIndex(index)
                except Exception as e:
                    raise NvmlUnavailable(f"NVML has no GPU {index}: {e}") from e
                self._handles[index] = h

        def ask(f: Any, *args: Any) -> Any:  # one unsupported metric hides no other
            try:
                return f(h, *args)
            except Exception:
                return None

        util = ask(nv.nvmlDeviceGetUtilizationRates)
        mem = ask(nv.nvmlDeviceGetMemoryInfo)
        power = ask(nv.nvmlDeviceGetPowerUsage)
        temp = ask(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        return GpuUsage(
            utilization=float(util.gpu) if util is not None else None,
            memory_used=int(mem.used) if mem is not None else None,
            memory_total=int(mem.total) if mem is not None else None,
            power_w=power / 1000.0 if power is not None else None,  # mW
            temperature_c=float(temp) if temp is not None else None,
        )

    def close(self) -> None:
        """Release NVML if :meth:`usage` initialised it."""
        with self._lock:
            if self._nvml is not None:
                try:
                    self._nvml.nvmlShutdown()
                except Exception:
                    pass
            self._nvml = None
            self._handles.clear()

    def gpus(self) -> list[GpuInfo]:
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - it is a dependency
            raise NvmlUnavailable(f"pynvml is not installed ({e})") from e
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise NvmlUnavailable(f"NVML unavailable: {e}") from e
        try:
            infos = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                uuid = pynvml.nvmlDeviceGetUUID(h)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
                try:
                    words = (os.cpu_count() or 64) // 64 + 1
                    mask = pynvml.nvmlDeviceGetCpuAffinity(h, words)
                    affinity = _mask_to_cores(list(mask))
                except Exception:
                    affinity = ()
                infos.append(
                    GpuInfo(
                        index=i,
                        name=name.decode() if isinstance(name, bytes) else str(name),
                        uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                        memory_total=int(mem),
                        cpu_affinity=affinity,
                    )
                )
            return infos
        except Exception as e:
            raise NvmlUnavailable(f"NVML query failed: {e}") from e
        finally:
            try:
                pynvml.nvmlShutdown()
            except Exception:
                pass
