"""Does a later cell touch a pending background run?  (pure: a cell in, a reason out)

A ``%%gpu_parallel --background`` cell returns while its loop still runs; its
results are merged, and the code after its loop run, only when a later cell
needs them.  Serially the whole cell would have finished before the later cell
started, so a later cell may run at once only where the order cannot show: it
neither reads nor binds nor deletes a name the run will write, a name whose
object the run still reads (its inputs, the loop's iterable), a name the code
after the loop (the epilogue, run at the merge) uses, nor a name that is
another name for one of those objects.  Whatever makes that unknowable from the
cell's text makes it wait: a magic or shell escape (after IPython's transforms,
``get_ipython()``), ``exec``/``eval``/``globals()``/``locals()``/``vars()``/
``__import__``, frames' globals, a star import, gpucell's own API (but
``gpucell.runs`` and ``gpucell.last_run``), and notebook code the kernel cannot
read (the caller passes what each notebook function's code uses).

Names are collected with Python's scopes: a comprehension's variables and a
function's parameters and locals are not the notebook's names; a function
body's free names are (a ``def`` does not run its body, but a later call
would, and the call is not always visible).  Everything here is text and
names: the kernel computes the run's :class:`Footprint` from its plan and the
objects, and which notebook functions a cell names.
"""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import CodeType

__all__ = [
    "NAMESPACE_NAMES",
    "CellUse",
    "Footprint",
    "cell_use",
    "cell_use_of",
    "code_uses",
    "hot_words",
    "identifiers",
    "might_wait",
    "statements_with",
    "why_wait",
    "why_wait_source",
]

#: names whose use reaches the whole namespace, or runs code no text shows
NAMESPACE_NAMES = frozenset(
    {
        "exec",
        "eval",
        "globals",
        "locals",
        "__import__",
        "breakpoint",
        "get_ipython",
        "__builtins__",
        "builtins",
        "__main__",
    }
)
#: ``vars()`` and ``dir()`` without an argument are the namespace too
_NAMESPACE_NO_ARGS = frozenset({"vars", "dir"})
#: attributes that lead to a namespace or to every object (frames, referrers)
_NAMESPACE_ATTRS = frozenset(
    {
        "f_globals",
        "f_locals",
        "f_back",
        "__globals__",
        "_getframe",
        "currentframe",
        "user_ns",
        "user_global_ns",
        "get_referrers",
        "get_referents",
        "get_objects",
        "get_ipython",
    }
)
#: gpucell's API a cell may use while a run is pending (it reads, it waits itself)
_GPUCELL_READS = frozenset({"runs", "last_run"})
#: gpucell's own line magic that waits by itself (for one run, or all)
_SELF_WAITING_MAGICS = frozenset({"gpu_wait"})
#: words that make the full analysis of a cell's text necessary
_TRIGGERS = (
    NAMESPACE_NAMES
    | _NAMESPACE_NO_ARGS
    | _NAMESPACE_ATTRS
    | frozenset({"gpucell", "modules"})
)


@dataclass(frozen=True)
class CellUse:
    """What a cell's code may do to the notebook's names.

    ``names``: every notebook name it may read, bind or delete; ``bound``: the
    ones it binds or deletes; ``unknowable``: why its effects cannot be read
    from its text (``None`` when they can)."""

    names: frozenset[str] = frozenset()
    bound: frozenset[str] = frozenset()
    unknowable: str | None = None


