"""Telemetry benchmark: what sampling costs, and how fresh the samples are.

1. **Per-sample cost in the kernel** (``LocalTelemetry.sample()``, µs per call) for
   2 and 8 local engines (real processes; CPU engines through psutil, GPU engines
   through the fake NVML, which times our code but not the driver call).
2. **Overhead on a compute-bound loop**: a 2-engine cluster runs 8 fixed-work
   iterations (~0.5 s each, queued 4 per engine through ``apply_async``) while the
   kernel waits as the dispatcher does (``concurrent.futures.wait``, 50 ms), in
   three modes, interleaved: ``off`` (no telemetry), ``local`` (kernel samples the
   engines' pids at 4 Hz) and ``remote`` (engine-side sampler publishing at 4 Hz,
   kernel polls ``ar.data`` every 50 ms).  Reported two ways: the wall-time delta
   against ``off`` (noisy on a shared host), and the CPU time the telemetry itself
   used (kernel thread time in sample/poll + the engine sampler threads' own CPU
   time) as % of the loop's compute time — the cost, without the noise.
3. **Sample rate during one 10 s iteration**, for both paths: samples/s and the
   longest gap between consecutive samples.

Usage:  python bench/bench_telemetry.py [--reps 5] [--quick]
Writes bench/results/telemetry.json and prints a table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gpucell.devices.sampling import LocalTelemetry  # noqa: E402
from gpucell.kernel.telemetry import for_cluster  # noqa: E402
from gpucell.protocol.telemetry import Target  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "telemetry.json"


def work(n: int) -> float:
    """Runs on an engine: a fixed amount of pure-Python work; returns its seconds."""
    import time

    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x += i * i % 7
    return time.perf_counter() - t0


def busy_for(seconds: float) -> int:
    import time

    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        n += 1
    return n


# ---- 1. per-sample cost ------------------------------------------------------------


def per_sample_cost(calls: int) -> dict[str, float]:
    from fake_nvml import FakeNvml, a100s

    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        for _ in range(8)
    ]
    out = {}
    try:
        for n in (2, 8):
            for kind in ("cpu", "gpu"):
                targets = [
                    Target(i, p.pid, "here", kind, i if kind == "gpu" else -1, "x")
                    for i, p in enumerate(procs[:n])
                ]
                src = LocalTelemetry(targets, nvml=FakeNvml(a100s(n)))
                src.sample()
                t0 = time.perf_counter()
                for _ in range(calls):
                    src.sample()
                us = (time.perf_counter() - t0) / calls * 1e6
                out[f"{kind}_{n}_engines_us"] = round(us, 1)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return out


# ---- 2. overhead on a compute-bound loop -------------------------------------------


def calibrate(gc, eid: int, seconds: float) -> int:
    n = 200_000
    t = gc.client[eid].apply_sync(work, n)
    return max(1, int(n * seconds / t))


def run_loop(gc, ids, n_work: int, iters: int, mode: str) -> dict[str, float]:
    """One loop of ``iters`` fixed-work iterations; returns wall and telemetry CPU."""
    from gpucell.engine import telemetry as telemetry_engine

    tele = None
    if mode != "off":
        tele = for_cluster(gc, ids, remote=ids if mode == "remote" else ())
        if mode == "remote":
            for ar in tele.start_remote():
                ar.get(timeout=10)
    kernel_cpu = 0.0
    samples = 0
    proc0 = time.process_time()
    t0 = time.perf_counter()
    ars = [gc.client[ids[i % len(ids)]].apply_async(work, n_work) for i in range(iters)]
    pending = set(ars)
    last_sample = t0
    while pending:
        done, _ = concurrent.futures.wait(
            list(pending), timeout=0.05, return_when="FIRST_COMPLETED"
        )
        pending -= done
        if tele is not None:
            c0 = time.thread_time()
            tele.poll(pending | done)
            now = time.perf_counter()
            if now - last_sample >= 0.25:
                last_sample = now
                samples += len(tele.sample())
            kernel_cpu += time.thread_time() - c0
    wall = time.perf_counter() - t0
    kernel_process = time.process_time() - proc0
    compute = sum(ar.get() for ar in ars)
    engine_cpu = 0.0
    if mode == "remote":
        for eid in ids:
            st = gc.client[eid].apply_sync(telemetry_engine.status)
            engine_cpu += st.get("cpu_seconds", 0.0)
            gc.client[eid].apply_sync(telemetry_engine.stop)
        samples = sum(len(tele.remote.history(e)) for e in ids)
    return {
        "wall": wall,
        "compute": compute,
        "kernel_cpu": kernel_cpu,
        "kernel_process_cpu": kernel_process,
        "engine_cpu": engine_cpu,
        "samples": samples,
    }


def overhead(gc, reps: int, iters: int, seconds: float) -> dict[str, dict]:
    ids = gc.ids[:2]
    n_work = calibrate(gc, ids[0], seconds)
    runs: dict[str, list[dict]] = {"off": [], "local": [], "remote": []}
    run_loop(gc, ids, n_work, 2, "off")  # warm-up
    for _ in range(reps):
        for mode in runs:
            runs[mode].append(run_loop(gc, ids, n_work, iters, mode))
    base = statistics.median(r["wall"] for r in runs["off"])
    base_compute = statistics.median(r["compute"] for r in runs["off"])
    base_kproc = statistics.median(r["kernel_process_cpu"] for r in runs["off"])
    out = {}
    for mode, rs in runs.items():
        wall = statistics.median(r["wall"] for r in rs)
        compute = statistics.median(r["compute"] for r in rs)
        kproc = statistics.median(r["kernel_process_cpu"] for r in rs)
        tele_cpu = statistics.median(r["kernel_cpu"] + r["engine_cpu"] for r in rs)
        out[mode] = {
            "median_wall_s": round(wall, 4),
            "wall_spread_s": round(
                max(r["wall"] for r in rs) - min(r["wall"] for r in rs), 4
            ),
            "wall_overhead_pct": round(100 * (wall - base) / base, 2),
            # the engines' own time for the same fixed work: what a slower loop
            # body would show (sampler and IOPub threads taking the GIL included)
            "compute_overhead_pct": round(
                100 * (compute - base_compute) / base_compute, 2
            ),
            # every kernel thread (the client's IO thread decoding data messages
            # included), beyond what the "off" loop already costs
            "kernel_extra_cpu_ms": round(1e3 * (kproc - base_kproc), 2),
            "telemetry_cpu_ms": round(1e3 * tele_cpu, 2),
            "telemetry_cpu_pct_of_compute": round(100 * tele_cpu / compute, 3),
            "samples": statistics.median(r["samples"] for r in rs),
        }
    out["_setup"] = {
        "iterations": iters,
        "iteration_s": seconds,
        "engines": 2,
        "reps": reps,
    }
    return out


# ---- 3. sample rate during one long iteration --------------------------------------


def _rate(stamps: list[float], span: float) -> dict[str, float]:
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return {
        "samples": len(stamps),
        "per_second": round(len(stamps) / span, 2),
        "max_gap_s": round(max(gaps), 3) if gaps else float("nan"),
    }


def rate(gc, seconds: float) -> dict[str, dict]:
    from gpucell.engine import telemetry as telemetry_engine

    eid = gc.ids[0]
    out = {}
    # local: the kernel samples at 4 Hz while the iteration runs
    tele = for_cluster(gc, [eid])
    ar = gc.client[eid].apply_async(busy_for, seconds)
    stamps, t0 = [], time.perf_counter()
    while not ar.ready():
        (s,) = tele.sample()
        if s.state == "ok":
            stamps.append(s.timestamp)
        time.sleep(0.25)
    out["local"] = _rate(stamps, time.perf_counter() - t0)
    # remote: the engine publishes, the kernel polls ar.data every 50 ms
    tele = for_cluster(gc, [eid], remote=[eid])
    for a in tele.start_remote():
        a.get(timeout=10)
    ar = gc.client[eid].apply_async(busy_for, seconds)
    t0 = time.perf_counter()
    while not ar.ready():
        tele.poll([ar])
        time.sleep(0.05)
    tele.poll([ar])
    span = time.perf_counter() - t0
    gc.client[eid].apply_sync(telemetry_engine.stop)
    out["remote"] = _rate([s.timestamp for s in tele.remote.history(eid)], span)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="1 rep, 3 s rate test")
    args = ap.parse_args()
    reps = 1 if args.quick else args.reps
    long_s = 3.0 if args.quick else 10.0

    import gpucell

    cost = per_sample_cost(200 if args.quick else 2000)
    gc = gpucell.start_cluster(2, gpus="none")
    try:
        over = overhead(gc, reps, iters=8, seconds=0.5)
        fresh = rate(gc, long_s)
    finally:
        gpucell.stop()

    print("\nper-sample cost in the kernel (LocalTelemetry.sample(), one call)")
    for k, v in cost.items():
        print(f"  {k:<22} {v:8.1f} µs")
    print("\noverhead on 8 x 0.5 s compute-bound iterations on 2 engines")
    print(
        f"  {'mode':<8}{'wall s':>9}{'spread':>9}{'wall Δ%':>9}{'comp Δ%':>9}"
        f"{'tele ms':>9}{'tele %':>9}{'kern ms':>9}{'samples':>9}"
    )
    for mode in ("off", "local", "remote"):
        r = over[mode]
        print(
            f"  {mode:<8}{r['median_wall_s']:9.3f}{r['wall_spread_s']:9.3f}"
            f"{r['wall_overhead_pct']:9.2f}{r['compute_overhead_pct']:9.2f}"
            f"{r['telemetry_cpu_ms']:9.2f}{r['telemetry_cpu_pct_of_compute']:9.3f}"
            f"{r['kernel_extra_cpu_ms']:9.2f}{r['samples']:9.0f}"
        )
    print(
        "  wall Δ%/comp Δ%: against 'off' (noise included); tele: CPU time of the\n"
        "  sampling code itself (kernel sample/poll + engine sampler threads) as %\n"
        "  of the loop's compute; kern ms: extra CPU of all kernel threads."
    )
    print(f"\nsample rate during one {long_s:g} s iteration")
    for path, r in fresh.items():
        print(
            f"  {path:<8}{r['per_second']:6.2f}/s  {r['samples']} samples, "
            f"longest gap {r['max_gap_s']:.3f} s"
        )
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "bench": "telemetry",
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                    "loadavg_at_end": load,
                },
                "per_sample_cost": cost,
                "overhead": over,
                "rate": fresh,
                "long_iteration_s": long_s,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
