"""Find the GPUs of this host, behind one small interface.

Discovery asks NVML first (names, memory, UUIDs, near CPU cores, MIG slices),
then ``torch.cuda``, and falls back to CPU engines.  A GPU in MIG mode is not a
device; each of its MIG slices is (``Device.uuid`` ``MIG-...``, ``index`` its
GPU's).  A missing driver or library is a
fallback, never a crash: a notebook written on a laptop must still run.

NVML is reached only through :class:`gpucell.devices.nvml.NvmlApi`, the seam the
tests replace.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from gpucell.devices.nvml import (
    GpuInfo,
    MigInfo,
    NvmlApi,
    NvmlUnavailable,
    PynvmlApi,
    mig_token_matches,
)
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


def _whole(g: GpuInfo) -> Device:
    return Device(
        kind="gpu",
        index=g.index,
        name=g.name,
        uuid=g.uuid,
        memory_total=g.memory_total,
        cpu_affinity=g.cpu_affinity,
    )


def _slice(g: GpuInfo, m: MigInfo) -> Device:
    """A MIG slice as a device: its GPU's index and near cores, its own name,
    UUID (``MIG-...``: what its engine's ``CUDA_VISIBLE_DEVICES`` will say) and
    memory."""
    return Device(
        kind="gpu",
        index=g.index,
        name=m.name,
        uuid=m.uuid,
        memory_total=m.memory_total,
        cpu_affinity=g.cpu_affinity,
    )


def _in_mig_mode(g: GpuInfo) -> str:
    return (
        f"GPU {g.index} ({g.name}) is in MIG mode: CUDA cannot use it whole, only "
        "its MIG devices"
    )


def _all_devices(infos: list[GpuInfo], notes: list[str]) -> list[Device]:
    """Every device when nothing restricts them: whole GPUs, and the slices of
    GPUs in MIG mode (one without slices is no device)."""
    out: list[Device] = []
    for g in infos:
        if not g.mig_enabled:
            out.append(_whole(g))
        elif g.migs:
            out.extend(_slice(g, m) for m in g.migs)
        else:
            notes.append(_in_mig_mode(g) + ", and none was created")
    return out


def _match(tok: str, infos: list[GpuInfo]) -> tuple[GpuInfo, MigInfo | None] | None:
    """The GPU or MIG slice one ``CUDA_VISIBLE_DEVICES`` entry names: an NVML
    index, ``GPU-<uuid>``, ``MIG-<uuid>`` or ``MIG-GPU-<uuid>/<gi>/<ci>``.  As
    CUDA does, a UUID may be shortened to a prefix that names one device."""
    if tok.isdigit():
        return next(((g, None) for g in infos if g.index == int(tok)), None)
    if tok.startswith("MIG-"):
        slices = [(g, m) for g in infos for m in g.migs]
        hits = [(g, m) for g, m in slices if mig_token_matches(tok, g, m)] or [
            (g, m)
            for g, m in slices
            if not tok.startswith("MIG-GPU-") and m.uuid.startswith(tok)
        ]
        return hits[0] if len(hits) == 1 else None
    if tok.startswith("GPU-"):
        found = [g for g in infos if g.uuid == tok] or [
            g for g in infos if g.uuid.startswith(tok)
        ]
        return (found[0], None) if len(found) == 1 else None
    return None


def _visible(infos: list[GpuInfo], notes: list[str]) -> list[Device]:
    """The devices this process may use: all of them, or those a
    CUDA_VISIBLE_DEVICES set for the kernel names (a Slurm or shared-server
    allocation), in its order.

    Like CUDA, the list ends at its first entry that names no device here.  A
    GPU in MIG mode named whole is no device (its slices are, when named).
    """
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return _all_devices(infos, notes)
    picked: list[Device] = []
    for tok in (t.strip() for t in spec.split(",")):
        if not tok:
            continue
        hit = _match(tok, infos)
        if hit is None:
            notes.append(
                f"CUDA_VISIBLE_DEVICES entry {tok!r} names no GPU or MIG device "
                "here; CUDA ignores it and every entry after it"
            )
            break
        g, m = hit
        if m is None and g.mig_enabled:
            notes.append(
                _in_mig_mode(g) + " (name them, MIG-..., in CUDA_VISIBLE_DEVICES)"
            )
            continue
        dev = _whole(g) if m is None else _slice(g, m)
        if dev not in picked:
            picked.append(dev)
    return picked


def discover(nvml: NvmlApi | None = None) -> Discovery:
    """Find this host's GPUs (and MIG slices); never raises.

    Parameters
    ----------
    nvml
        The NVML implementation; the real one by default, a fake in tests.
    """
    notes: list[str] = []
    api = nvml if nvml is not None else PynvmlApi()
    try:
        gpus = _visible(api.gpus(), notes)
        source = "nvml"
    except NvmlUnavailable as e:
        notes.append(str(e))
        gpus = [_whole(g) for g in (_torch_gpus() if nvml is None else [])]
        source = "torch" if gpus else "none"
    if not gpus:
        source = "none"
    return Discovery(gpus=tuple(gpus), source=source, notes=tuple(notes))


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
