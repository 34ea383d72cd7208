"""Find the GPUs of this host, behind one small interface.

Discovery asks NVML first (names, memory, UUIDs, near CPU cores), then
``torch.cuda``, and falls back to CPU engines.  A missing driver or library is a
fallback, never a crash: a notebook written on a laptop must still run.

NVML is reached only through :class:`gpucell.devices.nvml.NvmlApi`, the seam the
tests replace.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from gpucell.devices.nvml import GpuInfo, NvmlApi, NvmlUnavailable, PynvmlApi
from gpucell.protocol.devices import Device

__all__ = ["Discovery", "cpu_device", "discover"]


@dataclass(frozen=True)
class Discovery:
    """The result of discovery: the GPUs found, where from, and why not if none."""

    gpus: tuple[Device, ...]
    source: str  # "nvml", "torch" or "none"
    notes: tuple[str, ...] = field(default=())


def _torch_gpus() -> list[GpuInfo]:
    """GPUs as torch sees them: the fallback when NVML is unavailable.

    torch costs seconds to import, so it is asked only when it is already imported
    in this process or an NVIDIA driver node exists; on a CPU-only host neither holds
    and cluster start-up stays fast.
    """
    if "torch" not in sys.modules and not os.path.exists("/dev/nvidia0"):
        return []
    try:
        import torch
    except ImportError:
        return []
    try:
        if not torch.cuda.is_available():
            return []
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append(
                GpuInfo(
                    index=i,
                    name=p.name,
                    uuid=str(getattr(p, "uuid", "")),
                    memory_total=int(p.total_memory),
                )
            )
        return out
    except Exception:
        return []


def _visible_filter(infos: list[GpuInfo]) -> list[GpuInfo]:
    """Honour a CUDA_VISIBLE_DEVICES the user set for the kernel (indices or UUIDs)."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return infos
    picked = []
    for tok in (t.strip() for t in spec.split(",")):
        if not tok:
            continue
        for info in infos:
            if tok == str(info.index) or (tok.startswith("GPU-") and info.uuid == tok):
                picked.append(info)
                break
        else:
            break  # CUDA stops at the first invalid entry
    return picked


def discover(nvml: NvmlApi | None = None) -> Discovery:
    """Find this host's GPUs; never raises.

    Parameters
    ----------
    nvml
        The NVML implementation; the real one by default, a fake in tests.
    """
    notes: list[str] = []
    api = nvml if nvml is not None else PynvmlApi()
    try:
        infos = _visible_filter(api.gpus())
        source = "nvml"
    except NvmlUnavailable as e:
        notes.append(str(e))
        infos = _torch_gpus() if nvml is None else []
        source = "torch" if infos else "none"
    if not infos:
        source = "none"
    gpus = tuple(
        Device(
            kind="gpu",
            index=i.index,
            name=i.name,
            uuid=i.uuid,
            memory_total=i.memory_total,
            cpu_affinity=i.cpu_affinity,
        )
        for i in infos
    )
    return Discovery(gpus=gpus, source=source, notes=tuple(notes))


def cpu_device() -> Device:
    """The CPU as a device, named after the host's processor where we can tell."""
    name = "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    return Device(kind="cpu", index=-1, name=name, memory_total=mem)
