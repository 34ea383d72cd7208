"""The loop variable after the loop: the iterable's last item itself (pure).

Serially ``for xb in batches: ...`` leaves ``xb`` bound to ``batches[-1]``,
the same object; from an engine it would come back an equal copy (a later
``xb[0] = 0`` would then not show in ``batches``, and a numpy row would not
share memory with its array).  When the body never rebinds or deletes a name
of the loop's target, the kernel binds the target to the last item it holds
itself, with Python's own unpacking (``for i, (a, b) in ...``).
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Callable
from types import CodeType, ModuleType
from typing import Any

__all__ = [
    "LAST_ITEM",
    "RESTORING_LIBRARY",
    "dotted_name",
    "last_item_binding",
    "loop_node",
    "shared_file_writes",
]

#: the name the kernel puts the last item under while the binding runs
LAST_ITEM = "__gpucell_last_item__"


def _names_only(target: ast.expr) -> bool:
    """Plain names, in tuples or lists: each is bound to a part of the item.
    (Not ``*rest``: it gets a new list, which the body may have gathered and
    so be the same object as one that came back from the engine.)"""
    if isinstance(target, ast.Name):
        return True
    if isinstance(target, (ast.Tuple, ast.List)):
        return all(_names_only(e) for e in target.elts)
    return False


def _target_names(target: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _touched(body: list[ast.stmt]) -> set[str]:
    """Names the body binds or deletes anywhere (nested scopes included: a
    ``global``/``nonlocal`` there could rebind the target, so be generous)."""
    out: set[str] = set()
    binds = (ast.Store, ast.Del)
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, binds):
                out.add(node.id)
            elif isinstance(node, defs):
                out.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                out.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                out.update(node.names)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                out.add(node.name)
    return out


def loop_node(source: str, line: int) -> ast.For | None:
    """The ``for`` statement at ``line`` of ``source`` (the analysed cell), or
    ``None``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    return next(
        (n for n in ast.walk(tree) if isinstance(n, ast.For) and n.lineno == line),
        None,
    )


def last_item_binding(
    source: str, line: int, filename: str, part: bool = False
) -> CodeType | None:
    """Code binding the ``for`` loop at ``line``'s target to ``LAST_ITEM``, or
    ``None`` when the body may leave another value there (it rebinds or
    deletes a target name) or the target is not plain names.  ``part``: the
    loop runs with its own elements (``analysis/ownsubscripts.py``), its
    item the first part of ``LAST_ITEM``."""
    loop = loop_node(source, line)
    if loop is None or not _names_only(loop.target):
        return None
    if _target_names(loop.target) & _touched(loop.body):
        return None
    item = f"{LAST_ITEM}[0]" if part else LAST_ITEM
    module = ast.parse(f"{ast.unparse(loop.target)} = {item}")
    ast.increment_lineno(module, line - 1)  # (an error names the loop's line)
    return compile(module, filename, "exec")


_WRITE_MODES = frozenset("wax+")


def shared_file_writes(source: str, line: int) -> list[tuple[int, str]]:
    """``(line, path text)`` of each ``open(path, mode)`` that every iteration
    of the ``for`` loop at ``line`` runs (not under an ``if`` or an inner
    loop: a marker file touched once is fine) and that writes (mode ``w``,
    ``a``, ``x`` or ``+``) a path naming nothing the loop binds: every
    iteration writes the same file, so what it holds at the end (the last
    iteration's content, or the lines in iteration order) depends on which
    engine writes when."""
    loop = loop_node(source, line)
    if loop is None:
        return []
    bound = _target_names(loop.target) | _touched(loop.body)
    out: list[tuple[int, str]] = []
    for stmt in _every_iteration(loop.body):
        out += _writes(_own_nodes(stmt), bound)
    # a loop nested in the body may write many times per iteration, under an
    # `if` of its own too: engines' writes would interleave
    for node in ast.walk(ast.Module(body=loop.body, type_ignores=[])):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            inner = [n for s in node.body for n in ast.walk(s)]
            out += _writes(inner, bound)
    return sorted(set(out))


