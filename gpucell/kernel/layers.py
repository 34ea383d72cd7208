"""The ``with`` blocks around the loop, entered in the kernel.

Python's own semantics: a context that swallows an exception swallows it here
too, and each block's statements before and after the loop run inside it, as
serially.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Callable
from typing import Any

from gpucell.core.astcopy import copy_tree
from gpucell.kernel.plans import Prepared
from gpucell.kernel.stages import Shell

__all__ = ["inside_layers"]


def inside_layers(
    shell: Shell, prep: Prepared, k: int, inner: Callable[[], None]
) -> None:
    """Run ``inner`` inside the ``with`` blocks around the loop, from the ``k``-th."""
    layers = prep.plan.layers
    if k == len(layers):
        inner()
        return
    layer, ns = layers[k], shell.user_ns
    with contextlib.ExitStack() as stack:
        for i, item in enumerate(layer.node.items):
            _enter(stack, ns, prep, f"{k}.{i}", item)
        before = prep.code(
            f"before {k}", lambda: prep.plan.compile_statements(layer.before)
        )
        if before is not None:
            shell.ex(before)
        inside_layers(shell, prep, k + 1, inner)
        after = prep.code(
            f"after {k}", lambda: prep.plan.compile_statements(layer.after)
        )
        if after is not None:
            shell.ex(after)


def _enter(
    stack: contextlib.ExitStack[Any],
    ns: dict[str, Any],
    prep: Prepared,
    at: str,
    item: ast.withitem,
) -> None:
    """Enter one ``with`` item and bind its ``as`` target, as Python would."""
    filename = prep.plan.filename
    code = prep.code(
        f"with {at}",
        lambda: compile(ast.Expression(item.context_expr), filename, "eval"),
    )
    entered = stack.enter_context(eval(code, ns))
    if item.optional_vars is None:
        return
    bind = prep.code(f"as {at}", lambda: _binder(item, filename))
    ns["__gpucell_entered__"] = entered
    try:
        exec(bind, ns)
    finally:
        ns.pop("__gpucell_entered__", None)


def _binder(item: ast.withitem, filename: str) -> Any:
    """Code binding a ``with ... as target`` to what the context entered gave."""
    assert item.optional_vars is not None
    target = copy_tree(item.optional_vars)
    value = ast.copy_location(ast.Name("__gpucell_entered__", ast.Load()), target)
    stmt = ast.copy_location(ast.Assign(targets=[target], value=value), target)
    module = ast.fix_missing_locations(ast.Module(body=[stmt], type_ignores=[]))
    return compile(module, filename, "exec")
