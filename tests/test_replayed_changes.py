"""Statements that only change a container from before the loop, replayed
on the kernel in iteration order (``core/analysis/replaystmts.py``):
``index.setdefault(w, set()).add(i)``, ``index[w].add(i)`` with keys that
repeat, ``pivot[a][b] += u`` on nested defaultdicts, ``grid[r][c] = v``,
``budget.subtract(c)``, ``heapq.heappush(heap, x)``, ``bisect.insort``.
Each cell is compared with its serial run; a replayed change that fails
serially fails here with nothing merged; another object's method is refused
before anything runs.
"""

from __future__ import annotations

import bisect
import heapq
import textwrap
from collections import Counter, defaultdict, deque

import pandas as pd
import pytest
from test_concat_rebind import identical

from gpucell.core.analysis import analyse
from gpucell.errors import NotParallelizable

pytestmark = pytest.mark.cluster

WORDS = "the cat sat on the mat and the dog sat on the cat".split()


class _Results:
    def __init__(self):
        self.scores = []
        self.best = {}

    def __eq__(self, other):
        return vars(self) == vars(other)


def _nested():
    return defaultdict(lambda: defaultdict(int))


CASES = {
    "setdefault(k, set()).add: an inverted index": (
        "for i, w in enumerate(words):\n    inverted.setdefault(w, set()).add(i)\n",
        lambda: {"words": WORDS, "inverted": {}},
    ),
    "defaultdict(set)[k].add with repeated keys": (
        "for i, w in enumerate(words):\n    index[w].add(i)\n    n_seen = i\n",
        lambda: {"words": WORDS, "index": defaultdict(set)},
    ),
    "a dict of lists, insert at the front": (
        "for i, w in enumerate(words):\n    recent[w[0]].insert(0, i)\n",
        lambda: {"words": WORDS, "recent": defaultdict(list)},
    ),
    "nested defaultdict counts": (
        "for s, b, u in rows:\n    pivot[s][b] += u\n",
        lambda: {
            "rows": [("n", "lo", 3), ("s", "hi", 1), ("n", "lo", 2), ("n", "hi", 5)],
            "pivot": _nested(),
        },
    ),
    "nested writes, the last one wins": (
        "for r in recs:\n    table[r[0]][r[1]] = r[2]\n",
        lambda: {
            "recs": [(0, "a", 1), (1, "b", 2), (0, "a", 3), (1, "c", 4)],
            "table": {0: {}, 1: {}},
        },
    ),
    "Counter.subtract": (
        "for c in spent:\n    budget.subtract({c: 1})\n",
        lambda: {"spent": list("abcabca"), "budget": Counter(a=5, b=5, c=1)},
    ),
    "heapq.heappush builds the serial heap layout": (
        "for name, s in scores:\n    heapq.heappush(heap, (s, name))\n",
        lambda: {
            "heapq": heapq,
            "scores": [(f"m{k}", (k * 7) % 11) for k in range(15)],
            "heap": [],
        },
    ),
    "bisect.insort and a deque's appendleft": (
        "for x in xs:\n    bisect.insort(ordered, x)\n    dq.appendleft(x * 2)\n",
        lambda: {
            "bisect": bisect,
            "xs": [5, 1, 4, 1, 5, 9, 2, 6],
            "ordered": [3],
            "dq": deque([0]),
        },
    ),
    "a Counter updated and subtracted in one loop": (
        "for d in docs:\n    c.update(d.split())\n    c.subtract(['the'])\n",
        lambda: {
            "docs": [" ".join(WORDS[k : k + 4]) for k in range(9)],
            "c": Counter(),
        },
    ),
    "lists held by an object's attributes (res.scores.append, res.best[k] = )": (
        "for i, w in enumerate(words):\n"
        "    res.scores.append(len(w) * i)\n"
        "    res.best[w] = i\n",
        lambda: {"words": WORDS, "res": _Results()},
    ),
    "a running mean, a new value from the last (floats, bit for bit)": (
        "for i, x in enumerate(xs):\n    mean = mean + (x - mean) / (i + 1)\n",
        lambda: {"xs": [0.1 * k**1.5 for k in range(40)], "mean": 0.0},
    ),
    "an EMA started from None, the heavy part on the engines": (
        "for b in batches:\n"
        "    loss = sum(v * v for v in b) / len(b)\n"
        "    ema = loss if ema is None else 0.9 * ema + 0.1 * loss\n",
        lambda: {"batches": [[k, k + 0.5, k / 3] for k in range(25)], "ema": None},
    ),
    "bigram counts: setdefault, then a nested get + 1 made on the kernel": (
        "for a, b in zip(words, words[1:]):\n"
        "    follows.setdefault(a, {})\n"
        "    follows[a][b] = follows[a].get(b, 0) + 1\n",
        lambda: {"words": WORDS, "follows": {"the": {"end": 5}}},
    ),
    "iterating over a copy of the keys the body adds to": (
        "for k in sorted(index):\n    index.setdefault(k.lower(), set()).add(len(k))\n",
        lambda: {"index": {"Cat": {1}, "dog": {2}, "Dog": {3}}},
    ),
    "a row appended at the frame's end (df.loc[len(df)] = row)": (
        "for i, f in enumerate(files):\n    df.loc[len(df)] = [f, len(f) * 1.5]\n",
        lambda: {
            "files": [f"part-{k}.csv" for k in range(12)],
            "df": pd.DataFrame({"name": ["seed"], "size": [0.0]}),
        },
    ),
}


