"""A fake NVML behind gpucell's one NVML interface: the only mock in the suite.

There is no NVIDIA GPU on CI; everything else in the tests is real.
:class:`FakePynvml` puts the same fake GPUs behind ``pynvml``'s functions, for the
tests of :class:`gpucell.devices.nvml.PynvmlApi` itself (when it initialises NVML,
and whether it shuts it down again).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gpucell.devices.nvml import GpuInfo, GpuUsage, NvmlUnavailable


class FakeNvml:
    """Pretends to be NVML on a host with the given GPUs."""

    def __init__(
        self,
        gpus: list[GpuInfo] | None = None,
        *,
        broken: str = "",
        usages: dict[int, GpuUsage] | None = None,
    ) -> None:
        self._gpus = list(gpus or [])
        self._broken = broken
        #: per-index load :meth:`usage` reports; tests may change it between calls
        self.usages: dict[int, GpuUsage] = dict(usages or {})
        self.usage_calls = 0

    def gpus(self) -> list[GpuInfo]:
        if self._broken:
            raise NvmlUnavailable(self._broken)
        return list(self._gpus)

    def usage(self, index: int) -> GpuUsage:
        self.usage_calls += 1
        if self._broken:
            raise NvmlUnavailable(self._broken)
        if index in self.usages:
            return self.usages[index]
        for g in self._gpus:
            if g.index == index:  # idle GPU unless told otherwise
                return GpuUsage(0.0, 0, g.memory_total, 60.0, 35.0)
        raise NvmlUnavailable(f"NVML has no GPU {index}")


def a100s(n: int, cores_per_gpu: int = 0) -> list[GpuInfo]:
    return [
        GpuInfo(
            index=i,
            name="NVIDIA A100-SXM4-80GB",
            uuid=f"GPU-a100-{i}",
            memory_total=80 * 2**30,
            cpu_affinity=tuple(range(i * cores_per_gpu, (i + 1) * cores_per_gpu)),
        )
        for i in range(n)
    ]


class FakePynvml:
    """Stands in for the ``pynvml`` module (``sys.modules["pynvml"]``) over a
    :class:`FakeNvml`'s GPUs, counting what the real NVML counts.

    NVML reference-counts ``nvmlInit``/``nvmlShutdown``; its handles are valid only
    while it is initialised, so a handle from before the count fell to zero fails
    here as it would there.
    """

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, nvml: FakeNvml) -> None:
        self.nvml = nvml
        self.inits = 0
        self.shutdowns = 0
        self.handles = 0  # handles handed out
        self._session = 0  # handles of an earlier session are stale

    @property
    def initialised(self) -> int:
        """``nvmlInit`` calls not yet matched by ``nvmlShutdown`` (0: released)."""
        return self.inits - self.shutdowns

    def _check(self, handle: Any = None) -> None:
        if self.initialised <= 0 or (handle is not None and handle[0] != self._session):
            raise RuntimeError("NVML_ERROR_UNINITIALIZED")

    def nvmlInit(self) -> None:
        if self.initialised == 0:
            self._session += 1
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self._check()
        self.shutdowns += 1

    def _gpu(self, handle: Any) -> GpuInfo:
        self._check(handle)
        return next(g for g in self.nvml.gpus() if g.index == handle[1])

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.nvml.gpus())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[int, int]:
        self._check()
        if all(g.index != index for g in self.nvml.gpus()):
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        self.handles += 1
        return (self._session, index)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetCpuAffinity(self, handle: Any, words: int) -> list[int]:
        mask = [0] * words
        for c in self._gpu(handle).cpu_affinity:
            mask[c // 64] |= 1 << (c % 64)
        return mask

    def _usage(self, handle: Any) -> GpuUsage:
        return self.nvml.usage(self._gpu(handle).index)

    @staticmethod
    def _reported(value: Any) -> Any:
        if value is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return value

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return SimpleNamespace(gpu=self._reported(self._usage(handle).utilization))

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        u = self._usage(handle)
        total = self._gpu(handle).memory_total
        used = self._reported(u.memory_used)
        return SimpleNamespace(used=used, total=u.memory_total or total)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._reported(self._usage(handle).power_w) * 1000)  # mW

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> float:
        return self._reported(self._usage(handle).temperature_c)
