"""Receives the rewritten loop body's contributions on an engine
(``__gpucell_rec__``): gathers, writes, reductions, keyed folds, unions, the
loop-locals' last values, into a plain, picklable :class:`ChunkResult`.

Imported on every engine: the standard library (and torch, lazily, when the
program uses the engine's device).
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable, Mapping
from numbers import Number
from types import ModuleType
from typing import Any

from gpucell.engine.where import Where
from gpucell.protocol.chunks import ChunkResult
from gpucell.protocol.fold import (
    SELECTS,
    fold,
    is_numpy,
    is_torch,
    own,
    own_in_order,
    unordered,
)
from gpucell.protocol.program import (
    AS_DEVICE,
    BEGIN,
    DEVICE,
    ITEM_ERROR,
    NATIVE_REDUCTIONS,
    NOW,
    Indexed,
    ItemError,
    Row,
    gather_name,
    is_cuda_device,
    partial_name,
)

__all__ = ["Recorder", "as_device", "private_copy", "resolve_device"]

_MISSING = object()


class _Start:
    """A chunk partial before its first contribution: ``p op= e`` on it gives
    the recorder's private copy of ``e`` (:func:`own`); from then on the
    operator folds the partial as the merge would (lists and sets in place,
    numbers out of place), with no recorder call per iteration."""

    __slots__ = ("op",)

    def __init__(self, op: str) -> None:
        self.op = op

    def _first(self, value: Any) -> Any:
        return own_in_order(self.op, value)

    __iadd__ = __imul__ = __ior__ = __iand__ = __ixor__ = _first


def private_copy(row: Any) -> Any:
    """A copy of a row the iteration may write without touching the original:
    one level deep (its writes are one level deep), writable even when the
    shipped input is read-only."""
    if is_numpy(row):
        return row.copy()
    if is_torch(row):
        return row.clone()
    if type(row) in (list, dict, set, bytearray):
        return type(row)(row)
    return copy.copy(row)


def resolve_device(device: Any = None) -> Any:
    """The value of ``__gpucell_device__``: a ``torch.device`` when torch exists."""
    try:
        import torch
    except ImportError:
        return device or "cpu"
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def as_device(target: Any, value: Any) -> Any:
    """``target`` for a CUDA device held in a value (``"cuda"``, ``"cuda:1"``, a
    ``torch.device``); anything else (a dtype, a tensor, ``"cpu"``) unchanged.
    CPU engines standing in for GPUs call it where the cell passes a device."""
    return target if is_cuda_device(value) else value


class Recorder:
    """Receives the rewritten body's contributions (``__gpucell_rec__``).

    Never touches the shipped inputs: every contribution goes to this object.
    """

    def __init__(
        self,
        ns: dict[str, Any],
        start: int,
        *,
        seed_fn: Callable[[int], Any] | None = None,
        device: Any = None,
        stamps: dict[int, float] | None = None,
        to_host: Any = None,
        where: Where | None = None,
    ) -> None:
        self.ns = ns
        # GPU engines: starts each recorded value's copy to the host at once
        # (gpucell.engine.tohost.HostCopier); None records values as they are
        self.to_host = to_host
        self.result = ChunkResult(start=start)
        self.seed_fn = seed_fn
        self.device = device
        # iteration index -> wall-clock start: provenance, and which iteration
        # is running (the last key) for output tags and error reports
        self.stamps: dict[int, float] = {} if stamps is None else stamps
        self.where = where if where is not None else Where(self.stamps, start)
        self.locals: tuple[str, ...] = ()
        self.red_ops: dict[str, str] = {}
        self.keyed_ops: dict[str, str] = {}
        self._partials: dict[str, Any] = {}
        self._unhashable_keys: dict[int, list[Any]] = {}
        self._keyed: dict[str, list[list[Any]]] = {}
        self._keyed_index: dict[str, dict[Any, int]] = {}
        self._deleted: set[str] = set()
        self._per_iteration_end = False
        self.suppressed: BaseException | None = None

    @property
    def current(self) -> int | None:
        """The iteration running (or that ran last)."""
        return self.where.current()

    # -- called by the program ---------------------------------------------------

    def setup(self, spec: Mapping[str, Any]) -> None:
        """Bind what the program calls per iteration to the cheapest callables.

        The common case costs no Python frame per iteration: ``begin`` is the
        stamps dict's ``__setitem__`` and each gather its list's ``append``.
        """
        ns = self.ns
        self.locals = tuple(spec.get("locals", ()))
        self.red_ops = dict(spec.get("reductions", {}))
        self.keyed_ops = dict(spec.get("keyed", {}))
        self._per_iteration_end = bool(spec.get("end", True))
        if spec.get("device"):
            target = resolve_device(self.device)
            ns[DEVICE] = target
            ns[AS_DEVICE] = functools.partial(as_device, target)
        ns[NOW] = time.time
        ns[ITEM_ERROR] = ItemError
        for name, op in self.red_ops.items():
            if op in NATIVE_REDUCTIONS:  # folded by ``p op= e`` in the program
                ns[partial_name(name)] = _Start(op)
        stamp, seed = self.stamps.__setitem__, self.seed_fn
        if seed is None:
            ns[BEGIN] = stamp
        else:

            def begin(index: int, t: float) -> None:
                stamp(index, t)
                seed(index)

            ns[BEGIN] = begin
        gathers = self.result.gathers
        to_host = self.to_host
        for name in spec.get("gathers", ()):
            add = gathers.setdefault(name, []).append
            if to_host is None:
                ns[gather_name(name)] = add
            else:
                ns[gather_name(name)] = lambda v, add=add: add(to_host(v))

    def end(self, index: int) -> None:
        ns, last = self.ns, self.result.last_values
        for name in self.locals:
            value = ns.pop(name, _MISSING)
            if value is not _MISSING:
                if isinstance(value, ModuleType):
                    last[name] = (index, "module", value.__name__)
                else:
                    last[name] = (index, "value", value)
            elif name in self._deleted:
                last[name] = (index, "deleted", None)
        self._deleted.clear()
        self.result.count += 1

    def raised(self, exc: BaseException) -> None:
        """The loop raised inside a ``with`` around it (which may swallow it)."""
        self.suppressed = exc

    def deleted(self, names: tuple[str, ...]) -> None:
        self._deleted.update(names)

    def append(self, name: str, value: Any) -> None:
        if self.to_host is not None:
            value = self.to_host(value)
        self.result.gathers.setdefault(name, []).append(value)

    def extend(self, name: str, values: Any) -> None:
        if self.to_host is not None:
            values = [self.to_host(v) for v in values]
        self.result.gathers.setdefault(name, []).extend(values)

    def setitem(self, value: Any, name: str, key: Any) -> None:
        if self.to_host is not None:
            value = self.to_host(value)
        self.result.writes.setdefault(name, []).append((key, value))

    def keyed_append(self, name: str, key: Any, value: Any) -> None:
        self.keyed_extend(name, key, [value])

    def keyed_extend(self, name: str, key: Any, values: Any) -> None:
        if self.to_host is not None:
            values = [self.to_host(v) for v in values]
        runs = self.result.keyed_gathers.setdefault(name, [])
        if runs and runs[-1][0] is key:
            runs[-1][1].extend(values)
        else:
            runs.append((key, list(values)))

    def setindexed(self, value: Any, name: str, accessor: str, key: Any) -> None:
        if self.to_host is not None:
            value = self.to_host(value)
        self.result.writes.setdefault(name, []).append((Indexed(accessor, key), value))

    def own_copy(self, seq: Any, index: Any) -> Any:
        """The iteration's private copy of its row ``seq[index]``: its reads see
        its own writes (as serially) while the shipped input stays as it was.
        A row that does not exist yet (a dict's new key) starts as missing."""
        try:
            row = seq[index]
        except (KeyError, IndexError):
            return _MISSING
        return private_copy(row)

    def touch(self, keys: dict[Any, None], key: Any) -> None:
        try:
            keys[key] = None
        except TypeError:  # a slice or a list of positions: kept, in order
            self._unhashable_keys.setdefault(id(keys), []).append(key)

    def own_done(self, name: str, index: Any, row: Any, written: Any) -> None:
        """Record what the iteration wrote in its row: the final value of each
        key it wrote (``written``: the keys), or the whole element (``True``)."""
        if written is True:
            if row is not _MISSING:
                self.setitem(row, name, index)
            return
        if not written and id(written) not in self._unhashable_keys:
            return
        keys = [*written, *self._unhashable_keys.pop(id(written), ())]
        out = self.result.writes.setdefault(name, [])
        for key in keys:
            value = row[key]
            if self.to_host is not None:
                value = self.to_host(value)
            out.append((Row(index, key), value))

    def reduce(self, name: str, value: Any) -> None:
        op = self.red_ops[name]
        if op in SELECTS and unordered(value):
            # ``acc = max(acc, nan)`` keeps ``acc`` (nan > acc is false), and
            # an ``acc`` that is nan stays nan whatever comes: serially a nan
            # contribution never changes the result, but as a chunk's first
            # value it would become the chunk's partial and hide the rest
            return
        cur = self._partials.get(name, _MISSING)
        if cur is _MISSING:
            self._partials[name] = own_in_order(op, value)
        else:
            self._partials[name] = fold(op, cur, value)

    def keyed(self, name: str, key: Any, value: Any) -> None:
        op = self.keyed_ops[name]
        entries = self._keyed.setdefault(name, [])
        index = self._keyed_index.setdefault(name, {})
        try:
            pos = index.get(key)
            hashable = True
        except TypeError:  # unhashable keys (slices, lists) stay separate, in order
            pos, hashable = None, False
        if pos is None:
            if hashable:
                index[key] = len(entries)
            entries.append([key, own(op, value)])
        else:
            entries[pos][1] = fold(op, entries[pos][1], value)

    def add(self, name: str, value: Any) -> None:
        ops = self.result.unions.setdefault(name, [])
        if ops and ops[-1][0] == "add":
            ops[-1][1].append(value)
        else:
            ops.append(("add", [value]))

    def update(self, name: str, *args: Any) -> None:
        ops = self.result.unions.setdefault(name, [])
        for a in args:
            if isinstance(a, Number):  # `bar.update(1)`: a progress bar's step
                ops.append(("update", a))
            else:
                ops.append(("update", dict(a) if isinstance(a, Mapping) else list(a)))

    # -- called by run_chunk ---------------------------------------------------

    def finish(self) -> ChunkResult:
        r = self.result
        if not self._per_iteration_end:
            # Locals were not popped after each iteration (nothing deletes
            # them), so the namespace holds each one's last value in this chunk,
            # exactly as a serial run would; merge only compares chunks, so the
            # chunk's last index orders them.
            r.count = self.where.done()
            last_index = self.where.current()
            if last_index is None:
                last_index = r.start
            ns, last = self.ns, r.last_values
            for name in self.locals:
                value = ns.get(name, _MISSING)
                if value is _MISSING:
                    continue
                if isinstance(value, ModuleType):
                    last[name] = (last_index, "module", value.__name__)
                else:
                    last[name] = (last_index, "value", value)
        for name, op in self.red_ops.items():
            if op in NATIVE_REDUCTIONS:
                p = self.ns.get(partial_name(name), _MISSING)
                if p is not _MISSING and not isinstance(p, _Start):
                    self._partials[name] = p
        for name, partial in self._partials.items():
            r.reductions[name] = (self.red_ops[name], partial)
        for name, entries in self._keyed.items():
            r.keyed[name] = (self.keyed_ops[name], [(k, p) for k, p in entries])
        move = self.to_host
        if move is not None:
            # what is only known at the end goes now, then every copy is awaited
            r.reductions = {k: (op, move(v)) for k, (op, v) in r.reductions.items()}
            r.keyed = {
                k: (op, [(key, move(p)) for key, p in es])
                for k, (op, es) in r.keyed.items()
            }
            r.last_values = {
                k: (i, kind, move(v) if kind == "value" else v)
                for k, (i, kind, v) in r.last_values.items()
            }
            r.unions = {
                k: [(op, move(x)) for op, x in ops] for k, ops in r.unions.items()
            }
            move.wait()
        return r
