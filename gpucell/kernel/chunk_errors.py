"""An iteration's error as the user reads it: where, what, and how to fix.

The engine sends an exception as data (``protocol.conversation.ChunkError``);
here the kernel re-raises the user's own exception type (with the remote
traceback's cell lines and gpucell's context as a note) or gpucell's
(``InputChanged``: an input changed in place, ``IterationError``).
"""

from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING

from gpucell.core.provenance import LastRun
from gpucell.core.schedule import Chunk
from gpucell.errors import InputChanged, IterationError
from gpucell.protocol import wire
from gpucell.protocol.conversation import ChunkError

if TYPE_CHECKING:
    from gpucell.cluster.lifecycle import GpuCluster
    from gpucell.core.analysis.plan import LoopPlan

__all__ = ["raise_iteration_error"]


def raise_iteration_error(
    payload: ChunkError,
    chunk: Chunk,
    gc: GpuCluster,
    record: LastRun,
    unfinished_before: list[tuple[int, int]] | None = None,
) -> None:
    """Raise what the iteration raised, with where it ran; ``unfinished_before``:
    earlier iterations other engines had not finished (serially one of them
    might have raised first: said, as the run stops at the first error heard)."""
    info = gc.engines.get(chunk.engine) if chunk.engine is not None else None
    where = (
        f"iteration {payload['iteration']} (loop values {payload['item']}) on engine "
        f"{chunk.engine}"
        + (f" ({info.host}, {info.device} {info.name})" if info else "")
    )
    context = (
        f"gpucell: raised in {where}. Nothing from the loop was merged; the prelude "
        "ran.\nRemote traceback (cell lines):\n" + payload["traceback"].rstrip()
    )
    if unfinished_before:
        from gpucell.core.resume import describe_ranges

        context += (
            f"\ngpucell: iterations {describe_ranges(unfinished_before)}, before "
            "it, had not finished on other engines when it raised: serially one "
            "of them might have raised first."
        )
    oom, changed = payload.get("oom"), payload.get("changed")
    if oom:
        context += "\n" + oom
    if changed:
        message = _changed_message(changed, chunk, where, record)
        record.errors.append(message)
        raise InputChanged(message)
    if payload.get("readonly"):
        context += (
            "\ngpucell: inputs are read-only to iterations: each engine writes "
            "only its own copy, so the change would be lost in your namespace (and "
            "later iterations would not see it). Copy the array inside the loop "
            "(`x = x.copy()`), or collect results (`out[i] = ...` on a name the "
            "loop writes) and apply them after the loop."
        )
    record.errors.append(context)
    exc: BaseException | None = None
    pickled = payload.get("exception")
    if pickled:
        try:
            exc = wire.loads(pickled)
        except Exception:
            exc = None
    if isinstance(exc, BaseException):
        exc.__traceback__ = None
        if hasattr(exc, "add_note"):
            exc.add_note(context)
        else:  # pragma: no cover - Python 3.10
            warnings.warn(context, stacklevel=2)
        raise exc
    raise IterationError(f"{payload['type']}: {payload['message']}\n{context}")


def _by_index(name: str, plan: LoopPlan | None) -> str:
    """The rewrite, where the changed input is the list the loop indexes
    (``for i in range(len(models)): models[i].fit(...)``): the loop
    variable's own item is written back (engine/checkout.py); an item reached
    by index is an input."""
    source = plan.iter_space.source if plan and plan.iter_space else ""
    pattern = rf"range\(\s*len\(\s*{re.escape(name)}\s*\)\s*\)"
    if not name or not re.fullmatch(pattern, source):
        return ""
    return (
        f" (the loop reaches `{name}`'s items by index: written `for x in "
        f"{name}:` or `for i, x in enumerate({name}):`, each iteration's change "
        "to its own item is written back in place)"
    )


def _changed_message(
    changed: list[tuple[str, str]], chunk: Chunk, where: str, record: LastRun
) -> str:
    """What changed, where it could have happened, and how to rewrite."""
    plan = record.plan
    parts = []
    data = "the loop's data"
    if plan is not None and plan.iter_space is not None:
        data = f"`{plan.iter_space.source}` (the loop's data)"
    for name, what in changed:
        label = f"an item of {data}" if name == "" else f"`{name}`"
        lines = plan.watch_lines(name or None) if plan is not None else ()
        at = ""
        if lines:
            at = " (by a call on line" + ("s " if len(lines) > 1 else " ")
            at += ", ".join(map(str, lines)) + ")"
        parts.append(f"{label} changed in place{at}: {what}{_by_index(name, plan)}")
    span = f"iterations {chunk.start}-{chunk.stop - 1}"
    return (
        f"gpucell: {'; '.join(parts)}, in {span} on {where.split(' on ', 1)[-1]}. "
        "Inputs are read-only to iterations: serially the change would stay in your "
        "object and later iterations would see it, but each engine changes only its "
        "own copy, so the result would silently differ. Nothing was merged. Create "
        "the object inside the loop (`m = make_model()`, `est = clone(est)`), "
        "collect what you need instead (`results.append(...)`), or run the cell "
        "without %%gpu_parallel."
    )
