"""A fake NVML behind gpucell's one NVML interface: the only mock in the suite.

There is no NVIDIA GPU on CI; everything else in the tests is real.
"""

from __future__ import annotations

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
