"""In-place changes the flow walk finds: to an object from before the loop
(refused, or watched by the engines where a call cannot be seen into), to the
iteration's own item (written back), and refits of estimators."""

from __future__ import annotations

import ast

from gpucell.core.analysis.flowbase import State, _FlowBase
from gpucell.core.analysis.messages import REFIT_METHODS, _method_name, _setdefault_fix
from gpucell.core.analysis.refusals import OuterMutation, Refusal
from gpucell.core.analysis.scope import (
    ACCESSORS,
    ENGINE_PROVIDED,
    SAFE_BUILTINS,
    global_draw,
    is_inplace_method,
    is_mutating_method,
    root_name,
)

__all__ = ["ARGUMENT_MUTATORS", "MODULE_STATE_MUTATORS"]

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


#: methods only lists, dicts and sets have (no module function is called so):
#: on a module's attribute (`sys.path.append`) they change module state
MODULE_STATE_MUTATORS = frozenset(
    {"append", "extend", "insert", "remove", "setdefault", "popitem", "discard"}
)


def _through_data(node: ast.AST, op: str) -> bool:
    """Is the object changed at ``node`` reached through a tensor's ``.data``
    (``p.data.mul_(2)``, ``w.data[0] = 1``, ``m.weight.data += d``)?
    ``op``: the augmented operator of a store (``""``: a plain ``=``)."""
    e: ast.AST = node
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        e = node.func.value
    if isinstance(e, ast.Attribute) and not isinstance(e.ctx, ast.Load) and not op:
        e = e.value  # (`t.data = x` puts new memory there: seen)
    while isinstance(e, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(e, ast.Attribute) and e.attr == "data":
            return True
        e = e.func if isinstance(e, ast.Call) else e.value
    return False


def _is_itself(e: ast.expr) -> bool:
    """Is ``e`` a name itself (``rec``, ``df.loc``), not an object it holds
    (``rec["v"]``, ``rec.items``, ``rec.get("v")``)?"""
    while isinstance(e, ast.Attribute) and e.attr in ACCESSORS:
        e = e.value
    return isinstance(e, ast.Name)


#: the hidden lists where an iteration records its replayed statements and
#: concatenations (replaystmts.py, concats.py)
_RECORDS = ("__gpucell_rp_", "__gpucell_cat_")

#: safe builtins whose first argument is a function they call
_CALLING = frozenset({"map", "filter"})


class _Mutations(_FlowBase):
    """The walk's checks of calls and stores that may change an object."""

    def outerish(
        self, name: ast.Name | None, state: State, changed: ast.expr | None = None
    ) -> bool:
        """Would changing ``name``'s object in place change an object from
        outside?  ``changed``: the expression of the object changed (``name``
        itself, or what it holds: ``rec["v"]``); None where unknown."""
        if name is None or id(name) in self.c.own:
            return False
        n = name.id
        if n in self.c.sinks:
            return False  # reported as sink-read
        if self._shadowed(n):
            return True  # comprehension variables iterate over outer data
        if n in self.c.shallow and changed is not None and _is_itself(changed):
            return False  # `entry[-1] = x` on `entry = [prio, name]`: a new list
        if n in self.c.tainted:
            return True
        return n not in self.c.body_bound and not self.c.is_builtin(n)

    def _refuse_mutation(
        self, node: ast.AST, root: ast.Name, what: str, fix: str = "", op: str = ""
    ) -> None:
        n = root.id
        if n in self.c.item_names and not self._shadowed(n) and _through_data(node, op):
            # `p.data.mul_(2)`: bumps no version counter, so the engines'
            # check of the items would not see the change (it would be lost)
            self.c.diag.report(
                OuterMutation(
                    getattr(node, "lineno", root.lineno),
                    getattr(node, "col_offset", root.col_offset),
                    n,
                    what=what,
                    owner=(
                        f"`{n}` is the iteration's own item (or a part of it), "
                        "and a change made through a tensor's `.data` is not "
                        "seen by the check that writes items back"
                    ),
                    fix=(
                        "Change the tensor itself under `torch.no_grad()` "
                        "(`with torch.no_grad(): p.mul_(2)`), or run the cell "
                        "serially."
                    ),
                )
            )
            return
        if n in self.c.item_names and not self._shadowed(n):
            # the iteration's own item, changed in place: the engines check
            # the items and send back each one's new state, which the kernel
            # writes into its own object in iteration order (writeback.py),
            # or the run fails unmerged where that could differ from serial
            self.c.watch_items.append(getattr(node, "lineno", root.lineno))
            return
        if n in self.c.shallow and not self._shadowed(n):
            owner = (
                f"`{n}` is a new container the iteration makes, but it holds "
                "objects from elsewhere (elements of the loop's data or objects "
                "that exist before the loop), and this changes one of them"
            )
            fix = fix or (
                f"Copy what `{n}` holds where the iteration makes it "
                f"(`{n} = copy.deepcopy(...)`), or collect the results "
                "(`results.append(...)`)."
            )
        elif n in self.c.tainted or self._shadowed(n):
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
        self.c.diag.report(
            OuterMutation(
                getattr(node, "lineno", root.lineno),
                getattr(node, "col_offset", root.col_offset),
                n,
                what=what,
                owner=owner,
                fix=fix,
            )
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
        if (n in c.target_names or n in c.item_names) and n in c.tainted:
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
                # what they call may change things: `map(seen.add, ws)`,
                # `sorted(xs, key=scorer)`
                called = call.args[:1] if f.id in _CALLING else []
                for e in [*called, *(k.value for k in call.keywords if k.arg == "key")]:
                    self.watch(e, line)
                return
            self.watch(f, line)
        elif isinstance(f, ast.Attribute):
            root = root_name(f.value)
            if root is not None and root.id.startswith(_RECORDS):
                return  # (gpucell's own records: they change nothing they get)
            if root is not None and root.id in self.c.module_names:
                text = global_draw(call)
                if text is not None:
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
        if is_mutating_method(f.attr) and self.outerish(root, state, f.value):
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
        if self.outerish(arg_root, state, arg):
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
                    if self.outerish(root, state, part):
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
        changed = (
            part.value if isinstance(part, (ast.Subscript, ast.Attribute)) else None
        )
        if not self.outerish(root, state, changed):
            return
        assert root is not None
        text = ast.unparse(part)
        if isinstance(part, ast.Attribute):
            what = f"`{text} {op}= ...` (attribute assignment)"
        else:
            what = f"`{text} {op}= ...`"
        self._refuse_mutation(part, root, what, op=op)

    def forbid(
        self, node: ast.AST, refusal: type[Refusal], name: str, **args: str
    ) -> None:
        """Record a ``refusal`` of ``name`` at ``node``."""
        line, col = getattr(node, "lineno", 0), getattr(node, "col_offset", 0)
        self.c.diag.report(refusal(line, col, name, **args))
