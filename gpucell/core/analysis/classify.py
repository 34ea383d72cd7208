"""Classify every name of the loop body, and refuse what cannot stay serial.

Two passes over the body's AST, never evaluating anything:

1. *Sink patterns*: statements that only contribute to an outer object in a way
   the merge can replay (``L.append(e)``, ``D[k] = e``, ``acc += e``, ``D[k] += e``,
   ``S.add(e)``). A name is a sink when every occurrence of it is such a pattern.
2. *Flow*: a definite-assignment walk in evaluation order. A name assigned in the
   body but read where it is not definitely assigned would see the previous
   iteration's value: a loop-carried dependency, refused. The walk also finds the
   inputs, refuses control flow that escapes the iteration, and refuses in-place
   changes to objects that exist before the loop (whose effect could not come
   back from an engine).

Every problem becomes a :class:`Diagnostic`; the caller raises them all at once.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from gpucell.core.analysis.diagnostics import DiagnosticSink
from gpucell.core.analysis.ownrows import OwnRow, find_own_rows, metadata_only
from gpucell.core.analysis.scope import (
    COMPREHENSIONS,
    ENGINE_PROVIDED,
    SAFE_BUILTINS,
    WELL_KNOWN_MODULES,
    bindings_of,
    indexer_write,
    is_global_random,
    is_inplace_method,
    is_mutating_method,
    nested_free_loads,
    nested_statements,
    root_name,
    scope_nodes,
    target_names,
    target_parts,
)
from gpucell.core.reducers import BY_AST, SELECTING
from gpucell.protocol.program import INDEXERS

__all__ = [
    "INPUT",
    "LOCAL",
    "GATHER",
    "WRITE",
    "REDUCTION",
    "KEYED",
    "KEYED_GATHER",
    "UNION",
    "Classification",
    "classify_body",
    "BIN_OPS",
]

INPUT = "input"
LOCAL = "local"
GATHER = "ordered gather"
WRITE = "indexed write"
REDUCTION = "reduction"
KEYED = "keyed reduction"
KEYED_GATHER = "keyed gather"
UNION = "set union"

#: operators accepted in reductions, by AST class (core/reducers.py)
BIN_OPS: dict[type[ast.operator], str] = BY_AST

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


@dataclass
class Candidate:
    """A statement that may be a sink pattern for ``name``."""

    cls: str
    name: str
    stmt: ast.stmt
    own: list[ast.Name]
    op: str | None = None
    augmented: bool = True


@dataclass
class Classification:
    """Result of classifying a loop body. Line numbers are the cell's."""

    inputs: dict[str, int] = field(default_factory=dict)
    locals: dict[str, int] = field(default_factory=dict)
    gathers: dict[str, int] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)
    reductions: dict[str, tuple[str, bool, int]] = field(default_factory=dict)
    keyed: dict[str, tuple[str, int]] = field(default_factory=dict)
    unions: dict[str, int] = field(default_factory=dict)
    deleted_locals: set[str] = field(default_factory=set)
    keyed_gathers: dict[str, int] = field(default_factory=dict)
    # writes whose iteration reads its own row back (see ownrows.py)
    own_rows: dict[str, OwnRow] = field(default_factory=dict)
    prints: list[int] = field(default_factory=list)
    # inputs a call could change in place (receivers, arguments, callees), with
    # the lines: the engines check them before and after each chunk
    watch: dict[str, list[int]] = field(default_factory=dict)
    # lines where an item of the loop's data is a receiver or an argument
    watch_items: list[int] = field(default_factory=list)
    # an alias of outer data is a receiver or argument: check every input
    watch_all: bool = False
    # (line, call) drawing from a global random generator
    random_calls: list[tuple[int, str]] = field(default_factory=list)
    # (line, iterable) of nested loops taken to run at least once because
    # their iterable, made of inputs, is checked non-empty before the run
    nonempty: list[tuple[int, str]] = field(default_factory=list)
    # own elements and own rows whose keys may name one element twice:
    # sink -> (the loop's key, "range" or "any"); `y[-3]` and `y[0]` are one
    # element of a 3-item list, `a[True]` and `a[(0, 1)]` overlap `a[0]`: the
    # engine program checks each key of a sink that is not a dict
    key_checks: dict[str, tuple[str, str]] = field(default_factory=dict)


def _handlers(s: ast.stmt) -> list[ast.ExceptHandler]:
    """The except clauses of a ``try`` / ``try*`` statement; none for others."""
    if isinstance(s, ast.Try):
        return s.handlers
    if sys.version_info >= (3, 11) and isinstance(s, ast.TryStar):
        return s.handlers
    return []


