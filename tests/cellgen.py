"""Random loop cells for serial-equivalence tests, and helpers to run them.

``cells()`` is a hypothesis strategy of :class:`GenCell` (the cell's text, whether
it contains a pattern that must be refused, and a namespace factory).
``run_serial`` runs a cell with plain ``exec``; ``run_parallel_local`` runs it
through analysis -> chunked ``gpucell.engine.chunk.run_chunk`` -> ``gpucell.core.merge``
in
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

import numpy as np
from hypothesis import strategies as st

from gpucell.core.analysis import analyse, make_chunker
from gpucell.core.merge import prepare
from gpucell.engine import checkin
from gpucell.engine.chunk import ChunkResult, run_chunk
from gpucell.protocol.chunks import chunk_items

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
        "neg": 0,
        "facc": 0.0,
        "prod": 1,
        "bits": 0,
        "mask": 255,
        "mx": -1,
        "mn": 10**6,
        "best": 12,
        "km": {0: 3, 1: 3, 2: 3},
        "kn": {},
        "kf": {},
        "best_at": None,
        "kd": {0: 0, 1: 0, 2: 0},
        "dd": defaultdict(int),
        "cnt": Counter(),
        "s": set(),
        "base": 10,
        "nullcontext": nullcontext,
        "prev": 0,
        "obj": _Obj(),
        "vals": list(range(20)),
        "grid": [[j, j + 1] for j in range(20)],
        "kv": {"p": 1, "q": 2, "r": 3, "s": 4},
        "img": np.arange(60.0).reshape(20, 3),
        "kg": {0: [], 1: [], 2: []},
        "ks": {"n": 0, "items": []},
        "tracker": Tracker(),
        "trackers": [Tracker(), Tracker()],
        "bump_all": bump_all,
        "np": np,
        "arr": np.array([]),
        "rows": np.zeros((0, 2)),
        "ra": 1.0,
        "rb": 0,
        "rc": 5,
    }


class Tracker:
    """An input whose methods a loop calls: ``bump`` changes it in place (what
    static analysis cannot see), ``peek`` only reads it."""

    def __init__(self) -> None:
        self.count = 0

    def bump(self, v: Any) -> int:
        self.count += 1 + int(v) % 3
        return self.count

    def peek(self) -> int:
        return self.count

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tracker) and other.count == self.count

    __hash__ = None  # type: ignore[assignment]


def bump_all(items: list[Tracker], v: Any) -> None:
    """A helper that changes its argument's items in place."""
    for t in items:
        t.bump(v)


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
    # calls something that changes an input in place: if that ran serially, the
    # parallel run must fail with the engines' check, never merge
    mutates: bool = False

    def __str__(self) -> str:  # readable hypothesis output
        return self.source


def run_serial(cell: str | GenCell, ns: dict[str, Any]) -> dict[str, Any]:
    """Run a cell serially with ``exec`` in ``ns`` (returned for convenience)."""
    src = cell.source if isinstance(cell, GenCell) else cell
    exec(compile(src, FILENAME, "exec"), ns)
    return ns


def _roundtrip(obj: Any) -> Any:
    """What crossing to an engine does to an object (cloudpickle, as engines use)."""
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover
        return pickle.loads(pickle.dumps(obj))
    return pickle.loads(cloudpickle.dumps(obj))


def _in_layers(
    plan: Any, ns: dict[str, Any], k: int, inner: Callable[[], None]
) -> None:
    """The `with` blocks around the loop, entered here as the kernel does."""
    import ast
    import contextlib

    if k == len(plan.layers):
        inner()
        return
    layer = plan.layers[k]
    with contextlib.ExitStack() as stack:
        for item in layer.node.items:
            expr = compile(ast.Expression(item.context_expr), FILENAME, "eval")
            stack.enter_context(eval(expr, ns))
        for part in (layer.before, None, layer.after):
            if part is None:
                _in_layers(plan, ns, k + 1, inner)
            elif (code := plan.compile_statements(part)) is not None:
                exec(code, ns)


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

    def loop() -> None:
        assert plan.iter_space is not None
        values = [
            eval(compile(e, FILENAME, "eval"), ns) for e in plan.iter_space.leaves
        ]
        chunker = make_chunker(plan.iter_space, values)
        program = _roundtrip(plan.engine_program())
        inputs = _roundtrip({n: ns[n] for n in plan.inputs if n in ns})
        bounds = chunk_bounds(chunker.count, cuts)
        idx = list(range(len(bounds)))
        if order is not None:  # engines finish in any order
            idx = order(idx)
        results: list[ChunkResult] = []
        watch = plan.watched()
        for i in idx:
            a, b = bounds[i]
            obj = _roundtrip(chunker.chunk(a, b))
            # the engines' check: inputs are read-only to iterations
            items = (lambda obj=obj: chunk_items(obj)) if watch["items"] else None
            before = checkin.snapshot(inputs, watch["names"], items)
            result = run_chunk(program, inputs, obj, a)
            changed = checkin.changes(before, inputs, items)
            if changed:
                raise checkin.Changed(changed)
            results.append(_roundtrip(result))
        view = {n: ns[n] for n in plan.affected_names if n in ns}
        update = prepare(plan, results, view)
        update.commit(ns)

    _in_layers(plan, ns, 0, loop)
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


