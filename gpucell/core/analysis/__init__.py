"""Pure static analysis of ``%%gpu_parallel`` cells (text in, plan or error out).

Nothing here evaluates user code, reads a namespace, or imports ipyparallel.
"""

from __future__ import annotations

from gpucell.core.analysis.diagnostics import Diagnostic
from gpucell.core.analysis.driver import analyse
from gpucell.core.analysis.iterspace import (
    Chunker,
    IterSpace,
    chunk_items,
    make_chunker,
)
from gpucell.core.analysis.plan import LoopPlan, NameInfo, Reduction
from gpucell.core.analysis.report import format_plan
from gpucell.core.analysis.sinks import (
    GATHER,
    INPUT,
    KEYED,
    LOCAL,
    REDUCTION,
    UNION,
    WRITE,
)

__all__ = [
    "analyse",
    "format_plan",
    "LoopPlan",
    "Diagnostic",
    "NameInfo",
    "Reduction",
    "IterSpace",
    "Chunker",
    "make_chunker",
    "chunk_items",
    "INPUT",
    "LOCAL",
    "GATHER",
    "WRITE",
    "REDUCTION",
    "KEYED",
    "UNION",
]