def block_statements(stmts: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of the body's scope, through compound statements."""
    for s in stmts:
        yield s
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in ("body", "orelse", "finalbody"):
            yield from block_statements(getattr(s, name, []))
        for h in _handlers(s):
            yield from block_statements(h.body)
        if isinstance(s, ast.Match):
            for c in s.cases:
                yield from block_statements(c.body)


def match_candidates(
    stmt: ast.stmt, is_builtin: Callable[[str], bool]
) -> list[Candidate]:
    """Sink patterns in one statement (structure only; names decided later)."""
    out: list[Candidate] = []
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        f = call.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            nargs = len(call.args)
            star = any(isinstance(a, ast.Starred) for a in call.args)
            if not call.keywords and not star:
                if f.attr in ("append", "extend") and nargs == 1:
                    out.append(Candidate(GATHER, f.value.id, stmt, [f.value]))
                elif f.attr == "add" and nargs == 1 or f.attr == "update" and nargs:
                    out.append(Candidate(UNION, f.value.id, stmt, [f.value]))
        elif (
            isinstance(f, ast.Attribute)
            and f.attr in ("append", "extend")
            and isinstance(f.value, ast.Subscript)
            and isinstance(f.value.value, ast.Name)
            and len(call.args) == 1
            and not call.keywords
            and not isinstance(call.args[0], ast.Starred)
        ):
            # D[k].append(e): the list under each key gathers in iteration order
            d = f.value.value
            out.append(Candidate(KEYED_GATHER, d.id, stmt, [d]))
    elif isinstance(stmt, ast.AugAssign):
        op = BIN_OPS.get(type(stmt.op))
        t = stmt.target
        if isinstance(t, ast.Name) and op is not None:
            if op == "+" and isinstance(stmt.value, (ast.List, ast.ListComp)):
                out.append(Candidate(GATHER, t.id, stmt, [t]))
            else:
                out.append(Candidate(REDUCTION, t.id, stmt, [t], op, True))
        elif (
            isinstance(t, ast.Subscript)
            and isinstance(t.value, ast.Name)
            and op is not None
        ):
            out.append(Candidate(KEYED, t.value.id, stmt, [t.value], op, True))
    elif isinstance(stmt, ast.Delete):
        # `del D[k]`: a write of the key's absence (own keys only, below)
        for target in stmt.targets:
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                out.append(Candidate(WRITE, target.value.id, stmt, [target.value]))
    elif isinstance(stmt, ast.Assign):
        v = stmt.value
        if len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            t = stmt.targets[0]
            if (
                isinstance(v, ast.BinOp)
                and isinstance(v.left, ast.Name)
                and v.left.id == t.id
                and type(v.op) in BIN_OPS
            ):
                op = BIN_OPS[type(v.op)]
                out.append(Candidate(REDUCTION, t.id, stmt, [t, v.left], op, False))
            elif (
                isinstance(v, ast.Call)
                and isinstance(v.func, ast.Name)
                and v.func.id in SELECTING
                and is_builtin(v.func.id)
                and len(v.args) == 2
                and not v.keywords
                and isinstance(v.args[0], ast.Name)
                and v.args[0].id == t.id
            ):
                out.append(
                    Candidate(REDUCTION, t.id, stmt, [t, v.args[0]], v.func.id, False)
                )
        for target in stmt.targets:
            for part in target_parts(target):
                if isinstance(part, ast.Subscript) and isinstance(part.value, ast.Name):
                    out.append(Candidate(WRITE, part.value.id, stmt, [part.value]))
        indexed = indexer_write(stmt)
        if indexed is not None:  # D.at[k] = v (pandas): an indexed write of D
            out.append(Candidate(WRITE, indexed[0].id, stmt, [indexed[0]]))
    return out


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


@dataclass
class _Jumps:
    """States at the ``break``s and ``continue``s of one nested loop."""

    breaks: list[State] = field(default_factory=list)
    continues: list[State] = field(default_factory=list)


class _Flow:
    """Definite-assignment walk of the loop body in evaluation order."""

    def __init__(self, ctx: _Ctx) -> None:
        self.c = ctx
        self.loop_depth = 0
        self.shadow: list[frozenset[str]] = []
        # break/continue states of the nested loops being walked, innermost last
        self.jumps: list[_Jumps] = []

    # -- helpers ---------------------------------------------------------------

    def _shadowed(self, name: str) -> bool:
        return any(name in s for s in self.shadow)

    def load(self, node: ast.Name, state: State) -> None:
        c = self.c
        n = node.id
        if id(node) in c.own or self._shadowed(n):
            return
        if n in c.sinks:
            cand = c.sinks[n]
            c.diag.add(
                node.lineno,
                node.col_offset,
                n,
                "sink-read",
                _write_once_text(n, *c.several_writes[n])
                if n in c.several_writes
                else f"`{n}` is combined across iterations ({cand.cls} on line "
                f"{cand.stmt.lineno}) and is also used here; while the loop runs in "
                f"parallel an iteration sees only its own contributions, not those "
                f"of earlier iterations. "
                + (
                    _own_key_fix(n, c.key_loop)
                    if cand.cls == WRITE
                    else f"Use `{n}` only after the loop (or give the running "
                    f"value another name inside the loop)."
                ),
            )
            c.sink_reads.setdefault(n, node.lineno)
        elif n in c.body_bound:
            if state is not None and n not in state:
                c.diag.add(
                    node.lineno,
                    node.col_offset,
                    n,
                    "loop-carried",
                    self._carried_text(n),
                )
        elif n not in c.inputs:
            c.inputs[n] = node.lineno

    def _carried_text(self, n: str) -> str:
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
        why += " Iterations run independently in parallel. "
        pick = c.selections.get(n)
        if pick is not None and pick.kind == "first":
            return why + (
                f"`{n}` keeps the first match, which depends on the iterations "
                f"before it: collect the matches (`hits.append(x)`) and take the "
                f"first after the loop (`{n} = hits[0] if hits else None`)."
            )
        if pick is not None and pick.kept and pick.op and len(pick.kept) > 1:
            return why + _running_best_text(n, pick)
        if pick is not None:
            score = pick.score or "score"
            what = {"max": "running maximum", "min": "running minimum"}
            pick_fn = pick.op or "max"  # (either way round: say both)
            either = "" if pick.op else " (or `min`, for a running minimum)"
            return why + (
                f"`{n}` keeps a {what.get(pick.op or '', 'running best')}, which "
                f"depends on the iterations before it: collect candidates "
                f"(`pairs.append(({score}, params))`) and pick after the loop "
                f"(`{pick_fn}(pairs, key=lambda t: t[0])`{either}), or write "
                f"`{n} = {pick_fn}({n}, {score})` when only the value is needed."
            )
        fix = f"Assign `{n}` before reading it on every path of the iteration"
        if loop_line is not None:
            fix += f" (e.g. `{n} = None` before the loop on line {loop_line})"
        return (
            why
            + fix
            + (
                f", or, if it accumulates, write it as a reduction (`{n} += ...`) and "
                f"read it only after the loop."
            )
        )

    def outerish(self, name: ast.Name | None, state: State) -> bool:
        """Would changing ``name``'s object in place change an object from outside?"""
        if name is None or id(name) in self.c.own:
            return False
        n = name.id
        if n in self.c.sinks:
            return False  # reported as sink-read
        if self._shadowed(n):
            return True  # comprehension variables iterate over outer data
        if n in self.c.tainted:
            return True
        return n not in self.c.body_bound and not self.c.is_builtin(n)

    def _refuse_mutation(
        self, node: ast.AST, root: ast.Name, what: str, fix: str = ""
    ) -> None:
        n = root.id
        if n in self.c.item_names and not self._shadowed(n):
            # the iteration's own item, changed in place: the engines check
            # the items and send back each one's new state, which the kernel
            # writes into its own object in iteration order (writeback.py),
            # or the run fails unmerged where that could differ from serial
            self.c.watch_items.append(getattr(node, "lineno", root.lineno))
            return
        if n in self.c.tainted or self._shadowed(n):
            owner = (
                f"`{n}` refers to an element of the loop's data or to an object that "
                f"exists before the loop"
            )
            fix = fix or (
                f"Make a new object instead (`{n} = {n} + ...`, `{n}.copy()`), "
                f"or collect the results (`results.append(...)`)."
            )
        else:
            owner = f"`{n}` exists before the loop"
            fix = fix or (
                "Collect what you need (`results.append(...)`, `d[k] = ...`) and "
                "apply the change after the loop, or run the cell serially."
            )
        self.c.diag.add(
            getattr(node, "lineno", root.lineno),
            getattr(node, "col_offset", root.col_offset),
            n,
            "outer-mutation",
            f"{what} changes an object in place; {owner}, and each engine would "
            f"change only its own copy, so the change would be lost in your "
            f"namespace (and later iterations would not see it). {fix}",
        )

    def watch(self, e: ast.expr | None, line: int) -> None:
        """An outer object reached by ``e`` may be changed by a call we cannot
        see into: the engines check it (inputs are read-only to iterations)."""
        if isinstance(e, (ast.List, ast.Tuple, ast.Set)):
            for elt in e.elts:
                self.watch(elt, line)
            return
        if isinstance(e, ast.Dict):
            for v in e.values:
                self.watch(v, line)
            return
        if isinstance(e, ast.Starred):
            self.watch(e.value, line)
            return
        root = root_name(e) if e is not None else None
        if root is None or id(root) in self.c.own:
            return
        n = root.id
        c = self.c
        if n in c.sinks or n in c.module_names:
            return
        if n in c.target_names and n in c.tainted:
            c.watch_items.append(line)
        elif n in c.tainted or self._shadowed(n):
            c.watch_all = True
        elif n not in c.body_bound and not c.is_builtin(n) and n not in ENGINE_PROVIDED:
            c.watch.setdefault(n, []).append(line)

    def note_call(self, call: ast.Call) -> None:
        """What a call could change in place: its receiver, its arguments, and
        (for a notebook function or a callable object) what it holds."""
        f = call.func
        line = call.lineno
        if isinstance(f, ast.Name):
            if self.c.is_builtin(f.id) and f.id in SAFE_BUILTINS:
                return
            self.watch(f, line)
        elif isinstance(f, ast.Attribute):
            root = root_name(f.value)
            if root is not None and root.id in self.c.module_names:
                text = ast.unparse(f)
                if is_global_random(text):
                    self.c.random_calls.append((line, text))
            else:
                self.watch(f.value, line)
        for a in call.args:
            self.watch(a, line)
        for k in call.keywords:
            self.watch(k.value, line)

    def check_call(self, call: ast.Call, state: State) -> None:
        f = call.func
        if isinstance(f, ast.Name) and f.id == "print":
            self.c.prints.append(call.lineno)
        self.note_call(call)
        if not isinstance(f, ast.Attribute):
            return
        root = root_name(f.value)
        if root is None or id(root) in self.c.own:
            return
        is_module = root.id in self.c.module_names and root.id not in self.c.tainted
        if is_module:
            if isinstance(f.value, ast.Attribute) and f.attr in MODULE_STATE_MUTATORS:
                # `sys.path.append(d)`: a module's list or dict, which each
                # engine would change in its own process only
                self._refuse_mutation(
                    call,
                    root,
                    f"`{ast.unparse(f)}(...)`",
                    f"`{ast.unparse(f.value)}` is state of the `{root.id}` module "
                    "in this process: change it before or after the loop, or run "
                    "the cell serially.",
                )
                return
            if (
                is_inplace_method(f.attr)
                or f.attr in ARGUMENT_MUTATORS
                or (f.attr == "at" and isinstance(f.value, ast.Attribute))
            ) and call.args:
                # `torch.nn.init.zeros_(w)`, `np.copyto(dst, x)`, and a ufunc's
                # `np.add.at(counts, idx, 1)`, which writes even into an array
                # made read-only (the engines' check-in cannot stop it)
                self._refuse_argument_mutation(call, call.args[0], state)
            self._refuse_out_argument(call, state)
            return
        self._refuse_out_argument(call, state)
        self._note_refit(call, f)
        if f.attr == "shuffle" and call.args:  # `rng.shuffle(x)` changes `x`
            self._refuse_argument_mutation(call, call.args[0], state)
        if is_mutating_method(f.attr) and self.outerish(root, state):
            fix = _setdefault_fix(call, root.id) if f.attr == "setdefault" else ""
            self._refuse_mutation(call, root, f"`{ast.unparse(f)}(...)`", fix)

    def _note_refit(self, call: ast.Call, f: ast.Attribute) -> None:
        """``est.fit(X, y)`` (or ``est.set_params(C=c).fit(...)``) on an
        estimator that exists before the loop, not an item of the loop: named
        first when the loop is refused (see :func:`_refit_text`)."""
        if f.attr not in REFIT_METHODS:
            return
        recv = f.value
        while isinstance(recv, ast.Call) and isinstance(recv.func, ast.Attribute):
            recv = recv.func.value  # (through `set_params(...)`, which returns it)
        root = recv if isinstance(recv, ast.Name) else None
        c = self.c
        if (
            root is None
            or id(root) in c.own
            or root.id in c.body_bound
            or root.id in c.tainted
            or root.id in c.sinks
            or root.id in c.module_names
            or self._shadowed(root.id)
            or c.is_builtin(root.id)
        ):
            return
        had = c.refits.get(root.id)
        if had is None or (  # a fit says more than set_params
            _method_name(had) == "set_params" and f.attr != "set_params"
        ):
            c.refits[root.id] = call

    def _refuse_argument_mutation(
        self, call: ast.Call, arg: ast.expr, state: State
    ) -> None:
        """``arg``, an argument the call changes in place, may be outer data."""
        arg_root = root_name(arg)
        if self.outerish(arg_root, state):
            assert arg_root is not None
            fn = ast.unparse(call.func)
            fix = (
                f"Collect what the call needs (`parts.append(...)`) and call "
                f"`{fn}({ast.unparse(arg)}, ...)` once after the loop, or change a "
                f"copy made in the iteration (`{arg_root.id}_i = "
                f"{arg_root.id}.copy()`) and collect that."
            )
            if arg_root.id in self.c.tainted or self._shadowed(arg_root.id):
                fix = ""  # the loop's own item: the generic advice fits
            self._refuse_mutation(
                call, arg_root, f"`{fn}({ast.unparse(arg)}, ...)`", fix
            )

    def _refuse_out_argument(self, call: ast.Call, state: State) -> None:
        """``out=`` names where numpy and torch write the result: in place."""
        for k in call.keywords:
            if k.arg == "out":
                for part in _out_parts(k.value):
                    root = root_name(part)
                    if self.outerish(root, state):
                        assert root is not None
                        self._refuse_mutation(
                            call,
                            root,
                            f"`{ast.unparse(call.func)}(..., out={ast.unparse(part)})`",
                        )

    def check_target_mutation(self, part: ast.expr, state: State, op: str) -> None:
        """Refuse a store into an outer object; ``op``: the augmented operator
        (``"/"`` for ``/=``), ``""`` for a plain ``=``."""
        root = root_name(part)
        if not self.outerish(root, state):
            return
        assert root is not None
        text = ast.unparse(part)
        if isinstance(part, ast.Attribute):
            what = f"`{text} {op}= ...` (attribute assignment)"
        else:
            what = f"`{text} {op}= ...`"
        self._refuse_mutation(part, root, what)

    def forbid(self, node: ast.AST, name: str, kind: str, text: str) -> None:
        self.c.diag.add(
            getattr(node, "lineno", 0), getattr(node, "col_offset", 0), name, kind, text
        )

    # -- statements --------------------------------------------------------------

    def block(self, stmts: Iterable[ast.stmt], state: State) -> State:
        for s in stmts:
            state = self.stmt(s, state)
        return state

    def store(self, target: ast.expr, state: State, op: str = "") -> State:
        for part in target_parts(target):
            if isinstance(part, ast.Name):
                if id(part) in self.c.own:
                    continue
                self.c.seen_stored.add(part.id)
                state = _add(state, [part.id])
            elif isinstance(part, ast.Subscript):
                if isinstance(part.value, ast.Name) and id(part.value) in self.c.own:
                    state = self.expr(part.slice, state)
                    continue
                state = self.expr(part.value, state)
                state = self.expr(part.slice, state)
                self.check_target_mutation(part, state, op)
            elif isinstance(part, ast.Attribute):
                state = self.expr(part.value, state)
                self.check_target_mutation(part, state, op)
            else:
                state = self.expr(part, state)
        return state

    def stmt(self, s: ast.stmt, state: State) -> State:  # noqa: C901
        m = getattr(self, "stmt_" + type(s).__name__, None)
        if m is not None:
            return m(s, state)  # type: ignore[no-any-return]
        # simple statements: evaluate every expression child in order
        for child in ast.iter_child_nodes(s):
            if isinstance(child, ast.expr):
                state = self.expr(child, state)
        return state

    def stmt_Assign(self, s: ast.Assign, state: State) -> State:
        state = self.expr(s.value, state)
        for t in s.targets:
            state = self.store(t, state)
        return state

    def stmt_AnnAssign(self, s: ast.AnnAssign, state: State) -> State:
        if s.value is None:
            return state
        state = self.expr(s.value, state)
        state = self.expr(s.annotation, state)
        return self.store(s.target, state)

    def stmt_AugAssign(self, s: ast.AugAssign, state: State) -> State:
        t = s.target
        if isinstance(t, ast.Name):
            if id(t) in self.c.own:
                return self.expr(s.value, state)
            self.load(
                ast.Name(t.id, ast.Load(), lineno=t.lineno, col_offset=t.col_offset),
                state,
            )
            state = self.expr(s.value, state)
            if t.id in self.c.tainted:
                self._refuse_mutation(
                    s, t, f"`{t.id} {_op_text(s.op)}= ...` on an alias"
                )
            self.c.seen_stored.add(t.id)
            return _add(state, [t.id])
        if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
            if id(t.value) in self.c.own:
                state = self.expr(t.slice, state)
                return self.expr(s.value, state)
        state = self.store(t, state, _op_text(s.op))
        return self.expr(s.value, state)

    def _loop(
        self,
        s: ast.For | ast.While,
        state: State,
        head: Callable[[State], State],
    ) -> State:
        """Definite assignment through a nested loop.  A loop whose body surely
        runs once (:func:`_runs_once`) leaves what that body assigns on every
        path; any other may run zero times and leaves only what held before it.
        ``break``/``continue`` states are collected, not guessed."""
        entry = s_in = state
        self.loop_depth += 1
        converged = False
        for _ in range(4):  # definite assignment converges in a pass or two
            self.jumps.append(_Jumps())
            body_end = self.block(s.body, head(s_in))
            jumps = self.jumps.pop()
            new_in = _join(entry, body_end, *jumps.continues)
            converged = new_in == s_in
            if converged:
                break
            s_in = new_in
        self.loop_depth -= 1
        # the last pass's states are lower bounds only once they converged
        runs = converged and _runs_once(s, self.c.is_builtin, self._checkable)
        if isinstance(s, ast.While):
            exhausted = None if runs else head(s_in)
        else:
            exhausted = _join(body_end, *jumps.continues) if runs else s_in
        after = self.block(s.orelse, exhausted)
        return _join(after, *jumps.breaks)

    def _checkable(self, e: ast.expr) -> bool:
        """Can the kernel tell before the run that iterating ``e`` yields an
        item?  Inputs only (names the body never binds, their attributes,
        ``range`` of those, ``len`` of those and int literals): the same value
        in every iteration, so one check in the kernel covers them all.
        Recorded, for the plan to check (``LoopPlan.nonempty``)."""
        if not self.c.assume_nonempty or not self._input_expr(e, calls=True):
            return False
        self.c.nonempty[(e.lineno, ast.unparse(e))] = None
        return True

    def _input_expr(self, e: ast.expr, calls: bool) -> bool:
        if isinstance(e, ast.Name):
            n = e.id
            return not (
                n in self.c.body_bound
                or n in self.c.tainted
                or n in self.c.sinks
                or self._shadowed(n)
                or self.c.is_builtin(n)
            )
        if isinstance(e, ast.Attribute):
            return self._input_expr(e.value, False)
        if isinstance(e, ast.Constant):
            return isinstance(e.value, int) and not calls
        if (
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Name)
            and e.func.id in ("range", "len")
            and self.c.is_builtin(e.func.id)
            and not e.keywords
            and e.args
            and (e.func.id == "range") == calls
        ):
            return all(
                not isinstance(a, ast.Starred) and self._input_expr(a, False)
                for a in e.args
            )
        if isinstance(e, ast.BinOp) and not calls:  # range(n // 2), len(x) - 1
            return self._input_expr(e.left, False) and self._input_expr(e.right, False)
        return False

    def stmt_For(self, s: ast.For, state: State) -> State:
        state = self.expr(s.iter, state)
        return self._loop(s, state, lambda st: self.store(s.target, st))

    def stmt_AsyncFor(self, s: ast.AsyncFor, state: State) -> State:
        self.forbid(s, "async for", "await", _AWAIT_TEXT)
        return self.stmt_For(s, state)  # type: ignore[arg-type]

    def stmt_While(self, s: ast.While, state: State) -> State:
        return self._loop(s, state, lambda st: self.expr(s.test, st))

    def stmt_If(self, s: ast.If, state: State) -> State:
        state = self.expr(s.test, state)
        return _join(self.block(s.body, state), self.block(s.orelse, state))

    def stmt_With(self, s: ast.With, state: State) -> State:
        for item in s.items:
            state = self.expr(item.context_expr, state)
            if item.optional_vars is not None:
                state = self.store(item.optional_vars, state)
        return self.block(s.body, state)

    def stmt_AsyncWith(self, s: ast.AsyncWith, state: State) -> State:
        self.forbid(s, "async with", "await", _AWAIT_TEXT)
        return self.stmt_With(s, state)  # type: ignore[arg-type]

    def stmt_Try(self, s: ast.Try, state: State) -> State:
        entry = state
        body_end = self.block(s.body, entry)
        else_end = self.block(s.orelse, body_end)
        ends = [else_end]
        for h in s.handlers:
            hs = entry
            if h.type is not None:
                hs = self.expr(h.type, hs)
            if h.name:
                self.c.seen_stored.add(h.name)
                hs = _add(hs, [h.name])
            end = self.block(h.body, hs)
            if h.name and end is not None:
                end = end - {h.name}  # Python deletes the name when the handler ends
                self.c.deleted.add(h.name)
            ends.append(end)
        normal = _join(*ends)
        if s.finalbody:
            self.block(
                s.finalbody, _join(entry, normal) if normal is not None else entry
            )
            return self.block(s.finalbody, normal)
        return normal

    stmt_TryStar = stmt_Try

    def stmt_Match(self, s: ast.Match, state: State) -> State:
        state = self.expr(s.subject, state)
        ends: list[State] = [state]
        for case in s.cases:
            cs = state
            for node in ast.walk(case.pattern):
                if isinstance(node, (ast.MatchValue,)):
                    cs = self.expr(node.value, cs)
                elif isinstance(node, ast.MatchClass):
                    cs = self.expr(node.cls, cs)
                name = getattr(node, "name", None) or getattr(node, "rest", None)
                if isinstance(name, str):
                    self.c.seen_stored.add(name)
                    cs = _add(cs, [name])
            if case.guard is not None:
                cs = self.expr(case.guard, cs)
            ends.append(self.block(case.body, cs))
        return _join(*ends)

    def stmt_Raise(self, s: ast.Raise, state: State) -> State:
        for e in (s.exc, s.cause):
            if e is not None:
                state = self.expr(e, state)
        return None

    def stmt_Return(self, s: ast.Return, state: State) -> State:
        self.forbid(
            s,
            "return",
            "return",
            "`return` is not allowed in the loop: the cell is not a function, and "
            "leaving the loop early makes the result depend on iteration order. "
            "Use `continue` to skip the rest of an iteration.",
        )
        if s.value is not None:
            self.expr(s.value, state)
        return None

    def stmt_Continue(self, s: ast.Continue, state: State) -> State:
        if self.jumps:  # a nested loop's: its next item starts from here
            self.jumps[-1].continues.append(state)
        return None

    def stmt_Break(self, s: ast.Break, state: State) -> State:
        if self.jumps:  # a nested loop's: the code after it starts from here
            self.jumps[-1].breaks.append(state)
        if self.loop_depth == 0:
            self.forbid(
                s,
                "break",
                "break",
                "`break` stops the loop at an iteration that depends on the "
                "iterations before it, but engines run iterations independently "
                "and all at once. Record a flag per iteration (e.g. "
                "`hits.append(i)`) and pick the first one after the loop, or run "
                "the cell serially.",
            )
        return None

    def stmt_Global(self, s: ast.Global | ast.Nonlocal, state: State) -> State:
        kw = "global" if isinstance(s, ast.Global) else "nonlocal"
        for n in s.names:
            self.forbid(
                s,
                n,
                kw,
                f"`{kw} {n}` would rebind `{n}` in an engine's namespace, not in "
                f"yours. Assign `{n}` in the loop body (it comes back as the value "
                f"of the last iteration) or collect values and combine them after "
                f"the loop.",
            )
        return state

    stmt_Nonlocal = stmt_Global

    def stmt_Delete(self, s: ast.Delete, state: State) -> State:
        for t in s.targets:
            for part in target_parts(t):
                if isinstance(part, ast.Name):
                    n = part.id
                    if n in self.c.sinks or n not in self.c.body_bound:
                        self.forbid(
                            part,
                            n,
                            "del-outer",
                            f"`del {n}` deletes a name that exists before the loop; "
                            f"an engine can delete only its own copy. Delete `{n}` "
                            f"after the loop.",
                        )
                        continue
                    self.load(
                        ast.Name(
                            n,
                            ast.Load(),
                            lineno=part.lineno,
                            col_offset=part.col_offset,
                        ),
                        state,
                    )
                    self.c.deleted.add(n)
                    if state is not None:
                        state = state - {n}
                else:
                    if (
                        isinstance(part, ast.Subscript)
                        and isinstance(part.value, ast.Name)
                        and part.value.id in self.c.own_elements
                        and id(part.value) in self.c.own
                    ):
                        # `del D[k]` of the own key: recorded, deleted at merge
                        state = self.expr(part.slice, state)
                        continue
                    if isinstance(part, (ast.Subscript, ast.Attribute)):
                        state = self.expr(part.value, state)
                        if isinstance(part, ast.Subscript):
                            state = self.expr(part.slice, state)
                        root = root_name(part)
                        if self.outerish(root, state):
                            assert root is not None
                            self._refuse_mutation(
                                part, root, f"`del {ast.unparse(part)}`"
                            )
        return state

    def stmt_Import(self, s: ast.Import | ast.ImportFrom, state: State) -> State:
        names = []
        for alias in s.names:
            if alias.name == "*":
                self.forbid(
                    s,
                    "*",
                    "star-import",
                    "`from ... import *` in the loop binds names the analysis cannot "
                    "see. Import the names you use explicitly.",
                )
                continue
            names.append(alias.asname or alias.name.split(".")[0])
        self.c.seen_stored.update(names)
        return _add(state, names)

    stmt_ImportFrom = stmt_Import

    def _nested(self, node: ast.AST, state: State) -> State:
        """A def/lambda/class: outer parts now, free names read at definition."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for d in [*node.args.defaults, *node.args.kw_defaults]:
                if d is not None:
                    state = self.expr(d, state)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for d in node.decorator_list:
                state = self.expr(d, state)
        if isinstance(node, ast.ClassDef):
            for b in [*node.bases, *(k.value for k in node.keywords)]:
                state = self.expr(b, state)
        free = nested_free_loads(node)
        free_names = {f.id for f in free}
        for name in free:
            self.load(name, state)
        for inner in nested_statements(node):
            if isinstance(inner, (ast.Global, ast.Nonlocal)):
                self.stmt_Global(inner, state)
            elif isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute):
                root = root_name(inner.func.value)
                if root is not None and root.id in free_names:
                    self.check_call(inner, state)
            elif isinstance(inner, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = (
                    inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                )
                for t in targets:
                    for part in target_parts(t):
                        if isinstance(part, (ast.Attribute, ast.Subscript)):
                            root = root_name(part)
                            if root is not None and root.id in free_names:
                                op = (
                                    _op_text(inner.op)
                                    if isinstance(inner, ast.AugAssign)
                                    else ""
                                )
                                self.check_target_mutation(part, state, op)
        return state

    def stmt_FunctionDef(self, s: ast.FunctionDef, state: State) -> State:
        state = self._nested(s, state)
        self.c.seen_stored.add(s.name)
        return _add(state, [s.name])

    stmt_AsyncFunctionDef = stmt_FunctionDef
    stmt_ClassDef = stmt_FunctionDef

    # -- expressions ---------------------------------------------------------------

    def _own_read(self, e: ast.AST) -> ast.Name | None:
        """``S[i]``, ``S[i, ...]`` or ``S.at[i, ...]`` (any indexer) read, ``S``
        written only at the loop's own index ``i``: the sink's name node."""
        if not (isinstance(e, ast.Subscript) and isinstance(e.ctx, ast.Load)):
            return None
        base = e.value
        if isinstance(base, ast.Attribute) and base.attr in INDEXERS:
            base = base.value
        if not isinstance(base, ast.Name) or self._shadowed(base.id):
            return None
        i = self.c.own_elements.get(base.id)
        if i is not None and _is_own_key(e.slice, i):
            return base
        keys = self.c.write_keys.get(base.id)
        if keys is None:
            return None
        reads = _read_keys(e, ("loc",), self.c.literal_keys)
        if reads and all(_differ(k, r) for k in keys for r in reads):
            return base  # (keys no iteration writes: their values from before)
        return None

    def expr(self, e: ast.AST, state: State) -> State:  # noqa: C901
        own = self._own_read(e)
        if own is not None:
            # the iteration's own element (or row), which only this iteration
            # writes: it reads the value from before the loop, serially as here
            self.c.inputs.setdefault(own.id, e.lineno)  # type: ignore[attr-defined]
            return self.expr(e.slice, state)  # type: ignore[attr-defined]
        if isinstance(e, ast.Name):
            if isinstance(e.ctx, ast.Load):
                self.load(e, state)
            return state
        if isinstance(e, ast.NamedExpr):
            state = self.expr(e.value, state)
            self.c.seen_stored.add(e.target.id)
            return _add(state, [e.target.id])
        if isinstance(e, ast.BoolOp):
            first = self.expr(e.values[0], state)
            st = first
            for v in e.values[1:]:
                st = self.expr(v, st)
            return first
        if isinstance(e, ast.IfExp):
            state = self.expr(e.test, state)
            return _join(self.expr(e.body, state), self.expr(e.orelse, state))
        if isinstance(e, ast.Lambda):
            return self._nested(e, state)
        if isinstance(e, COMPREHENSIONS):
            return self._comprehension(e, state)
        if isinstance(e, (ast.Await, ast.Yield, ast.YieldFrom)):
            kw = {ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield"}[
                type(e)
            ]
            self.forbid(
                e,
                kw,
                kw,
                _AWAIT_TEXT
                if kw == "await"
                else "`yield` is not allowed in the loop: the cell is not a "
                "generator. Collect the values in a list instead.",
            )
        if isinstance(e, ast.Call):
            self.check_call(e, state)
        for child in ast.iter_child_nodes(e):
            if isinstance(child, ast.keyword):
                state = self.expr(child.value, state)
            elif isinstance(child, ast.expr):
                state = self.expr(child, state)
        return state

    def _comprehension(self, e: ast.AST, state: State) -> State:
        gens: list[ast.comprehension] = e.generators  # type: ignore[attr-defined]
        before = self.expr(gens[0].iter, state)
        st = before
        names = frozenset(n.id for g in gens for n in target_names(g.target))
        self.shadow.append(names)
        try:
            for i, g in enumerate(gens):
                if g.is_async:
                    self.forbid(g.iter, "async for", "await", _AWAIT_TEXT)
                if i:
                    st = self.expr(g.iter, st)
                for cond in g.ifs:
                    st = self.expr(cond, st)
            if isinstance(e, ast.DictComp):
                st = self.expr(e.key, st)
                st = self.expr(e.value, st)
            else:
                st = self.expr(e.elt, st)  # type: ignore[attr-defined]
        finally:
            self.shadow.pop()
        return before


_AWAIT_TEXT = (
    "`await`/`async` is not allowed in the parallel loop: engines run the body as "
    "plain synchronous code. Call a synchronous function, or run the cell serially."
)


#: methods only lists, dicts and sets have (no module function is called so):
#: on a module's attribute (`sys.path.append`) they change module state
#: functions of a module (numpy's, heapq's, random's) that change their
#: first argument in place: `np.copyto(dst, src)`, `heapq.heappush(h, x)`
ARGUMENT_MUTATORS = frozenset(
    {
        "copyto",
        "put",
        "place",
        "putmask",
        "put_along_axis",
        "fill_diagonal",
        "shuffle",
        "heapify",
        "heappush",
        "heappop",
        "heapreplace",
        "heappushpop",
    }
)


def _out_parts(e: ast.expr) -> list[ast.expr]:
    """The arrays an ``out=`` value names (a ufunc takes a tuple of them)."""
    if isinstance(e, (ast.Tuple, ast.List)):
        return [x for elt in e.elts for x in _out_parts(elt)]
    if isinstance(e, ast.Constant):
        return []  # out=None
    return [e]


MODULE_STATE_MUTATORS = frozenset(
    {"append", "extend", "insert", "remove", "setdefault", "popitem", "discard"}
)


#: the source text of every binary operator (messages quote the user's own)
OP_TEXT: dict[type[ast.operator], str] = {
    **BIN_OPS,
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.LShift: "<<",
    ast.RShift: ">>",
}


def _op_text(op: ast.operator) -> str:
    """``/`` for ``ast.Div()``: the operator as the user wrote it."""
    return OP_TEXT[type(op)]


def _element_fix(name: str) -> str:
    """Advice for ``h[k] = []`` beside ``h[k].append(x)`` (or ``+=``) that was
    not proven to be the iteration's own new element."""
    return (
        f"To fill a new element per key, make it new at the top of the loop "
        f"body, before any other use of `{name}`, under the loop variable "
        f"itself (`{name}[k] = []`, then `{name}[k].append(...)`); or build it "
        f"in a local and store it once (`h = []`, `h.append(...)`, "
        f"`{name}[k] = h`)."
    )


