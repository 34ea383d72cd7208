"""``%%gpu_parallel --background`` in a terminal-style IPython shell (the
``ip`` fixture: no event loop, so a daemon thread drives the run), and the
kernel side of the wait rule (kernel/background.py): the run's footprint as
names, other names of its objects, start order, the check's cost."""

from __future__ import annotations

import statistics
import time

import pytest
from IPython.core.error import UsageError

from gpucell.core.waitrule import Footprint
from gpucell.kernel import background, background_wait, session

pytestmark = pytest.mark.cluster


@pytest.fixture
def shell(ip, cluster):
    ip.run_cell("import time")
    yield ip
    background.shutdown()  # nothing left pending for other tests


def _cell(ip, code: str):
    r = ip.run_cell(code, store_history=True)
    return r


def test_a_background_cell_in_a_terminal_is_driven_by_a_thread(shell, capsys):
    shell.user_ns.update(data=list(range(8)), scale=3)
    t0 = time.perf_counter()
    r = _cell(
        shell,
        "%%gpu_parallel -b\nout = []\nfor v in data:\n    time.sleep(0.2)\n"
        "    out.append(v * scale)\n    print('it', v)\n",
    )
    assert r.success and time.perf_counter() - t0 < 1.0
    bg = background.runs[-1]
    assert bg.state == "running" and bg._driver is not None
    assert isinstance(bg._driver, background.ThreadDriver)
    _cell(shell, "z = 1")
    assert bg.pending and "z" in shell.user_ns
    capsys.readouterr()
    r = _cell(shell, "n = len(out)")
    assert r.success and shell.user_ns["n"] == 8
    text = capsys.readouterr().out
    assert "(this cell uses `out`, which the run writes)" in text
    its = [ln for ln in text.splitlines() if "] it " in ln]
    assert [int(ln.split()[-1]) for ln in its] == list(range(8))
    assert bg.state == "merged" and bg.tail is None  # what it held, let go
    assert background_wait._HOOKS is None  # no run pending: no hooks


def test_cancel_keeps_the_finished_chunks_for_resume(shell, capsys):
    cell = (
        "%%gpu_parallel -b --quiet --schedule dynamic --chunksize 1\nacc = []\n"
        "for v in range(10):\n    time.sleep(0.3)\n    acc.append(v)\n"
    )
    _cell(shell, cell)
    bg = background.runs[-1]
    time.sleep(1.2)
    bg.cancel()
    assert bg.state == "cancelled" and not bg.pending
    assert shell.user_ns["acc"] == []  # the prelude ran; nothing was merged
    text = capsys.readouterr().out
    assert "was cancelled" in text and "are kept" in text
    r = _cell(shell, cell.replace("-b --quiet", "--resume --quiet"))
    assert r.success and shell.user_ns["acc"] == list(range(10))
    assert "resuming:" in capsys.readouterr().out


def test_a_timeout_is_raised_in_the_next_cell_that_waits(shell):
    from gpucell.errors import CellTimeout

    _cell(
        shell,
        "%%gpu_parallel -b --quiet --timeout 1\nslow = []\n"
        "for v in range(20):\n    time.sleep(0.5)\n    slow.append(v)\n",
    )
    bg = background.runs[-1]
    deadline = time.monotonic() + 10
    while bg.state == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert bg.state == "failed" and isinstance(bg.error, CellTimeout)
    r = _cell(shell, "print(slow)")
    assert isinstance(r.error_in_exec, CellTimeout)
    assert "--timeout 1 s reached" in str(r.error_in_exec)
    assert shell.user_ns["slow"] == []


def test_refusals_before_anything_runs(shell):
    shell.user_ns.pop("ctx_out", None)
    with pytest.raises(UsageError, match="inside a `with` block"):
        shell.run_cell_magic(
            "gpu_parallel",
            "-b",
            "import contextlib\nctx_out = []\nwith contextlib.nullcontext():\n"
            "    for v in range(3):\n        ctx_out.append(v)\n",
        )
    assert "ctx_out" not in shell.user_ns  # not even the prelude ran
    with pytest.raises(UsageError, match="not a cell number"):
        shell.run_line_magic("gpu_wait", "abc")
    with pytest.raises(UsageError, match="no background run of cell"):
        shell.run_line_magic("gpu_wait", "99999")


