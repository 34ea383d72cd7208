"""Merge ordered chunk results into the user's namespace, all or nothing.

Pure: ``prepare(plan, results, current)`` reads the chunk results and a read-only
view of the affected names' current values, validates everything that could fail
and computes new values, and touches nothing. ``PreparedUpdate.commit(namespace)``
then applies in-place mutations that cannot fail on validated data, binds names
and deletes names, in that order.

Semantics (see ARCHITECTURE §1):

- *gathers*: ``L.extend(items)`` in iteration order on the same list object; the
  list-comprehension form binds a new list.
- *indexed writes*: ``D[k] = v`` in iteration order (last write wins).
- *reductions*: partials are folded per chunk on the engine, and here combined in
  chunk order, then applied once: ``acc op= combined``. Only associativity is
  assumed (``@`` keeps order). ``-=`` folds its contributions with ``+`` (``|`` for
  sets) and subtracts once: it assumes ``a - x - y == a - (x + y)``. Augmented
  reductions on an object with an in-place operator (numpy array, torch tensor,
  list, set) mutate that object in commit, as serial code would; others rebind.
  ``max``/``min`` keep the first of equal values, as serial code does.
- *keyed reductions*: per-key partials combined in chunk order, applied in the
  order keys were first seen.
- *set unions*: union of every ``add``/``update``; on a non-set (a dict, a
  Counter) the recorded ``update`` calls are replayed in iteration order.
- *locals*: the value from the last iteration that assigned (or deleted) it.

What cannot be made atomic (validation is done, but commit may still raise):

- in-place operators and ``__setitem__``/``extend``/``update`` of types other than
  ``list``, ``dict``, ``set``, numpy arrays and torch tensors (user classes,
  deques, Counters): validated on an out-of-place computation or a shallow copy
  only;
- keys that alias the same element (``a[0]`` and ``a[-1]`` of a length-1 array)
  in keyed reductions are each computed from the value before the merge;
- memory errors.
"""

from __future__ import annotations

import builtins
import copy
import importlib
import io
import operator
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpucell.core import writeback
from gpucell.core.analysis.sinks import (
    MERGE_ORDER,
    GatherSink,
    KeyedGatherSink,
    KeyedSink,
    LocalSink,
    OwnFrameRowsSink,
    ReductionSink,
    ReplayedUfuncSink,
    RunningBestSink,
    SinkKind,
    UnionSink,
    WriteSink,
)
from gpucell.core.deleted import DELETED
from gpucell.core.reducers import selects
from gpucell.errors import NotParallelizable
from gpucell.protocol.fold import (
    BINARY,
    INPLACE,
    combine,
    fold,
    is_numpy,
    is_torch,
    own,
    unordered,
)
from gpucell.protocol.program import RESULT, Indexed, ItemError, Row

__all__ = [
    "ChunkResultLike",
    "PreparedUpdate",
    "Mutation",
    "prepare",
    "merge",
]


#: reduction operator -> (its in-place method, the function that calls it)
_INPLACE = INPLACE


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------


class ChunkResultLike(Protocol):
    """What :func:`prepare` reads from a ``gpucell.engine.chunk.ChunkResult``."""

    start: int
    count: int
    gathers: dict[str, list[Any]]
    writes: dict[str, list[tuple[Any, Any]]]
    reductions: dict[str, tuple[str, Any]]
    keyed: dict[str, tuple[str, list[tuple[Any, Any]]]]
    unions: dict[str, list[tuple[str, Any]]]
    last_values: dict[str, tuple[int, str, Any]]
    keyed_gathers: dict[str, list[tuple[Any, list[Any]]]]


@dataclass
class Mutation:
    """One in-place change to apply in commit, already validated."""

    name: str
    what: str
    apply: Callable[[], Any]


@dataclass
class PreparedUpdate:
    """Everything the merge will do; nothing has happened yet.

    Attributes
    ----------
    mutations : list of Mutation
        In-place changes of existing objects, applied first, in plan order.
    assign : dict
        Names to bind (locals, reductions, the list-comprehension result).
    delete : tuple of str
        Locals whose last iteration deleted them.
    iterations : int
        Total iterations the chunks ran.
    """

    mutations: list[Mutation] = field(default_factory=list)
    assign: dict[str, Any] = field(default_factory=dict)
    delete: tuple[str, ...] = ()
    iterations: int = 0
    # locals whose last value could not travel back: left as they were, said so
    notes: list[str] = field(default_factory=list)
    # the loop's logging records in iteration order, for the kernel's handlers
    # once the namespace holds the results (emitting them is the kernel's I/O)
    records: list[Any] = field(default_factory=list)

    def commit(self, namespace: MutableMapping[str, Any]) -> None:
        """Apply the update. Touches only validated objects and the given names."""
        for m in self.mutations:
            m.apply()
        namespace.update(self.assign)
        for n in self.delete:
            namespace.pop(n, None)


# ---------------------------------------------------------------------------
# prepare
# ---------------------------------------------------------------------------


def _current(current: Mapping[str, Any], name: str) -> Any:
    try:
        return current[name]
    except KeyError:
        raise NameError(
            f"name {name!r} is not defined: the loop adds to it, so it must exist "
            f"before the loop (as it would have to serially). Nothing was merged."
        ) from None


def _torch_broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """``torch.broadcast_shapes`` as a tuple (torch leaves that function untyped)."""
    import torch

    broadcast: Callable[..., Sequence[int]] = torch.broadcast_shapes
    return tuple(broadcast(*shapes))


def _appender(target: Any, items: Sequence[Any]) -> Callable[[], Any]:
    """A commit action appending ``items`` one by one to ``target``."""

    def action() -> list[Any]:
        return [target.append(x) for x in items]

    return action


def _extender(extend: Callable[[Any], Any], items: Sequence[Any]) -> Callable[[], Any]:
    """A commit action calling ``extend(items)``."""

    def action() -> Any:
        return extend(items)

    return action


