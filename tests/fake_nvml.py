"""A fake NVML behind gpucell's one NVML interface: the only mock in the suite.

There is no NVIDIA GPU on CI; everything else in the tests is real.
"""

from __future__ import annotations

from gpucell.devices import GpuInfo, NvmlUnavailable


class FakeNvml:
    """Pretends to be NVML on a host with the given GPUs."""

    def __init__(self, gpus: list[GpuInfo] | None = None, *, broken: str = "") -> None:
        self._gpus = list(gpus or [])
        self._broken = broken

    def gpus(self) -> list[GpuInfo]:
        if self._broken:
            raise NvmlUnavailable(self._broken)
        return list(self._gpus)


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
