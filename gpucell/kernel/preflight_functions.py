"""Pre-flight checks that read the code of the notebook's functions the loop
calls (the cell's text shows only the call): a function reading a global the
loop changes, changing a tensor through ``.data``, or changing in place a part
of a notebook array it is handed."""

from __future__ import annotations

import ast
import textwrap
import types
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gpucell.core.analysis.diagnostics import Diagnostic
from gpucell.kernel.preflight_problem import Namespace, line_of, problem

if TYPE_CHECKING:
    from gpucell.core.analysis import LoopPlan

__all__ = [
    "helpers_changing_data",
    "helpers_changing_modules",
    "hooks_recording_into_the_notebook",
    "helpers_changing_own_rows",
    "helpers_reading_what_the_loop_changes",
    "notebook_functions",
]


def helpers_reading_what_the_loop_changes(
    plan: LoopPlan, ns: Namespace, inputs: Namespace
) -> list[Diagnostic]:
    """A function defined in the notebook that the loop calls and that reads a
    global the loop changes (``def is_new(t): return t not in uniq`` while the
    loop appends to ``uniq``): serially each call sees what the iterations
    before it left there; on an engine the function reads a copy from before
    the loop.  The cell's text does not show it: the functions' code does."""
    from gpucell.core.globalreads import global_reads

    changed = {*plan.locals, *plan.affected_names, *plan.deep_writes}
    found = global_reads(inputs, ns, changed) if changed else []
    exact = _read_as_each_iteration_binds(plan, ns, inputs) if found else set()
    out, seen = [], set()
    for r in found:
        if (r.via, r.function, r.name) in seen or (r.via, r.name) in exact:
            continue
        seen.add((r.via, r.function, r.name))
        what = (
            f"`{r.via}`"
            if r.function == r.via
            else f"`{r.via}` (through `{r.function}`)"
        )
        called = {info.name: info.line for info in plan.names}.get(r.via, "?")
        out.append(
            problem(
                line_of(plan, r.via),
                r.name,
                "helper-reads-changed",
                f"{what}, called at line {called}, reads the global `{r.name}`, "
                f"which the loop changes (line {line_of(plan, r.name)}). Serially "
                f"each call sees what the iterations before it left in `{r.name}`; "
                f"on an engine the function reads `{r.name}` as it was before the "
                "loop, so the results would differ. Pass "
                f"`{r.name}` to the function as an argument (the loop's own code "
                "then shows the dependence), or bind it in every iteration before "
                "the call (the loop variable, or an assignment not under an `if`), "
                "or run the cell without %%gpu_parallel.",
            )
        )
    return out


def _read_as_each_iteration_binds(
    plan: LoopPlan, ns: Namespace, inputs: Namespace
) -> set[tuple[str, str]]:
    """``(input, name)``: the notebook function ``input`` reads the global
    ``name``, which every iteration binds before the body first names the
    function (the loop variable, or an unconditional assignment above it),
    and the body only calls it there (never hands it on: a thread or a
    callback kept past the iteration could read another one's value).  The
    engines run such a function with the chunk's namespace as its globals
    (``engine.chunk``), so each call sees its own iteration's value, as
    serially; the kernel ends with the last iteration's, as serially."""
    from gpucell.core.globalreads import plain_reads

    loop = _the_for(plan)
    if loop is None:
        return set()
    local = set(plan.locals) - {*plan.affected_names, *plan.deep_writes}
    bound = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    out: set[tuple[str, str]] = set()
    for via, value in inputs.items():
        reads = plain_reads(value, ns, local)
        if not reads or not _only_called(loop, via):
            continue
        before = set(bound)
        for st in loop.body:
            if any(isinstance(n, ast.Name) and n.id == via for n in ast.walk(st)):
                break
            before |= _bound_by(st)
        out |= {(via, n) for n in reads & before}
    return out


