"""One ``%%gpu_parallel`` cell, end to end: analyse, prelude, loop, merge, epilogue.

The magic only parses its line and calls :func:`run_cell`.  This module glues the
pure stages (analysis, merge) to the one that talks to engines (dispatch); it is
the only place that writes the user's namespace.
"""

from __future__ import annotations

import ast
import copy
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpucell import config as _config
from gpucell.core.analysis.scope import BUILTIN_NAMES
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
    resume: bool = False
    checkpoint: str | None = None
    background: bool = False  # --background: the cell returns, the run goes on

    def asks_for_engines(self) -> bool:
        """Explicit engines, schedule, chunk size, seed or timeout: the cell must
        run on the engines (never inline in the kernel)."""
        explicit = (
            self.seed,
            self.targets,
            self.devices,
            self.schedule,
            self.chunksize,
            self.timeout,
        )
        return any(x is not None for x in explicit)


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

    live = gc.live_ids()
    if req.targets:
        return parse_engine_ids(req.targets, live, "--targets")
    if req.devices:
        return _engines_for_devices(gc, live, req.devices)
    if gc.selected:
        sel = [e for e in gc.selected if e in live]
        if sel:
            return sel
    return live


def _engines_for_devices(gc: Any, live: list[int], spec: str) -> list[int]:
    """``--devices 0,1`` / ``cpu``: the live engines on those devices, every
    device named found.  On a cluster without GPU engines, GPU index k means the
    k-th CPU engine standing in for it (one note), so a notebook written for a
    GPU node runs unchanged on a laptop."""
    from gpucell.errors import DeviceSelectionError

    want = [t.strip().lower() for t in spec.split(",") if t.strip()]
    gpus = {gc.engines[e].index: e for e in live if gc.engines[e].kind == "gpu"}
    cpus = [e for e in live if gc.engines[e].kind == "cpu"]
    have = ", ".join(sorted({gc.engines[e].device for e in live})) or "none"
    ids: list[int] = []
    stand_ins = []
    for tok in want:
        if tok == "cpu":
            found = cpus
        elif tok.isdigit() and gpus:
            found = [gpus[int(tok)]] if int(tok) in gpus else []
        elif tok.isdigit() and int(tok) < len(cpus):
            found = [cpus[int(tok)]]
            stand_ins.append(f"GPU {tok} -> engine {cpus[int(tok)]}")
        else:
            found = []
        if not found:
            raise DeviceSelectionError(
                f"--devices {spec!r}: no live engine on device {tok!r} (devices: "
                f"{have}; use GPU indices like '0,1' or 'cpu')."
            )
        ids.extend(e for e in found if e not in ids)
    if stand_ins:
        print(
            "gpucell: note: this cluster has no GPU engines; CPU engines stand in for "
            "the GPUs asked for (" + ", ".join(stand_ins) + ")."
        )
    return ids


def run_cell(shell: Any, cell: str, req: CellRequest) -> None:
    """Run ``cell`` as ``%%gpu_parallel`` would (see the magic's docstring)."""
    from gpucell.core.analysis import format_plan

    ns = shell.user_ns
    if not req.dry_run:
        # one run on the cluster at a time: a pending background run is waited
        # for (and merged) first, as it would have finished serially
        from gpucell.kernel import background

        background.wait_for_all(shell, "a new %%gpu_parallel cell runs after it")
    # The magic's own line stays line 1 (as a comment), so every line number we
    # report is the one the notebook editor shows for the cell.
    src = "# %%gpu_parallel\n" + shell.transform_cell(cell)
    filename = shell.compile.cache(src)
    from gpucell.cluster.lifecycle import current_or_none

    gc = current_or_none()
    if gc is not None:
        _drop_gone_inputs(gc, ns)
    targets: list[int] = select_targets(gc, req) if gc is not None else []
    kinds = {gc.engines[e].kind for e in targets} if gc is not None else set()

    # names IPython put in the namespace for builtins (its `open` wrapper, exit)
    # are the builtins on engines, never inputs to ship
    ipython_names = frozenset(
        n
        for n, v in getattr(shell, "user_ns_hidden", {}).items()
        if ns.get(n) is v and n in BUILTIN_NAMES
    )

    def prepared(for_cpu: bool) -> Prepared:
        return _PLANS.get(
            src,
            filename,
            ns,
            for_cpu=for_cpu,
            dry_run=req.dry_run,
            exclude=ipython_names,
        )

    if req.dry_run:
        print(format_plan(prepared("cpu" in kinds).plan))
        if gc is None:
            print("(no cluster: start one with `%gpu_cluster start`)")
        else:
            print(f"engines: {', '.join(map(str, targets))}")
        return
    prep = prepared(False)
    if req.background and prep.plan.layers:
        from gpucell.kernel.background import refuse_layers

        refuse_layers(prep.plan)  # before anything runs
    if gc is None:
        if req.background and _config.settings().serial_fallback:
            print("gpucell: no cluster, so the cell runs now, not in the background.")
        _run_without_cluster(shell, src, filename)
        return
    from gpucell.core.provenance import LastRun

    record = LastRun(plan=prep.plan)
    _set_last_run(record)
    if req.checkpoint:  # before the prelude: a folder refused, nothing ran
        from gpucell.kernel.keep import check_folder

        check_folder(req.checkpoint)
    prelude = prep.code("prelude", prep.plan.compile_prelude)
    if prelude is not None:
        shell.ex(prelude)

    def loop_and_merge() -> None:
        from gpucell.kernel import nonempty
        from gpucell.kernel.keep import Keeping

        nonempty.check(prep.plan, ns)
        loop = _start_loop(shell, prep)
        keeping = Keeping(
            src,
            loop.inputs,
            loop.chunker,
            resume=req.resume,
            checkpoint=req.checkpoint,
            seed=req.seed,
        )
        kept = keeping.start()
        cuda = "cuda" in src or any(map(_names_cuda, loop.inputs.values()))
        programs = _programs(gc, targets, prep, prepared(True) if cuda else prep, req)
        cost_key = (src, tuple(sorted(targets)))
        advice = gc.cost_history.advise(
            cost_key,
            iterations=loop.chunker.count,
            shapes=loop.shapes,
            plain=not cuda and not req.asks_for_engines(),
            inline_below=_config.settings().inline_below,
        )
        random_said = _warn_random(prep.plan, req, loop.inputs, ns)
        _warn_set_order(prep)
        tail = _Tail(
            shell, gc, prep, loop, record, req, keeping, kept, advice, cost_key
        )
        tail.random_said = random_said
        at_once = _runs_at_once(loop, advice, kept, req) if req.background else None
        if req.background and at_once is None:
            from gpucell.kernel import background

            try:
                started.append(
                    background.launch(tail, targets, programs, _options(advice, req))
                )
            except BaseException as e:
                keeping.failed(type(e).__name__)
                raise
            return
        if at_once is not None and not req.quiet:
            print(f"gpucell: the loop runs now, not in the background: {at_once}.")
        try:
            results = _run_loop(
                shell,
                gc,
                targets,
                programs,
                prep,
                loop,
                advice,
                record,
                req,
                keeping,
                kept,
            )
        except BaseException as e:
            keeping.failed(type(e).__name__)
            raise
        _conclude(tail, results)

    started: list[Any] = []
    failed: list[BaseException] = []

    def guarded() -> None:
        try:
            loop_and_merge()
        except BaseException as e:
            failed.append(e)
            raise

    _inside_layers(shell, prep, 0, guarded)
    if started:  # the epilogue runs at the merge
        return
    if failed:
        # a `with` around the loop swallowed the loop's error: serially the
        # iterations before it would have kept their results, here nothing was
        # merged, so going on would be silently different
        from gpucell.errors import IterationError

        raise IterationError(
            f"gpucell: the loop failed ({type(failed[0]).__name__}: {failed[0]}) and "
            "a `with` around it suppressed the error. Serially the iterations "
            "before the failing one would have kept their results; in parallel "
            "nothing from the loop was merged, so gpucell stops here instead of "
            "going on with a different namespace. Handle the error inside the "
            "loop body (`try: ... except ...:`), or run the cell without "
            "%%gpu_parallel."
        ) from failed[0]
    run_epilogue(shell, prep)