def test_the_footprint_names_the_runs_objects_by_every_name(shell):
    import numpy as np

    ns = shell.user_ns
    items = [[1], [2]]
    ns.update(
        items=items,
        first=items[0],  # held by the iterable
        cfg={"k": 2},
        n=3,
        np=np,
        arr=np.arange(6.0),
    )
    ns["view"] = ns["arr"][2:]  # shares memory with an input
    ns["box"] = {"c": ns["cfg"]}  # holds an input
    _cell(shell, "def make(o):\n    return lambda: o\nkeep = make(cfg)")
    _cell(
        shell,
        "%%gpu_parallel -b --quiet\nres = []\nfor it in items:\n"
        "    res.append(len(it) * cfg['k'] * n + arr.sum() + np.pi)\n"
        "total = len(res)\n",
    )
    fp = background.runs[-1].footprint
    try:
        assert {"res", "it"} <= fp.writes
        assert {"items", "cfg", "arr"} <= fp.reads
        assert not {"n", "np", "len"} & fp.reads  # harmless to use
        assert fp.epilogue == {"total", "res"} and fp.bound_only == {"len"}
        aliases = dict(fp.aliases)
        assert aliases["first"].startswith("is `items[0]`")
        assert aliases["view"] == "shares memory with `arr`"
        assert aliases["box"].startswith("holds")
        assert aliases["keep"] == "holds `cfg` (in its closure or defaults)"
    finally:
        _cell(shell, "%gpu_wait")


class _Fake(background.BackgroundRun):
    def __init__(self, cell: int, fp: Footprint) -> None:
        super().__init__(None, cell)
        self.footprint = fp


@pytest.fixture
def own_session():
    """A Session of the test's own: its pending runs are the test's."""
    with session.using() as s:
        yield s


def test_waiting_for_a_later_run_waits_for_every_run_before_it(
    shell, monkeypatch, own_session
):
    settled: list[tuple[int, str]] = []

    def settle(shell, bg, why):
        background._pending().remove(bg)
        settled.append((bg.cell, why))

    monkeypatch.setattr(background_wait, "_settle", settle)
    one = _Fake(1, Footprint(writes=frozenset({"a"})))
    two = _Fake(2, Footprint(writes=frozenset({"b"})))
    three = _Fake(3, Footprint(writes=frozenset({"c"})))
    own_session.pending[:] = [one, two, three]
    background.settle_for(shell, "x = 1\nprint(x)")
    assert settled == []
    background.settle_for(shell, "print(b)")
    assert settled == [
        (1, "before the run of cell [2]"),
        (2, "this cell uses `b`, which the run writes"),
    ]
    assert background._pending() == [three]


def test_the_kernels_check_of_an_unrelated_cell_costs_under_a_millisecond(
    shell, own_session
):
    """What a cell that waits for nothing pays while a run is pending: the
    quick check before it (its text's words, the notebook code they name) and,
    when a word of the run's is in it only as its own name (a comprehension's
    `i`), the look at its code as IPython parsed it (the medians are printed
    for the record)."""
    import ast

    ns = shell.user_ns
    for k in range(300):  # a notebook's worth of names
        ns[f"v{k}"] = list(range(k % 7))
    _cell(shell, "def helper(x):\n    return x * 2\nclass Net:\n    pass")
    run = _Fake(
        1,
        Footprint(
            writes=frozenset({"out", "total", "i"}),
            reads=frozenset({"data", "model"}),
            epilogue=frozenset({"best"}),
            bound_only=frozenset({"print"}),
            aliases=(("alias", "is the same object as `out`"),),
        ),
    )
    own_session.pending[:] = [run]
    cell = (
        "import pandas as pd\nframe = pd.DataFrame({'a': v1, 'b': v2})\n"
        "m = Net()\ny = helper(frame['a'].sum())\nprint(y, len(v3))\n"
        + "\n".join(f"w{k} = v{k} + [helper({k})]" for k in range(20))
    )
    quick, look = [], []
    for j in range(300):
        text = cell + f"\n# {j}"  # a text never seen: nothing cached
        t0 = time.perf_counter()
        assert not background.might_touch(shell, text)
        quick.append(time.perf_counter() - t0)
        text += "\nsquares = [i * i for i in range(4)]"
        tree = ast.parse(text)  # (IPython's parse, done anyway)
        t0 = time.perf_counter()
        assert background.might_touch(shell, text)
        background.settle_for(shell, text, tree)
        look.append(time.perf_counter() - t0)
    q, k = statistics.median(quick), statistics.median(look)
    print(
        f"unrelated 25-line cell: quick check {q * 1e6:.0f} us, look {k * 1e6:.0f} us"
    )
    assert q < 0.001 and k < 0.001, (q, k)
    assert background._pending() == [run]