def _the_for(plan: LoopPlan) -> ast.For | None:
    """The cell's parallel ``for`` statement (``None`` for a comprehension)."""
    if plan.loop_lines is None:
        return None
    try:
        tree = ast.parse(plan.source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and node.lineno == plan.loop_lines[0]:
            return node
    return None


def _only_called(loop: ast.For, name: str) -> bool:
    """Every mention of ``name`` in the loop's body is the callee of a call."""
    called = {
        id(n.func)
        for st in loop.body
        for n in ast.walk(st)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    return all(
        id(n) in called
        for st in loop.body
        for n in ast.walk(st)
        if isinstance(n, ast.Name) and n.id == name
    )


def _bound_by(st: ast.stmt) -> set[str]:
    """Names a top-level statement of the body binds whenever it runs: an
    assignment's plain names (nothing it may skip: no ``if``, ``try``...)."""
    if isinstance(st, ast.Assign):
        targets: list[ast.expr] = list(st.targets)
    elif isinstance(st, ast.AnnAssign) and st.value is not None:
        targets = [st.target]
    else:
        return set()
    out: set[str] = set()
    for t in targets:
        todo = [t]
        while todo:
            e = todo.pop()
            if isinstance(e, ast.Name):
                out.add(e.id)
            elif isinstance(e, (ast.Tuple, ast.List)):
                todo.extend(e.elts)
            elif isinstance(e, ast.Starred):
                todo.append(e.value)
    return out


def notebook_functions(plan: LoopPlan, ns: Namespace) -> Iterator[tuple[str, str]]:
    """The functions defined in the notebook that the loop reads, with their
    source (those whose source is not at hand are left out)."""
    import inspect

    for name in plan.inputs:
        fn = ns.get(name)
        if not (
            isinstance(fn, types.FunctionType)
            and getattr(fn, "__module__", None) == "__main__"
        ):
            continue
        try:
            yield name, inspect.getsource(fn)
        except (OSError, TypeError):
            continue


def helpers_changing_data(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """A notebook function the loop calls that changes a tensor through its
    ``.data`` (``p.data -= lr * p.grad``): no version counter moves, so the
    engines' check of inputs and items would not see it (``core/lastitem``)."""
    from gpucell.core.lastitem import data_writes

    for name, source in notebook_functions(plan, ns):
        found = data_writes(source)
        if found:
            line, text = found[0]
            return [
                problem(
                    line_of(plan, name),
                    name,
                    "data-write",
                    f"`{name}`, which the loop calls, changes a tensor through its "
                    f"`.data` (`{text}`, line {line} of `{name}`): that moves no "
                    "version counter, so the engines cannot see the change to send "
                    "it back, and it would be lost. Change the tensor itself under "
                    "`torch.no_grad()` (`with torch.no_grad(): p -= lr * p.grad`), "
                    "or run the cell without %%gpu_parallel.",
                )
            ]
    return []


def helpers_changing_own_rows(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """A notebook function the body hands part of a notebook array
    (``carry_(grid[i], grid[i + 1])``, ``bump_(W[0])``) and that changes its
    argument in place (``dst += src``): an engine hands each iteration a
    read-only view, so it would fail after the chunks were sent; serially the
    change stays in the array.  Refused before anything runs, naming the
    rewrite.  (The iteration's own row, ``center_(data[i])``, is its own item
    in the program the engines run, ``center_(__gpucell_own_data__)``, and
    comes back: core/analysis/ownsubscripts.)"""
    import inspect

    if plan.chunk_ast is None:
        return []
    for call in ast.walk(plan.chunk_ast):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            continue
        fn = ns.get(call.func.id)
        if not (isinstance(fn, types.FunctionType) and fn.__module__ == "__main__"):
            continue
        try:
            params = inspect.signature(fn).parameters
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, ValueError, SyntaxError):
            continue
        given = list(zip(params, call.args, strict=False))
        given += [(k.arg, k.value) for k in call.keywords if k.arg and k.arg in params]
        for param, arg in given:
            row = _part_of_array(arg, ns)
            change = _changes_in_place(tree, param) if row else None
            if row and change:
                return [_changed_part(call, param, change, row)]
    return []


def _changed_part(call: ast.Call, param: str, change: str, row: str) -> Diagnostic:
    name = ast.unparse(call.func)
    return problem(
        call.lineno,
        name,
        "helper-changes-row",
        f"`{name}`, called at line {call.lineno}, changes its argument `{param}` "
        f"in place (`{change}`), and the loop hands it `{row}`, part of a "
        "notebook array that is not the iteration's own item: serially the change "
        "stays in the array for the iterations after it, the engines hand each "
        "iteration a read-only view. Write it in the loop body (`"
        f"{row} = f({row})` with a function that returns the new value), or run "
        "the cell without %%gpu_parallel.",
    )


def _part_of_array(arg: ast.expr, ns: Namespace) -> str | None:
    """``arg``'s text when it is part of a notebook array or tensor
    (``S[...]``): a view of the shipped input on an engine, read-only."""
    if not (isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Name)):
        return None
    array = ns.get(arg.value.id)
    kind = type(array).__module__.split(".")[0]
    if kind not in ("numpy", "torch") or not hasattr(array, "shape"):
        return None
    return ast.unparse(arg)


def _changes_in_place(tree: ast.AST, param: str) -> str | None:
    """The first statement of a function's source that changes its parameter
    ``param`` in place (``p -= m``, ``p[k] = v``, ``p.fill(0)``, ``p.add_(1)``,
    ``np.f(..., out=p)``), as text."""

    def is_param(e: ast.expr) -> bool:
        while isinstance(e, ast.Subscript):
            e = e.value
        return isinstance(e, ast.Name) and e.id == param

    for node in ast.walk(tree):
        if isinstance(node, ast.AugAssign) and is_param(node.target):
            return ast.unparse(node)
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Subscript) and is_param(t) for t in node.targets
        ):
            return ast.unparse(node)
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and is_param(f.value):
                if f.attr in _IN_PLACE or (
                    f.attr.endswith("_") and not f.attr.startswith("_")
                ):
                    return ast.unparse(node)
            if any(k.arg == "out" and is_param(k.value) for k in node.keywords):
                return ast.unparse(node)
    return None


