"""One ``%%gpu_parallel`` cell, end to end, as stages with typed hand-offs.

prepare (text, plan, engines: :class:`~gpucell.kernel.stages.Cell`) -> prelude
(the cell's code before the loop, in the kernel) -> admit (the loop's items and
inputs, the pre-flight checks of :mod:`.preflight`, keeping, programs, advice:
:class:`~gpucell.kernel.stages.Admitted`) -> run (in the kernel, on the
engines, or in the background) -> merge (:mod:`.finish`) -> epilogue.  The
magic only parses its line and calls :func:`run_cell`; this module and
:mod:`.finish` are the only ones that write the user's namespace.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpucell import config as _config
from gpucell.core.analysis.scope import BUILTIN_NAMES
from gpucell.errors import NoCluster
from gpucell.kernel import preflight
from gpucell.kernel.finish import conclude, run_epilogue, runs_at_once
from gpucell.kernel.layers import inside_layers
from gpucell.kernel.plans import Prepared
from gpucell.kernel.randomness import warn_random, warn_set_order
from gpucell.kernel.request import CellRequest, select_targets
from gpucell.kernel.session import current as _session
from gpucell.kernel.stages import Admitted, Cell, Loop, Shell
from gpucell.kernel.watched import run_with_display

#: gpucell's decisions for a cell (where it runs, what was kept), for users who ask:
#: ``logging.getLogger("gpucell").setLevel(logging.INFO)`` with a handler
log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from gpucell.cluster.lifecycle import GpuCluster
    from gpucell.core.costmodel import Advice
    from gpucell.core.provenance import LastRun
    from gpucell.kernel.dispatch import Options

__all__ = ["CellRequest", "run_cell", "select_targets"]


def run_cell(shell: Shell, cell: str, req: CellRequest) -> None:
    """Run ``cell`` as ``%%gpu_parallel`` would (see the magic's docstring)."""
    if not req.dry_run:
        # one run on the cluster at a time: a pending background run is waited
        # for (and merged) first, as it would have finished serially
        from gpucell.kernel import background

        background.wait_for_all(shell, "a new %%gpu_parallel cell runs after it")
    c = prepare(shell, cell, req)
    if req.dry_run:
        _dry_run(c)
        return
    prep = _plan(c, for_cpu=False)
    if req.background and prep.plan.layers:
        from gpucell.kernel.background import refuse_layers

        refuse_layers(prep.plan)  # before anything runs
    if c.gc is None:
        if req.background and _config.settings().serial_fallback:
            print("gpucell: no cluster, so the cell runs now, not in the background.")
        _run_without_cluster(shell, c.src, c.filename)
        return
    record = prelude(c, prep)
    outcome = _Outcome()
    inside_layers(shell, prep, 0, lambda: _loop_stages(c, prep, record, outcome))
    if outcome.started:  # the epilogue runs at the merge
        return
    if outcome.failed:
        _raise_suppressed(outcome.failed[0])
    run_epilogue(shell, prep)


# ------------------------------------------------------------------ prepare


def prepare(shell: Shell, cell: str, req: CellRequest) -> Cell:
    """The cell's text as analysed, the cluster, the engines it runs on."""
    # The magic's own line stays line 1 (as a comment), so every line number we
    # report is the one the notebook editor shows for the cell.
    src = "# %%gpu_parallel\n" + shell.transform_cell(cell)
    filename = shell.compile.cache(src)
    ns = shell.user_ns
    gc = _session().cluster
    if gc is not None:
        _drop_gone_inputs(gc, ns)
    targets = tuple(select_targets(gc, req)) if gc is not None else ()
    ipython_names = frozenset(
        n
        for n, v in getattr(shell, "user_ns_hidden", {}).items()
        if ns.get(n) is v and n in BUILTIN_NAMES
    )
    return Cell(shell, req, src, filename, gc, targets, ipython_names)


def _plan(c: Cell, for_cpu: bool) -> Prepared:
    """The cell's plan (analysed once per text and names known: the session's
    plan cache)."""
    return _session().plans.get(
        c.src,
        c.filename,
        c.ns,
        for_cpu=for_cpu,
        dry_run=c.req.dry_run,
        exclude=c.ipython_names,
    )


def _dry_run(c: Cell) -> None:
    from gpucell.core.analysis import format_plan

    print(format_plan(_plan(c, "cpu" in c.kinds()).plan))
    if c.gc is None:
        print("(no cluster: start one with `%gpu_cluster start`)")
    else:
        print(f"engines: {', '.join(map(str, c.targets))}")


def _run_without_cluster(shell: Shell, src: str, filename: str) -> None:
    if _config.settings().serial_fallback:
        print(
            "gpucell: no cluster; running the cell serially in the kernel "
            "(`%gpu_cluster start` to run it in parallel)."
        )
        shell.ex(compile(src, filename, "exec"))
        return
    raise NoCluster(
        "No cluster for %%gpu_parallel. Start one with `%gpu_cluster start` (or "
        "`%config GpuCell.serial_fallback = True` to run such cells serially)."
    )


def _drop_gone_inputs(gc: GpuCluster, ns: dict[str, Any]) -> None:
    """Engines forget cached inputs whose name the kernel no longer has (``del
    big``), whichever way the next cell runs (even in the kernel); the kernel
    does not wait."""
    from gpucell.devices.host import kernel_key
    from gpucell.engine import worker

    live = gc.live_ids()
    for eid in [e for e in gc.input_cache if e in live]:
        drop = gc.forget_cached(eid, lambda name: name not in ns)
        if not drop:
            continue
        try:
            gc.view(eid).apply_async(worker.TIDY, drop, kernel_key())
        except Exception:
            pass


# ------------------------------------------------------------------ prelude


def prelude(c: Cell, prep: Prepared) -> LastRun:
    """The record of this run (``gpucell.last_run``), then the cell's code
    before the loop, in the kernel."""
    from gpucell.core.provenance import LastRun

    record = LastRun(plan=prep.plan)
    _session().last_run = record
    if c.req.checkpoint:  # before the prelude: a folder refused, nothing ran
        from gpucell.kernel.keep import check_folder

        check_folder(c.req.checkpoint)
    code = prep.code("prelude", prep.plan.compile_prelude)
    if code is not None:
        c.shell.ex(code)
    return record


# ---------------------------------------------------- admit, run and merge


@dataclass
class _Outcome:
    """How the stages inside the ``with`` blocks ended (they may swallow an
    error: it is kept here)."""

    started: bool = False  # a background run was launched
    failed: list[BaseException] = field(default_factory=list)


def _loop_stages(c: Cell, prep: Prepared, record: LastRun, out: _Outcome) -> None:
    try:
        a = admit(c, prep, record)
        if c.req.background and runs_at_once(a.loop, a.advice, a.kept, c.req) is None:
            _launch(c, a)
            out.started = True
            return
        conclude(a, run(c, a))
    except BaseException as e:
        out.failed.append(e)
        if record.status == "running":  # (it ended before the run's own end)
            record.status = (
                "interrupted" if isinstance(e, KeyboardInterrupt) else "error"
            )
        raise


def _raise_suppressed(e: BaseException) -> None:
    """A `with` around the loop swallowed the loop's error: serially the
    iterations before it would have kept their results, here nothing was
    merged, so going on would be silently different."""
    from gpucell.errors import IterationError

    raise IterationError(
        f"gpucell: the loop failed ({type(e).__name__}: {e}) and "
        "a `with` around it suppressed the error. Serially the iterations "
        "before the failing one would have kept their results; in parallel "
        "nothing from the loop was merged, so gpucell stops here instead of "
        "going on with a different namespace. Handle the error inside the "
        "loop body (`try: ... except ...:`), or run the cell without "
        "%%gpu_parallel."
    ) from e


def admit(c: Cell, prep: Prepared, record: LastRun) -> Admitted:
    """The loop's items and inputs, checked (every pre-flight problem refused
    in one message), with what was kept for it, each engine's program and
    the advice of its last run."""
    from gpucell.kernel import nonempty
    from gpucell.kernel.keep import Keeping

    assert c.gc is not None
    req, ns = c.req, c.ns
    nonempty.check(prep.plan, ns)
    loop = start_loop(c.shell, prep)
    keeping = Keeping(
        c.src,
        loop.inputs,
        loop.chunker,
        resume=req.resume,
        checkpoint=req.checkpoint,
        seed=req.seed,
    )
    kept = keeping.start()
    cuda = "cuda" in c.src or any(map(_names_cuda, loop.inputs.values()))
    programs = _programs(c, prep, _plan(c, for_cpu=True) if cuda else prep)
    cost_key = (c.src, tuple(sorted(c.targets)))
    advice = c.gc.cost_history.advise(
        cost_key,
        iterations=loop.chunker.count,
        shapes=loop.shapes,
        plain=not cuda and not req.asks_for_engines(),
        inline_below=_config.settings().inline_below,
    )
    said = warn_random(prep.plan, req.seed, loop.inputs, ns)
    warn_set_order(prep.plan)
    return Admitted(
        shell=c.shell,
        gc=c.gc,
        prep=prep,
        loop=loop,
        record=record,
        req=req,
        keeping=keeping,
        kept=kept,
        advice=advice,
        cost_key=cost_key,
        random_said=said,
        programs=programs,
    )


def _groups_kept(value: Any) -> Any:
    """``itertools.groupby(...)``: each group, an iterator over the one shared
    iterator, is emptied by drawing the next; every item is drawn before any
    iteration runs, so each group is drawn with its key, as an iterator over
    its own items (what the body iterates serially)."""
    import itertools

    if not isinstance(value, itertools.groupby):
        return value
    return ((key, iter(list(group))) for key, group in value)


def start_loop(shell: Shell, prep: Prepared) -> Loop:
    """Evaluate the loop's iterable and gather its inputs (the prelude ran);
    refuse, listing every problem the pre-flight checks find, before its items
    are drawn, then whatever drawing them changed."""
    from gpucell.core.analysis import make_chunker
    from gpucell.core.costmodel import shape_of

    ns, plan = shell.user_ns, prep.plan
    space = plan.iter_space
    assert space is not None
    leaves = prep.code(
        "leaves",
        lambda: [compile(leaf, plan.filename, "eval") for leaf in space.leaves],
    )
    values = [_groups_kept(eval(code, ns)) for code in leaves]
    inputs = {name: ns[name] for name in plan.inputs if name in ns}
    preflight.refuse(preflight.before_drawing(plan, ns, inputs, values))
    # a lazy iterable's items are all drawn before any iteration runs (serially
    # each after the iterations before it): what drawing them changes in the
    # notebook is checked after
    lazy = [v for v in values if hasattr(type(v), "__next__")]
    drawn_from = preflight.fingerprints(plan, ns) if lazy else None
    chunker = make_chunker(space, values)
    _items_travel(chunker, space.source)
    if drawn_from is not None:
        problems = preflight.after_drawing(plan, ns, drawn_from, lazy)
        preflight.refuse(problems, preflight.ITEMS_DRAWN)
        inputs = {name: ns[name] for name in plan.inputs if name in ns}
    shapes = (
        tuple(shape_of(v) for v in values),
        tuple((k, shape_of(v)) for k, v in sorted(inputs.items())),
    )
    return Loop(chunker, inputs, shapes, tuple(values))


def _items_travel(chunker: Any, source: str) -> None:
    """The loop's first item can travel to an engine (``os.scandir``'s
    entries cannot): said before anything runs, naming the iterable."""
    from gpucell.errors import InputNotSendable
    from gpucell.protocol import wire

    if chunker.count == 0:
        return
    items = list(chunker.items(chunker.chunk(0, 1)))
    parts = [p for x in items for p in (x if type(x) is tuple else (x,))]
    if any(type(p).__module__.split(".")[0] in ("numpy", "torch") for p in parts):
        return  # (an array's row: it travels; a tensor's view would copy it all)
    try:
        wire.dumps(items)
    except Exception as e:
        kinds = sorted({type(x).__name__ for x in items})
        raise InputNotSendable(
            f"gpucell: the loop's items (`{source}`: {', '.join(kinds)}) cannot "
            f"travel to the engines ({type(e).__name__}: {e}). Loop over what "
            "they are made from instead (for `os.scandir(d)`: `os.listdir(d)` or "
            "`[e.path for e in os.scandir(d)]`), or run the cell without "
            "%%gpu_parallel. Nothing from the loop ran."
        ) from None


def _programs(c: Cell, prep: Prepared, cpu: Prepared) -> dict[int, Any]:
    """Each engine's chunk program: CPU engines get the CUDA-rewritten one."""
    assert c.gc is not None
    engines = c.gc.engines
    if cpu is not prep and "cpu" in c.kinds():
        if cpu.plan.cuda_rewritten and not c.req.quiet:
            lines = ", ".join(map(str, cpu.plan.cuda_lines))
            print(
                f"gpucell: CPU engines run the CUDA code of line(s) {lines} on the "
                "CPU (their device has no GPU)."
            )
    else:
        cpu = prep
    out = {}
    for e in c.targets:
        p = cpu if engines[e].kind == "cpu" else prep
        out[e] = p.code("program", p.plan.engine_program)
    return out


# ---------------------------------------------------------------------- run


def run(c: Cell, a: Admitted) -> list[Any]:
    """Every iteration, in the kernel (when advised) or on the engines; with
    kept chunks, only those an earlier run did not finish.  A failure keeps
    what finished for ``--resume``."""
    from gpucell.kernel.inline import run_in_kernel

    at_once = runs_at_once(a.loop, a.advice, a.kept, c.req)
    if c.req.background and at_once is not None and not c.req.quiet:
        print(f"gpucell: the loop runs now, not in the background: {at_once}.")
    try:
        if a.loop.chunker.count == 0:
            a.record.status = "ok"
            return []
        _log_decision(c, a)
        if a.advice.inline and not a.kept and c.req.checkpoint is None:
            program = a.prep.code("program", a.prep.plan.engine_program)
            return run_in_kernel(program, a.loop.inputs, a.loop.chunker, a.record)
        return run_with_display(a, list(c.targets), options(a.advice, c.req, a))
    except BaseException as e:
        a.keeping.failed(type(e).__name__)
        raise


def _log_decision(c: Cell, a: Admitted) -> None:
    """Where the loop runs and why, as the ``gpucell.kernel.execute`` logger's line."""
    if not log.isEnabledFor(logging.INFO):
        return
    lines = a.prep.plan.loop_lines
    where = f"the loop on lines {lines[0]}-{lines[1]}" if lines else "the loop"
    n = a.loop.chunker.count
    if a.advice.inline and not a.kept and c.req.checkpoint is None:
        log.info(
            "%s: %d iterations run in the kernel: its last run cost %.3g s an "
            "iteration, less than sending them to engines",
            where,
            n,
            a.advice.per_iteration or 0.0,
        )
        return
    kept = sum(hi - lo for lo, hi in a.kept) if a.kept else 0
    log.info(
        "%s: %d iterations on %d engines (%s)%s",
        where,
        n,
        len(c.targets),
        "first run: calibration chunks"
        if a.advice.per_iteration is None
        else f"{a.advice.per_iteration:.3g} s an iteration last run"
        + (", uniform" if a.advice.uniform else ""),
        f"; {kept} iterations kept from an earlier run" if kept else "",
    )


def _launch(c: Cell, a: Admitted) -> None:
    """The run goes on in the background; the cell returns once it is under way."""
    from gpucell.kernel import background

    try:
        background.launch(a, list(c.targets), options(a.advice, c.req, a))
    except BaseException as e:
        a.keeping.failed(type(e).__name__)
        raise


def options(advice: Advice, req: CellRequest, a: Admitted | None = None) -> Options:
    """The dispatcher's options for this cell (its line, its last run)."""
    from gpucell.kernel.dispatch import Options

    return Options(
        cost_hint=advice.per_iteration,
        uniform=advice.uniform,
        profile=advice.profile,
        schedule=req.schedule or _config.settings().schedule,
        chunksize=req.chunksize,
        seed=req.seed,
        reseed=_reseed(req, a),
        timeout=req.timeout,
        retries=req.retries,
    )


def _reseed(req: CellRequest, a: Admitted | None) -> tuple[str, ...] | None:
    """``--seed``: only the generators the loop can draw from are reseeded on
    the engines (``core/seeding``; each costs 1-4 us per iteration)."""
    if req.seed is None or a is None:
        return None
    from gpucell.core.seeding import loop_generators

    plan = a.prep.plan
    return loop_generators(
        plan.source,
        plan.prelude_lines,
        plan.epilogue_lines,
        a.loop.inputs,
        a.shell.user_ns,
    )


def _names_cuda(value: Any, depth: int = 1) -> bool:
    """A CUDA device held in a value (or one level into a dict, list or tuple)."""
    from gpucell.protocol.program import is_cuda_device

    if is_cuda_device(value):
        return True
    if depth > 0 and isinstance(value, (dict, list, tuple)) and len(value) <= 64:
        items = value.values() if isinstance(value, dict) else value
        return any(_names_cuda(v, depth - 1) for v in items)
    return False
