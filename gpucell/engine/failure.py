"""An iteration's exception as data the kernel re-raises with context (type,
message, the cell-line traceback, the iteration and its loop values, a note
when a GPU ran out of memory), and a result's loop-locals that cannot travel.
"""

from __future__ import annotations

import io
import os
import sys
import traceback
from typing import Any

from gpucell.engine import checkin
from gpucell.engine.where import Where
from gpucell.protocol import wire
from gpucell.protocol.chunks import chunk_items
from gpucell.protocol.conversation import ChunkError

__all__ = [
    "describe_oom",
    "error_payload",
    "mark_unsendable",
    "release_cuda_cache",
]


def error_payload(
    exc: BaseException, where: Where, start: int, chunk_obj: Any
) -> ChunkError:
    """An iteration's exception as data the kernel can re-raise with context."""
    it = getattr(exc, "gpucell_iteration", None)
    if it is None:
        it = where.current()
    if it is None:
        it = start
    try:
        pickled = wire.dumps(exc)
    except Exception:
        pickled = None
    return {
        "changed": exc.changes if isinstance(exc, checkin.Changed) else None,
        "readonly": isinstance(exc, ValueError) and "read-only" in str(exc),
        "type": type(exc).__name__,
        "module": type(exc).__module__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
        "iteration": it,
        "item": _item_repr(chunk_obj, it - start),
        "exception": pickled,
        "oom": _oom_note(exc),
    }


def mark_unsendable(result: Any) -> None:
    """Replace the loop-locals' last values that do not serialise with a marker
    naming their type (everything else in the result travels as it is)."""
    for name, (index, kind, value) in list(result.last_values.items()):
        if kind != "value":
            continue
        try:
            wire.dumps(value)
        except Exception:
            closed = _closed_file(value)
            if closed is not None:  # (`with open(p) as f:` in the body)
                result.last_values[name] = (index, "closed file", closed)
            else:
                result.last_values[name] = (index, "unsendable", type(value).__name__)


def _closed_file(value: Any) -> dict[str, Any] | None:
    """What the kernel needs to stand in for a closed file object (``open``'s
    text or buffered file, or its raw one): nothing can be done with it but
    look at it, so an equal closed object is what the serial loop left."""
    kinds: dict[type, str] = {
        io.TextIOWrapper: "text",
        io.BufferedReader: "reader",
        io.BufferedWriter: "writer",
        io.BufferedRandom: "random",
    }
    kind = kinds.get(type(value))
    if kind is None or not getattr(value, "closed", False):
        return None
    out: dict[str, Any] = {"kind": kind}
    for attr in ("name", "mode", "encoding", "errors", "newlines"):
        try:
            out[attr] = getattr(value, attr)
        except (AttributeError, ValueError):
            pass
    if kind == "text":  # its buffer's kind (the name lives on the raw file)
        out["buffer"] = kinds.get(type(getattr(value, "buffer", None)), "reader")
    return out


def _item_repr(chunk_obj: Any, offset: int) -> str:
    try:
        for k, item in enumerate(chunk_items(chunk_obj)):
            if k == offset:
                r = repr(item)
                return r if len(r) <= 200 else r[:197] + "..."
    except Exception:
        pass
    return "?"


def describe_oom(
    message: str, device: str, total: int | None, free: int | None, held: int | None
) -> str:
    """The note added to a CUDA out-of-memory error (pure, so it is unit-tested)."""
    import re

    asked = re.search(r"Tried to allocate ([0-9.]+ [KMGT]?i?B)", message)
    gib = 2**30
    parts = [f"CUDA out of memory on {device}"]
    if total is not None:
        parts.append(f"{total / gib:.1f} GiB total")
    if free is not None:
        parts.append(f"{free / gib:.2f} GiB free")
    if held is not None:
        parts.append(f"{held / gib:.2f} GiB held by this engine")
    if asked:
        parts.append(f"the iteration asked for {asked.group(1)} more")
    return (
        ": ".join([parts[0], ", ".join(parts[1:])]) if len(parts) > 1 else parts[0]
    ) + (
        ". Put fewer engines on each GPU (--per-gpu 1), use smaller batches per "
        "iteration, or free tensors kept between iterations (del them, or "
        "torch.cuda.empty_cache())."
    )


def release_cuda_cache() -> None:
    """Give the caching allocator's free blocks back to the device."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:
        pass


def _oom_note(exc: BaseException) -> str | None:
    torch = sys.modules.get("torch")
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if torch is None or oom is None or not isinstance(exc, oom):
        return None
    total = free = held = None
    try:
        free, total = torch.cuda.mem_get_info()
        held = torch.cuda.memory_allocated()
    except Exception:
        pass
    device = (
        f"{os.environ.get('GPUCELL_DEVICE_NAME', 'GPU')} "
        f"(GPU {os.environ.get('GPUCELL_DEVICE_INDEX', '?')})"
    )
    return describe_oom(str(exc), device, total, free, held)