def _returner(value: Any) -> Callable[[], Any]:
    """A commit action that just returns ``value`` (computed and checked already)."""

    def action() -> Any:
        return value

    return action


def _one_entry_per_position(
    name: str, op: str, target: Any, entries: list[list[Any]]
) -> list[list[Any]]:
    """A sequence's keys as positions: ``y[-1]`` and ``y[2]`` of a 3-element
    list are one element, which serially gets both contributions, so their
    partials are folded into one entry (each entry is computed from the value
    before the merge).  A key that is not a position (a slice, a mask, an
    index array) may overlap another iteration's: refused, nothing merged."""
    shape = tuple(target.shape) if hasattr(target, "shape") else (len(target),)
    merged: list[list[Any]] = []
    at: dict[tuple[int, ...], int] = {}
    for k, c in entries:
        parts = k if isinstance(k, tuple) else (k,)
        try:
            if len(parts) > len(shape):
                raise TypeError
            pos = tuple(
                _position(operator.index(p), n)
                for p, n in zip(parts, shape, strict=False)
            )
        except IndexError:
            raise IndexError(
                f"`{name}[{k!r}]`: index out of range for a `{name}` of shape "
                f"{shape}, as serially. Nothing was merged."
            ) from None
        except TypeError:
            raise NotParallelizable(
                f"`{name}[{k!r}] {op}= ...`: the key is not one position of "
                f"`{name}` (a slice, a mask or an index array may cover elements "
                "another iteration's key covers, which serially get both "
                "contributions). Key it by single positions, or gather the "
                "contributions in a dict and add them after the loop. Nothing was "
                "merged."
            ) from None
        if pos in at:
            merged[at[pos]][1] = fold(op, merged[at[pos]][1], c)
        else:
            at[pos] = len(merged)
            merged.append([k, c])
    return merged


def _position(i: int, n: int) -> int:
    """``i`` as a position in ``range(n)`` (a negative one counted from the end)."""
    if not -n <= i < n:
        raise IndexError(i)
    return i + n if i < 0 else i


def _refuse_a_cast_per_store(name: str, k: Any, op: str, target: Any, new: Any) -> None:
    """A keyed reduction into an array stores each key once, its contributions
    folded; serially every iteration's store casts to the array's dtype.  The
    two agree (to rounding) while the folded value keeps the array's kind; a
    float into an int array (or a complex into a float one) is cut at each
    store serially (``y[0] += 0.5`` twice on ints stays 1), once here."""
    if is_numpy(target):
        import numpy as np

        kind: str = target.dtype.kind
        got: str = np.asarray(new).dtype.kind
    else:
        kind, got = _torch_kind(target), _torch_kind(new)
    order = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}
    if order.get(got, 9) > order.get(kind, 9):
        raise NotParallelizable(
            f"`{name}[{k!r}] {op}= ...`: the values combined into `{name}` are of "
            f"another kind ({got!r}) than its dtype ({kind!r}), so serially each "
            "iteration's store casts them, and folding a key's contributions first "
            "can differ. Gather the contributions in a dict (`parts[k] = "
            f"parts.get(k, 0) + e`) and add them into `{name}` after the loop, or "
            f"make `{name}` of the values' dtype before it. Nothing was merged."
        )


def _replay_array_store(target: Any, k: Any, op: str, c: Any, binary: bool) -> Any:
    """``target[k] op= c`` as the serial statement runs it, on a copy: read
    the element or view, apply the operator (in place on a view, which raises
    where the result's dtype cannot be cast back, as ``img[b] += 0.5`` does on
    an int image; rebinding on a numpy scalar, which casts at the store:
    ``y[i] += 0.5`` on ints stores the truncated value), then the store's own
    cast into a scratch of the element's dtype.  Returns that scratch, which
    the commit stores unchanged, so it cannot fail half-way."""
    view = target[k]
    if is_numpy(target):
        import numpy as np

        if not target.flags.writeable:
            raise ValueError("assignment destination is read-only")
        tmp = view.copy() if isinstance(view, np.ndarray) else view
        new = BINARY[op](tmp, c) if binary else _INPLACE[op][1](tmp, c)
        scratch = np.empty(np.shape(view), dtype=target.dtype)
        scratch[...] = new
        return scratch
    import torch

    if target.requires_grad and target.is_leaf and torch.is_grad_enabled():
        raise RuntimeError(
            "a leaf tensor that requires grad cannot be written in place"
        )
    if is_torch(c) and c.device != target.device:
        c = c.to(target.device)
    tmp = view.clone()
    new = BINARY[op](tmp, c) if binary else _INPLACE[op][1](tmp, c)
    tscratch = torch.empty_like(view)
    tscratch[...] = new
    return tscratch


def _holds_objects(target: Any) -> bool:
    """A numpy array of dtype object: its elements are the objects themselves
    (a list ``+=`` extends in place), so the replay on a copy would not be one."""
    return is_numpy(target) and target.dtype.kind == "O"


def _numpy_scalar(v: Any) -> bool:
    """A numpy scalar (``np.float32(0)``, ``np.int64(3)``): immutable."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(v, np.generic)


def _torch_kind(x: Any) -> str:
    """numpy's dtype kind letter for a tensor or a Python number."""
    if hasattr(x, "is_complex"):
        return "c" if x.is_complex() else "f" if x.is_floating_point() else "i"
    return "c" if isinstance(x, complex) else "f" if isinstance(x, float) else "i"


def _check_array_write(target: Any, key: Any, value: Any) -> Any:
    """Validate ``target[key] = value`` for numpy/torch; return the converted value."""
    view = target[key]
    if is_numpy(target):
        import numpy as np

        if not target.flags.writeable:
            raise ValueError("assignment destination is read-only")
        conv = np.asarray(value, dtype=target.dtype)
        np.broadcast_to(conv, np.shape(view))
        return conv
    import torch

    tconv = torch.as_tensor(value, dtype=target.dtype, device=target.device)
    shape = tuple(view.shape)
    if _torch_broadcast_shape(tuple(tconv.shape), shape) != shape:
        raise ValueError(
            f"cannot write a value of shape {tuple(tconv.shape)} into {shape}"
        )
    if target.requires_grad and target.is_leaf and torch.is_grad_enabled():
        raise RuntimeError(
            "a leaf tensor that requires grad cannot be written in place"
        )
    return tconv


