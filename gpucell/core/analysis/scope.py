"""Small, pure helpers about Python scoping used by the classifier.

Kept apart from the classifier so each function can be read (and tested) alone:
which names an assignment target binds, the root name of ``a.b[c].d``, which names
a nested function or lambda reads from the cell, and which method names mutate.
"""

from __future__ import annotations

import ast
import builtins
import sys
from collections.abc import Collection, Iterable, Iterator

from gpucell.protocol.program import DEVICE, INDEXERS, ITEM_ERROR

__all__ = [
    "BUILTIN_NAMES",
    "block_statements",
    "ENGINE_PROVIDED",
    "MUTATOR_METHODS",
    "WELL_KNOWN_MODULES",
    "SAFE_BUILTINS",
    "indexer_write",
    "global_draw",
    "is_global_random",
    "is_mutating_method",
    "is_inplace_method",
    "target_names",
    "root_name",
    "scope_bindings",
    "bindings_of",
    "scope_nodes",
    "nested_free_loads",
    "iter_scope",
    "NESTED_SCOPES",
    "COMPREHENSIONS",
    "target_parts",
    "nested_statements",
]

BUILTIN_NAMES = frozenset(dir(builtins))

#: names every engine provides itself; never shipped
ENGINE_PROVIDED = frozenset({"get_ipython", DEVICE, ITEM_ERROR})

#: methods that change their receiver (lists, dicts, sets, numpy, torch optimisers)
MUTATOR_METHODS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "remove",
        "pop",
        "popitem",
        "clear",
        "sort",
        "reverse",
        "update",
        "setdefault",
        "add",
        "discard",
        "difference_update",
        "intersection_update",
        "symmetric_difference_update",
        "appendleft",
        "extendleft",
        "popleft",
        "rotate",
        "step",
        "zero_grad",
        "backward",
        "fill",
        "resize",
        "put",
        "itemset",
        "setflags",
        "load_state_dict",
        "register_buffer",
        "register_parameter",
        "write",
        "writelines",
        "seek",
        "truncate",
        "__setitem__",
        "__delitem__",
        "__setattr__",
        "__delattr__",
        "__iadd__",
        "__isub__",
        "__imul__",
        "__ior__",
        "__iand__",
    }
)

#: names commonly bound to modules; their in-place functions mutate the argument
WELL_KNOWN_MODULES = frozenset(
    {"torch", "np", "numpy", "F", "nn", "init", "math", "random", "os", "sys", "jnp"}
)

#: pandas' indexers: an attribute that reaches the object's own data, not
#: another object (`df.loc[i] = row` changes `df`)
ACCESSORS = frozenset({"loc", "iloc", "at", "iat"})
#: builtins that make a new container of all their argument's items (the
#: items themselves), there and then
COPYING_BUILTINS = frozenset({"list", "tuple", "sorted", "set", "frozenset", "dict"})

NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


#: builtins that never change their arguments: calling them needs no check
SAFE_BUILTINS = frozenset(
    {
        "abs", "all", "any", "ascii", "bin", "bool", "bytes", "callable", "chr",
        "complex", "dict", "divmod", "enumerate", "float", "format", "frozenset",
        "getattr", "hasattr", "hash", "hex", "id", "int", "isinstance",
        "issubclass", "iter", "len", "list", "max", "min", "oct", "ord", "pow",
        "print", "range", "repr", "reversed", "round", "set", "slice", "sorted",
        "str", "sum", "tuple", "type", "zip", "map", "filter",
    }
)  # fmt: skip

#: module functions that draw from (or reseed) a process-wide random generator
_GLOBAL_RANDOM_PREFIXES = ("random.", "np.random.", "numpy.random.")
_TORCH_RANDOM = frozenset(
    {
        "rand", "randn", "randint", "randperm", "rand_like", "randn_like",
        "randint_like", "normal", "bernoulli", "multinomial", "poisson",
        "manual_seed", "seed",
    }
)  # fmt: skip
#: constructors of generators of one's own: no shared state
_OWN_GENERATORS = frozenset(
    {
        "default_rng",
        "Generator",
        "RandomState",
        "Random",
        "SystemRandom",
        "SeedSequence",
    }
)


