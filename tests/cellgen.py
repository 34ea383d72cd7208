"""Random loop cells for serial-equivalence tests, and helpers to run them.

``cells()`` is a hypothesis strategy of :class:`GenCell` (the cell's text, whether
it contains a pattern that must be refused, and a namespace factory).
``run_serial`` runs a cell with plain ``exec``; ``run_parallel_local`` runs it
through analysis -> chunked ``gpucell.engine.run_chunk`` -> ``gpucell.merge`` in
this process, with a pickle round trip where data would cross to an engine.
The next issue pushes the same cells through a real cluster.
"""

from __future__ import annotations

import math
import pickle
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from gpucell.analysis import analyse, make_chunker
from gpucell.engine import ChunkResult, run_chunk
from gpucell.merge import prepare

__all__ = [
    "GenCell",
    "cells",
    "fresh_namespace",
    "run_serial",
    "run_parallel_local",
    "assert_same_namespace",
]

FILENAME = "<gpucell-test-cell>"


def fresh_namespace() -> dict[str, Any]:
    """The namespace every generated cell starts from (plain, picklable data)."""
    return {
        "xs": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3],
        "ys": [0.5, 1.25, -2.0, 3.5, 0.125, 7.0, -1.5, 2.25, 4.0, 0.75, 1.0, -3.0],
        "n": 13,
        "k": 3,
        "out": [],
        "out2": ["pre"],
        "d": {"pre": 0},
        "w": [0, 0, 0, 0, 0],
        "acc": 0,
        "facc": 0.0,
        "prod": 1,
        "bits": 0,
        "mask": 255,
        "mx": -1,
        "mn": 10**6,
        "kd": {0: 0, 1: 0, 2: 0},
        "dd": defaultdict(int),
        "cnt": Counter(),
        "s": set(),
        "base": 10,
        "nullcontext": nullcontext,
        "prev": 0,
        "obj": _Obj(),
    }


class _Obj:
    """An outer object with an attribute, for refused attribute assignments."""

    def __init__(self) -> None:
        self.v = 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Obj) and other.v == self.v

    __hash__ = None  # type: ignore[assignment]


@dataclass
class GenCell:
    """A generated cell and what the generator knows about it."""

    source: str
    refused: bool  # contains a pattern gpucell must refuse
    kinds: list[str] = field(default_factory=list)

    def __str__(self) -> str:  # readable hypothesis output
        return self.source


def run_serial(cell: str | GenCell, ns: dict[str, Any]) -> dict[str, Any]:
    """Run a cell serially with ``exec`` in ``ns`` (returned for convenience)."""
    src = cell.source if isinstance(cell, GenCell) else cell
    exec(compile(src, FILENAME, "exec"), ns)
    return ns


def _roundtrip(obj: Any) -> Any:
    return pickle.loads(pickle.dumps(obj))


def chunk_bounds(count: int, cuts: Sequence[float]) -> list[tuple[int, int]]:
    """Chunk boundaries from fractions in [0, 1]; may include empty chunks."""
    points = sorted({0, count, *(min(count, int(c * (count + 1))) for c in cuts)})
    return list(zip(points[:-1], points[1:], strict=True)) or [(0, 0)]


def run_parallel_local(
    cell: str | GenCell,
    ns: dict[str, Any],
    cuts: Sequence[float] = (0.5,),
    *,
    for_cpu: bool = False,
    order: Callable[[list[int]], list[int]] | None = None,
) -> dict[str, Any]:
    """Analyse, run chunk by chunk (engines simulated by pickling), merge."""
    src = cell.source if isinstance(cell, GenCell) else cell
    plan = analyse(src, filename=FILENAME, known_names=ns.keys(), for_cpu=for_cpu)
    prelude = plan.compile_prelude()
    if prelude is not None:
        exec(prelude, ns)
    assert plan.iter_space is not None
    values = [eval(compile(e, FILENAME, "eval"), ns) for e in plan.iter_space.leaves]
    chunker = make_chunker(plan.iter_space, values)
    program = _roundtrip(plan.engine_program())
    inputs = _roundtrip({n: ns[n] for n in plan.inputs if n in ns})
    bounds = chunk_bounds(chunker.count, cuts)
    idx = list(range(len(bounds)))
    if order is not None:  # engines finish in any order
        idx = order(idx)
    results: list[ChunkResult] = []
    for i in idx:
        a, b = bounds[i]
        obj = _roundtrip(chunker.chunk(a, b))
        results.append(_roundtrip(run_chunk(program, inputs, obj, a)))
    view = {n: ns[n] for n in plan.affected_names if n in ns}
    update = prepare(plan, results, view)
    update.commit(ns)
    epilogue = plan.compile_epilogue()
    if epilogue is not None:
        exec(epilogue, ns)
    return ns


def approx_equal(a: Any, b: Any, rel: float = 1e-9, abs_: float = 1e-9) -> bool:
    """Structural equality with floats compared approximately (reassociation)."""
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            if math.isnan(a) and math.isnan(b):
                return True
            return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)
        return False
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(
            approx_equal(x, y, rel, abs_) for x, y in zip(a, b, strict=True)
        )
    if isinstance(a, dict):
        return list(a) == list(b) and all(
            approx_equal(a[k], b[k], rel, abs_) for k in a
        )
    try:
        import numpy as np

        if isinstance(a, np.ndarray):
            return a.shape == b.shape and bool(np.allclose(a, b, rtol=rel, atol=abs_))
    except ImportError:  # pragma: no cover
        pass
    return bool(a == b)


def assert_same_namespace(
    serial: dict[str, Any],
    parallel: dict[str, Any],
    serial_before: dict[str, Any],
    parallel_before: dict[str, Any],
) -> None:
    """Same names, approximately equal values, same identity of mutated objects.

    ``*_before`` are shallow copies of the namespaces taken before the cell ran:
    an object the serial run kept (and mutated) must be kept by the merge too.
    """
    skip = {"__builtins__"}
    sk = set(serial) - skip
    pk = set(parallel) - skip
    assert sk == pk, f"names differ: serial-only {sk - pk}, parallel-only {pk - sk}"
    for name in sorted(sk):
        sv, pv = serial[name], parallel[name]
        if callable(sv) and not isinstance(sv, type) and callable(pv):
            continue  # functions defined in the body: compared by use, not value
        assert approx_equal(sv, pv), f"{name}: serial {sv!r} != parallel {pv!r}"
        if name in serial_before and name in parallel_before:
            kept_serial = sv is serial_before[name]
            kept_parallel = pv is parallel_before[name]
            assert kept_serial == kept_parallel, (
                f"{name}: identity differs (serial kept the object: {kept_serial})"
            )