@dataclass(frozen=True)
class Footprint:
    """What a pending run will still do to the notebook, as names.

    ``writes``: names the merge binds or changes (every class of the plan's
    names, the loop's target, a comprehension's result); ``reads``: names of
    objects the run still reads (inputs that can change, the loop's
    iterable); ``epilogue``: names the code after the loop uses (it runs at
    the merge); ``bound_only``: names only binding or deleting touches (the
    builtins the epilogue calls); ``aliases``: other names of the run's
    objects, each with what it is (``"is the same object as `out`"``);
    ``always``: why every later cell waits (the epilogue runs a magic, or the
    run's names could not be read), else ``None``."""

    writes: frozenset[str] = frozenset()
    reads: frozenset[str] = frozenset()
    epilogue: frozenset[str] = frozenset()
    bound_only: frozenset[str] = frozenset()
    aliases: tuple[tuple[str, str], ...] = ()
    always: str | None = None
    touched: frozenset[str] = field(init=False, repr=False, compare=False)
    triggers: frozenset[str] = field(init=False, repr=False, compare=False)
    _alias_of: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        alias_of = dict(self.aliases)
        object.__setattr__(self, "_alias_of", alias_of)
        touched = self.writes | self.reads | self.epilogue | frozenset(alias_of)
        object.__setattr__(self, "touched", touched)
        # a word of the cell's text among these calls for the full analysis
        object.__setattr__(self, "triggers", touched | self.bound_only | _TRIGGERS)


def why_wait(
    use: CellUse,
    run: Footprint,
    notebook_code: Mapping[str, frozenset[str] | None] | None = None,
) -> str | None:
    """Why a cell that does ``use`` must wait for ``run`` (a phrase for the
    line the kernel prints), or ``None`` when it can run at once.

    ``notebook_code`` maps each name the cell uses whose value is notebook code
    (a function or class defined in the notebook, an instance of such a class)
    to the names that code may use (:func:`code_uses`, followed through the
    notebook functions it names), or ``None`` when that cannot be read."""
    if run.always is not None:
        return f"runs after it: {run.always}"
    if use.unknowable is not None:
        return use.unknowable
    names = use.names
    if not names:
        return None
    hit = names & run.writes
    if hit:
        return f"uses `{min(hit)}`, which the run writes"
    hit = names & run.reads
    if hit:
        return f"uses `{min(hit)}`, which the run reads"
    hit = names & run.epilogue
    if hit:
        return f"uses `{min(hit)}`, which the cell's code after its loop uses"
    hit = use.bound & run.bound_only
    if hit:
        return f"binds `{min(hit)}`, which the cell's code after its loop calls"
    hit = names & run._alias_of.keys()
    if hit:
        name = min(hit)
        return f"uses `{name}`, which {run._alias_of[name]}"
    for name in sorted(names & (notebook_code or {}).keys()):
        inner = (notebook_code or {})[name]
        if inner is None:
            return f"uses `{name}`, notebook code gpucell cannot read"
        hit = inner & (run.touched | NAMESPACE_NAMES)
        if hit:
            return f"uses `{name}`, whose code uses `{min(hit)}`"
    return None


def why_wait_source(
    source: str,
    run: Footprint,
    notebook_code: Mapping[str, frozenset[str] | None] | None = None,
    tree: ast.Module | None = None,
) -> str | None:
    """:func:`why_wait` for a cell's (IPython-transformed) text.  Most cells
    that wait for nothing cost a scan of their text for words and a few set
    operations (:func:`hot_words`); otherwise only the top-level statements
    holding a word that could matter are analysed, from ``tree`` (the cell
    as IPython parsed it) or from the text parsed here."""
    if run.always is not None:
        return f"runs after it: {run.always}"
    hot = hot_words(source, run, notebook_code)
    star = _star_import(source)
    if not hot and not star:
        return None
    if tree is None:
        try:
            tree = _parse(source)
        except (SyntaxError, ValueError):
            return None  # (Python refuses it before it runs)
    body = tree.body if star else statements_with(tree, source, hot)
    return why_wait(cell_use_of(tree, body), run, notebook_code)


def might_wait(
    source: str,
    run: Footprint,
    notebook_code: Mapping[str, frozenset[str] | None] | None = None,
) -> bool:
    """The quick check of :func:`why_wait_source`: ``False`` when the cell's
    text shows it cannot touch ``run`` (no analysis needed)."""
    return (
        run.always is not None
        or _star_import(source)
        or bool(hot_words(source, run, notebook_code))
    )


