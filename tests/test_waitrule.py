"""The rule for when a later cell waits for a pending background run
(gpucell/core/waitrule.py): pure, cell texts in, a reason or None out.

The run of these tests' footprint is the cell

    %%gpu_parallel --background
    out = []
    total = 0.0
    for i, x in enumerate(batches):      # batches: a list (the iterable)
        y = model(x) * scale             # model: an input; scale: a float
        out.append(y)
        total += y
        res[i] = y
    best = max(out)                      # epilogue
    print(best, np.mean(out))

with `alias = out` and `holder = {"m": model}` defined earlier.
"""

from __future__ import annotations

import ast
import statistics
import time

import pytest

from gpucell.core.waitrule import (
    CellUse,
    Footprint,
    cell_use,
    cell_use_of,
    code_uses,
    why_wait,
    why_wait_source,
)

RUN = Footprint(
    writes=frozenset({"out", "total", "i", "x", "y", "res"}),
    reads=frozenset({"batches", "model"}),
    epilogue=frozenset({"best", "out", "np"}),
    bound_only=frozenset({"max", "print"}),
    aliases=(
        ("alias", "is the same object as `out`"),
        ("holder", "holds (as `holder['m']`) `model`"),
    ),
)

#: cells that run at once: they touch none of the run's names
AT_ONCE = [
    "a = 1",
    "z = 40 + 2\nprint(z)",
    "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})\ndf.describe()",
    "[i * 2 for i in range(5)]",  # a comprehension's own i
    "{x: x for x in 'abc'}",
    "sum(y for y in range(3))",
    "def f(x, y):\n    return x + y",  # parameters are the function's own
    "def g(n):\n    i = 0\n    for x in range(n):\n        i += x\n    return i",
    "lambda out: out + 1",
    "class A:\n    out = 3\n    z = out",  # a class body's own name
    "for k in range(3):\n    pass",
    "with open('f.txt') as fh:\n    text = fh.read()",
    "try:\n    v = 1 / 0\nexcept ZeroDivisionError as err:\n    msg = str(err)",
    "gpucell.runs",
    "print(gpucell.runs[-1].progress)",
    "gpucell.last_run",
    "from gpucell import runs",
    "import gpucell",
    "vars(obj)",
    "del unrelated",
    "get_ipython().run_line_magic('gpu_wait', '')",  # %gpu_wait waits by itself
    "s = 'out total batches'",  # words in a string are no names
    "# out = []\nq = 1",
    "print(len(other))",  # builtins the epilogue calls, only read
    "match cmd:\n    case [first, *rest]:\n        pass",
    "async def h():\n    await thing()",
    "values = [v for v in data if (n := len(v)) > 2]",
]

#: cells that wait, and why
WAITS = [
    ("print(out)", "uses `out`, which the run writes"),
    ("out = ['mine']", "uses `out`, which the run writes"),
    ("out.append(1)", "uses `out`, which the run writes"),
    ("del total", "uses `total`, which the run writes"),
    ("print(i)", "uses `i`, which the run writes"),  # the loop's target
    ("x = 0", "uses `x`, which the run writes"),
    ("y += 1", "uses `y`, which the run writes"),
    ("res[0] = 1", "uses `res`, which the run writes"),
    ("batches.append(None)", "uses `batches`, which the run reads"),
    ("batches[0][0] = 1", "uses `batches`, which the run reads"),
    ("model.train()", "uses `model`, which the run reads"),
    ("m2 = model", "uses `model`, which the run reads"),
    ("best = 3", "uses `best`, which the cell's code after its loop uses"),
    ("np.random.seed(0)", "uses `np`, which the cell's code after its loop uses"),
    ("import numpy as np", "uses `np`, which the cell's code after its loop uses"),
    ("print = lambda *a: None", "binds `print`, which the cell's code after"),
    ("def max(*a):\n    return 0", "binds `max`, which the cell's code after"),
    ("alias.clear()", "uses `alias`, which is the same object as `out`"),
    ("holder['m'].eval()", "uses `holder`, which holds"),
    ("def f():\n    return out", "uses `out`, which the run writes"),
    ("def f():\n    global res\n    res = {}", "uses `res`, which the run writes"),
    ("class A:\n    def m(self):\n        return total", "uses `total`"),
    ("[out for _ in range(2)]", "uses `out`"),
    ("[v for v in batches]", "uses `batches`"),  # the first iterable is outer
    ("(w := out)", "uses `out`"),
    ("for i in range(3):\n    pass", "uses `i`, which the run writes"),
    ("import out", "uses `out`"),
    ("from m import total", "uses `total`"),
    ("try:\n    pass\nexcept E as out:\n    pass", "uses `out`"),
    ("with open('f') as total:\n    pass", "uses `total`"),
    # what the text cannot show
    ("get_ipython().run_line_magic('time', 'a = 1')", "uses `%time`"),
    ("get_ipython().run_cell_magic('gpu_parallel', '', 'for k in r: pass')", "%%"),
    ("get_ipython().system('ls')", "runs a shell command"),
    ("exec('a = 1')", "uses `exec`"),
    ("eval('out')", "uses `eval`"),
    ("globals()['q'] = 1", "uses `globals`"),
    ("locals()", "uses `locals`"),
    ("vars()", "uses `vars()`"),
    ("dir()", "uses `dir()`"),
    ("__import__('os')", "uses `__import__`"),
    ("import sys\nsys.modules['__main__'].q = 1", "uses `sys.modules`"),
    ("import __main__", "uses `__main__`"),
    ("f.__globals__['q'] = 1", "uses `.__globals__`"),
    ("import inspect\ninspect.currentframe().f_globals", "uses `.f_globals`"),
    ("print = 3\nprint(1)", "binds `print`"),
    ("def print(*a):\n    pass", "binds `print`"),
    ("class max:\n    pass", "binds `max`"),
    ("from m import *", "import *"),
    ("gpucell.stop()", "uses gpucell's API"),
    ("from gpucell import stop", "uses gpucell's API"),
    ("breakpoint()", "uses `breakpoint`"),
]