# ---------------------------------------------------------------------------
# the generator
# ---------------------------------------------------------------------------


class _Gen:
    """Draws one cell body; tracks definitely-assigned int locals as it goes."""

    def __init__(self, draw: Callable[[Any], Any]) -> None:
        self.mutates = False
        self.own = 0
        self.draw = draw
        self.counter = 0
        self.refused = False
        self.kinds: list[str] = []
        # the loop's variable when it is a key (`for c in ('p', 'q')`), and
        # whether its keys may repeat; one own-key write per body
        self.key: str | None = None
        self.key_repeats = False
        self.key_written = False
        # one running best kept with a payload per body (a second would
        # assign `best` twice: a loop-carried read, refused)
        self.best_written = False

    def fresh(self, prefix: str = "t") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def expr(self, avail: list[str]) -> str:
        v = self.draw(st.sampled_from(avail))
        w = self.draw(st.sampled_from(avail))
        c = self.draw(st.integers(1, 7))
        form = self.draw(st.integers(0, 6))
        return [
            f"{v} * {c}",
            f"{v} + {c}",
            f"({v} % {c})",
            f"{v} - {w}",
            f"base + {v}",
            f"k * {v} - {w}",
            f"len(xs) - {v}",
        ][form]

    def block(self, avail: list[str], depth: int, top: bool, size: int) -> list[str]:
        lines: list[str] = []
        avail = list(avail)
        for _ in range(size):
            lines.extend(self.stmt(avail, depth, top))
        return lines or ["pass"]

    def stmt(self, avail: list[str], depth: int, top: bool) -> list[str]:  # noqa: C901
        d = self.draw
        kind = d(
            st.sampled_from(
                [
                    "local", "local", "gather", "gather2", "write", "reduce",
                    "keyed", "union", "if", "for", "try", "with", "comp", "lambda",
                    "walrus", "continue", "refused", "call", "mutate", "own",
                    "kgather", "best", "kmax", "concat", "rebind",
                ]
            )
        )  # fmt: skip
        if depth >= 2 and kind in ("if", "for", "try", "with"):
            kind = "local"
        self.kinds.append(kind)
        e = self.expr(avail)
        if kind == "local":
            name = self.fresh()
            avail.append(name)
            return [f"{name} = {e}"]
        if kind == "gather":
            form = d(st.integers(0, 2))
            return [
                [f"out.append({e})"],
                [f"out.extend([{e}, {self.expr(avail)}])"],
                [f"out += [{e}]"],
            ][form]
        if kind == "gather2":
            return [f"out2.append(({e}, {self.expr(avail)}))"]
        if kind == "write":
            return [
                d(st.sampled_from([f"d[({e}) % 4] = {self.expr(avail)}",
                                   f"w[({e}) % 5] = {self.expr(avail)}"]))
            ]  # fmt: skip
        if kind == "reduce":
            return [
                d(
                    st.sampled_from(
                        [
                            f"acc += {e}",
                            f"neg -= {e}",
                            f"prod *= 1 + ({e}) % 2",
                            f"bits |= 1 << ({e}) % 8",
                            f"mask &= ~(1 << ({e}) % 8)",
                            f"facc = facc + ({e}) * 0.1",
                            f"mx = max(mx, {e})",
                            f"mn = min(mn, {e})",
                        ]
                    )
                )
            ]
        if kind == "keyed":
            return [
                d(st.sampled_from([f"kd[({e}) % 3] += {self.expr(avail)}",
                                   f"dd[({e}) % 4] += 1",
                                   f"cnt[({e}) % 3] += {self.expr(avail)}"]))
            ]  # fmt: skip
        if kind == "union":
            return [d(st.sampled_from([f"s.add(({e}) % 7)", f"s.update([{e}, 1])"]))]
        if kind == "rebind":  # a new value made from the last: on the kernel
            return [
                d(st.sampled_from([f"ra = ra * 0.5 + ({e})",
                                   f"rb = rb + 2 if ({e}) % 3 else rb - 1",
                                   f"rc = max(rc, {e}) - min(rc, 2)"]))
            ]  # fmt: skip
        if kind == "concat":  # a name rebound by a concatenation of itself
            return [
                d(st.sampled_from([f"arr = np.append(arr, {e})",
                                   f"rows = np.vstack([rows, [{e}, 0.5]])"]))
            ]  # fmt: skip
        if kind == "if":
            body = self.block(avail, depth + 1, top, d(st.integers(1, 3)))
            out = [f"if ({e}) % 2 == 0:", *("    " + b for b in body)]
            if d(st.booleans()):
                other = self.block(avail, depth + 1, top, d(st.integers(1, 2)))
                out += ["else:", *("    " + b for b in other)]
            return out
        if kind == "for":
            j = self.fresh("j")
            body = self.block([*avail, j], depth + 1, False, d(st.integers(1, 3)))
            return [f"for {j} in range(({e}) % 3):", *("    " + b for b in body)]
        if kind == "try":
            name = self.fresh("q")
            avail.append(name)
            return [
                "try:",
                f"    {name} = 10 // (({e}) % 3)",
                "except ZeroDivisionError:",
                f"    {name} = -1",
            ]
        if kind == "with":
            body = self.block(avail, depth + 1, top, d(st.integers(1, 2)))
            return ["with nullcontext():", *("    " + b for b in body)]
        if kind == "comp":
            name = self.fresh()
            avail.append(name)
            v = d(st.sampled_from(avail[:-1]))
            return [
                d(
                    st.sampled_from(
                        [
                            f"{name} = sum([z * {v} for z in range(3) if z != {v}])",
                            f"{name} = sum(z + k for z in range(({e}) % 4))",
                            f"{name} = len({{z % 3 for z in range({v} % 5 + 1)}})",
                        ]
                    )
                )
            ]
        if kind == "lambda":
            f = self.fresh("f")
            name = self.fresh()
            avail.append(name)
            return [f"{f} = lambda z: z * 2 + {e}", f"{name} = {f}(k)"]
        if kind == "best":  # a running best kept with a payload (bests.py)
            if self.best_written:
                return [f"out.append({e})"]
            self.best_written = True
            op = d(st.sampled_from(["<", "<=", ">", ">="]))
            at = self.expr(avail)
            return [f"if {e} {op} best:", f"    best = {e}", f"    best_at = {at}"]
        if kind == "kmax":  # a keyed running max/min, as written or respelled
            names = [a for a in avail if a.isidentifier()]
            if not names:
                return [f"out.append({e})"]
            v, w = d(st.sampled_from(names)), d(st.sampled_from(names))
            c = d(st.integers(1, 5))
            return [
                [f"km[{v} % 3] = max(km[{v} % 3], {w} * {c})"],
                [f"kn[{v} % 4] = min(kn.get({v} % 4, 50), {w} - {c})"],
                [f"if {v} % 3 not in kf or {w} + {c} > kf[{v} % 3]:",
                 f"    kf[{v} % 3] = {w} + {c}"],
            ][d(st.integers(0, 2))]  # fmt: skip
        if kind == "kgather":  # lists under a dict's keys, and counts beside them
            return [
                d(st.sampled_from([f"kg[({e}) % 3].append({self.expr(avail)})",
                                   f"kg[({e}) % 3].extend([{e}, 1])",
                                   f"ks['n'] += {e}",
                                   f"ks['items'].append({e})"]))
            ]  # fmt: skip
        if kind == "own" and self.key is not None:
            # the iteration's own key (`kv[c] = f(kv[c])`): distinct keys only,
            # one write, outside nested loops
            if self.key_written or not top:
                return [f"out.append({e})"]
            self.key_written = True
            if self.key_repeats:
                self.refused = True  # serially a repeat reads the first write
            return [f"kv[{self.key}] = kv[{self.key}] * 2 + ({e})"]
        if kind == "own":  # read and write the iteration's own element or row
            if "i" not in avail:
                return [f"out.append({e})"]
            self.own += 1
            # repeated, nested in a loop, or read back after the write: each
            # engine writes a private copy of the row (see ownrows.py)
            return [
                d(st.sampled_from([f"vals[i] = vals[i] * 2 + ({e})",
                                   f"vals[i] += {e}",
                                   f"grid[i][0] = grid[i][1] + ({e})",
                                   f"grid[i][1] += grid[i][0] * ({e})",
                                   # a pure method of the own row or its slice
                                   f"grid[i][1] = grid[i][1] + grid[i].count({e})",
                                   f"img[i, 0] = img[i, 0] - img[i].mean() + ({e})",
                                   f"img[i, 2] -= img[i, 1:].max() * ({e})"]))
            ]  # fmt: skip
        if kind == "call":  # a call that only reads an input: the check passes
            return [
                d(st.sampled_from([f"out.append(tracker.peek() + {e})",
                                   f"out.append(trackers[0].peek() * {e})"]))
            ]  # fmt: skip
        if kind == "mutate":  # a call that changes an input in place
            self.mutates = True
            return [
                d(st.sampled_from([f"tracker.bump({e})",
                                   f"bump_all(trackers, {e})",
                                   f"trackers[1].bump({e})"]))
            ]  # fmt: skip
        if kind == "walrus":
            name = self.fresh("m")
            body = self.block([*avail, name], depth + 1, top, 1)
            avail.append(name)
            return [f"if ({name} := {e}) > 2:", *("    " + b for b in body)]
        if kind == "continue":
            if not top:  # continue inside a nested loop: still fine
                return [f"if ({e}) % 5 == 0:", "    continue"]
            return [f"if ({e}) % 5 == 1:", "    continue"]
        # refused patterns
        self.refused = True
        u = self.fresh("u")
        pattern = d(st.integers(0, 8))
        return [
            [f"out.append(prev + {e})", f"prev = {e}"],
            [f"if ({e}) % 4 == 3:", "    break"] if top else [f"obj.v = {e}"],
            [f"out.append(len(out) + {e})"],
            ["xs.sort()"],
            [f"if ({e}) % 2:", f"    {u} = 1", f"out.append({u})"],
            [f"obj.v = {e}"],
            ["del base"],
            [f"acc = acc * 2 + {e}", "out.append(acc)"],
            ["global gg", "gg = 1"],
        ][pattern]


