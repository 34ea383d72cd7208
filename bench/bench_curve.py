"""What encrypting a local cluster's messages (CurveZMQ) costs: start-up and
per-message round trips, with and without, on the same host in one run.

Each round starts ``gpucell.start_cluster(2, gpus="none")`` with
``starting.LOCAL_CURVE`` on and off (alternating, so drift in the host's load
falls on both), then times on one engine: a tiny task's round trip, and a
1 MiB and a 16 MiB bytes argument echoed back (encryption is per byte; the
shared-memory channel only carries results, so inputs travel the sockets).

Usage:  python bench/bench_curve.py [--rounds 3] [--tiny 200]
Prints one table and the ratios (curve / plain, medians).
"""

from __future__ import annotations

import argparse
import statistics
import time

import gpucell
from gpucell.cluster import starting


def _echo(b: bytes) -> int:
    return len(b)


def _noop() -> None:
    return None


def one_round(curve: bool, tiny: int) -> dict[str, float]:
    starting.LOCAL_CURVE = curve
    t0 = time.perf_counter()
    gc = gpucell.start_cluster(2, gpus="none")
    out = {"start_s": time.perf_counter() - t0}
    try:
        view = gc.client[gc.ids[0]]
        view.apply_sync(_noop)  # warm
        t = time.perf_counter()
        for _ in range(tiny):
            view.apply_sync(_noop)
        out["tiny_ms"] = (time.perf_counter() - t) / tiny * 1e3
        for size, key in ((1 << 20, "1MiB_ms"), (16 << 20, "16MiB_ms")):
            data = b"x" * size
            view.apply_sync(_echo, data)
            times = []
            for _ in range(5):
                t = time.perf_counter()
                view.apply_sync(_echo, data)
                times.append(time.perf_counter() - t)
            out[key] = statistics.median(times) * 1e3
    finally:
        gpucell.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tiny", type=int, default=200)
    a = ap.parse_args()
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for _ in range(a.rounds):
        for curve in (False, True):
            runs[curve].append(one_round(curve, a.tiny))
    keys = ["start_s", "tiny_ms", "1MiB_ms", "16MiB_ms"]
    med = {c: {k: statistics.median(r[k] for r in runs[c]) for k in keys} for c in runs}
    print(f"{'':8}" + "".join(f"{k:>12}" for k in keys))
    for c, name in ((False, "plain"), (True, "curve")):
        print(f"{name:8}" + "".join(f"{med[c][k]:12.3f}" for k in keys))
    print(
        f"{'ratio':8}" + "".join(f"{med[True][k] / med[False][k]:12.2f}" for k in keys)
    )


if __name__ == "__main__":
    main()