def _plan_inplace(name: str, v0: Any, op: str, c: Any) -> tuple[Any, Callable[[], Any]]:
    """Validate ``v0 op= c``; return (value to bind after commit, commit action).

    The action is ``None``-free: for immutable ``v0`` it just returns the new value
    computed here.
    """
    dunder, iop = _INPLACE[op]
    if _numpy_scalar(v0):
        # a numpy scalar (np.float32(0)) is immutable: `s += c` binds a new
        # scalar, as for a Python number (its `flags` say read-only)
        new = BINARY[op](v0, c)
        return new, lambda: new
    if is_numpy(v0):
        import numpy as np

        rt = np.result_type(v0, c)
        if not np.can_cast(rt, v0.dtype, casting="same_kind"):
            raise TypeError(
                f"cannot apply `{name} {op}= ...` in place: the combined result "
                f"has dtype {rt}, which cannot be cast to {name}'s dtype {v0.dtype}"
            )
        if op == "@":
            shape = np.shape(np.matmul(v0, c))
        else:
            shape = np.broadcast_shapes(v0.shape, np.shape(c))
        if tuple(shape) != tuple(v0.shape):
            raise ValueError(
                f"cannot apply `{name} {op}= ...` in place: result shape {shape} "
                f"differs from {name}'s shape {v0.shape}"
            )
        if not v0.flags.writeable:
            raise ValueError(f"`{name}` is a read-only array")
        return v0, lambda: iop(v0, c)
    if is_torch(v0) and hasattr(type(v0), dunder):
        import torch

        if is_torch(c) and c.device != v0.device:
            c = c.to(v0.device)
        trt = torch.result_type(v0, c)
        if not torch.can_cast(trt, v0.dtype):
            raise TypeError(
                f"cannot apply `{name} {op}= ...` in place: result type {trt} "
                f"cannot be cast to {v0.dtype}"
            )
        cshape = tuple(c.shape) if is_torch(c) else ()
        if _torch_broadcast_shape(tuple(v0.shape), cshape) != tuple(v0.shape):
            raise ValueError(f"cannot apply `{name} {op}= ...` in place: shape change")
        if v0.requires_grad and v0.is_leaf and torch.is_grad_enabled():
            raise RuntimeError(
                f"`{name}` is a leaf tensor that requires grad; in-place "
                f"`{op}=` is not allowed on it (serially it would fail too)"
            )
        return v0, lambda: iop(v0, c)
    if isinstance(v0, list) and op == "+":
        items = list(c)

        def extend() -> Any:
            v0.extend(items)
            return v0

        return v0, extend
    if hasattr(type(v0), dunder):
        # validate on an out-of-place computation (or a shallow copy)
        if isinstance(v0, (list, set, dict)):
            iop(copy.copy(v0), c)
        else:
            try:
                BINARY[op](v0, c)
            except TypeError:
                iop(copy.copy(v0), c)
        return v0, lambda: iop(v0, c)
    new = BINARY[op](v0, c)
    return new, lambda: new


def _changed_in_place(v: Any, op: str) -> bool:
    """Does ``v op= c`` change ``v`` (the branches of :func:`_plan_inplace`)?
    A number's result may be the same object (``0 - 0 is 0``) and two
    reductions may start from one cached ``0``: nothing is shared there."""
    return not _numpy_scalar(v) and (
        is_numpy(v)
        or (isinstance(v, list) and op == "+")
        or hasattr(type(v), _INPLACE[op][0])
    )


def _concat(results: Sequence[ChunkResultLike], attr: str, name: str) -> list[Any]:
    out: list[Any] = []
    for r in results:
        out.extend(getattr(r, attr).get(name, ()))
    return out


def check_exactly_once(results: Iterable[ChunkResultLike], count: int) -> None:
    """Every iteration merged exactly once: the chunks' ranges tile
    ``[0, count)`` with no gap and no overlap, or nothing is merged.  Checked
    for every run, kept or not: a chunk merged twice (an overlap of kept
    checkpoint files, a reply matched to the wrong chunk) or never (a lost
    one) would leave a namespace that looks right and is not."""
    at = 0
    for r in sorted(results, key=lambda r: (r.start, r.count)):
        if r.start != at:
            what = "twice" if r.start < at else "never"
            a, b = (r.start, at) if r.start < at else (at, r.start)
            cover = "more than once" if what == "twice" else "not at all"
            raise RuntimeError(
                f"gpucell: iterations {a}-{b - 1} would be merged {what} (chunk "
                f"results cover them {cover}); nothing was merged. This is a "
                "gpucell bug or a damaged checkpoint: run the cell again without "
                "--resume."
            )
        at = r.start + r.count
    if at != count:
        raise RuntimeError(
            f"gpucell: chunk results end at iteration {at}, the loop has {count}; "
            "nothing was merged. Run the cell again without --resume."
        )