def _mixed_depths(cs: list[Candidate]) -> bool:
    """``A[i] *= 2`` beside ``A[i, :2] += 1``: one row written at two depths."""
    tuples: set[bool] = set()
    for c in cs:
        st = c.stmt
        if isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Subscript):
            tuples.add(isinstance(st.target.slice, ast.Tuple))
    return len(tuples) > 1


def _row_depth_fix(name: str) -> str:
    """The own-row form of mixed-depth row updates (numpy/torch rows)."""
    return (
        f" If each iteration changes only its own row `{name}[i]` (`i` from "
        f"`range` or `enumerate`), write every statement one level into the "
        f"row (`{name}[i, :] *= 2` beside `{name}[i, :2] += 1`): own-row writes "
        f"are accepted."
    )


def _own_key_fix(name: str, key_loop: tuple[str, str] | None = None) -> str:
    """Advice for ``for k in d: d[k] = f(d[k])``: forms that are accepted;
    ``key_loop``: the loop's variable and iterable when its items are keys
    that may repeat (``for c in cols``)."""
    if key_loop is not None and name not in _identifiers(key_loop[1]):
        k, it = key_loop
        return (
            f"`{name}[{k}]` is each iteration's own item only when no two items "
            f"of `{it}` are equal (serially a repeated key's second write would "
            f"read what the first wrote), which the cell does not show: loop "
            f"over keys that cannot repeat: `{name}.items()` (`for {k}, v in "
            f"{name}.items(): {name}[{k}] = f(v)`), `{name}.columns` (or a slice "
            f"of it, or `{name}.select_dtypes(...).columns`) for a DataFrame, "
            f"`dict.fromkeys({it})`, or a literal list of distinct keys "
            f"(`for {k} in ['a', 'b']:`); or write into another name (`new[{k}] "
            f"= f({name}[{k}])`) and apply it after the loop."
        )
    return (
        f"If each iteration reads and writes only its own item, loop over "
        f"`{name}.items()` (`for k, v in {name}.items(): {name}[k] = f(v)`) for "
        f"a dict, or `range(len({name}))` for a list or array; or write into "
        f"another name (`new[k] = f({name}[k])`) and apply it after the loop "
        f"(`for k, v in new.items(): {name}[k] = v`)."
    )


