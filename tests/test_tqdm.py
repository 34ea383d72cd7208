"""tqdm progress bars in a ``%%gpu_parallel`` cell, on a real cluster.

- A bar made in the loop header (``for x in tqdm(items):``) wraps the iterable,
  which the kernel evaluates: the kernel draws every item before the engines
  start, so the bar reaches 100% at once; the results are the serial ones.
  gpucell's own progress line (or widget) shows the iterations' progress.
- A bar made before the loop and advanced in the body (``bar.update(1)``) is
  refused before anything runs: ``update`` on an object that is not a set or a
  dict would run on each engine's copy. The rewrite: advance it after the loop.
- A bar made inside the body runs on the engine; its output reaches the kernel
  with the iteration's other output, in iteration order.
"""

from __future__ import annotations

import re
import time

import pytest

pytestmark = pytest.mark.cluster

pytest.importorskip("tqdm")


def test_bar_around_the_iterable_fills_as_the_kernel_draws_the_items(
    ip, cluster, capsys
):
    ip.run_cell(
        "import time\n"
        "from tqdm import tqdm\n"
        "class Timed(tqdm):\n"
        "    def close(self):\n"
        "        self.closed_at = getattr(self, 'closed_at', None) or time.time()\n"
        "        super().close()\n"
        "items = list(range(12))"
    )
    capsys.readouterr()
    ip.run_cell_magic(
        "gpu_parallel",
        "",
        "bar = Timed(items, desc='items')\n"
        "out = []\n"
        "started = []\n"
        "for x in bar:\n"
        "    started.append(time.time())\n"
        "    time.sleep(0.02)\n"
        "    out.append(x * 2)\n",
    )
    ns = ip.user_ns
    assert ns["out"] == [x * 2 for x in range(12)]  # as serially
    bar = ns["bar"]
    assert bar.n == 12 and bar.total == 12
    # every item was drawn (and the bar closed) before the first iteration began
    assert bar.closed_at <= min(ns["started"])
    err = capsys.readouterr().err
    assert "items: 100%" in err and "12/12" in err


def test_bar_advanced_in_the_body_ends_as_serially(ip, cluster):
    # the kernel makes the bar's calls in iteration order at the merge
    # (core/progressbars.py; tests/test_progress_bars.py has the other forms)
    ip.run_cell(
        "import io\n"
        "from tqdm import tqdm\n"
        "items = list(range(12))\n"
        "bar = tqdm(total=len(items), file=io.StringIO())\n"
        "out = 'before'"
    )
    ip.run_cell_magic(
        "gpu_parallel",
        "",
        "out = []\nfor x in items:\n    out.append(x * 2)\n    bar.update(1)\n",
    )
    assert ip.user_ns["out"] == [x * 2 for x in range(12)]
    assert ip.user_ns["bar"].n == 12


def test_the_rewrite_advances_the_bar_after_the_loop(ip, cluster):
    ip.run_cell(
        "import io\n"
        "from tqdm import tqdm\n"
        "items = list(range(12))\n"
        "bar = tqdm(total=len(items), file=io.StringIO())"
    )
    ip.run_cell_magic(
        "gpu_parallel",
        "",
        "out = []\nfor x in items:\n    out.append(x * 2)\nbar.update(len(out))\n",
    )
    assert ip.user_ns["out"] == [x * 2 for x in range(12)]
    assert ip.user_ns["bar"].n == 12


def test_bars_made_in_the_body_print_in_iteration_order(ip, cluster, capsys):
    ip.run_cell("from tqdm import tqdm\nimport time\nitems = list(range(6))")
    capsys.readouterr()
    t0 = time.perf_counter()
    ip.run_cell_magic(
        "gpu_parallel",
        "",
        "out = []\n"
        "for x in items:\n"
        "    s = 0\n"
        "    for j in tqdm(range(3), desc=f'item {x}'):\n"
        "        time.sleep(0.01 * (6 - x))\n"
        "        s += j\n"
        "    out.append(s + x)\n",
    )
    assert time.perf_counter() - t0 < 60
    assert ip.user_ns["out"] == [3 + x for x in range(6)]
    err = capsys.readouterr().err
    done = re.findall(r"item (\d): 100%\|.*?3/3", err)
    assert done == [str(x) for x in range(6)], err
