"""Plan which engines to start and how each is pinned (pure: no processes, no I/O).

One engine per selected GPU (or K with ``per_gpu``), each with an environment fixed
before CUDA can initialise:

* ``CUDA_VISIBLE_DEVICES`` lists its GPU first and the others after it, as dask-cuda's
  LocalCUDACluster does, so user code written for one GPU finds its device at
  ``cuda:0`` while peer-to-peer access to the other GPUs still works; an engine on
  a MIG slice sees that slice alone (``CUDA_VISIBLE_DEVICES=MIG-<uuid>``: CUDA
  gives a process one MIG device, and no peer access between slices);
* its CPU affinity is the GPU's near cores where NVML reports them;
* thread pools (OpenMP, MKL, OpenBLAS, torch) are limited to the engine's share of
  cores, so engines sharing a host do not fight over them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from gpucell.errors import DeviceSelectionError
from gpucell.protocol.devices import THREAD_ENV_VARS, Device

__all__ = [
    "ENGINES_PER_CORE",
    "MAX_ENGINES",
    "EngineSpec",
    "engine_limit",
    "is_mig",
    "parse_gpu_selection",
    "plan_engines",
    "slice_text",
    "thread_env",
    "visible_devices_order",
]


@dataclass(frozen=True)
class EngineSpec:
    """One engine to start: its label, device, environment and CPU affinity."""

    label: str  # unique within a cluster; engines report it back after they start
    device: Device
    env: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    cpu_affinity: tuple[int, ...] = ()
    threads: int = 1


#: a host's engines at most: this many per core (an engine is a process of its
#: own, ~100 MB before it imports anything), and never more than MAX_ENGINES,
#: unless the host has more GPUs than that (one engine each is always allowed)
ENGINES_PER_CORE = 4
MAX_ENGINES = 1024


def engine_limit(cores: int, gpus: int = 0) -> int:
    """The most engines a local cluster may have on a host with ``cores`` cores
    and ``gpus`` GPUs."""
    return max(min(ENGINES_PER_CORE * max(1, cores), MAX_ENGINES), gpus)


def _too_many(option: str, value: int, limit: int, cores: int) -> DeviceSelectionError:
    return DeviceSelectionError(
        f"{option} {value}: at most {limit} engines on this host "
        f"({ENGINES_PER_CORE} per core of its {cores}, {MAX_ENGINES} at most; each "
        f"engine is a process of its own). Pass {option} {limit} or less."
    )


def parse_gpu_selection(spec: str | Sequence[int] | None) -> str | tuple[int, ...]:
    """Parse ``--gpus``: ``all``, ``none``, or comma-separated indices like ``0,2``."""
    if spec is None:
        return "all"
    if isinstance(spec, str):
        s = spec.strip().lower()
        if s in ("all", ""):
            return "all"
        if s == "none":
            return "none"
        try:
            idx = tuple(int(t) for t in s.split(",") if t.strip())
        except ValueError:
            raise DeviceSelectionError(
                f"--gpus {spec!r}: expected 'all', 'none' or GPU indices like '0,2'."
            ) from None
    else:
        idx = tuple(int(i) for i in spec)
    if len(set(idx)) != len(idx):
        raise DeviceSelectionError(f"--gpus {spec!r}: a GPU index is repeated.")
    if any(i < 0 for i in idx):
        raise DeviceSelectionError(f"--gpus {spec!r}: GPU indices are >= 0.")
    return idx


def is_mig(device: Device) -> bool:
    """Is ``device`` a MIG slice (its UUID ``MIG-...``) rather than a whole GPU?"""
    return device.kind == "gpu" and device.uuid.startswith("MIG-")


def slice_text(visible: str | None) -> str:
    """How the status names the MIG slice an engine's ``CUDA_VISIBLE_DEVICES``
    pins it to: ``MIG-c6d4f1ef`` (the start of its UUID, as ``nvidia-smi -L``
    shows it), ``MIG 1/0`` (GPU and compute instance, for the older
    ``MIG-GPU-<uuid>/1/0`` names); ``""`` for anything else."""
    first = (visible or "").split(",")[0].strip()
    if not first.startswith("MIG-"):
        return ""
    if first.startswith("MIG-GPU-") and first.count("/") == 2:
        return "MIG " + first.split("/", 1)[1]
    return first[: len("MIG-") + 8]


def visible_devices_order(gpu: int, all_gpus: Sequence[int]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for ``gpu``'s engine: its GPU first, then the rest."""
    rest = [g for g in all_gpus if g != gpu]
    return ",".join(str(g) for g in [gpu, *rest])


def thread_env(threads: int) -> dict[str, str]:
    """Environment that caps native thread pools at ``threads``."""
    return {var: str(threads) for var in THREAD_ENV_VARS}


def _share(cores: Sequence[int], k: int, n: int) -> tuple[int, ...]:
    """The k-th of n near-equal contiguous shares of ``cores`` (never empty)."""
    if not cores:
        return ()
    if n >= len(cores):
        return (cores[k % len(cores)],)
    lo = k * len(cores) // n
    hi = (k + 1) * len(cores) // n
    return tuple(cores[lo:hi])