#: methods that refit an estimator (scikit-learn's, Keras', statsmodels'
#: results aside) or change its parameters in place
REFIT_METHODS = frozenset(
    {"fit", "partial_fit", "fit_transform", "fit_predict", "fit_resample",
     "set_params"}
)  # fmt: skip


def _method_name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else ""


def _refit_text(name: str, call: ast.Call) -> str:
    """The change that matters in a refused loop that refits ``name``."""
    what = f"`{ast.unparse(call.func)}(...)`"
    if _method_name(call) == "set_params":
        serially = (
            f"every iteration changes that one object (each sees the parameters "
            f"the one before set, and after the loop `{name}` has the last)"
        )
    else:
        serially = (
            f"every iteration refits that one object (each starts from the one "
            f"before, and after the loop `{name}` is the last fit)"
        )
    return (
        f"{what} changes `{name}`, which exists before the loop: serially "
        f"{serially}, while each "
        f"engine would change only its own copy, and the run would stop when "
        f"the engines' check finds `{name}` changed. Make a new estimator in "
        f"each iteration (`m = sklearn.base.clone({name})`, then "
        f"`m.set_params(...)` and `m.fit(...)`, or `m = Model(...)`) and collect "
        f"what you need (`scores[k] = m.score(...)`, `models.append(m)`); a loop "
        f"over the models themselves (`for m in models: m.fit(X, y)`) runs in "
        f"parallel and writes each one back."
    )


def _write_once_text(name: str, key: str, lines: list[int]) -> str:
    """Why ``S[i] = f(S[i])`` then ``S[i] = g(S[i])`` is refused, and the
    rewrite that is accepted: one write."""
    if len(lines) > 1:
        where = f"on lines {', '.join(map(str, lines[:-1]))} and {lines[-1]}"
    else:
        where = f"in a nested loop (line {lines[0]})"
    own = f"{name}[{key}]"
    return (
        f"each iteration uses only its own `{own}`, but writes it {where} and "
        f"reads what it wrote. An engine reads `{own}` as it was before "
        f"the loop, so that runs in parallel only for plain operators on the "
        f"elements of a list or dict by position (an array would cast what it "
        f"stores, a frame align it). Keep the value in a local and write it "
        f"once (`v = {own}`, `v = f(v)`, `v = g(v)`, then `{own} = v`): one "
        f"write of the iteration's own item, read only before it, is accepted."
    )


def _identifiers(text: str) -> set[str]:
    tree = ast.parse(text, mode="eval")
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _setdefault_fix(call: ast.Call, name: str) -> str:
    """Advice for ``D.setdefault(k, []).append(v)``: the ``defaultdict`` form is
    a keyed gather; other defaults (``set()``) are built after the loop."""
    default = call.args[1] if len(call.args) == 2 else None
    k = ast.unparse(call.args[0]) if call.args else "k"
    is_list = isinstance(default, (ast.List, ast.ListComp)) or (
        isinstance(default, ast.Call)
        and isinstance(default.func, ast.Name)
        and default.func.id == "list"
    )
    if is_list:
        return (
            f"Make `{name}` a `collections.defaultdict(list)` before the loop and "
            f"write `{name}[{k}].append(...)` (or `.extend(...)`) in it: the lists "
            f"per key are gathered in iteration order."
        )
    return (
        f"Collect the pairs (`pairs.append(({k}, value))`) and run this "
        f"statement after the loop (`for {k}, value in pairs: ...`), where it "
        f"changes `{name}` itself."
    )


def _loop_bindings(stmts: Iterable[ast.stmt]) -> dict[str, int]:
    """Names bound by a nested loop (its target or body) -> the line of the
    innermost such loop: where to initialise a name the loop may not assign."""
    out: dict[str, int] = {}
    for s in stmts:  # pre-order: an inner loop overwrites its outer one
        if isinstance(s, (ast.For, ast.AsyncFor, ast.While)):
            parts: list[ast.AST] = list(s.body)
            if not isinstance(s, ast.While):
                parts.append(s.target)
            for n in bindings_of(node for p in parts for node in scope_nodes(p)):
                out[n] = s.lineno
    return out


@dataclass(frozen=True)
class _Selection:
    """A name kept as a first match (``kind == "first"``) or a running best
    (``"best"``): ``op`` is ``"max"`` or ``"min"`` when the test says which
    (``if loss < best: best = loss`` keeps a minimum), and ``score`` the text
    of what it is compared with (``loss``) when that is a name."""

    kind: str
    op: str | None = None
    score: str | None = None
    # `<`/`>` (the first of equal scores is kept) rather than `<=`/`>=`
    strict: bool = True
    # what the test's branch assigns: name -> the value's text (`closest = j`)
    kept: tuple[tuple[str, str], ...] = ()


#: ``x OP name``: a new ``x`` is taken when it is smaller (min) or larger (max)
_TAKES_WHEN_RIGHT = {ast.Lt: "min", ast.LtE: "min", ast.Gt: "max", ast.GtE: "max"}
_FLIP = {"min": "max", "max": "min"}


def _best_direction(node: ast.Compare, name: str) -> tuple[str | None, str | None]:
    """``("min", "loss")`` for ``loss < best`` or ``best > loss`` (the value
    is replaced when the test holds), ``(None, None)`` when it cannot tell."""
    sides = [node.left, *node.comparators]
    for k, side in enumerate(sides):
        if not (isinstance(side, ast.Name) and side.id == name):
            continue
        if k > 0:  # `other OP name`
            op, other = node.ops[k - 1], sides[k - 1]
            took = _TAKES_WHEN_RIGHT.get(type(op))
        else:  # `name OP other`: reversed
            op, other = node.ops[0], sides[1]
            took = _TAKES_WHEN_RIGHT.get(type(op))
            took = _FLIP[took] if took else None
        score = other.id if isinstance(other, ast.Name) else None
        return took, score
    return None, None


def _selection_kind(
    test: ast.expr, name: str, when_false: bool = False
) -> _Selection | None:
    """A first match for a test like ``name is None`` / ``not name``, a
    running best for an ordering (``score > name``), else ``None``;
    ``when_false``: ``name`` is assigned when the test fails (an ``else``)."""
    negated: set[int] = set()
    for node in ast.walk(test):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            if isinstance(node.operand, ast.Name) and node.operand.id == name:
                return _Selection("first")
            negated |= {id(n) for n in ast.walk(node.operand)}
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if not any(isinstance(x, ast.Name) and x.id == name for x in sides):
                continue
            if any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
                return _Selection("first")
            if any(
                isinstance(op, (ast.Lt, ast.Gt, ast.LtE, ast.GtE)) for op in node.ops
            ):
                op, score = _best_direction(node, name)
                if op is not None and when_false:
                    op = _FLIP[op]
                if id(node) in negated or (
                    isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or)
                ):
                    op = None  # (under `not` or `or`: which way is not plain)
                strict = all(isinstance(o, (ast.Lt, ast.Gt)) for o in node.ops)
                return _Selection("best", op, score, strict != when_false)
    return None


def _assigned(body: Iterable[ast.stmt]) -> set[str]:
    return {
        n.id
        for st in block_statements(body)
        if isinstance(st, (ast.Assign, ast.AnnAssign))
        for t in (st.targets if isinstance(st, ast.Assign) else [st.target])
        for n in target_names(t)
    }