#: numpy methods that change their array in place
_IN_PLACE = frozenset({"fill", "sort", "put", "resize", "partition", "itemset"})


def helpers_changing_modules(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """A notebook function the loop calls that sets an attribute of a module
    (``math.calls += 1``, ``__main__.n_seen = 0``, a ``types.ModuleType`` the
    notebook made): a module travels by name or as a copy, so on an engine the
    change stays in the engine's module (or fails there, the attribute being
    the notebook's alone) and the notebook's module never sees it."""
    import inspect

    from gpucell.core.modulewrites import store_targets

    for name, source in notebook_functions(plan, ns):
        fn = ns[name]
        try:
            tree = ast.parse(textwrap.dedent(source))
        except SyntaxError:
            continue
        local = set(inspect.signature(fn).parameters)
        for node in ast.walk(tree):
            for t in store_targets(node):
                if not (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)):
                    continue
                module = fn.__globals__.get(t.value.id)
                if t.value.id in local or not isinstance(module, types.ModuleType):
                    continue
                spelled = f"{t.value.id}.{t.attr}"
                return [
                    problem(
                        line_of(plan, name),
                        name,
                        "helper-module-state",
                        f"`{name}`, which the loop calls, sets `{spelled}` (line "
                        f"{node.lineno} of `{name}`), an attribute of the module "
                        f"`{module.__name__}`. Each engine has a module of its "
                        "own, so the change would stay there (or fail, the "
                        "attribute being the notebook's alone) and the notebook's "
                        f"`{t.value.id}` would not see it as it does serially. Keep "
                        "the state in a name of the notebook and collect what the "
                        "loop computes (`out.append(...)`), or run the cell "
                        "without %%gpu_parallel.",
                    )
                ]
    return []


#: a torch module's hook tables (forward, pre-forward, backward)
_HOOK_TABLES = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
)
#: what a hook may keep what it sees in: the notebook's containers
_CONTAINERS = (list, dict, set)


def hooks_recording_into_the_notebook(
    plan: LoopPlan, inputs: Namespace
) -> list[Diagnostic]:
    """A hook on a model the loop uses that keeps what it sees in a container
    of the notebook (``register_forward_hook(lambda m, i, o: acts.append(o))``,
    ``activation[name] = output.detach()``): the hook runs on the engines'
    copies of the model, and what it records stays there; the serial cell
    leaves it in the notebook's container."""
    for name, value in inputs.items():
        modules = getattr(value, "modules", None)
        if not callable(modules) or not hasattr(value, "_forward_hooks"):
            continue
        try:
            subs = list(modules())
        except Exception:
            continue
        for sub in subs:
            for table in _HOOK_TABLES:
                for hook in list(getattr(sub, table, {}).values()):
                    kept = _kept_in(hook)
                    if kept is None:
                        continue
                    called = getattr(hook, "__name__", repr(hook))
                    return [
                        problem(
                            line_of(plan, name),
                            name,
                            "hook-records",
                            f"`{name}` has a hook (`{called}`, "
                            f"in `{table.strip('_')}` of a `{type(sub).__name__}`) "
                            f"that keeps what it sees in the notebook's `{kept}`. "
                            "The hook runs on each engine's copy of the model, so "
                            f"what it records would stay there and `{kept}` would "
                            "not get it as it does serially. Remove the hook "
                            "(`handle.remove()`) before the cell and collect what "
                            "you need in the loop (`acts.append(model[0](x))`), or "
                            "run the cell without %%gpu_parallel.",
                        )
                    ]
    return []


def _kept_in(hook: Any) -> str | None:
    """The notebook container a hook function reads by name (a global, or a
    closure's cell), where it may keep what it sees; None if none."""
    fn = getattr(hook, "__func__", hook)
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    globals_ = getattr(fn, "__globals__", {})
    if globals_.get("__name__") != "__main__":
        return None  # (a library's hook keeps its own state)
    for n in code.co_names:
        if isinstance(globals_.get(n), _CONTAINERS):
            return n
    for n, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
        try:
            held = cell.cell_contents
        except ValueError:
            continue
        if isinstance(held, _CONTAINERS):
            return n
    return None
