"""Parallel-loop benchmark: gpucell's ``%%gpu_parallel`` beside ipyparallel, Dask and
joblib.

Everything runs on 2 engines/workers, all started once and warmed up; then each
measurement is repeated ``--runs`` times, systems interleaved round by round (so the
noise of a busy 2-core machine falls on all of them alike), and median and min are
reported.

Benchmarks
  a  overhead: whole-cell wall time of a 2,000-iteration trivial loop
     ``out = []; for i in range(2000): out.append(i * i)``.  gpucell runs through a real
     IPython shell (``run_cell_magic("gpu_parallel", "--quiet", cell)``), so analysis,
     dispatch and merge are all inside the timing.  Peers: serial exec of the same
     cell, ipyparallel ``DirectView.map_sync``, ``LoadBalancedView.map_sync`` (best of
     a few chunksizes), Dask ``client.map`` and chunked ``client.submit`` (best of a
     few chunk counts), joblib ``Parallel(n_jobs=2, backend="loky")``.
  b  speedup on 40 x ~50 ms compute-bound iterations (pure Python arithmetic,
     calibrated here) vs serial in the same run; ceiling: a stdlib
     ``ProcessPoolExecutor(2)`` running two static halves.
  c  efficiency = serial / (2 x makespan) on an uneven loop, iteration i costing
     i x 5 ms (i < 40); gpucell guided/static/dynamic vs ipyparallel DirectView
     (static), LoadBalancedView chunksize 1 (dynamic), Dask client.map, joblib.
  d  MiB/s of 32 x 4 MiB float32 results coming back (numpy arrays, torch tensors):
     gpucell vs ipyparallel DirectView.map vs Dask client.map + gather; ceiling:
     ``np.copyto`` of 128 MiB in this process.

  e  a new 256 MiB float64 input reaching both workers (a dataset the loop reads):
     seconds of gpucell's whole cell (4 trivial iterations reading it) with and without
     /dev/shm, vs ipyparallel ``DirectView.push`` and Dask ``scatter(broadcast=True)``
     of the same array (the send alone).  Not an issue target: a measurement.

ipyparallel peers use the same two engines gpucell started
(``gpucell.current().client``), so both drive identical processes.  Results: tables
on stdout and ``bench/results/parallel.json``.

Usage:  python bench/bench_parallel.py [--runs 5] [--quick] [--only a,b,c,d,e]
"""

from __future__ import annotations

import argparse
import gc as _gc
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "parallel.json"
N_WORKERS = 2
MiB = 1 << 20

CELL_A = "out = []\nfor i in range(2000):\n    out.append(i * i)\n"
CELL_B = "out_b = []\nfor i in range(40):\n    out_b.append(burn(N_B))\n"
CELL_C = "out_c = []\nfor i in range(40):\n    out_c.append(burn(i * U_C))\n"
CELL_D_NP = (
    "res = []\nfor i in range(32):\n    res.append(np.full(1 << 20, i, np.float32))\n"
)
CELL_D_T = (
    "res_t = []\nfor i in range(32):\n"
    "    res_t.append(torch.full((1 << 20,), i, dtype=torch.float32))\n"
)
BURN_SRC = """
def burn(n):
    x = 0
    for k in range(n):
        x += k * k % 7
    return x
"""


# --------------------------------------------------------------------------------------
# Work functions for the peers. Self-contained (ipyparallel resolves a __main__
# function's globals on the engine, so they import what they need themselves).
# --------------------------------------------------------------------------------------


def body(i):
    return i * i


def body_range(lo, hi):
    return [i * i for i in range(lo, hi)]


def burn(n):
    x = 0
    for k in range(n):
        x += k * k % 7
    return x


def burn_many(ns):
    out = []
    for n in ns:
        x = 0
        for k in range(n):
            x += k * k % 7
        out.append(x)
    return out


def make_np(i):
    import numpy as np

    return np.full(1 << 20, i, np.float32)


def make_torch(i):
    import torch

    return torch.full((1 << 20,), i, dtype=torch.float32)


def _pid(_=None):
    import os

    return os.getpid()


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def calibrate(target_s: float) -> int:
    """n such that burn(n) takes ~target_s on one core of this machine (median of 5)."""
    n = 20_000
    while True:
        t = time.perf_counter()
        burn(n)
        dt = time.perf_counter() - t
        if dt > 0.02:
            break
        n *= 2
    n = int(n * target_s / dt)
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        burn(n)
        samples.append(time.perf_counter() - t)
    return max(1, int(n * target_s / statistics.median(samples)))


