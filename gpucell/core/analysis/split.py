"""Split a cell into prelude, parallel loop and epilogue.

The parallel loop is the first top-level ``for`` statement (at the top of the
cell or of top-level ``with`` blocks); only a cell without one runs its first
top-level comprehension assignment (``name = [expr for ...]``) in parallel, so a
small comprehension before the real loop never takes its place. Everything before
the loop is the prelude (run in the kernel first), everything after it --
including a ``for`` loop's ``else`` block, which always runs because ``break`` is
refused -- is the epilogue; other loops there run in the kernel, as written.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from gpucell.core.analysis.refusals import NoLoop, WhileLoop

__all__ = ["CellSplit", "Layer", "parse_cell", "split_cell"]


@dataclass(frozen=True)
class CellSplit:
    """The three parts of a cell, as AST statements with the cell's line numbers.

    Attributes
    ----------
    module : ast.Module
        The whole parsed cell.
    prelude : tuple of ast.stmt
    loop : ast.For or ast.AsyncFor or ast.Assign or None
        ``None`` when the cell has no parallelisable loop.
    epilogue : tuple of ast.stmt
    """

    module: ast.Module
    prelude: tuple[ast.stmt, ...]
    loop: ast.stmt | None
    epilogue: tuple[ast.stmt, ...]
    index: int = -1  # position of the loop among the module's statements
    # the top-level `with` blocks the loop sits in, outermost first
    layers: tuple[Layer, ...] = ()
    # the cell's other top-level loops and comprehension assignments (run in
    # the kernel, in the prelude or the epilogue), in cell order
    others: tuple[ast.stmt, ...] = ()


@dataclass(frozen=True)
class Layer:
    """A ``with`` block around the loop: its items, and the statements of its
    body before and after the part that holds the loop (run in the kernel,
    inside the context, as serially)."""

    node: ast.With
    before: tuple[ast.stmt, ...]
    after: tuple[ast.stmt, ...]


def parse_cell(source: str, filename: str) -> ast.Module:
    """Parse the (already IPython-transformed) cell.

    A syntax error propagates as the ``SyntaxError`` Python raises, whose ``lineno``
    is the cell's own line and whose ``filename`` is the caller's: that is how
    IPython reports syntax errors in a cell.
    """
    return ast.parse(source, filename=filename, mode="exec")


#: builtins that consume a whole generator: ``name = sum(e for x in xs)`` runs as
#: a loop whose values are gathered in order and handed to the builtin once
#: (``any``/``all`` stop early, so their later items never run serially: not here)
CONSUMERS = frozenset({"sum", "max", "min", "sorted", "list", "tuple", "set", "dict"})
#: consumers that stop at a deciding item: every item runs on the engines, an
#: item that raised is gathered as such, and the kernel replays the call in
#: order (so an error after the deciding item is ignored, as serially)
SHORT_CIRCUIT = frozenset({"any", "all"})


def comprehension_kind(
    node: ast.stmt, shadowed: Callable[[str], bool] = lambda _n: False
) -> str | None:
    """What a single-name assignment of a comprehension builds, or ``None``:
    ``"list"``, ``"set"``, ``"dict"`` for ``[...]``, ``{...}``, ``{k: v ...}``,
    or the builtin's name for ``sum(e for ...)``, ``max(...)``, ``sorted(...)``..."""
    if not (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
    ):
        return None
    v = node.value
    if isinstance(v, ast.ListComp):
        return "list"
    if isinstance(v, ast.SetComp):
        return "set"
    if isinstance(v, ast.DictComp):
        return "dict"
    if (
        isinstance(v, ast.Call)
        and isinstance(v.func, ast.Name)
        and v.func.id in CONSUMERS | SHORT_CIRCUIT
        and not shadowed(v.func.id)
        and len(v.args) == 1
        and not v.keywords
        and isinstance(v.args[0], ast.GeneratorExp)
    ):
        return v.func.id
    return None


def comprehension_of(
    node: ast.Assign,
) -> ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp:
    """The comprehension a :func:`comprehension_kind` assignment holds."""
    v = node.value
    if isinstance(v, ast.Call):
        gen = v.args[0]
        assert isinstance(gen, ast.GeneratorExp)
        return gen
    assert isinstance(v, (ast.ListComp, ast.SetComp, ast.DictComp))
    return v