@pytest.mark.parametrize("cell", AT_ONCE)
def test_cells_that_touch_nothing_run_at_once(cell: str) -> None:
    assert why_wait(cell_use(cell), RUN) is None
    assert why_wait_source(cell, RUN) is None


@pytest.mark.parametrize(("cell", "why"), WAITS)
def test_cells_that_could_touch_the_run_wait(cell: str, why: str) -> None:
    reason = why_wait(cell_use(cell), RUN)
    assert reason is not None and why in reason, reason
    # the quick path (a scan of the text's words) never misses what the
    # full analysis finds
    assert why_wait_source(cell, RUN) == reason


def test_notebook_code_is_followed_through_what_it_uses() -> None:
    """A call of a notebook function waits when its code (as the kernel
    followed it) uses a name of the run, or cannot be read."""
    cell = "result = helper(3)"
    assert why_wait_source(cell, RUN, {"helper": frozenset({"np", "len"})}) == (
        "uses `helper`, whose code uses `np`"
    )  # (np in the function's code is the epilogue's np)
    pure = {"helper": frozenset({"math", "sqrt"})}
    assert why_wait_source(cell, RUN, pure) is None
    touching = {"helper": frozenset({"append", "out"})}
    assert why_wait_source(cell, RUN, touching) == (
        "uses `helper`, whose code uses `out`"
    )
    unreadable = {"helper": None}
    assert "cannot read" in (why_wait_source(cell, RUN, unreadable) or "")
    sneaky = {"helper": frozenset({"globals"})}
    assert why_wait_source(cell, RUN, sneaky) == (
        "uses `helper`, whose code uses `globals`"
    )


def test_code_uses_reads_nested_code() -> None:
    src = "def f():\n    global res\n    def g():\n        return out.x\n    res = 1\n"
    ns: dict[str, object] = {}
    exec(compile(src, "<t>", "exec"), ns)
    uses = code_uses(ns["f"].__code__)  # type: ignore[attr-defined]
    assert {"res", "out", "x"} <= uses


def test_a_footprint_that_cannot_be_read_makes_every_cell_wait() -> None:
    run = Footprint(always="the code after its loop uses `%time`")
    assert why_wait_source("a = 1", run) == (
        "runs after it: the code after its loop uses `%time`"
    )


def test_silent_executions_are_decided_from_their_code() -> None:
    """The AST transformer decides for executions that skip pre_run_cell."""
    tree = ast.parse("print(out)")
    assert why_wait(cell_use_of(tree), RUN) == "uses `out`, which the run writes"
    assert why_wait(cell_use_of(ast.parse("a = 1")), RUN) is None


def test_a_cell_that_does_not_parse_does_nothing() -> None:
    assert cell_use("for x in") == CellUse()


def test_the_check_on_an_unrelated_cell_costs_well_under_a_millisecond() -> None:
    """What a later cell that waits for nothing pays (the kernel's part, the
    notebook-code lookups, adds a dictionary lookup per word)."""
    cell = "\n".join(
        f"a{k} = pd.Series(range({k})).rolling(3).mean()\nprint(a{k}.sum())"
        for k in range(40)
    )  # 80 lines
    why_wait_source(cell, RUN)
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        why_wait_source(cell + f"\n# {_}", RUN)  # a new text: no cache
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 0.001, times
