"""Who else would see a changed item: refused where an input, another item or
another changed item is, holds, or shares memory with what an iteration
changed in place (an item, a module's part, an attribute it replaced), since
serially the change is seen there and each engine changed its own copy.
The search is bounded (``_REACH_MAX`` objects): past it, refused, never
guessed.  torch is recognised, never imported.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import itertools
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gpucell.core.writeback_target import Target
from gpucell.errors import NotParallelizable

__all__ = [
    "bit_generator",
    "check_memory",
    "check_module_parts",
    "check_reach",
    "memory_span",
]


def check_module_parts(
    targets: list[Target],
    inputs: Mapping[str, Any],
    others: Sequence[tuple[str, Any]],
) -> None:
    """No two changed modules may share a part, and no input or other item may
    be or hold one: serially the change (a step, an accumulated gradient, a
    running statistic) is made to the one shared object and seen by all of its
    holders; each engine changed its own copy, and the last write-back would
    win."""
    parts: dict[int, tuple[Target, str]] = {}
    for t in targets:
        for what, x in _module_parts(t.obj):
            prior = parts.setdefault(id(x), (t, what))
            if prior[0].obj is not t.obj:
                raise NotParallelizable(
                    f"gpucell: {prior[0].label} and {t.label} share one object "
                    f"(its {prior[1]}, their {what}), and both changed it in "
                    "place: serially each iteration's change would be made to "
                    "that one object and seen by the other; each engine changed "
                    "its own copy. Nothing was merged. Give each item its own "
                    f"{_own(what)} (`copy.deepcopy`), or run the cell serially."
                )
    if not parts:
        return
    budget = [_REACH_MAX]
    looked = [(_input_label(n, v), v) for n, v in inputs.items()] + list(others)
    for holder, value in looked:
        for x in _reachable(value, budget):
            hit = parts.get(id(x))
            if hit is not None:
                t, what = hit
                raise NotParallelizable(
                    f"gpucell: {t.label} changed in place, and {holder} is or "
                    f"holds its {what}: serially the change would be seen there "
                    "too; each engine changed its own copy. Nothing was merged. "
                    f"Give each item its own {_own(what)} (`copy.deepcopy`), or "
                    "run the cell serially."
                )


def _module_parts(obj: Any) -> list[tuple[str, Any]]:
    """A torch module's submodules, parameters and buffers, by name, or a
    numpy generator's bit generator: what its write-back writes into, which
    another item may hold too (a shared encoder, a tied weight, two
    ``Generator``s of one bit generator)."""
    bits = bit_generator(obj)
    if bits is not None:
        return [("bit generator", bits)]
    if not callable(getattr(obj, "named_modules", None)):
        return []
    try:
        return [
            *((f"submodule `{n}`", m) for n, m in obj.named_modules() if n),
            *((f"parameter `{n}`", p) for n, p in obj.named_parameters()),
            *((f"buffer `{n}`", b) for n, b in obj.named_buffers() if b is not None),
        ]
    except Exception:
        return []


def _own(part: str) -> str:
    if part == "bit generator":
        return "generator (`np.random.default_rng(seed)` for each)"
    return "modules and parameters"


def check_reach(
    targets: list[Target],
    inputs: Mapping[str, Any],
    others: Sequence[tuple[str, Any]] = (),
) -> None:
    """No input and no other item may be or hold a changed item, nor a mutable
    attribute the iteration replaced (serially other iterations would see the
    change through it)."""
    changed = {id(t.obj): t for t in targets}
    # attributes changed in place (not rebound): serially the change is in
    # the attribute's object, which other holders see; here it is replaced
    replaced: dict[int, tuple[Target, str]] = {}
    for t in targets:
        old = _attrs_old(t)
        for n in _inplace(t):
            if n in old and _mutable(old[n]):
                replaced[id(old[n])] = (t, n)
    budget = [_REACH_MAX]
    looked: list[tuple[str, Target | None, Iterator[Any]]] = [
        (_input_label(n, v), None, _reachable(v, budget)) for n, v in inputs.items()
    ]
    looked += [(what, None, _reachable(v, budget)) for what, v in others]
    looked += [
        (
            t.label,
            t,
            (y for x in _children(t.obj) for y in _reachable(x, budget, 2)),
        )
        for t in targets
    ]
    for what, by, seen in looked:
        holder = None if by is None else by.obj
        first = True
        for x in seen:
            hit = changed.get(id(x))
            if hit is not None and by is not None and hit.within(by):
                continue  # its own element: written back with it
            if (
                hit is not None
                and by is not None
                and by.update[0] == "torchstate"
                and hit.iteration == by.iteration
            ):
                continue  # (a scheduler's optimizer: loaded, never replaced)
            if hit is not None and hit.obj is not holder:
                raise NotParallelizable(
                    f"gpucell: {hit.label} changed in place, and {what} "
                    f"{'is' if first and holder is None else 'holds'} it: "
                    "serially other "
                    "iterations would see the change through it, each engine "
                    "changed its own copy. Nothing was merged. Give each "
                    "iteration an object nothing else refers to."
                )
            first = False
            shared = replaced.get(id(x))
            if shared is not None and shared[0].obj is not holder:
                t, n = shared
                raise NotParallelizable(
                    f"gpucell: {t.label} changed its attribute `{n}`, which "
                    f"{what} holds too: serially the change would be seen "
                    "there as well. Nothing was merged. Give each item its own "
                    f"`{n}` (`copy.deepcopy`), or run the cell serially."
                )


def _attrs_old(t: Target) -> dict[str, Any]:
    """A changed object's attributes as the kernel holds them (before)."""
    kind = t.update[0]
    if kind == "attrs":
        return dict(vars(t.obj))
    if kind == "slots":
        return {n: getattr(t.obj, n) for n in t.update[1] if hasattr(t.obj, n)}
    if kind == "module":
        return {
            n: getattr(t.obj, n) for n in t.update[1]["attrs"][0] if n in vars(t.obj)
        }
    if kind in ("dict", "list") and len(t.update) > 3:
        return dict(vars(t.obj))
    return {}


