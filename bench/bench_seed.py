"""``--seed`` cost benchmark (issue 34): a numpy-only loop, torch loaded on the
engines, with and without ``--seed``.

Why.  ``--seed S`` reseeds the process-wide generators before every iteration
(so iteration ``i``'s draws depend only on ``(S, i)``).  Once torch was loaded on
the engines that cost 0.4-0.5 ms per iteration, even for a loop that never
touches torch: a cheap loop became ~100 times slower with ``--seed``.  The
engines now reseed only the generators the loop can reach
(``gpucell.core.seeding``); this bench says what ``--seed`` costs.

The loop (``--n`` N, 20,000 by default), on 2 CPU engines that imported torch::

    out = []
    for i in range(N):
        out.append(np.random.random())

The ratio the issue asks for (within 10%) is not reachable for this loop by
an exact reseed: its body costs ~0.35 us an iteration, and numpy's legacy
seeding of MT19937 (624 words, a serial dependency chain in C) costs ~1.2 us
by itself, before the first draw regenerates the 624 words.  The per-
generator table says what each reseed costs and what the floor is.

Rows, in one run: the cell's wall time (``ip.run_cell``, median of ``--runs``
rounds after an untimed first one; the three ways interleaved, so a change in
the host's load hits them alike) and the engines' compute seconds summed over
chunks (``gpucell.last_run``): without ``--seed``; with ``--seed 7`` reseeding
every generator (what the engines did before: the kernel's decision replaced
by "all"); with ``--seed 7`` reseeding what the kernel decided.  Then the chunk
program alone in this process (no messages, no other engine): microseconds per
iteration each way.  Every seeded run is checked against the serial loop
seeded per iteration as the engines seed it.

Then, per generator, microseconds per call of the engines' seeder alone
(thread time, median of rounds): ``random``, ``numpy``, ``torch``, all three,
and numpy's floor (``MT19937._legacy_seeding`` alone, and with one draw).

Usage:  python bench/bench_seed.py [--n 20000] [--runs 5] [--label after]
Results: a table on stdout and ``bench/results/seed-<label>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
import warnings
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

CELL = (
    "# bench_seed {tag}\nout = []\nfor i in range({n}):\n"
    "    out.append(np.random.random() + sum(range(WORK)))\n"
)


def _import_torch() -> bool:
    import torch  # noqa: F401

    return True


def _serial_seeded(n: int, seed: int, work: int = 0) -> list[float]:
    """The serial loop, each iteration seeded as the engines seed it."""
    import numpy as np

    from gpucell.engine.worker import _seeder

    seed_fn = _seeder(seed)
    out = []
    for i in range(n):
        seed_fn(i)
        out.append(np.random.random() + sum(range(work)))
    return out


def _run(ip, cell: str, line: str) -> dict:
    import gpucell

    t = time.perf_counter()
    res = ip.run_cell(f"%%gpu_parallel --quiet {line}\n" + cell)
    wall = time.perf_counter() - t
    res.raise_error()
    lr = gpucell.last_run
    done = [c for c in lr.chunks if c.state == "done"]
    return {
        "wall": wall,
        "compute": sum(c.compute for c in done),
        "chunks": len(done),
        "inline": lr.inline,
    }


def _engine_only(n: int, rounds: int, work: int = 0) -> dict[str, float]:
    """Microseconds per iteration of the chunk program alone, in this process
    with torch imported (no messages, no other engine; thread time, so the
    host's load counts less): what each way of seeding adds to the loop's
    own cost."""
    import numpy as np
    import torch  # noqa: F401 - loaded, as on the engines

    from gpucell.core.analysis.driver import analyse
    from gpucell.engine.chunk import Where, run_chunk
    from gpucell.engine.reseed import seeder

    cell = CELL.format(tag="engine", n=n)
    prog = analyse(cell, known_names=["out", "np", "WORK"]).engine_program()
    ways = {
        "no --seed": lambda: None,
        "--seed, every generator (before)": lambda: seeder(7),
        "--seed, numpy only (after)": lambda: seeder(7, ["numpy"]),
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(rounds):
        for name, make in ways.items():
            t = time.thread_time()
            run_chunk(
                prog,
                {"np": np, "WORK": work},
                ("range", range(n)),
                0,
                where=Where({}, 0),
                seed_fn=make(),
                cheap=True,
            )
            times[name].append(time.thread_time() - t)
    return {k: statistics.median(v) / n * 1e6 for k, v in times.items()}


def _per_generator(n: int, rounds: int) -> dict[str, float]:
    """Microseconds per call of the seeder for each generator alone (thread
    time, median of ``rounds``), beside numpy's floor: MT19937's own legacy
    seeding, alone and with the draw that regenerates its words."""
    import numpy as np
    import torch  # noqa: F401 - loaded, as on the engines

    from gpucell.engine.reseed import seeder

    bg = np.random.mtrand._rand._bit_generator
    legacy, draw = bg._legacy_seeding, np.random.random

    def floor(i: int) -> None:
        legacy(i)

    def floor_draw(i: int) -> None:
        legacy(i)
        draw()

    ways = {
        "random": lambda: seeder(7, ["random"]),
        "numpy": lambda: seeder(7, ["numpy"]),
        "torch": lambda: seeder(7, ["torch"]),
        "all three": lambda: seeder(7),
        "floor: MT19937 seeding alone": lambda: floor,
        "floor: MT19937 seeding + 1 draw": lambda: floor_draw,
        "numpy seeder + 1 draw": lambda: _then_draw(seeder(7, ["numpy"]), draw),
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(rounds):
        for name, make in ways.items():
            fn = make()
            t = time.thread_time()
            for i in range(n):
                fn(i)
            times[name].append(time.thread_time() - t)
    return {k: statistics.median(v) / n * 1e6 for k, v in times.items()}


def _then_draw(seed_fn, draw):
    def both(i: int) -> None:
        seed_fn(i)
        draw()

    return both


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--label", default="now")
    ap.add_argument(
        "--work",
        type=int,
        default=0,
        help="the body also sums range(WORK): 0 is the bare draw (~0.35 us an "
        "iteration); 2000 makes a body of some 15-25 us, a small real one",
    )
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from IPython.testing.globalipapp import start_ipython

    import gpucell
    import gpucell.core.seeding as seeding

    decide = seeding.loop_generators
    every = tuple(sorted(seeding.ALL))
    engine = _engine_only(args.n // 2, args.runs, args.work)
    per_generator = _per_generator(args.n // 2, args.runs)
    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpucell")
    ip.run_line_magic("gpu_cluster", "start -n 2 --gpus none")
    ip.run_cell(f"import numpy as np\nWORK = {args.work}")
    ways = {  # (the magic's line, what the kernel decides to reseed)
        "no --seed": ("", decide),
        "--seed, every generator (before)": ("--seed 7", lambda *a: every),
        "--seed, decided (after)": ("--seed 7", decide),
    }
    runs: dict[str, list[dict]] = {k: [] for k in ways}
    try:
        gpucell.current().client[:].apply_sync(_import_torch)
        expect = _serial_seeded(args.n, 7, args.work)
        cell = CELL.format(tag=f"cluster {time.time_ns()}", n=args.n)
        for r in range(args.runs + 1):  # interleaved: load changes alike
            for name, (line, decision) in ways.items():
                seeding.loop_generators = decision
                got = _run(ip, cell, line)
                if line and ip.user_ns["out"] != expect:
                    raise AssertionError(f"{name}: not the serial seeded numbers")
                if r:  # the first round plans, warms and learns the cost
                    runs[name].append(got)
    finally:
        seeding.loop_generators = decide
        ip.run_line_magic("gpu_cluster", "stop")
    reseeds = decide(
        CELL.format(tag="", n=args.n),
        (1, 2),
        None,
        {"np": np_module(), "WORK": args.work},
        {"out": []},
    )
    rows = {
        k: {
            "wall": statistics.median(x["wall"] for x in v),
            "compute": statistics.median(x["compute"] for x in v),
            "runs": v,
        }
        for k, v in runs.items()
    }
    report(args, rows, engine, reseeds, per_generator)


def np_module() -> object:
    import numpy

    return numpy


def report(
    args: argparse.Namespace,
    rows: dict,
    engine: dict,
    reseeds: tuple,
    per_generator: dict,
) -> None:
    base = rows["no --seed"]
    print(
        f"N = {args.n}, WORK = {args.work}; 2 CPU engines with torch loaded; "
        f"median of {args.runs} "
        f"interleaved runs; the kernel reseeds {reseeds} for this loop"
    )
    print(f"{'':34}{'wall s':>9}{'x':>6}{'compute s':>11}{'+us/it':>8}")
    for name, r in rows.items():
        extra = (r["compute"] - base["compute"]) / args.n * 1e6
        print(
            f"{name:34}{r['wall']:>9.4f}{r['wall'] / base['wall']:>6.2f}"
            f"{r['compute']:>11.4f}{extra:>8.2f}"
        )
    print(f"engine program alone, {args.n // 2} iterations, in this process:")
    for name, us in engine.items():
        print(f"{name:34}{us:>6.2f} us/iteration (+{us - engine['no --seed']:.2f})")
    print("reseed per iteration, per generator (the seeder alone, thread time):")
    for name, us in per_generator.items():
        print(f"{name:34}{us:>6.2f} us")
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"seed-{args.label}.json"
    out.write_text(
        json.dumps(
            {
                "n": args.n,
                "work": args.work,
                "git": head,
                "load": os.getloadavg(),
                "reseeds": reseeds,
                "rows": rows,
                "engine_us_per_iteration": engine,
                "reseed_us_per_generator": per_generator,
            },
            indent=1,
            default=str,
        )
    )


if __name__ == "__main__":
    main()
