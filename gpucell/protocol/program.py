"""The chunk program's contract: names the kernel's code generator writes and the
engine's recorder binds, defined once for both sides.

The kernel (:mod:`gpucell.core.analysis.rewrite`) emits a program that calls
``__gpucell_rec__.<method>(...)`` and reads a few ``__gpucell_*__`` names; the
engine (:class:`gpucell.engine.chunk.Recorder`) provides them.  Both import the
constants below, so a renamed method or spec key breaks at import time on both
sides, not silently on an engine.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple, TypedDict

from gpucell.protocol.fold import NATIVE

__all__ = [
    "AS_DEVICE",
    "INDEXERS",
    "Indexed",
    "Row",
    "own_name",
    "ITEM_ERROR",
    "ItemError",
    "partial_name",
    "NATIVE_REDUCTIONS",
    "own_keys_name",
    "BEGIN",
    "DEVICE",
    "INDEX",
    "ITEMS",
    "NOW",
    "REC",
    "RESULT",
    "RECORDER_METHODS",
    "Method",
    "LogLevels",
    "Setup",
    "Spec",
    "Watch",
    "gather_name",
    "is_cuda_device",
]

#: the recorder object in the program's namespace
REC: Final = "__gpucell_rec__"
#: the chunk's ``(index, item)`` pairs
ITEMS: Final = "__gpucell_items__"
#: the loop's iteration index
INDEX: Final = "__gpucell_i__"
#: the engine's device (CPU engines standing in for GPUs)
DEVICE: Final = "__gpucell_device__"
#: maps a CUDA device held in a value to the engine's device
AS_DEVICE: Final = "__gpucell_as_device__"
#: the gather of a list comprehension's values (``L = [e for ...]``)
RESULT: Final = "__gpucell_result__"
#: called at each iteration's start with ``(index, time)``
BEGIN: Final = "__gpucell_begin__"
#: the clock ``BEGIN`` is given
NOW: Final = "__gpucell_now__"


class Method:
    """Names of the recorder methods the generated program calls."""

    SETUP: Final = "setup"  # once, with the Spec
    END: Final = "end"  # after an iteration, only when the body deletes a local
    DELETED: Final = "deleted"  # names a ``del`` removed in this iteration
    APPEND: Final = "append"  # L.append(e) (when not bound to list.append)
    EXTEND: Final = "extend"  # L.extend(e), L += e
    SETITEM: Final = "setitem"  # D[k] = e
    REDUCE: Final = "reduce"  # acc += e, acc = max(acc, e), ...
    KEYED: Final = "keyed"  # D[k] += e
    ADD: Final = "add"  # S.add(e)
    UPDATE: Final = "update"  # S.update(e)
    RAISED: Final = "raised"  # the loop raised inside a `with` that may swallow it
    SETINDEXED: Final = "setindexed"  # D.at[k] = e (also .loc, .iat, .iloc)
    KEYED_APPEND: Final = "keyed_append"  # D[k].append(e)
    KEYED_EXTEND: Final = "keyed_extend"  # D[k].extend(e)
    OWN_COPY: Final = "own_copy"  # the iteration's private copy of its row S[i]
    TOUCH: Final = "touch"  # a key of the private row was written
    OWN_DONE: Final = "own_done"  # the iteration's row writes, at its end


#: every method the program may call; the engine's recorder defines each one
RECORDER_METHODS: Final = (
    Method.SETUP,
    Method.END,
    Method.DELETED,
    Method.APPEND,
    Method.EXTEND,
    Method.SETITEM,
    Method.REDUCE,
    Method.KEYED,
    Method.ADD,
    Method.UPDATE,
    Method.RAISED,
    Method.SETINDEXED,
    Method.KEYED_APPEND,
    Method.KEYED_EXTEND,
    Method.OWN_COPY,
    Method.TOUCH,
    Method.OWN_DONE,
)

#: attribute indexers whose item writes are indexed writes (pandas' ``D.at[k] = e``)
INDEXERS: Final = frozenset({"at", "loc", "iat", "iloc"})


class Indexed(NamedTuple):
    """The key of a write through an indexer: ``D.at[k] = v`` is recorded as
    ``(Indexed("at", k), v)`` and applied as ``getattr(D, "at")[k] = v``."""

    accessor: str
    key: Any


class Row(NamedTuple):
    """The key of a write one level under the iteration's own row:
    ``S[i][k] = v`` (or ``S[i, k] = v``) is recorded as ``(Row(i, k), v)`` and
    applied as ``S[i][k] = v``."""

    index: Any
    key: Any


#: reductions whose chunk partial is folded by the operator itself on the engine
#: (``__gpucell_p_acc__ += e``, a few tens of ns), not by a recorder call
NATIVE_REDUCTIONS: Final = NATIVE  # (the reducer table's column: protocol/fold.OPS)


def partial_name(name: str) -> str:
    """The engine-side name of reduction ``name``'s chunk partial."""
    return f"__gpucell_p_{name}__"