def run_epilogue(shell: Any, prep: Prepared) -> None:
    """The cell's statements after its loop, in the kernel (after the merge)."""
    epilogue = prep.code("epilogue", prep.plan.compile_epilogue)
    if epilogue is not None:
        shell.ex(epilogue)


@dataclass
class _Tail:
    """What finishing a started loop needs: merging its results, the summary,
    keeping (also when a background run finishes in a later cell)."""

    shell: Any
    gc: Any
    prep: Prepared
    loop: _Loop
    record: Any
    req: CellRequest
    keeping: Any
    kept: list[tuple[int, int]]
    advice: Any
    cost_key: Any
    random_said: str = ""


def _runs_at_once(
    loop: _Loop, advice: Any, kept: list[tuple[int, int]], req: CellRequest
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


def _conclude(t: _Tail, results: list[Any]) -> None:
    """Every iteration finished: merge (all or nothing), bind the loop's last
    item, let the kept chunks go, say how it went.  (The epilogue is next.)"""
    record, keeping, kept, loop = t.record, t.keeping, t.kept, t.loop
    if not t.random_said and record.drew:
        _warn_hidden_draws(record.drew)
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
        _merge(ns, t.prep.plan, results, loop)
        _bind_last_item(ns, t.prep, loop)
    except BaseException as e:
        # every chunk finished: keep them all, so a fixed namespace (the
        # error says what) merges with --resume without running anything
        if not kept and results:
            keeping.failed(type(e).__name__)
        raise
    keeping.merged()
    if not t.req.quiet:
        print(record.summary())


def _inside_layers(
    shell: Any, prep: Prepared, k: int, inner: Callable[[], None]
) -> None:
    """Run ``inner`` inside the ``with`` blocks around the loop, from the ``k``-th,
    entered in the kernel with Python's own semantics (a context that swallows an
    exception swallows it here too); each block's statements before and after
    the loop run inside it, as serially."""
    import contextlib

    layers = prep.plan.layers
    if k == len(layers):
        inner()
        return
    layer, ns = layers[k], shell.user_ns
    with contextlib.ExitStack() as stack:
        for i, item in enumerate(layer.node.items):
            code = prep.code(
                f"with {k}.{i}",
                lambda item=item: compile(
                    ast.Expression(item.context_expr), prep.plan.filename, "eval"
                ),
            )
            entered = stack.enter_context(eval(code, ns))
            if item.optional_vars is not None:
                bind = prep.code(
                    f"as {k}.{i}", lambda item=item: _binder(item, prep.plan.filename)
                )
                ns["__gpucell_entered__"] = entered
                try:
                    exec(bind, ns)
                finally:
                    ns.pop("__gpucell_entered__", None)
        before = prep.code(
            f"before {k}", lambda: prep.plan.compile_statements(layer.before)
        )
        if before is not None:
            shell.ex(before)
        _inside_layers(shell, prep, k + 1, inner)
        after = prep.code(
            f"after {k}", lambda: prep.plan.compile_statements(layer.after)
        )
        if after is not None:
            shell.ex(after)


def _binder(item: ast.withitem, filename: str) -> Any:
    """Code binding a ``with ... as target`` to what the context entered gave."""
    assert item.optional_vars is not None
    target = copy.deepcopy(item.optional_vars)
    value = ast.copy_location(ast.Name("__gpucell_entered__", ast.Load()), target)
    stmt = ast.copy_location(ast.Assign(targets=[target], value=value), target)
    module = ast.fix_missing_locations(ast.Module(body=[stmt], type_ignores=[]))
    return compile(module, filename, "exec")


def _warn_random(
    plan: Any, req: CellRequest, inputs: dict[str, Any], ns: dict[str, Any]
) -> str:
    """Say when iterations draw from a process-wide random generator: in the
    loop's own text, in a notebook function it calls, or in a torch model in
    training mode with dropout.  Each engine's generator is its own, so the
    numbers differ from a serial run.  (Shown with ``--quiet`` too: it says
    the results will differ, not how the run went.)"""
    if req.seed is not None:
        return "seeded"
    from gpucell.core.globalreads import global_random_calls

    lines = {info.name: info.line for info in plan.names}
    # (line, text) of each draw; seeds in the body apart
    draws = [(n, f"`{c}` (line {n})") for n, c in plan.random_calls if not _seeds(c)]
    seeds = [(n, c) for n, c in plan.random_calls if _seeds(c)]
    draws += [
        (
            lines.get(via, 0),
            f"`{call}` in `{fn}` (called at line {lines.get(via, '?')})",
        )
        for via, fn, call in global_random_calls(inputs, ns)
    ]
    models = [name for name, value in inputs.items() if _draws_in_training(value)]
    draws += [
        (
            lines.get(name, 0),
            f"`{name}`'s dropout in training mode (line {lines.get(name, '?')})",
        )
        for name in models
    ]
    if (
        seeds
        and _top_of_body(plan, seeds[0][0])
        and all(n > seeds[0][0] for n, _ in draws)
    ):
        # every iteration reseeds before it draws: its numbers are the serial
        # ones; only the kernel's generator is not where the loop left it
        line, call = seeds[0]
        after = _draws_after_the_loop(plan)
        if after is not None:
            print(
                f"gpucell: warning: each iteration seeds its generator (`{call}`, "
                f"line {line}), so the loop's numbers are those of a serial run, but "
                f"the kernel's generator is left as it was before the cell, and "
                f"`{after[1]}` after the loop (line {after[0]}) draws other numbers "
                "than serially. Reseed right after the loop."
            )
            return "reseeds"
        print(
            f"gpucell: note: each iteration seeds its generator (`{call}`, line "
            f"{line}) before drawing, so its numbers are those of a serial run; "
            "the kernel's generator is left as it was before the cell, not where "
            "the last iteration left it (reseed before drawing in a later cell)."
        )
        return "reseeds"
    calls = [text for _, text in sorted(draws)] + [
        f"`{c}` (line {n})" for n, c in seeds
    ]
    if calls:
        hint = (
            f" (`{models[0]}` only evaluated in the loop: call `{models[0]}.eval()` "
            "before it)"
            if models
            else ""
        )
        print(
            f"gpucell: warning: {', '.join(calls)} draw(s) from a global random "
            "generator: each engine's is its own, so the numbers differ from a "
            "serial run and with the number of engines. `%%gpu_parallel --seed S` "
            f"makes them depend only on S and the iteration{hint}."
        )
        return "warned"
    return ""


def _warn_set_order(prep: Prepared) -> None:
    """A set's order given to something ordered in the body (``list(set(words))``):
    for strings it follows the process's hash seed, and each engine has its
    own (unless ``PYTHONHASHSEED`` fixes it for the kernel, whose environment
    the engines it starts inherit)."""
    import os

    from gpucell.core.lastitem import set_orders

    plan = prep.plan
    if plan.kind != "for" or plan.loop_lines is None:
        return
    if os.environ.get("PYTHONHASHSEED", "random") != "random":
        return
    lines = prep.code("set orders", lambda: set_orders(plan.source, plan.loop_lines[0]))
    if lines:
        where = ", ".join(map(str, lines))
        print(
            f"gpucell: warning: line(s) {where} give a set's order to something "
            "ordered (a list, a join, a loop): a set of strings iterates in an "
            "order that follows each process's hash seed, so each engine's can "
            "differ from a serial run's. Sort it (`sorted(...)`), or keep "
            "first-seen order with `list(dict.fromkeys(...))`."
        )


def _warn_hidden_draws(drew: set[str]) -> None:
    """The engines saw the loop draw from a process-wide generator that no
    line of the cell names (a library's own draw: ``DataLoader(shuffle=True)``,
    a layer's initialisation, an estimator without ``random_state``)."""
    names = {"random": "`random`'s", "numpy": "numpy's", "torch": "torch's"}
    which = " and ".join(names.get(g, g) for g in sorted(drew))
    print(
        f"gpucell: warning: the loop drew from {which} global random generator "
        "inside a call (an unseeded DataLoader(shuffle=True), a layer's "
        "initialisation, an estimator without random_state...): each engine's "
        "generator is its own, so the numbers differ from a serial run and with "
        "the number of engines. `%%gpu_parallel --seed S` makes them depend only "
        "on S and the iteration; or seed at the top of the loop body."
    )


def _draws_after_the_loop(plan: Any) -> tuple[int, str] | None:
    """``(line, call)`` of the first draw from a global generator in the code
    after the loop (the cell's epilogue), if any."""
    from gpucell.core.analysis.scope import is_global_random
    from gpucell.core.lastitem import dotted_name

    if not plan.epilogue_source.strip() or plan.epilogue_lines is None:
        return None
    try:
        tree = ast.parse(plan.source)
    except SyntaxError:
        return None
    first, last = plan.epilogue_lines
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and first <= node.lineno <= last:
            text = dotted_name(node.func)
            if text is not None and is_global_random(text):
                return node.lineno, text
    return None


def _top_of_body(plan: Any, line: int) -> bool:
    """Line ``line`` is a statement of the loop body itself (not under an
    ``if`` or an inner loop): it runs in every iteration."""
    from gpucell.core.lastitem import loop_node

    if plan.kind != "for" or plan.loop_lines is None:
        return False
    loop = loop_node(plan.source, plan.loop_lines[0])
    return loop is not None and any(
        isinstance(st, ast.Expr) and st.lineno == line for st in loop.body
    )


def _seeds(call: str) -> bool:
    """``random.seed``, ``np.random.seed``, ``torch.manual_seed``: a call that
    resets a global generator rather than drawing from it."""
    return call.rsplit(".", 1)[-1] in ("seed", "manual_seed")


def _draws_in_training(value: Any) -> bool:
    """A torch module in training mode with a layer that draws random numbers
    on every call (dropout with p > 0, RReLU)."""
    torch = sys.modules.get("torch")
    nn = getattr(torch, "nn", None)
    if nn is None or not isinstance(value, nn.Module) or not value.training:
        return False
    dropout = getattr(getattr(nn.modules, "dropout", None), "_DropoutNd", None)
    rrelu = getattr(nn, "RReLU", None)
    for m in value.modules():
        if not m.training:
            continue
        if isinstance(dropout, type) and isinstance(m, dropout) and m.p > 0:
            return True
        if isinstance(rrelu, type) and isinstance(m, rrelu):
            return True
    return False


def _run_without_cluster(shell: Any, src: str, filename: str) -> None:
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


@dataclass(frozen=True)
class _Loop:
    """The loop as the prelude left it: its iterations and what it reads."""

    chunker: Any
    inputs: dict[str, Any]
    shapes: Any  # what its cost scales with (gpucell.core.costmodel.shape_of)
    values: tuple[Any, ...] = ()  # the iterable's parts, as evaluated


def _start_loop(shell: Any, prep: Prepared) -> _Loop:
    """Evaluate the loop's iterable and gather its inputs (the prelude ran)."""
    from gpucell.core.analysis import make_chunker
    from gpucell.core.costmodel import shape_of

    ns, plan = shell.user_ns, prep.plan
    space = plan.iter_space
    leaves = prep.code(
        "leaves",
        lambda: [compile(leaf, plan.filename, "eval") for leaf in space.leaves],
    )
    values = [eval(code, ns) for code in leaves]
    _refuse_interleaved_generators(plan, values, ns)
    _refuse_duplicate_labels(plan, ns)
    # a lazy iterable's items are all drawn before any iteration runs (serially
    # each after the iterations before it): what drawing them changes in the
    # notebook is checked below
    lazy = [v for v in values if hasattr(type(v), "__next__")]
    drawn_from = _input_fingerprints(plan, ns) if lazy else None
    chunker = make_chunker(space, values)
    if drawn_from is not None:
        _refuse_inputs_changed_by_drawing(plan, ns, drawn_from, lazy)
    inputs = {name: ns[name] for name in plan.inputs if name in ns}
    _refuse_helpers_reading_what_the_loop_changes(plan, ns, inputs)
    _refuse_one_file_written_by_every_iteration(prep, ns)
    _refuse_process_state_changes(prep)
    _refuse_unions_of_other_types(plan, ns)
    _refuse_inputs_shared_with_sinks(plan, ns, inputs, values)
    _refuse_contexts_that_cannot_travel(plan, ns)
    _refuse_rows_that_are_not_own(plan, ns)
    shapes = (
        tuple(shape_of(v) for v in values),
        tuple((k, shape_of(v)) for k, v in sorted(inputs.items())),
    )
    return _Loop(chunker, inputs, shapes, tuple(values))


def _programs(
    gc: Any, targets: list[int], prep: Prepared, cpu: Prepared, req: CellRequest
) -> dict[int, Any]:
    """Each engine's chunk program: CPU engines get the CUDA-rewritten one."""
    if cpu is not prep and "cpu" in {gc.engines[e].kind for e in targets}:
        if cpu.plan.cuda_rewritten and not req.quiet:
            lines = ", ".join(map(str, cpu.plan.cuda_lines))
            print(
                f"gpucell: CPU engines run the CUDA code of line(s) {lines} on the "
                "CPU (their device has no GPU)."
            )
    else:
        cpu = prep
    out = {}
    for e in targets:
        p = cpu if gc.engines[e].kind == "cpu" else prep
        out[e] = p.code("program", p.plan.engine_program)
    return out


def _run_loop(
    shell: Any,
    gc: Any,
    targets: list[int],
    programs: dict[int, Any],
    prep: Prepared,
    loop: _Loop,
    advice: Any,
    record: Any,
    req: CellRequest,
    keeping: Any = None,
    kept: list[tuple[int, int]] | None = None,
) -> list[Any]:
    """Every iteration, in the kernel (when advised) or on the engines; with
    ``kept``, only those an earlier run did not finish."""
    from gpucell.kernel.inline import run_in_kernel

    if loop.chunker.count == 0:
        record.status = "ok"
        return []
    if advice.inline and not kept and req.checkpoint is None:
        program = prep.code("program", prep.plan.engine_program)
        return run_in_kernel(program, loop.inputs, loop.chunker, record)
    return _run_with_display(
        shell,
        gc,
        targets,
        programs,
        loop,
        _options(advice, req),
        record,
        req.quiet,
        kept=kept or (),
        on_chunk=keeping.add if keeping is not None else None,
    )


def _options(advice: Any, req: CellRequest) -> Any:
    """The dispatcher's options for this cell (its line, its last run)."""
    from gpucell.kernel.dispatch import Options

    return Options(
        cost_hint=advice.per_iteration,
        uniform=advice.uniform,
        profile=advice.profile,
        schedule=req.schedule or _config.settings().schedule,
        chunksize=req.chunksize,
        seed=req.seed,
        timeout=req.timeout,
        retries=req.retries,
    )


def _refuse_interleaved_generators(
    plan: Any, values: list[Any], ns: dict[str, Any] | None = None
) -> None:
    """A generator whose items depend on what the body changes (``yield len(out)``
    while the body appends to ``out``) interleaves with the body serially; here
    its items are all drawn first, so they would differ.  Refused before the
    loop runs (the prelude has run, as it would serially)."""
    import types

    from gpucell.core.globalreads import generator_reads
    from gpucell.errors import NotParallelizable

    changed = set(plan.affected_names) | set(plan.locals)
    for value in values:
        code = getattr(value, "gi_code", None)
        if not isinstance(value, types.GeneratorType) or code is None:
            continue
        # globals notebook code reads (never attribute names: iterrows reads
        # `self.index`, no global `index`), and what the generator was given
        reads = {r.name for r in generator_reads(value, ns or {}, changed)}
        if reads:
            names = ", ".join(f"`{n}`" for n in sorted(reads))
            raise NotParallelizable(
                f"%%gpu_parallel: the loop iterates over the generator "
                f"`{code.co_name}`, which reads {names}, which the loop body "
                f"changes (line {plan.loop_lines[0]}): serially each item is made "
                "after the iterations before it, here all items are made first, so "
                "they would differ. Build the items first (`items = list(...)` in a "
                "cell of its own, then loop over `items`), or run the cell without "
                "%%gpu_parallel. Nothing from the loop ran."
            )


def _input_fingerprints(plan: Any, ns: dict[str, Any]) -> dict[str, Any]:
    from gpucell.protocol.fingerprint import fingerprint

    return {n: fingerprint(ns[n]) for n in plan.inputs if n in ns}


def _refuse_inputs_changed_by_drawing(
    plan: Any, ns: dict[str, Any], before: dict[str, Any], lazy: list[Any]
) -> None:
    """Drawing a generator's items changed a name the body reads (``def
    gen(): log.append(...); yield ...`` while the body reads ``len(log)``):
    serially each iteration sees what the items drawn before it changed; here
    every item was drawn first.  (An input without a fingerprint, an object
    gpucell cannot summarise, is not checked.)"""
    from gpucell.errors import NotParallelizable

    after = _input_fingerprints(plan, ns)
    changed = sorted(
        n
        for n, fp in before.items()
        if fp is not None and (n not in after or after[n] != fp)
    )
    if not changed:
        return
    what = getattr(getattr(lazy[0], "gi_code", None), "co_name", None)
    source = f"the generator `{what}`" if what else f"a {type(lazy[0]).__name__}"
    names = ", ".join(f"`{n}`" for n in changed)
    raise NotParallelizable(
        f"%%gpu_parallel: drawing the loop's items from {source} changed {names}, "
        f"which the loop body reads (line {plan.loop_lines[0]}): serially each "
        "iteration sees what drawing the items before it changed; here every item "
        "is drawn first, so the iterations would see another value. Draw the items "
        "in a cell of their own (`items = list(...)`) and loop over `items`, or run "
        "the cell without %%gpu_parallel. The items were drawn (as serially, the "
        "generator ran); nothing of the loop body ran."
    )


def _refuse_helpers_reading_what_the_loop_changes(
    plan: Any, ns: dict[str, Any], inputs: dict[str, Any]
) -> None:
    """A function defined in the notebook that the loop calls and that reads a
    global the loop changes (``def is_new(t): return t not in uniq`` while the
    loop appends to ``uniq``): serially each call sees what the iterations
    before it left there; on an engine the function reads a copy from before
    the loop.  The cell's text does not show it, so the functions' code is
    read here, before anything runs."""
    from gpucell.core.globalreads import global_reads
    from gpucell.errors import NotParallelizable

    changed = {
        *plan.locals,
        *plan.affected_names,
        *plan.deep_writes,
    }
    found = global_reads(inputs, ns, changed) if changed else []
    if not found:
        return
    lines = {info.name: info.line for info in plan.names}
    r = found[0]
    what = (
        f"`{r.via}`" if r.function == r.via else f"`{r.via}` (through `{r.function}`)"
    )
    raise NotParallelizable(
        f"%%gpu_parallel: {what}, called at line {lines.get(r.via, '?')}, reads the "
        f"global `{r.name}`, which the loop changes (line "
        f"{lines.get(r.name, plan.loop_lines[0])}). Serially each call sees what "
        f"the iterations before it left in `{r.name}`; on an engine the function "
        f"reads `{r.name}` as it was before the loop, so the results would differ. "
        f"Pass `{r.name}` to the function as an argument (the loop's own code then "
        "shows the dependence), or run the cell without %%gpu_parallel. Nothing "
        "from the loop ran."
    )


def _refuse_process_state_changes(prep: Prepared) -> None:
    """``os.chdir``, ``pd.set_option``, ``torch.set_default_dtype`` in the
    body: serially later iterations (and the kernel) see the change; on an
    engine it changes that process only, and stays for its later cells."""
    from gpucell.core.lastitem import process_state_calls
    from gpucell.errors import NotParallelizable

    plan = prep.plan
    if plan.kind != "for" or plan.loop_lines is None:
        return
    found = prep.code(
        "process state",
        lambda: process_state_calls(plan.source, plan.loop_lines[0]),
    )
    if found:
        line, call = found[0]
        raise NotParallelizable(
            f"%%gpu_parallel: line {line} calls `{call}`, which changes state of "
            "the whole process: serially the iterations after it and the "
            "notebook see the change; each engine would change only its own "
            "process, and keep it for later cells. Use its `with` form where "
            "there is one (`np.errstate`, `pd.option_context`, `torch.no_grad`), "
            "pass what the call sets as an argument instead (`dtype=`), or run "
            "the cell without %%gpu_parallel. Nothing from the loop ran."
        )


def _helper_file_write(plan: Any, ns: dict[str, Any]) -> tuple[str, int, str] | None:
    """A notebook function the loop calls that writes one fixed file."""
    import inspect
    import types

    from gpucell.core.lastitem import helper_file_writes

    for name in plan.inputs:
        fn = ns.get(name)
        if not (
            isinstance(fn, types.FunctionType)
            and getattr(fn, "__module__", None) == "__main__"
        ):
            continue
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError):
            continue
        found = helper_file_writes(source)
        if found:
            line, path = found[0]
            return name, line, path
    return None


