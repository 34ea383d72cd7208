"""Nested loops over inputs (``for xb in loader:`` then ``loss.item()``): taken
to run by the analysis, checked non-empty by the kernel before the run."""

from __future__ import annotations

import pytest

from gpucell.core.analysis import analyse
from gpucell.errors import NotParallelizable

TRAIN = """\
losses = {}
for lr in [0.1, 0.2, 0.3]:
    w = 0.0
    for epoch in range(epochs):
        for x, y in data:
            loss = (w * x - y) ** 2
            w -= lr * 2 * (w * x - y) * x
    losses[lr] = loss
"""


def test_reads_after_loops_over_inputs_are_accepted_and_checked() -> None:
    plan = analyse(TRAIN, known_names=["epochs", "data"])
    assert plan.ok
    assert plan.nonempty == ((4, "range(epochs)"), (5, "data"))
    assert "`loss` is assigned inside the loop" in str(plan.unless_nonempty[0])


def test_no_check_is_kept_where_the_loop_does_not_need_one() -> None:
    plan = analyse("for i in range(3):\n    for x in data:\n        out.append(x)\n")
    assert plan.ok and plan.nonempty == ()


@pytest.mark.parametrize(
    "inner",
    ["loaders[lr]", "make(lr)", "range(lr)", "data[:k]"],
)
def test_iterables_that_vary_by_iteration_stay_refused(inner: str) -> None:
    src = (
        f"for lr in [1, 2]:\n    k = lr\n    for x in {inner}:\n"
        "        v = x\n    out[lr] = v\n"
    )
    with pytest.raises(NotParallelizable, match="may run zero times"):
        analyse(src, known_names=["loaders", "make", "data", "out"])


@pytest.mark.cluster
def test_the_kernel_checks_them_before_the_run(ip, cluster) -> None:
    ip.user_ns.update(epochs=2, data=[(1.0, 2.0), (2.0, 3.0)])
    ip.run_cell_magic("gpu_parallel", "--quiet", TRAIN)
    par = dict(ip.user_ns["losses"])
    ns = {"epochs": 2, "data": [(1.0, 2.0), (2.0, 3.0)]}
    exec(TRAIN, ns)
    assert par == ns["losses"]
    for data, why in (
        ([], "`data` is empty"),
        (iter([(1.0, 2.0)]), "`data` is an iterator"),
    ):
        ip.user_ns.update(data=data)
        ip.user_ns.pop("losses", None)
        with pytest.raises(NotParallelizable, match=why) as info:
            ip.run_cell_magic("gpu_parallel", "--quiet", TRAIN)
        assert "line 9: `loss` is assigned inside the loop" in str(info.value)
        assert ip.user_ns["losses"] == {}  # the prelude ran, as serially
    ip.user_ns.update(epochs=0, data=[(1.0, 2.0)])
    with pytest.raises(NotParallelizable, match=r"`range\(epochs\)` is empty"):
        ip.run_cell_magic("gpu_parallel", "--quiet", TRAIN)