def is_global_random(call: str) -> bool:
    """``random.random``, ``np.random.rand``, ``torch.randn``...: a call (by its
    dotted text) that draws from a process-wide generator, so engines draw
    different numbers than a serial run unless ``--seed`` seeds them."""
    last = call.rsplit(".", 1)[-1]
    if last in _OWN_GENERATORS:
        return False
    if call.startswith(_GLOBAL_RANDOM_PREFIXES):
        return True
    return call.startswith("torch.") and call.count(".") == 1 and last in _TORCH_RANDOM


def global_draw(call: ast.Call) -> str | None:
    """The dotted text of a call that draws from a process-wide generator
    (:func:`is_global_random`), or ``None``: a call on an object a call made
    (``np.random.default_rng(0).normal()``) or one given its own generator
    (``torch.randn(3, generator=g)``; ``generator=None`` is the global one)
    draws from that object, the same numbers on an engine as serially."""
    parts: list[str] = []
    f: ast.expr = call.func
    while isinstance(f, ast.Attribute):
        parts.append(f.attr)
        f = f.value
    if not isinstance(f, ast.Name):
        return None
    text = ".".join([f.id, *reversed(parts)])
    if not is_global_random(text):
        return None
    for kw in call.keywords:
        if kw.arg == "generator" and not (
            isinstance(kw.value, ast.Constant) and kw.value.value is None
        ):
            return None
    return text


def indexer_write(stmt: ast.Assign) -> tuple[ast.Name, str, ast.expr] | None:
    """``D.at[k] = v`` (also ``.loc``, ``.iat``, ``.iloc``): ``(D, "at", k)``."""
    t = stmt.targets[0]
    if (
        len(stmt.targets) == 1
        and isinstance(t, ast.Subscript)
        and isinstance(t.value, ast.Attribute)
        and t.value.attr in INDEXERS
        and isinstance(t.value.value, ast.Name)
    ):
        return t.value.value, t.value.attr, t.slice
    return None


def is_inplace_method(attr: str) -> bool:
    """torch's convention: ``add_``, ``zero_``, ``copy_`` change the receiver."""
    return attr.endswith("_") and not attr.startswith("__")


def is_mutating_method(attr: str) -> bool:
    """True for known mutators and torch-style in-place methods."""
    return attr in MUTATOR_METHODS or is_inplace_method(attr)


def target_names(target: ast.expr) -> list[ast.Name]:
    """The ``Name`` nodes an assignment target binds (through tuples and stars)."""
    if isinstance(target, ast.Name):
        return [target]
    if isinstance(target, (ast.Tuple, ast.List)):
        out: list[ast.Name] = []
        for elt in target.elts:
            out.extend(target_names(elt))
        return out
    if isinstance(target, ast.Starred):
        return target_names(target.value)
    return []


def target_parts(target: ast.expr) -> Iterator[ast.expr]:
    """Every non-tuple leaf of a target: names, subscripts, attributes."""
    if isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from target_parts(elt)
    elif isinstance(target, ast.Starred):
        yield from target_parts(target.value)
    else:
        yield target


def root_name(node: ast.expr) -> ast.Name | None:
    """The name an ``a.b[c].d`` chain starts from; ``None`` through calls.

    ``f(x).y`` has no root: the call's result is a new object as far as static
    analysis can tell.
    """
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node if isinstance(node, ast.Name) else None


def iter_scope(node: ast.AST) -> Iterator[ast.AST]:
    """Walk ``node``'s children without entering nested functions/classes/lambdas.

    Comprehensions are entered (their walrus targets bind in this scope) but their
    own targets are skipped. Pre-order, in source order; iterative, because this
    runs over every node of the cell several times.
    """
    stack: list[ast.AST] = list(reversed(_scope_children(node)))
    while stack:
        child = stack.pop()
        yield child
        stack.extend(reversed(_scope_children(child)))