def _refuse_one_file_written_by_every_iteration(
    prep: Prepared, ns: dict[str, Any]
) -> None:
    """``open("log.txt", "a")`` in the body, the path the same in every
    iteration: serially the file ends with the lines in iteration order (or,
    for ``"w"``, the last iteration's content); engines writing it at once
    would leave another order or another iteration's content."""
    from gpucell.core.lastitem import shared_file_writes
    from gpucell.errors import NotParallelizable

    plan = prep.plan
    if getattr(ns.get("open"), "__module__", None) == "__main__":
        return  # (`open` defined in the notebook: not the builtin's, nor IPython's)
    helper = _helper_file_write(plan, ns)
    if helper is not None:
        name, line, path = helper
        raise NotParallelizable(
            f"%%gpu_parallel: `{name}`, which the loop calls, opens `{path}` for "
            f"writing (line {line} of `{name}`), the same file at every call: "
            "serially it ends with what the iterations wrote in order; calls on "
            "engines at once would write it in another order. Return what to "
            "write and collect it in the loop (`lines.append(...)`), then write "
            "the file once after it, or give each call its own file. Nothing from "
            "the loop ran."
        )
    if plan.kind != "for" or plan.loop_lines is None:
        return
    found = prep.code(  # (a re-run does not parse the cell again)
        "shared file writes",
        lambda: shared_file_writes(plan.source, plan.loop_lines[0]),
    )
    if found:
        line, path = found[0]
        raise NotParallelizable(
            f"%%gpu_parallel: line {line} opens `{path}` for writing in every "
            "iteration (or in a loop inside it), the same file each time: serially "
            "it ends with what the "
            "iterations wrote in order (or the last one's, for mode 'w'); engines "
            "writing it at once would leave another order or another iteration's "
            "content. Collect what to write in a list in the loop "
            "(`lines.append(...)`) and write the file once after it, or give each "
            "iteration its own file (a path built from the loop variable). "
            "Nothing from the loop ran."
        )


