"""Pre-flight checks: what the namespace shows, after the prelude, that the
cell's text could not (the run-time refusals).

Each check looks at the live objects the loop will read (a generator's code,
a notebook function's globals, an index's labels, a row's identity) and
returns the problems it finds as :class:`~gpucell.core.analysis.Diagnostic`
values; nothing here runs the loop or writes the namespace.  :func:`refuse`
raises one :class:`~gpucell.errors.NotParallelizable` listing every problem,
as the static analysis does, so the cell is fixed in one edit.
"""

from __future__ import annotations

import ast
import textwrap
import types
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from gpucell.core.analysis.diagnostics import Diagnostic, in_order
from gpucell.errors import NotParallelizable

if TYPE_CHECKING:
    from gpucell.core.analysis import LoopPlan

__all__ = [
    "after_drawing",
    "before_drawing",
    "fingerprints",
    "format_problems",
    "refuse",
]

Namespace = dict[str, Any]

#: what the one-problem message ends with (the prelude ran, as serially)
NOTHING_RAN = "Nothing from the loop ran."
#: ... and the message about drawing a lazy iterable's items
ITEMS_DRAWN = (
    "The items were drawn (as serially, the generator ran); nothing of the loop "
    "body ran."
)


def refuse(problems: Iterable[Diagnostic], ending: str = NOTHING_RAN) -> None:
    """Raise one :class:`NotParallelizable` naming every problem (none: return)."""
    items = in_order(problems)
    if items:
        err = NotParallelizable(format_problems(items, ending))
        err.diagnostics = items  # type: ignore[attr-defined]
        raise err


def format_problems(items: tuple[Diagnostic, ...], ending: str = NOTHING_RAN) -> str:
    """One problem reads as it always has (its text, then ``ending``); several
    are listed as the static analysis lists them."""
    if len(items) == 1:
        return f"%%gpu_parallel: {items[0].text} {ending}"
    lines = [
        "%%gpu_parallel cannot run this loop in parallel and keep the result "
        f"identical to running it serially ({len(items)} problems):"
    ]
    lines += [f"  - line {d.line}: {d.text}" for d in items]
    lines.append(f"{ending} (The cell's code before the loop ran, as serially.)")
    return "\n".join(lines)


def before_drawing(
    plan: LoopPlan, ns: Namespace, inputs: Namespace, values: list[Any]
) -> list[Diagnostic]:
    """Every problem found before the loop's items are drawn (the prelude ran;
    ``values`` are the iterable's parts as evaluated, ``inputs`` what the body
    reads)."""
    out: list[Diagnostic] = []
    out += _interleaved_generators(plan, values, ns)
    out += _duplicate_labels(plan, ns)
    out += _helpers_reading_what_the_loop_changes(plan, ns, inputs)
    out += _one_file_written_by_every_iteration(plan, ns)
    out += _user_module_state_changes(plan, inputs)
    out += _process_state_changes(plan, ns)
    out += _helpers_changing_data(plan, ns)
    out += _unions_of_other_types(plan, ns)
    out += _keyed_stores(plan, ns)
    out += _inputs_shared_with_sinks(plan, ns, inputs, values)
    out += _contexts_that_cannot_travel(plan, ns)
    out += _rows_that_are_not_own(plan, ns)
    out += _helpers_changing_own_rows(plan, ns)
    return out