def _scope_children(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.comprehension):
        # the comprehension's own targets do not bind in this scope
        return [node.iter, *node.ifs]
    if isinstance(node, NESTED_SCOPES):
        # decorators, defaults, bases are evaluated in this scope
        return _outer_parts(node)
    return list(ast.iter_child_nodes(node))


def scope_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and every node of the same scope under it (see :func:`iter_scope`)."""
    yield node
    yield from iter_scope(node)


def _outer_parts(node: ast.AST) -> list[ast.AST]:
    """Parts of a def/lambda/class evaluated in the enclosing scope."""
    parts: list[ast.AST] = []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = node.args
        parts.extend(d for d in a.defaults)
        parts.extend(d for d in a.kw_defaults if d is not None)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        parts.extend(node.decorator_list)
    if isinstance(node, ast.ClassDef):
        parts.extend(node.bases)
        parts.extend(k.value for k in node.keywords)
    return parts


def _arg_names(args: ast.arguments) -> set[str]:
    names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    if args.vararg:
        names.add(args.vararg.arg)
    if args.kwarg:
        names.add(args.kwarg.arg)
    return names


def scope_bindings(
    stmts: list[ast.AST], exclude: Collection[int] = frozenset()
) -> set[str]:
    """Names bound directly in a scope made of ``stmts`` (any binding form).

    ``exclude`` holds ``id()`` of ``Name`` nodes to ignore (sink patterns' own
    stores, which do not make a name local).
    """
    return bindings_of(
        (node for top in stmts for node in scope_nodes(top)), exclude=exclude
    )


def bindings_of(
    nodes: Iterable[ast.AST], exclude: Collection[int] = frozenset()
) -> set[str]:
    """Names bound by ``nodes`` (already walked with :func:`scope_nodes`)."""
    bound: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store) and id(node) not in exclude:
                bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    return bound


def _comprehension_targets(node: ast.AST) -> set[str]:
    names: set[str] = set()
    for gen in getattr(node, "generators", []):
        names.update(n.id for n in target_names(gen.target))
    return names


def nested_free_loads(node: ast.AST) -> list[ast.Name]:
    """``Name`` loads inside a def/lambda/class body that resolve in the cell.

    Conservative model used by the classifier: a nested function reads its free
    names when it is *defined* (serially it reads them when called, which is never
    earlier within an iteration).
    """
    if isinstance(node, ast.Lambda):
        body: list[ast.AST] = [node.body]
        local = _arg_names(node.args) | scope_bindings(body)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        body = list(node.body)
        local = _arg_names(node.args) | scope_bindings(body)
    elif isinstance(node, ast.ClassDef):
        body = list(node.body)
        local = set()  # class bindings are not visible to methods; keep it simple
    else:
        raise TypeError(node)
    out: list[ast.Name] = []
    _collect_free(body, local, out)
    return out


def _collect_free(body: list[ast.AST], local: set[str], out: list[ast.Name]) -> None:
    for top in body:
        stack: list[tuple[ast.AST, frozenset[str]]] = [(top, frozenset())]
        while stack:
            node, shadow = stack.pop()
            if isinstance(node, ast.Name):
                if (
                    isinstance(node.ctx, ast.Load)
                    and node.id not in local
                    and node.id not in shadow
                ):
                    out.append(node)
                continue
            if isinstance(node, NESTED_SCOPES):
                for part in _outer_parts(node):
                    stack.append((part, shadow))
                for name in nested_free_loads(node):
                    if name.id not in local and name.id not in shadow:
                        out.append(name)
                continue
            if isinstance(node, COMPREHENSIONS):
                inner = shadow | _comprehension_targets(node)
                for child in ast.iter_child_nodes(node):
                    stack.append((child, inner))
                continue
            for child in ast.iter_child_nodes(node):
                stack.append((child, shadow))


def nested_statements(node: ast.AST) -> Iterator[ast.AST]:
    """Every node inside a nested scope's body, including deeper nested scopes."""
    if isinstance(node, ast.Lambda):
        yield from ast.walk(node.body)
    else:
        for stmt in getattr(node, "body", []):
            yield from ast.walk(stmt)


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
