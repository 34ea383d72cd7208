"""The analysis result: a frozen, inspectable :class:`LoopPlan`."""

from __future__ import annotations

import ast
import marshal
from dataclasses import dataclass, field
from types import CodeType

from gpucell.core.analysis.diagnostics import Diagnostic
from gpucell.core.analysis.facts import LoopFacts
from gpucell.core.analysis.iterspace import IterSpace
from gpucell.core.analysis.ownrows import OwnRow
from gpucell.core.analysis.rewrite import unstamped
from gpucell.core.analysis.sinks import (
    GATHER,
    INPUT,
    KEYED,
    KEYED_GATHER,
    LOCAL,
    REDUCTION,
    UNION,
    WRITE,
    RunningBest,
)
from gpucell.core.analysis.spellings import Spelled
from gpucell.core.analysis.split import Layer
from gpucell.protocol.program import Watch

__all__ = ["LoopPlan", "NameInfo", "Reduction", "EngineProgram"]

#: what ``LoopPlan.engine_program`` returns: (filename, cell source, marshalled
#: code, marshalled unstamped code or None)
EngineProgram = tuple[str, str, bytes, bytes | None]


@dataclass(frozen=True)
class NameInfo:
    """One name of the loop body, its class and where it first appears."""

    name: str
    cls: str
    line: int
    detail: str = ""


@dataclass(frozen=True)
class Reduction:
    """A reduction: ``name op= e`` (augmented) or ``name = name op e`` / max / min.

    ``op`` is one of ``+ - * | & ^ @ max min``.
    """

    name: str
    op: str
    augmented: bool
    line: int