def _refuse_unions_of_other_types(plan: Any, ns: dict[str, Any]) -> None:
    """``x.add(...)``/``x.update(...)`` in the body is merged as a set union or
    a dict update; on any other object (a notebook class, ``hashlib``'s
    hashes, a tqdm bar) the method does something the merge cannot replay
    exactly, so the loop is refused before it runs."""
    from gpucell.errors import NotParallelizable

    lines = {info.name: info.line for info in plan.names}
    for name in plan.unions:
        # (Counter, OrderedDict, defaultdict and other subclasses included)
        if name not in ns or isinstance(ns[name], (set, dict)):
            continue
        kind = type(ns[name])
        where = (
            "defined in this notebook"
            if kind.__module__ == "__main__"
            else (f"from `{kind.__module__}`")
        )
        raise NotParallelizable(
            f"%%gpu_parallel: `{name}.add(...)`/`{name}.update(...)` (line "
            f"{lines.get(name, plan.loop_lines[0])}) changes `{name}`, a "
            f"`{kind.__name__}` ({where}). gpucell merges `.add`/`.update` only "
            "on sets, dicts and Counters, replaying them in iteration order; "
            "another object's method would run on each engine's copy. Collect "
            f"the arguments in a list in the loop (`args.append(...)`) and call "
            f"`{name}.update` on each after the loop, or run the cell without "
            "%%gpu_parallel. Nothing from the loop ran."
        )


