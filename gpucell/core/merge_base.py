"""What every sink kind's merge shares: the chunk results it reads, the
validated change it adds (``Mutation``), the update it adds to
(``PreparedUpdate``: nothing happens until its ``commit``) and one merge's
state (``Merging``: the sorted results, the names' values before the merge,
which combined name owns which object).  Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpucell.errors import NotParallelizable

__all__ = ["ChunkResultLike", "Merging", "Mutation", "PreparedUpdate"]


class ChunkResultLike(Protocol):
    """What :func:`gpucell.core.merge.prepare` reads from a
    ``gpucell.engine.chunk.ChunkResult``."""

    start: int
    count: int
    gathers: dict[str, list[Any]]
    writes: dict[str, list[tuple[Any, Any]]]
    reductions: dict[str, tuple[str, Any]]
    keyed: dict[str, tuple[str, list[tuple[Any, Any]]]]
    unions: dict[str, list[tuple[str, Any]]]
    last_values: dict[str, tuple[int, str, Any]]
    keyed_gathers: dict[str, list[tuple[Any, list[Any]]]]


@dataclass
class Mutation:
    """One in-place change to apply in commit, already validated."""

    name: str
    what: str
    apply: Callable[[], Any]


@dataclass
class PreparedUpdate:
    """Everything the merge will do; nothing has happened yet.

    Attributes
    ----------
    mutations : list of Mutation
        In-place changes of existing objects, applied first, in plan order.
    assign : dict
        Names to bind (locals, reductions, the list-comprehension result).
    delete : tuple of str
        Locals whose last iteration deleted them.
    iterations : int
        Total iterations the chunks ran.
    """

    mutations: list[Mutation] = field(default_factory=list)
    assign: dict[str, Any] = field(default_factory=dict)
    delete: tuple[str, ...] = ()
    iterations: int = 0
    # locals whose last value could not travel back: left as they were, said so
    notes: list[str] = field(default_factory=list)
    # the loop's logging records in iteration order, for the kernel's handlers
    # once the namespace holds the results (emitting them is the kernel's I/O)
    records: list[Any] = field(default_factory=list)

    def commit(self, namespace: MutableMapping[str, Any]) -> None:
        """Apply the update. Touches only validated objects and the given names."""
        for m in self.mutations:
            m.apply()
        namespace.update(self.assign)
        for n in self.delete:
            namespace.pop(n, None)


@dataclass
class Merging:
    """One merge's inputs and what it has decided so far: each sink kind's
    merge (``SINK_MERGES``) reads the plan and the sorted chunk results and
    adds to ``up``; ``claim`` refuses two combined names that are one object."""

    plan: Any
    rs: list[ChunkResultLike]
    current: Mapping[str, Any]
    up: PreparedUpdate
    owners: dict[int, str] = field(default_factory=dict)
    # names another kind's merge has bound (a running best's group)
    picked: set[str] = field(default_factory=set)

    def claim(self, name: str, obj: Any) -> None:
        other = self.owners.setdefault(id(obj), name)
        if other != name:
            raise NotParallelizable(
                f"`{name}` and `{other}` are the same object, and the loop adds to "
                f"both; serially their contributions would interleave. Use one "
                f"name, or make them separate objects before the loop. Nothing "
                f"was merged."
            )

    def existing(self, name: str) -> Any:
        """``name``'s value before the merge: the loop adds to it, so it must
        exist before the loop, as it would have to serially."""
        try:
            return self.current[name]
        except KeyError:
            raise NameError(
                f"name {name!r} is not defined: the loop adds to it, so it must exist "
                f"before the loop (as it would have to serially). Nothing was merged."
            ) from None

    def concat(self, attr: str, name: str) -> list[Any]:
        """What the chunks recorded for ``name`` under ``attr``, in chunk order."""
        out: list[Any] = []
        for r in self.rs:
            out.extend(getattr(r, attr).get(name, ()))
        return out

    @property
    def spelled(self) -> Any:
        return getattr(self.plan, "spelled", None)

    def hidden_gathers(self) -> dict[str, str]:
        """Hidden gathers that stand for another sink (replayed calls, own
        frame rows): hidden name -> the notebook's name."""
        return {
            **getattr(self.spelled, "ufunc_at", {}),
            **getattr(self.spelled, "frame_rows", {}),
            **getattr(self.spelled, "concats", {}),
            **{h: r.target for h, r in getattr(self.spelled, "replayed", {}).items()},
        }
