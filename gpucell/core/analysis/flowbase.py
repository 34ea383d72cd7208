"""The flow walk's state and context: the names definitely assigned, what
the walk knows of the body (:class:`_Ctx`) and finds, and the base of the
walk, which reads names (a loop-carried read, a sink read, an input)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpucell.core.analysis.diagnostics import DiagnosticSink
from gpucell.core.analysis.messages import _own_key_fix, _write_once_text
from gpucell.core.analysis.refusals import LoopCarried, SinkRead
from gpucell.core.analysis.selections import _running_best_text, _Selection
from gpucell.core.analysis.sinks import WRITE, Candidate, RunningBest

__all__ = ["State"]

State = frozenset[str] | None  # names definitely assigned; None: unreachable


def _join(*states: State) -> State:
    """Intersection of reachable states (a path that cannot fall through is ignored)."""
    live = [s for s in states if s is not None]
    if not live:
        return None
    out = live[0]
    for s in live[1:]:
        out = out & s
    return out


def _add(state: State, names: Iterable[str]) -> State:
    return None if state is None else state | frozenset(names)


class _Ctx:
    """Everything the flow walk needs to know, and what it finds."""

    def __init__(
        self,
        *,
        sink: DiagnosticSink,
        body_bound: set[str],
        sinks: dict[str, Candidate],
        own: set[int],
        tainted: set[str],
        module_names: set[str],
        is_builtin: Callable[[str], bool],
    ) -> None:
        self.diag = sink
        self.body_bound = body_bound
        self.sinks = sinks
        self.own = own
        self.tainted = tainted
        # tainted names that are new containers (`rec = {"v": item}`): a
        # change to the container itself changes nothing from outside
        self.shallow: set[str] = set()
        self.module_names = module_names
        self.is_builtin = is_builtin
        # may a nested loop over inputs be taken to run (checked at run time)?
        self.assume_nonempty = True
        self.nonempty: dict[tuple[int, str], None] = {}
        self.inputs: dict[str, int] = {}
        self.prints: list[int] = []
        self.watch: dict[str, list[int]] = {}
        self.watch_items: list[int] = []
        self.watch_all = False
        self.target_names: set[str] = set()
        # the loop variable's names that hold the iteration's own item (or a
        # part of it) everywhere in the body: changes to it are written back
        self.item_names: set[str] = set()
        # write sinks whose every write and read is its own element `S[i]` (i the
        # loop's distinct index): S -> i
        self.own_elements: dict[str, str] = {}
        # those whose key is a part of an `enumerate`'s item (its checks are
        # the enumerated items')
        self.enumerated_keys: set[str] = set()
        # write sinks whose every written key differs from some constant keys
        # (`ts[f"lag_{k}"] = ...` beside reads of `ts["y"]`): S -> the keys
        self.write_keys: dict[str, list[ast.expr]] = {}
        # the loop's variable, never rebound, over a literal list of strings
        self.literal_keys: dict[str, tuple[str, ...]] = {}
        # write sinks used only at `S[i]` but written more than once: S -> (i,
        # the lines that write it)
        self.several_writes: dict[str, tuple[str, list[int]]] = {}
        self.random_calls: list[tuple[int, str]] = []
        self.deleted: set[str] = set()
        self.seen_stored: set[str] = set()
        # sinks the body also reads (refused as sink-read)
        self.sink_reads: dict[str, int] = {}
        # names a nested loop's body binds -> that loop's line (innermost)
        self.loop_stored: dict[str, int] = {}
        # the loop's variable and iterable when its items are keys that may
        # repeat (`for c in cols`): the own-item advice names distinct forms
        self.key_loop: tuple[str, str] | None = None
        # estimators from before the loop that the body refits: name -> call
        self.refits: dict[str, ast.Call] = {}
        # names kept as a running best or first match: "best" / "first"
        self.selections: dict[str, _Selection] = {}
        # names rebound by a concatenation of themselves (`x = np.append(x,
        # e)`) -> its line: `x += e` would add elementwise, not append
        self.concatenated: dict[str, tuple[int, str]] = {}
        # running bests merged exactly (sinks.RunningBest), and the reads of
        # `best` in their tests: inputs, each chunk starting from the kernel's
        self.bests: dict[str, RunningBest] = {}
        self.best_reads: set[int] = set()


@dataclass
class _Jumps:
    """States at the ``break``s and ``continue``s of one nested loop."""

    breaks: list[State] = field(default_factory=list)
    continues: list[State] = field(default_factory=list)


class _FlowBase:
    """Definite-assignment walk of the loop body in evaluation order: its
    state, and the reads of names.  The walk's statement and expression
    visitors (``flow._Flow``) fill in :meth:`expr`, :meth:`block`, :meth:`store`."""

    def __init__(self, ctx: _Ctx) -> None:
        self.c = ctx
        self.loop_depth = 0
        self.shadow: list[frozenset[str]] = []
        # break/continue states of the nested loops being walked, innermost last
        self.jumps: list[_Jumps] = []

    # -- helpers ---------------------------------------------------------------

    def _shadowed(self, name: str) -> bool:
        return any(name in s for s in self.shadow)

    def expr(self, e: ast.AST, state: State) -> State:
        raise NotImplementedError

    def block(self, stmts: Iterable[ast.stmt], state: State) -> State:
        raise NotImplementedError

    def store(self, target: ast.expr, state: State, op: str = "") -> State:
        raise NotImplementedError

    def load(self, node: ast.Name, state: State) -> None:
        c = self.c
        n = node.id
        if id(node) in c.own or self._shadowed(n):
            return
        if id(node) in c.best_reads:
            c.inputs.setdefault(n, node.lineno)
            return
        if n in c.sinks:
            cand = c.sinks[n]
            if n in c.several_writes:
                what, fix = _write_once_text(n, *c.several_writes[n])
            else:
                what = (
                    f"`{n}` is combined across iterations ({cand.cls} on line "
                    f"{cand.stmt.lineno}) and is also used here; while the loop runs "
                    f"in parallel an iteration sees only its own contributions, not "
                    f"those of earlier iterations. "
                )
                fix = (
                    _own_key_fix(n, c.key_loop)
                    if cand.cls == WRITE
                    else f"Use `{n}` only after the loop (or give the running "
                    f"value another name inside the loop)."
                )
            c.diag.report(SinkRead(node.lineno, node.col_offset, n, what=what, fix=fix))
            c.sink_reads.setdefault(n, node.lineno)
        elif n in c.body_bound:
            if state is not None and n not in state:
                why, fix = self._carried_text(n)
                c.diag.report(
                    LoopCarried(node.lineno, node.col_offset, n, why=why, fix=fix)
                )
        elif n not in c.inputs:
            c.inputs[n] = node.lineno

    def _carried_text(self, n: str) -> tuple[str, str]:
        """Why reading ``n`` here sees the previous iteration, and the rewrite
        that fits how the body assigns it."""
        c = self.c
        loop_line = c.loop_stored.get(n)
        if n in c.seen_stored and loop_line is not None:
            why = (
                f"`{n}` is assigned inside the loop on line {loop_line}, which may "
                f"run zero times (or skip the assignment), so this read could see "
                f"the value left by the previous iteration."
            )
        elif n in c.seen_stored:
            why = (
                f"`{n}` is assigned earlier in the loop only on some paths "
                f"(e.g. under an `if`), so on the other paths this read would see "
                f"the value left by the previous iteration."
            )
        else:
            why = (
                f"`{n}` is read here before the iteration assigns it, so it "
                f"would see the value left by the previous iteration (a "
                f"loop-carried dependency)."
            )
        pick = c.selections.get(n)
        if pick is not None and pick.kind == "first":
            return why, (
                f"`{n}` keeps the first match, which depends on the iterations "
                f"before it: collect the matches (`hits.append(x)`) and take the "
                f"first after the loop (`{n} = hits[0] if hits else None`)."
            )
        if pick is not None and pick.kept and pick.op and len(pick.kept) > 1:
            return why, _running_best_text(n, pick)
        if pick is not None:
            score = pick.score or "score"
            what = {"max": "running maximum", "min": "running minimum"}
            pick_fn = pick.op or "max"  # (either way round: say both)
            either = "" if pick.op else " (or `min`, for a running minimum)"
            return why, (
                f"`{n}` keeps a {what.get(pick.op or '', 'running best')}, which "
                f"depends on the iterations before it: collect candidates "
                f"(`pairs.append(({score}, params))`) and pick after the loop "
                f"(`{pick_fn}(pairs, key=lambda t: t[0])`{either}), or write "
                f"`{n} = {pick_fn}({n}, {score})` when only the value is needed."
            )
        cat = c.concatenated.get(n)
        if cat is not None:
            return why, (
                f"`{n}` grows by a concatenation of itself (line {cat[0]}), "
                f"which gpucell replays in order only where the body uses `{n}` "
                f"nowhere else: read it after the loop, or gather the pieces "
                f"(`pieces.append(...)`) and concatenate them once after the "
                f"loop (`{n} = {cat[1]}([{n}, *pieces])`)."
            )
        fix = f"Assign `{n}` before reading it on every path of the iteration"
        if loop_line is not None:
            fix += f" (e.g. `{n} = None` before the loop on line {loop_line})"
        return why, fix + (
            f", or, if it accumulates, write it as a reduction (`{n} += ...`) and "
            f"read it only after the loop."
        )