#: writers that take a path (not an open file) and replace or extend that
#: file: where the path is among the arguments (``None``: the receiver is it,
#: as ``Path(p).write_text(s)``)
PATH_WRITERS: dict[str, int | None] = {
    "save": 0,  # np.save(p, a), img.save(p), torch.save is below
    "savez": 0,
    "savez_compressed": 0,
    "savetxt": 0,
    "savefig": 0,
    "to_csv": 0,
    "to_parquet": 0,
    "to_json": 0,
    "to_pickle": 0,
    "to_excel": 0,
    "to_feather": 0,
    "to_hdf": 0,
    "write_text": None,
    "write_bytes": None,
}
#: dotted writers whose path is another argument than PATH_WRITERS says
_PATH_AT = {"torch.save": 1, "joblib.dump": 1}


def _path_writer(node: ast.Call) -> ast.expr | None:
    """The path a library writer call (``np.save(p, a)``, ``df.to_csv(p)``,
    ``torch.save(m, p)``, ``Path(p).write_text(s)``) writes, if it is one."""
    f = node.func
    if not isinstance(f, ast.Attribute):
        return None
    dotted = dotted_name(f) or ""
    at = _PATH_AT.get(dotted, PATH_WRITERS.get(f.attr, -1))
    if dotted == "joblib.dump" or f.attr in PATH_WRITERS or dotted in _PATH_AT:
        if at is None:
            return f.value
        if at is not None and 0 <= at < len(node.args):
            return node.args[at]
        for kw in node.keywords:
            if kw.arg in ("path", "path_or_buf", "file", "fname", "f", "filename"):
                return kw.value
    return None


def _writes(nodes: list[ast.AST], bound: set[str]) -> list[tuple[int, str]]:
    """``open(path, mode)`` calls (and library writers given a path) among
    ``nodes`` that write a path naming nothing in ``bound``."""
    out: list[tuple[int, str]] = []
    for node in nodes:
        if isinstance(node, ast.Call):
            written = _path_writer(node)
            if written is not None and not (
                isinstance(written, ast.Constant) and not isinstance(written.value, str)
            ):
                names = {n.id for n in ast.walk(written) if isinstance(n, ast.Name)}
                if not names & bound:
                    out.append((node.lineno, ast.unparse(written)))
                continue
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "open"
            and node.args
        ):
            continue
        mode: ast.expr | None = node.args[1] if len(node.args) > 1 else None
        for kw in node.keywords:
            if kw.arg == "mode":
                mode = kw.value
        if not (
            isinstance(mode, ast.Constant)
            and isinstance(mode.value, str)
            and _WRITE_MODES & set(mode.value)
        ):
            continue
        path = node.args[0]
        names = {n.id for n in ast.walk(path) if isinstance(n, ast.Name)}
        if not names & bound:
            out.append((node.lineno, ast.unparse(path)))
    return out


#: calls that change state of the whole process (its working directory, a
#: library's options, default dtypes, error modes), which an engine would
#: change in its own process only, and keep for later cells
PROCESS_STATE_SETTERS = frozenset(
    {
        "os.chdir",
        "os.putenv",
        "os.unsetenv",
        "os.umask",
        "pd.set_option",
        "pandas.set_option",
        "pd.reset_option",
        "np.seterr",
        "numpy.seterr",
        "np.set_printoptions",
        "numpy.set_printoptions",
        "torch.set_default_dtype",
        "torch.set_default_device",
        "torch.set_default_tensor_type",
        "torch.set_num_threads",
        "torch.set_grad_enabled",
        "torch.set_printoptions",
        "torch.use_deterministic_algorithms",
        "torch.set_float32_matmul_precision",
        "torch.set_flush_denormal",
        "torch.set_num_interop_threads",
        "torch.autograd.set_detect_anomaly",
        # hooks every module of the process runs (not one module's own)
        *(
            f"{prefix}.modules.module.register_module_{hook}"
            for prefix in ("torch.nn", "nn")
            for hook in (
                "forward_hook",
                "forward_pre_hook",
                "backward_hook",
                "full_backward_hook",
                "full_backward_pre_hook",
                "buffer_registration_hook",
                "module_registration_hook",
                "parameter_registration_hook",
            )
        ),
        "sys.setrecursionlimit",
        "locale.setlocale",
        "warnings.filterwarnings",
        "warnings.simplefilter",
        "warnings.resetwarnings",
        "logging.basicConfig",
        "logging.disable",
        "matplotlib.use",
        "plt.style.use",
        "matplotlib.rcParams.update",
        "plt.rcParams.update",
        "sklearn.set_config",
        "tf.config.set_visible_devices",
    }
)