def split_cell(
    module: ast.Module, shadowed: Callable[[str], bool] = lambda _n: False
) -> CellSplit:
    """Find the parallel loop among the top-level statements (``shadowed``: a
    builtin name the notebook rebinds, so ``sum(...)`` is not the builtin):
    the first top-level ``for``, or, in a cell without one, the first
    top-level comprehension assignment."""
    body = module.body
    every = [loop for node in body for loop in _loops_in(node, shadowed)]
    fors = [n for n in every if isinstance(n, (ast.For, ast.AsyncFor))]
    chosen = fors[0] if fors else (every[0] if every else None)
    if chosen is None:
        return CellSplit(module, tuple(body), None, ())
    for i, node in enumerate(body):
        found = _find_loop(node, chosen)
        if found is None:
            continue
        loop, layers, orelse = found
        epilogue = list(body[i + 1 :])
        if not layers:
            epilogue = orelse + epilogue
        others = tuple(n for n in every if n is not loop)
        return CellSplit(
            module, tuple(body[:i]), loop, tuple(epilogue), i, tuple(layers), others
        )
    raise AssertionError("the chosen loop is a top-level statement")


def _loops_in(node: ast.stmt, shadowed: Callable[[str], bool]) -> list[ast.stmt]:
    """The loops ``node`` is or holds where the parallel loop may be: itself,
    or at the top of (nested) ``with`` bodies."""
    if isinstance(node, (ast.For, ast.AsyncFor)) or comprehension_kind(node, shadowed):
        return [node]
    if isinstance(node, ast.With):
        return [loop for inner in node.body for loop in _loops_in(inner, shadowed)]
    return []


def no_loop_refusal(module: ast.Module) -> NoLoop | WhileLoop:
    """Why a cell has no loop to run: a cell whose loop is a ``while`` where
    the parallel loop could be (the top level of the cell or of ``with``
    blocks) is told so, not to move its loop to the top level."""
    todo = list(module.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.While):
            return WhileLoop(node.lineno, node.col_offset)
        if isinstance(node, ast.With):
            todo[:0] = node.body
    return NoLoop()


def _find_loop(
    node: ast.stmt, chosen: ast.stmt
) -> tuple[ast.stmt, list[Layer], list[ast.stmt]] | None:
    """Where ``chosen`` is, when ``node`` is it or holds it at the top of
    (nested) ``with`` bodies: ``(loop, layers outermost first, the for's else
    block)``."""
    if node is chosen:
        orelse = list(node.orelse) if isinstance(node, (ast.For, ast.AsyncFor)) else []
        return node, [], orelse
    if isinstance(node, ast.With):
        for j, inner in enumerate(node.body):
            found = _find_loop(inner, chosen)
            if found is None:
                continue
            loop, layers, orelse = found
            if not layers:  # a for's else block runs inside this with
                after = (*orelse, *node.body[j + 1 :])
            else:
                after = tuple(node.body[j + 1 :])
            layer = Layer(node, tuple(node.body[:j]), after)
            return loop, [layer, *layers], []
    return None


def line_span(stmts: tuple[ast.stmt, ...] | list[ast.stmt]) -> tuple[int, int] | None:
    """First and last cell line covered by ``stmts`` (``None`` when empty)."""
    if not stmts:
        return None
    first = min(
        [s.lineno for s in stmts]
        + [d.lineno for s in stmts for d in getattr(s, "decorator_list", [])]
    )
    last = max((s.end_lineno or s.lineno) for s in stmts)
    return first, last


def source_of(
    source: str,
    stmts: tuple[ast.stmt, ...] | list[ast.stmt],
    avoid: tuple[int, int] | None = None,
) -> str:
    """The source text of ``stmts``, dedented, for display.

    Uses whole lines when the statements own them; falls back to ``ast.unparse``
    when they share a line with the loop (``a = 1; L = [...]``, whose lines are
    ``avoid``) or do not parse on their own (``else: x = 1``).
    """
    span = line_span(stmts)
    if span is None:
        return ""
    overlaps = avoid is not None and span[0] <= avoid[1] and avoid[0] <= span[1]
    if not overlaps:
        lines = source.splitlines()
        text = textwrap.dedent("\n".join(lines[span[0] - 1 : span[1]]))
        try:
            ast.parse(text)
            return text
        except SyntaxError:
            pass
    return "\n".join(ast.unparse(s) for s in stmts)
