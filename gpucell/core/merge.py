"""Merge ordered chunk results into the user's namespace, all or nothing.

Pure: ``prepare(plan, results, current)`` reads the chunk results and a read-only
view of the affected names' current values, validates everything that could fail
and computes new values, and touches nothing. ``PreparedUpdate.commit(namespace)``
then applies in-place mutations that cannot fail on validated data, binds names
and deletes names, in that order.

Semantics (see ARCHITECTURE §1):

- *gathers*: ``L.extend(items)`` in iteration order on the same list object; the
  list-comprehension form binds a new list.
- *indexed writes*: ``D[k] = v`` in iteration order (last write wins).
- *reductions*: partials are folded per chunk on the engine, and here combined in
  chunk order, then applied once: ``acc op= combined``. Only associativity is
  assumed (``@`` keeps order), except for a scalar's float contributions, which
  come back one by one (``fold.InOrder``) and are applied in iteration order.
  ``-=`` folds its contributions with ``+`` (``|`` for sets) and subtracts once:
  it assumes ``a - x - y == a - (x + y)``. Augmented
  reductions on an object with an in-place operator (numpy array, torch tensor,
  list, set) mutate that object in commit, as serial code would; others rebind.
  ``max``/``min`` keep the first of equal values, as serial code does.
- *keyed reductions*: per-key partials combined in chunk order, applied in the
  order keys were first seen.
- *set unions*: union of every ``add``/``update``; on a non-set (a dict, a
  Counter) the recorded ``update`` calls are replayed in iteration order.
- *locals*: the value from the last iteration that assigned (or deleted) it.

Each sink kind's merge lives beside this module, which holds the order
they run in (``SINK_MERGES``): ``merge_ordered`` (gathers, running bests,
locals), ``merge_inplace`` (reductions, and the in-place checks the others
share), ``merge_writes`` (indexed writes), ``merge_keyed`` (keyed reductions
and gathers), ``merge_replays`` (a ufunc's ``.at``, a frame's own rows, set
unions); ``merge_base`` holds their shared data.

What cannot be made atomic (validation is done, but commit may still raise):

- in-place operators and ``__setitem__``/``extend``/``update`` of types other than
  ``list``, ``dict``, ``set``, numpy arrays and torch tensors (user classes,
  deques, Counters): validated on an out-of-place computation or a shallow copy
  only;
- keys that alias the same element (``a[0]`` and ``a[-1]`` of a length-1 array)
  in keyed reductions are each computed from the value before the merge;
- memory errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping
from functools import partial
from typing import Any

from gpucell.core import writeback, writeback_apply
from gpucell.core.analysis.sinks import (
    MERGE_ORDER,
    GatherSink,
    KeyedGatherSink,
    KeyedSink,
    LocalSink,
    OwnFrameRowsSink,
    ReductionSink,
    ReplayedConcatSink,
    ReplayedStatementsSink,
    ReplayedUfuncSink,
    RunningBestSink,
    SinkKind,
    UnionSink,
    WriteSink,
)
from gpucell.core.merge_base import ChunkResultLike, Merging, Mutation, PreparedUpdate
from gpucell.core.merge_inplace import merge_reductions
from gpucell.core.merge_keyed import merge_keyed, merge_keyed_gathers
from gpucell.core.merge_ordered import merge_bests, merge_gathers, merge_locals
from gpucell.core.merge_replays import (
    merge_concats,
    merge_frame_rows,
    merge_replayed_statements,
    merge_ufunc_at,
    merge_unions,
)
from gpucell.core.merge_writes import merge_writes
from gpucell.errors import NotParallelizable

__all__ = [
    "SINK_MERGES",
    "ChunkResultLike",
    "PreparedUpdate",
    "Mutation",
    "check_exactly_once",
    "prepare",
    "merge",
]


def prepare(
    plan: Any,
    results: Iterable[ChunkResultLike],
    current: Mapping[str, Any],
    *,
    item_of: Callable[[int], Any] | None = None,
    inputs: Mapping[str, Any] | None = None,
) -> PreparedUpdate:
    """Validate and compute everything; change nothing.

    Parameters
    ----------
    plan : LoopPlan
        The analysis plan (only its name lists are read).
    results : iterable of ChunkResult
        One per chunk; sorted here by ``start``.
    current : mapping
        Read-only view of the current values of ``plan.affected_names``.

    Raises
    ------
    NameError, TypeError, ValueError, KeyError, IndexError
        What the serial loop would (roughly) have raised; nothing is changed.
    NotParallelizable
        When two combined names are the same object (their contributions would
        interleave serially).
    """
    rs = sorted(results, key=lambda r: r.start)
    up = PreparedUpdate(iterations=sum(r.count for r in rs))
    up.records = [rec for r in rs for rec in getattr(r, "logs", ())]
    own = [u for r in rs for u in getattr(r, "own_items", ())]
    if own:
        if item_of is None:
            raise NotParallelizable(
                "gpucell: the loop changed its own items, and this merge cannot "
                "reach the kernel's items to write them back. Nothing was merged."
            )
        targets = writeback.resolve(own, item_of, inputs or {}, up.iterations)
        up.mutations.append(
            Mutation(
                "(own items)",
                f"{len(targets)} items changed in place",
                lambda: writeback_apply.apply(targets),
            )
        )
    m = Merging(plan, rs, current, up)
    for kind in MERGE_ORDER:
        SINK_MERGES[kind](m)
    facts = getattr(plan, "facts", None)
    for name, training in getattr(facts, "mode_calls", ()):
        train = getattr((inputs or {}).get(name), "train", None)
        if up.iterations and callable(train):
            # `model.eval()` in the body: the mode the last iteration left
            what = "train" if training else "eval"
            up.mutations.append(Mutation(name, what, partial(train, training)))
    return up


def merge(
    plan: Any,
    results: Iterable[ChunkResultLike],
    namespace: MutableMapping[str, Any],
) -> PreparedUpdate:
    """``prepare`` then ``commit`` into ``namespace`` (for tests and local runs)."""
    view = {n: namespace[n] for n in plan.affected_names if n in namespace}
    up = prepare(plan, results, view)
    up.commit(namespace)
    return up


def check_exactly_once(results: Iterable[ChunkResultLike], count: int) -> None:
    """Every iteration merged exactly once: the chunks' ranges tile
    ``[0, count)`` with no gap and no overlap, or nothing is merged.  Checked
    for every run, kept or not: a chunk merged twice (an overlap of kept
    checkpoint files, a reply matched to the wrong chunk) or never (a lost
    one) would leave a namespace that looks right and is not."""
    at = 0
    for r in sorted(results, key=lambda r: (r.start, r.count)):
        if r.start != at:
            what = "twice" if r.start < at else "never"
            a, b = (r.start, at) if r.start < at else (at, r.start)
            cover = "more than once" if what == "twice" else "not at all"
            raise RuntimeError(
                f"gpucell: iterations {a}-{b - 1} would be merged {what} (chunk "
                f"results cover them {cover}); nothing was merged. This is a "
                "gpucell bug or a damaged checkpoint: run the cell again without "
                "--resume."
            )
        at = r.start + r.count
    if at != count:
        raise RuntimeError(
            f"gpucell: chunk results end at iteration {at}, the loop has {count}; "
            "nothing was merged. Run the cell again without --resume."
        )


#: each sink kind's merge, keyed by its class (``core/analysis/sinks.py``,
#: whose ``MERGE_ORDER`` is the order they run in)
SINK_MERGES: dict[type[SinkKind], Callable[[Merging], None]] = {
    ReplayedUfuncSink: merge_ufunc_at,
    ReplayedConcatSink: merge_concats,
    ReplayedStatementsSink: merge_replayed_statements,
    OwnFrameRowsSink: merge_frame_rows,
    GatherSink: merge_gathers,
    WriteSink: merge_writes,
    ReductionSink: merge_reductions,
    KeyedSink: merge_keyed,
    KeyedGatherSink: merge_keyed_gathers,
    UnionSink: merge_unions,
    RunningBestSink: merge_bests,
    LocalSink: merge_locals,
}
