"""The loop's iteration space: described statically, chunked at run time.

The analysis never evaluates the iterable. It records *what* the iterable is
(``range(...)``, a name, ``enumerate``/``zip`` of those, or any expression) and the
expressions the kernel must evaluate (the *leaves*). Once the kernel has evaluated
them, :func:`make_chunker` returns the iteration count and, for an index range, a
small self-describing *chunk object*; :func:`chunk_items` (used by
``gpucell.engine.chunk`` on the engines) turns a chunk object back into the items.

Chunk objects are tagged tuples of plain values so they pickle without gpucell
classes::

    ("range", range_obj)              a range slice, never materialised
    ("seq", sequence_slice)           list/tuple/str slice, numpy/torch view
    ("enumerate", offset, inner)      enumerate(inner items, offset)
    ("zip", (inner, inner, ...))      zip of inner items
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gpucell.errors import NotParallelizable
from gpucell.protocol.chunks import chunk_items

__all__ = [
    "IterSpace",
    "Chunker",
    "describe_iterable",
    "make_chunker",
    "with_own_items",
    "chunk_items",
]

#: chunking strategies as shown in plans
INDEX = "index"
SLICE_OR_LIST = "slice if list/tuple/str/numpy array/torch tensor, else materialised"
MATERIALISE = "materialised to a list in the kernel; items travel with their chunk"


@dataclass(frozen=True)
class IterSpace:
    """Static description of a loop's iterable.

    Attributes
    ----------
    kind : str
        ``"range"``, ``"name"``, ``"enumerate"``, ``"zip"`` or ``"expr"``.
    source : str
        The iterable as written (after IPython's transforms).
    chunking : str
        How it will be split (decided finally by the evaluated value's type).
    parts : tuple of IterSpace
        Inner iterables of ``enumerate``/``zip``.
    start : str or None
        ``enumerate``'s start expression, evaluated after the inner iterable.
    strict : str or None
        ``zip``'s ``strict=`` expression.
    key : tuple of int
        ``"own"``: where the key is in an item of the first part
        (``models[i]`` over ``enumerate(...)``: ``(0,)``); ``source`` is the
        container, ``spelling`` the element as the user wrote it.
    """

    kind: str
    source: str
    chunking: str
    parts: tuple[IterSpace, ...] = ()
    start: str | None = None
    strict: str | None = None
    key: tuple[int, ...] = ()
    spelling: str = ""

    @property
    def leaves(self) -> tuple[str, ...]:
        """Expressions the kernel evaluates, in Python's evaluation order.

        :func:`make_chunker` consumes the values in the same order.
        """
        if self.kind == "enumerate":
            out = self.parts[0].leaves
            return out + ((self.start,) if self.start is not None else ())
        if self.kind == "zip":
            leaves: tuple[str, ...] = ()
            for p in self.parts:
                leaves += p.leaves
            return leaves + ((self.strict,) if self.strict is not None else ())
        return (self.source,)

    def describe(self) -> str:
        """A one-line human description for dry-run plans."""
        if self.kind == "enumerate":
            inner = self.parts[0].describe()
            return f"enumerate of [{inner}]"
        if self.kind == "zip" and self.parts[-1].kind == "own":
            owns = ", ".join(f"`{p.spelling}`" for p in self.parts[1:])
            return (
                f"{self.parts[0].describe()}; each iteration's own item {owns}, "
                "read for every item before the loop runs"
            )
        if self.kind == "zip":
            return "zip of [" + "; ".join(p.describe() for p in self.parts) + "]"
        return f"{self.kind} `{self.source}`: {self.chunking}"


def with_own_items(
    space: IterSpace, own: dict[str, tuple[str, tuple[int, ...]]]
) -> IterSpace:
    """``space`` with each container's own element ``C[k]`` a part of its own
    (``container -> (k, where k is in an item)``, ``ownsubscripts.py``): the
    kernel evaluates the iterable once and the container, and reads ``C[k]``
    for each item it drew (:func:`make_chunker`).  No element: ``space``."""
    if not own:
        return space
    owns = tuple(
        IterSpace("own", c, SLICE_OR_LIST, key=path, spelling=f"{c}[{var}]")
        for c, (var, path) in own.items()
    )
    return IterSpace("zip", space.source, space.chunking, parts=(space, *owns))


def describe_iterable(node: ast.expr, shadowed: Callable[[str], bool]) -> IterSpace:
    """Describe ``node`` without evaluating it.

    Parameters
    ----------
    node : ast.expr
        The loop's iterable.
    shadowed : callable
        ``shadowed(name)`` is true when ``range``/``enumerate``/``zip`` may not be
        the builtin (the user's namespace or the prelude binds it); such calls are
        then treated as arbitrary expressions, which is always safe.
    """
    src = ast.unparse(node)
    if isinstance(node, ast.Name):
        return IterSpace("name", src, SLICE_OR_LIST)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and not shadowed(node.func.id)
        and not any(isinstance(a, ast.Starred) for a in node.args)
        and not any(k.arg is None for k in node.keywords)
    ):
        fname = node.func.id
        kw = {k.arg: k.value for k in node.keywords}
        if fname == "range" and not kw:
            return IterSpace("range", src, INDEX)
        if fname == "enumerate" and 1 <= len(node.args) + len(kw) <= 2:
            args = list(node.args)
            it = args[0] if args else kw.get("iterable")
            start = args[1] if len(args) > 1 else kw.get("start")
            if it is not None and set(kw) <= {"iterable", "start"}:
                inner = describe_iterable(it, shadowed)
                return IterSpace(
                    "enumerate",
                    src,
                    inner.chunking if inner.chunking != INDEX else INDEX,
                    parts=(inner,),
                    start=ast.unparse(start) if start is not None else None,
                )
        if fname == "zip" and node.args and set(kw) <= {"strict"}:
            parts = tuple(describe_iterable(a, shadowed) for a in node.args)
            strict = kw.get("strict")
            chunking = (
                INDEX
                if all(p.chunking == INDEX for p in parts)
                else MATERIALISE
                if any(p.chunking == MATERIALISE for p in parts)
                else SLICE_OR_LIST
            )
            return IterSpace(
                "zip",
                src,
                chunking,
                parts=parts,
                strict=ast.unparse(strict) if strict is not None else None,
            )
    if isinstance(
        node, (ast.List, ast.Tuple, ast.ListComp, ast.Constant, ast.Subscript)
    ):
        return IterSpace("expr", src, SLICE_OR_LIST)
    return IterSpace("expr", src, MATERIALISE)


# ---------------------------------------------------------------------------
# run time (kernel side): values in, count and chunk objects out
# ---------------------------------------------------------------------------


def _is_array(value: Any) -> bool:
    """True for numpy arrays and torch tensors with at least one dimension.

    Checked by module name so that neither library is imported here.
    """
    mod = type(value).__module__ or ""
    if not (mod.startswith("numpy") or mod.startswith("torch")):
        return False
    if type(value).__name__ == "nditer":
        return False  # (an iterator: `len` is its number of operands)
    ndim = getattr(value, "ndim", None)
    return isinstance(ndim, int) and ndim >= 1 and hasattr(value, "__getitem__")


@dataclass(frozen=True)
class Chunker:
    """The evaluated iteration space: its length and how to cut it.

    Attributes
    ----------
    count : int
        Number of iterations of the serial loop.
    chunk : callable
        ``chunk(start, stop)`` returns the chunk object for iterations
        ``start <= i < stop``. numpy arrays and torch tensors are sliced as views.
    items : callable
        The engine-side function (:func:`chunk_items`) turning a chunk object back
        into the chunk's items.
    materialised : bool
        True when some part had to be turned into a list in the kernel.
    """

    count: int
    chunk: Callable[[int, int], tuple[Any, ...]]
    items: Callable[[tuple[Any, ...]], Iterable[Any]]
    materialised: bool


def _leaf_chunker(value: Any) -> Chunker:
    if isinstance(value, range):
        return Chunker(
            len(value), lambda a, b: ("range", value[a:b]), chunk_items, False
        )
    if isinstance(value, (list, tuple, str, bytes)) or _is_array(value):
        n = len(value)
        return Chunker(n, lambda a, b: ("seq", value[a:b]), chunk_items, False)
    items = list(value)
    if _writes_through(value, items):
        raise NotParallelizable(
            "gpucell: the loop iterates over a `numpy.nditer` opened for writing: "
            "its items are views the body writes into the array through, and "
            "each engine would write into its own copy, so the changes would be "
            "lost. Write the whole array at once (`a[...] = 2 * a`), or by index "
            "(`for idx in np.ndindex(a.shape): a[idx] = ...`), or run the cell "
            "without %%gpu_parallel. Nothing ran."
        )
    return Chunker(len(items), lambda a, b: ("seq", items[a:b]), chunk_items, True)


def _writes_through(value: Any, items: list[Any]) -> bool:
    """An ``np.nditer(a, op_flags=["readwrite"])``: items are writeable views."""
    kind = type(value)
    return (
        kind.__name__ == "nditer"
        and kind.__module__ == "numpy"
        and any(getattr(getattr(x, "flags", None), "writeable", False) for x in items)
    )


def make_chunker(space: IterSpace, values: Sequence[Any]) -> Chunker:
    """Build the :class:`Chunker` for ``space`` from its evaluated leaves.

    Parameters
    ----------
    space : IterSpace
        From the plan.
    values : sequence
        ``eval`` of each of ``space.leaves``, in order.

    Raises
    ------
    ValueError
        When ``zip(..., strict=True)`` parts differ in length, as serial ``zip``
        would (serially it raises only after the shorter part is exhausted).
    """
    vals = list(values)
    if len(vals) != len(space.leaves):
        raise ValueError(f"expected {len(space.leaves)} values, got {len(vals)}")
    chunker = _build(space, iter(vals))
    return chunker


def _build(space: IterSpace, vals: Iterator[Any]) -> Chunker:
    if space.kind == "enumerate":
        inner = _build(space.parts[0], vals)
        offset = next(vals) if space.start is not None else 0
        offset = offset.__index__()

        def enum_chunk(a: int, b: int) -> tuple[Any, ...]:
            return ("enumerate", offset + a, inner.chunk(a, b))

        return Chunker(inner.count, enum_chunk, chunk_items, inner.materialised)
    if space.kind == "zip" and space.parts[-1].kind == "own":
        return _with_own(space, vals)
    if space.kind == "zip":
        values = [[next(vals) for _ in p.leaves] for p in space.parts]
        strict = bool(next(vals)) if space.strict is not None else False
        if any(_lazy(v) for part in values for v in part):
            return _drawn_zip(space, values, strict)
        parts = [_build(p, iter(v)) for p, v in zip(space.parts, values, strict=True)]
        counts = [p.count for p in parts]
        if strict and len(set(counts)) > 1:
            raise ValueError(
                f"zip() arguments have different lengths {counts} (strict=True)"
            )
        n = min(counts)

        def zip_chunk(a: int, b: int) -> tuple[Any, ...]:
            return ("zip", tuple(p.chunk(a, b) for p in parts))

        return Chunker(n, zip_chunk, chunk_items, any(p.materialised for p in parts))
    return _leaf_chunker(next(vals))


def _drawn_zip(space: IterSpace, values: list[list[Any]], strict: bool) -> Chunker:
    """``zip`` over an iterator (a file, ``iter(xs)``, ``itertools.cycle``):
    drawn through ``zip`` itself, as the serial loop draws it: it stops at the
    shortest part (an endless part is drawn only as far), an iterator given
    twice takes turns, and a longer one is left drawn one item past the end,
    as serially.  Only plain parts: an iterator inside an inner ``enumerate``
    or ``zip`` is refused."""
    if not all(p.kind in ("range", "name", "expr") for p in space.parts):
        raise NotParallelizable(
            f"gpucell: the loop's `{space.source}` zips an iterator inside another "
            "`enumerate` or `zip`, whose items gpucell cannot draw as the serial "
            "loop does. Draw the items in a line before the loop "
            "(`items = list(...)`) and loop over `items`. Nothing ran."
        )
    rows = list(zip(*(v[0] for v in values), strict=strict))
    columns = [list(c) for c in zip(*rows, strict=True)] or [[] for _ in values]

    def zip_chunk(a: int, b: int) -> tuple[Any, ...]:
        return ("zip", tuple(("seq", c[a:b]) for c in columns))

    return Chunker(len(rows), zip_chunk, chunk_items, True)


def _lazy(value: Any) -> bool:
    """An iterator (a generator, ``iter(keys)``): its items are drawn once."""
    return hasattr(type(value), "__next__")


def _with_own(space: IterSpace, vals: Iterator[Any]) -> Chunker:
    """The loop's items zipped with each own element ``C[k]`` (the kernel's
    objects).  An iterator of keys is drawn once, each ``C[k]`` read right
    after its key, as the serial loop reads it; an iterator inside
    ``enumerate``/``zip`` is refused, naming the rewrite (its keys could be
    drawn only once, and ``C[k]`` read after every draw: a draw that changed
    ``C`` would go unseen)."""
    first, owns = space.parts[0], space.parts[1:]
    values = [next(vals) for _ in first.leaves]
    containers = [next(vals) for _ in owns]
    lazy = first.kind in ("name", "expr") and _lazy(values[0])
    if not lazy and any(map(_lazy, values)):
        spelled = ", ".join(f"`{p.spelling}`" for p in owns)
        raise NotParallelizable(
            f"gpucell: the loop reads {spelled} for the items of `{first.source}`; "
            "an iterator inside it can be drawn only once, so each element would "
            "be read after all the items were drawn, not right after its own. "
            "Draw the items in a line before the loop (`items = list(...)`) and "
            "loop over `items`. Nothing ran."
        )
    if lazy:
        drawn: list[Any] = []
        elements: list[list[Any]] = [[] for _ in owns]
        for item in values[0]:
            drawn.append(item)
            for p, c, out in zip(owns, containers, elements, strict=True):
                out.append(c[_dig(item, p.key)])
        base = Chunker(len(drawn), lambda a, b: ("seq", drawn[a:b]), chunk_items, True)
    else:
        base = _build(first, iter(values))
        items = list(chunk_items(base.chunk(0, base.count)))
        elements = [
            [c[_dig(x, p.key)] for x in items]
            for p, c in zip(owns, containers, strict=True)
        ]
    parts = [base, *(_seq(e) for e in elements)]

    def zip_chunk(a: int, b: int) -> tuple[Any, ...]:
        return ("zip", tuple(p.chunk(a, b) for p in parts))

    return Chunker(base.count, zip_chunk, chunk_items, base.materialised)


def _dig(item: Any, path: tuple[int, ...]) -> Any:
    for j in path:
        item = item[j]
    return item


def _seq(items: list[Any]) -> Chunker:
    return Chunker(len(items), lambda a, b: ("seq", items[a:b]), chunk_items, False)