@pytest.fixture
def run(ip, cluster):
    ip.run_line_magic("config", "GpuCell.inline_below = 0")

    def both(cell: str, make) -> None:
        serial = make()
        exec(compile(cell, "<serial>", "exec"), serial)
        for k in [k for k in ip.user_ns if not k.startswith("_")]:
            if k not in ("In", "Out", "exit", "quit", "get_ipython"):
                ip.user_ns.pop(k)
        ip.user_ns.update(make())
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        for k, v in serial.items():
            if k.startswith("__") or k in ("heapq", "bisect"):
                continue
            got = ip.user_ns[k]
            if isinstance(v, (dict, deque, Counter)):
                assert type(got) is type(v), k
                assert _plain(v) == _plain(got), f"{k}: {v!r} != {got!r}"
                assert list(v) == list(got), f"{k}: key order"
            else:
                assert identical(v, got), f"{k}: {v!r} != {got!r}"

    yield both
    ip.run_line_magic("config", "GpuCell.inline_below = 0.005")


def _plain(v):
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, deque):
        return list(v)
    return v


@pytest.mark.parametrize("case", list(CASES))
def test_a_replayed_change_equals_the_serial_run(run, case):
    cell, make = CASES[case]
    assert not analyse(cell, known_names=make().keys(), raise_errors=False).diagnostics
    run(textwrap.dedent(cell), make)


def test_a_replayed_change_that_fails_serially_fails_with_nothing_merged(
    ip, cluster
) -> None:
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    try:
        index = {"the": set()}
        ip.user_ns.update(words=WORDS, index=index, out=[])
        cell = "for i, w in enumerate(words):\n    out.append(i)\n    index[w].add(i)\n"
        with pytest.raises(KeyError) as err:
            ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        assert "replayed on the kernel" in "\n".join(err.value.__notes__)
        assert ip.user_ns["index"] == {"the": set()} and ip.user_ns["out"] == []
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")


def test_another_objects_method_is_refused_before_anything_runs(ip, cluster) -> None:
    class Meter:
        def __init__(self):
            self.calls = 0

        def subtract(self, v):
            self.calls += 1

    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    try:
        meter = Meter()
        ip.user_ns.update(meter=meter, out=[])
        cell = "for i in range(4):\n    out.append(i)\n    meter.subtract(i)\n"
        with pytest.raises(NotParallelizable, match="only for sets, dicts"):
            ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        assert meter.calls == 0 and ip.user_ns["out"] == []
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")


def test_an_update_that_fails_serially_fails_with_nothing_merged(ip, cluster) -> None:
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    try:
        ip.user_ns.update(xs=[3, 2, 1, 0, 5], acc=1.0, out=[])
        cell = "for x in xs:\n    out.append(x)\n    acc = acc / x\n"
        with pytest.raises(ZeroDivisionError) as err:
            ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        assert "update number 4 of 5" in "\n".join(err.value.__notes__)
        assert ip.user_ns["acc"] == 1.0 and ip.user_ns["out"] == []
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")


def test_a_method_of_an_attribute_that_is_not_a_container_is_refused(
    ip, cluster
) -> None:
    class Bar:
        def __init__(self):
            self.n = 0

        def add(self, k):
            self.n += k

    class Run:
        def __init__(self):
            self.bar = Bar()

    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    try:
        run_ = Run()
        ip.user_ns.update(run_=run_, out=[])
        cell = "for i in range(4):\n    out.append(i)\n    run_.bar.add(i)\n"
        with pytest.raises(NotParallelizable, match=r"changes `run_\.bar`, a `Bar`"):
            ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        assert run_.bar.n == 0 and ip.user_ns["out"] == []
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")


def test_a_shadowed_builtin_in_a_replayed_update_is_the_notebooks(ip, cluster) -> None:
    # `max` is the notebook's own: serially `best = max(best, x) * 1` calls it
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    try:
        ip.user_ns.update(xs=[3, 1, 4, 1, 5], best=0, max=lambda a, b: a + b)
        cell = "for x in xs:\n    best = max(best, x) * 1\n"
        plan = analyse(cell, known_names=["xs", "best", "max"])
        assert [r.target for r in plan.spelled.replayed.values()] == ["best"]
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        assert ip.user_ns["best"] == 14  # (the builtin would give 5)
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")
        ip.user_ns.pop("max", None)


def test_a_container_read_elsewhere_is_not_replayed() -> None:
    plan = analyse(
        "for i, w in enumerate(words):\n    index[w].add(i)\n    k = len(index)\n",
        known_names={"words", "index"},
        raise_errors=False,
    )
    assert not plan.spelled.replayed


def test_a_container_iterated_as_it_changes_is_not_replayed() -> None:
    # serially the loop would see (or fail on) the keys the body adds; a
    # copy made before the loop (`list(index)`) is another matter
    for header, replayed in [
        ("for k in index:", False),
        ("for k in index.keys():", False),
        ("for k in sorted(index, key=lambda k: len(index[k])):", False),
        ("for k in list(index):", True),
    ]:
        cell = f"{header}\n    index.setdefault(k.lower(), set()).add(1)\n"
        plan = analyse(cell, known_names={"index"}, raise_errors=False)
        assert bool(plan.spelled.replayed) is replayed, header


def test_a_shadowed_list_in_the_header_is_not_a_copy() -> None:
    cell = "list = iter\nfor k in list(index):\n    index.setdefault(k, set()).add(1)\n"
    plan = analyse(cell, known_names={"index"}, raise_errors=False)
    assert not plan.spelled.replayed