def prepare(
    plan: Any,
    results: Iterable[ChunkResultLike],
    current: Mapping[str, Any],
    *,
    item_of: Callable[[int], Any] | None = None,
    inputs: Mapping[str, Any] | None = None,
) -> PreparedUpdate:
    """Validate and compute everything; change nothing.

    Parameters
    ----------
    plan : LoopPlan
        The analysis plan (only its name lists are read).
    results : iterable of ChunkResult
        One per chunk; sorted here by ``start``.
    current : mapping
        Read-only view of the current values of ``plan.affected_names``.

    Raises
    ------
    NameError, TypeError, ValueError, KeyError, IndexError
        What the serial loop would (roughly) have raised; nothing is changed.
    NotParallelizable
        When two combined names are the same object (their contributions would
        interleave serially).
    """
    rs = sorted(results, key=lambda r: r.start)
    up = PreparedUpdate(iterations=sum(r.count for r in rs))
    up.records = [rec for r in rs for rec in getattr(r, "logs", ())]
    own = [u for r in rs for u in getattr(r, "own_items", ())]
    if own:
        if item_of is None:
            raise NotParallelizable(
                "gpucell: the loop changed its own items, and this merge cannot "
                "reach the kernel's items to write them back. Nothing was merged."
            )
        targets = writeback.resolve(own, item_of, inputs or {}, up.iterations)
        up.mutations.append(
            Mutation(
                "(own items)",
                f"{len(targets)} items changed in place",
                lambda: writeback.apply(targets),
            )
        )
    m = _Merging(plan, rs, current, up)
    for kind in MERGE_ORDER:
        SINK_MERGES[kind](m)
    return up


@dataclass
class _Merging:
    """One merge's inputs and what it has decided so far: each sink kind's
    merge (``SINK_MERGES``) reads the plan and the sorted chunk results and
    adds to ``up``; ``claim`` refuses two combined names that are one object."""

    plan: Any
    rs: list[ChunkResultLike]
    current: Mapping[str, Any]
    up: PreparedUpdate
    owners: dict[int, str] = field(default_factory=dict)
    # names another kind's merge has bound (a running best's group)
    picked: set[str] = field(default_factory=set)

    def claim(self, name: str, obj: Any) -> None:
        other = self.owners.setdefault(id(obj), name)
        if other != name:
            raise NotParallelizable(
                f"`{name}` and `{other}` are the same object, and the loop adds to "
                f"both; serially their contributions would interleave. Use one "
                f"name, or make them separate objects before the loop. Nothing "
                f"was merged."
            )

    @property
    def spelled(self) -> Any:
        return getattr(self.plan, "spelled", None)

    def hidden_gathers(self) -> dict[str, str]:
        """Hidden gathers that stand for another sink (replayed calls, own
        frame rows): hidden name -> the notebook's name."""
        return {
            **getattr(self.spelled, "ufunc_at", {}),
            **getattr(self.spelled, "frame_rows", {}),
        }


def _merge_replayed(m: _Merging, kind: str, prepare: Callable[..., Any]) -> None:
    """What the engines gathered under each hidden name of ``kind`` (a
    spelling's table: hidden name -> the notebook's name), replayed on the
    notebook's object in iteration order by ``prepare``'s mutation."""
    for hidden, name in getattr(m.spelled, kind, {}).items():
        gathered = _concat(m.rs, "gathers", hidden)
        if gathered:
            target = _current(m.current, name)
            m.claim(name, target)
            m.up.mutations.append(prepare(name, target, gathered))


def _merge_ufunc_at(m: _Merging) -> None:
    """``np.add.at(D, idx, w)``: the calls replayed into D in iteration order."""
    _merge_replayed(m, "ufunc_at", _prepare_ufunc_at)


def _merge_frame_rows(m: _Merging) -> None:
    """A frame's own rows read back: each iteration's written cells replayed."""
    _merge_replayed(m, "frame_rows", _prepare_frame_rows)


def _merge_gathers(m: _Merging) -> None:
    """Ordered gathers: extended in iteration order; a comprehension's result."""
    plan, up = m.plan, m.up
    hidden = m.hidden_gathers()
    for name in plan.gathers:
        if name in hidden:
            continue
        items = _concat(m.rs, "gathers", name)
        if not items:
            continue
        target = _current(m.current, name)
        m.claim(name, target)
        if not hasattr(target, "extend") and not hasattr(target, "append"):
            raise TypeError(
                f"`{name}` is a {type(target).__name__}, which has no append/extend"
            )
        ext = getattr(target, "extend", None)
        if ext is None:
            up.mutations.append(Mutation(name, "append", _appender(target, items)))
        else:
            up.mutations.append(Mutation(name, "extend", _extender(ext, items)))
    if getattr(plan, "result_name", None):
        values = _concat(m.rs, "gathers", RESULT)
        up.assign[plan.result_name] = _build(
            getattr(plan, "result_kind", None) or "list", values
        )


def _merge_writes(m: _Merging) -> None:
    """Indexed writes, in iteration order."""
    for name in m.plan.writes:
        entries = _concat(m.rs, "writes", name)
        if not entries:
            continue
        target = _current(m.current, name)
        m.claim(name, target)
        m.up.mutations.append(_prepare_writes(name, target, entries))


def _merge_reductions(m: _Merging) -> None:
    """Reductions: the chunks' partials combined in chunk order, applied once."""
    up = m.up
    for red in m.plan.reductions:
        name, op = red.name, red.op
        partials = [r.reductions[name][1] for r in m.rs if name in r.reductions]
        if not partials:
            continue
        c = combine(op, partials)
        v0 = _current(m.current, name)
        if selects(op):
            up.assign[name] = BINARY[op](v0, c)
        elif red.augmented:
            new, action = _plan_inplace(name, v0, op, c)
            if new is v0 and _changed_in_place(v0, op):
                m.claim(name, v0)
                up.mutations.append(Mutation(name, f"{op}=", action))
            up.assign[name] = new
        else:
            up.assign[name] = BINARY[op](v0, c)


def _merge_keyed(m: _Merging) -> None:
    """Keyed reductions: per-key partials combined in chunk order."""
    for name, op in m.plan.keyed:
        chunks = [r.keyed[name][1] for r in m.rs if name in r.keyed]
        first_nan = _select_nans(name, op, chunks)
        entries = _combine_keyed(op, chunks)
        if not entries:
            continue
        target = _current(m.current, name)
        m.claim(name, target)
        facts = getattr(m.plan, "facts", None)
        once = name in getattr(facts, "stored_once", ())
        m.up.mutations.extend(
            _prepare_keyed(name, target, op, entries, m.spelled, once, first_nan)
        )


