"""Which functions of the user's own modules change their module's state
(pure: objects in, findings out).

A function imported from a module of the user's (``helpers.py`` beside the
notebook, not an installed library) travels to the engines by name: each
engine imports the module afresh and runs the function there.  When the
function changes its module's state (``LOG.append(x)``, ``Counter.n += 1``,
``global total; total += x``), serially the notebook's module sees every
change; in parallel the changes stay on the engines and the notebook's module
is left as it was, without a word.  The engines' input check cannot see it
(the function is the same name on both sides), so the kernel asks this module
before anything runs and refuses the loop by name.

Only the user's modules are read (a file outside the interpreter's library
folders): an installed library's caches are its own business, not the
notebook's state.
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import sys
import sysconfig
import textwrap
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ModuleWrite", "module_writes", "store_targets", "user_module"]

#: methods that change the object they are called on (lists, dicts, sets,
#: deques, files, arrays)
MUTATORS = frozenset(
    {
        "append",
        "appendleft",
        "add",
        "clear",
        "discard",
        "extend",
        "extendleft",
        "fill",
        "insert",
        "pop",
        "popitem",
        "popleft",
        "put",
        "remove",
        "resize",
        "reverse",
        "rotate",
        "setdefault",
        "sort",
        "update",
        "write",
        "writelines",
    }
)

#: at most this many functions are read from one loop's inputs
MAX_FUNCTIONS = 200


@dataclass(frozen=True)
class ModuleWrite:
    """``function`` (reached from the input ``via``), defined in the user's
    module ``module`` (file ``path``), changes ``what`` there at ``line``."""

    via: str
    function: str
    module: str
    path: str
    line: int
    what: str


#: folders that hold installed distributions, wherever they are on sys.path
_PACKAGE_FOLDERS = ("site-packages", "dist-packages")


def _library_roots() -> tuple[str, ...]:
    """The interpreter's own library folders, and every folder of installed
    packages the interpreter searches: the user site (``pip install --user``),
    the base interpreter's (a ``--system-site-packages`` venv), and any
    ``site-packages`` added by a ``.pth`` file or ``PYTHONPATH`` (a conda or
    shared environment borrowed): torch found there is a library, not the
    user's module."""
    return _roots_for(tuple(sys.path))


@functools.cache
def _roots_for(path: tuple[str, ...]) -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    try:
        import site

        roots |= set(site.getsitepackages())
        roots.add(site.getusersitepackages())
    except Exception:  # a frozen or embedded interpreter without them
        pass
    roots |= {p for p in path if os.path.basename(p.rstrip(os.sep)) in _PACKAGE_FOLDERS}
    return tuple(os.path.realpath(r) + os.sep for r in roots if r)


def store_targets(node: ast.AST) -> list[ast.expr]:
    """What an assignment, augmented or annotated assignment or ``del``
    stores into (none for other nodes)."""
    if isinstance(node, (ast.Assign, ast.Delete)):
        return list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def user_module(name: str | None) -> types.ModuleType | None:
    """The module ``name`` when it is one of the user's own files: imported,
    with a source file outside the interpreter's library folders (not the
    notebook itself, nor gpucell)."""
    if not name or name == "__main__" or name.split(".")[0] == "gpucell":
        return None
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    if mod is None or not isinstance(path, str) or not path.endswith(".py"):
        return None
    real = os.path.realpath(path)
    if any(real.startswith(root) for root in _library_roots()):
        return None
    return mod


def _code_of(value: Any) -> Iterator[types.FunctionType]:
    """The functions ``value`` is or holds as code (a partial's, a bound
    method's, a class's methods, an instance's class's methods)."""
    if isinstance(value, functools.partial):
        yield from _code_of(value.func)
    elif isinstance(value, (types.MethodType, staticmethod, classmethod)):
        yield from _code_of(value.__func__)
    elif isinstance(value, property):
        for part in (value.fget, value.fset, value.fdel):
            if part is not None:
                yield from _code_of(part)
    elif isinstance(value, types.FunctionType):
        yield value
    elif not isinstance(value, types.ModuleType):
        cls = value if isinstance(value, type) else type(value)
        for klass in getattr(cls, "__mro__", ()):
            if user_module(getattr(klass, "__module__", None)) is None:
                continue
            for member in vars(klass).values():
                if isinstance(
                    member, (types.FunctionType, staticmethod, classmethod, property)
                ):
                    yield from _code_of(member)