def _refuse_inputs_shared_with_sinks(
    plan: Any, ns: dict[str, Any], inputs: dict[str, Any], values: list[Any]
) -> None:
    """An input that is, holds or shares memory with an object the loop changes
    (``y = out`` in an earlier cell): serially iterations see earlier ones'
    changes through it, on an engine it is a copy from before the loop."""
    from gpucell.core.aliasing import shared_with_sinks
    from gpucell.errors import NotParallelizable

    growing = [
        *plan.gathers,
        *plan.unions,
        *(k for k, _ in plan.keyed),
        *plan.keyed_gathers,
        *(r.name for r in plan.reductions),
    ]
    sinks = {n: ns[n] for n in (*growing, *plan.writes) if n in ns}
    found = shared_with_sinks(
        sinks, inputs, frozenset(getattr(plan, "deep_writes", ()))
    )
    iterable = {n: ns[n] for n in growing if n in ns}
    found += [
        s._replace(input="the loop's iterable")
        for v in values
        for s in shared_with_sinks(iterable, {"": v})
    ]
    if not found:
        return
    lines = {info.name: info.line for info in plan.names}
    s = found[0]
    named = s.input != "the loop's iterable"
    reader = f"`{s.input}`" if named else s.input
    copy_hint = (
        f"`{s.input} = copy.copy({s.input})`" if named else "`items = list(...)`"
    )
    raise NotParallelizable(
        f"%%gpu_parallel: {reader} {s.how} `{s.sink}`, which the loop changes "
        f"(line {lines.get(s.sink, plan.loop_lines[0])}). Serially each iteration "
        f"would see through {reader} what the iterations before it changed; on an "
        "engine it is a copy from before the loop, so the results would differ. "
        f"Make a copy before the loop ({copy_hint}), or run the cell without "
        "%%gpu_parallel. Nothing from the loop ran."
    )