def _merge_keyed_gathers(m: _Merging) -> None:
    """``D[k].append(e)`` / extend, per key in iteration order."""
    plan = m.plan
    for name in getattr(plan, "keyed_gathers", ()):
        runs = _concat(m.rs, "keyed_gathers", name)
        if not runs:
            continue
        target = _current(m.current, name)
        m.claim(name, target)
        keyed = dict(plan.keyed)
        reduced = [k for k, _ in _keys_of(m.rs, name)] if name in keyed else []
        spelled = m.spelled
        new_lists = spelled is not None and name in spelled.new_lists
        m.up.mutations.append(
            _prepare_keyed_gather(name, target, runs, reduced, new_lists)
        )


def _merge_unions(m: _Merging) -> None:
    """Set unions: every iteration's additions."""
    for name in m.plan.unions:
        ops = _concat(m.rs, "unions", name)
        if not ops:
            continue
        target = _current(m.current, name)
        m.claim(name, target)
        m.up.mutations.append(_prepare_union(name, target, ops))


def _merge_bests(m: _Merging) -> None:
    """Running bests: the chunk whose final best the test takes, in chunk order."""
    for b in getattr(m.plan, "bests", ()):
        m.picked.update(b.names)
        m.up.assign.update(_pick_best(b, m.rs, m.current))


def _merge_locals(m: _Merging) -> None:
    """Locals: the last iteration that assigned (or deleted) each name."""
    up = m.up
    deletes: list[str] = []
    for name in m.plan.locals:
        if name in m.picked:
            continue
        best: tuple[int, str, Any] | None = None
        for r in m.rs:
            rec = r.last_values.get(name)
            if rec is not None and (best is None or rec[0] > best[0]):
                best = rec
        if best is None:
            continue
        _idx, kind, payload = best
        if kind == "value":
            up.assign[name] = payload
        elif kind == "module":
            up.assign[name] = importlib.import_module(payload)
        elif kind == "deleted":
            deletes.append(name)
        elif kind == "closed file":
            up.assign[name] = closed_file(payload)
        elif kind == "unsendable":
            up.notes.append(
                f"`{name}` keeps the value it had before the cell: its last value "
                f"in the loop (a {payload}) cannot travel back from an engine."
            )
    up.delete = tuple(deletes)


#: each sink kind's merge, keyed by its class (``core/analysis/sinks.py``,
#: whose ``MERGE_ORDER`` is the order they run in)
SINK_MERGES: dict[type[SinkKind], Callable[[_Merging], None]] = {
    ReplayedUfuncSink: _merge_ufunc_at,
    OwnFrameRowsSink: _merge_frame_rows,
    GatherSink: _merge_gathers,
    WriteSink: _merge_writes,
    ReductionSink: _merge_reductions,
    KeyedSink: _merge_keyed,
    KeyedGatherSink: _merge_keyed_gathers,
    UnionSink: _merge_unions,
    RunningBestSink: _merge_bests,
    LocalSink: _merge_locals,
}


_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _totally_ordered(v: Any) -> bool:
    """A value whose ``<`` is a total order on its kind (a real number that
    is not nan, a string, bytes; a numpy or torch scalar of a real dtype):
    there folding the chunks' bests is the serial fold."""
    if isinstance(v, bool) or (
        isinstance(v, (int, float, str, bytes)) and not is_numpy(v)
    ):
        return v == v
    if is_numpy(v) or is_torch(v):
        dtype = str(getattr(v, "dtype", ""))
        size = getattr(v, "size", None)
        n = size if isinstance(size, int) else getattr(v, "numel", lambda: 0)()
        real = not any(t in dtype for t in ("complex", "object", "str", "void"))
        return n == 1 and real and bool(v == v)
    from decimal import Decimal
    from fractions import Fraction

    return isinstance(v, (Fraction, Decimal)) and v == v


def _pick_best(
    b: Any, rs: Sequence[ChunkResultLike], current: Mapping[str, Any]
) -> dict[str, Any]:
    """``if score < best: best = score; best_epoch = epoch``: each chunk ran
    it from the kernel's ``best``, so its final ``best`` is its own running
    best; replaying the test over those in chunk order (from the kernel's
    ``best``) is the serial fold when the scores are totally ordered, ties
    included. A chunk whose payloads were never assigned took nothing."""
    missing = object()
    cur = current.get(b.name, missing)
    test = _COMPARE[b.op]
    chosen: dict[str, Any] | None = None
    for r in rs:
        last = r.last_values
        if b.payloads and not all(p in last for p in b.payloads):
            continue  # (the chunk never took: its best is the kernel's)
        rec = last.get(b.name)
        if rec is None:
            continue
        recs = {n: last[n] for n in b.names if n in last}
        if any(kind != "value" for _i, kind, _v in recs.values()):
            raise NotParallelizable(
                f"gpucell: `{b.name}` keeps a running best, and a value the "
                "chunk kept with it cannot travel back from an engine. Nothing "
                "was merged."
            )
        value = rec[2]
        if cur is missing or (b.none_first and cur is None):
            take = True
        else:
            for v in (value, cur):
                if not _totally_ordered(v):
                    raise NotParallelizable(
                        f"gpucell: `{b.name}` keeps a running best of "
                        f"{type(v).__name__} values, whose order is not total: "
                        "the best of the chunks' bests need not be the serial "
                        "one. Nothing was merged; collect the candidates and "
                        "pick after the loop."
                    )
            take = bool(test(cur, value) if b.best_left else test(value, cur))
        if take:
            cur = value
            chosen = {n: v for n, (_i, _k, v) in recs.items()}
    return chosen or {}


def _build(kind: str, values: list[Any]) -> Any:
    """What the comprehension builds from its values in iteration order: the
    same builtin the serial statement calls, over the same values in the same
    order (so ``sum`` of floats is bit-for-bit the serial one, and ``max`` of
    nothing raises as it would serially)."""
    if kind == "list":
        return values
    if kind in ("any", "all"):
        return _short_circuit(kind == "any", values)
    return getattr(builtins, kind)(values)


