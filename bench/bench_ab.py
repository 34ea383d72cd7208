"""Before/after on this (shared, noisy) host: ``bench_scale.py`` run alternately
against two source trees, A/B/A/B, so load drifts hit both alike.

Why a driver and not one process: two versions of gpucell cannot live in one
interpreter, and the engines import gpucell too; each round is a fresh process
(its engines inherit ``PYTHONPATH``) with the same bench script.  Prints, per
engine count, loop and gpucell variant, the median and spread over rounds of
each round's median efficiency and per-process CPU per chunk.

Usage:  python bench/bench_ab.py --a /tmp/base --b /tmp/new [--rounds 3]
        [--engines 8,16] [--runs 2] [--peers joblib] [--out DIR]
        [--a-config 'k=v,...'] [--b-config 'k=v,...']  (GpuCell settings a side
        runs with: bench_scale applies $GPUCELL_BENCH_CONFIG with %config)
Writes DIR/ab.json (DIR defaults to bench/results/ab).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIELDS = (
    ("efficiency", "eff", 1.0),
    ("kernel_cpu_per_chunk", "kernel ms/chunk", 1e3),
    ("controller_cpu_per_chunk", "controller ms/chunk", 1e3),
    ("engine_cpu_per_chunk", "engines ms/chunk", 1e3),
    ("chunks", "chunks", 1.0),
)


def one_round(tree: str, args: argparse.Namespace, out: Path, config: str = "") -> dict:
    env = dict(os.environ, PYTHONPATH=tree, GPUCELL_BENCH_CONFIG=config)
    cmd = [
        sys.executable,
        str(HERE / "bench_scale.py"),
        "--engines",
        args.engines,
        "--runs",
        str(args.runs),
        "--peers",
        args.peers,
        "--json",
        str(out),
    ]
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if p.returncode != 0 or not out.exists():
        raise RuntimeError(
            f"{tree}: bench_scale failed\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        )
    res = json.loads(out.read_text())
    res["round_seconds"] = time.perf_counter() - t
    return res


def rows(res: dict) -> dict:
    """(engines, loop, system) -> {field: the round's median}."""
    out = {}
    for E, entry in res["by_engines"].items():
        for loop, lp in entry.items():
            if not isinstance(lp, dict) or "systems" not in lp:
                continue
            for name, row in lp["systems"].items():
                out[(E, loop, name)] = {
                    f: row[f]["median"] for f, _, _ in FIELDS if f in row
                }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="tree before (its root on PYTHONPATH)")
    ap.add_argument("--b", required=True, help="tree after")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engines", default="8,16")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--peers", default="joblib")
    ap.add_argument("--out", default=str(HERE / "results" / "ab"))
    ap.add_argument(
        "--a-config",
        default="",
        help="GpuCell settings for side a, e.g. 'quiet_idle=True' (comma list); "
        "the same tree for --a and --b compares a setting",
    )
    ap.add_argument("--b-config", default="")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    got: dict[str, list] = {"a": [], "b": []}
    loads = []
    for r in range(args.rounds):
        for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
            tree = getattr(args, side)
            loads.append(os.getloadavg()[0])
            config = getattr(args, f"{side}_config")
            res = one_round(tree, args, out / f"{side}{r}.json", config)
            got[side].append(res)
            print(
                f"round {r} {side} ({tree}): {res['round_seconds']:.0f} s, load "
                f"{os.getloadavg()[0]:.2f}",
                flush=True,
            )
    table: dict = {}
    for side, results in got.items():
        for res in results:
            for key, vals in rows(res).items():
                for f, v in vals.items():
                    table.setdefault(key, {}).setdefault(f, {}).setdefault(
                        side, []
                    ).append(v)
    print(f"\nload average (1 min) at each round's start: {loads}")
    print(
        "median over rounds [min-max] of each round's median; a = "
        f"{args.a}, b = {args.b}"
    )
    for key in sorted(table):
        cells = []
        for f, label, scale in FIELDS:
            d = table[key].get(f)
            if not d:
                continue
            part = []
            for side in ("a", "b"):
                xs = [x * scale for x in d.get(side, [])]
                if xs:
                    part.append(
                        f"{side} {statistics.median(xs):.3g} "
                        f"[{min(xs):.3g}-{max(xs):.3g}]"
                    )
            cells.append(f"{label}: " + ", ".join(part))
        print(f"  {key[0]:>3} {key[1]:<8} {key[2]:<28} " + "; ".join(cells))
    summary = {
        "a": args.a,
        "b": args.b,
        "loads": loads,
        "table": {" / ".join(k): v for k, v in table.items()},
    }
    (out / "ab.json").write_text(json.dumps(summary, indent=1))
    print(f"\nwrote {out / 'ab.json'}")


if __name__ == "__main__":
    main()
