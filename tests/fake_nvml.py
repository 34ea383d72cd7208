"""A fake NVML behind gpucell's one NVML interface: the only mock in the suite.

There is no NVIDIA GPU on CI; everything else in the tests is real.
:func:`a100_mig` models a GPU in MIG mode (its slices, their UUIDs, memory and
GPU/compute instance ids), which both fakes serve as NVML would.
:class:`FakePynvml` puts the same fake GPUs behind ``pynvml``'s functions, for the
tests of :class:`gpucell.devices.nvml.PynvmlApi` itself (when it initialises NVML,
and whether it shuts it down again).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from gpucell.devices.nvml import (
    GpuInfo,
    GpuUsage,
    MigInfo,
    NvmlUnavailable,
    mig_token_matches,
)


class FakeNvml:
    """Pretends to be NVML on a host with the given GPUs."""

    def __init__(
        self,
        gpus: list[GpuInfo] | None = None,
        *,
        broken: str = "",
        usages: dict[int, GpuUsage] | None = None,
        mig_usages: dict[str, GpuUsage] | None = None,
    ) -> None:
        self._gpus = list(gpus or [])
        self._broken = broken
        #: per-index load :meth:`usage` reports; tests may change it between calls
        self.usages: dict[int, GpuUsage] = dict(usages or {})
        #: per-MIG-UUID load :meth:`mig_usage` reports
        self.mig_usages: dict[str, GpuUsage] = dict(mig_usages or {})
        self.usage_calls = 0
        self.mig_usage_calls: list[str] = []

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
                util = None if g.mig_enabled else 0.0  # in MIG mode: not reported
                return GpuUsage(util, 0, g.memory_total, 60.0, 35.0)
        raise NvmlUnavailable(f"NVML has no GPU {index}")

    def mig_usage(self, uuid: str) -> GpuUsage:
        self.mig_usage_calls.append(uuid)
        if self._broken:
            raise NvmlUnavailable(self._broken)
        for g in self._gpus:
            for m in g.migs:
                if mig_token_matches(uuid, g, m):
                    if m.uuid in self.mig_usages:
                        return self.mig_usages[m.uuid]
                    # as NVML: no utilisation or power per slice
                    return GpuUsage(None, 0, m.memory_total, None, 35.0)
        raise NvmlUnavailable(f"NVML has no MIG device {uuid}")


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


#: A100-80GB MIG profiles: name -> (memory, GPU instance slices)
A100_80_PROFILES = {"1g.10gb": 10, "2g.20gb": 20, "3g.40gb": 40, "7g.80gb": 80}


def a100_mig(
    index: int,
    profiles: list[str],
    cores_per_gpu: int = 0,
    *,
    slots: Sequence[int] = (),
) -> GpuInfo:
    """An A100-80GB in MIG mode with one slice per entry of ``profiles``
    (``[]``: MIG mode with no slice created).  Slice ``k``'s UUID is
    ``MIG-a100-<index>-<k>``, its GPU instance ``k + 1``, compute instance 0;
    ``slots``: NVML's MIG device indices (default 0, 1, ...; gaps are empty
    slots, as after a slice was destroyed)."""
    slots = list(slots) or list(range(len(profiles)))
    return GpuInfo(
        index=index,
        name="NVIDIA A100-SXM4-80GB",
        uuid=f"GPU-a100-{index}",
        memory_total=80 * 2**30,
        cpu_affinity=tuple(range(index * cores_per_gpu, (index + 1) * cores_per_gpu)),
        mig_enabled=True,
        migs=tuple(
            MigInfo(
                slot=slot,
                name=f"NVIDIA A100-SXM4-80GB MIG {p}",
                uuid=f"MIG-a100-{index}-{k}",
                memory_total=A100_80_PROFILES[p] * 2**30,
                gpu_instance=k + 1,
                compute_instance=0,
            )
            for k, (p, slot) in enumerate(zip(profiles, slots, strict=True))
        ),
    )


class FakePynvml:
    """Stands in for the ``pynvml`` module (``sys.modules["pynvml"]``) over a
    :class:`FakeNvml`'s GPUs, counting what the real NVML counts.

    NVML reference-counts ``nvmlInit``/``nvmlShutdown``; its handles are valid only
    while it is initialised, so a handle from before the count fell to zero fails
    here as it would there.
    """

    NVML_TEMPERATURE_GPU = 0
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    MAX_MIG_DEVICES = 7  # an A100's

    def __init__(self, nvml: FakeNvml) -> None:
        self.nvml = nvml
        self.inits = 0
        self.shutdowns = 0
        self.handles = 0  # handles handed out
        self.mig_handles = 0  # MIG device handles handed out
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
        """The GPU of a handle (of its parent, for a MIG device's handle)."""
        self._check(handle)
        return next(g for g in self.nvml.gpus() if g.index == handle[1])

    @staticmethod
    def _is_mig(handle: Any) -> bool:
        return len(handle) == 3  # (session, GPU index, MIG slot)

    def _mig(self, handle: Any) -> MigInfo:
        return next(m for m in self._gpu(handle).migs if m.slot == handle[2])

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
        if self._is_mig(handle):  # this driver: the profile only, "MIG 1g.10gb"
            return "MIG " + self._mig(handle).name.rsplit(" MIG ", 1)[-1]
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if self._is_mig(handle):
            return self._mig(handle).uuid
        return self._gpu(handle).uuid

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        if self._is_mig(handle):
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        mode = int(self._gpu(handle).mig_enabled)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return self.MAX_MIG_DEVICES if self._gpu(handle).mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, k: int) -> Any:
        g = self._gpu(handle)
        if not g.mig_enabled:
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        if all(m.slot != k for m in g.migs):
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        self.mig_handles += 1
        return (handle[0], handle[1], k)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._mig(handle).gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._mig(handle).compute_instance

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
        if self._is_mig(handle) or self._gpu(handle).mig_enabled:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")  # as on a real A100
        return SimpleNamespace(gpu=self._reported(self._usage(handle).utilization))

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        if self._is_mig(handle):
            m = self._mig(handle)
            u = self.nvml.mig_usage(m.uuid)
            return SimpleNamespace(
                used=self._reported(u.memory_used), total=m.memory_total
            )
        u = self._usage(handle)
        total = self._gpu(handle).memory_total
        used = self._reported(u.memory_used)
        return SimpleNamespace(used=used, total=u.memory_total or total)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        if self._is_mig(handle):
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return int(self._reported(self._usage(handle).power_w) * 1000)  # mW

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> float:
        if self._is_mig(handle):
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return self._reported(self._usage(handle).temperature_c)