def _short_circuit(want: bool, values: list[Any]) -> bool:
    """``any``/``all`` replayed in order over every item's value: an item that
    raised (``ItemError``) is raised only if no item before it decided, which is
    exactly when the serial call would have reached it."""
    for v in values:
        if isinstance(v, ItemError):
            raise v.exc
        if bool(v) is want:
            return want
    return not want


def _prepare_indexed(
    name: str, target: Any, entries: list[tuple[Any, Any]]
) -> Mutation:
    """``D.at[k] = v`` writes (pandas indexers), tried on a copy first so a bad
    key fails before anything changes, then applied in iteration order."""

    def write_all(obj: Any) -> None:
        for k, v in entries:
            if isinstance(k, Indexed):
                getattr(obj, k.accessor)[k.key] = v
            else:
                obj[k] = v

    copy_of = getattr(target, "copy", None)
    if callable(copy_of):
        write_all(copy_of())  # raises here, with nothing changed yet
    return Mutation(name, "setitem", lambda: write_all(target))


def _prepare_rows(name: str, target: Any, entries: list[tuple[Any, Any]]) -> Mutation:
    """``S[i][k] = v`` writes under each iteration's own row, applied to the row
    in place (its identity kept, as serially), in iteration order.  Each row is
    tried on a copy first, so a bad key or value fails before anything
    changes."""
    rows: dict[int, Any] = {}
    checked: list[tuple[Any, Any, Any]] = []
    for k, v in entries:
        if not isinstance(k, Row):
            raise TypeError(f"`{name}`: mixed row and item writes")
        try:
            row = target[k.index]
        except (KeyError, IndexError, TypeError) as e:
            raise type(e)(
                f"`{name}[{k.index!r}]` does not exist in the kernel: {e}"
            ) from None
        if is_numpy(row) or is_torch(row):
            v = _check_array_write(row, k.key, v)
        else:
            trial = rows.get(id(row))
            if trial is None:
                trial = rows[id(row)] = (
                    type(row)(row) if type(row) in (list, dict) else None
                )
            if trial is None:
                if not hasattr(row, "__setitem__"):
                    raise TypeError(
                        f"`{name}[{k.index!r}]` is a {type(row).__name__}, which "
                        "does not support item assignment"
                    )
            else:
                trial[k.key] = v  # raises here, with nothing changed yet
        checked.append((row, k.key, v))

    def apply_rows() -> None:
        for row, key, value in checked:
            row[key] = value

    return Mutation(name, "setitem", apply_rows)


def _prepare_writes(name: str, target: Any, entries: list[tuple[Any, Any]]) -> Mutation:
    if any(isinstance(k, Row) for k, _v in entries):
        return _prepare_rows(name, target, entries)
    if any(isinstance(k, Indexed) for k, _v in entries):
        return _prepare_indexed(name, target, entries)
    gone = any(v is DELETED for _k, v in entries)
    if isinstance(target, dict):
        keys = set(target) if gone else set()
        for k, v in entries:
            hash(k)
            if v is DELETED and k not in keys:
                raise KeyError(k)  # (serially the iteration's `del` raises)
            if v is DELETED:
                keys.discard(k)
            else:
                keys.add(k)

        def apply_dict() -> None:
            for k, v in entries:
                if v is DELETED:
                    del target[k]
                else:
                    target[k] = v

        return Mutation(name, "setitem", apply_dict)
    if gone and _is_frame(target):
        return _prepare_frame_deletes(name, target, entries)
    if gone:
        raise TypeError(
            f"`{name}` is a {type(target).__name__}: gpucell deletes an "
            "iteration's own key (`del D[k]`) only from a dict"
        )
    if isinstance(target, list):
        new = list(target)
        for k, v in entries:
            new[k] = v

        def apply_list() -> None:
            target[:] = new

        return Mutation(name, "setitem", apply_list)
    if is_numpy(target) or is_torch(target):
        conv = [(k, _check_array_write(target, k, v)) for k, v in entries]

        def apply_array() -> None:
            for k, v in conv:
                target[k] = v

        return Mutation(name, "setitem", apply_array)
    if not hasattr(target, "__setitem__"):
        raise TypeError(
            f"`{name}` is a {type(target).__name__}, which does not support item "
            f"assignment"
        )

    def apply_other() -> None:
        for k, v in entries:
            target[k] = v

    return Mutation(name, "setitem", apply_other)


def _is_frame(target: Any) -> bool:
    cls = type(target)
    return cls.__name__ == "DataFrame" and cls.__module__.startswith("pandas")


def _prepare_frame_deletes(
    name: str, target: Any, entries: list[tuple[Any, Any]]
) -> Mutation:
    """A DataFrame's own columns written and deleted (``del df[c]``), in
    iteration order; a column deleted that is not there fails the merge."""
    cols = set(target.columns)
    for k, v in entries:
        if v is DELETED and k not in cols:
            raise KeyError(k)
        if v is DELETED:
            cols.discard(k)
        else:
            cols.add(k)

    def apply_frame() -> None:
        for k, v in entries:
            if v is DELETED:
                del target[k]
            else:
                target[k] = v

    return Mutation(name, "setitem", apply_frame)


def _keys_of(rs: Sequence[ChunkResultLike], name: str) -> list[tuple[Any, Any]]:
    """The (key, partial) entries a keyed reduction of ``name`` recorded."""
    return [e for r in rs if name in r.keyed for e in r.keyed[name][1]]


