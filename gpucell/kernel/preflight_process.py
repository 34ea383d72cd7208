"""Pre-flight checks for what the loop changes outside the namespace, which an
engine would keep in its own process: a process-wide setting, a user module's
state, one file every iteration writes, and the ``with`` contexts the engines
enter again around their share of the loop."""

from __future__ import annotations

import ast
import types
from typing import TYPE_CHECKING, Any

from gpucell.core.analysis.diagnostics import Diagnostic
from gpucell.kernel.preflight_functions import notebook_functions
from gpucell.kernel.preflight_problem import Namespace, line_of, problem

if TYPE_CHECKING:
    from gpucell.core.analysis import LoopPlan

__all__ = [
    "contexts_that_cannot_travel",
    "one_file_written_by_every_iteration",
    "process_state_changes",
    "user_module_state_changes",
]


def user_module_state_changes(plan: LoopPlan, inputs: Namespace) -> list[Diagnostic]:
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
            problem(
                line_of(plan, w.via),
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


def process_state_changes(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
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
    from gpucell.core.loggerconfig import logger_message

    logger = logger_message(line, call)
    if logger is not None:
        return [problem(line, call, "process-state", logger)]
    return [
        problem(
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

    for name, source in notebook_functions(plan, ns):
        found = helper_file_writes(source)
        if found:
            line, path = found[0]
            return name, line, path
    return None


def one_file_written_by_every_iteration(
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
            problem(
                line_of(plan, name),
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
            problem(
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


def contexts_that_cannot_travel(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
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
    return problem(
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
    return problem(
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
    return problem(
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
