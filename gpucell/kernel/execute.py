"""One ``%%gpu_parallel`` cell, end to end: analyse, prelude, loop, merge, epilogue.

The magic only parses its line and calls :func:`run_cell`.  This module glues the
pure stages (analysis, merge) to the one that talks to engines (dispatch); it is
the only place that writes the user's namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpucell import config as _config
from gpucell.errors import NoCluster

__all__ = ["CellRequest", "run_cell", "select_targets"]


@dataclass(frozen=True)
class CellRequest:
    """What the magic line asked for."""

    devices: str | None = None
    targets: str | None = None
    schedule: str | None = None
    chunksize: int | None = None
    seed: int | None = None
    timeout: float | None = None
    retries: int = 2
    dry_run: bool = False
    quiet: bool = False


def _set_last_run(record: Any) -> None:
    import gpucell

    gpucell.last_run = record


def parse_engine_ids(spec: str, live: list[int], option: str) -> list[int]:
    """``"0,2"`` -> ``[0, 2]``, all live engines, or an error naming ``option``."""
    from gpucell.errors import DeviceSelectionError

    try:
        ids = [int(t) for t in spec.split(",") if t.strip()]
    except ValueError:
        raise DeviceSelectionError(
            f"{option} {spec!r}: expected engine ids like '0,2'."
        ) from None
    bad = [i for i in ids if i not in live]
    if bad or not ids:
        raise DeviceSelectionError(
            f"{option}: no live engine {bad or spec!r} (live engines: {live})."
        )
    return ids


def select_targets(gc: Any, req: CellRequest) -> list[int]:
    """Engine ids a cell runs on: --targets, --devices, the selection, or all live."""
    from gpucell.errors import DeviceSelectionError

    live = gc.live_ids()
    if req.targets:
        return parse_engine_ids(req.targets, live, "--targets")
    if req.devices:
        want = [t.strip().lower() for t in req.devices.split(",") if t.strip()]
        ids = []
        for eid in live:
            e = gc.engines[eid]
            if (e.kind == "cpu" and "cpu" in want) or (
                e.kind == "gpu" and str(e.index) in want
            ):
                ids.append(eid)
        if not ids:
            have = sorted({gc.engines[e].device for e in live})
            raise DeviceSelectionError(
                f"--devices {req.devices!r}: no live engine on those devices "
                f"(devices: {', '.join(have)}; use GPU indices or 'cpu')."
            )
        return ids
    if gc.selected:
        sel = [e for e in gc.selected if e in live]
        if sel:
            return sel
    return live


def run_cell(shell: Any, cell: str, req: CellRequest) -> None:
    """Run ``cell`` as ``%%gpu_parallel`` would (see the magic's docstring)."""
    from gpucell.core.analysis import analyse, format_plan, make_chunker

    settings = _config.settings()
    ns = shell.user_ns
    # The magic's own line stays line 1 (as a comment), so every line number we
    # report is the one the notebook editor shows for the cell.
    src = "# %%gpu_parallel\n" + shell.transform_cell(cell)
    filename = shell.compile.cache(src)
    gc = _current_or_none()
    targets: list[int] = select_targets(gc, req) if gc is not None else []
    kinds = {gc.engines[e].kind for e in targets} if gc is not None else set()

    def plan_for(for_cpu: bool) -> Any:
        # The plan depends only on the text and on which of its names exist in
        # the namespace: re-running a cell reuses it.
        known = frozenset(_identifiers(src) & ns.keys())
        key = (src, filename, for_cpu, not req.dry_run, known)
        plan = _PLANS.get(key)
        if plan is None:
            plan = analyse(
                src,
                filename=filename,
                known_names=known,
                for_cpu=for_cpu,
                raise_errors=not req.dry_run,
            )
            if len(_PLANS) >= 64:
                _CODES.pop(id(_PLANS.pop(next(iter(_PLANS)))), None)
            _PLANS[key] = plan
        return plan

    if req.dry_run:
        print(format_plan(plan_for("cpu" in kinds)))
        if gc is None:
            print("(no cluster: start one with `%gpu_cluster start`)")
        else:
            print(f"engines: {', '.join(map(str, targets))}")
        return

    plan = plan_for(False)
    if gc is None:
        if settings.serial_fallback:
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
    from gpucell.core import merge as _merge
    from gpucell.core.provenance import LastRun
    from gpucell.kernel.dispatch import Options
    from gpucell.kernel.inline import run_in_kernel, shape_of, should_inline

    record = LastRun(plan=plan)
    _set_last_run(record)

    prelude = _code(plan, "prelude", plan.compile_prelude)
    if prelude is not None:
        shell.ex(prelude)
    space = plan.iter_space
    leaves = _code(
        plan,
        "leaves",
        lambda: [compile(leaf, filename, "eval") for leaf in space.leaves],
    )
    values = [eval(code, ns) for code in leaves]
    chunker = make_chunker(space, values)
    inputs = {name: ns[name] for name in plan.inputs if name in ns}
    # The CUDA rewrite for CPU engines is a second analysis; skip it when neither
    # the cell nor a value it reads can name a CUDA device.
    cuda = "cuda" in src or any(map(_names_cuda, inputs.values()))
    cpu_plan = plan_for(True) if "cpu" in kinds and cuda else plan
    if cpu_plan.cuda_rewritten and not req.quiet:
        lines = ", ".join(map(str, cpu_plan.cuda_lines))
        print(
            f"gpucell: CPU engines run the CUDA code of line(s) {lines} on the CPU "
            "(their device has no GPU)."
        )
    programs = {}
    for e in targets:
        p = cpu_plan if gc.engines[e].kind == "cpu" else plan
        programs[e] = _code(p, "program", p.engine_program)
    cost_key = (src, tuple(sorted(targets)))
    hint, uniform, profile, shapes = gc.cost_history.get(
        cost_key, (None, False, None, None)
    )
    now_shapes = (
        tuple(shape_of(v) for v in values),
        tuple((k, shape_of(v)) for k, v in sorted(inputs.items())),
    )
    options = Options(
        cost_hint=hint,
        uniform=uniform,
        profile=profile,
        schedule=req.schedule or settings.schedule,
        chunksize=req.chunksize,
        seed=req.seed,
        timeout=req.timeout,
        retries=req.retries,
    )
    if chunker.count == 0:
        results: list[Any] = []
        record.status = "ok"
    elif should_inline(
        uses_cuda=cuda,
        request=req,
        iterations=chunker.count,
        per_iteration=hint if shapes == now_shapes else None,
        threshold=settings.inline_below,
    ):
        program = _code(plan, "program", plan.engine_program)
        results = run_in_kernel(program, inputs, chunker, record)
    else:
        results = _run_with_display(
            shell, gc, targets, programs, inputs, chunker, options, record, req.quiet
        )
    if record.status == "ok" and chunker.count:
        # a statically split run has too few chunks to judge uniformity: it
        # keeps the verdict that made it static
        done = sum(c.state == "done" for c in record.chunks)
        work = record.work_estimate
        same = record.uniform if done >= 4 else uniform
        # a per-iteration profile only steers a loop worth balancing: a cheap or
        # uniform one is split statically next time (and computing it costs
        # ~0.2 us per iteration, in the kernel, after every cell)
        worth = work > 0.05 and not same
        gc.cost_history[cost_key] = (
            work / chunker.count,
            same,
            record.profile() if worth else None,
            now_shapes,
        )
    current = {n: ns[n] for n in plan.affected_names if n in ns}
    update = _merge.prepare(plan, results, current)
    update.commit(ns)
    if not req.quiet:
        print(record.summary())
    epilogue = _code(plan, "epilogue", plan.compile_epilogue)
    if epilogue is not None:
        shell.ex(epilogue)


def _run_with_display(
    shell: Any,
    gc: Any,
    targets: list[int],
    programs: dict[int, Any],
    inputs: dict[str, Any],
    chunker: Any,
    options: Any,
    record: Any,
    quiet: bool,
) -> list[Any]:
    """The dispatcher's run, watched by the live display (widget or text line)."""
    from gpucell.kernel.dispatch import run_chunks
    from gpucell.kernel.telemetry import for_cluster
    from gpucell.ui.model import initial_snapshot
    from gpucell.ui.progress import make_progress

    first = initial_snapshot([gc.engines[e] for e in targets], chunker.count)
    tele = None if quiet else for_cluster(gc, targets)
    display = make_progress(shell, first, tele, quiet)
    last = [first]

    def on_progress(snap: Any) -> None:
        last[0] = snap
        display.update(snap)

    try:
        return run_chunks(
            gc,
            targets,
            programs=programs,
            inputs=inputs,
            n=chunker.count,
            chunk_of=chunker.chunk,
            options=options,
            record=record,
            progress=on_progress,
            telemetry=tele,
            relay=getattr(display, "write_above", None),
        )
    finally:
        display.close(last[0])


_PLANS: dict[Any, Any] = {}
# compiled prelude, iterable, epilogue and engine program of the cached plans (a
# re-run of a cell compiles nothing), by the plan object's id while it is cached
_CODES: dict[int, dict[str, Any]] = {}


def _code(plan: Any, what: str, make: Any) -> Any:
    if not any(p is plan for p in _PLANS.values()):
        return make()  # not cached: its id may be reused later
    codes = _CODES.setdefault(id(plan), {})
    if what not in codes:
        codes[what] = make()
    return codes[what]


def _names_cuda(value: Any, depth: int = 1) -> bool:
    """A CUDA device held in a value (or one level into a dict, list or tuple)."""
    from gpucell.protocol.program import is_cuda_device

    if is_cuda_device(value):
        return True
    if depth > 0 and isinstance(value, (dict, list, tuple)) and len(value) <= 64:
        items = value.values() if isinstance(value, dict) else value
        return any(_names_cuda(v, depth - 1) for v in items)
    return False


def _identifiers(src: str) -> set[str]:
    """Every identifier-like token of the cell (a superset of its names)."""
    import re

    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", src))


def _current_or_none() -> Any:
    from gpucell.cluster import lifecycle as cluster

    try:
        return cluster.current()
    except NoCluster:
        return None