def _prepare_keyed_gather(
    name: str,
    target: Any,
    runs: list[tuple[Any, list[Any]]],
    reduced: list[Any],
    new_lists: bool = False,
) -> Mutation:
    """``D[k].append(e)``: the items for each key, in iteration order, extended
    onto the list already under that key (which must exist, as serially), or
    (``new_lists``: ``D.setdefault(k, []).append(e)``) onto a new list put
    under a key missing, in the order keys were first seen."""
    groups: list[tuple[Any, list[Any]]] = []
    for key, items in runs:
        for k, acc in groups:
            if k is key or k == key:
                acc.extend(items)
                break
        else:
            groups.append((key, list(items)))
    for key, _items in groups:
        if any(key is r or key == r for r in reduced):
            raise NotParallelizable(
                f"`{name}[{key!r}]` is both reduced (`+=`) and appended to in the "
                "loop; serially the two would interleave on one object. Use separate "
                "keys (or names) for counts and lists. Nothing was merged."
            )
        if new_lists and isinstance(target, dict) and key not in target:
            continue  # (a new list: shared with no other key)
        try:
            lst = target[key]
        except (KeyError, IndexError) as e:
            raise type(e)(
                f"`{name}[{key!r}]` does not exist, so `{name}[{key!r}].append(...)` "
                "would fail serially too; create it before the loop. Nothing was "
                "merged."
            ) from None
        if any(target[k] is lst for k, _ in groups if k is not key and k != key):
            raise NotParallelizable(
                f"`{name}[{key!r}]` is the same list as another key's, so serially "
                "the appends under both keys would interleave on it. Give each key "
                "its own list before the loop. Nothing was merged."
            )
        if not hasattr(lst, "extend"):
            raise TypeError(
                f"`{name}[{key!r}]` is a {type(lst).__name__}, which has no extend(); "
                "nothing was merged."
            )

    missing = [
        key
        for key, _ in groups
        if new_lists and isinstance(target, dict) and key not in target
    ]

    def apply() -> None:
        for key, items in groups:
            if any(key is m for m in missing):
                target[key] = []
            target[key].extend(items)

    return Mutation(name, "extend", apply)


def _combine_keyed(op: str, chunks: list[list[tuple[Any, Any]]]) -> list[list[Any]]:
    """Per-key partials of all chunks, folded in chunk order, in first-seen order."""
    entries: list[list[Any]] = []
    index: dict[Any, int] = {}
    for chunk in chunks:
        for k, p in chunk:
            try:
                pos = index.get(k)
                hashable = True
            except TypeError:
                pos, hashable = None, False
            if pos is None:
                if hashable:
                    index[k] = len(entries)
                entries.append([k, own(op, p)])
            else:
                entries[pos][1] = fold(op, entries[pos][1], p)
    return entries


def _select_nans(name: str, op: str, chunks: list[list[tuple[Any, Any]]]) -> list[Any]:
    """A keyed max/min's keys whose first chunk's partial is nan (unordered).

    On an engine a nan that comes first stays (``max(nan, x)`` is nan) and
    hides what came after it in the chunk; serially it stays only where it
    is the key's first value (``if k not in D or v > D[k]``).  A nan partial
    after the first is refused here; the first is checked against the key's
    starting value by ``_prepare_keyed``."""
    if not selects(op):
        return []
    seen: list[Any] = []
    nans: list[Any] = []
    for chunk in chunks:
        for k, p in chunk:
            if unordered(p):
                if any(k == s for s in seen):
                    raise NotParallelizable(
                        f"gpucell: `{name}[{k!r}] = {op}(...)` met a nan after "
                        f"other values of the key: on its engine it hid the "
                        f"values after it, which serially still count. "
                        f"Nothing was merged."
                    )
                nans.append(k)
            seen.append(k)
    return nans


def _prepare_keyed(
    name: str,
    target: Any,
    op: str,
    entries: list[list[Any]],
    spelled: Any = None,
    once: bool = False,
    first_nan: Sequence[Any] = (),
) -> list[Mutation]:
    """``spelled`` (``analysis.spellings.Spelled``): a missing key's starting
    value (``D.get(k, 0) + e``), and whether the statements rebind
    (``D[k] = D[k] + e``: the binary operator, a new object as serially).
    ``once``: each key was stored by exactly one iteration's one statement
    (``LoopFacts.stored_once``), so an array's store is replayed as serially."""
    muts: list[Mutation] = []
    is_array = is_numpy(target) or is_torch(target)
    if is_array or isinstance(target, list):
        entries = _one_entry_per_position(name, op, target, entries)
    defaults = getattr(spelled, "defaults", {})
    rebinding = name in getattr(spelled, "rebinding", ())
    mixed = name in getattr(spelled, "mixed", ())
    first = name in getattr(spelled, "first", ())
    for k, c in entries:
        if isinstance(target, dict) and first and k not in target:
            # `if k not in D or v > D[k]: D[k] = v`: the key's first value
            muts.append(Mutation(name, f"[{k!r}] = {op}", _setter(target, k, c)))
            continue
        if any(k == n for n in first_nan) and not unordered(_base_of(target, k)):
            raise NotParallelizable(
                f"gpucell: `{name}[{k!r}] = {op}(...)` met a nan first on an "
                "engine, where it hid the values after it; serially the key's "
                "value before it keeps them. Nothing was merged."
            )
        if isinstance(target, dict):
            if k in target:
                base = target[k]
            elif name in defaults:  # (before a defaultdict's factory: get's)
                base = defaults[name]
            elif isinstance(target, defaultdict) and target.default_factory is not None:
                base = target.default_factory()
            elif isinstance(target, Counter):
                base = 0
            else:
                raise KeyError(
                    f"{k!r}: `{name}[{k!r}] {op}= ...` needs the key to exist (use a "
                    f"collections.defaultdict or Counter). Nothing was merged."
                )
        else:
            base = target[k]
        if mixed and not isinstance(base, (int, float, complex, str, bytes)):
            raise NotParallelizable(
                f"`{name}[{k!r}]` is a {type(base).__name__}, changed in place by "
                f"`{name}[k] {op}= ...` and rebound by `{name}[k] = {name}[k] {op} "
                "...` in the loop: serially the two differ for such a value. Use "
                "one form. Nothing was merged."
            )
        if (selects(op) and not (is_array and once)) or (rebinding and not is_array):
            new: Any = BINARY[op](base, c)
            action: Callable[[], Any] = _returner(new)
        elif is_array and once and not _holds_objects(target):
            new = _replay_array_store(target, k, op, c, rebinding or selects(op))
            action = _returner(new)
        elif is_array:
            new = BINARY[op](base, c)
            _refuse_a_cast_per_store(name, k, op, target, new)
            new = _check_array_write(target, k, new)
            action = _returner(new)
        else:
            new, action = _plan_inplace(f"{name}[{k!r}]", base, op, c)

        def apply(k: Any = k, action: Callable[[], Any] = action) -> None:
            target[k] = action()

        muts.append(Mutation(name, f"[{k!r}] {op}=", apply))
    return muts


