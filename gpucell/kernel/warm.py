"""The kernel's side of a cell run, imported when a cluster starts or is joined.

Why: the first ``%%gpu_parallel`` after ``%gpu_cluster start`` imported some 90
modules (analysis, dispatcher, run state, merge, cloudpickle, the engine worker it
names): ~170 ms of kernel CPU with their bytecode cached, more without, all on the
first cell's critical path (bench/bench_scale.py: the first cell after start ran at
0.44 efficiency on 8 engines, its re-runs at 0.94).  A start takes seconds, so the
same imports there go unnoticed.  In the calling thread, not a background one: two
threads importing one package at once can see a module half-initialised.
"""

from __future__ import annotations

import contextlib
import importlib

__all__ = ["RUN_MODULES", "warm_kernel"]

#: what a cell run imports in the kernel (each pulls its own dependencies)
RUN_MODULES = (
    "cloudpickle",
    "gpucell.core.analysis",
    "gpucell.kernel.execute",
    "gpucell.kernel.dispatch",
    "gpucell.kernel.finish",
    "gpucell.engine.worker",
    "gpucell.kernel.keep",
    "gpucell.kernel.background",
    "gpucell.kernel.inline",
    "gpucell.kernel.nonempty",
    "gpucell.kernel.telemetry",
    "gpucell.ui.progress",
    "gpucell.core.merge",
    "gpucell.core.writeback",
    "gpucell.core.aliasing",
    "gpucell.core.globalreads",
    "gpucell.core.fileconflicts",
    "gpucell.core.modulewrites",
    "gpucell.kernel.keyed_stores",
)


def warm_kernel() -> None:
    """Import :data:`RUN_MODULES` now; a failure is left for the cell to report."""
    for name in RUN_MODULES:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