def _keyed_stores(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    from gpucell.kernel import keyed_stores  # (it uses this module's helpers)

    return keyed_stores.of_other_types(plan, ns)


def _line_of(plan: LoopPlan, name: str | None = None) -> int:
    """Where the cell names ``name`` (the loop's line when it does not)."""
    loop = plan.loop_lines[0] if plan.loop_lines is not None else 1
    lines = {info.name: info.line for info in plan.names}
    return lines.get(name, loop) if name is not None else loop


def _problem(line: int, name: str, kind: str, text: str) -> Diagnostic:
    return Diagnostic(line, 0, name, kind, text)


def _interleaved_generators(
    plan: LoopPlan, values: list[Any], ns: Namespace
) -> list[Diagnostic]:
    """A generator whose items depend on what the body changes (``yield len(out)``
    while the body appends to ``out``) interleaves with the body serially; here
    its items are all drawn first, so they would differ."""
    from gpucell.core.globalreads import generator_reads

    changed = set(plan.affected_names) | set(plan.locals)
    out = []
    for value in values:
        code = getattr(value, "gi_code", None)
        if not isinstance(value, types.GeneratorType) or code is None:
            continue
        # globals notebook code reads (never attribute names: iterrows reads
        # `self.index`, no global `index`), and what the generator was given
        reads = {r.name for r in generator_reads(value, ns, changed)}
        if reads:
            names = ", ".join(f"`{n}`" for n in sorted(reads))
            out.append(
                _problem(
                    _line_of(plan),
                    code.co_name,
                    "interleaved-generator",
                    f"the loop iterates over the generator `{code.co_name}`, which "
                    f"reads {names}, which the loop body changes (line "
                    f"{_line_of(plan)}): serially each item is made after the "
                    "iterations before it, here all items are made first, so they "
                    "would differ. Build the items first (`items = list(...)` in a "
                    "cell of its own, then loop over `items`), or run the cell "
                    "without %%gpu_parallel.",
                )
            )
    return out


def fingerprints(plan: LoopPlan, ns: Namespace) -> dict[str, Any]:
    """The inputs' fingerprints (to see what drawing a lazy iterable changed)."""
    from gpucell.protocol.fingerprint import fingerprint

    return {n: fingerprint(ns[n]) for n in plan.inputs if n in ns}


def after_drawing(
    plan: LoopPlan, ns: Namespace, before: dict[str, Any], lazy: list[Any]
) -> list[Diagnostic]:
    """Drawing a generator's items changed a name the body reads (``def
    gen(): log.append(...); yield ...`` while the body reads ``len(log)``):
    serially each iteration sees what the items drawn before it changed; here
    every item was drawn first.  (An input without a fingerprint, an object
    gpucell cannot summarise, is not checked.)"""
    after = fingerprints(plan, ns)
    changed = sorted(
        n
        for n, fp in before.items()
        if fp is not None and (n not in after or after[n] != fp)
    )
    if not changed:
        return []
    what = getattr(getattr(lazy[0], "gi_code", None), "co_name", None)
    source = f"the generator `{what}`" if what else f"a {type(lazy[0]).__name__}"
    names = ", ".join(f"`{n}`" for n in changed)
    return [
        _problem(
            _line_of(plan),
            changed[0],
            "changed-by-drawing",
            f"drawing the loop's items from {source} changed {names}, which the "
            f"loop body reads (line {_line_of(plan)}): serially each iteration "
            "sees what drawing the items before it changed; here every item is "
            "drawn first, so the iterations would see another value. Draw the "
            "items in a cell of their own (`items = list(...)`) and loop over "
            "`items`, or run the cell without %%gpu_parallel.",
        )
    ]


def _helpers_reading_what_the_loop_changes(
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
            _problem(
                _line_of(plan, r.via),
                r.name,
                "helper-reads-changed",
                f"{what}, called at line {called}, reads the global `{r.name}`, "
                f"which the loop changes (line {_line_of(plan, r.name)}). Serially "
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


def _user_module_state_changes(plan: LoopPlan, inputs: Namespace) -> list[Diagnostic]:
    """A function from one of the user's own modules (``helpers.py``) that
    changes its module's state (``LOG.append(x)``): it travels to the engines
    by name, so the changes would stay there and the notebook's module would
    be left as it was, without a word (the first law)."""
    from gpucell.core.modulewrites import module_writes

    try:
        tree = ast.parse(plan.source)
    except SyntaxError:
        return []
    attrs = frozenset(n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute))
    out, seen = [], set()
    for w in module_writes(inputs, attrs):
        if (w.via, w.function) in seen:
            continue
        seen.add((w.via, w.function))
        if isinstance(inputs.get(w.via), types.ModuleType):
            what = f"`{w.via}.{w.function}`"
        elif w.function != w.via:
            what = f"`{w.via}` (through `{w.function}`)"
        else:
            what = f"`{w.via}`"
        out.append(
            _problem(
                _line_of(plan, w.via),
                w.via,
                "user-module-state",
                f"{what}, which the loop calls, changes `{w.what}` of "
                f"your module `{w.module}` (line {w.line} of {w.path}). The "
                f"engines import `{w.module}` afresh and run the function there, "
                "so those changes would stay on them and the notebook's "
                f"`{w.module}` would not see them as it does serially. Return "
                "what the function records and collect it in the loop "
                "(`out.append(...)`), or run the cell without %%gpu_parallel.",
            )
        )
    return out


def _process_state_changes(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """``os.chdir``, ``pd.set_option``, ``torch.set_default_dtype`` in the
    body: serially later iterations (and the kernel) see the change; on an
    engine it changes that process only, and stays for its later cells.  A
    setter inside a restoring ``with`` counts as undone only where the
    ``with``'s function is its library's (``core/lastitem.py``)."""
    from gpucell.core.lastitem import process_state_calls

    calls = list(plan.facts.process_state_calls)
    if not calls and plan.loop_lines is not None:
        calls = process_state_calls(
            plan.source, plan.loop_lines[0], lambda name: _resolved(name, ns)
        )
    if not calls:
        return []
    line, call = calls[0]
    return [
        _problem(
            line,
            call,
            "process-state",
            f"line {line} calls `{call}`, which changes state of the whole "
            "process: serially the iterations after it and the notebook see the "
            "change; each engine would change only its own process, and keep it "
            "for later cells. Use its `with` form where there is one "
            "(`np.errstate`, `pd.option_context`, `torch.no_grad`), pass what the "
            "call sets as an argument instead (`dtype=`), or run the cell without "
            "%%gpu_parallel.",
        )
    ]


def _notebook_functions(plan: LoopPlan, ns: Namespace) -> Iterator[tuple[str, str]]:
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


def _helpers_changing_data(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """A notebook function the loop calls that changes a tensor through its
    ``.data`` (``p.data -= lr * p.grad``): no version counter moves, so the
    engines' check of inputs and items would not see it (``core/lastitem``)."""
    from gpucell.core.lastitem import data_writes

    for name, source in _notebook_functions(plan, ns):
        found = data_writes(source)
        if found:
            line, text = found[0]
            return [
                _problem(
                    _line_of(plan, name),
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


def _helpers_changing_own_rows(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
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
    return _problem(
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


def _resolved(name: str, ns: Namespace) -> Any:
    """What a dotted name is in the notebook, or ``None``."""
    root, *rest = name.split(".")
    obj = ns.get(root)
    for part in rest:
        obj = getattr(obj, part, None)
    return obj


def _helper_file_write(plan: LoopPlan, ns: Namespace) -> tuple[str, int, str] | None:
    """A notebook function the loop calls that writes one fixed file."""
    from gpucell.core.lastitem import helper_file_writes

    for name, source in _notebook_functions(plan, ns):
        found = helper_file_writes(source)
        if found:
            line, path = found[0]
            return name, line, path
    return None


def _one_file_written_by_every_iteration(
    plan: LoopPlan, ns: Namespace
) -> list[Diagnostic]:
    """``open("log.txt", "a")`` in the body, the path the same in every
    iteration: serially the file ends with the lines in iteration order (or,
    for ``"w"``, the last iteration's content); engines writing it at once
    would leave another order or another iteration's content."""
    if getattr(ns.get("open"), "__module__", None) == "__main__":
        return []  # (`open` defined in the notebook: not the builtin's, nor IPython's)
    out = []
    helper = _helper_file_write(plan, ns)
    if helper is not None:
        name, line, path = helper
        out.append(
            _problem(
                _line_of(plan, name),
                name,
                "shared-file",
                f"`{name}`, which the loop calls, opens `{path}` for writing (line "
                f"{line} of `{name}`), the same file at every call: serially it "
                "ends with what the iterations wrote in order; calls on engines at "
                "once would write it in another order. Return what to write and "
                "collect it in the loop (`lines.append(...)`), then write the file "
                "once after it, or give each call its own file.",
            )
        )
    if plan.facts.shared_file_writes:
        line, path = plan.facts.shared_file_writes[0]
        out.append(
            _problem(
                line,
                path,
                "shared-file",
                f"line {line} opens `{path}` for writing in every iteration (or in "
                "a loop inside it), the same file each time: serially it ends with "
                "what the iterations wrote in order (or the last one's, for mode "
                "'w'); engines writing it at once would leave another order or "
                "another iteration's content. Collect what to write in a list in "
                "the loop (`lines.append(...)`) and write the file once after it, "
                "or give each iteration its own file (a path built from the loop "
                "variable).",
            )
        )
    return out


def _unions_of_other_types(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """``x.add(...)``/``x.update(...)`` in the body is merged as a set union or
    a dict update; on any other object (a notebook class, ``hashlib``'s
    hashes, a tqdm bar) the method does something the merge cannot replay."""
    out = []
    for name in plan.unions:
        # (Counter, OrderedDict, defaultdict and other subclasses included)
        if name not in ns or isinstance(ns[name], (set, dict)):
            continue
        kind = type(ns[name])
        where = (
            "defined in this notebook"
            if kind.__module__ == "__main__"
            else (f"from `{kind.__module__}`")
        )
        out.append(
            _problem(
                _line_of(plan, name),
                name,
                "union-of-other-type",
                f"`{name}.add(...)`/`{name}.update(...)` (line "
                f"{_line_of(plan, name)}) changes `{name}`, a `{kind.__name__}` "
                f"({where}). gpucell merges `.add`/`.update` only on sets, dicts "
                "and Counters, replaying them in iteration order; another object's "
                "method would run on each engine's copy. Collect the arguments in "
                f"a list in the loop (`args.append(...)`) and call `{name}.update` "
                "on each after the loop, or run the cell without %%gpu_parallel.",
            )
        )
    return out


def _inputs_shared_with_sinks(
    plan: LoopPlan, ns: Namespace, inputs: Namespace, values: list[Any]
) -> list[Diagnostic]:
    """An input that is, holds or shares memory with an object the loop changes
    (``y = out`` in an earlier cell): serially iterations see earlier ones'
    changes through it, on an engine it is a copy from before the loop."""
    from gpucell.core.aliasing import shared_with_sinks

    growing = [
        *plan.gathers,
        *plan.unions,
        *(k for k, _ in plan.keyed),
        *plan.keyed_gathers,
        *(r.name for r in plan.reductions),
    ]
    sinks = {n: ns[n] for n in (*growing, *plan.writes) if n in ns}
    found = shared_with_sinks(sinks, inputs, frozenset(plan.deep_writes))
    iterable = {n: ns[n] for n in growing if n in ns}
    found += [
        s._replace(input="the loop's iterable")
        for v in values
        for s in shared_with_sinks(iterable, {"": v})
    ]
    out, seen = [], set()
    for s in found:
        if s.input in seen:
            continue  # (one problem per input: the first object it shares)
        seen.add(s.input)
        named = s.input != "the loop's iterable"
        reader = f"`{s.input}`" if named else s.input
        copy_hint = (
            f"`{s.input} = copy.copy({s.input})`" if named else "`items = list(...)`"
        )
        out.append(
            _problem(
                _line_of(plan, s.sink),
                s.input,
                "input-shares-sink",
                f"{reader} {s.how} `{s.sink}`, which the loop changes (line "
                f"{_line_of(plan, s.sink)}). Serially each iteration would see "
                f"through {reader} what the iterations before it changed; on an "
                "engine it is a copy from before the loop, so the results would "
                f"differ. Make a copy before the loop ({copy_hint}), or run the "
                "cell without %%gpu_parallel.",
            )
        )
    return out


def _contexts_that_cannot_travel(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """Engines re-enter each ``with`` item around the loop; one whose object
    cannot travel (a lock, an open file, a transaction) is refused by name,
    before anything is sent (the kernel is inside it now, as serially)."""
    from gpucell.protocol import wire

    out = []
    for layer in plan.layers:
        for item in layer.node.items:
            if _records_warnings(item.context_expr, ns):
                out.append(_recorder_problem(layer.node, item))
            if item.optional_vars is not None:
                continue
            for node in ast.walk(item.context_expr):
                if not isinstance(node, ast.Name) or node.id not in ns:
                    continue
                value = ns[node.id]
                try:
                    wire.dumps(value)
                except Exception as e:
                    out.append(_context_problem(layer.node, item, node.id, value, e))
                    continue
                if _a_notebook_stream(value):
                    out.append(_stream_problem(layer.node, item, node.id, value))
    return out


def _a_notebook_stream(value: Any) -> bool:
    """A stream the notebook names (an ``io.StringIO`` it reads after the
    loop): what an engine's copy of it receives stays on the engine
    (``redirect_stdout(buf)`` around the loop).  ``sys.stdout`` is no name
    here (an attribute of ``sys``), and the kernel may already be inside the
    redirection, so it is not compared with."""
    import io
    import sys

    if not isinstance(value, io.IOBase):
        return False
    return value is not sys.__stdout__ and value is not sys.__stderr__


def _records_warnings(expr: ast.expr, ns: Namespace) -> bool:
    """``warnings.catch_warnings(record=True)`` (by any name the notebook
    gave it): each engine would record into its copy of the list."""
    import warnings

    if not isinstance(expr, ast.Call):
        return False
    record = [k.value for k in expr.keywords if k.arg == "record"]
    if not record or (isinstance(record[0], ast.Constant) and not record[0].value):
        return False
    f = expr.func
    if isinstance(f, ast.Name):
        fn = ns.get(f.id)
    elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        fn = getattr(ns.get(f.value.id), f.attr, None)
    else:
        return False
    return isinstance(fn, type) and issubclass(fn, warnings.catch_warnings)


def _recorder_problem(node: ast.With, item: ast.withitem) -> Diagnostic:
    return _problem(
        node.lineno,
        "warnings",
        "context-records-warnings",
        f"`with {ast.unparse(item.context_expr)}:` (line {node.lineno}) would "
        "be entered again on every engine around its share of the loop, and "
        "each engine would record the warnings into its own copy of the list: "
        "the notebook's list would stay empty. Record inside the loop "
        "(`with warnings.catch_warnings(record=True) as w:` in the body, then "
        "`caught.extend(w)`), or run the cell without %%gpu_parallel.",
    )


def _stream_problem(
    node: ast.With, item: ast.withitem, name: str, value: Any
) -> Diagnostic:
    return _problem(
        node.lineno,
        name,
        "context-writes-notebook-stream",
        f"`with {ast.unparse(item.context_expr)}:` (line {node.lineno}) is "
        "entered again on every engine around its share of the loop, with a "
        f"copy of `{name}` (a {type(value).__name__}): what the loop writes "
        f"through it would stay in the engines' copies, and `{name}` would "
        "miss it. Collect what the loop prints (`lines.append(...)`) and write "
        f"it to `{name}` after the loop, or run the cell without %%gpu_parallel.",
    )


def _context_problem(
    node: ast.With, item: ast.withitem, name: str, value: Any, e: Exception
) -> Diagnostic:
    return _problem(
        node.lineno,
        name,
        "context-cannot-travel",
        f"`with {ast.unparse(item.context_expr)}:` (line {node.lineno}) is "
        "entered again on every engine around its share of the loop, but "
        f"`{name}` (a {type(value).__name__}) cannot travel to an engine ({e}), "
        "and a copy would not be the same context anyway (a lock guards only the "
        "kernel, a file or transaction is open only there). Keep the `with` "
        "around the statements that need it and put the loop outside it, create "
        "the context inside the loop body (each iteration gets its own), or run "
        "the cell without %%gpu_parallel.",
    )


def _duplicate_labels(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """Rows written by label (``df.at[idx, "c"] = ...`` in ``df.iterrows()``) are
    each iteration's own only when no two rows share a label."""
    out = []
    for name in plan.writes:
        value = ns.get(name)
        # rows by the index; a DataFrame's columns too (`for col, s in
        # df.items(): df[col] = ...`)
        for axis, what, fix in (
            ("index", "rows", f"`{name} = {name}.reset_index(drop=True)`"),
            ("columns", "columns", f"`{name}.columns = [...]`"),
        ):
            labels = getattr(value, axis, None)
            if labels is not None and getattr(labels, "is_unique", True) is False:
                out.append(
                    _problem(
                        _line_of(plan, name),
                        name,
                        "duplicate-labels",
                        f"`{name}` is written by label and its {axis} has "
                        "duplicate labels, so two iterations may write the same "
                        f"{what} (and serially a later one could read what an "
                        f"earlier one wrote). Make the labels unique ({fix}), or "
                        "run the cell without %%gpu_parallel.",
                    )
                )
                break
    return out


def _rows_that_are_not_own(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """Own-row writes (``C[i][j] += ...``) are serial-equivalent only when no two
    rows are one object (``[[0] * m] * n`` makes n names for one list: serially
    a write to one row shows in all) and, for whole-element writes, when the
    elements are values (a list element changed by ``+=`` keeps its identity
    serially, which a copy from an engine would not)."""
    out = []
    for row in plan.own_rows:
        target = ns.get(row.name)
        if target is None:
            continue
        where = f"`{row.name}` (line {row.line})"
        if row.mode == "row":
            problem = _shared_row(row.name, where, target)
        else:
            problem = _element_not_value(row.name, where, target)
        if problem is not None:
            out.append(
                _problem(
                    row.line,
                    row.name,
                    "row-not-own",
                    f"{problem}. Or run the cell without %%gpu_parallel.",
                )
            )
    return out


def _shared_row(name: str, where: str, target: Any) -> str | None:
    """Why rows of ``target`` are not each iteration's own, or ``None``."""
    from gpucell.core.aliasing import first_shared_element
    from gpucell.protocol.fold import is_numpy, is_torch

    array = is_numpy(target) or is_torch(target)
    if not isinstance(target, (list, dict)) and not array:
        return (
            f"{where} is a {type(target).__name__}; gpucell writes the rows of "
            "lists, dicts, numpy arrays and tensors"
        )
    if array and (target.ndim == 0 or _first_stride(target) == 0):
        return f"{where} repeats one row in memory (a broadcast view)"
    pair = first_shared_element(target)
    if pair is None:
        return None
    a, b = pair
    return (
        f"`{name}[{a!r}]` and `{name}[{b!r}]` are the same object (as "
        "`[[0] * m] * n` makes them), so serially a write to one row shows in the "
        "other. Build the rows separately (`[[0] * m for _ in range(n)]`)"
    )


def _element_not_value(name: str, where: str, target: Any) -> str | None:
    """Why whole elements of ``target`` cannot be written back, or ``None``."""
    from gpucell.core.aliasing import first_mutable_element
    from gpucell.protocol.fold import is_numpy, is_torch

    if is_numpy(target) or is_torch(target):
        # serially `y[i] = v` stores v cast to the array's dtype and a later
        # `y[i]` reads the cast value back; an engine's private element is
        # a plain value, so an int or float32 array would read back more
        # than it stored: numbers that differ without a word
        return (
            f"{where} is a {type(target).__name__} whose elements the loop "
            "assigns whole and reads back; the array would cast each value to its "
            "dtype, an engine's private copy would not. Accumulate in a local and "
            f"store it once (`acc = 0.0`, ..., `{name}[i] = acc`)"
        )
    if isinstance(target, (list, dict)):
        key = first_mutable_element(target)
        if key is not None:
            return (
                f"{where} holds a {type(target[key]).__name__} at "
                f"`{name}[{key!r}]`, and the loop assigns whole elements and reads "
                "them back; serially such an element keeps its identity, which a "
                "copy from an engine would not"
            )
    return None


def _first_stride(array: Any) -> int:
    from gpucell.protocol.fold import is_torch

    return int(array.stride(0) if is_torch(array) else array.strides[0])