def _selections(stmts: Iterable[ast.stmt]) -> dict[str, _Selection]:
    """Names the body re-assigns under a test that reads them (``if score >
    best: best = score``, ``if found is None: found = x``): a running best or a
    first match, for which a reduction is the wrong advice."""
    out: dict[str, _Selection] = {}
    for s in stmts:
        # (test, names assigned when it holds, names assigned when it fails)
        guarded: list[tuple[ast.expr, set[str], set[str]]] = []
        if isinstance(s, ast.If):
            guarded.append((s.test, _assigned(s.body), _assigned(s.orelse)))
        elif isinstance(s, ast.Assign) and isinstance(s.value, ast.IfExp):
            names = _assigned([s])
            # `best = best if best > x else x`: the new value comes when it fails
            keeps = {
                n
                for n in names
                if isinstance(s.value.body, ast.Name) and s.value.body.id == n
            }
            guarded.append((s.value.test, names - keeps, keeps))
        for test, if_true, if_false in guarded:
            kept = _simple_assignments(s.body) if isinstance(s, ast.If) else {}
            for n in sorted(if_true | if_false):
                kind = _selection_kind(test, n, when_false=n not in if_true)
                if kind is not None and n in kept and not kind.kept:
                    kind = dataclasses.replace(kind, kept=tuple(kept.items()))
                if kind is not None:
                    out.setdefault(n, kind)
    return out


def _running_best_text(n: str, pick: _Selection) -> str:
    """The advice for a running best kept with what goes with it (``if d <
    best_d: best_i, best_d = i, d``): the pairs, and the pick after the loop
    with the same choice among equal scores."""
    kept = dict(pick.kept)
    score = kept[n]
    others = [k for k in kept if k != n]
    names = ", ".join([n, *others])
    values = ", ".join([score, *(kept[k] for k in others)])
    what = {"max": "running maximum", "min": "running minimum"}[pick.op or "max"]
    pairs = "pairs" if pick.strict else "reversed(pairs)"
    ties = "first" if pick.strict else "last"
    return (
        f"`{n}` keeps a {what} (with {', '.join(f'`{k}`' for k in others)}), "
        "which depends on the iterations before it: collect the candidates "
        f"(`pairs = [({names})]` before the loop, `pairs.append(({values}))` in "
        f"it) and pick after the loop (`{names} = "
        f"{pick.op}({pairs}, key=lambda t: t[0])`, which keeps the {ties} of "
        "equal scores, as the loop does)."
    )


def _simple_assignments(body: list[ast.stmt]) -> dict[str, str]:
    """``name -> value text`` for the plain assignments of a branch
    (``best = d``, ``best_i, best_d = i, d``), in order."""
    out: dict[str, str] = {}
    for st in body:
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1):
            continue
        t, v = st.targets[0], st.value
        if isinstance(t, ast.Name):
            out[t.id] = ast.unparse(v)
        elif (
            isinstance(t, ast.Tuple)
            and isinstance(v, ast.Tuple)
            and len(t.elts) == len(v.elts)
            and all(isinstance(e, ast.Name) for e in t.elts)
        ):
            for e, val in zip(t.elts, v.elts, strict=True):
                out[e.id] = ast.unparse(val)  # type: ignore[attr-defined]
    return out


def _int_literal(e: ast.expr) -> int | None:
    """``3`` or ``-3`` written as a literal (not a bool), else ``None``."""
    sign = 1
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
        sign, e = -1, e.operand
    if isinstance(e, ast.Constant) and type(e.value) is int:
        return sign * e.value
    return None


def _nonempty(
    e: ast.expr,
    is_builtin: Callable[[str], bool],
    checkable: Callable[[ast.expr], bool] = lambda e: False,
) -> bool:
    """Does iterating ``e`` surely yield an item?  Literals: ``range`` of int
    literals, a display with an item that is not ``*starred``, a non-empty
    string, ``enumerate``/``zip`` of those; and what ``checkable`` says the
    kernel checks before the run (a loader, ``range(epochs)``).  Anything else
    may be empty."""
    if isinstance(e, (ast.List, ast.Tuple, ast.Set)):
        return any(not isinstance(x, ast.Starred) for x in e.elts)
    if isinstance(e, ast.Dict):
        return any(k is not None for k in e.keys)
    if isinstance(e, ast.Constant):
        return isinstance(e.value, (str, bytes)) and len(e.value) > 0
    if not (
        isinstance(e, ast.Call)
        and isinstance(e.func, ast.Name)
        and is_builtin(e.func.id)
        and e.args
        and not any(isinstance(a, ast.Starred) for a in e.args)
    ):
        return checkable(e)
    f, args = e.func.id, e.args
    if f == "range" and not e.keywords and len(args) <= 3:
        bounds = [_int_literal(a) for a in args]
        ints = [b for b in bounds if b is not None]
        if len(ints) == len(args):
            return (len(args) < 3 or ints[2] != 0) and (len(range(*ints)) > 0)
        return checkable(e)
    if f == "enumerate":
        return _nonempty(args[0], is_builtin, checkable)
    if f == "zip":
        return all(_nonempty(a, is_builtin, checkable) for a in args)
    return False


def _runs_once(
    s: ast.For | ast.While,
    is_builtin: Callable[[str], bool],
    checkable: Callable[[ast.expr], bool] = lambda e: False,
) -> bool:
    """A nested ``for`` over a surely non-empty iterable runs its body at least
    once; a ``while True:`` leaves only by ``break`` (or an exception)."""
    if isinstance(s, ast.While):
        t = s.test
        return isinstance(t, ast.Constant) and bool(t.value)
    return _nonempty(s.iter, is_builtin, checkable)


def _alias_expr(e: ast.AST, is_outer: Callable[[str], bool]) -> bool:
    """Could evaluating ``e`` return an object from outside (not a new one)?"""
    if isinstance(e, (ast.Name, ast.Attribute, ast.Subscript, ast.Starred)):
        root = root_name(e)
        return root is not None and is_outer(root.id)
    if isinstance(e, ast.IfExp):
        return _alias_expr(e.body, is_outer) or _alias_expr(e.orelse, is_outer)
    if isinstance(e, ast.BoolOp):
        return any(_alias_expr(v, is_outer) for v in e.values)
    if isinstance(e, (ast.Tuple, ast.List)):
        return any(_alias_expr(v, is_outer) for v in e.elts)
    if isinstance(e, ast.NamedExpr):
        return _alias_expr(e.value, is_outer)
    return False


def _mentions(e: ast.AST, is_outer: Callable[[str], bool]) -> bool:
    return any(
        isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and is_outer(n.id)
        for n in ast.walk(e)
    )


#: builtins that consume their argument before the loop starts: a sink named in
#: them (``range(len(a))``) is read once, as serially, not iterated lazily
_EAGER = frozenset(
    {
        "len", "list", "tuple", "sorted", "set", "frozenset", "dict", "sum",
        "min", "max", "range",
    }
)  # fmt: skip


def _lazy_names(e: ast.AST, is_builtin: Callable[[str], bool]) -> Iterator[ast.Name]:
    """Names an iterable expression reads lazily (not inside an eager builtin)."""
    if (
        isinstance(e, ast.Call)
        and isinstance(e.func, ast.Name)
        and e.func.id in _EAGER
        and is_builtin(e.func.id)
    ):
        return
    if (
        isinstance(e, ast.Call)
        and isinstance(e.func, ast.Attribute)
        and e.func.attr in _COPYING_METHODS
    ):
        return  # a new object, made before the loop runs (its arguments too)
    if isinstance(e, ast.Name):
        yield e
        return
    for child in ast.iter_child_nodes(e):
        yield from _lazy_names(child, is_builtin)


#: methods that return a new object (a copy, a sorted or filtered one): an
#: iterable made with one does not see what the body changes afterwards
_COPYING_METHODS = frozenset(
    {
        "copy",
        "sort_values",
        "sort_index",
        "drop_duplicates",
        "unique",
        "tolist",
        "to_list",
        "value_counts",
        "nlargest",
        "nsmallest",
    }
)


def _own_index(
    loop_target: ast.expr, loop_iter: ast.expr | None, is_builtin: Callable[[str], bool]
) -> str | None:
    """The loop's index name when every iteration has a distinct one: the target
    of ``range(...)``, or the first name of ``enumerate(...)``'s target."""
    if loop_iter is None:
        return None
    if _is_range(loop_iter, is_builtin) and isinstance(loop_target, ast.Name):
        return loop_target.id
    if (
        isinstance(loop_iter, ast.Attribute)
        and loop_iter.attr == "index"
        and isinstance(loop_target, ast.Name)
    ):
        # a frame's labels (`for idx in df.index`): distinct when the index is
        # unique, which the kernel checks before the loop runs
        return loop_target.id
    if (
        isinstance(loop_iter, ast.Call)
        and isinstance(loop_iter.func, ast.Attribute)
        and loop_iter.func.attr in ("iterrows", "items")
        and not loop_iter.args
        and isinstance(loop_target, ast.Tuple)
        and loop_target.elts
        and isinstance(loop_target.elts[0], ast.Name)
    ):
        # pandas rows by label: distinct when the index is unique, which the
        # kernel checks before the loop runs
        return loop_target.elts[0].id
    if (
        isinstance(loop_iter, ast.Call)
        and isinstance(loop_iter.func, ast.Name)
        and loop_iter.func.id == "enumerate"
        and is_builtin("enumerate")
        and isinstance(loop_target, ast.Tuple)
        and loop_target.elts
        and isinstance(loop_target.elts[0], ast.Name)
    ):
        return loop_target.elts[0].id
    return None


def _labels_owner(loop_iter: ast.expr | None) -> str | None:
    """``X`` when the loop iterates over ``X``'s labels (``X.index``,
    ``X.iterrows()``, ``X.items()``), else ``None`` (positions: distinct)."""
    node = loop_iter
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr not in ("iterrows", "items"):
            return None
        node = node.func
    elif not (isinstance(node, ast.Attribute) and node.attr == "index"):
        return None
    base = node.value if isinstance(node, ast.Attribute) else None
    return base.id if isinstance(base, ast.Name) else "<expression>"


#: calls whose items are distinct by construction (hash-equal items collapse)
_DISTINCT_MAKERS = frozenset({"set", "frozenset"})
#: builtins that keep the items of a distinct iterable distinct
_DISTINCT_KEEPERS = frozenset({"sorted", "list", "tuple", "reversed"})


def _columns_of(e: ast.expr) -> str | None:
    """``X`` for ``X.columns``, ``X.columns[a:b]``, ``X.columns.tolist()``,
    ``X.columns.drop(...)``, ``X.select_dtypes(...).columns``, ``X.keys()``:
    labels of ``X``'s columns (or a dict's keys), distinct when ``X``'s are
    (which the kernel checks for a written ``X``), else ``None``."""
    while True:
        if isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Slice):
            e = e.value  # a slice keeps them distinct (not a list of positions)
        elif (
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Attribute)
            and e.func.attr in ("tolist", "to_list", "drop")
        ):
            e = e.func.value  # (a subset, in order)
        else:
            break
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute):
        if e.func.attr == "keys" and not e.args and not e.keywords:
            base = e.func.value
            return base.id if isinstance(base, ast.Name) else None
    if not (isinstance(e, ast.Attribute) and e.attr == "columns"):
        return None
    base = e.value
    if (
        isinstance(base, ast.Call)
        and isinstance(base.func, ast.Attribute)
        and base.func.attr == "select_dtypes"
    ):
        base = base.func.value
    return base.id if isinstance(base, ast.Name) else None


