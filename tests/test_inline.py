"""Loops too cheap to send run in the kernel (inline.py, decided by the cost model
in core/costmodel.py): when, and with the same result as the engines would give."""

from __future__ import annotations

import pytest

import gpucell
from gpucell.core.costmodel import Advice, CostMemory
from gpucell.kernel.execute import CellRequest

CHEAP = (
    "sq = []\ntotal = 0\nfor i in range(500):\n    sq.append(i * i)\n    total += i\n"
)


class _Run:
    """A finished run as the cost model reads it."""

    def __init__(self, work: float, uniform: bool = False, chunks: int = 4) -> None:
        self.work_estimate, self.uniform, self.chunks = work, uniform, chunks

    def done_chunks(self) -> int:
        return self.chunks

    def profile(self):
        return (0.1,) * 500


def test_policy_needs_a_cheap_measured_run_and_a_plain_request():
    mem = CostMemory()
    ok = {"iterations": 500, "shapes": "s", "plain": True, "inline_below": 0.005}
    assert not mem.advise("cell", **ok).inline  # never ran
    mem.learn("cell", _Run(500e-6), iterations=500, shapes="s", previous=Advice())
    assert mem.advise("cell", **ok).inline
    assert not mem.advise("cell", **{**ok, "inline_below": 0}).inline
    assert not mem.advise("cell", **{**ok, "plain": False}).inline
    assert not mem.advise("cell", **{**ok, "shapes": "bigger"}).inline
    assert not mem.advise("cell", **{**ok, "iterations": 100_000}).inline  # 0.1 s
    mem.learn("cell", _Run(0.05), iterations=500, shapes="s", previous=Advice())
    assert not mem.advise("cell", **ok).inline  # 50 ms
    for explicit in (
        {"seed": 1},
        {"targets": "0"},
        {"devices": "cpu"},
        {"schedule": "static"},
        {"chunksize": 10},
        {"timeout": 5.0},
    ):
        assert CellRequest(**explicit).asks_for_engines(), explicit
    assert not CellRequest(quiet=True).asks_for_engines()


def test_the_cost_model_keeps_a_profile_only_for_uneven_loops_worth_it():
    mem = CostMemory()
    uneven = mem.learn("a", _Run(1.0), iterations=500, shapes=0, previous=Advice())
    assert uneven.profile is not None and not uneven.uniform
    even = mem.learn("b", _Run(1.0, True), iterations=500, shapes=0, previous=Advice())
    assert even.profile is None and even.uniform
    cheap = mem.learn("c", _Run(0.01), iterations=500, shapes=0, previous=Advice())
    assert cheap.profile is None
    # two chunks cannot tell uniformity: the verdict that made it static stays
    static = mem.learn(
        "d",
        _Run(1.0, False, 2),
        iterations=500,
        shapes=0,
        previous=Advice(uniform=True),
    )
    assert static.uniform
    advice = mem.advise("a", iterations=500, shapes=0, plain=True, inline_below=0.005)
    assert advice.per_iteration == 1.0 / 500 and advice.profile == uneven.profile


def test_the_cost_memory_forgets_the_least_recently_used_cells():
    mem = CostMemory(cells=3)
    for key in "abc":
        mem.learn(key, _Run(1.0), iterations=10, shapes=0, previous=Advice())
    assert mem.get("a") is not None  # a is now the most recent
    mem.learn("d", _Run(1.0), iterations=10, shapes=0, previous=Advice())
    assert len(mem) == 3 and mem.get("b") is None
    assert all(mem.get(k) is not None for k in "acd")


@pytest.mark.cluster
def test_second_run_of_a_cheap_cell_runs_in_the_kernel_with_the_same_result(
    ip, cluster, capsys
):
    ip.run_cell_magic("gpu_parallel", "--quiet", CHEAP)
    assert not gpucell.last_run.inline  # first run: nothing measured yet
    first = (list(ip.user_ns["sq"]), ip.user_ns["total"])
    ip.user_ns.pop("sq")
    ip.run_cell_magic("gpu_parallel", "", CHEAP)
    assert gpucell.last_run.inline
    assert (ip.user_ns["sq"], ip.user_ns["total"]) == first
    assert first == ([i * i for i in range(500)], sum(range(500)))
    assert "in the kernel" in capsys.readouterr().out
    rows = gpucell.last_run.rows()
    assert [r["iteration"] for r in rows] == list(range(500))
    assert {r["device"] for r in rows} == {"kernel"}


def test_shapes_summarise_what_a_loops_cost_scales_with():
    import numpy as np
    import torch

    from gpucell.core.costmodel import shape_of

    assert shape_of(np.zeros((3, 4))) == ("ndarray", (3, 4), "float64")
    assert shape_of(torch.zeros(2)) == ("Tensor", (2,), "torch.float32")
    small = [np.zeros(10)] * 5
    assert shape_of(small) != shape_of([np.zeros(1000)] * 5)
    assert shape_of(small) != shape_of([np.zeros(10)] * 6)
    assert shape_of(range(10)) == shape_of(range(10)) != shape_of(range(11))
    assert shape_of("abc") == ("str", 3) and shape_of(3) == "int"


@pytest.mark.cluster
def test_the_same_cell_over_bigger_data_is_sent_again(ip, cluster):
    import numpy as np

    cell = "norms = []\nfor a in arrays:\n    norms.append(float(a.sum()))\n"
    ip.user_ns["arrays"] = [np.ones(10) for _ in range(8)]
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert gpucell.last_run.inline  # cheap, and the data as measured
    ip.user_ns["arrays"] = [np.ones(100_000) for _ in range(8)]
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert not gpucell.last_run.inline  # same cell, bigger data: measured again
    assert ip.user_ns["norms"] == [100_000.0] * 8


@pytest.mark.cluster
def test_inline_can_be_turned_off(ip, cluster):
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    try:
        for _ in range(2):
            ip.run_cell_magic("gpu_parallel", "--quiet", CHEAP)
            assert not gpucell.last_run.inline
            assert gpucell.last_run.engines == tuple(cluster.live_ids())
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")


@pytest.mark.cluster
def test_an_exception_in_an_inline_run_merges_nothing(ip, cluster):
    cell = "vals = []\nfor i in range(300):\n    vals.append(10 // (i - limit))\n"
    ip.user_ns["limit"] = -1  # never zero: cheap and fine
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert gpucell.last_run.inline
    ip.user_ns["limit"] = 150
    ip.user_ns["vals"] = "untouched"
    with pytest.raises(ZeroDivisionError) as err:
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert gpucell.last_run.inline and gpucell.last_run.status == "error"
    assert "iteration 150" in "".join(getattr(err.value, "__notes__", []))
    assert ip.user_ns["vals"] == []  # the prelude ran; nothing from the loop
