"""Time ``gpucell.core.analysis.analyse`` on a realistic 200-line cell.

Prints a small table and writes ``bench/results/analysis.json``. Target: the
median ``analyse`` under 20 ms (it runs before every ``%%gpu_parallel`` cell).

Run: ``.venv/bin/python bench/bench_analysis.py [--repeat N]``
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from gpucell.core.analysis import analyse, format_plan

TARGET_MS = 20.0


def build_cell(lines: int = 200) -> str:
    """Prelude, a loop whose long body uses every pattern, and an epilogue."""
    prelude = [
        "import math",
        "import numpy as np",
        "import torch",
        "from collections import defaultdict, Counter",
        "model = make_model()",
        "criterion = torch.nn.MSELoss()",
        "batches = list(loader)",
        "losses = []",
        "preds = {}",
        "grid = np.zeros((64, 64))",
        "total_loss = 0.0",
        "best = -math.inf",
        "worst = math.inf",
        "hist = defaultdict(int)",
        "words = Counter()",
        "seen = set()",
        "flags = 0",
        "scale = 0.5",
        "names = ['a', 'b', 'c']",
        "",
    ]
    head = ["for step, (x, y) in enumerate(zip(inputs, targets)):"]
    block = [
        "    xb = x.cuda() * scale",
        "    yb = y.to('cuda')",
        "    with torch.no_grad():",
        "        out = model(xb)",
        "        loss = criterion(out, yb)",
        "    val = float(loss)",
        "    if val > 1.0:",
        "        tag = 'high'",
        "    else:",
        "        tag = 'low'",
        "    losses.append(val)",
        "    preds[step] = out.argmax().item()",
        "    total_loss += val",
        "    best = max(best, val)",
        "    worst = min(worst, val)",
        "    hist[tag] += 1",
        "    seen.add(tag)",
        "    flags |= 1 << (step % 8)",
        "    try:",
        "        ratio = val / (step % 5)",
        "    except ZeroDivisionError as err:",
        "        ratio = 0.0",
        "    parts = [math.sqrt(abs(v)) for v in range(4) if v != step]",
        "    norm = sum(p * p for p in parts)",
        "    f = lambda z, s=scale: z * s + norm",
        "    if (big := f(val)) > 10:",
        "        words[names[step % 3]] += 1",
        "    for j in range(3):",
        "        grid[step % 64, j] = j * val + ratio",
        "    def helper(a, b=2):",
        "        c = a + b",
        "        return c * scale",
        "    h = helper(step)",
        "    acc = 0",
        "    for k in range(step % 4):",
        "        acc += k * h",
        "    print(step, tag, acc)",
    ]
    epilogue = [
        "mean_loss = total_loss / max(1, len(losses))",
        "print(f'mean loss {mean_loss:.3f}, best {best}, worst {worst}')",
        "top = sorted(preds.items())[:5]",
        "summary = dict(hist)",
        "n_seen = len(seen)",
        "bits = bin(flags)",
        "grid_sum = float(grid.sum())",
        "common = words.most_common(3)",
        "report = (mean_loss, n_seen, bits, grid_sum, common)",
        "report",
    ]
    body: list[str] = []
    i = 0
    room = lines - len(prelude) - len(head) - len(epilogue)
    while len(body) + len(block) <= room:
        # rename locals per copy so every copy is new code to analyse
        body.extend(line.replace("ratio", f"ratio{i}") for line in block)
        i += 1
    while len(body) < room:
        body.append(f"    pad{len(body)} = step + {len(body)}")
    return "\n".join(prelude + head + body + epilogue) + "\n"


def timeit(fn, repeat: int) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    """Wall and CPU (process) milliseconds per run.

    CPU time is reported too because a shared 2-core machine makes wall time noisy.
    """
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        cpu.append((time.process_time() - c0) * 1000)
        wall.append((time.perf_counter() - t0) * 1000)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    cell = build_cell()
    known = {"make_model", "loader", "inputs", "targets"}
    plan = analyse(cell, known_names=known, for_cpu=True)  # warm up, and check
    assert plan.ok, plan.diagnostics
    rows = {
        "analyse": timeit(lambda: analyse(cell, known_names=known), args.repeat),
        "analyse(for_cpu)": timeit(
            lambda: analyse(cell, known_names=known, for_cpu=True), args.repeat
        ),
        "compile_chunk": timeit(plan.compile_chunk, args.repeat),
        "engine_program": timeit(plan.engine_program, args.repeat),
        "format_plan": timeit(lambda: format_plan(plan), args.repeat),
    }
    lines = len(cell.splitlines())
    print(f"cell: {lines} lines, loop on lines {plan.loop_lines}, {args.repeat} runs")
    print(f"{'step':<18}{'median ms':>10}{'p90 ms':>10}{'min ms':>10}{'cpu med':>10}")
    summary = {}
    for name, (ts, cpu) in rows.items():
        med = statistics.median(ts)
        p90 = statistics.quantiles(ts, n=10)[-1]
        cmed = statistics.median(cpu)
        summary[name] = {
            "median_ms": med,
            "p90_ms": p90,
            "min_ms": min(ts),
            "cpu_median_ms": cmed,
        }
        print(f"{name:<18}{med:>10.2f}{p90:>10.2f}{min(ts):>10.2f}{cmed:>10.2f}")
    med = summary["analyse"]["median_ms"]
    verdict = "OK" if med < TARGET_MS else "OVER TARGET"
    print(f"target: analyse median < {TARGET_MS} ms (wall): {verdict}")
    out = Path(__file__).parent / "results" / "analysis.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "cell_lines": lines,
                "repeat": args.repeat,
                "target_ms": TARGET_MS,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "results": summary,
                "names": {k: list(v) for k, v in plan.names_by_class().items()},
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
