"""The flow walk: a definite-assignment walk of the body in evaluation order
that finds loop-carried reads, the inputs, control flow leaving the
iteration and in-place changes to objects from before the loop."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpucell.core.analysis.diagnostics import DiagnosticSink
from gpucell.core.analysis.keys import _differ, _int_literal, _is_own_key, _read_keys
from gpucell.core.analysis.messages import (
    _AWAIT_TEXT,
    REFIT_METHODS,
    _method_name,
    _op_text,
    _own_key_fix,
    _setdefault_fix,
    _write_once_text,
)
from gpucell.core.analysis.scope import (
    COMPREHENSIONS,
    ENGINE_PROVIDED,
    SAFE_BUILTINS,
    bindings_of,
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
from gpucell.core.analysis.selections import _running_best_text, _Selection
from gpucell.core.analysis.sinks import WRITE, Candidate
from gpucell.protocol.program import INDEXERS

__all__ = [
    "ARGUMENT_MUTATORS",
    "MODULE_STATE_MUTATORS",
    "State",
]


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