def _distinct_items(
    e: ast.expr, is_builtin: Callable[[str], bool]
) -> tuple[bool, str | None]:
    """Whether every item of the iterable ``e`` is a key no other item equals,
    and of which name's labels that depends on: ``(True, None)`` for a
    literal of distinct constants, ``set(...)``, ``dict.fromkeys(...)`` (and
    ``sorted``/``list``/``tuple`` of those); ``(True, "X")`` for ``X``'s
    columns; ``(False, None)`` when items may repeat (``for c in cols``)."""
    if isinstance(e, (ast.List, ast.Tuple, ast.Set)):
        # strings or ints only: `True` and `None` index a whole array (a mask,
        # a new axis), `...` too; `-3` is no constant (a negative position)
        values = [v.value if isinstance(v, ast.Constant) else None for v in e.elts]
        if not all(
            isinstance(v, (str, int, bytes)) and not isinstance(v, bool) for v in values
        ):
            return False, None
        # one type: a Series takes `s[0]` as the first position when its
        # labels are strings, so `[0, "a"]` may name one element twice
        one_type = len({type(v) for v in values}) <= 1
        return one_type and len(set(values)) == len(values), None
    if isinstance(e, ast.Call) and not e.keywords:
        f = e.func
        if isinstance(f, ast.Attribute) and f.attr == "copy" and not e.args:
            # `for k in prices.copy()`: the same keys (a list's items are its
            # values: the engine program checks a written one is a mapping)
            return _distinct_items(f.value, is_builtin)
        if isinstance(f, ast.Name) and is_builtin(f.id) and len(e.args) == 1:
            if f.id in _DISTINCT_MAKERS:
                return True, None
            if f.id in _DISTINCT_KEEPERS:
                return _distinct_items(e.args[0], is_builtin)
        if (
            isinstance(f, ast.Attribute)
            and f.attr == "fromkeys"
            and isinstance(f.value, ast.Name)
            and f.value.id == "dict"
            and is_builtin("dict")
            and len(e.args) == 1
        ):
            return True, None
    if isinstance(e, ast.Name):
        # the written mapping itself (`for k in settings: settings[k] = ...`):
        # a dict's keys, a frame's columns; the engine program checks it is one
        return True, e.id
    owner = _columns_of(e)
    return owner is not None, owner


def _nonnegative(e: ast.expr) -> bool:
    n = _int_literal(e)
    return n is not None and n >= 0


def _key_check(
    loop_iter: ast.expr | None, is_builtin: Callable[[str], bool]
) -> str | None:
    """Which keys of ``loop_iter`` may name one element twice: ``"range"``
    for a ``range`` that may reach negative positions (``range(k, n)``; not
    ``range(n)``, ``range(1, n)``, ``range(n - 1, -1, -1)``), ``"any"`` for
    the items of ``set(..)``, ``dict.fromkeys(..)`` (distinct as dict keys,
    not as positions), ``"mapping"`` for the written sink itself (``for k in
    d``: keys only if ``d`` is a dict or a frame), ``None`` for
    ``enumerate``, labels, columns and literals of strings and ints."""
    if loop_iter is None:
        return None
    if _is_range(loop_iter, is_builtin):
        assert isinstance(loop_iter, ast.Call)
        args = loop_iter.args
        step = _int_literal(args[2]) if len(args) == 3 else 1
        if len(args) <= 1:
            return None
        if step is not None and step > 0 and _nonnegative(args[0]):
            return None
        stop = _int_literal(args[1]) if len(args) > 1 else None
        if step is not None and step < 0 and stop is not None and stop >= -1:
            return None
        return "range"
    if (
        isinstance(loop_iter, ast.Call)
        and isinstance(loop_iter.func, ast.Name)
        and loop_iter.func.id == "enumerate"
        and is_builtin("enumerate")
    ):
        return None
    if _labels_owner(loop_iter) is not None or isinstance(
        loop_iter, (ast.List, ast.Tuple, ast.Set)
    ):
        return None
    inner = loop_iter
    while (
        isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Name)
        and inner.func.id in _DISTINCT_KEEPERS
        and is_builtin(inner.func.id)
        and len(inner.args) == 1
    ):
        inner = inner.args[0]
    if isinstance(inner, ast.Name):
        return "mapping"  # (iterating a list gives values, not keys)
    return None if _columns_of(loop_iter) is not None else "any"


def _own_key(
    loop_target: ast.expr, loop_iter: ast.expr | None, is_builtin: Callable[[str], bool]
) -> tuple[str, str | None] | None:
    """``(k, owner)`` when the loop's variable ``k`` is a distinct key in
    every iteration, not a position: a column of ``owner``'s (``for c in
    df.columns``) or one of a literal list of distinct names (``for c in
    ["a", "b"]``, ``owner`` ``None``).  ``for c in cols`` is not: a list's
    items may repeat, and serially the second ``df[c] = f(df[c])`` would read
    what the first wrote."""
    if loop_iter is None or not isinstance(loop_target, ast.Name):
        return None
    distinct, owner = _distinct_items(loop_iter, is_builtin)
    return (loop_target.id, owner) if distinct else None


def _is_own_key(key: ast.expr, i: str) -> bool:
    """``i``, or a tuple led by ``i`` (``a[i, 0]``, ``df.at[i, "c"]``): the
    iteration's own row."""
    if isinstance(key, ast.Tuple) and key.elts:
        key = key.elts[0]
    return isinstance(key, ast.Name) and key.id == i


def _own_elements(
    writes: dict[str, list[Candidate]],
    body: list[ast.stmt],
    loop_target: ast.expr,
    loop_iter: ast.expr | None,
    bound: set[str],
    is_builtin: Callable[[str], bool],
    several: dict[str, tuple[str, list[int]]] | None = None,
) -> dict[str, str]:
    """Write sinks ``S`` the iteration reads and writes only at its own element:
    one statement ``S[i] = ...`` (not inside a nested loop) with ``i`` the loop's
    distinct, never reassigned index, and every read of ``S`` an ``S[i]`` in that
    statement's value or before it.  Iteration ``i`` alone touches ``S[i]``, and
    reads it only before writing it, so it sees the value from before the loop,
    serially as on an engine.

    ``several`` receives ``S -> (i, lines)`` for the sinks read and written
    only at ``S[i]`` but written by more than one statement (or in a nested
    loop), for the refusal's advice: write it once from a local."""
    i = _own_index(loop_target, loop_iter, is_builtin)
    # labels (`X.index`, `X.iterrows()`, `X.items()`, `X.columns`) are distinct
    # only when X's labels are unique, which the kernel checks for the written
    # sink: so they are the own index of X alone, never of another name
    # written with them
    labels_of = _labels_owner(loop_iter)
    if i is None:
        # a distinct key (`for c in df.columns: df[c] = df[c].fillna(0)`)
        key = _own_key(loop_target, loop_iter, is_builtin)
        if key is not None:
            i, labels_of = key
    if i is None or i in bound:  # `bound`: what the body itself assigns
        return {}
    in_loops = {
        id(s)
        for outer in block_statements(body)
        if isinstance(outer, (ast.For, ast.AsyncFor, ast.While))
        for s in block_statements([*outer.body, *outer.orelse])
    }
    out = {}
    for name, cands in writes.items():
        if labels_of is not None and labels_of != name:
            continue
        stmts = {id(c.stmt): c.stmt for c in cands}
        if len(stmts) != 1 or any(id(w) in in_loops for w in stmts.values()):
            if several is not None and _only_at(name, i, body):
                several[name] = (i, sorted({w.lineno for w in stmts.values()}))
            continue
        (w,) = stmts.values()
        if isinstance(w, ast.Delete):
            if _deletes_own_key(w, name, i, loop_iter, body):
                out[name] = i
            continue
        if not isinstance(w, ast.Assign):
            continue
        keys = [
            part.slice
            for t in w.targets
            for part in target_parts(t)
            if isinstance(part, ast.Subscript)
            and root_name(part.value) is not None
            and root_name(part.value).id == name  # type: ignore[union-attr]
        ]
        if not keys or not all(_is_own_key(k, i) for k in keys):
            continue
        # the write's own `S` (a Load inside the Subscript target) is no read
        inside = {id(n) for n in ast.walk(w.value)} | {
            id(n)
            for t in w.targets
            for part in target_parts(t)
            if isinstance(part, ast.Subscript)
            for n in ast.walk(part.value)
        }
        start = (w.lineno, w.col_offset)
        reads_ok = all(
            id(node) in inside or (node.lineno, node.col_offset) < start
            for s in body
            for node in ast.walk(s)
            if isinstance(node, ast.Name)
            and node.id == name
            and isinstance(node.ctx, ast.Load)
        )
        if reads_ok:
            out[name] = i
    return out


def _column_key(e: ast.Subscript, indexers: tuple[str, ...]) -> str | None:
    """The constant string key of ``S["c"]`` (a column, a dict key), or of
    ``S.loc[rows, "c"]`` (the column part), else ``None``."""
    key: ast.expr = e.slice
    if isinstance(e.value, ast.Attribute):
        if e.value.attr not in indexers:
            return None
        if not (isinstance(key, ast.Tuple) and len(key.elts) == 2):
            return None
        key = key.elts[1]
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return key.value
    return None


def _literal_keys(
    loop_target: ast.expr, loop_iter: ast.expr | None, body: list[ast.stmt]
) -> dict[str, tuple[str, ...]]:
    """``{c: ("a", "b")}`` for ``for c in ["a", "b"]`` (a literal list or
    tuple of strings) whose ``c`` the body never rebinds: the keys ``S[c]``
    may read."""
    if not (
        isinstance(loop_target, ast.Name)
        and isinstance(loop_iter, (ast.List, ast.Tuple))
        and all(
            isinstance(v, ast.Constant) and isinstance(v.value, str)
            for v in loop_iter.elts
        )
    ):
        return {}
    for st in body:
        for n in ast.walk(st):
            if isinstance(n, ast.Name) and n.id == loop_target.id:
                if not isinstance(n.ctx, ast.Load):
                    return {}
    return {loop_target.id: tuple(str(v.value) for v in loop_iter.elts)}  # type: ignore[attr-defined]


def _read_keys(
    e: ast.Subscript, indexers: tuple[str, ...], literal: dict[str, tuple[str, ...]]
) -> tuple[str, ...]:
    """The string keys ``e`` may read: a constant's, or every item of the
    literal list the loop's variable walks (``for c in ["a", "b"]: S[c]``)."""
    key = _column_key(e, indexers)
    if key is not None:
        return (key,)
    part: ast.expr = e.slice
    if isinstance(e.value, ast.Attribute):
        if not (isinstance(part, ast.Tuple) and len(part.elts) == 2):
            return ()
        part = part.elts[1]
    if isinstance(part, ast.Name):
        return literal.get(part.id, ())
    return ()


def _differ(written: ast.expr, read: str) -> bool:
    """Is every value ``written`` can take (a key of the loop's writes) other
    than the string ``read``?  A constant other than it; an f-string or a
    ``"p" + x`` / ``x + "s"`` whose constant prefix (suffix) ``read`` does not
    start (end) with: every string it makes does."""
    if isinstance(written, ast.Constant):
        return isinstance(written.value, str) and written.value != read
    parts: list[ast.expr] = []
    if isinstance(written, ast.JoinedStr):
        parts = list(written.values)
    elif isinstance(written, ast.BinOp) and isinstance(written.op, ast.Add):
        parts = [written.left, written.right]
    if not parts:
        return False
    first, last = parts[0], parts[-1]
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value:
        if not read.startswith(first.value):
            return True
    if isinstance(last, ast.Constant) and isinstance(last.value, str) and last.value:
        if not read.endswith(last.value):
            return True
    return False


def _write_keys(
    writes: dict[str, list[Candidate]],
    own_elements: dict[str, str],
    body: list[ast.stmt],
) -> dict[str, list[ast.expr]]:
    """Write sinks whose writes are all ``S[k] = ...`` (whole keys: a column,
    a dict key) or ``S.loc[rows, k] = ...`` with ``rows`` ``:`` or a mask made
    from ``S``'s own column (``m = S["c"] == v``: a boolean Series, so never a
    new row): S -> every key ``k`` written.  A read of ``S`` at a constant key
    that differs from every one of them sees the value from before the loop,
    serially as on an engine (`_Flow._own_read`)."""
    out: dict[str, list[ast.expr]] = {}
    bound: dict[str, list[ast.expr]] = {}
    for st in block_statements(body):
        for node in ast.walk(st):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = (
                    node.targets if isinstance(node, ast.Assign) else [node.target]
                )
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                            v = node.value if isinstance(node, ast.Assign) else None
                            bound.setdefault(n.id, []).append(v)  # type: ignore[arg-type]
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.NamedExpr)):
                for n in ast.walk(node):
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                        bound.setdefault(n.id, []).append(None)  # type: ignore[arg-type]
    for name, cands in writes.items():
        if name in own_elements:
            continue
        masks = {
            m
            for m, values in bound.items()
            if len(values) == 1 and values[0] is not None and _mask(values[0], name)
        }
        keys: list[ast.expr] = []
        for c in cands:
            if not isinstance(c.stmt, ast.Assign):
                break
            parts = [
                part
                for t in c.stmt.targets
                for part in target_parts(t)
                if isinstance(part, ast.Subscript)
                and root_name(part) is not None
                and root_name(part).id == name  # type: ignore[union-attr]
            ]
            if not parts or not all(_whole_key(p, name, masks) for p in parts):
                break
            keys += [_written_key(p) for p in parts]
        else:
            out[name] = keys
    return out


