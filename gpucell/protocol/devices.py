"""A device an engine can be pinned to, as every side describes it.

The kernel plans engines from these (:mod:`gpucell.core.topology`), discovery
(kernel or engine) produces them, and the status table and widgets show them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["THREAD_ENV_VARS", "Device"]

#: The engine environment the kernel sets and the engine reports back:
#: variables that size native thread pools, read when a library loads.
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "GPUCELL_NUM_THREADS",
)


@dataclass(frozen=True)
class Device:
    """A device an engine can be pinned to: a GPU, or the CPU."""

    kind: str  # "gpu" or "cpu"
    index: int  # GPU index on its host; -1 for the CPU
    name: str
    uuid: str = ""
    memory_total: int = 0  # bytes; host memory for the CPU
    cpu_affinity: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        return f"GPU {self.index}" if self.kind == "gpu" else "CPU"
