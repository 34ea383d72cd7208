"""Copy a syntax tree by its grammar alone.

``copy.deepcopy`` also copies whatever other code has hung on a node, and
IPython's traceback display (``executing``, through ``stack_data``) sets a
``parent`` on every node of the source it shows, including the ``Load``,
``Store`` and operator nodes the parser shares between all trees.  After one
traceback, deep-copying any new tree followed those shared nodes into the old
tree and everything reachable from it: hundreds of milliseconds per analysis.
Copying ``_fields`` and ``_attributes`` only costs what the tree itself costs.
"""

from __future__ import annotations

import ast
from typing import TypeVar, cast

__all__ = ["copy_tree", "copy_trees"]

_Node = TypeVar("_Node", bound=ast.AST)


def copy_tree(node: _Node) -> _Node:
    """A copy of ``node`` and its children: the grammar's fields and the
    source positions, nothing else a node carries."""
    return cast(_Node, _copy(node))


def copy_trees(nodes: list[_Node]) -> list[_Node]:
    """``copy_tree`` of each of ``nodes`` (a block of statements)."""
    return [copy_tree(n) for n in nodes]


def _copy(value: object) -> object:
    if isinstance(value, ast.AST):
        cls = type(value)
        new = cls.__new__(cls)
        for name in value._fields:
            if hasattr(value, name):
                setattr(new, name, _copy(getattr(value, name)))
        for name in value._attributes:
            if hasattr(value, name):
                setattr(new, name, getattr(value, name))
        return new
    if isinstance(value, list):
        return [_copy(v) for v in value]
    # constants (str, bytes, numbers, tuples and frozensets of them, Ellipsis)
    # and identifiers are immutable: shared as the parser shares them
    return value