@dataclass(frozen=True, eq=False)
class LoopPlan:
    """What ``%%gpu_parallel`` will do with a cell; pure data, no values.

    Attributes
    ----------
    source, filename : str
        The analysed (IPython-transformed) cell and the filename used to compile
        every part, so tracebacks name the cell's lines.
    kind : str or None
        ``"for"``, ``"listcomp"`` (``name = [... for ...]``), or ``None`` (no loop).
    prelude_source, prelude_lines, prelude
        What runs in the kernel before the loop (source, 1-based inclusive line
        span, statements).
    loop_lines : tuple of int or None
        Line span of the parallel loop.
    loop_header : str
        ``for <target> in <iterable>`` as written.
    iter_space : IterSpace or None
        The iterable's description; the kernel evaluates ``iter_space.leaves``.
    inputs, locals, gathers, writes, unions : tuple of str
        Names by class (see ARCHITECTURE §1).
    reductions : tuple of Reduction
    keyed : tuple of (name, op)
    result_name : str or None
        The assigned name of the list-comprehension form (gets a new list).
    hidden : tuple of str
        Comprehension variables: never returned.
    names : tuple of NameInfo
        Every classified name, in cell order.
    prints : tuple of int
        Lines with ``print(...)`` calls (their output is forwarded).
    chunk_ast : ast.Module or None
        The engine-side program; ``None`` when the loop is refused.
    epilogue_source, epilogue_lines, epilogue
        What runs in the kernel after the merge (includes a ``for``'s ``else``).
    cuda_rewritten : bool
        True when ``for_cpu=True`` rewrote a CUDA device selection.
    cuda_lines : tuple of int
    diagnostics : tuple of Diagnostic
        Refusals (empty when the plan can run).
    warnings : tuple of Diagnostic
        Problems that do not prevent running (e.g. an input not defined yet).
    choice : str
        Which of the cell's loops runs in parallel and why, and where its other
        top-level loops run (for ``--dry-run`` and the summary line).
    """

    source: str
    filename: str
    kind: str | None
    prelude_source: str
    prelude_lines: tuple[int, int] | None
    loop_lines: tuple[int, int] | None
    loop_header: str
    iter_space: IterSpace | None
    inputs: tuple[str, ...]
    locals: tuple[str, ...]
    gathers: tuple[str, ...]
    writes: tuple[str, ...]
    reductions: tuple[Reduction, ...]
    keyed: tuple[tuple[str, str], ...]
    unions: tuple[str, ...]
    result_name: str | None
    hidden: tuple[str, ...]
    names: tuple[NameInfo, ...]
    prints: tuple[int, ...]
    chunk_ast: ast.Module | None
    epilogue_source: str
    epilogue_lines: tuple[int, int] | None
    cuda_rewritten: bool = False
    cuda_lines: tuple[int, ...] = ()
    # what the comprehension builds from its gathered values: "list", "set",
    # "dict" ((key, value) pairs), or a consuming builtin ("sum", "max", ...)
    result_kind: str | None = None
    # D[k].append(e) / extend: the lists under D's keys gather in iteration order
    keyed_gathers: tuple[str, ...] = ()
    # reductions and gathers rewritten from another spelling (spellings.py):
    # a missing key's starting value, rebinding instead of in place
    spelled: Spelled = field(default_factory=Spelled)
    # writes whose iteration reads its own row back: engines write a private
    # copy of the row, the kernel applies the final values (ownrows.py)
    own_rows: tuple[OwnRow, ...] = ()
    watch: tuple[tuple[str, tuple[int, ...]], ...] = ()
    watch_items: tuple[int, ...] = ()
    watch_all: bool = False
    random_calls: tuple[tuple[int, str], ...] = ()
    # running bests kept with their payloads (`if loss < best: best = loss;
    # best_epoch = epoch`): locals whose chunk values the merge picks by the test
    bests: tuple[RunningBest, ...] = ()
    # what the kernel needs at run time about the loop (facts.py): found once
    facts: LoopFacts = field(default_factory=LoopFacts)
    # (line, iterable) of nested loops over inputs the plan takes to run at
    # least once (`for xb in loader:` then `loss.item()`): the kernel checks
    # each is non-empty after the prelude, and refuses with
    # ``unless_nonempty`` (what the loop is refused for without it) if not
    nonempty: tuple[tuple[int, str], ...] = ()
    unless_nonempty: tuple[Diagnostic, ...] = ()
    diagnostics: tuple[Diagnostic, ...] = ()
    warnings: tuple[Diagnostic, ...] = ()
    choice: str = ""
    prelude: tuple[ast.stmt, ...] = field(default=(), repr=False)
    # the `with` blocks around the loop, outermost first (kernel side: entered
    # after the prelude, their statements around the loop run inside them)
    layers: tuple[Layer, ...] = field(default=(), repr=False)
    epilogue: tuple[ast.stmt, ...] = field(default=(), repr=False)

    # -- convenience views ----------------------------------------------------

    def watched(self) -> Watch:
        """What the engines check before and after each chunk (inputs are
        read-only to iterations): the inputs a call could change in place, and
        the loop's items when an item is a receiver or an argument."""
        every = self.watch_all or self.facts.uses_autograd
        names = self.inputs if every else tuple(n for n, _ in self.watch)
        modes = [n for n, _ in self.facts.mode_calls]
        items = bool(self.watch_items) or every
        return {"names": list(names), "items": items, "modes": modes}

    def watch_lines(self, name: str | None) -> tuple[int, ...]:
        """Lines where ``name`` (``None``: an item of the loop's data) is a
        receiver or an argument of a call."""
        if name is None:
            return self.watch_items
        return dict(self.watch).get(name, ())

    @property
    def ok(self) -> bool:
        """True when the loop can run in parallel (no refusals)."""
        return not self.diagnostics and self.chunk_ast is not None

    def names_by_class(self) -> dict[str, tuple[str, ...]]:
        """``{class: names}`` for every class that has at least one name."""
        out: dict[str, list[str]] = {}
        for info in self.names:
            out.setdefault(info.cls, []).append(info.name)
        return {k: tuple(v) for k, v in out.items()}

    @property
    def deep_writes(self) -> tuple[str, ...]:
        """Sinks whose elements (rows) the loop changes in place."""
        return tuple(r.name for r in self.own_rows if r.mode == "row")

    @property
    def affected_names(self) -> tuple[str, ...]:
        """Names whose *current* values the merge needs (a read-only view)."""
        names = [
            *self.gathers,
            *self.writes,
            *(r.name for r in self.reductions),
            *(k for k, _ in self.keyed),
            *self.keyed_gathers,
            *self.unions,
            *(b.name for b in self.bests),
            *self.spelled.ufunc_at.values(),
            *self.spelled.frame_rows.values(),
            *self.spelled.concats.values(),
            *(r.target for r in self.spelled.replayed.values()),
        ]
        return tuple(n for n in names if not n.startswith("__gpucell_"))

    @property
    def chunk_source(self) -> str:
        """The chunk program as text (for reading; line numbers live in the AST)."""
        return ast.unparse(self.chunk_ast) if self.chunk_ast is not None else ""

    # -- compilation ---------------------------------------------------------------

    def compile_chunk(self) -> CodeType:
        """Compile the chunk program with the cell's filename and line numbers."""
        if self.chunk_ast is None:
            raise ValueError("this plan has no chunk program (the loop was refused)")
        return compile(self.chunk_ast, self.filename, "exec", dont_inherit=True)

    def compile_unstamped(self) -> CodeType | None:
        """The chunk program without per-iteration stamps (``None`` when the
        body needs the iteration's index); see ``rewrite.unstamped``."""
        if self.chunk_ast is None:
            return None
        m = unstamped(self.chunk_ast)
        if m is None:
            return None
        return compile(m, self.filename, "exec", dont_inherit=True)

    def engine_program(self) -> EngineProgram:
        """What to send to engines: ``(filename, cell source, marshalled code,
        marshalled unstamped code or None)``.

        Code objects do not pickle; ``marshal`` bytes do, between engines running
        the same Python version as the kernel (which ipyparallel requires anyway).
        The cell source lets the engine show the cell's lines in tracebacks.
        """
        fast = self.compile_unstamped()
        return (
            self.filename,
            self.source,
            marshal.dumps(self.compile_chunk()),
            None if fast is None else marshal.dumps(fast),
        )

    def compile_prelude(self) -> CodeType | None:
        """The prelude as code with the cell's line numbers (``None`` if empty)."""
        return self._compile(self.prelude)

    def compile_epilogue(self) -> CodeType | None:
        """The epilogue as code with the cell's line numbers (``None`` if empty)."""
        return self._compile(self.epilogue)

    def compile_statements(self, stmts: tuple[ast.stmt, ...]) -> CodeType | None:
        """Some of the cell's statements (a ``with`` block's around the loop) as
        code with the cell's line numbers (``None`` if there are none)."""
        return self._compile(stmts)

    def _compile(self, stmts: tuple[ast.stmt, ...]) -> CodeType | None:
        if not stmts:
            return None
        module = ast.Module(body=list(stmts), type_ignores=[])
        return compile(module, self.filename, "exec", dont_inherit=True)


CLASS_ORDER = (INPUT, LOCAL, GATHER, WRITE, REDUCTION, KEYED, KEYED_GATHER, UNION)
