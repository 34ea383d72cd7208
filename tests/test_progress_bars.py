"""A progress bar made before the loop and driven by the body
(``bar.update(1)``, ``bar.set_postfix(...)``, ``bar.set_description(...)``):
the kernel makes the calls on the bar in iteration order at the merge
(``core/progressbars.py``), so the bar ends as the serial cell leaves it;
a body that reads the bar, or calls another of its methods, is refused before
anything runs.
"""

from __future__ import annotations

import io

import pytest
from tqdm import tqdm

from gpucell.core.progressbars import is_progress_bar
from gpucell.errors import InputNotSendable, NotParallelizable

pytestmark = pytest.mark.cluster

CELLS = {
    "update(1)": "for x in items:\n    out.append(x * 2)\n    bar.update(1)\n",
    "update() and update(n)": (
        "for x in items:\n    bar.update()\n    out.append(x)\n    bar.update(x % 3)\n"
    ),
    "set_postfix then update": (
        "for x in items:\n"
        "    loss = (x - 4) ** 2 / 2\n"
        "    out.append(loss)\n"
        "    bar.set_postfix(loss=loss, step=x)\n"
        "    bar.update(1)\n"
    ),
    "set_description with an f-string": (
        "for x in items:\n    bar.set_description(f'item {x}')\n    out.append(-x)\n"
    ),
}


def _state(bar: tqdm) -> tuple:
    return bar.n, bar.total, bar.desc, bar.postfix


@pytest.fixture
def run(ip, cluster):
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    yield ip
    ip.run_line_magic("config", "GpuCell.inline_below = 0.005")
    for name in ("bar", "out", "items"):
        ip.user_ns.pop(name, None)


def _fresh(ns: dict) -> None:
    ns.update(items=list(range(10)), out=[])
    ns["bar"] = tqdm(total=10, file=io.StringIO(), mininterval=0)


@pytest.mark.parametrize("case", list(CELLS))
def test_a_bar_driven_by_the_body_ends_as_serially(run, case):
    cell = CELLS[case]
    serial: dict = {}
    _fresh(serial)
    exec(cell, serial)
    _fresh(run.user_ns)
    run.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert run.user_ns["out"] == serial["out"]
    assert _state(run.user_ns["bar"]) == _state(serial["bar"])


def test_the_bar_the_loop_iterates_takes_its_drawing_calls(run):
    # `pbar = tqdm(xs); for x in pbar: pbar.set_postfix(...)`, the usual form
    cell = (
        "for x in bar:\n"
        "    out.append(x * 3)\n"
        "    bar.set_postfix(last=x)\n"
        "    bar.set_description(f'at {x}')\n"
    )
    serial: dict = {"out": []}
    serial["bar"] = tqdm(range(6), file=io.StringIO(), mininterval=0)
    exec(cell, serial)
    run.user_ns.update(out=[], bar=tqdm(range(6), file=io.StringIO(), mininterval=0))
    run.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert run.user_ns["out"] == serial["out"]
    assert _state(run.user_ns["bar"]) == _state(serial["bar"])


def test_an_iterated_object_that_is_not_a_bar_is_not_drawn_on(run):
    class Feed(list):
        def set_postfix(self, **kw):
            self.append(kw)

    run.user_ns.update(out=[], bar=Feed([1, 2, 3]))
    cell = "for x in bar:\n    out.append(x)\n    bar.set_postfix(k=x)\n"
    with pytest.raises(NotParallelizable):
        run.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert run.user_ns["bar"] == [1, 2, 3] and run.user_ns["out"] == []


def test_a_body_that_reads_the_bar_is_refused_before_anything_runs(run):
    _fresh(run.user_ns)
    cell = "for x in items:\n    bar.update(1)\n    out.append(bar.n)\n"
    with pytest.raises(NotParallelizable):
        run.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert run.user_ns["bar"].n == 0 and run.user_ns["out"] == []


def test_a_method_that_does_more_than_draw_is_refused(run, capsys):
    # (a bar on the notebook's stderr, as notebooks make them: it cannot
    # travel to the engines, and is not replayed)
    run.user_ns.update(items=list(range(10)), out=[], bar=tqdm(total=10))
    cell = "for x in items:\n    out.append(x)\n    bar.reset(total=x)\n"
    with pytest.raises(InputNotSendable, match="`bar`"):
        run.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert run.user_ns["bar"].total == 10 and run.user_ns["out"] == []


def test_a_progress_bar_is_known_by_its_class_not_its_name():
    from tqdm.auto import tqdm as auto_bar

    class Bar:
        def update(self, n=1):
            pass

    assert is_progress_bar(auto_bar(total=1, file=io.StringIO()))
    assert not is_progress_bar(Bar()) and not is_progress_bar({})
