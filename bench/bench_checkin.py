"""What the engines' input check costs (gpucell/engine/checkin.py).

Inputs are read-only to iterations: before and after each chunk an engine takes a
token of every input a call could change and compares.  Two loops, each run with
the check on and off (``GpuCell.check_inputs``) in alternating rounds on a real
2-engine cluster, plus the token itself timed in this process:

  model   a ~100 M-parameter torch model (6 x Linear(4096, 4096)) as an input,
          called on a batch per iteration under no_grad (40 iterations)
  cheap   2,000 cheap iterations calling a notebook function that reads a global
          list (the function and its global are checked)

Columns: on / off = median cell seconds; cost = (on - off) / off; token = one
snapshot + compare of that input in this process (what each chunk pays twice).

Usage:  python bench/bench_checkin.py [--runs 5] [--only model,cheap]
Writes bench/results/checkin.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "checkin.json"


def _shell():
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpucell")
    return ip


SETUPS = {
    "model": (
        "import torch\ntorch.manual_seed(0)\n"
        "layers = [torch.nn.Linear(4096, 4096) for _ in range(6)]\n"
        "model = torch.nn.Sequential(*layers)\n"
        "model.eval()\nbatches = [torch.randn(64, 4096) for _ in range(40)]\n",
        "outs = []\nfor x in batches:\n    with torch.no_grad():\n"
        "        outs.append(float(model(x).sum()))\n",
        "model",
    ),
    "cheap": (
        "table = list(range(100))\ndef f(i):\n    return table[i % 100] * 2\n",
        "acc = 0\nfor i in range(2000):\n    acc += f(i)\n",
        "f",
    ),
}


def _token_seconds(ip, name: str) -> float:
    from gpucell.engine import checkin

    obj = ip.user_ns[name]
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        before = checkin.snapshot({name: obj}, [name], None)
        checkin.changes(before, {name: obj}, None)
    return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", default=",".join(SETUPS))
    args = ap.parse_args()
    import gpucell
    from gpucell import config

    ip = _shell()
    gpucell.start_cluster(2, gpus="none")
    settings = config.settings()
    settings.inline_below = 0.0  # always send: the check runs on the engines
    report: dict = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "runs": args.runs,
        "results": {},
    }
    try:
        for case in args.only.split(","):
            setup, cell, watched = SETUPS[case]
            ip.run_cell(setup)
            times: dict[bool, list[float]] = {True: [], False: []}
            ip.run_cell_magic("gpu_parallel", "--quiet", cell)  # ship inputs once
            for _ in range(args.runs):
                for on in (True, False):
                    settings.check_inputs = on
                    t0 = time.perf_counter()
                    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
                    times[on].append(time.perf_counter() - t0)
            settings.check_inputs = True
            on, off = statistics.median(times[True]), statistics.median(times[False])
            report["results"][case] = {
                "on_s": on,
                "off_s": off,
                "cost": (on - off) / off,
                "token_s": _token_seconds(ip, watched),
                "chunks": len(gpucell.last_run.chunks),
                "on_all": times[True],
                "off_all": times[False],
            }
    finally:
        gpucell.stop()
    print(f"{'case':8} {'on (s)':>8} {'off (s)':>8} {'cost':>8} {'token':>10} chunks")
    for case, r in report["results"].items():
        print(
            f"{case:8} {r['on_s']:8.3f} {r['off_s']:8.3f} {r['cost']:8.1%} "
            f"{r['token_s'] * 1e3:8.2f}ms {r['chunks']:6d}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
