"""Inputs that are (or hold, or share memory with) what the loop changes.

The analysis sees names, not objects: ``y = out`` in an earlier cell makes ``y``
and ``out`` one list.  A loop that appends to ``out`` and reads ``y`` sees,
serially, what earlier iterations appended; on an engine ``y`` is a copy from
before the loop, so the numbers would differ without a word.  The same holds
for a view ``v = a[2:]`` of an array the loop writes, ``torch.from_numpy(a)``,
or a dict holding the list.  The kernel checks the objects before anything runs
and refuses such a loop, naming both names.

Pure: objects in, findings out; numpy and torch are recognised without being
imported.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from gpucell.protocol.fold import is_numpy, is_torch

__all__ = [
    "Shared",
    "first_mutable_element",
    "first_shared_element",
    "shared_with_sinks",
]

#: containers bigger than this are not searched item by item (the check must
#: stay cheap beside a loop; a miss here is a missed refusal, never a wrong one)
MAX_ITEMS = 100_000

_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), range, frozenset)


class Shared(NamedTuple):
    """``input`` reaches ``sink`` (which the loop changes) ``how``."""

    input: str
    sink: str
    how: str


def _mutable(value: Any) -> bool:
    if isinstance(value, type):  # a class is an input like a function
        return False
    return not isinstance(value, _IMMUTABLE) and not (
        isinstance(value, tuple) and all(isinstance(v, _IMMUTABLE) for v in value)
    )


def _children(value: Any) -> Iterator[tuple[str, Any]]:
    """One level of what ``value`` holds: items of builtin containers and the
    attributes of an instance of a user class."""
    if isinstance(value, dict):
        if len(value) <= MAX_ITEMS:
            for k, v in value.items():
                yield f"[{k!r}]", v
        return
    if isinstance(value, (list, tuple)):
        if len(value) <= MAX_ITEMS:
            for i, v in enumerate(value):
                yield f"[{i}]", v
        return
    if isinstance(value, (set, frozenset)) or is_numpy(value) or is_torch(value):
        return
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict) and not isinstance(value, type):
        if type(value).__module__ in ("builtins",) or callable(value):
            return
        if len(attrs) <= MAX_ITEMS:
            for k, v in attrs.items():
                yield f".{k}", v


def _span(value: Any) -> tuple[str, int, int] | None:
    """(device, first byte, end byte) of an array's or tensor's memory."""
    if is_numpy(value):
        import numpy as np

        if value.size == 0:
            return None
        utils = getattr(np.lib, "array_utils", np)  # numpy 2 moved it
        lo, hi = utils.byte_bounds(value)
        return ("cpu", int(lo), int(hi))
    if is_torch(value):
        try:
            storage = value.untyped_storage()
            start = int(storage.data_ptr())
            size = int(storage.nbytes())
        except Exception:  # a meta or sparse tensor: nothing to compare
            return None
        if size == 0:
            return None
        return (str(value.device), start, start + size)
    return None


def _overlap(a: Any, b: Any) -> bool:
    sa, sb = _span(a), _span(b)
    if sa is None or sb is None or sa[0] != sb[0]:
        return False
    if not (sa[1] < sb[2] and sb[1] < sa[2]):
        return False
    if is_numpy(a) and is_numpy(b):
        import numpy as np

        try:  # exact for two arrays (strided halves of one buffer do not share)
            shares: Any = np.shares_memory  # numpy types max_work as -1 or 0 only
            return bool(shares(a, b, max_work=100_000))
        except Exception:  # numpy's TooHardError: too costly to decide
            return True
    return True


def shared_with_sinks(
    sinks: Mapping[str, Any],
    inputs: Mapping[str, Any],
    deep_sinks: frozenset[str] = frozenset(),
) -> list[Shared]:
    """Every input that is a sink, holds one (one level down), or shares its
    memory; for ``deep_sinks`` (whose elements the loop changes in place) also
    an input that is one of the sink's elements."""
    found: list[Shared] = []
    targets = {n: v for n, v in sinks.items() if _mutable(v)}
    if not targets:
        return found
    by_id = {id(v): n for n, v in targets.items()}
    element_of: dict[int, tuple[str, str]] = {}
    for n in deep_sinks:
        if n in targets:
            for where, child in _children(targets[n]):
                if _mutable(child):
                    element_of.setdefault(id(child), (n, where))
    buffers = {n: v for n, v in targets.items() if _span(v) is not None}
    for name, value in inputs.items():
        sink = by_id.get(id(value))
        if sink is not None and sink != name:
            found.append(Shared(name, sink, "is the same object as"))
            continue
        if id(value) in element_of:
            sink, where = element_of[id(value)]
            if sink != name:
                found.append(Shared(name, sink, f"is `{sink}{where}`, an element of"))
                continue
        hit = None
        for where, child in _children(value):
            sink = by_id.get(id(child))
            if sink is not None and sink != name:
                hit = Shared(name, sink, f"holds (as `{name}{where}`)")
                break
        if hit is None:
            for sink, buf in buffers.items():
                if sink != name and _overlap(value, buf):
                    hit = Shared(name, sink, "shares memory with")
                    break
        if hit is not None:
            found.append(hit)
    return found


def first_shared_element(container: Any) -> tuple[Any, Any] | None:
    """Two keys of ``container`` whose values are one mutable object (rows
    made by ``[[0] * m] * n``), or ``None``."""
    seen: dict[int, Any] = {}
    for key, value in _items(container):
        if _mutable(value):
            other = seen.setdefault(id(value), key)
            if other is not key:
                return other, key
    return None


def first_mutable_element(container: Any) -> Any:
    """The first key of ``container`` whose value is a mutable object, or
    ``None``."""
    for key, value in _items(container):
        if _mutable(value) and not _is_scalar(value):
            return key
    return None


def _items(container: Any) -> Iterator[tuple[Any, Any]]:
    if isinstance(container, dict):
        yield from container.items()
    elif isinstance(container, list):
        yield from enumerate(container)


def _is_scalar(value: Any) -> bool:
    """numpy and torch scalars (0-d) behave as values."""
    return (is_numpy(value) or is_torch(value)) and getattr(value, "ndim", 1) == 0
