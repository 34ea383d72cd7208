"""The scope the loop runs in: what the kernel binds before it (the
namespace, the prelude, the ``with`` blocks), and the checks that need it
(inputs nothing defines, nested loops over inputs taken to run)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from gpucell.core.analysis.classify import classify_body
from gpucell.core.analysis.diagnostics import Diagnostic, DiagnosticSink
from gpucell.core.analysis.refusals import UndefinedInput
from gpucell.core.analysis.scope import BUILTIN_NAMES, scope_bindings, target_names
from gpucell.core.analysis.sinks import Classification
from gpucell.core.analysis.split import CellSplit

__all__: list[str] = []


@dataclass(frozen=True)
class _Scope:
    """What the kernel binds before the loop: the names of the user's namespace,
    the prelude's and the ``with`` blocks' bindings and its imported modules."""

    known: frozenset[str]
    prelude_bound: set[str]
    with_targets: set[str]
    prelude_modules: set[str]

    def shadowed(self, name: str) -> bool:
        return name in self.known or name in self.prelude_bound

    def is_builtin(self, name: str) -> bool:
        return name in BUILTIN_NAMES and not self.shadowed(name)


def _context_inputs(
    contexts: list[ast.expr], cl: Classification, is_builtin: Callable[[str], bool]
) -> None:
    """The names the engines read to re-enter a context are inputs too."""
    for item in contexts:
        for node in ast.walk(item):
            if isinstance(node, ast.Name) and not is_builtin(node.id):
                cl.inputs.setdefault(node.id, node.lineno)


def _cell_scope(split: CellSplit, known: frozenset[str]) -> _Scope:
    """The scope the loop runs in, from the statements the kernel runs first."""
    # what runs in the kernel before the loop: the prelude, and inside each
    # `with` around the loop its `as` targets and the statements before the loop
    before: list[ast.AST] = [
        *split.prelude,
        *(s for layer in split.layers for s in layer.before),
    ]
    with_targets = {
        n.id
        for layer in split.layers
        for item in layer.node.items
        if item.optional_vars is not None
        for n in target_names(item.optional_vars)
    }
    prelude_bound = scope_bindings(before) | with_targets
    prelude_modules = {
        a.asname or a.name.split(".")[0]
        for s in before
        if isinstance(s, (ast.Import, ast.ImportFrom))
        for a in s.names
    }
    return _Scope(known, prelude_bound, with_targets, prelude_modules)


def _nonempty_checks(
    cl: Classification,
    diag: DiagnosticSink,
    body: list[ast.stmt],
    target: ast.expr,
    iterable: ast.expr,
    scope: _Scope,
) -> tuple[tuple[tuple[int, str], ...], tuple[Diagnostic, ...]]:
    """The nested loops over inputs the kernel checks nonempty, and the
    refusals the loop would have without that assumption."""
    if not cl.nonempty or diag.sorted():
        return (), ()
    # accepted by taking nested loops over inputs to run: keep the checks
    # only if the loop needs them (what it would be refused for otherwise)
    bare = DiagnosticSink()
    classify_body(
        body,
        loop_target=target,
        loop_iter=iterable,
        diag=bare,
        is_builtin=scope.is_builtin,
        module_names=scope.prelude_modules,
        assume_nonempty=False,
    )
    unless_nonempty = tuple(bare.sorted())
    if not unless_nonempty:
        return (), ()
    return tuple(sorted(cl.nonempty)), unless_nonempty


def _undefined_inputs(cl: Classification, scope: _Scope) -> DiagnosticSink:
    """Warnings for inputs neither the namespace nor the prelude defines."""
    warnings = DiagnosticSink()
    if not scope.known:
        return warnings
    for n, line in cl.inputs.items():
        if n not in scope.known and n not in scope.prelude_bound:
            warnings.report(UndefinedInput(line, 0, n))
    return warnings