def _mask(e: ast.expr, name: str) -> bool:
    """``S["c"] == v`` (any comparison led by a column of ``S``), and ``&``,
    ``|``, ``~`` of such: a boolean Series of ``S``'s rows."""
    if isinstance(e, ast.Compare):
        left = e.left
        return (
            isinstance(left, ast.Subscript)
            and isinstance(left.value, ast.Name)
            and left.value.id == name
            and _column_key(left, indexers=()) is not None
        )
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.BitAnd, ast.BitOr)):
        return _mask(e.left, name) and _mask(e.right, name)
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Invert):
        return _mask(e.operand, name)
    return False


def _whole_key(part: ast.Subscript, name: str, masks: set[str]) -> bool:
    """``S[k]``, or ``S.loc[mask, k]`` / ``S.loc[:, k]`` (rows that exist)."""
    if isinstance(part.value, ast.Name):
        return part.value.id == name and not isinstance(part.slice, ast.Slice)
    v = part.value
    if not (
        isinstance(v, ast.Attribute)
        and v.attr == "loc"
        and isinstance(v.value, ast.Name)
        and v.value.id == name
        and isinstance(part.slice, ast.Tuple)
        and len(part.slice.elts) == 2
    ):
        return False
    rows = part.slice.elts[0]
    return (
        isinstance(rows, ast.Slice)
        and rows.lower is None
        and rows.upper is None
        and rows.step is None
    ) or (isinstance(rows, ast.Name) and rows.id in masks)


def _written_key(part: ast.Subscript) -> ast.expr:
    key = part.slice
    if isinstance(part.value, ast.Attribute) and isinstance(key, ast.Tuple):
        return key.elts[1]
    return key


def _deletes_own_key(
    w: ast.Delete,
    name: str,
    i: str,
    loop_iter: ast.expr | None,
    body: list[ast.stmt],
) -> bool:
    """``del D[k]`` with ``k`` the loop's own key of ``D``, ``D`` read only as
    ``D[k]`` and only before the ``del``, and the loop not iterating ``D``
    itself (serially deleting from a dict being iterated raises): iteration
    ``k`` alone removes ``D[k]``, and reads only what was there before."""
    if len(w.targets) != 1:
        return False
    (t,) = w.targets
    if not (
        isinstance(t, ast.Subscript)
        and isinstance(t.value, ast.Name)
        and t.value.id == name
        and isinstance(t.slice, ast.Name)
        and t.slice.id == i
    ):
        return False
    if loop_iter is None or any(
        isinstance(n, ast.Name) and n.id == name
        for n in ([loop_iter] if isinstance(loop_iter, ast.Name) else [])
    ):
        return False
    if (
        isinstance(loop_iter, ast.Call)
        and isinstance(loop_iter.func, ast.Attribute)
        and isinstance(loop_iter.func.value, ast.Name)
        and loop_iter.func.value.id == name
    ):
        return False  # (`D.keys()`, `D.items()`: a live view)
    start = (w.lineno, w.col_offset)
    for s in body:
        for node in ast.walk(s):
            for child in ast.iter_child_nodes(node):
                if not (isinstance(child, ast.Name) and child.id == name):
                    continue
                if child is t.value:
                    continue
                at_own = (
                    isinstance(node, ast.Subscript)
                    and node.value is child
                    and _is_own_key(node.slice, i)
                )
                if not at_own or (child.lineno, child.col_offset) >= start:
                    return False
    return True


def _only_at(name: str, i: str, body: list[ast.stmt]) -> bool:
    """Is every use of ``name`` in ``body`` a subscript at the own key ``i``?"""
    for s in body:
        for node in ast.walk(s):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Name) and child.id == name:
                    if not (
                        isinstance(node, ast.Subscript)
                        and node.value is child
                        and _is_own_key(node.slice, i)
                    ):
                        return False
    return True


def _own_rows(
    body: list[ast.stmt],
    nodes: list[ast.AST],
    loop_target: ast.expr,
    loop_iter: ast.expr | None,
    bound: set[str],
    is_builtin: Callable[[str], bool],
) -> dict[str, OwnRow]:
    """Sinks written and read back under the loop's own position index (from
    ``range`` or ``enumerate``; labels can repeat across objects), or under any
    loop variable for a row the iteration first makes new (``h[k] = []``);
    never the iterable itself (its items would not see the writes on an
    engine)."""
    rebound = bindings_of(nodes)
    iterated = (
        {
            n.id
            for n in _lazy_names(loop_iter, is_builtin)
            if not metadata_only(loop_iter, n.id)
        }
        if loop_iter
        else set()
    )
    names = (
        {
            n.id
            for st in body
            for n in ast.walk(st)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        }
        - bound
        - iterated
    )
    i = (
        None
        if _labels_owner(loop_iter)
        else _own_index(loop_target, loop_iter, is_builtin)
    )
    rows: dict[str, OwnRow] = {}
    if i is not None and i not in rebound:
        rows = find_own_rows(body, i, sorted(names - {i}), is_builtin)
    for t in target_names(loop_target):
        if t.id != i and t.id not in rebound:
            left = sorted(names - set(rows) - {t.id})
            rows.update(find_own_rows(body, t.id, left, is_builtin, distinct=False))
    return {n: r for n, r in rows.items() if not (r.mode == "value" and r.simple)}


def _is_range(e: ast.AST, is_builtin: Callable[[str], bool]) -> bool:
    return (
        isinstance(e, ast.Call)
        and isinstance(e.func, ast.Name)
        and e.func.id == "range"
        and is_builtin("range")
    )


def _rebound(nodes: Iterable[ast.AST]) -> set[str]:
    """Names the body binds or deletes anywhere (a loop variable rebound is
    no longer surely the item: `row = template` then `row[k] = v`)."""
    out: set[str] = set()
    for node in nodes:
        # `row /= s`: in place for the arrays and lists it could change, a
        # new value (never an outer object) for the rest
        aug = {id(a.target) for a in ast.walk(node) if isinstance(a, ast.AugAssign)}
        for sub in ast.walk(node):
            if id(sub) in aug:
                continue
            if isinstance(sub, ast.Name) and not isinstance(sub.ctx, ast.Load):
                out.add(sub.id)
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(sub.name)
            elif isinstance(sub, ast.arg):
                out.add(sub.arg)
            elif isinstance(sub, ast.ExceptHandler) and sub.name:
                out.add(sub.name)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                out |= {(a.asname or a.name).split(".")[0] for a in sub.names}
            elif isinstance(sub, (ast.Global, ast.Nonlocal)):
                out |= set(sub.names)
            elif isinstance(sub, ast.MatchAs) and sub.name:
                out.add(sub.name)
            elif isinstance(sub, ast.MatchStar) and sub.name:
                out.add(sub.name)
            elif isinstance(sub, ast.MatchMapping) and sub.rest:
                out.add(sub.rest)
    return out


def _target_taint(
    target: ast.expr, it: ast.expr, is_builtin: Callable[[str], bool]
) -> tuple[set[str], bool]:
    """Names of a loop target that may hold objects from the iterable.

    Returns (names, decided). Items of ``range`` are ints; ``enumerate``'s index is
    an int; everything else may be an element of outer data.
    """
    if _is_range(it, is_builtin):
        return set(), True
    if (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Name)
        and it.func.id == "enumerate"
        and is_builtin("enumerate")
        and it.args
        and isinstance(target, (ast.Tuple, ast.List))
        and len(target.elts) == 2
    ):
        return _target_taint(target.elts[1], it.args[0], is_builtin)
    if (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Name)
        and it.func.id == "zip"
        and is_builtin("zip")
        and isinstance(target, (ast.Tuple, ast.List))
        and len(target.elts) == len(it.args)
        and not it.keywords
    ):
        out: set[str] = set()
        for t, a in zip(target.elts, it.args, strict=True):
            out |= _target_taint(t, a, is_builtin)[0]
        return out, True
    return {n.id for n in target_names(target)}, False


def _refuse_mutated_iterable(
    loop_iter: ast.expr,
    is_builtin: Callable[[str], bool],
    sinks: dict[str, Candidate],
    own_elements: dict[str, str],
    ctx: _Ctx,
    diag: DiagnosticSink,
) -> None:
    """The loop iterates over a name the body changes (read lazily, not
    through a copy): serially the loop would see its own changes."""
    several_writes = ctx.several_writes
    for node in _lazy_names(loop_iter, is_builtin):
        if (
            node.id in sinks
            and node.id not in own_elements
            # (the write-once advice is there)
            and not (node.id in several_writes and node.id in ctx.sink_reads)
        ):
            diag.add(
                node.lineno,
                node.col_offset,
                node.id,
                "iterable-mutated",
                f"the loop iterates over `{node.id}`, which the body also changes "
                f"(line {sinks[node.id].stmt.lineno}); serially the loop would "
                f"see its own changes. "
                + (
                    f"A copy (`list({node.id})`) is not enough here: the body "
                    f"also reads `{node.id}` (see line "
                    f"{ctx.sink_reads[node.id]})."
                    if node.id in ctx.sink_reads
                    else f"Iterate over a copy (`for x in list({node.id}):`) "
                    f"or collect into another name."
                ),
            )


def _resolve_sinks(
    by_name: dict[str, list[Candidate]],
    diag: DiagnosticSink,
    result: Classification,
) -> dict[str, Candidate]:
    """Each name's sink (its first candidate of the one kind it is used as),
    filed in ``result`` by kind; a name used as two kinds, or reduced with two
    operators or forms, refused in ``diag``."""
    sinks: dict[str, Candidate] = {}
    for name, cs in by_name.items():
        classes = {c.cls for c in cs}
        first = cs[0]
        if classes == {KEYED, KEYED_GATHER}:
            # counts and lists under different keys of one dict (stats["n"] += 1,
            # stats["items"].append(x)); a key used both ways fails the merge
            classes = {KEYED}
            first = next(c for c in cs if c.cls == KEYED)
            result.keyed_gathers[name] = next(
                c.stmt.lineno for c in cs if c.cls == KEYED_GATHER
            )
            cs = [c for c in cs if c.cls == KEYED]
        if len(classes) > 1:
            kinds = " and ".join(sorted(classes))
            diag.add(
                cs[1].stmt.lineno,
                cs[1].stmt.col_offset,
                name,
                "mixed-use",
                f"`{name}` is used both as {kinds} in the loop; gpucell can merge "
                f"one kind of contribution per name. "
                + (
                    _element_fix(name)
                    if WRITE in classes and classes & {KEYED, KEYED_GATHER}
                    else "Use a separate name for each."
                ),
            )
            sinks[name] = first
            continue
        cls = first.cls
        if cls in (REDUCTION, KEYED):
            ops = {c.op for c in cs}
            augs = {c.augmented for c in cs}
            if len(ops) > 1 or len(augs) > 1:
                diag.add(
                    cs[1].stmt.lineno,
                    cs[1].stmt.col_offset,
                    name,
                    "mixed-reduction",
                    f"`{name}` is combined with different operators or forms "
                    f"({', '.join(sorted(ast.unparse(c.stmt) for c in cs))}); a "
                    f"parallel reduction needs one associative operator per name. "
                    f"Use one form (e.g. only `{name}{'[k]' if cls == KEYED else ''}"
                    f" += ...`)." + (_row_depth_fix(name) if _mixed_depths(cs) else ""),
                )
        sinks[name] = first
        line = first.stmt.lineno
        if cls == GATHER:
            result.gathers[name] = line
        elif cls == WRITE:
            result.writes[name] = line
        elif cls == UNION:
            result.unions[name] = line
        elif cls == REDUCTION:
            result.reductions[name] = (first.op or "+", first.augmented, line)
        elif cls == KEYED:
            result.keyed[name] = (first.op or "+", line)
        elif cls == KEYED_GATHER:
            result.keyed_gathers[name] = line
    return sinks