def _refuse_contexts_that_cannot_travel(plan: Any, ns: dict[str, Any]) -> None:
    """Engines re-enter each ``with`` item around the loop; one whose object
    cannot travel (a lock, an open file, a transaction) is refused by name,
    before anything is sent (the kernel is inside it now, as serially)."""
    from gpucell.errors import NotParallelizable
    from gpucell.protocol import wire

    for layer in plan.layers:
        for item in layer.node.items:
            if item.optional_vars is not None:
                continue
            for node in ast.walk(item.context_expr):
                if not isinstance(node, ast.Name) or node.id not in ns:
                    continue
                value = ns[node.id]
                try:
                    wire.dumps(value)
                except Exception as e:
                    raise NotParallelizable(
                        f"%%gpu_parallel: `with {ast.unparse(item.context_expr)}:` "
                        f"(line {layer.node.lineno}) is entered again on every "
                        f"engine around its share of the loop, but `{node.id}` (a "
                        f"{type(value).__name__}) cannot travel to an engine ({e}), "
                        "and a copy would not be the same context anyway (a lock "
                        "guards only the kernel, a file or transaction is open only "
                        "there). Keep the `with` around the statements that need it "
                        "and put the loop outside it, create the context inside the "
                        "loop body (each iteration gets its own), or run the cell "
                        "without %%gpu_parallel. Nothing from the loop ran."
                    ) from None


