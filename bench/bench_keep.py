"""What keeping finished work costs (gpucell/kernel/keep.py, issue 14).

A loop whose results total 1 GiB (64 iterations, each a 16 MiB numpy array) on a
real 2-engine cluster, in alternating rounds:

  off         keeping disabled (Keeping.add a no-op): the behaviour before --resume
  memory      the default: finished chunks are kept in kernel memory (references,
              no copy) until the merge
  checkpoint  --checkpoint DIR on local disk: every finished chunk is also written
              (temporary file, fsync, rename) and the folder removed after the merge

Columns: median cell seconds, and the ratio to ``off``.

Usage:  python bench/bench_keep.py [--runs 3] [--dir /tmp/gpucell-bench-ckpt]
Writes bench/results/keep.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "keep.json"

CELL = (
    "out = []\nfor i in range(64):\n"
    "    out.append(np.full(2 ** 21, float(i)))  # 16 MiB each, 1 GiB in all\n"
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/gpucell-bench-ckpt")
    args = ap.parse_args()
    from IPython.testing.globalipapp import start_ipython

    import gpucell
    from gpucell import config
    from gpucell.kernel import keep

    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpucell")
    ip.run_cell("import numpy as np")
    gpucell.start_cluster(2, gpus="none")
    config.settings().inline_below = 0.0
    real_add = keep.Keeping.add
    modes = {
        "off": "--quiet",
        "memory": "--quiet",
        "checkpoint": f"--quiet --checkpoint {args.dir}",
    }
    times: dict[str, list[float]] = {m: [] for m in modes}
    try:
        ip.run_cell_magic("gpu_parallel", "--quiet", CELL)  # warm up
        for _ in range(args.runs):
            for mode, line in modes.items():
                keep.Keeping.add = (  # type: ignore[method-assign]
                    (lambda self, a, b, r: None) if mode == "off" else real_add
                )
                ip.user_ns.pop("out", None)
                t0 = time.perf_counter()
                ip.run_cell_magic("gpu_parallel", line, CELL)
                times[mode].append(time.perf_counter() - t0)
                assert len(ip.user_ns["out"]) == 64
    finally:
        keep.Keeping.add = real_add  # type: ignore[method-assign]
        gpucell.stop()
        shutil.rmtree(args.dir, ignore_errors=True)
    base = statistics.median(times["off"])
    report = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "runs": args.runs,
        "result_bytes": 64 * 2**24,
        "results": {
            m: {
                "median_s": statistics.median(t),
                "ratio": statistics.median(t) / base,
                "all_s": t,
            }
            for m, t in times.items()
        },
    }
    print(f"{'mode':12} {'median (s)':>10} {'x off':>7}")
    for m, r in report["results"].items():
        print(f"{m:12} {r['median_s']:10.3f} {r['ratio']:7.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