def _alias_taint(
    stmts: list[ast.stmt],
    nodes: list[ast.AST],
    loop_target: ast.expr,
    loop_iter: ast.expr | None,
    body_bound: set[str],
    is_builtin: Callable[[str], bool],
) -> set[str]:
    """Locals of the body that may hold objects from outside the iteration:
    the loop's targets (but ``range``'s and ``enumerate``'s numbers) and
    what is bound from them or from names outside the body, to a fixpoint."""

    def is_outer(n: str) -> bool:
        return (n not in body_bound and not is_builtin(n)) or n in tainted

    tainted: set[str] = set()
    if loop_iter is not None:
        names, _ = _target_taint(loop_target, loop_iter, is_builtin)
        tainted |= names
    # (kind, expression, names it binds) for every binding that may alias
    aliasing: list[tuple[str, ast.expr, set[str]]] = []
    for s in stmts:
        if isinstance(s, ast.Assign):
            names = {n.id for t in s.targets for n in target_names(t)}
            aliasing.append(("alias", s.value, names))
        elif isinstance(s, (ast.For, ast.AsyncFor)) and not _is_range(
            s.iter, is_builtin
        ):
            aliasing.append(
                ("mentions", s.iter, {n.id for n in target_names(s.target)})
            )
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                if item.optional_vars is not None:
                    names = {n.id for n in target_names(item.optional_vars)}
                    aliasing.append(("alias", item.context_expr, names))
    for node in nodes:
        if isinstance(node, ast.NamedExpr):
            aliasing.append(("alias", node.value, {node.target.id}))
    for _ in range(len(aliasing) + 1):
        before = len(tainted)
        for kind, e, names in aliasing:
            if names <= tainted:
                continue
            hit = (
                _alias_expr(e, is_outer) if kind == "alias" else _mentions(e, is_outer)
            )
            if hit:
                tainted |= names
        if len(tainted) == before:
            break
    tainted &= body_bound
    return tainted


@dataclass
class _Sinks:
    """The body's sink candidates by name, and which names they are."""

    stmts: list[ast.stmt]
    nodes: list[ast.AST]
    by_name: dict[str, list[Candidate]]
    sinks: dict[str, Candidate]
    own_rows: dict[str, OwnRow]
    own: set[int]
    body_bound: set[str]


def _find_sinks(
    body: list[ast.stmt],
    loop_target: ast.expr,
    loop_iter: ast.expr | None,
    diag: DiagnosticSink,
    is_builtin: Callable[[str], bool],
    result: Classification,
) -> _Sinks:
    """Match every statement against the sink forms and keep the names whose
    every binding is a sink's own store (a name also assigned by ordinary code
    is a plain local)."""
    stmts = list(block_statements(body))
    nodes = [n for s in body for n in scope_nodes(s)]
    cands: list[Candidate] = []
    for s in stmts:
        cands.extend(match_candidates(s, is_builtin))
    own_store_ids = {
        id(n) for c in cands for n in c.own if isinstance(n.ctx, ast.Store)
    }
    other_bound = {n.id for n in target_names(loop_target)} | bindings_of(
        nodes, exclude=own_store_ids
    )

    own_rows = _own_rows(body, nodes, loop_target, loop_iter, other_bound, is_builtin)
    by_name: dict[str, list[Candidate]] = {}
    for c in cands:
        if c.name in other_bound or c.name in own_rows:
            continue
        by_name.setdefault(c.name, []).append(c)
    sinks = _resolve_sinks(by_name, diag, result)
    own = {id(n) for name in sinks for c in by_name[name] for n in c.own}
    own |= {
        id(node)
        for st in body
        for node in ast.walk(st)
        if isinstance(node, ast.Name) and node.id in own_rows
    }
    return _Sinks(stmts, nodes, by_name, sinks, own_rows, own, other_bound - set(sinks))


def _flow_context(
    body: list[ast.stmt],
    found: _Sinks,
    loop_target: ast.expr,
    loop_iter: ast.expr | None,
    diag: DiagnosticSink,
    is_builtin: Callable[[str], bool],
    module_names: Iterable[str],
    assume_nonempty: bool,
) -> _Ctx:
    """What the flow walk is told before it starts: the sinks, the taint, the
    own elements and keys, the running bests."""
    stmts, nodes, sinks = found.stmts, found.nodes, found.sinks
    writes = {n: cs for n, cs in found.by_name.items() if sinks[n].cls == WRITE}
    several_writes: dict[str, tuple[str, list[int]]] = {}
    own_elements = _own_elements(
        writes,
        body,
        loop_target,
        loop_iter,
        bindings_of(nodes),
        is_builtin,
        several_writes,
    )
    # alias taint: locals that may hold objects from outside the iteration
    tainted = _alias_taint(
        stmts, nodes, loop_target, loop_iter, found.body_bound, is_builtin
    )
    ctx = _Ctx(
        sink=diag,
        body_bound=found.body_bound,
        sinks=sinks,
        own=found.own,
        tainted=tainted,
        module_names=set(module_names) | set(WELL_KNOWN_MODULES),
        is_builtin=is_builtin,
    )
    ctx.target_names = {n.id for n in target_names(loop_target)}
    ctx.item_names = (ctx.target_names & tainted) - _rebound(body)
    ctx.assume_nonempty = assume_nonempty
    ctx.own_elements = own_elements
    ctx.write_keys = _write_keys(writes, own_elements, body)
    ctx.several_writes = several_writes
    ctx.literal_keys = _literal_keys(loop_target, loop_iter, body)
    ctx.loop_stored = _loop_bindings(stmts)
    ctx.selections = _selections(stmts)
    own_key = _own_key(loop_target, loop_iter, is_builtin)
    if (
        isinstance(loop_target, ast.Name)
        and loop_iter is not None
        and _own_index(loop_target, loop_iter, is_builtin) is None
        # keys that may repeat, or a name's own (distinct for that name only)
        and (own_key is None or own_key[1] is not None)
    ):
        ctx.key_loop = (loop_target.id, ast.unparse(loop_iter))
    return ctx


def _refuse_target_parts(loop_target: ast.expr, diag: DiagnosticSink) -> None:
    """``for d[k] in ...``, ``for self.x in ...``: a loop target that stores
    into an object changes something outside the iteration."""
    for part in target_parts(loop_target):
        if not isinstance(part, ast.Name):
            diag.add(
                part.lineno,
                part.col_offset,
                ast.unparse(part),
                "loop-target",
                f"the loop assigns each item to `{ast.unparse(part)}`, which changes "
                f"an object outside the iteration. Use plain names as loop targets "
                f"(`for i, x in ...`) and store the values in the body.",
            )


def _own_row_results(
    result: Classification,
    found: _Sinks,
    ctx: _Ctx,
    flow: _Flow,
    loop_target: ast.expr,
    loop_iter: ast.expr | None,
    is_builtin: Callable[[str], bool],
) -> None:
    """Own rows as writes, the inputs their values name watched, and the keys
    the kernel checks distinct before the run."""
    own_rows = found.own_rows
    for name, row in own_rows.items():
        result.writes[name] = row.line
        ctx.inputs.setdefault(name, row.line)  # engines copy the rows they write
    result.own_rows = own_rows
    # a row's value handed to a function or a method (`d[k] = [x]`, then
    # `f(d[k])`) may have what it holds changed: the engines check the inputs
    # the written values name, as for a call's arguments
    for row in own_rows.values():
        for st in found.stmts:
            if st.lineno in row.handed and isinstance(st, ast.Assign):
                for sub in ast.walk(st.value):
                    if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                        flow.watch(sub, st.lineno)
    check = _key_check(loop_iter, is_builtin)
    if check is not None:
        # (a row made new under any loop variable never reads what was there:
        # two keys for one element are a repeated key, the last one wins)
        i = _own_index(loop_target, loop_iter, is_builtin)
        result.key_checks = {
            **{n: (r.index, check) for n, r in own_rows.items() if r.index == i},
            **{n: (k, check) for n, k in ctx.own_elements.items()},
        }


def classify_body(
    body: list[ast.stmt],
    *,
    loop_target: ast.expr,
    loop_iter: ast.expr | None,
    diag: DiagnosticSink,
    is_builtin: Callable[[str], bool],
    module_names: Iterable[str] = (),
    fixed_sinks: dict[str, str] | None = None,
    assume_nonempty: bool = True,
) -> Classification:
    """Classify the names of a loop body.

    Parameters
    ----------
    body : list of ast.stmt
        The loop body (a synthesized one for the list-comprehension form).
    loop_target : ast.expr
        The parallel loop's target; its names are definitely assigned on entry.
    loop_iter : ast.expr or None
        The iterable (to refuse iterating over something the body changes, and to
        tell which loop targets hold outer objects).
    diag : DiagnosticSink
        Receives every refusal.
    is_builtin : callable
        ``is_builtin(name)`` when ``name`` resolves to the builtin on engines.
    module_names : iterable of str
        Names bound by ``import`` in the prelude (receivers whose in-place functions
        modify their argument rather than themselves).
    assume_nonempty : bool
        Take a nested loop over inputs (``for xb in loader``) to run at least
        once, recording its iterable in ``nonempty`` for the kernel to check.
    """
    result = Classification()
    found = _find_sinks(body, loop_target, loop_iter, diag, is_builtin, result)
    ctx = _flow_context(
        body,
        found,
        loop_target,
        loop_iter,
        diag,
        is_builtin,
        module_names,
        assume_nonempty,
    )
    flow = _Flow(ctx)
    entry: State = frozenset(n.id for n in target_names(loop_target))
    _refuse_target_parts(loop_target, diag)
    flow.block(body, entry)

    if loop_iter is not None:
        _refuse_mutated_iterable(
            loop_iter, is_builtin, found.sinks, ctx.own_elements, ctx, diag
        )

    if diag:
        # refused anyway: name the refit of an estimator from before the loop
        # first, which the engines' check would stop after running otherwise
        for name, call in ctx.refits.items():
            diag.add(
                call.lineno, call.col_offset, name, "input-refit",
                _refit_text(name, call),
            )  # fmt: skip

    _own_row_results(result, found, ctx, flow, loop_target, loop_iter, is_builtin)
    _fill(result, ctx, found.nodes, loop_target, found.body_bound, is_builtin)
    return result


def _fill(
    result: Classification,
    ctx: _Ctx,
    nodes: list[ast.AST],
    loop_target: ast.expr,
    body_bound: set[str],
    is_builtin: Callable[[str], bool],
) -> None:
    """What the flow walk found, as the classification's names and lines."""
    result.inputs = {
        n: line
        for n, line in ctx.inputs.items()
        if n not in ENGINE_PROVIDED and not is_builtin(n)
    }
    first_lines: dict[str, int] = {}
    for n in target_names(loop_target):
        first_lines.setdefault(n.id, n.lineno)
    for any_node in nodes:
        if isinstance(any_node, ast.Name) and any_node.id in body_bound:
            first_lines.setdefault(any_node.id, any_node.lineno)
    result.locals = {n: first_lines.get(n, 0) for n in sorted(body_bound)}
    result.locals = dict(sorted(result.locals.items(), key=lambda kv: (kv[1], kv[0])))
    result.deleted_locals = ctx.deleted & body_bound
    result.prints = sorted(set(ctx.prints))
    result.watch = {
        n: sorted(set(lines)) for n, lines in ctx.watch.items() if n in result.inputs
    }
    result.watch_items = sorted(set(ctx.watch_items))
    result.watch_all = ctx.watch_all
    result.random_calls = sorted(set(ctx.random_calls))
    result.nonempty = list(ctx.nonempty)
