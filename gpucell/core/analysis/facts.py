"""Facts about the loop the kernel needs at run time, found once here.

The kernel used to parse the cell again for each of them (the last item's
binding, a file every iteration writes, process-wide state, set orders, where
the body reseeds, a draw after the loop); the plan now carries them, so a run
parses nothing and a re-run of a cached plan computes nothing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from types import CodeType

from gpucell.core.analysis.scope import is_global_random
from gpucell.core.lastitem import (
    dotted_name,
    last_item_binding,
    loop_node,
    process_state_calls,
    set_orders,
    shared_file_writes,
    uses_autograd,
)

__all__ = ["LoopFacts", "loop_facts"]


@dataclass(frozen=True)
class LoopFacts:
    """What :func:`loop_facts` found (empty for a loop that is not a ``for``)."""

    # code binding the loop's target to the last item (core/lastitem.py), or
    # None when the body may leave another value there
    last_item: CodeType | None = None
    # (line, path) of an open(path, "w"/"a") every iteration runs
    shared_file_writes: tuple[tuple[int, str], ...] = ()
    # (line, call) of a call changing process-wide state (os.chdir...)
    process_state_calls: tuple[tuple[int, str], ...] = ()
    # lines giving a set's order to something ordered (list(set(words)))
    set_orders: tuple[int, ...] = ()
    # lines of the body's own expression statements (run in every iteration)
    top_expressions: tuple[int, ...] = ()
    # (line, call) of the first draw from a global generator after the loop
    epilogue_draw: tuple[int, str] | None = None
    # the body runs autograd itself (loss.backward()): engines check every input
    uses_autograd: bool = False


def loop_facts(
    source: str,
    kind: str | None,
    loop_line: int,
    filename: str,
    epilogue_lines: tuple[int, int] | None,
) -> LoopFacts:
    """The :class:`LoopFacts` of the loop at ``loop_line`` of ``source``."""
    draw = _first_draw(source, epilogue_lines)
    if kind != "for":
        return LoopFacts(epilogue_draw=draw)
    loop = loop_node(source, loop_line)
    top = (
        tuple(st.lineno for st in loop.body if isinstance(st, ast.Expr))
        if loop is not None
        else ()
    )
    return LoopFacts(
        last_item=last_item_binding(source, loop_line, filename),
        shared_file_writes=tuple(shared_file_writes(source, loop_line)),
        process_state_calls=tuple(process_state_calls(source, loop_line)),
        set_orders=tuple(set_orders(source, loop_line)),
        top_expressions=top,
        epilogue_draw=draw,
        uses_autograd=uses_autograd(source, loop_line),
    )


def _first_draw(source: str, lines: tuple[int, int] | None) -> tuple[int, str] | None:
    """``(line, call)`` of the first draw from a global generator in the
    cell's code after the loop, if any."""
    if lines is None:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    first, last = lines
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and first <= node.lineno <= last:
            text = dotted_name(node.func)
            if text is not None and is_global_random(text):
                return node.lineno, text
    return None