#: the ``with`` forms (their function's last name) that put back what a setter
#: changes: a setter inside one, within an iteration, changes nothing the next
#: iteration or the notebook sees
RESTORED_BY: dict[str, frozenset[str]] = {
    # (an "ignore" or "error" filter only: one that shows warnings the
    # kernel's filters would not could show them differently when the kernel
    # issues them again, gpucell.protocol.warned)
    **dict.fromkeys(
        ("warnings.filterwarnings", "warnings.simplefilter"),
        frozenset({"catch_warnings"}),
    ),
    **dict.fromkeys(("np.seterr", "numpy.seterr"), frozenset({"errstate"})),
    **dict.fromkeys(
        ("pd.set_option", "pandas.set_option", "pd.reset_option"),
        frozenset({"option_context"}),
    ),
    **dict.fromkeys(
        ("np.set_printoptions", "numpy.set_printoptions"), frozenset({"printoptions"})
    ),
    "torch.set_grad_enabled": frozenset(
        {"no_grad", "enable_grad", "set_grad_enabled", "inference_mode"}
    ),
    **dict.fromkeys(
        (
            "matplotlib.rcParams.update",
            "plt.rcParams.update",
            "matplotlib.rcParams[...]",
            "plt.rcParams[...]",
            "mpl.rcParams[...]",
        ),
        frozenset({"rc_context"}),
    ),
    "os.chdir": frozenset({"chdir"}),
}


#: the library each restoring ``with`` function comes from: a notebook
#: function of the same name (one that restores nothing) is not trusted
RESTORING_LIBRARY: dict[str, str] = {
    "catch_warnings": "warnings",
    "errstate": "numpy",
    "option_context": "pandas",
    "printoptions": "numpy",
    "no_grad": "torch",
    "enable_grad": "torch",
    "set_grad_enabled": "torch",
    "inference_mode": "torch",
    "rc_context": "matplotlib",
    "chdir": "contextlib",
}

#: ``dotted name -> object``, or ``None`` where it cannot be resolved
Resolve = Callable[[str], Any]


