"""A logger configured in a loop's body: process-wide state that travels by
name (pure).

A ``logging.Logger`` pickles as ``getLogger(name)``: an engine's copy of the
notebook's logger is the engine's own logger of that name.  ``lg.setLevel(...)``,
``lg.addHandler(h)``, ``lg.disabled = True`` in an iteration would change the
engine's logger (kept there for later cells) and never the kernel's, which
serially the later iterations and the notebook see.  So the loop is refused
before it runs, as for any other process-wide setter
(``core/lastitem.process_state_calls``), with its own rewrite: configure the
loggers before the loop.

What configures one: the methods of ``logging.Filterer`` and ``Logger``
(:data:`LOGGER_METHODS`), a store into one of its attributes
(:data:`LOGGER_ATTRIBUTES`), and a change in place of its ``handlers`` or
``filters`` list.  Which receivers are loggers: a ``getLogger(...)`` call,
``logging.root``, a name the body binds to one, and, where the kernel's names
are at hand (``resolve``), a name that is one (a ``logging.Filterer`` or a
``LoggerAdapter``: a handler hangs off loggers too) or the loop's variable
over data holding loggers.  Without the names (the analysis), only the
receivers the source shows to be loggers; with them, a configuring method on
a receiver that cannot be resolved counts too (its names are logging's own).
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Callable, Iterator
from typing import Any, Literal

__all__ = [
    "LOGGER_ATTRIBUTES",
    "LOGGER_METHODS",
    "logger_configuration",
    "logger_message",
]

#: the methods that configure a logger (or a handler)
LOGGER_METHODS = frozenset(
    {"setLevel", "addHandler", "removeHandler", "addFilter", "removeFilter"}
)
#: a logger's attributes whose store configures it
LOGGER_ATTRIBUTES = frozenset(
    {"level", "disabled", "propagate", "handlers", "filters", "parent"}
)
#: the list methods that change a logger's ``handlers`` or ``filters`` in place
_LIST_CHANGES = frozenset({"append", "extend", "insert", "remove", "pop", "clear"})
#: calls that return a logger
_GETTERS = frozenset({"getLogger", "get_logger", "getChild"})
#: what iterating a call of these gives: the elements of its arguments
_PASS_THROUGH = frozenset(
    {"enumerate", "list", "tuple", "sorted", "reversed", "zip", "set", "iter"}
)
#: the setters of ``logging`` itself that configure every logger at once
_MODULE_SETTERS = frozenset({"logging.basicConfig", "logging.disable"})

Resolve = Callable[[str], Any]
_Kind = Literal["logger", "other", "unknown"]


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _holds_loggers(obj: Any, depth: int = 0) -> bool | None:
    """Whether ``obj`` is, or holds among its first elements (two levels
    down: ``(name, logger)`` pairs), a logger; ``None``: not a container."""
    if isinstance(obj, (logging.Filterer, logging.LoggerAdapter)):
        return True
    if depth >= 2 or isinstance(obj, (str, bytes)):
        return None
    if isinstance(obj, dict):
        parts: list[Any] = list(obj.values())[:1000]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        parts = list(obj)[:1000]
    else:
        return None
    return any(_holds_loggers(x, depth + 1) for x in parts)


class _Receivers:
    """What a receiver in the loop's body is: a logger, something else, or
    unknown (nothing resolved it)."""

    def __init__(self, loop: ast.For | ast.AsyncFor, resolve: Resolve | None) -> None:
        self.resolve = resolve
        self.bound: dict[str, list[ast.expr]] = {}
        for node in ast.walk(loop):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.bound.setdefault(t.id, []).append(node.value)
        self.targets = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
        self.loop_iter = loop.iter
        self._seen: set[str] = set()

    def kind(self, node: ast.expr) -> _Kind:
        if isinstance(node, ast.Call):
            f = node.func
            last = f.attr if isinstance(f, ast.Attribute) else _dotted(f) or ""
            if last in _GETTERS:
                return "logger"
            made = _dotted(f)
            if made and self.resolve is not None:
                # a class called: an object the iteration makes (a handler
                # it sets up before adding it, which is what is refused)
                return "other" if isinstance(self.resolve(made), type) else "unknown"
            return "unknown"
        if isinstance(node, ast.Subscript):
            return self._data(node.value)
        name = _dotted(node)
        if name is None:
            return "unknown"
        if name == "logging.root":
            return "logger"
        root = name.split(".", 1)[0]
        if root in self.targets and root == name:
            return self._data(self.loop_iter)
        if root in self.bound and root == name:
            if root in self._seen:
                return "unknown"
            self._seen.add(root)
            kinds = {self.kind(v) for v in self.bound[root]}
            self._seen.discard(root)
            return "logger" if "logger" in kinds else kinds.pop()
        if root in self.targets or root in self.bound or self.resolve is None:
            return "unknown"
        obj = self.resolve(name)
        if obj is None:
            return "unknown"
        return "logger" if _holds_loggers(obj) is True else "other"

    def _data(self, node: ast.expr) -> _Kind:
        """What the elements of ``node`` (an iterable, a subscripted value)
        are."""
        kinds = set(self._sources(node))
        if "logger" in kinds:
            return "logger"
        return "other" if kinds == {"other"} else "unknown"

    def _sources(self, node: ast.expr) -> Iterator[_Kind]:
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            yield self.kind(node.elt)
            return
        if isinstance(node, ast.DictComp):
            yield self.kind(node.value)
            return
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            for e in node.elts:
                yield self.kind(e)
            return
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("values", "items"):
                yield from self._sources(f.value)
                return
            if isinstance(f, ast.Name) and f.id in _PASS_THROUGH:
                for a in node.args:
                    yield from self._sources(a)
                return
            yield "unknown"
            return
        name = _dotted(node)
        if name is None or self.resolve is None:
            yield "unknown"
            return
        if name.split(".", 1)[0] in self.bound:
            yield self.kind(node)
            return
        obj = self.resolve(name)
        found = None if obj is None else _holds_loggers(obj)
        yield "unknown" if found is None else ("logger" if found else "other")


def logger_configuration(
    loop: ast.For | ast.AsyncFor, resolve: Resolve | None = None
) -> list[tuple[int, str]]:
    """``(line, what)`` for each configuration of a logger in the loop's
    body: ``lg.setLevel``, ``lg.disabled = ...``, ``lg.handlers.clear``."""
    receivers = _Receivers(loop, resolve)
    # (an unresolved receiver of a configuring method counts where the
    # kernel's names were looked in: the analysis alone does not decide)
    methods_by_name = resolve is not None
    out: list[tuple[int, str]] = []
    for stmt in loop.body:
        for node in ast.walk(stmt):
            out += _configures(node, receivers, methods_by_name)
    return sorted(set(out))


def _configures(
    node: ast.AST, receivers: _Receivers, methods_by_name: bool
) -> list[tuple[int, str]]:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        f = node.func
        if f.attr in LOGGER_METHODS:
            kind = receivers.kind(f.value)
            if kind == "logger" or (kind == "unknown" and methods_by_name):
                return [(node.lineno, f"{ast.unparse(f.value)}.{f.attr}")]
        elif f.attr in _LIST_CHANGES and _logger_list(f.value, receivers):
            return [(node.lineno, f"{ast.unparse(f.value)}.{f.attr}")]
        return []
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        targets = (
            node.targets
            if isinstance(node, (ast.Assign, ast.Delete))
            else [node.target]
        )
        out = []
        for t in targets:
            if isinstance(t, ast.Subscript) and _logger_list(t.value, receivers):
                out.append((node.lineno, f"{ast.unparse(t.value)}[...] = ..."))
            elif (
                isinstance(t, ast.Attribute)
                and t.attr in LOGGER_ATTRIBUTES
                and receivers.kind(t.value) == "logger"
            ):
                out.append((node.lineno, f"{ast.unparse(t)} = ..."))
        return out
    return []


def _logger_list(node: ast.expr, receivers: _Receivers) -> bool:
    """``lg.handlers`` or ``lg.filters`` of a logger."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr in ("handlers", "filters")
        and receivers.kind(node.value) == "logger"
    )


def logger_message(line: int, call: str) -> str | None:
    """The refusal of a logger configured in the body (``call`` as
    :func:`logger_configuration` or ``logging.basicConfig``/``disable``
    names it), or ``None`` for another process-wide setter."""
    parts = call.rsplit(".", 2)
    if not (
        call in _MODULE_SETTERS
        or call.endswith(" = ...")
        or parts[-1] in LOGGER_METHODS
        or (parts[-1] in _LIST_CHANGES and parts[-2:-1] in (["handlers"], ["filters"]))
    ):
        return None
    return (
        f"line {line} configures logging (`{call}`), which is process-wide: "
        "loggers travel to the engines by name, so each engine would change its "
        "own logger of that name (and keep the change for later cells) while "
        "the notebook's stayed as it was; serially the iterations after it and "
        "the notebook see the change. Configure the loggers before the loop (a "
        "loop of its own, outside %%gpu_parallel), or run the cell without "
        "%%gpu_parallel."
    )
