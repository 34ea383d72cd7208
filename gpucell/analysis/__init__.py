"""Pure static analysis of ``%%gpu_parallel`` cells (text in, plan or error out).

Nothing here evaluates user code, reads a namespace, or imports ipyparallel.
"""

from __future__ import annotations

from gpucell.analysis.classify import (
    GATHER,
    INPUT,
    KEYED,
    LOCAL,
    REDUCTION,
    UNION,
    WRITE,
)
from gpucell.analysis.diagnostics import Diagnostic
from gpucell.analysis.driver import analyse
from gpucell.analysis.iterspace import Chunker, IterSpace, chunk_items, make_chunker
from gpucell.analysis.plan import LoopPlan, NameInfo, Reduction
from gpucell.analysis.report import format_plan

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