def _inplace(t: Target) -> list[str]:
    kind = t.update[0]
    if kind in ("attrs", "slots"):
        return list(t.update[3])
    if kind == "module":
        return list(t.update[1]["attrs"][2])
    if kind in ("dict", "list") and len(t.update) > 3:
        return list(t.update[3][2])
    return []


def _input_label(name: str, value: Any) -> str:
    if isinstance(value, (types.FunctionType, types.MethodType)):
        return f"what `{name}` reads (its globals, closure or defaults)"
    return f"`{name}`"


def check_memory(
    targets: list[Target],
    inputs: Mapping[str, Any],
    others: Sequence[tuple[str, Any]],
) -> None:
    """No other item and no input may share memory with a changed array or
    tensor (a view of it, or of what it is a view of: ``for row in P`` while
    the body reads ``P``); serially the change would be seen there."""
    spans = sorted(
        ((s, t) for t in targets if (s := memory_span(t.obj)) is not None),
        key=lambda st: st[0],
    )
    if not spans:
        return
    for (a, t), (b, u) in zip(spans, spans[1:], strict=False):
        if b[0] < a[1]:  # two changed windows overlap
            _shares(t, u.label)
    # disjoint and sorted: the first whose end is past a span's start is the
    # only one that could overlap it first
    ends = [hi for (_lo, hi), _t in spans]
    mine = {id(t.obj) for t in targets}
    budget = [_REACH_MAX]
    candidates = [(_input_label(n, v), v) for n, v in inputs.items()]
    candidates += list(others)
    for what, v in candidates:
        for x in _reachable(v, budget):
            span = memory_span(x) if id(x) not in mine else None
            if span is None:
                continue
            j = bisect.bisect_right(ends, span[0])
            if j < len(spans) and spans[j][0][0] < span[1]:
                _shares(spans[j][1], what)


def memory_span(x: Any) -> tuple[int, int] | None:
    """The bytes an array, tensor or bytearray covers in memory, ``[lo, hi)``."""
    try:
        if type(x) is bytearray:
            if not x:
                return None
            # (the ctypes view is an export only while it lives: here)
            ptr = ctypes.addressof((ctypes.c_char * len(x)).from_buffer(x))
            return ptr, ptr + len(x)
        if type(x).__name__ == "ndarray" and hasattr(x, "__array_interface__"):
            face = x.__array_interface__
            ptr, shape = face["data"][0], x.shape
            strides, size = x.strides, x.itemsize
        elif type(x).__name__ in ("Tensor", "Parameter") and hasattr(x, "data_ptr"):
            if str(x.layout) != "torch.strided":
                return None
            ptr, shape = x.data_ptr(), tuple(x.shape)
            size = x.element_size()
            strides = tuple(st * size for st in x.stride())
        else:
            return None
    except Exception:
        return None
    if any(n == 0 for n in shape):
        return None
    lo = ptr + sum(min(0, (n - 1) * st) for n, st in zip(shape, strides, strict=True))
    hi = ptr + sum(max(0, (n - 1) * st) for n, st in zip(shape, strides, strict=True))
    return lo, hi + size