def _drop_gone_inputs(gc: Any, ns: dict[str, Any]) -> None:
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


def _first_stride(array: Any) -> int:
    from gpucell.protocol.fold import is_torch

    return int(array.stride(0) if is_torch(array) else array.strides[0])


def _refuse_rows_that_are_not_own(plan: Any, ns: dict[str, Any]) -> None:
    """Own-row writes (``C[i][j] += ...``) are serial-equivalent only when no two
    rows are one object (``[[0] * m] * n`` makes n names for one list: serially
    a write to one row shows in all) and, for whole-element writes, when the
    elements are values (a list element changed by ``+=`` keeps its identity
    serially, which a copy from an engine would not)."""
    from gpucell.core.aliasing import first_mutable_element, first_shared_element
    from gpucell.errors import NotParallelizable
    from gpucell.protocol.fold import is_numpy, is_torch

    for row in plan.own_rows:
        target = ns.get(row.name)
        if target is None:
            continue
        where = f"`{row.name}` (line {row.line})"
        problem = None
        if row.mode == "row":
            kind = type(target).__name__
            if not isinstance(target, (list, dict)) and not (
                is_numpy(target) or is_torch(target)
            ):
                problem = (
                    f"{where} is a {kind}; gpucell writes the rows of lists, dicts, "
                    "numpy arrays and tensors"
                )
            elif (is_numpy(target) or is_torch(target)) and (
                target.ndim == 0 or _first_stride(target) == 0
            ):
                problem = f"{where} repeats one row in memory (a broadcast view)"
            else:
                pair = first_shared_element(target)
                if pair is not None:
                    a, b = pair
                    problem = (
                        f"`{row.name}[{a!r}]` and `{row.name}[{b!r}]` are the same "
                        "object (as `[[0] * m] * n` makes them), so serially a write "
                        "to one row shows in the other. Build the rows separately "
                        "(`[[0] * m for _ in range(n)]`)"
                    )
        elif is_numpy(target) or is_torch(target):
            # serially `y[i] = v` stores v cast to the array's dtype and a later
            # `y[i]` reads the cast value back; an engine's private element is
            # a plain value, so an int or float32 array would read back more
            # than it stored: numbers that differ without a word
            problem = (
                f"{where} is a {type(target).__name__} whose elements the loop "
                "assigns whole and reads back; the array would cast each value "
                "to its dtype, an engine's private copy would not. Accumulate in "
                f"a local and store it once (`acc = 0.0`, ..., `{row.name}[i] = "
                "acc`)"
            )
        elif isinstance(target, (list, dict)):
            key = first_mutable_element(target)
            if key is not None:
                problem = (
                    f"{where} holds a {type(target[key]).__name__} at "
                    f"`{row.name}[{key!r}]`, and the loop assigns whole elements "
                    "and reads them back; serially such an element keeps its "
                    "identity, which a copy from an engine would not"
                )
        if problem is not None:
            raise NotParallelizable(
                f"%%gpu_parallel: {problem}. Or run the cell without "
                "%%gpu_parallel. Nothing from the loop ran."
            )


def _refuse_duplicate_labels(plan: Any, ns: dict[str, Any]) -> None:
    """Rows written by label (``df.at[idx, "c"] = ...`` in ``df.iterrows()``) are
    each iteration's own only when no two rows share a label."""
    from gpucell.errors import NotParallelizable

    for name in plan.writes:
        value = ns.get(name)
        # rows by the index; a DataFrame's columns too (`for col, s in
        # df.items(): df[col] = ...`)
        for axis, what, fix in (
            ("index", "rows", f"`{name} = {name}.reset_index(drop=True)`"),
            ("columns", "columns", f"`{name}.columns = [...]`"),
        ):
            labels = getattr(value, axis, None)
            if labels is not None and getattr(labels, "is_unique", True) is False:
                raise NotParallelizable(
                    f"%%gpu_parallel: `{name}` is written by label and its {axis} "
                    f"has duplicate labels, so two iterations may write the same "
                    f"{what} (and serially a later one could read what an earlier "
                    f"one wrote). Make the labels unique ({fix}), or run the cell "
                    "without %%gpu_parallel. Nothing from the loop ran."
                )


def _bind_last_item(ns: dict[str, Any], prep: Prepared, loop: _Loop) -> None:
    """The loop variable is the kernel's own last item, as serially (the same
    object, not an engine's equal copy), when the body never rebinds it
    (``core/lastitem.py``)."""
    from gpucell.core.lastitem import LAST_ITEM, last_item_binding
    from gpucell.protocol.chunks import chunk_items

    plan, n = prep.plan, loop.chunker.count
    if plan.kind != "for" or not n or plan.loop_lines is None:
        return
    # an item read from an object the loop changed (`for i, x in enumerate(a):
    # a[i] = ...`) is not what the last iteration saw: the engine's value stays
    changed = {*plan.affected_names, *(r.name for r in plan.own_rows)}
    if plan.iter_space is None or changed & _identifiers(
        " ".join(plan.iter_space.leaves)
    ):
        return
    code = prep.code(
        "last item",
        lambda: last_item_binding(plan.source, plan.loop_lines[0], plan.filename),
    )
    if code is None:
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