def _prepare_ufunc_at(
    name: str, target: Any, calls: list[tuple[Any, tuple[Any, ...]]]
) -> Mutation:
    """``np.add.at(D, idx, w)`` per iteration: the engines gathered the ufunc
    and its arguments; replayed here in iteration order on a copy (what
    fails, fails before anything changes), then copied into ``D`` itself, so
    a float sum is the serial one bit for bit."""
    if not is_numpy(target) or not hasattr(target, "shape"):
        raise TypeError(
            f"`{name}` is a {type(target).__name__}: a ufunc's `.at` writes "
            "into numpy arrays only. Nothing was merged."
        )
    trial = target.copy()
    for ufunc, args in calls:
        if type(ufunc).__name__ != "ufunc" or not is_numpy(trial):
            raise NotParallelizable(
                f"gpucell: `{name}` was given to `{ufunc!r}.at`, which is not "
                "a numpy ufunc's: its effect cannot be replayed. Nothing was "
                "merged."
            )
        ufunc.at(trial, *args)

    def apply() -> None:
        target[...] = trial

    return Mutation(name, "ufunc.at", apply)


def _prepare_frame_rows(
    name: str, target: Any, rows: list[tuple[Any, list[tuple[str, Any, str]]]]
) -> Mutation:
    """``df.loc[i, c] = ...`` read back in the iteration: each ran on a
    private copy of its row (``core/framerows.py``); its written cells are
    stored into the frame in iteration order, on a copy first.  A column
    whose type an iteration's copy changed (or that two iterations' new
    column got differently) is refused: serially the later iterations would
    have read the frame's changed column."""
    columns = getattr(target, "columns", None)
    if columns is None or not hasattr(target, "loc"):
        raise TypeError(
            f"`{name}` is a {type(target).__name__}, not a DataFrame. Nothing "
            "was merged."
        )
    types: dict[str, str] = {}
    for _label, cells in rows:
        for c, _v, dtype in cells:
            before = str(target[c].dtype) if c in columns else None
            first = types.setdefault(c, before or dtype)
            if dtype != first:
                raise NotParallelizable(
                    f"gpucell: `{name}[{c!r}]` holds {first} values, and an "
                    f"iteration stored a value that made its own row's column "
                    f"{dtype}: serially the iterations after it read the "
                    "changed column. Nothing was merged; give the column its "
                    f"type before the loop (`{name}[{c!r}] = ...`)."
                )

    def store(frame: Any) -> None:
        loc = frame.loc
        for label, cells in rows:
            for c, v, _dtype in cells:
                loc[label, c] = v

    store(target.copy())
    return Mutation(name, "own rows", lambda: store(target))


def _setter(target: Any, k: Any, value: Any) -> Callable[[], None]:
    def apply() -> None:
        target[k] = value

    return apply


def _base_of(target: Any, k: Any) -> Any:
    """The value under ``k`` before the merge (None where there is none)."""
    try:
        return target[k] if not isinstance(target, dict) or k in target else None
    except Exception:
        return None


def _replay(target: Any, ops: list[tuple[str, Any]]) -> None:
    for kind, payload in ops:
        if kind == "add":
            for x in payload:
                target.add(x)
        else:
            target.update(payload)


def _prepare_union(name: str, target: Any, ops: list[tuple[str, Any]]) -> Mutation:
    if isinstance(target, set):
        # added one by one, first seen first, as serially: a set's iteration
        # order follows its insertion history, table resizes included
        # (`list(vocab)` after the loop; `update` would presize the table)
        items: dict[Any, None] = {}
        for _kind, payload in ops:
            items.update(dict.fromkeys(payload))

        def add_each() -> None:
            add = target.add
            for x in items:
                add(x)

        return Mutation(name, "update", add_each)
    trial = copy.copy(target)
    _replay(trial, ops)
    return Mutation(name, "replay", lambda: _replay(target, ops))


def merge(
    plan: Any,
    results: Iterable[ChunkResultLike],
    namespace: MutableMapping[str, Any],
) -> PreparedUpdate:
    """``prepare`` then ``commit`` into ``namespace`` (for tests and local runs)."""
    view = {n: namespace[n] for n in plan.affected_names if n in namespace}
    up = prepare(plan, results, view)
    up.commit(namespace)
    return up


def closed_file(desc: dict[str, Any]) -> Any:
    """A closed file object like the one an engine's loop left (``with open(p)
    as f:`` in the body leaves ``f`` closed): same type, name, mode and
    encoding, over no file (built in memory: nothing on disk is touched)."""
    raw: Any = io.BytesIO()
    name, mode = desc.get("name"), desc.get("mode")
    if name is not None:
        raw.name = name
    kind = str(desc.get("kind"))
    inner = str(desc.get("buffer", kind))
    buffered: Any = {
        "writer": io.BufferedWriter,
        "random": io.BufferedRandom,
    }.get(inner, io.BufferedReader)(raw)
    if mode is not None:
        raw.mode = mode
    out: Any = buffered
    if kind == "text":
        out = io.TextIOWrapper(
            buffered,
            encoding=desc.get("encoding"),
            errors=desc.get("errors"),
            newline=None,
        )
        if mode is not None:
            out.mode = mode
    out.close()
    return out
