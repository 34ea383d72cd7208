"""Loops too cheap to send run in the kernel (inline.py): when, and with the same
result as the engines would give."""

from __future__ import annotations

import pytest

import gpucell
from gpucell.kernel.execute import CellRequest
from gpucell.kernel.inline import should_inline

CHEAP = (
    "sq = []\ntotal = 0\nfor i in range(500):\n    sq.append(i * i)\n    total += i\n"
)


def test_policy_needs_a_cheap_measured_run_and_a_plain_request():
    plain = CellRequest()
    ok = {"uses_cuda": False, "iterations": 500, "threshold": 0.005}
    assert should_inline(request=plain, per_iteration=1e-6, **ok)
    assert not should_inline(request=plain, per_iteration=None, **ok)  # never ran
    assert not should_inline(request=plain, per_iteration=1e-4, **ok)  # 50 ms
    assert not should_inline(
        request=plain, per_iteration=1e-6, **{**ok, "threshold": 0}
    )
    assert not should_inline(
        request=plain, per_iteration=1e-6, **{**ok, "uses_cuda": True}
    )
    for explicit in (
        {"seed": 1},
        {"targets": "0"},
        {"devices": "cpu"},
        {"schedule": "static"},
        {"chunksize": 10},
        {"timeout": 5.0},
    ):
        assert not should_inline(
            request=CellRequest(**explicit), per_iteration=1e-6, **ok
        ), explicit


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

    from gpucell.kernel.inline import shape_of

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