def _root(node: ast.expr) -> tuple[str | None, str]:
    """The name an attribute or subscript chain starts from, and the chain
    as written (``LOG``, ``Counter.n``, ``cache[k]``)."""
    text = ast.unparse(node)
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), text


def _locals(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Names bound in the function (parameters, assignments, imports, loop
    and ``with`` targets, nested definitions) and those declared global."""
    bound: set[str] = set()
    declared: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            declared.update(node.names)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    return bound - declared, declared


def _writes(tree: ast.AST, module: types.ModuleType) -> Iterator[tuple[int, str]]:
    """``(line, what)`` for each change the function's text makes to its
    module's state: a global it declares and assigns, or an object a module
    global holds (an item or attribute stored or deleted, a changing method
    called on it).  A call of a module's function (``np.append``) is not."""
    local, declared = _locals(tree)
    names = vars(module)

    def outer(name: str | None) -> bool:
        return name is not None and name not in local and name in names

    for node in ast.walk(tree):
        for t in store_targets(node):
            for part in t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                if isinstance(part, ast.Name) and part.id in declared:
                    yield part.lineno, part.id
                elif isinstance(part, (ast.Attribute, ast.Subscript)):
                    root, text = _root(part)
                    if outer(root):
                        yield part.lineno, text
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
        ):
            root, text = _root(node.func.value)
            direct = isinstance(node.func.value, ast.Name)
            if outer(root) and not (
                direct and isinstance(names.get(root or ""), types.ModuleType)
            ):
                yield node.lineno, text


def _tree(fn: types.FunctionType) -> ast.AST | None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)
    return tree


def module_writes(
    inputs: Mapping[str, Any], attrs: frozenset[str] = frozenset()
) -> list[ModuleWrite]:
    """Every change to a user module's state made by a function of that
    module reachable from ``inputs`` (the values the loop reads, and the
    notebook functions, modules' functions and classes they reach; of a user
    module the loop reads, the functions named in ``attrs``), each function
    read once.  In input order."""
    out: list[ModuleWrite] = []
    seen: set[int] = set()
    for via, value in inputs.items():
        todo = [*_code_of(value)]
        if isinstance(value, types.ModuleType) and user_module(value.__name__):
            todo += [f for a in attrs for f in _code_of(getattr(value, a, None))]
        while todo and len(seen) < MAX_FUNCTIONS:
            fn = todo.pop()
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            g = fn.__globals__
            mod = user_module(g.get("__name__"))
            if mod is None and g.get("__name__") != "__main__":
                continue
            for n in _names(fn.__code__):
                if n in g and not isinstance(g[n], types.ModuleType):
                    todo.extend(_code_of(g[n]))
            for cell in fn.__closure__ or ():
                try:
                    todo.extend(_code_of(cell.cell_contents))
                except ValueError:  # an empty cell
                    pass
            _reach_module_attrs(fn, g, todo)
            tree = None if mod is None else _tree(fn)
            if tree is None or mod is None:
                continue
            path = getattr(mod, "__file__", "") or ""
            for line, what in _writes(tree, mod):
                out.append(
                    ModuleWrite(via, fn.__qualname__, mod.__name__, path, line, what)
                )
    return out


def _names(code: types.CodeType) -> set[str]:
    """The names (globals and attributes) a code object and the code nested
    in it use."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return out


def _reach_module_attrs(
    fn: types.FunctionType, g: Mapping[str, Any], todo: list[types.FunctionType]
) -> None:
    """``helpers.record(x)`` inside a followed function: the user module's
    functions it names as attributes are followed too."""
    names = _names(fn.__code__)
    for n in names:
        mod = g.get(n)
        if isinstance(mod, types.ModuleType) and user_module(mod.__name__):
            for attr in names:
                todo.extend(_code_of(getattr(mod, attr, None)))
