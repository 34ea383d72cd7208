"""The merge and epilogue stages: a finished loop's results written into the
namespace (all or nothing), the loop variable bound to the kernel's own last
item, the summary, then the cell's statements after the loop.

Shared by the foreground run and a background run merged in a later cell.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpucell.kernel.plans import Prepared, identifiers
from gpucell.kernel.randomness import warn_hidden_draws
from gpucell.kernel.stages import Admitted, Loop, Shell

if TYPE_CHECKING:
    from gpucell.core.analysis import LoopPlan
    from gpucell.core.analysis.iterspace import Chunker
    from gpucell.core.costmodel import Advice
    from gpucell.kernel.request import CellRequest

__all__ = ["conclude", "merge", "run_epilogue", "runs_at_once"]


def run_epilogue(shell: Shell, prep: Prepared) -> None:
    """The cell's statements after its loop, in the kernel (after the merge)."""
    epilogue = prep.code("epilogue", prep.plan.compile_epilogue)
    if epilogue is not None:
        shell.ex(epilogue)


def runs_at_once(
    loop: Loop, advice: Advice, kept: list[tuple[int, int]], req: CellRequest
) -> str | None:
    """Why a --background loop finishes now instead: no iteration to send
    (empty, or all kept), or its last run measured it cheaper than sending it
    (then it runs in the kernel).  ``None``: it runs in the background."""
    if loop.chunker.count == 0:
        return "it has no iteration"
    if kept and sum(b - a for a, b in kept) >= loop.chunker.count:
        return "every iteration is kept"
    if advice.inline and not kept and req.checkpoint is None:
        return "it costs less than sending it (its last run), so it runs in the kernel"
    return None


def conclude(t: Admitted, results: list[Any]) -> None:
    """Every iteration finished: merge (all or nothing), bind the loop's last
    item, let the kept chunks go, say how it went.  (The epilogue is next.)"""
    record, keeping, kept, loop = t.record, t.keeping, t.kept, t.loop
    if not t.random_said and record.drew:
        warn_hidden_draws(record.drew)
    if kept:
        results = keeping.results()
        record.resumed = tuple(kept)
    if record.status == "ok" and loop.chunker.count and not kept:
        t.gc.cost_history.learn(
            t.cost_key,
            record,
            iterations=loop.chunker.count,
            shapes=loop.shapes,
            previous=t.advice,
        )
    ns = t.shell.user_ns
    try:
        merge(ns, t.prep.plan, results, loop)
        bind_last_item(ns, t.prep, loop)
    except BaseException as e:
        # every chunk finished: keep them all, so a fixed namespace (the
        # error says what) merges with --resume without running anything
        if not kept and results:
            keeping.failed(type(e).__name__)
        raise
    keeping.merged()
    if not t.req.quiet:
        choice = t.prep.plan.choice
        several = "in the kernel, as written" in choice
        print(record.summary() + (f"; in parallel: {choice}" if several else ""))


def bind_last_item(ns: dict[str, Any], prep: Prepared, loop: Loop) -> None:
    """The loop variable is the kernel's own last item, as serially (the same
    object, not an engine's equal copy), when the body never rebinds it
    (``core/lastitem.py``; the analysis compiled the binding)."""
    from gpucell.core.lastitem import LAST_ITEM
    from gpucell.protocol.chunks import chunk_items

    plan, n = prep.plan, loop.chunker.count
    code = plan.facts.last_item
    if code is None or not n or plan.iter_space is None:
        return
    # an item read from an object the loop changed (`for i, x in enumerate(a):
    # a[i] = ...`) is not what the last iteration saw: the engine's value stays
    changed = {*plan.affected_names, *(r.name for r in plan.own_rows)}
    leaves = " ".join(plan.iter_space.leaves)
    if changed & identifiers(leaves):
        return
    for last in chunk_items(loop.chunker.chunk(n - 1, n)):
        ns[LAST_ITEM] = last
        try:
            exec(code, ns)
        except Exception:
            pass  # (it does not unpack: the engine's values stay)
        finally:
            ns.pop(LAST_ITEM, None)
        return


def _item_of(chunker: Chunker) -> Callable[[int], Any]:
    """The kernel's own item of an iteration, as the loop yields it (what an
    iteration's changes to its item are written back into)."""
    from gpucell.protocol.chunks import chunk_items

    def item_of(iteration: int) -> Any:
        return next(iter(chunk_items(chunker.chunk(iteration, iteration + 1))))

    return item_of


def merge(
    ns: dict[str, Any], plan: LoopPlan, results: list[Any], loop: Loop | None = None
) -> None:
    """All or nothing: validate every result against the namespace, then write."""
    from gpucell.core import merge as merging
    from gpucell.kernel.interrupts import interrupts_deferred

    item_of = None
    if loop is not None:
        merging.check_exactly_once(results, loop.chunker.count)
        item_of = _item_of(loop.chunker)

    from gpucell.core.fileconflicts import check_files

    check_files(results)  # two iterations that met in one file: nothing merged
    current = {n: ns[n] for n in plan.affected_names if n in ns}
    update = merging.prepare(  # an interrupt here changes nothing
        plan,
        results,
        current,
        item_of=item_of,
        inputs=loop.inputs if loop is not None else None,
    )
    with interrupts_deferred(
        "the merge wrote the loop's results (the namespace holds them all)"
    ):
        update.commit(ns)
    if update.records:
        from gpucell.kernel import logs

        logs.emit(update.records)
    for note in update.notes:
        print(f"gpucell: note: {note}")