def timed(fn):
    _gc.collect()
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


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
    import joblib
    import numpy
    import torch

    return {
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {
            "ipyparallel": ipyparallel.__version__,
            "distributed": distributed.__version__,
            "joblib": joblib.__version__,
            "numpy": numpy.__version__,
            "torch": torch.__version__,
        },
    }


# --------------------------------------------------------------------------------------
# the systems
# --------------------------------------------------------------------------------------


def _start(c):
    return c.start


class Systems:
    """Every pool started once; shut down by :meth:`close`."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.ip = None
        self.gc = None
        self.dask_cluster = None
        self.dask = None
        self.ppe = None
        self.startup: dict[str, float] = {}

    def start(self) -> None:
        import concurrent.futures

        # the stdlib pool first, forked before any zmq/dask thread exists
        t = time.perf_counter()
        self.ppe = concurrent.futures.ProcessPoolExecutor(N_WORKERS)
        assert len(set(self.ppe.map(_pid, range(4)))) >= 1
        self.startup["processpool"] = time.perf_counter() - t

        from IPython.testing.globalipapp import start_ipython

        self.ip = start_ipython()
        self.ip.run_line_magic("load_ext", "gpucell")
        import gpucell

        if os.environ.get("GPUCELL_BENCH_PIN") == "0":
            gpucell.config.settings().pin_cpu_engines = False
        t = time.perf_counter()
        self.gc = gpucell.start_cluster(N_WORKERS, gpus="none")
        self.startup["gpucell"] = time.perf_counter() - t
        client = self.gc.client
        self.dv = client[:]
        self.dv.block = True
        self.lbv = client.load_balanced_view()

        import logging

        from distributed import Client, LocalCluster

        logging.getLogger("distributed").setLevel(logging.CRITICAL)
        t = time.perf_counter()
        self.dask_cluster = LocalCluster(
            n_workers=N_WORKERS,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.CRITICAL,
        )
        self.dask = Client(self.dask_cluster)
        self.dask.wait_for_workers(N_WORKERS)
        self.startup["dask"] = time.perf_counter() - t

        from joblib import Parallel, delayed

        t = time.perf_counter()
        Parallel(n_jobs=N_WORKERS, backend="loky")(delayed(_pid)() for _ in range(4))
        self.startup["joblib"] = time.perf_counter() - t

        self.ip.run_cell("import numpy as np\nimport torch\n" + BURN_SRC)

    # -- gpucell ---------------------------------------------------------------------

    def gpucell_cell(
        self, cell: str, line: str = "--quiet", inline: bool = True, fresh: bool = False
    ) -> dict:
        """One run of ``cell``. ``inline=False``: always send it to the engines;
        ``fresh``: forget what earlier runs measured (a cell's first run)."""
        import gpucell
        from gpucell import config

        config.settings().inline_below = 0.005 if inline else 0.0
        if fresh:
            self.gc.cost_history.clear()
        t = time.perf_counter()
        self.ip.run_cell_magic("gpu_parallel", line, cell)
        whole = time.perf_counter() - t
        config.settings().inline_below = 0.005
        lr = gpucell.last_run
        done = [c for c in lr.chunks if c.state == "done"]
        return {
            "inline": lr.inline,
            "whole": whole,
            "dispatch_wall": lr.wall,
            "chunks": len(done),
            "chunk_sizes": [c.stop - c.start for c in sorted(done, key=_start)],
            "engine_compute": sum(c.compute for c in done),
            "busy": {str(k): v for k, v in lr.busy.items()},
        }

    # -- peers -------------------------------------------------------------------------

    def dask_map(self, fn, seq):
        futs = self.dask.map(fn, seq, pure=False)
        out = self.dask.gather(futs)
        del futs
        return out

    def dask_chunked(self, n: int, chunks: int):
        edges = [k * n // chunks for k in range(chunks + 1)]
        futs = [
            self.dask.submit(body_range, a, b, pure=False)
            for a, b in zip(edges, edges[1:], strict=False)
        ]
        parts = self.dask.gather(futs)
        del futs
        return [x for p in parts for x in p]

    @staticmethod
    def joblib_map(fn, seq):
        from joblib import Parallel, delayed

        return Parallel(n_jobs=N_WORKERS, backend="loky")(delayed(fn)(x) for x in seq)

    def ppe_halves(self, seq):
        h = len(seq) // 2
        f1 = self.ppe.submit(burn_many, seq[:h])
        f2 = self.ppe.submit(burn_many, seq[h:])
        return f1.result() + f2.result()

    # -- shutdown --------------------------------------------------------------------

    def close(self) -> dict:
        import psutil

        me = psutil.Process()
        errors = []
        if self.dask is not None:
            try:
                self.dask.close()
                self.dask_cluster.close()
            except Exception as e:
                errors.append(f"dask: {e!r}")
        try:
            from joblib.externals.loky import get_reusable_executor

            get_reusable_executor().shutdown(wait=True)
        except Exception as e:
            errors.append(f"loky: {e!r}")
        if self.ppe is not None:
            self.ppe.shutdown(wait=True)
        if self.gc is not None:
            try:
                import gpucell

                gpucell.stop()
            except Exception as e:
                errors.append(f"gpucell: {e!r}")
        # what is still running: wait a little, then end our own leftovers by pid
        kids = me.children(recursive=True)
        gone, alive = psutil.wait_procs(kids, timeout=10)
        left, helpers = [], []
        for p in alive:
            try:
                cmd = " ".join(p.cmdline())[:160]
            except psutil.Error:
                continue
            # multiprocessing's and loky's resource trackers: one helper per pool
            # library, they exit when this interpreter does
            (helpers if "resource_tracker" in cmd else left).append(
                {"pid": p.pid, "cmd": cmd}
            )
        for p in alive:
            try:
                p.terminate()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)
        return {
            "errors": errors,
            "left_after_shutdown": left,
            "resource_trackers_ended": helpers,
        }


# --------------------------------------------------------------------------------------
# benchmarks
# --------------------------------------------------------------------------------------


def rounds(systems: dict, runs: int, check=None, cap=None) -> dict[str, list]:
    """Run every system once per round, in the same order, ``runs`` rounds.

    ``cap``: ``{name: n}`` runs a slow system only in its first ``n`` rounds.
    """
    out: dict[str, list] = {k: [] for k in systems}
    cap = cap or {}
    for r in range(runs):
        for name, fn in systems.items():
            if r >= cap.get(name, runs):
                continue
            dt, res = timed(fn)
            if check is not None:
                check(name, res)
            out[name].append((dt, res))
    return out


def paired(times: dict[str, list[float]], ours: str, peers: list[str]) -> dict:
    """Round by round, each peer's time over ours: systems run interleaved, so a
    round's ratio cancels the host's slow drifts that separate medians keep."""
    out = {}
    for p in peers:
        r = [b / a for a, b in zip(times[ours], times[p], strict=True)]
        wins = sum(x > 1 for x in r)
        out[p] = {"median_ratio": statistics.median(r), "wins": wins, "rounds": len(r)}
        print(
            f"   paired: {ours} faster than {p} in {wins}/{len(r)} rounds "
            f"(median time ratio {statistics.median(r):.3f})"
        )
    return out


def ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def bench_a(S: Systems, runs: int, quick: bool) -> dict:
    import gpucell
    from gpucell.core.analysis import analyse

    ip = S.ip
    expect_last = 1999 * 1999
    code = compile(CELL_A, "<cell-a>", "exec")

    def serial_exec():
        ns: dict = {}
        exec(code, ns)
        return ns["out"]

    def serial_ipython():
        ip.run_cell(CELL_A, store_history=False)
        return ip.user_ns["out"]

    def gp():
        return S.gpucell_cell(CELL_A)

    def check(name, res):
        if name.startswith("gpucell"):
            out = ip.user_ns["out"]
        else:
            out = res
        if not (len(out) == 2000 and out[-1] == expect_last):
            raise AssertionError(f"{name}: got {type(out)} {str(out)[:200]}")

    # tuning: LoadBalancedView chunksize, Dask submit chunk count
    lbv_sizes = [100, 250, 500, 1000] if not quick else [250, 1000]
    dask_chunks = [2, 4, 8, 16] if not quick else [2, 4]
    tune_runs = 3 if not quick else 1
    tune = {}
    for cs in lbv_sizes:
        S.lbv.map_sync(body, range(2000), chunksize=cs)  # warm
        tune[f"lbv_chunksize_{cs}"] = [
            timed(lambda cs=cs: S.lbv.map_sync(body, range(2000), chunksize=cs))[0]
            for _ in range(tune_runs)
        ]
    for k in dask_chunks:
        S.dask_chunked(2000, k)
        tune[f"dask_chunks_{k}"] = [
            timed(lambda k=k: S.dask_chunked(2000, k))[0] for _ in range(tune_runs)
        ]
    med = {k: statistics.median(v) for k, v in tune.items()}
    best_cs = min(lbv_sizes, key=lambda c: med[f"lbv_chunksize_{c}"])
    best_k = min(dask_chunks, key=lambda k: med[f"dask_chunks_{k}"])

    systems = {
        "gpucell %%gpu_parallel (whole cell)": gp,
        "gpucell, sent to the engines (inline off)": lambda: S.gpucell_cell(
            CELL_A, inline=False
        ),
        "gpucell, first run (no cost memory)": lambda: S.gpucell_cell(
            CELL_A, fresh=True
        ),
        "serial exec": serial_exec,
        "serial ip.run_cell": serial_ipython,
        "ipp DirectView.map_sync": lambda: S.dv.map_sync(body, range(2000)),
        f"ipp LoadBalancedView.map_sync cs={best_cs}": lambda: S.lbv.map_sync(
            body, range(2000), chunksize=best_cs
        ),
        "dask client.map + gather": lambda: S.dask_map(body, range(2000)),
        f"dask submit x{best_k} chunks": lambda: S.dask_chunked(2000, best_k),
        "joblib loky (batch auto)": lambda: S.joblib_map(body, range(2000)),
    }
    if quick:  # 2,000 Dask tasks take seconds: not in the smoke mode
        del systems["dask client.map + gather"]
    for name, fn in systems.items():  # warm-up: 2 each (1 for the slow Dask map)
        for _ in range(1 if name.startswith("dask client.map") else 2):
            check(name, fn())
    # 2,000 Dask tasks take seconds each time: at most 3 runs of it
    res = rounds(systems, runs, check, cap={"dask client.map + gather": 3})
    rows = {k: summary([d for d, _ in v]) for k, v in res.items()}
    gp_runs = [r for _, r in res["gpucell %%gpu_parallel (whole cell)"]]
    rows["gpucell %%gpu_parallel (whole cell)"]["gpucell"] = {
        "dispatch_wall": summary([r["dispatch_wall"] for r in gp_runs]),
        "outside_dispatch": summary([r["whole"] - r["dispatch_wall"] for r in gp_runs]),
        "chunks": [r["chunks"] for r in gp_runs],
        "chunk_sizes_last": gp_runs[-1]["chunk_sizes"],
        "engine_compute": summary([r["engine_compute"] for r in gp_runs]),
    }

    # analysis cost of the cell (what run_cell does before anything is sent)
    reps = 50 if not quick else 10
    t_tr, t_an, t_prog = [], [], []
    for _ in range(reps):
        t = time.perf_counter()
        src = ip.transform_cell(CELL_A)
        t_tr.append(time.perf_counter() - t)
        fname = ip.compile.cache(src)
        t = time.perf_counter()
        plan = analyse(src, filename=fname, known_names=ip.user_ns.keys(), for_cpu=True)
        t_an.append(time.perf_counter() - t)
        t = time.perf_counter()
        plan.engine_program()
        t_prog.append(time.perf_counter() - t)
    analysis = {
        "transform_cell": summary(t_tr),
        "analyse_for_cpu": summary(t_an),
        "engine_program": summary(t_prog),
    }
    assert gpucell.last_run is not None

    ref = rows["ipp DirectView.map_sync"]["median"]
    trs = []
    for k, v in rows.items():
        trs.append([k, ms(v["median"]), ms(v["min"]), f"{v['median'] / ref:.2f}"])
    table(
        "(a) 2,000 trivial iterations: whole-cell wall time",
        ["system", "median ms", "min ms", "ratio to DirectView"],
        trs,
    )
    g = rows["gpucell %%gpu_parallel (whole cell)"]["gpucell"]
    print(
        f"   gpucell breakdown (median): dispatch loop (last_run.wall) "
        f"{ms(g['dispatch_wall']['median'])} ms, outside it (analysis, load, "
        f"merge, magic) {ms(g['outside_dispatch']['median'])} ms; chunks "
        f"{g['chunk_sizes_last']}; engine compute "
        f"{ms(g['engine_compute']['median'])} ms"
    )
    print(
        "   gpucell's default re-run ran in the kernel: "
        f"{all(r['inline'] for r in gp_runs)} (OpenMP-style `if`: its last run "
        "measured less work than sending costs; GpuCell.inline_below)"
    )
    print(
        f"   analysis: transform_cell {ms(analysis['transform_cell']['median'])} ms, "
        f"analyse {ms(analysis['analyse_for_cpu']['median'])} ms, engine_program "
        f"{ms(analysis['engine_program']['median'])} ms"
    )
    print(
        "   tuning (median ms): "
        + ", ".join(f"{k} {ms(statistics.median(v))}" for k, v in tune.items())
    )
    return {
        "cell": CELL_A,
        "rows": rows,
        "tuning": {k: summary(v) for k, v in tune.items()},
        "best_lbv_chunksize": best_cs,
        "best_dask_chunks": best_k,
        "analysis": analysis,
        "target": "gpucell whole-cell median <= ipp DirectView.map_sync median",
        "target_met": rows["gpucell %%gpu_parallel (whole cell)"]["median"] <= ref,
    }


def bench_b(S: Systems, runs: int, quick: bool, per_iter: float) -> dict:
    n = calibrate(per_iter)
    S.ip.user_ns["N_B"] = n
    seq = [n] * 40
    t_one = min(timed(lambda: burn(n))[0] for _ in range(3))

    def serial():
        return [burn(x) for x in seq]

    def check(name, res):
        if name.startswith("gpucell"):
            res = S.ip.user_ns["out_b"]
        assert len(res) == 40, name

    systems = {
        "serial (kernel)": serial,
        "ProcessPoolExecutor(2) halves (ceiling)": lambda: S.ppe_halves(seq),
        "gpucell %%gpu_parallel": lambda: S.gpucell_cell(CELL_B),
        "ipp DirectView.map_sync": lambda: S.dv.map_sync(burn, seq),
        "ipp LoadBalancedView cs=1": lambda: S.lbv.map_sync(burn, seq, chunksize=1),
        "dask client.map + gather": lambda: S.dask_map(burn, seq),
        "joblib loky": lambda: S.joblib_map(burn, seq),
    }
    for name, fn in systems.items():
        if name != "serial (kernel)":
            check(name, fn())
    res = rounds(systems, runs, check)
    times = {k: [d for d, _ in v] for k, v in res.items()}
    serial_t = times["serial (kernel)"]
    rows = {}
    for k, v in times.items():
        # speedup per round (serial of the same round), then median / max
        sp = [s / t for s, t in zip(serial_t, v, strict=True)]
        rows[k] = summary(v)
        rows[k]["speedup_median"] = statistics.median(sp)
        rows[k]["speedup_of_medians"] = statistics.median(serial_t) / (
            statistics.median(v)
        )
        rows[k]["speedups"] = sp
        # best-case estimate on a noisy machine: fastest serial / fastest run
        rows[k]["speedup_of_mins"] = min(serial_t) / min(v)
    ceil = rows["ProcessPoolExecutor(2) halves (ceiling)"]["speedup_median"]
    ceil_min = rows["ProcessPoolExecutor(2) halves (ceiling)"]["speedup_of_mins"]
    for v in rows.values():
        v["ratio_to_ceiling"] = v["speedup_median"] / ceil
        v["ratio_to_ceiling_of_mins"] = v["speedup_of_mins"] / ceil_min
    gp_runs = [r for _, r in res["gpucell %%gpu_parallel"]]
    rows["gpucell %%gpu_parallel"]["gpucell"] = {
        "chunk_sizes_last": gp_runs[-1]["chunk_sizes"],
        "busy_last": gp_runs[-1]["busy"],
        "dispatch_wall": summary([r["dispatch_wall"] for r in gp_runs]),
    }
    table(
        f"(b) 40 x {t_one * 1e3:.0f} ms compute-bound iterations (burn({n}))",
        [
            "system",
            "median s",
            "min s",
            "speedup",
            "ratio to ceiling",
            "speedup (mins)",
            "ratio (mins)",
        ],
        [
            [
                k,
                f"{v['median']:.3f}",
                f"{v['min']:.3f}",
                f"{v['speedup_median']:.2f}x",
                f"{v['ratio_to_ceiling']:.3f}",
                f"{v['speedup_of_mins']:.2f}x",
                f"{v['ratio_to_ceiling_of_mins']:.3f}",
            ]
            for k, v in rows.items()
        ],
        "speedup = serial / system per round (serial run in the same round), median "
        "of rounds; (mins) = fastest serial / fastest run, the quiet-machine estimate",
    )
    g = rows["gpucell %%gpu_parallel"]
    peers = [k for k in rows if not k.startswith(("gpucell", "serial", "ProcessPool"))]
    best_peer = max(rows[k]["speedup_median"] for k in peers)
    pairs = paired(
        times,
        "gpucell %%gpu_parallel",
        [*peers, next(iter(k for k in rows if k.startswith("ProcessPool")))],
    )
    print(f"   gpucell chunks (last run): {g['gpucell']['chunk_sizes_last']}")
    return {
        "paired": pairs,
        "n": n,
        "iteration_seconds": t_one,
        "cell": CELL_B,
        "rows": rows,
        "target": ">= 0.97 of the ProcessPool ceiling's speedup, ahead of every peer",
        "target_met": g["ratio_to_ceiling"] >= 0.97 and g["speedup_median"] > best_peer,
        "target_met_of_mins": g["ratio_to_ceiling_of_mins"] >= 0.97
        and g["speedup_of_mins"] > max(rows[k]["speedup_of_mins"] for k in peers),
    }


def bench_c(S: Systems, runs: int, quick: bool, unit: float) -> dict:
    u = calibrate(unit)
    S.ip.user_ns["U_C"] = u
    seq = [i * u for i in range(40)]

    def serial():
        return [burn(x) for x in seq]

    def check(name, res):
        if name.startswith("gpucell"):
            res = S.ip.user_ns["out_c"]
        assert len(res) == 40, name

    systems = {
        "serial (kernel)": serial,
        "gpucell guided (default)": lambda: S.gpucell_cell(CELL_C),
        "gpucell --schedule static": lambda: S.gpucell_cell(
            CELL_C, "--quiet --schedule static"
        ),
        "gpucell --schedule dynamic": lambda: S.gpucell_cell(
            CELL_C, "--quiet --schedule dynamic"
        ),
        "ipp DirectView.map_sync (static)": lambda: S.dv.map_sync(burn, seq),
        "ipp LoadBalancedView cs=1 (dynamic)": lambda: S.lbv.map_sync(
            burn, seq, chunksize=1
        ),
        "dask client.map + gather": lambda: S.dask_map(burn, seq),
        "joblib loky": lambda: S.joblib_map(burn, seq),
    }
    for name, fn in systems.items():  # warm-up once each
        if name != "serial (kernel)":
            check(name, fn())
    res = rounds(systems, runs, check)
    times = {k: [d for d, _ in v] for k, v in res.items()}
    serial_t = times["serial (kernel)"]
    rows = {}
    for k, v in times.items():
        eff = [s / (N_WORKERS * t) for s, t in zip(serial_t, v, strict=True)]
        rows[k] = summary(v)
        rows[k]["efficiency_median"] = statistics.median(eff)
        rows[k]["efficiency_max"] = max(eff)
        rows[k]["efficiencies"] = eff
        rows[k]["efficiency_of_mins"] = min(serial_t) / (N_WORKERS * min(v))
        if k.startswith("gpucell"):
            last = res[k][-1][1]
            rows[k]["gpucell"] = {
                "chunk_sizes_last": last["chunk_sizes"],
                "busy_last": last["busy"],
                "dispatch_wall": summary([r["dispatch_wall"] for _, r in res[k]]),
            }
    peers = [k for k in rows if not k.startswith(("gpucell", "serial"))]
    best_peer = max(rows[k]["efficiency_median"] for k in peers)
    best_peer_min = max(rows[k]["efficiency_of_mins"] for k in peers)
    # two static halves of sum(i): 780 units, the second half 590 -> 780 / 1180
    ideal_static = sum(range(40)) / (N_WORKERS * sum(range(20, 40)))
    table(
        "(c) uneven loop, iteration i costs i x 5 ms: "
        "efficiency = serial / (2 x makespan)",
        [
            "system",
            "median s",
            "min s",
            "efficiency",
            "ratio to best peer",
            "efficiency (mins)",
        ],
        [
            [
                k,
                f"{v['median']:.3f}",
                f"{v['min']:.3f}",
                f"{v['efficiency_median']:.3f}" if not k.startswith("serial") else "-",
                f"{v['efficiency_median'] / best_peer:.3f}"
                if not k.startswith("serial")
                else "-",
                f"{v['efficiency_of_mins']:.3f}" if not k.startswith("serial") else "-",
            ]
            for k, v in rows.items()
        ],
        f"unit burn({u}); serial median {statistics.median(serial_t):.2f} s "
        f"(ideal {sum(range(40)) * unit:.2f} s); static halves can reach at most "
        f"{ideal_static:.3f}: a static row far from it means a noisy run",
    )
    for k, v in rows.items():
        if "gpucell" in v:
            busy = v["gpucell"]["busy_last"].items()
            print(
                f"   {k}: chunks {v['gpucell']['chunk_sizes_last']}, busy "
                + ", ".join(f"e{e} {b:.2f}s" for e, b in busy)
            )
    pairs = paired(times, "gpucell guided (default)", peers)
    g = rows["gpucell guided (default)"]["efficiency_median"]
    return {
        "paired": pairs,
        "unit_n": u,
        "cell": CELL_C,
        "rows": rows,
        "best_peer_efficiency": best_peer,
        "best_peer_efficiency_of_mins": best_peer_min,
        "ideal_static_efficiency": ideal_static,
        "target": ">= 0.95 efficiency (guided, default) and ahead of every peer",
        "target_met": g >= 0.95 and g > best_peer,
        "target_met_of_mins": rows["gpucell guided (default)"]["efficiency_of_mins"]
        >= 0.95
        and rows["gpucell guided (default)"]["efficiency_of_mins"] > best_peer_min,
    }


def bench_d(S: Systems, runs: int, quick: bool) -> dict:
    import numpy as np

    total = 32 * 4 * MiB
    ip = S.ip

    def memcpy():
        np.copyto(dst, src)
        return None

    src = np.ones(total // 4, np.float32)
    dst = np.empty_like(src)
    memcpy()

    def check(name, res):
        if name.startswith("gpucell numpy"):
            res = ip.user_ns["res"]
        elif name.startswith("gpucell torch"):
            res = ip.user_ns["res_t"]
        if res is None:
            return
        assert len(res) == 32 and float(res[31][0]) == 31.0, name
        nbytes = sum(r.nbytes if hasattr(r, "nbytes") else r.numel() * 4 for r in res)
        assert nbytes == total, name

    systems = {
        "memcpy np.copyto 128 MiB (ceiling)": memcpy,
        "gpucell numpy": lambda: S.gpucell_cell(CELL_D_NP),
        "ipp DirectView.map numpy": lambda: S.dv.map_sync(make_np, range(32)),
        "dask client.map+gather numpy": lambda: S.dask_map(make_np, range(32)),
        "gpucell torch": lambda: S.gpucell_cell(CELL_D_T),
        "ipp DirectView.map torch": lambda: S.dv.map_sync(make_torch, range(32)),
        "dask client.map+gather torch": lambda: S.dask_map(make_torch, range(32)),
    }
    for name, fn in systems.items():
        for _ in range(1 if quick else 2):
            check(name, fn())
            ip.user_ns.pop("res", None)
            ip.user_ns.pop("res_t", None)

    out: dict[str, list] = {k: [] for k in systems}
    for _ in range(runs):
        for name, fn in systems.items():
            dt, res = timed(fn)
            check(name, res)
            del res
            ip.user_ns.pop("res", None)
            ip.user_ns.pop("res_t", None)
            out[name].append(dt)
    rows = {}
    for k, v in out.items():
        rows[k] = summary(v)
        rows[k]["mib_s_median"] = total / MiB / statistics.median(v)
        rows[k]["mib_s_best"] = total / MiB / min(v)
    trs = []
    for k, v in rows.items():
        kind = "torch" if "torch" in k else "numpy"
        ref = rows[f"ipp DirectView.map {kind}"]["mib_s_median"]
        trs.append(
            [
                k,
                ms(v["median"]),
                ms(v["min"]),
                f"{v['mib_s_median']:.0f}",
                f"{v['mib_s_median'] / ref:.2f}" if "memcpy" not in k else "-",
            ]
        )
    table(
        "(d) 32 x 4 MiB float32 results back to the kernel",
        ["system", "median ms", "min ms", "MiB/s (median)", "ratio to DirectView"],
        trs,
    )
    met = {}
    for kind in ("numpy", "torch"):
        g = rows[f"gpucell {kind}"]["mib_s_median"]
        met[kind] = (
            g >= 2 * rows[f"ipp DirectView.map {kind}"]["mib_s_median"]
            and g > rows[f"dask client.map+gather {kind}"]["mib_s_median"]
        )
    return {
        "bytes": total,
        "rows": rows,
        "target": ">= 2x ipp DirectView MiB/s and ahead of Dask",
        "target_met": met,
    }


CELL_E = "e_out = []\nfor i in range(4):\n    e_out.append(float(table_e[i]))\n"


def bench_e(S: Systems, runs: int, quick: bool) -> dict:
    import numpy as np

    from gpucell import config

    n = (32 if not quick else 4) << 20  # float64: 256 MiB (32 MiB quick)
    mib = n * 8 / MiB
    ip = S.ip

    def fresh():
        return np.random.default_rng().random(n)

    def gp(shm: bool):
        def run():
            ip.user_ns["table_e"] = fresh()  # new content: must be sent
            config.settings().shared_memory = shm
            try:
                r = S.gpucell_cell(CELL_E, "--quiet --schedule static")
            finally:
                config.settings().shared_memory = True
            return r

        return run

    def push():
        a = fresh()
        t = time.perf_counter()
        S.dv.push({"table_e": a}, block=True)
        return time.perf_counter() - t

    def scatter():
        a = fresh()
        t = time.perf_counter()
        fut = S.dask.scatter(a, broadcast=True)
        S.dask.replicate([fut])
        dt = time.perf_counter() - t
        del fut
        return dt

    systems = {
        "gpucell whole cell, /dev/shm": gp(True),
        "gpucell whole cell, through the controller": gp(False),
        "ipp DirectView.push (send only)": push,
        "dask scatter(broadcast=True) (send only)": scatter,
    }
    out: dict[str, list[float]] = {k: [] for k in systems}
    for fn in systems.values():
        fn()  # warm-up
    for _ in range(runs):
        for name, fn in systems.items():
            r = fn()
            # each times its send alone (making the array is not in it)
            out[name].append(r if isinstance(r, float) else r["whole"])
    rows = {k: summary(v) for k, v in out.items()}
    ref = rows["ipp DirectView.push (send only)"]["median"]
    table(
        f"(e) a new {mib:.0f} MiB input to 2 workers",
        ["system", "median s", "min s", "MiB/s to each", "ratio to push"],
        [
            [
                k,
                f"{v['median']:.3f}",
                f"{v['min']:.3f}",
                f"{mib / v['median']:.0f}",
                f"{v['median'] / ref:.2f}",
            ]
            for k, v in rows.items()
        ],
    )
    return {
        "mib": mib,
        "rows": rows,
        "target": "(no target) gpucell /dev/shm faster than DirectView.push",
        "target_met": rows["gpucell whole cell, /dev/shm"]["median"] < ref,
    }


def git_state() -> dict:
    """Which gpucell was measured: HEAD, dirty files, a hash of gpucell/*.py."""
    import hashlib
    import subprocess

    root = Path(__file__).resolve().parent.parent

    def git(*a):
        try:
            return subprocess.run(
                ["git", *a], cwd=root, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except Exception:
            return ""

    h = hashlib.sha1()
    for f in sorted((root / "gpucell").rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode())
        h.update(f.read_bytes())
    return {
        "head": git("rev-parse", "HEAD"),
        "dirty": git("status", "--porcelain", "--", "gpucell").splitlines(),
        "gpucell_sources_sha1": h.hexdigest(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke mode (< 60 s): 2 runs, 5 ms / 0.5 ms work units, no per-item "
        "Dask map in (a)",
    )
    ap.add_argument("--only", default="a,b,c,d,e", help="benchmarks to run, e.g. a,d")
    ap.add_argument("--json", default=str(RESULTS))
    args = ap.parse_args()
    runs = 2 if args.quick and args.runs == 5 else args.runs
    which = set(args.only.split(","))
    per_iter = 0.005 if args.quick else 0.050
    unit = 0.0005 if args.quick else 0.005

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    t_all = time.perf_counter()
    load_before = os.getloadavg()
    info = machine_info()
    S = Systems(args.quick)
    result: dict = {"machine": info, "load_before": load_before, "git": git_state()}
    try:
        S.start()
        result["startup_seconds"] = S.startup
        print(
            f"machine: {info['cpu_count']} cpus ({info['cpu_model']}), load "
            f"{load_before[0]:.2f}; runs {runs}{' (quick)' if args.quick else ''}; "
            "started: " + ", ".join(f"{k} {v:.1f}s" for k, v in S.startup.items())
        )
        benches = {
            "a": lambda: bench_a(S, runs, args.quick),
            "b": lambda: bench_b(S, runs, args.quick, per_iter),
            "c": lambda: bench_c(S, runs, args.quick, unit),
            "d": lambda: bench_d(S, runs, args.quick),
            "e": lambda: bench_e(S, runs, args.quick),
        }
        for key, fn in benches.items():
            if key not in which:
                continue
            before, t = os.getloadavg(), time.perf_counter()
            try:
                result[key] = fn()
            except Exception:
                import traceback

                traceback.print_exc()
                result[key] = {"error": traceback.format_exc()}
            result[key]["seconds"] = time.perf_counter() - t
            result[key]["load_before_after"] = [before, os.getloadavg()]
            print(
                f"   [{key}: {result[key]['seconds']:.0f} s, load "
                f"{before[0]:.2f} -> {os.getloadavg()[0]:.2f}]"
            )
    finally:
        result["shutdown"] = S.close()
    result["load_after"] = os.getloadavg()
    result["config"] = {
        "runs": runs,
        "quick": args.quick,
        "workers": N_WORKERS,
        "per_iteration_b": per_iter,
        "unit_c": unit,
        "ipp_peers_share_gpucell_engines": True,
        "total_seconds": time.perf_counter() - t_all,
    }
    print("\n== targets")
    for k in "abcde":
        if k in result:
            if "error" in result[k]:
                print(f"   ({k}) failed: {result[k]['error'].splitlines()[-1]}")
                continue
            extra = result[k].get("target_met_of_mins")
            note = "" if extra is None else f" (estimate from mins: {extra})"
            print(f"   ({k}) {result[k]['target']}: {result[k]['target_met']}{note}")
    sh = result["shutdown"]
    print(
        f"   shutdown: {len(sh['left_after_shutdown'])} process(es) left "
        f"{sh['left_after_shutdown'] or ''}(+ {len(sh['resource_trackers_ended'])} "
        f"resource tracker(s) ended); errors {sh['errors'] or 'none'}"
    )
    print(
        f"   load {load_before[0]:.2f} -> {result['load_after'][0]:.2f}; total "
        f"{result['config']['total_seconds']:.0f} s"
    )
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str))
    print(f"   wrote {path}")


if __name__ == "__main__":
    main()