def hot_words(
    source: str,
    run: Footprint,
    notebook_code: Mapping[str, frozenset[str] | None] | None = None,
) -> frozenset[str]:
    """The words of a cell's text that could make it wait for ``run``: the
    run's names, words that make a cell's effect unknowable, notebook code
    that uses the run's names (a builtin the epilogue calls only where the
    text does more than call it)."""
    words = identifiers(source)
    hot = words & run.triggers
    called = {w for w in hot & run.bound_only if _only_called(source, w)}
    hot -= called  # print(...) and len(...) bind nothing
    inner = notebook_code or {}
    for name in words & inner.keys():
        uses = inner[name]
        if uses is None or uses & (run.touched | NAMESPACE_NAMES):
            hot |= {name}
    return hot


def statements_with(
    tree: ast.Module, source: str, words: Iterable[str]
) -> list[ast.stmt]:
    """The top-level statements of ``tree`` (parsed from ``source``) whose
    lines hold one of ``words``: the only ones whose names can matter (a
    statement's names do not depend on the others'); every statement when
    the lines cannot be matched."""
    lines = _lines_with(source, words)
    found = []
    for stmt in tree.body:
        first = min(
            [stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))]
        )
        last = stmt.end_lineno if stmt.end_lineno is not None else stmt.lineno
        if any(first <= n <= last for n in lines):
            found.append(stmt)
    return found if found or not lines else list(tree.body)


def _lines_with(source: str, words: Iterable[str]) -> set[int]:
    alternatives = "|".join(re.escape(w) for w in sorted(words))
    if not alternatives:
        return set()
    breaks = [m.start() for m in re.finditer("\n", source)]
    return {
        bisect.bisect_left(breaks, m.start()) + 1
        for m in re.finditer(rf"\b(?:{alternatives})\b", source)
    }


_STAR_IMPORT = re.compile(r"\bimport\s*\*")


def _star_import(source: str) -> bool:
    """``from m import *`` in the text (binds names the text does not show)."""
    return "*" in source and _STAR_IMPORT.search(source) is not None


@lru_cache(maxsize=64)
def _parse(source: str) -> ast.Module:
    return ast.parse(source)


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFINES = re.compile(r"(?:\bdef|\bclass)\s*$")


def _only_called(source: str, word: str) -> bool:
    """Every occurrence of ``word`` in the text is a call (``print(...)``), not
    a definition: the cell cannot bind it (a miss sends the cell to the full
    analysis, never past it)."""
    for m in re.finditer(rf"\b{re.escape(word)}\b", source):
        if source[m.end() :].lstrip()[:1] != "(":
            return False
        if _DEFINES.search(source[max(0, m.start() - 16) : m.start()]):
            return False
    return True


@lru_cache(maxsize=256)
def identifiers(source: str) -> frozenset[str]:
    """Every identifier-like word of a cell's text (a superset of its names:
    attribute names, words in strings and comments too)."""
    return frozenset(_WORD.findall(source))


def code_uses(code: CodeType) -> frozenset[str]:
    """Every global (and attribute) name a function's code and the code nested
    in it may use: ``co_names``, which holds loads, stores and deletes of
    globals (``global x; x = 1`` too) beside attribute names."""
    out: set[str] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        out.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, CodeType))
    return frozenset(out)