#: what an ``any``/``all`` item that raised is gathered as (the engine binds it)
ITEM_ERROR: Final = "__gpucell_item_error__"


class ItemError(NamedTuple):
    """An item of ``any(...)``/``all(...)`` that raised: the kernel raises it
    only if the serial call would have reached it (no deciding item before)."""

    exc: BaseException


def own_name(name: str) -> str:
    """The engine-side name of the iteration's private copy of ``name[i]``."""
    return f"__gpucell_own_{name}__"


def own_keys_name(name: str) -> str:
    """The engine-side name of the keys the iteration wrote in its row."""
    return f"__gpucell_keys_{name}__"


class Spec(TypedDict):
    """The argument of ``setup``: what the recorder prepares before iteration 0."""

    locals: tuple[str, ...]  # names whose last value comes back
    reductions: dict[str, str]  # name -> operator ("+", "max", ...)
    keyed: dict[str, str]  # name -> operator of D[k] op= e
    device: bool  # bind DEVICE and AS_DEVICE (CUDA code on a CPU engine)
    gathers: tuple[str, ...]  # names bound to their list's append
    end: bool  # the program calls END after every iteration


class Watch(TypedDict):
    """What an engine checks before and after each chunk: inputs are read-only
    to iterations, and a change a call made in place fails the cell."""

    names: list[str]  # inputs a call could change (receivers, arguments, callees)
    items: bool  # the chunk's items (an item of the loop's data is a receiver)
    # torch modules whose train/eval mode the body sets before any other use
    # (`model.eval()` first): a change of mode alone is no change; the kernel
    # sets the mode the body leaves at the merge
    modes: list[str]


class LogLevels(TypedDict):
    """The kernel's logging levels, which decide what records a loop makes:
    an engine makes exactly those, and the kernel's handlers get them."""

    root: int  # the root logger's level
    disable: int  # logging.disable()'s level
    named: dict[str, int]  # every named logger's own level (NOTSET included)


class Setup(TypedDict):
    """What an engine's first chunk of a cell carries besides the inputs."""

    program: Any  # LoopPlan.engine_program(): (filename, source, marshalled code)
    names: list[str]  # every input the program reads
    keys: dict[str, str | None]  # input -> digest of its fingerprint (cache key)
    watch: Watch  # what the chunks check in and out
    warnings: list[Any]  # wire frames of the kernel's warnings.filters
    logging: LogLevels  # records the loop logs come back to the kernel's handlers
    # process-wide settings of the kernel that change what a loop computes
    # (torch's default dtype, numpy's error modes), applied around each chunk
    state: dict[str, Any]
    cache_bytes: int  # the engine's budget for cached inputs (LRU beyond it)
    # the kernel's working directory: relative paths in the loop (`open("a.csv")`
    # after `%cd data`) name the same files on the engines of its host
    cwd: str


def gather_name(name: str) -> str:
    """The program's name for ``name``'s bound ``append`` (set by the recorder)."""
    return f"__gpucell_g_{name}__"


def is_cuda_device(value: Any) -> bool:
    """``"cuda"``, ``"cuda:N"`` or a CUDA ``torch.device`` (torch not imported).

    The one test of "a CUDA device held in a value": the kernel's rewrite of
    literals, the engines' device mapper and the kernel's check of a cell's inputs
    all use it.
    """
    if isinstance(value, str):
        return value == "cuda" or value.startswith("cuda:")
    t = type(value)
    return bool(
        t.__name__ == "device" and t.__module__ == "torch" and value.type == "cuda"
    )