@st.composite
def cells(draw: Callable[[Any], Any]) -> GenCell:
    """A small cell: optional prelude, a parallel loop, optional epilogue."""
    g = _Gen(draw)
    lines: list[str] = []
    if draw(st.booleans()):
        lines.append(draw(st.sampled_from(["out2 = []", "base = base + 1", "k = 2"])))
    prelude_end = len(lines)
    if draw(st.integers(0, 5)) == 0:
        # list-comprehension form
        cond = draw(st.sampled_from(["", " if i % 3", " if (m := i * 2) > 4"]))
        more = draw(st.sampled_from(["", " for j in range(i % 3)"]))
        elt = (
            "i * k + j" if more else draw(st.sampled_from(["i * k", "(t := i + base)"]))
        )
        form = draw(
            st.sampled_from(
                ["[{e}{g}]", "{{{e}{g}}}", "{{i % 4: {e}{g}}}", "sum({e}{g})",
                 "sorted({e}{g})", "min({e}{g})", "any({e} > 20{g})",
                 "all({e} % 7{g})"]
            )
        )  # fmt: skip
        gen = f" for i in range(n){cond}{more}"
        if form.startswith(("any", "all")) and ":=" in elt + cond:
            g.refused = True  # the walrus would keep the deciding item's value
        lines.append("res = " + form.format(e=elt, g=gen))
        g.kinds.append("listcomp")
    else:
        header, avail = draw(
            st.sampled_from(
                [
                    ("for i in range(n):", ["i"]),
                    ("for x in xs:", ["x"]),
                    ("for i, x in enumerate(xs):", ["i", "x"]),
                    ("for x, y in zip(xs, ys):", ["x"]),
                    ("for i in range(2, n, 3):", ["i"]),
                    ("for c in ('p', 'q', 'r', 's'):", ["len(c)"]),
                    ("for c in ['r', 'p', 'r']:", ["len(c)"]),
                    ("for c in kv.keys():", ["len(c)"]),
                ]
            )
        )
        if header.startswith("for c in"):
            g.key, g.key_repeats = "c", header.count("'r'") > 1
        body = g.block(avail, 0, True, draw(st.integers(1, 6)))
        if (
            header.startswith("for x, y")
            and draw(st.booleans())
            and not any(b.lstrip().startswith("facc =") for b in body)
        ):
            # one reduction form per name: mixing `facc = facc + e` with
            # `facc += e` is refused by design (see test_analysis)
            body.append("facc += y")
        lines.append(header)
        lines.extend("    " + b for b in body)
        if draw(st.integers(0, 3)) == 0:
            # a comprehension before the loop: prelude, never the parallel loop
            # (the first top-level `for` is)
            lines.insert(prelude_end, "sq = [v * 2 for v in xs]")
            prelude_end += 1
            g.kinds.append("comp-before")
    if draw(st.integers(0, 3)) == 0:
        # the loop inside a `with` block, with statements before and after it
        # inside the block (the kernel runs those in the context)
        inner = lines[prelude_end:]
        if draw(st.booleans()):
            inner.insert(0, "base = base * 2")
        if draw(st.booleans()):
            inner.append("inside = len(out)")
        lines[prelude_end:] = ["with nullcontext():", *("    " + x for x in inner)]
        g.kinds.append("with")
    if draw(st.booleans()):
        lines.append("total = acc + len(out) + sum(s)")
    return GenCell("\n".join(lines) + "\n", g.refused, g.kinds, g.mutates)
