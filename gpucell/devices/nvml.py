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

__all__ = [
    "GpuInfo",
    "GpuUsage",
    "MigInfo",
    "NvmlApi",
    "NvmlUnavailable",
    "PynvmlApi",
    "mig_token_matches",
]


class NvmlUnavailable(RuntimeError):
    """NVML could not be loaded or initialised (no driver, no library)."""


@dataclass(frozen=True)
class MigInfo:
    """One MIG device (a slice: a GPU instance's compute instance) of a GPU in
    MIG mode, as NVML reports it through the slice's own handle."""

    slot: int  # NVML's MIG device index on its GPU (GetMigDeviceHandleByIndex)
    name: str  # "NVIDIA A100-SXM4-80GB MIG 1g.10gb": the GPU's name and the profile
    uuid: str  # "MIG-<uuid>" (R470+ drivers); CUDA_VISIBLE_DEVICES names it so
    memory_total: int  # bytes: the slice's own memory
    gpu_instance: int = -1  # GI id, for the old "MIG-GPU-<uuid>/<gi>/<ci>" names
    compute_instance: int = -1  # CI id


@dataclass(frozen=True)
class GpuInfo:
    """What NVML reports about one GPU.

    A GPU in MIG mode (``mig_enabled``) cannot run CUDA work as a whole: only its
    slices (``migs``, empty when none were created) are devices.
    """

    index: int
    name: str
    uuid: str
    memory_total: int  # bytes
    cpu_affinity: tuple[int, ...] = ()  # the GPU's near cores; () when unknown
    mig_enabled: bool = False
    migs: tuple[MigInfo, ...] = ()


def mig_token_matches(token: str, gpu: GpuInfo, mig: MigInfo) -> bool:
    """Does ``token`` (one ``CUDA_VISIBLE_DEVICES`` entry) name slice ``mig`` of
    ``gpu``?  Either ``MIG-<uuid>`` (the slice's own UUID, R470+ drivers) or the
    older ``MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>`` (R450)."""
    if not token.startswith("MIG-"):
        return False
    if token == mig.uuid:
        return True
    if token.startswith("MIG-GPU-"):
        parent, _, rest = token[len("MIG-") :].partition("/")
        gi, _, ci = rest.partition("/")
        return (
            parent == gpu.uuid
            and gi.isdigit()
            and ci.isdigit()
            and (int(gi), int(ci)) == (mig.gpu_instance, mig.compute_instance)
        )
    return False


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

    def mig_usage(self, uuid: str) -> GpuUsage:
        """Load of the MIG slice ``uuid`` (either form :func:`mig_token_matches`
        reads).  NVML reports no utilisation per slice (``None``, never 0) nor
        power (the board's is shared by every slice: ``None``); memory is the
        slice's own; temperature the GPU's.  Raise :class:`NvmlUnavailable` when
        NVML cannot answer or has no such slice.
        """
        ...


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _mig_name(gpu_name: str, mig_name: str) -> str:
    """``NVIDIA A100-SXM4-80GB MIG 1g.10gb`` whatever the driver returns for the
    slice's handle (the full name, ``MIG 1g.10gb`` or only ``1g.10gb``)."""
    mig_name = mig_name.strip()
    if mig_name.startswith(gpu_name):
        return mig_name
    if not mig_name.startswith("MIG"):
        mig_name = f"MIG {mig_name}"
    return f"{gpu_name} {mig_name}".strip()


def _mig_enabled(nv: Any, handle: Any) -> bool:
    """Is the GPU in MIG mode now (its current mode, not a pending one)?  GPUs
    without MIG (before Ampere, consumer boards) answer NOT_SUPPORTED: no."""
    try:
        current = nv.nvmlDeviceGetMigMode(handle)[0]
    except Exception:
        return False
    return bool(current == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1))


def _mig_handles(nv: Any, handle: Any) -> list[tuple[int, Any]]:
    """(slot, handle) of each MIG device that exists on a GPU in MIG mode (an
    empty slot answers NOT_FOUND and is skipped)."""
    try:
        count = int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))
    except Exception:
        return []
    out = []
    for k in range(count):
        try:
            out.append((k, nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)))
        except Exception:
            continue
    return out


def _mig_info(nv: Any, slot: int, handle: Any, gpu_name: str) -> MigInfo:
    def opt(f: Any) -> int:
        try:
            return int(f(handle))
        except Exception:
            return -1

    return MigInfo(
        slot=slot,
        name=_mig_name(gpu_name, _text(nv.nvmlDeviceGetName(handle))),
        uuid=_text(nv.nvmlDeviceGetUUID(handle)),
        memory_total=int(nv.nvmlDeviceGetMemoryInfo(handle).total),
        gpu_instance=opt(nv.nvmlDeviceGetGpuInstanceId),
        compute_instance=opt(nv.nvmlDeviceGetComputeInstanceId),
    )


def _migs(nv: Any, handle: Any, gpu_name: str) -> tuple[MigInfo, ...]:
    """The slices of a GPU in MIG mode; one NVML cannot describe is left out
    (it is no device gpucell could name)."""
    out = []
    for k, m in _mig_handles(nv, handle):
        try:
            out.append(_mig_info(nv, k, m, gpu_name))
        except Exception:
            continue
    return tuple(out)


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
        self._mig_handles: dict[str, tuple[Any, Any]] = {}  # uuid -> (slice, GPU)
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

    def _find_mig(self, nv: Any, uuid: str) -> tuple[Any, Any]:
        """(slice handle, its GPU's handle) of MIG device ``uuid``: the GPUs in
        MIG mode are walked once per slice asked for, then the handles kept."""
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            if not _mig_enabled(nv, h):
                continue
            gpu = GpuInfo(i, "", _text(nv.nvmlDeviceGetUUID(h)), 0)
            for _, m in _mig_handles(nv, h):
                try:
                    info = _mig_info(nv, -1, m, "")
                except Exception:
                    continue
                if mig_token_matches(uuid, gpu, info):
                    return m, h
        raise NvmlUnavailable(f"NVML has no MIG device {uuid}")

    def mig_usage(self, uuid: str) -> GpuUsage:
        with self._lock:
            nv = self._init()
            found = self._mig_handles.get(uuid)
            if found is None:
                try:
                    found = self._find_mig(nv, uuid)
                except NvmlUnavailable:
                    raise
                except Exception as e:  # the GPU list changed under us, ...
                    raise NvmlUnavailable(f"NVML has no MIG device {uuid}: {e}") from e
                self._mig_handles[uuid] = found
        m, h = found

        def ask(f: Any, handle: Any, *args: Any) -> Any:
            try:
                return f(handle, *args)
            except Exception:
                return None

        mem = ask(nv.nvmlDeviceGetMemoryInfo, m)
        temp = ask(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        return GpuUsage(
            utilization=None,  # NVML does not report it per slice: unknown, not 0
            memory_used=int(mem.used) if mem is not None else None,
            memory_total=int(mem.total) if mem is not None else None,
            power_w=None,  # the board's power, shared by every slice
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
            self._mig_handles.clear()

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
                mig = _mig_enabled(pynvml, h)
                migs = _migs(pynvml, h, _text(name)) if mig else ()
                infos.append(
                    GpuInfo(
                        index=i,
                        name=_text(name),
                        uuid=_text(uuid),
                        memory_total=int(mem),
                        cpu_affinity=affinity,
                        mig_enabled=mig,
                        migs=migs,
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
