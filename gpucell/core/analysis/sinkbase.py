"""What every sink kind shares (sinks.py): a statement that may be one
(``Candidate``), what a kind's rewrite reads of the walk (``Rewriting``) and
gives (``Rewritten``), and the kind's interface (``SinkKind``)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

__all__ = ["Candidate", "Rewriting", "Rewritten", "SinkKind"]


@dataclass
class Candidate:
    """A statement that may be a sink pattern for ``name``."""

    cls: str
    name: str
    stmt: ast.stmt
    own: list[ast.Name]
    op: str | None = None
    augmented: bool = True


#: what a kind's rewrite gives for a statement: its replacement (one
#: statement or several), or None where the statement is not the kind's
Rewritten = ast.stmt | list[ast.stmt] | None


class Rewriting(Protocol):
    """What a kind's rewrite reads of the walk (sinkrewrite._SinkRewriter)."""

    names: Mapping[str, set[str]]  # kind -> the loop's names of that kind
    reduction_ops: Mapping[str, str]  # reduction name -> its operator

    def temporary(self) -> str: ...


class SinkKind:
    """One kind of sink: which statements may be one (``match``: the
    statement's candidates of this kind), how the plan describes a name of
    that kind (``describe``) and what the chunk program runs instead of the
    statement (``rewrite``). A statement is at most one kind's, but an
    assignment may be a reduction and write items besides."""

    kind: ClassVar[str]

    @staticmethod
    def match(stmt: ast.stmt, is_builtin: Callable[[str], bool]) -> list[Candidate]:
        raise NotImplementedError

    @staticmethod
    def rewrite(node: ast.stmt, rw: Rewriting) -> Rewritten:
        """The recorder calls for ``node``, a statement of a name of this kind."""
        return None
