"""Does the engine's update fit the kernel's object?  An item whose kind,
shape, keys, length or state is not what the engine's copy had is refused
before anything is written, rather than written by half.  Pure.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

from gpucell.core.writeback_reach import bit_generator
from gpucell.errors import NotParallelizable

__all__ = ["check_shape"]


def check_shape(obj: Any, update: tuple[Any, ...], iteration: int) -> None:
    """The update fits the kernel's object (else the item is not what the
    engine had: refuse rather than write half of it)."""
    kind = update[0]
    problem = ""
    if kind == "module":
        params = dict(obj.named_parameters())
        if params.keys() != update[1]["params"].keys():
            problem = "its parameters are not the ones the engine's copy has"
        elif any(
            tuple(params[n].shape) != tuple(q.shape)
            for n, q in update[1]["params"].items()
        ):
            problem = "a parameter changed shape"
        else:
            buffers = {n for n, b in obj.named_buffers() if b is not None}
            if buffers != update[1]["buffers"].keys():
                problem = "its buffers are not the ones the engine's copy has"
    elif kind == "tensor":
        if tuple(obj.shape) != tuple(update[1].shape) or obj.dtype != update[1].dtype:
            problem = "its shape or dtype changed"
    elif kind == "array":
        new = update[1]
        if type(obj).__name__ != "ndarray" or obj.shape != new.shape:
            problem = "its shape changed, or it is not the array the engine had"
        elif obj.dtype != new.dtype:
            problem = "its dtype changed"
        else:
            problem = _check_array_flag(obj, update)
    elif kind in ("dict", "list", "deque"):
        if kind == "dict" and not (
            isinstance(obj, dict) and list(obj.keys()) == update[1]
        ):
            problem = "its keys are not the ones the engine's copy had"
        elif kind != "dict" and not (
            isinstance(obj, list if kind == "list" else collections.deque)
            and len(obj) == update[1]
        ):
            problem = "its length is not the engine copy's"
        elif len(update) > 3 and not isinstance(getattr(obj, "__dict__", None), dict):
            problem = "it has no attributes to set"
    elif kind in ("set", "bytes", "random", "rng"):
        problem = _check_state(obj, update)
    elif kind == "torchstate":
        problem = _check_torch_state(obj, update[1])
    elif kind == "iterator":
        problem = _check_iterator(obj, update)
    elif kind == "frame":
        if type(obj) is not type(update[1]) or not hasattr(obj, "_update_inplace"):
            problem = "it is not the frame the engine had"
        elif getattr(obj, "_cacher", None) is not None:
            # (pandas < 3: `df[c]`, a column its frame caches: serially an
            # in-place change writes into the frame, a new state would not)
            problem = "it is a column its frame holds (`df[c]`)"
    elif kind == "slots":
        if isinstance(getattr(obj, "__dict__", None), dict):
            problem = "it is not the object the engine had"
    elif not isinstance(getattr(obj, "__dict__", None), dict):
        problem = "it has no attributes to set"
    if problem:
        raise NotParallelizable(
            f"gpucell: the item of iteration {iteration} (a {type(obj).__name__}) "
            f"changed in place and cannot be written back: {problem}. Nothing was "
            "merged. Build the object inside the loop and collect it "
            "(`results.append(m)`), or run the cell serially."
        )


def _check_array_flag(obj: Any, update: tuple[Any, ...]) -> str:
    """The kernel's array takes the update: writable where its bytes change,
    and able to be made writable where the engine's copy was made so
    (``update``: ``("array", values, new writeable flag or None, whether the
    bytes changed)``)."""
    flag = update[2] if len(update) > 2 else None
    changed = len(update) < 4 or bool(update[3])
    if obj.flags.writeable or not (changed or flag):
        return ""
    if not flag:
        return "the kernel's array is read-only"
    try:  # (numpy's own rule: only an array whose memory may be written)
        obj.setflags(write=True)
    except ValueError:
        return "the kernel's array cannot be made writable, as the engine's copy was"
    obj.setflags(write=False)
    return ""


def _check_state(obj: Any, update: tuple[Any, ...]) -> str:
    """Why a set, bytearray or generator cannot take the engine's change."""
    kind = update[0]
    if kind == "set":
        if type(obj) is not set:
            return "it is not the set the engine had"
        try:
            lost = [v for v in update[1] or () if v not in obj]
        except TypeError:
            lost = list(update[1])
        if lost:
            # an object compared by identity: the engine's is a copy
            return (
                f"an element it removed (a {type(lost[0]).__name__}) is not in "
                "the kernel's set by value"
            )
    elif kind == "bytes":
        if type(obj) is not bytearray:
            return "it is not the bytearray the engine had"
        if len(obj) != len(update[1]) and not _resizable(obj):
            return (
                "its length changed, and a view of it (a memoryview, an "
                "array) holds its memory"
            )
    elif kind == "random":
        if type(obj).__name__ != "Random" or not hasattr(obj, "setstate"):
            return "it is not the generator the engine had"
    elif bit_generator(obj) is None or (
        type(bit_generator(obj)).__name__ != update[1].get("bit_generator")
    ):
        return "its bit generator is not the one the engine's copy had"
    return ""


def _check_iterator(obj: Any, update: tuple[Any, ...]) -> str:
    """A sequence iterator takes the engine's position where it is the same
    kind, over a sequence as long as the engine's copy's was."""
    _kind, name, length, _position = update
    if type(obj).__name__ != name or not callable(getattr(obj, "__setstate__", None)):
        return "it is not the iterator the engine had"
    reduced = obj.__reduce__()
    if len(reduced) < 3:
        return "the kernel's iterator is used up"
    if length >= 0 and len(reduced[1][0]) != length:
        return "its sequence is not as long as the engine copy's"
    return ""


def _check_torch_state(obj: Any, state: Mapping[str, Any]) -> str:
    """An optimizer's groups must hold as many parameters as the engine's
    (``load_state_dict`` would raise half-way through the merge)."""
    if not callable(getattr(obj, "load_state_dict", None)):
        return "it has no state to load"
    groups = state.get("param_groups")
    if groups is None:
        return ""
    mine = getattr(obj, "param_groups", None)
    if not isinstance(mine, list) or [len(g["params"]) for g in mine] != [
        len(g["params"]) for g in groups
    ]:
        return "its parameter groups are not the engine copy's"
    return ""


def _resizable(b: bytearray) -> bool:
    """Whether no buffer (a memoryview, a numpy array) holds a bytearray's
    memory: resizing it would raise there (grown by one and shrunk back, or
    not at all)."""
    try:
        b.append(0)
    except BufferError:
        return False
    b.pop()
    return True