@lru_cache(maxsize=256)
def cell_use(source: str) -> CellUse:
    """:func:`cell_use_of` the cell's (IPython-transformed) text; a cell that
    does not parse does nothing (Python refuses it before it runs)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return CellUse()
    return cell_use_of(tree)


def cell_use_of(
    tree: ast.Module, statements: Iterable[ast.stmt] | None = None
) -> CellUse:
    """What the cell whose (IPython-transformed) code is ``tree`` may do to
    the notebook's names (``statements``: only those of its top-level
    statements)."""
    v = _Uses()
    for stmt in tree.body if statements is None else statements:
        v.visit(stmt)
    return CellUse(frozenset(v.names), frozenset(v.bound), v.unknowable)


# -- the scope-aware walk ---------------------------------------------------------

_FUNC = "function"
_COMP = "comprehension"
_CLASS = "class"

_Scope = tuple[str, frozenset[str]]


def _magic_name(call: ast.Call) -> str | None:
    """``%name`` / ``%%name`` / a shell command, from IPython's transformed
    ``get_ipython().run_line_magic('name', ...)`` and friends."""
    f = call.func
    if not (
        isinstance(f, ast.Attribute)
        and isinstance(f.value, ast.Call)
        and isinstance(f.value.func, ast.Name)
        and f.value.func.id == "get_ipython"
    ):
        return None
    first = call.args[0] if call.args else None
    name = first.value if isinstance(first, ast.Constant) else None
    if f.attr == "run_line_magic" and isinstance(name, str):
        return f"%{name}"
    if f.attr == "run_cell_magic" and isinstance(name, str):
        return f"%%{name}"
    if f.attr in ("system", "getoutput"):
        return "!"
    return "get_ipython()"


def _target_names(node: ast.AST) -> Iterator[str]:
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            yield n.id


def _bound_in(body: Iterable[ast.AST]) -> tuple[set[str], set[str]]:
    """(names bound in a function body, names it declares ``global``), not
    looking into nested functions' and classes' bodies (their names are
    bound here) nor comprehensions' variables (their walrus targets are)."""
    bound: set[str] = set()
    declared: set[str] = set()
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            stack.extend(node.decorator_list)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Global):
            declared.update(node.names)
            continue
        if isinstance(node, ast.Nonlocal):
            bound.update(node.names)  # an enclosing function's local
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                bound.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            stack.extend(n for n in ast.walk(node) if isinstance(n, ast.NamedExpr))
            continue
        elif isinstance(node, ast.DictComp):
            stack.extend(n for n in ast.walk(node) if isinstance(n, ast.NamedExpr))
            continue
        stack.extend(ast.iter_child_nodes(node))
    return bound - declared, declared


def _params(args: ast.arguments) -> set[str]:
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    every += [a for a in (args.vararg, args.kwarg) if a is not None]
    return {a.arg for a in every}