def _imports(source: str) -> dict[str, str]:
    """``name -> the module path it is bound to`` by the cell's own imports
    (``import numpy as np``: ``np -> numpy``; ``from warnings import
    catch_warnings``: ``catch_warnings -> warnings.catch_warnings``)."""
    out: dict[str, str] = {}
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    root = a.name.split(".")[0]
                    out[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _library_of(name: str, imports: dict[str, str], resolve: Resolve | None) -> str:
    """The top-level module ``name`` (dotted) comes from: the cell's imports
    name it, else what it resolves to in the notebook (an object's
    ``__module__``, a module's name); ``""`` where neither tells."""
    root = name.split(".", 1)[0]
    if root in imports:
        return imports[root].split(".", 1)[0]
    obj = resolve(name) if resolve is not None else None
    if obj is None:
        return ""
    module = getattr(obj, "__module__", None)
    if not isinstance(module, str):
        module = getattr(obj, "__name__", "") if isinstance(obj, ModuleType) else ""
    return module.split(".", 1)[0]


def _restoring(
    node: ast.With | ast.AsyncWith, imports: dict[str, str], resolve: Resolve | None
) -> frozenset[str]:
    """The last names of the context functions a ``with`` enters that come
    from their library (``resolve`` ``None``: by name only)."""
    names = set()
    for item in node.items:
        e = item.context_expr
        f = e.func if isinstance(e, ast.Call) else e
        name = dotted_name(f) or ""
        last = name.rsplit(".", 1)[-1]
        if resolve is None or _library_of(name, imports, resolve) == (
            RESTORING_LIBRARY.get(last)
        ):
            names.add(last)
    return frozenset(names)


def _undone(call: str, node: ast.Call, contexts: list[frozenset[str]]) -> bool:
    """A setter inside a ``with`` that puts its state back."""
    if call.startswith("warnings."):
        action = [k.value for k in node.keywords if k.arg == "action"] or node.args[:1]
        if not (
            action
            and isinstance(action[0], ast.Constant)
            and action[0].value in ("ignore", "error")
        ):
            return False
    undo = RESTORED_BY.get(call, frozenset())
    return any(undo & names for names in contexts)


def process_state_calls(
    source: str, line: int, resolve: Resolve | None = None
) -> list[tuple[int, str]]:
    """``(line, call)`` of each call in the body of the ``for`` loop at
    ``line`` that changes process-wide state (``os.chdir``,
    ``pd.set_option``, ``torch.set_default_dtype``...), or assigns into
    ``os.environ``: serially the later iterations see the change, and the
    kernel keeps it; an engine changes its own process only, and keeps it
    for the cells after.  A ``with`` form (``np.errstate``,
    ``pd.option_context``) is fine: it undoes itself; so is a setter inside
    a ``with`` in the body that puts its state back (``warnings.simplefilter``
    in ``with warnings.catch_warnings():``, :data:`RESTORED_BY`), where
    ``resolve`` (the kernel's names) says the ``with``'s function comes from
    its library (:data:`RESTORING_LIBRARY`): a notebook ``catch_warnings``
    of its own restores nothing.  Without ``resolve`` (the analysis, which
    sees no values), by name only.  A logger configured in the body
    (``lg.setLevel``, ``lg.disabled = True``: ``core/loggerconfig.py``) is
    process-wide too: loggers travel by name."""
    loop = loop_node(source, line)
    if loop is None:
        return []
    imports = _imports(source) if resolve is not None else {}
    out: list[tuple[int, str]] = []
    contexts: list[frozenset[str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Call):
            name = dotted_name(node.func)
            if name in PROCESS_STATE_SETTERS and not _undone(name, node, contexts):
                out.append((node.lineno, name))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = (
                node.targets
                if isinstance(node, (ast.Assign, ast.Delete))
                else [node.target]
            )
            for t in targets:
                if isinstance(t, ast.Subscript) and dotted_name(t.value) in (
                    "os.environ",
                    "plt.rcParams",
                    "matplotlib.rcParams",
                    "mpl.rcParams",
                ):
                    what = f"{dotted_name(t.value)}[...]"
                    if not any(RESTORED_BY.get(what, set()) & c for c in contexts):
                        out.append((node.lineno, what))
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                visit(item)
            contexts.append(_restoring(node, imports, resolve))
            for st in node.body:
                visit(st)
            contexts.pop()
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    for st in loop.body:
        visit(st)
    from gpucell.core.loggerconfig import logger_configuration

    return sorted(set(out) | set(logger_configuration(loop, resolve)))


def _a_set(e: ast.expr) -> bool:
    """``e`` makes a set where it stands: a display, a comprehension,
    ``set(...)``/``frozenset(...)``, or a set method that returns one."""
    if isinstance(e, (ast.Set, ast.SetComp)):
        return True
    if isinstance(e, ast.Call):
        f = e.func
        if isinstance(f, ast.Name) and f.id in ("set", "frozenset"):
            return True
        if isinstance(f, ast.Attribute) and f.attr in (
            "union",
            "intersection",
            "difference",
            "symmetric_difference",
        ):
            return _a_set(f.value)
    return False


def set_orders(source: str, line: int) -> list[int]:
    """Lines in the body of the ``for`` loop at ``line`` that give a set's
    iteration order to something ordered (``list(set(words))``, ``for w in
    set(...)``, ``"".join({...})``, a comprehension over one): for strings the
    order follows the process's hash seed, and each engine has its own."""
    loop = loop_node(source, line)
    if loop is None:
        return []
    out: set[int] = set()
    for node in ast.walk(ast.Module(body=loop.body, type_ignores=[])):
        if isinstance(node, ast.Call) and node.args and _a_set(node.args[0]):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
            if name in ("list", "tuple", "enumerate", "iter", "join", "zip"):
                out.add(node.lineno)
        elif isinstance(node, (ast.For, ast.comprehension)) and _a_set(node.iter):
            out.add(node.iter.lineno)
    return sorted(out)


def uses_autograd(source: str, line: int) -> bool:
    """Does the body of the ``for`` loop at ``line`` run autograd itself
    (``loss.backward()``, ``torch.autograd.grad(...)``)?  Gradients then reach
    every leaf tensor the graph touches, inputs that no call names among them
    (``out = (w * x).sum(); out.backward()`` fills ``w.grad``): the engines
    must check every input, not only the ones calls name."""
    loop = loop_node(source, line)
    if loop is None:
        return False
    for node in ast.walk(ast.Module(body=loop.body, type_ignores=[])):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = dotted_name(node.func) or ""
            if node.func.attr == "backward" or name.endswith("autograd.grad"):
                return True
    return False


def helper_file_writes(source: str) -> list[tuple[int, str]]:
    """``(line, path text)`` of each file a function's source opens for
    writing at a path built from none of its parameters or locals (``def
    log(m): open("run.log", "a").write(m)``): every call writes the same
    file, so calls from iterations on several engines interleave."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return []
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
    for extra in (fn.args.vararg, fn.args.kwarg):
        if extra is not None:
            params.add(extra.arg)
    bound = params | _touched(fn.body)
    return _writes([n for s in fn.body for n in ast.walk(s)], bound)


def _through_data(e: ast.expr) -> bool:
    """``e`` reaches an object through a tensor's ``.data`` (``p.data``,
    ``p.data[0]``, ``m.weight.data.view(-1)``)."""
    while isinstance(e, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(e, ast.Attribute) and e.attr == "data":
            return True
        e = e.func if isinstance(e, ast.Call) else e.value
    return False


def data_writes(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of each in-place change a function's source makes
    through a tensor's ``.data`` (``p.data.add_(g)``, ``p.data -= lr * g``,
    ``w.data[0] = 1``): it bumps no version counter, so the engines' check
    of what a chunk changed (an input, an item written back) cannot see it,
    and the change would be lost.  (``p.data = t`` puts new memory there:
    seen.)"""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return []
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        hit: ast.expr | None = None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr.endswith("_")
            and not node.func.attr.startswith("_")
            and _through_data(node.func.value)
        ):
            hit = node.func
        elif isinstance(node, ast.AugAssign) and _through_data(node.target):
            hit = node.target
        elif isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
            hit = next(
                (
                    t
                    for t in targets
                    if isinstance(t, ast.Subscript) and _through_data(t.value)
                ),
                None,
            )
        if hit is not None:
            out.append((hit.lineno, ast.unparse(hit)))
    return sorted(out)


def _every_iteration(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements every iteration runs: the body's own, and those inside
    its ``with`` blocks and ``try`` bodies (not under ``if``, loops,
    ``except`` or ``match``)."""
    out: list[ast.stmt] = []
    for stmt in body:
        out.append(stmt)
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            out.extend(_every_iteration(stmt.body))
        elif isinstance(stmt, ast.Try):
            out.extend(_every_iteration(stmt.body))
            out.extend(_every_iteration(stmt.finalbody))
    return out


def _own_nodes(stmt: ast.stmt) -> list[ast.AST]:
    """The nodes of ``stmt`` itself, not of the statements nested in it (those
    are listed on their own, or not run in every iteration)."""
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [n for item in stmt.items for n in ast.walk(item)]
    if isinstance(stmt, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.Match)):
        return []
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return []
    return list(ast.walk(stmt))


def dotted_name(node: ast.expr) -> str | None:
    """``np.random.rand`` for that attribute chain on a name, else ``None``."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))
