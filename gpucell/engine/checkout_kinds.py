"""What an own item's leaf is, for writing it back: its *kind* (``"module"``,
``"dict"``, ``"iterator"``, ``"object"``...: one per way the kernel applies a
change, listed in ``engine/checkout.py``), or ``""`` where a change to it
cannot be written back, and the attributes that are all of an object's state.
Standard library only.
"""

from __future__ import annotations

import collections
import copyreg
import random
import types
from typing import Any

from gpucell.engine import checkin
from gpucell.protocol.fold import is_numpy
from gpucell.protocol.globalrng import global_generator

__all__ = [
    "VALUES",
    "VALUE_TYPES",
    "attributes_of",
    "iterator_position",
    "kind_of",
    "rng_state",
]


#: values nothing changes in place: never a leaf to write back
VALUES = (type(None), bool, int, float, complex, str, bytes, range)
VALUE_TYPES = frozenset(VALUES)


def kind_of(obj: Any) -> str:
    if isinstance(obj, (type, types.ModuleType, types.FunctionType) + VALUES):
        return ""
    if checkin._is_module(obj):
        return "module"
    if checkin._is_tensor(obj):
        return "tensor"
    torch_kind = _torch_state_kind(obj)
    if torch_kind:
        return torch_kind
    if is_numpy(obj):
        plain = not checkin._is_numpy_scalar(obj) and not obj.dtype.hasobject
        return "array" if plain else ""
    t = type(obj)
    if t.__module__.startswith("pandas") and t.__name__ in ("DataFrame", "Series"):
        return "frame"
    if isinstance(obj, dict) and t.__module__ in ("builtins", "collections"):
        return "dict"
    if isinstance(obj, list) and t.__module__ == "builtins":
        return "list"
    if isinstance(obj, (dict, list)) and _plain_subclass(obj):
        return "udict" if isinstance(obj, dict) else "ulist"
    special = _stdlib_kind(obj)
    if special is not None:
        return special
    if isinstance(obj, (set, tuple, frozenset)) or t.__module__ == "builtins":
        return ""
    if isinstance(getattr(obj, "__dict__", None), dict):
        return "object" if _attributes_are_state(obj) else ""
    if _slot_names(obj):
        return "slots" if _attributes_are_state(obj) else ""
    return ""


#: numpy's generators, by (module, class): their state is their bit
#: generator's, read and set through these
_NUMPY_RNG = {
    ("numpy.random._generator", "Generator"): "generator",
    ("numpy.random.mtrand", "RandomState"): "randomstate",
}


#: what a subclass of dict or list may not define for its elements to be
#: written back by dict's and list's own stores (they would run again)
_MUTATORS = frozenset(
    "__setitem__ __delitem__ __iadd__ __imul__ clear update setdefault pop "
    "popitem append extend insert remove sort reverse __setattr__ __delattr__ "
    "__setstate__ __getstate__ __reduce__ __reduce_ex__ __slots__".split()
)


#: torch's objects that keep their state in a ``state_dict`` (their
#: parameters, their optimizer, by position: never the engine's copies)
_TORCH_STATE = {
    ("torch.optim.optimizer", "Optimizer"): "optimizer",
    ("torch.optim.lr_scheduler", "LRScheduler"): "scheduler",
}


def _torch_state_kind(obj: Any) -> str:
    for cls in type(obj).__mro__:
        if (cls.__module__, cls.__name__) in _TORCH_STATE:
            return _TORCH_STATE[(cls.__module__, cls.__name__)]
    return ""


def _plain_subclass(obj: Any) -> bool:
    """A subclass of ``dict`` or ``list`` (``class Row(dict)``) whose state is
    its elements and its attributes, as pickle sees it, with none of the
    stores overridden: its elements are written back as a dict's or list's,
    its attributes as an object's."""
    base = dict if isinstance(obj, dict) else list
    for cls in type(obj).__mro__:
        if cls in (base, object):
            break
        if cls.__module__ != "__main__" or _MUTATORS & set(vars(cls)):
            return False  # (a library's subclass may keep invariants)
    else:
        return False
    try:
        red = obj.__reduce_ex__(4)
    except Exception:
        return False
    newobj = getattr(copyreg, "__newobj__", None)
    if not (isinstance(red, tuple) and len(red) == 5 and red[0] is newobj):
        return False
    elements = red[4] if base is dict else red[3]
    other = red[3] if base is dict else red[4]
    return (
        tuple(red[1]) == (type(obj),)
        and (red[2] is None or isinstance(red[2], dict))
        and elements is not None
        and other is None
    )


