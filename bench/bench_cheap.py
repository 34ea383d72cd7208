"""Cheap-iteration benchmark: a loop whose body is one integer add, 10^7 times,
run serially by IPython, by gpucell's ``%%gpu_parallel`` on 2 CPU engines, and by
ipyparallel, Dask and joblib with 2 workers each.

Why.  The other benches use sleeps or heavy iterations, where per-chunk costs
vanish.  Here an iteration costs tens of nanoseconds, so what a system spends per
call (analysing the cell, shipping the program, the round trip, the merge) and
per iteration (how the body is executed: a notebook cell's loop runs at module
level on globals, a function's on fast locals) is all there is to see.  On a
2-core machine two workers can at best halve the work.

The loop (``--n`` N, 10^7 by default)::

    acc = 0
    for i in range(N):
        acc += i

Rows, all in one process on this machine, each checked against ``sum(range(N))``
  serial              the cell through a real IPython shell (``ip.run_cell``),
                      perf_counter around the call; ``--runs`` times.
  serial part(0, N)   reference only: the same loop inside a function (locals),
                      in this process; shows how much of any speedup is the
                      function-vs-module-level difference rather than the 2 workers.
  gpucell 1st cell    the very first ``%%gpu_parallel`` cell after the cluster
                      started (once per session: engine-side imports, first sends).
  gpucell first run   ``ip.run_cell("%%gpu_parallel --quiet\\n" + cell)`` with a
                      cell text gpucell has not seen (a tag comment and the
                      accumulator's name change each round), so no plan cache and no
                      cost memory applies: what a notebook user gets after editing
                      a cell, by far the common case.
  gpucell re-run      the same cell text again, right after its first run.
  ipyparallel         ``ipp.Cluster(n=2).start_and_connect_sync()``, a
                      LoadBalancedView ``map_sync(part, [0, N/2], [N/2, N])``.
  dask                ``LocalCluster(n_workers=2, threads_per_worker=1,
                      processes=True)``, ``client.map(part, ...)`` + ``gather``.
  joblib              ``Parallel(n_jobs=2, backend="loky")`` over the two halves
                      (loky's workers started by an untimed trivial call first).

``part(a, b)`` is the same body in a function: ``acc = 0; for i in range(a, b):
acc += i; return acc``.  Peers are timed on the computation only (their clusters
are started, and waited for, before); their first call (which ships the function)
is reported apart from the re-runs.  Systems run one after another, each cluster
stopped before the next starts, so no idle cluster shares the 2 cores.

Speedup = serial median / time; "vs fn" = serial part(0, N) median / time, the
fairer yardstick for the peers, whose halves run as functions.  A notebook cell's
loop, serial or on gpucell's engines (which execute the cell's code at module
level, as IPython does), pays global-dict lookups per iteration: about twice the
function's per-iteration cost.  Results: a table on stdout and
``bench/results/cheap.json`` (with ``gpucell.last_run.summary()`` and the chunk
count of every gpucell run).

Usage:  python bench/bench_cheap.py [--n 10000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import gc as _gc
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "cheap.json"

CELL = "# bench_cheap {tag}\n{acc} = 0\nfor i in range({n}):\n    {acc} += i\n"

SERIAL = "serial"
SERIAL_FN = "serial part(0, N)"
GP_VERY_FIRST = "gpucell 1st cell"
GP_FIRST = "gpucell first run"
GP_RERUN = "gpucell re-run"
IPP = "ipyparallel"
DASK = "dask"
JOBLIB = "joblib"


# --------------------------------------------------------------------------------------
# peers' work function (self-contained: pickled by value from __main__)
# --------------------------------------------------------------------------------------


def part(a, b):
    acc = 0
    for i in range(a, b):
        acc += i
    return acc


def _pid(_=None):
    import os

    return os.getpid()


# --------------------------------------------------------------------------------------
# helpers (as in bench_scale.py)
# --------------------------------------------------------------------------------------


def summary(xs: list[float]) -> dict:
    return {
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "runs": list(xs),
    }


def table(title: str, cols: list[str], rows: list[list], note: str = "") -> None:
    widths = [
        max(len(str(c)), *(len(str(r[k])) for r in rows)) for k, c in enumerate(cols)
    ]
    print(f"\n== {title}")
    if note:
        print(f"   {note}")
    print("  ".join(str(c).ljust(w) for c, w in zip(cols, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(
            "  ".join(
                str(v).ljust(w) if k == 0 else str(v).rjust(w)
                for k, (v, w) in enumerate(zip(r, widths, strict=True))
            )
        )


def machine_info() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import distributed
    import ipyparallel
    import IPython
    import joblib

    return {
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {
            "ipython": IPython.__version__,
            "ipyparallel": ipyparallel.__version__,
            "distributed": distributed.__version__,
            "joblib": joblib.__version__,
        },
    }


def git_state() -> dict:
    import subprocess

    root = Path(__file__).resolve().parent.parent

    def git(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", *a], cwd=root, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except Exception:
            return ""

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "-s"))}


def children() -> tuple[list[str], list[str]]:
    """This process's live descendants, as 'pid name cmdline' (zombies left out):
    (leftovers, resource trackers).  multiprocessing's and loky's resource
    trackers (started by Dask and joblib) live until this process exits, by
    design, so they are listed apart."""
    import psutil

    left, trackers = [], []
    for q in psutil.Process().children(recursive=True):
        try:
            if q.status() == psutil.STATUS_ZOMBIE:
                continue
            line = f"{q.pid} {q.name()} {' '.join(q.cmdline())[:160]}"
        except psutil.Error:
            continue
        (trackers if "resource_tracker" in line else left).append(line)
    return left, trackers


def timed(fn) -> tuple[float, object]:
    _gc.collect()
    t = time.perf_counter()
    res = fn()
    return time.perf_counter() - t, res


# --------------------------------------------------------------------------------------
# the systems
# --------------------------------------------------------------------------------------


def run_serial(ip, n: int, runs: int, expect: int) -> dict:
    cell = CELL.format(tag="serial", acc="acc", n=n)
    times = []
    for _ in range(runs):
        dt, res = timed(lambda: ip.run_cell(cell))
        res.raise_error()
        got = ip.user_ns.get("acc")
        if got != expect:
            raise AssertionError(f"serial: acc = {got!r}, expected {expect}")
        times.append(dt)
    fn_times = []
    for _ in range(runs):
        dt, got = timed(lambda: part(0, n))
        if got != expect:
            raise AssertionError(f"serial part: {got!r}, expected {expect}")
        fn_times.append(dt)
    return {SERIAL: {"time": summary(times)}, SERIAL_FN: {"time": summary(fn_times)}}


def run_gpucell(ip, n: int, runs: int, expect: int) -> dict:
    import gpucell

    t = time.perf_counter()
    ip.run_line_magic("load_ext", "gpucell")
    ip.run_line_magic("gpu_cluster", "start -n 2 --gpus none")
    startup = time.perf_counter() - t
    gc = gpucell.current()

    def one(tag: str, acc: str) -> dict:
        cell = CELL.format(tag=tag, acc=acc, n=n)
        src = "# %%gpu_parallel\n" + ip.transform_cell(cell)
        try:
            memory = any(k[0] == src for k in gc.cost_history._memory)
        except Exception:
            memory = None
        c0 = time.process_time()
        dt, res = timed(lambda: ip.run_cell("%%gpu_parallel --quiet\n" + cell))
        kernel_cpu = time.process_time() - c0
        res.raise_error()
        got = ip.user_ns.get(acc)
        if got != expect:
            raise AssertionError(f"gpucell {tag}: {acc} = {got!r}, expected {expect}")
        lr = gpucell.last_run
        done = [c for c in lr.chunks if c.state == "done"]
        return {
            "time": dt,
            "kernel_cpu": kernel_cpu,
            "had_cost_memory": memory,
            "status": str(lr.status),
            "inline": lr.inline,
            "schedule": lr.schedule,
            "dispatch_wall": lr.wall,
            "chunks": len(lr.chunks),
            "chunks_done": len(done),
            "engines_used": len({c.engine for c in done}),
            "chunk_sizes": [c.stop - c.start for c in done],
            "engine_compute": sum(c.compute for c in done),
            "summary": str(lr.summary()),
        }

    rec: dict[str, list] = {GP_VERY_FIRST: [], GP_FIRST: [], GP_RERUN: []}
    try:
        rec[GP_VERY_FIRST].append(one(f"very first {time.time_ns()}", "acc_v"))
        for r in range(runs):
            tag, acc = f"round {r} {time.time_ns()}", f"acc_{r}"
            rec[GP_FIRST].append(one(tag, acc))
            for _ in range(runs):
                rec[GP_RERUN].append(one(tag, acc))
    finally:
        t = time.perf_counter()
        ip.run_line_magic("gpu_cluster", "stop")
        stop_s = time.perf_counter() - t
    out: dict = {}
    for name, rs in rec.items():
        out[name] = {
            "time": summary([x["time"] for x in rs]),
            "chunks": [x["chunks"] for x in rs],
            "runs": rs,
        }
    out["_gpucell"] = {"startup_seconds": startup, "stop_seconds": stop_s}
    return out


def peer_runs(call, runs: int, expect: int, name: str) -> dict:
    """The first call apart, then ``runs`` re-runs; every total checked."""
    first, got = timed(call)
    if got != expect:
        raise AssertionError(f"{name} first: {got!r}, expected {expect}")
    times = []
    for _ in range(runs):
        dt, got = timed(call)
        if got != expect:
            raise AssertionError(f"{name}: {got!r}, expected {expect}")
        times.append(dt)
    return {"first": first, "time": summary(times)}


def run_ipp(n: int, runs: int, expect: int) -> dict:
    import ipyparallel as ipp

    h = n // 2
    t = time.perf_counter()
    cluster = ipp.Cluster(n=2, log_level=logging.ERROR)
    rc = cluster.start_and_connect_sync()
    try:
        rc.wait_for_engines(2, timeout=120)
        startup = time.perf_counter() - t
        lbv = rc.load_balanced_view()
        row = peer_runs(
            lambda: sum(lbv.map_sync(part, [0, h], [h, n])), runs, expect, IPP
        )
        row["startup_seconds"] = startup
    finally:
        try:
            rc.close()
        finally:
            cluster.stop_cluster_sync()
    return row


def run_dask(n: int, runs: int, expect: int) -> dict:
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    h = n // 2
    t = time.perf_counter()
    cluster = LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.CRITICAL,
    )
    client = Client(cluster)
    try:
        client.wait_for_workers(2)
        startup = time.perf_counter() - t

        def call():
            futs = client.map(part, [0, h], [h, n], pure=False)
            return sum(client.gather(futs))

        row = peer_runs(call, runs, expect, DASK)
        row["startup_seconds"] = startup
    finally:
        client.close()
        cluster.close()
    return row


def run_joblib(n: int, runs: int, expect: int) -> dict:
    from joblib import Parallel, delayed
    from joblib.externals.loky import get_reusable_executor

    h = n // 2
    t = time.perf_counter()
    pids = Parallel(n_jobs=2, backend="loky")(delayed(_pid)() for _ in range(8))
    startup = time.perf_counter() - t
    try:
        row = peer_runs(
            lambda: sum(
                Parallel(n_jobs=2, backend="loky")(
                    delayed(part)(a, b) for a, b in ((0, h), (h, n))
                )
            ),
            runs,
            expect,
            JOBLIB,
        )
        row["startup_seconds"] = startup
        row["worker_pids"] = sorted(set(pids))
    finally:
        get_reusable_executor().shutdown(wait=True)
    return row


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10**7, help="loop iterations")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default=str(RESULTS))
    args = ap.parse_args()
    n, runs = args.n, args.runs
    expect = sum(range(n))

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    t_all = time.perf_counter()
    info = machine_info()
    load_before = os.getloadavg()
    print(
        f"machine: {info['cpu_count']} cpus ({info['cpu_model']}), load "
        f"{load_before[0]:.2f}; N = {n}, runs {runs}"
    )

    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()

    result: dict = {
        "machine": info,
        "git": git_state(),
        "load_before": load_before,
        "systems": {},
        "errors": {},
    }
    sy = result["systems"]
    steps = [
        ("serial", lambda: run_serial(ip, n, runs, expect)),
        ("gpucell", lambda: run_gpucell(ip, n, runs, expect)),
        (IPP, lambda: {IPP: run_ipp(n, runs, expect)}),
        (DASK, lambda: {DASK: run_dask(n, runs, expect)}),
        (JOBLIB, lambda: {JOBLIB: run_joblib(n, runs, expect)}),
    ]
    for label, step in steps:
        t = time.perf_counter()
        try:
            sy.update(step())
        except Exception:
            import traceback

            traceback.print_exc()
            result["errors"][label] = traceback.format_exc()
        print(f"   [{label}: {time.perf_counter() - t:.1f} s]", flush=True)
    gp_meta = sy.pop("_gpucell", None)
    if gp_meta:
        result["gpucell_cluster"] = gp_meta

    # leftovers: every cluster above was stopped; give process exits a moment
    left: list[str] = []
    trackers: list[str] = []
    for _ in range(20):
        left, trackers = children()
        if not left:
            break
        time.sleep(0.5)
    result["leftover_children"] = left
    result["resource_trackers_until_exit"] = trackers

    # ---- speedups and table
    serial_med = sy[SERIAL]["time"]["median"] if SERIAL in sy else float("nan")
    fn_med = sy[SERIAL_FN]["time"]["median"] if SERIAL_FN in sy else float("nan")
    for row in sy.values():
        tm = row["time"]
        row["speedup_median"] = serial_med / tm["median"]
        row["speedup_vs_function_median"] = fn_med / tm["median"]
        row["speedup_min"] = serial_med / tm["min"]
        if "first" in row:
            row["speedup_first"] = serial_med / row["first"]
    rows = []
    order = [SERIAL, SERIAL_FN, GP_VERY_FIRST, GP_FIRST, GP_RERUN, IPP, DASK, JOBLIB]
    for name in order:
        row = sy.get(name)
        if row is None:
            rows.append([name, "error", "", "", "", "", "", "", ""])
            continue
        tm = row["time"]
        first = row.get("first")
        ch = row.get("chunks")
        rows.append(
            [
                name,
                f"{tm['median']:.3f}",
                f"{tm['min']:.3f}",
                f"{row['speedup_median']:.2f}",
                f"{row['speedup_vs_function_median']:.2f}",
                len(tm["runs"]),
                f"{first:.3f}" if first is not None else "",
                f"{serial_med / first:.2f}" if first is not None else "",
                ",".join(map(str, ch)) if ch else "",
            ]
        )
    table(
        f"cheap loop, N = {n}: wall seconds per call, speedup = serial median / time",
        [
            "system",
            "median s",
            "min s",
            "speedup",
            "vs fn",
            "n",
            "peer 1st call s",
            "1st speedup",
            "gpucell chunks",
        ],
        rows,
        note=(
            f"serial = the cell in IPython (module level); {SERIAL_FN} = the same "
            "loop in a function; peers: 2 halves of part(a, b) on 2 workers; "
            "peer rows' median/min are re-runs, their first call apart; vs fn = "
            f"{SERIAL_FN} median / time"
        ),
    )
    for name in (GP_VERY_FIRST, GP_FIRST, GP_RERUN):
        if name in sy:
            last = sy[name]["runs"][-1]
            print(f"\n-- {name}, last run's summary():\n{last['summary']}")
    if left:
        print("\nLEFTOVER processes:\n  " + "\n  ".join(left))
    else:
        print("\nno child process left running")
    if trackers:
        print(f"({len(trackers)} resource tracker(s), which exit with this process)")
    if result["errors"]:
        print("ERRORS in: " + ", ".join(result["errors"]))

    result["load_after"] = os.getloadavg()
    result["config"] = {
        "n": n,
        "runs": runs,
        "expected_total": expect,
        "cell": CELL.format(tag="{tag}", acc="acc", n=n),
        "total_seconds": time.perf_counter() - t_all,
    }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwrote {out} ({result['config']['total_seconds']:.0f} s in all)")


if __name__ == "__main__":
    main()