class _Uses(ast.NodeVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.bound: set[str] = set()
        self.unknowable: str | None = None
        self.scopes: list[_Scope] = []

    # -- helpers

    def _local(self, name: str) -> bool:
        """Bound in an enclosing function or comprehension (a class body's
        names are seen only from the class body itself)."""
        last = len(self.scopes) - 1
        for i, (kind, names) in enumerate(self.scopes):
            if name in names and (kind != _CLASS or i == last):
                return True
        return False

    def _use(self, name: str, binds: bool) -> None:
        if self._local(name):
            return
        self.names.add(name)
        if binds:
            self.bound.add(name)
        if name in NAMESPACE_NAMES:
            self._unknowable(f"uses `{name}`")
        elif name == "gpucell":
            self._unknowable("uses gpucell's API (other than `gpucell.runs`)")

    def _unknowable(self, why: str) -> None:
        if self.unknowable is None:
            self.unknowable = why

    def _bind_here(self, name: str) -> None:
        """A name bound by a statement in the current scope."""
        if self.scopes and self.scopes[-1][0] == _CLASS:
            return  # a class attribute, not the notebook's name
        self._use(name, True)

    # -- names

    def visit_Name(self, node: ast.Name) -> None:
        self._use(node.id, not isinstance(node.ctx, ast.Load))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in _NAMESPACE_ATTRS:
            self._unknowable(f"uses `.{node.attr}`")
        base = node.value
        if isinstance(base, ast.Name) and not self._local(base.id):
            if base.id == "gpucell" and node.attr in _GPUCELL_READS:
                self.names.add("gpucell")
                return
            if base.id == "sys" and node.attr == "modules":
                self._unknowable("uses `sys.modules`")
        self.visit(base)

    def visit_Call(self, node: ast.Call) -> None:
        magic = _magic_name(node)
        if magic is not None:
            first = node.args[0] if node.args else None
            if (
                magic.startswith("%")
                and not magic.startswith("%%")
                and isinstance(first, ast.Constant)
                and first.value in _SELF_WAITING_MAGICS
            ):
                for a in node.args[1:]:
                    self.visit(a)
                return  # %gpu_wait waits by itself
            if magic == "!":
                self._unknowable("runs a shell command (`!`)")
            elif magic.startswith("%"):
                self._unknowable(f"uses `{magic}`")
            else:
                self._unknowable("uses `get_ipython()`")
        f = node.func
        if (
            isinstance(f, ast.Name)
            and f.id in _NAMESPACE_NO_ARGS
            and not node.args
            and not node.keywords
            and not self._local(f.id)
        ):
            self._unknowable(f"uses `{f.id}()`")
        self.generic_visit(node)

    # -- statements that bind names without Name nodes

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            name = (a.asname or a.name).split(".")[0]
            if name == "gpucell" and a.name.split(".")[0] == "gpucell":
                self.names.add(name)  # the same module bound again
                continue
            self._bind_here(name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module == "gpucell" or module.startswith("gpucell."):
            if any(a.name not in _GPUCELL_READS for a in node.names):
                self._unknowable("uses gpucell's API (other than `gpucell.runs`)")
        for a in node.names:
            if a.name == "*":
                self._unknowable(f"imports every name of `{module}` (`import *`)")
                continue
            self._bind_here(a.asname or a.name)

    def visit_Global(self, node: ast.Global) -> None:
        for name in node.names:
            self.names.add(name)
            self.bound.add(name)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self._bind_here(node.name)
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self._bind_here(node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self._bind_here(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self._bind_here(node.rest)
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        # binds in the nearest scope that is not a comprehension
        for kind, names in reversed(self.scopes):
            if kind == _FUNC:
                if node.target.id in names:
                    return
                break
            if kind == _CLASS:
                break
        saved, self.scopes = self.scopes, [s for s in self.scopes if s[0] != _COMP]
        try:
            self._use(node.target.id, True)
        finally:
            self.scopes = saved

    # -- scopes

    def _function(
        self,
        node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
        body: list[ast.stmt] | list[ast.expr],
    ) -> None:
        args = node.args
        for d in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            self.visit(d)
        if not isinstance(node, ast.Lambda):
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if a.annotation is not None:
                    self.visit(a.annotation)
            if node.returns is not None:
                self.visit(node.returns)
            for d in node.decorator_list:
                self.visit(d)
            self._bind_here(node.name)
        bound, declared = _bound_in(body)
        local = frozenset((_params(args) | bound) - declared)
        self.scopes.append((_FUNC, local))
        try:
            for item in body:
                self.visit(item)
        finally:
            self.scopes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node, node.body)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function(node, node.body)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._function(node, [node.body])

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for d in [*node.decorator_list, *node.bases, *node.keywords]:
            self.visit(d)
        self._bind_here(node.name)
        bound, _declared = _bound_in(node.body)
        self.scopes.append((_CLASS, frozenset(bound)))
        try:
            for item in node.body:
                self.visit(item)
        finally:
            self.scopes.pop()

    def _comprehension(
        self, generators: list[ast.comprehension], parts: list[ast.expr]
    ) -> None:
        self.visit(generators[0].iter)  # evaluated in the enclosing scope
        local = frozenset(n for g in generators for n in _target_names(g.target))
        self.scopes.append((_COMP, local))
        try:
            for i, g in enumerate(generators):
                if i:
                    self.visit(g.iter)
                for cond in g.ifs:
                    self.visit(cond)
            for p in parts:
                self.visit(p)
        finally:
            self.scopes.pop()

    def visit_ListComp(self, node: ast.ListComp) -> None:
        self._comprehension(node.generators, [node.elt])

    def visit_SetComp(self, node: ast.SetComp) -> None:
        self._comprehension(node.generators, [node.elt])

    def visit_GeneratorExp(self, node: ast.GeneratorExp) -> None:
        self._comprehension(node.generators, [node.elt])

    def visit_DictComp(self, node: ast.DictComp) -> None:
        self._comprehension(node.generators, [node.key, node.value])