def _stdlib_kind(obj: Any) -> str | None:
    """Containers and generators whose state is not attributes, written back
    by their own means (exactly these classes: a subclass may hold more)."""
    t = type(obj)
    if global_generator(obj) is not None:
        return ""  # process state, a reference to each process's own
    if t is set:
        return "set"
    if t is bytearray:
        return "bytes"
    if t is collections.deque:
        return "deque"
    if t is random.Random:
        return "random"
    if (t.__module__, t.__name__) in _NUMPY_RNG:
        return "rng"
    if t in _SEQUENCE_ITERATORS:
        return "iterator"
    return None


#: iterators over a sequence, whose whole state is their position (pickled
#: as ``(iter, (sequence,), position)``, set by ``__setstate__``): written
#: back as that position into the kernel's own, over the kernel's sequence
_SEQUENCE_ITERATORS = frozenset(
    type(x)
    for x in (
        iter([]),
        iter(()),
        iter(range(0)),
        iter(""),
        iter("\u00e9"),
        iter(b""),
        iter(bytearray()),
        reversed([]),
    )
)


def iterator_position(it: Any) -> tuple[int, int | None]:
    """A sequence iterator's (length of its sequence, position), position
    ``None`` once it is used up (its sequence is dropped then)."""
    reduced = it.__reduce__()
    seq = reduced[1][0] if reduced[1] else ()
    if len(reduced) < 3:
        return -1, None
    return len(seq), int(reduced[2])


def rng_state(obj: Any) -> Any:
    """A ``random.Random``'s or numpy generator's whole state (a
    ``RandomState``'s cached Gaussian included)."""
    if type(obj) is random.Random:
        return obj.getstate()
    if _NUMPY_RNG[(type(obj).__module__, type(obj).__name__)] == "generator":
        return obj.bit_generator.state
    return obj.get_state(legacy=False)


def _attributes_are_state(obj: Any) -> bool:
    """Whether an object's attributes (``__dict__`` and slots) are all of its
    state, as pickle sees it: made from its class alone, with a dict of
    attributes.  Not a ``random.Random`` (its generator state lives in its C
    base, pickled as a tuple), nor a subclass of ``dict`` or ``list`` (their
    elements travel beside the attributes): written back by attributes, such
    an item would silently keep what it was."""
    try:
        red = obj.__reduce_ex__(4)
    except Exception:
        return False
    if not isinstance(red, tuple) or len(red) < 2:
        return False
    made, args = red[0], red[1]
    newobj = getattr(copyreg, "__newobj__", None)  # (not in typeshed)
    from_class = made is newobj and tuple(args) == (type(obj),)
    # SimpleNamespace: (its class, (), its attributes)
    from_class = from_class or (made is type(obj) and tuple(args) == ())
    if not from_class or any(x is not None for x in red[3:5]):
        return False
    state = red[2] if len(red) > 2 else None
    if type(state) is tuple and len(state) == 2:  # (attributes, slots)
        return all(x is None or isinstance(x, dict) for x in state)
    return state is None or isinstance(state, dict)


def _slot_names(obj: Any) -> list[str]:
    """The ``__slots__`` of an object's classes (a plain object without a
    ``__dict__``: ``p.x += 1`` on a ``@dataclass(slots=True)``)."""
    names: list[str] = []
    for cls in type(obj).__mro__:
        slots = vars(cls).get("__slots__", ())
        for n in (slots,) if isinstance(slots, str) else slots:
            if n not in ("__dict__", "__weakref__") and n not in names:
                names.append(n)
    return names


def attributes_of(kind: str, obj: Any) -> dict[str, Any]:
    """The attributes an iteration can set on an object of this kind."""
    if kind == "slots":
        return {n: getattr(obj, n) for n in _slot_names(obj) if hasattr(obj, n)}
    if kind == "module":  # its own plain attributes (checkin.module_attributes)
        return {
            k: v
            for k, v in vars(obj).items()
            if not k.startswith("_") and k != "training"
        }
    return dict(vars(obj))