def plan_engines(
    gpus: Sequence[Device],
    *,
    cpu: Device,
    cores: Sequence[int],
    select: str | tuple[int, ...] = "all",
    n: int | None = None,
    per_gpu: int = 1,
    cpu_engines: int = 0,
    pin_cpu_engines: bool = True,
) -> list[EngineSpec]:
    """Decide the engines of a local cluster.

    Parameters
    ----------
    gpus
        The host's GPUs (from discovery).
    cpu, cores
        The CPU device and the cores this process may use.
    select
        ``"all"``, ``"none"`` or GPU indices.
    n
        Without GPUs: the number of CPU engines (default: one per core).  With GPUs:
        use the first ``n`` selected GPUs.
    per_gpu
        Engines per GPU (several small jobs can share one big GPU).
    cpu_engines
        CPU engines to add beside the GPU engines.
    """
    if n is not None and n < 1:
        raise DeviceSelectionError(f"-n {n}: a cluster needs at least one engine.")
    if per_gpu < 1:
        raise DeviceSelectionError(f"--per-gpu {per_gpu}: must be at least 1.")
    if cpu_engines < 0:
        raise DeviceSelectionError(f"--cpu-engines {cpu_engines}: must be >= 0.")
    # before anything is planned: -n 10**8 once built 10**8 specs (12 GB)
    limit = engine_limit(len(cores), len(gpus))
    for option, value in (
        ("-n", n),
        ("--per-gpu", per_gpu),
        ("--cpu-engines", cpu_engines),
    ):
        if value is not None and value > limit:
            raise _too_many(option, value, limit, len(cores))
    by_index: dict[int, list[Device]] = {}  # a GPU in MIG mode: its slices
    for g in gpus:
        by_index.setdefault(g.index, []).append(g)
    if select == "none":
        chosen: list[Device] = []
    elif select == "all":
        chosen = list(gpus)
    else:
        missing = [i for i in select if i not in by_index]
        if missing:
            have = ", ".join(str(i) for i in sorted(by_index)) or "none"
            raise DeviceSelectionError(
                f"--gpus: no GPU {', '.join(map(str, missing))} on this host "
                f"(GPUs here: {have}). Pick from those, or use --gpus none for CPU "
                "engines."
            )
        # every entry is a known GPU index here (``missing`` is empty)
        chosen = [d for i in cast("tuple[int, ...]", select) for d in by_index[i]]
    if chosen and n is not None:
        if n > len(chosen):
            raise DeviceSelectionError(
                f"-n {n}: only {len(chosen)} GPU(s) selected; use --per-gpu to put "
                "several engines on one GPU, or --cpu-engines to add CPU engines."
            )
        chosen = chosen[:n]

    all_idx = [g.index for g in gpus if not is_mig(g)]  # whole GPUs: peers
    # a MIG slice's label: its GPU's index and its rank among that GPU's slices
    slices: dict[str, str] = {}
    per_parent: dict[int, int] = {}
    for g in gpus:
        if is_mig(g):
            k = per_parent.get(g.index, 0)
            per_parent[g.index] = k + 1
            slices[g.uuid] = f"gpu{g.index}.mig{k}"
    # the chosen slices of one GPU split its near cores, as --per-gpu engines do
    sharing: dict[int, list[str]] = {}
    for g in chosen:
        if is_mig(g):
            sharing.setdefault(g.index, []).append(g.uuid)
    n_cpu = cpu_engines if chosen else (n if n is not None else max(1, len(cores)))
    total = len(chosen) * per_gpu + n_cpu
    if total > limit:
        raise DeviceSelectionError(
            f"{len(chosen)} GPU(s) × --per-gpu {per_gpu} + {n_cpu} CPU engine(s) = "
            f"{total} engines: at most {limit} on this host ({ENGINES_PER_CORE} "
            f"per core of its {len(cores)}, {MAX_ENGINES} at most). Lower --per-gpu "
            "or --cpu-engines."
        )
    threads = max(1, len(cores) // total) if cores else 1
    specs: list[EngineSpec] = []
    for g in chosen:
        for k in range(per_gpu):
            part, parts = k, per_gpu
            if is_mig(g):
                part += sharing[g.index].index(g.uuid) * per_gpu
                parts *= len(sharing[g.index])
            near = _share(g.cpu_affinity, part, parts) if g.cpu_affinity else ()
            if is_mig(g):  # the slice alone, by its UUID
                env = {"CUDA_VISIBLE_DEVICES": g.uuid}
                name = slices[g.uuid]
            else:
                # NVML indices are written, and NVML orders GPUs by PCI bus id;
                # CUDA's default order (fastest first) may differ: say which
                env = {
                    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                    "CUDA_VISIBLE_DEVICES": visible_devices_order(g.index, all_idx),
                }
                name = f"gpu{g.index}"
            env.update(thread_env(max(1, len(near)) if near else threads))
            specs.append(
                EngineSpec(
                    label=name + (f".{k}" if per_gpu > 1 else ""),
                    device=g,
                    env=env,
                    cpu_affinity=near,
                    threads=max(1, len(near)) if near else threads,
                )
            )
    for k in range(n_cpu):
        aff = _share(cores, k, n_cpu) if pin_cpu_engines and n_cpu <= len(cores) else ()
        t = max(1, len(aff)) if aff else threads
        # An empty CUDA_VISIBLE_DEVICES hides every GPU from a CPU engine, so a
        # stray .cuda() fails loudly instead of landing on another engine's GPU.
        env = {"CUDA_VISIBLE_DEVICES": ""} if chosen or gpus else {}
        env.update(thread_env(t))
        specs.append(
            EngineSpec(
                label=f"cpu{k}", device=cpu, env=env, cpu_affinity=aff, threads=t
            )
        )
    return specs