def _item_of(chunker: Any) -> Any:
    """The kernel's own item of an iteration, as the loop yields it (what an
    iteration's changes to its item are written back into)."""
    from gpucell.protocol.chunks import chunk_items

    def item_of(iteration: int) -> Any:
        return next(iter(chunk_items(chunker.chunk(iteration, iteration + 1))))

    return item_of


def _merge(ns: dict[str, Any], plan: Any, results: list[Any], loop: Any = None) -> None:
    """All or nothing: validate every result against the namespace, then write."""
    from gpucell.core import merge
    from gpucell.kernel.interrupts import interrupts_deferred

    item_of = None
    if loop is not None:
        merge.check_exactly_once(results, loop.chunker.count)
        item_of = _item_of(loop.chunker)

    current = {n: ns[n] for n in plan.affected_names if n in ns}
    update = merge.prepare(  # an interrupt here changes nothing
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


def _run_with_display(
    shell: Any,
    gc: Any,
    targets: list[int],
    programs: dict[int, Any],
    loop: _Loop,
    options: Any,
    record: Any,
    quiet: bool,
    kept: Any = (),
    on_chunk: Any = None,
) -> list[Any]:
    """The dispatcher's run, watched by the live display (widget or text line)."""
    watched = Watched(
        shell, gc, targets, programs, loop, options, record, quiet, kept, on_chunk
    )
    try:
        watched.run.ship_inputs()
        return list(watched.run.execute())
    finally:
        watched.close()


class Watched:
    """A dispatcher's :class:`~gpucell.kernel.dispatch.Run` with its live display
    (widget or text line), its telemetry and the Lab panel's view of it.  The
    foreground drives it to its end at once; a background run step by step
    (``relay``/``echo``: where its engine output and notes go; ``display``: a
    display of its own instead of the usual one)."""

    def __init__(
        self,
        shell: Any,
        gc: Any,
        targets: list[int],
        programs: dict[int, Any],
        loop: _Loop,
        options: Any,
        record: Any,
        quiet: bool,
        kept: Any = (),
        on_chunk: Any = None,
        *,
        relay: Callable[[str], None] | None = None,
        echo: Callable[[str], None] = print,
        display: Any = None,
    ) -> None:
        from gpucell.kernel import panel
        from gpucell.kernel.dispatch import Run
        from gpucell.kernel.telemetry import for_cluster
        from gpucell.ui.model import initial_snapshot
        from gpucell.ui.progress import make_progress

        first = initial_snapshot([gc.engines[e] for e in targets], loop.chunker.count)
        self.tele = None if quiet else for_cluster(gc, targets)
        self.display = (
            display
            if display is not None
            else make_progress(shell, first, self.tele, quiet)
        )
        self.last = first
        self._closed = False
        panel.run_started(self.tele)
        panel.run_progress(first)
        try:
            self.run = Run(
                gc,
                targets,
                programs=programs,
                inputs=loop.inputs,
                n=loop.chunker.count,
                chunk_of=loop.chunker.chunk,
                options=options,
                record=record,
                echo=echo,
                progress=self.on_progress,
                telemetry=self.tele,
                relay=relay or getattr(self.display, "write_above", None),
                watch=(
                    record.plan.watched()
                    if record.plan is not None and _config.settings().check_inputs
                    else None
                ),
                kept=kept,
                on_chunk=on_chunk,
                drop_inputs=lambda name: name not in shell.user_ns,
                cache_bytes=_config.settings().engine_cache_bytes,
                namespace=shell.user_ns,
            )
        except BaseException:
            self.close()
            raise

    def on_progress(self, snap: Any) -> None:
        from gpucell.kernel import panel

        self.last = snap
        self.display.update(snap)
        panel.run_progress(snap)

    def close(self) -> None:
        """The display's final figures, the panel told, telemetry stopped (once)."""
        if self._closed:
            return
        self._closed = True
        from gpucell.kernel import panel

        try:
            self.display.close(self.last)
        finally:
            panel.run_ended(self.last)
            if self.tele is not None:
                self.tele.close()


@dataclass
class Prepared:
    """A cell's plan and the code compiled from it, kept together so a re-run
    compiles nothing and dropping the plan drops its code."""

    plan: Any  # gpucell.core.analysis.LoopPlan
    codes: dict[str, Any] = field(default_factory=dict)

    def code(self, what: str, make: Callable[[], Any]) -> Any:
        if what not in self.codes:
            self.codes[what] = make()
        return self.codes[what]


class PlanCache:
    """Plans of the cells run lately (least recently used dropped): a plan
    depends only on the cell's text and on which of its names exist."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._entries: OrderedDict[Any, Prepared] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(
        self,
        src: str,
        filename: str,
        ns: dict[str, Any],
        *,
        for_cpu: bool,
        dry_run: bool,
        exclude: frozenset[str] = frozenset(),
    ) -> Prepared:
        from gpucell.core.analysis import analyse

        known = frozenset(_identifiers(src) & ns.keys()) - exclude
        key = (src, filename, for_cpu, not dry_run, known)
        prep = self._entries.get(key)
        if prep is None:
            plan = analyse(
                src,
                filename=filename,
                known_names=known,
                for_cpu=for_cpu,
                raise_errors=not dry_run,
            )
            prep = self._entries[key] = Prepared(plan)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        return prep


_PLANS = PlanCache()


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