def _shares(t: Target, what: str) -> None:
    raise NotParallelizable(
        f"gpucell: {t.label} changed in place, and {what} "
        "shares its memory (a view of it, or of the same "
        "array): serially other iterations would see the "
        "change there, each engine changed its own copy. "
        "Nothing was merged. Change a copy (`x = x.copy()`) "
        "and collect it, or run the cell serially."
    )


#: objects looked at (through containers and attributes) when checking who
#: holds a changed item, at most: past it the check refuses, never guesses
_REACH_MAX = 2_000_000


def _reachable(
    value: Any, budget: list[int], depth: int = 3, seen: set[int] | None = None
) -> Iterator[Any]:
    """``value`` and what it holds, ``depth`` levels down (elements, dict
    values, instance attributes; a notebook function's globals and closure,
    each function once); arrays, tensors and frames are leaves."""
    yield value
    seen = set() if seen is None else seen
    if isinstance(value, (types.FunctionType, types.MethodType)):
        if id(value) not in seen:
            seen.add(id(value))
            for x in _uses(value):
                budget[0] -= 1
                yield from _reachable(x, budget, max(depth, 1), seen)
        return
    if depth <= 0 or not _mutable(value):
        return
    for x in _children(value):
        budget[0] -= 1
        if budget[0] < 0:
            raise NotParallelizable(
                "gpucell: the loop changed its own items, and the objects the "
                "loop reads are too many to check that none of them holds an "
                "item (a serial run would see the change through it). Nothing "
                "was merged. Run the cell serially."
            )
        if _mutable(x) or isinstance(x, types.FunctionType):
            yield from _reachable(x, budget, depth - 1, seen)


def _uses(fn: Any) -> list[Any]:
    """What a notebook function reads when called: the globals its code
    names, its closure, its defaults (a helper reading `P` while the loop
    changes `P`'s rows is reading an input)."""
    if isinstance(fn, types.MethodType):
        return [fn.__self__, *_uses(fn.__func__)]
    if not isinstance(fn, types.FunctionType) or fn.__module__ != "__main__":
        return []
    g = fn.__globals__
    out = [g[n] for n in sorted(_code_names(fn.__code__)) if n in g]
    for cell in fn.__closure__ or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    return out + list(fn.__defaults__ or ())


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


#: elements of a container looked at for references, at most
_CHILDREN_MAX = 100_000


def _children(value: Any) -> Iterator[Any]:
    """What ``value`` holds one level down: elements, dict values, instance
    attributes."""
    if isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        items: Any = value
    elif bit_generator(value) is not None:
        items = [bit_generator(value)]
    elif isinstance(value, dict):
        items = value.values()
    elif not isinstance(value, (type, types.ModuleType)) and isinstance(
        getattr(value, "__dict__", None), dict
    ):
        items = vars(value).values()
    else:
        return
    attrs = getattr(value, "__dict__", None)
    if isinstance(value, (list, tuple, set, frozenset, dict)) and isinstance(
        attrs, dict
    ):  # a subclass of a container: its attributes too (`Batch(list).log`)
        items = itertools.chain(items, list(attrs.values()))
    for n, x in enumerate(items):
        if n >= _CHILDREN_MAX:
            return
        yield x


def _mutable(v: Any) -> bool:
    return not isinstance(
        v,
        (type(None), bool, int, float, complex, str, bytes, range, tuple, type)
        + (types.ModuleType, types.FunctionType, types.BuiltinFunctionType),
    )


def bit_generator(obj: Any) -> Any:
    """A numpy ``Generator``'s or ``RandomState``'s bit generator (what two
    generators may share), or ``None``."""
    name = type(obj).__name__
    if name == "Generator" and type(obj).__module__.startswith("numpy"):
        return getattr(obj, "bit_generator", None)
    if name == "RandomState" and type(obj).__module__.startswith("numpy"):
        return getattr(obj, "_bit_generator", None)
    return None
