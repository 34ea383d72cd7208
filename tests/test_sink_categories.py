"""Sinks of issue 28 §3 without a cluster: each cell is analysed, run chunk
by chunk with random boundaries through the engine's ``run_chunk`` and merged
(tests/cellgen.run_parallel_local), and must leave exactly the serial
namespace, or be refused.  Values are chosen with ties and nans, where a
merge that folds the chunks' results in the wrong order or the wrong way
round would differ."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucell.core.analysis import analyse
from gpucell.errors import NotParallelizable

sys.path.insert(0, str(Path(__file__).parent))
from cellgen import run_parallel_local  # noqa: E402

_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

#: scores with many ties (small ints as floats)
scores = st.lists(st.integers(0, 4).map(float), min_size=0, max_size=12)
cuts = st.lists(st.floats(0, 1), max_size=5)


def _same(a: Any, b: Any) -> bool:
    """Exact equality, a nan equal to a nan, and the type too (``1`` is not ``1.0``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    try:
        import numpy as np

        if isinstance(a, np.ndarray):
            return a.dtype == b.dtype and bool(np.array_equal(a, b, equal_nan=True))
    except ImportError:  # pragma: no cover
        pass
    return bool(a == b)


def _check(cell: str, setup: dict[str, Any], cut: list[float]) -> None:
    serial: dict[str, Any] = {"__builtins__": __builtins__, **setup}
    exec(cell, serial)
    parallel: dict[str, Any] = {"__builtins__": __builtins__, **setup}
    run_parallel_local(cell, parallel, cut)
    names = {k for k in serial if not k.startswith("__")}
    assert names == {k for k in parallel if not k.startswith("__")}
    for k in names:
        assert _same(serial[k], parallel[k]), (k, serial[k], parallel[k])


def _plan(cell: str, known: tuple[str, ...] = ("xs",)):
    return analyse(cell, known_names=known)


# ---------------------------------------------------------------- running bests

ARGMIN = """
best = {start}
best_i = None
for i, x in enumerate(xs):
    if {test}:
        best = x
        best_i, tag = i, f"it{{i}}"
"""


@_SETTINGS
@given(
    xs=scores,
    cut=cuts,
    test=st.sampled_from(
        ["x < best", "x <= best", "x > best", "x >= best", "best > x", "best <= x"]
    ),
    start=st.sampled_from(["float('inf')", "float('-inf')", "2.0", "float('nan')"]),
)
def test_a_running_best_with_its_payloads_is_the_serial_one(
    xs: list[float], cut: list[float], test: str, start: str
) -> None:
    """Ties (first for ``<``, last for ``<=``), a start no score beats, a nan
    start (nothing is ever taken) and chunks that take nothing."""
    _check(ARGMIN.format(start=start, test=test), {"xs": xs}, cut)


@_SETTINGS
@given(
    xs=st.lists(
        st.sampled_from([0.0, 1.0, 2.0, -0.0, math.nan]), min_size=1, max_size=10
    ),
    cut=cuts,
)
def test_a_running_best_from_none_is_the_serial_one_or_refused(
    xs: list[float], cut: list[float]
) -> None:
    cell = (
        "best = None\nfor i, x in enumerate(xs):\n"
        "    if best is None or x < best:\n        best = x\n        at = i\n"
    )
    try:
        _check(cell, {"xs": xs}, cut)
    except NotParallelizable:
        # a chunk that took a nan first (`best is None`) kept nothing after
        # it: refused, nothing merged, never silently another best
        assert any(math.isnan(x) for x in xs)


@pytest.mark.parametrize(
    "cell",
    [
        # the running value read elsewhere in the body
        "best = 9\nfor x in xs:\n    if x < best:\n        best = x\n        at = x\n"
        "    seen = best\n",
        # a payload read in the body
        "best = 9\nat = 0\nfor x in xs:\n    if x < best:\n        best = x\n"
        "        at = at + 1\n",
        # an else: the other branch depends on the running value
        "best = 9\nfor x in xs:\n    if x < best:\n        best = x\n        at = x\n"
        "    else:\n        miss = x\n",
        # a tolerance: the pick depends on where the fold starts
        "best = 9\nfor x in xs:\n    if x < best - 1:\n        best = x\n"
        "        at = x\n",
        # an effect in the branch
        "best = 9\nfor x in xs:\n    if x < best:\n        best = x\n"
        "        print(x)\n",
        # a call with effects stored with the best
        "best = 9\nfor x in xs:\n    if x < best:\n        best = x\n"
        "        path = save(x)\n",
        # `min` beside a payload: the payload's test reads the running value
        "for e, x in enumerate(xs):\n    if x < best:\n        at = e\n"
        "    best = min(best, x)\n",
        "for e, x in enumerate(xs):\n    best = min(best, x)\n    if best == x:\n"
        "        at = e\n",
        # the stored value is not the compared one
        "best = 9\nfor x in xs:\n    if x < best:\n        best = x + 1\n"
        "        at = x\n",
    ],
)
def test_what_is_not_an_exact_running_best_stays_refused(cell: str) -> None:
    with pytest.raises(NotParallelizable):
        _plan(cell, ("xs", "save"))


def test_scores_whose_order_is_not_total_are_refused_at_merge() -> None:
    """Sets compare by inclusion: the best of the chunks' bests need not be
    the serial one; nothing is merged."""
    cell = (
        "best = {1, 2, 3, 4}\nfor i, s in enumerate(xs):\n    if s < best:\n"
        "        best = s\n        at = i\n"
    )
    ns: dict[str, Any] = {"xs": [{1, 2}, {3}, {1}, {4}]}
    with pytest.raises(NotParallelizable, match="not total"):
        run_parallel_local(cell, ns, [0.5])
    assert "at" not in ns and ns["best"] == {1, 2, 3, 4}


def test_a_running_best_is_described_as_min_or_max() -> None:
    plan = _plan(
        "best = 0\nfor i, x in enumerate(xs):\n    if best < x:\n"
        "        best = x\n        at = i\n"
    )
    (b,) = plan.bests
    assert (
        b.kind == "max"
        and b.describe() == "running maximum with at (the first of equal scores)"
    )


# ---------------------------------------------------------------- keyed max / min

KEYED = {
    "get": "top = {{}}\nfor k, v in kv:\n    top[k] = {op}(top.get(k, {start}), v)\n",
    "missing": "top = {{}}\nfor k, v in kv:\n    if k not in top or {better}:\n"
    "        top[k] = v\n",
    "existing": "top = dict.fromkeys('abc', {start})\nfor k, v in kv:\n"
    "    top[k] = {op}(top[k], v)\n",
    "setdefault": "top = {{}}\nfor k, v in kv:\n"
    "    top[k] = {op}(top.setdefault(k, v), v)\n",
}
_BETTER = {"max": ["v > top[k]", "top[k] < v"], "min": ["v < top[k]", "top[k] > v"]}

pairs = st.lists(
    st.tuples(
        st.sampled_from("abc"),
        st.one_of(st.integers(0, 3), st.integers(0, 3).map(float)),
    ),
    max_size=12,
)


@_SETTINGS
@given(
    kv=pairs,
    cut=cuts,
    form=st.sampled_from(sorted(KEYED)),
    op=st.sampled_from(["max", "min"]),
    start=st.sampled_from(["0", "2", "float('-inf')", "float('inf')", "1.0"]),
    which=st.integers(0, 1),
)
def test_a_keyed_running_max_or_min_is_the_serial_one(
    kv: list[tuple[str, float]],
    cut: list[float],
    form: str,
    op: str,
    start: str,
    which: int,
) -> None:
    """Equal values of two types (``1`` and ``1.0``: the first one stays, as
    the builtin keeps it), keys first seen in a later chunk."""
    cell = KEYED[form].format(op=op, start=start, better=_BETTER[op][which])
    _check(cell, {"kv": kv}, cut)


@_SETTINGS
@given(
    kv=st.lists(
        st.tuples(st.sampled_from("ab"), st.sampled_from([0.0, 1.0, 2.0, math.nan])),
        max_size=10,
    ),
    cut=cuts,
    form=st.sampled_from(sorted(KEYED)),
)
def test_a_keyed_max_with_nans_is_the_serial_one_or_refused(
    kv: list[tuple[str, float]], cut: list[float], form: str
) -> None:
    """A nan never wins a comparison: serially it stays only as a key's first
    value; on an engine it hides what follows it in the chunk.  Either the
    serial result or a refusal with nothing merged."""
    cell = KEYED[form].format(op="max", start="0.0", better="v > top[k]")
    try:
        _check(cell, {"kv": kv}, cut)
    except NotParallelizable:
        assert any(math.isnan(v) for _, v in kv)


@pytest.mark.parametrize(
    "cell",
    [
        # the dict read elsewhere
        "for k, v in kv:\n    top[k] = max(top.get(k, 0), v)\n    n = len(top)\n",
        # a default that is not a number
        "for k, v in kv:\n    top[k] = max(top.get(k, v), v)\n",
        # the test is not the builtin's (`>=` replaces equal values)
        "for k, v in kv:\n    if k not in top or v >= top[k]:\n        top[k] = v\n",
        # the key is a call: evaluated once here, twice serially
        "for k, v in kv:\n    top[f(k)] = max(top.get(f(k), 0), v)\n",
        # another key's value read
        "for k, v in kv:\n    top[k] = max(top.get(k, 0), top.get('a', 0) + v)\n",
    ],
)
def test_what_is_not_a_keyed_running_max_stays_refused(cell: str) -> None:
    with pytest.raises(NotParallelizable):
        _plan(cell, ("kv", "top", "f"))


# ------------------------------------------------ ufunc.at into an outer array


@_SETTINGS
@given(
    groups=st.lists(
        st.lists(st.integers(-4, 3), min_size=0, max_size=4), min_size=0, max_size=8
    ),
    weights=st.lists(
        st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=False),
        min_size=4,
        max_size=4,
    ),
    cut=cuts,
    ufunc=st.sampled_from(["add", "subtract", "maximum", "minimum", "multiply"]),
)
def test_a_ufunc_at_into_an_outer_array_is_the_serial_one_bit_for_bit(
    groups: list[list[int]], weights: list[float], cut: list[float], ufunc: str
) -> None:
    """Repeated and negative indices, float weights whose sums round: the
    calls are replayed in iteration order, so even a float sum is exact."""
    import numpy as np

    setup = {
        "np": np,
        "groups": [np.array(g, dtype=int) for g in groups],
        "w": np.array(weights),
        "hist": np.linspace(-3.0, 7.0, 4),
    }
    cell = (
        "alias = hist\nfor k, g in enumerate(groups):\n"
        f"    np.{ufunc}.at(hist, g, w[: len(g)] * (k + 0.1))\n"
        "same = alias is hist\n"
    )
    _check(cell, setup, cut)


@pytest.mark.parametrize(
    "cell",
    [
        # the array read in the body: it sees the calls so far
        "for g in groups:\n    np.add.at(hist, g, 1.0)\n    top = hist.max()\n",
        # the indices read from the array itself
        "for g in groups:\n    np.add.at(hist, hist > 0, 1.0)\n",
    ],
)
def test_a_ufunc_at_whose_array_is_read_stays_refused(cell: str) -> None:
    with pytest.raises(NotParallelizable):
        _plan(cell, ("np", "groups", "hist"))


def test_a_ufunc_at_into_a_list_fails_the_merge_as_serially() -> None:
    import numpy as np

    ns: dict[str, Any] = {"np": np, "groups": [[0], [1]], "hist": [0.0, 0.0]}
    with pytest.raises(TypeError):
        run_parallel_local("for g in groups:\n    np.add.at(hist, g, 1.0)\n", ns)
    assert ns["hist"] == [0.0, 0.0]


# ------------------------------------------------ a frame's own row read back


def _frame(n: int) -> Any:
    import pandas as pd

    return pd.DataFrame(
        {"units": list(range(n)), "price": [1.5 * k for k in range(n)], "tag": "x"}
    )


FRAME_CELLS = [
    # the corpus's loop: a cell written, then read back for another column
    'df["revenue"] = 0.0\nfor i in range(len(df)):\n'
    '    df.loc[i, "revenue"] = df.loc[i, "units"] * df.loc[i, "price"]\n'
    '    df.loc[i, "band"] = "high" if df.loc[i, "revenue"] > 5 else "low"\n',
    # several read-modify-write statements on one own row, `.at`, iterrows
    "for idx, r in df.iterrows():\n"
    '    df.at[idx, "price"] = df.at[idx, "price"] * 2\n'
    '    df.at[idx, "price"] += r["units"]\n'
    '    df.at[idx, "units"] = df.at[idx, "units"] + 1\n'
    '    df.at[idx, "tag"] = df.at[idx, "tag"] + str(df.at[idx, "units"])\n',
    # a write under an if, read back after it; a new float column
    "for i in df.index:\n"
    '    if df.loc[i, "units"] % 2:\n'
    '        df.loc[i, "half"] = df.loc[i, "price"] / 2\n'
    '        df.loc[i, "price"] = df.loc[i, "half"]\n',
]


@pytest.mark.parametrize("cell", FRAME_CELLS)
@pytest.mark.parametrize("cut", [[0.5], [0.2, 0.6], []])
def test_a_frames_own_row_read_back_is_the_serial_one(cell: str, cut) -> None:
    import pandas as pd

    serial: dict[str, Any] = {"df": _frame(7)}
    exec(cell, serial)
    parallel: dict[str, Any] = {"df": _frame(7)}
    alias = parallel["df"]
    run_parallel_local(cell, parallel, cut)
    pd.testing.assert_frame_equal(serial["df"], parallel["df"])
    assert parallel["df"] is alias  # changed in place, as serially


def test_a_column_whose_type_an_iteration_changes_is_refused_at_merge() -> None:
    """The first iteration makes the new column strings, the second stores a
    number in its own copy: serially it would store into a string column."""
    cell = (
        "for i in range(len(df)):\n"
        '    df.loc[i, "note"] = "big" if df.loc[i, "units"] > 3 else i\n'
        '    df.loc[i, "n"] = len(str(df.loc[i, "note"]))\n'
    )
    df = _frame(6)
    with pytest.raises(NotParallelizable, match="`df\\['note'\\]`"):
        run_parallel_local(cell, {"df": df}, [0.5])
    assert list(df.columns) == ["units", "price", "tag"]


def test_a_frame_read_at_another_row_stays_refused() -> None:
    cell = (
        "for i in range(1, len(df)):\n"
        '    df.loc[i, "units"] = df.loc[i - 1, "units"] + 1\n'
        '    df.loc[i, "price"] = df.loc[i, "units"] * 2\n'
    )
    with pytest.raises(NotParallelizable):
        _plan(cell, ("df",))


def test_every_sink_kind_has_its_merge() -> None:
    """Each sink kind is a class of core/analysis/sinks.py, in MERGE_ORDER
    once, and core/merge.SINK_MERGES is keyed by those classes: a new kind
    without its merge (or a merge without its kind) fails here."""
    from gpucell.core.analysis import sinks
    from gpucell.core.merge import SINK_MERGES

    def subclasses(c: type) -> set[type]:
        return {s for d in c.__subclasses__() for s in {d, *subclasses(d)}}

    order = sinks.MERGE_ORDER
    assert len(order) == len(set(order)) and set(order) == set(SINK_MERGES)
    assert set(order) == subclasses(sinks.SinkKind) and order[-1] is sinks.LocalSink
    assert set(sinks.KINDS) <= set(order)
    kinds = [k.kind for k in order]
    assert len(kinds) == len(set(kinds))
    named = {sinks.GATHER, sinks.WRITE, sinks.REDUCTION, sinks.KEYED}
    named |= {sinks.KEYED_GATHER, sinks.UNION, sinks.LOCAL}
    assert named <= set(kinds)


def test_a_new_column_read_back_over_iterrows_is_the_serial_one() -> None:
    """``iterrows`` reads the frame once, when the loop starts: the later rows
    have no column an earlier iteration made, serially as on the engines."""
    import pandas as pd

    cell = (
        "for idx, r in df.iterrows():\n"
        '    df.at[idx, "twice"] = r["units"] * 2\n'
        '    df.at[idx, "price"] = df.at[idx, "twice"] + len(r)\n'
    )
    serial: dict[str, Any] = {"df": _frame(5)}
    exec(cell, serial)
    parallel: dict[str, Any] = {"df": _frame(5)}
    run_parallel_local(cell, parallel, [0.5])
    pd.testing.assert_frame_equal(serial["df"], parallel["df"])


def test_a_ufunc_at_into_the_array_the_loop_iterates_stays_refused() -> None:
    with pytest.raises(NotParallelizable):
        _plan("for v in hist:\n    np.add.at(hist, [0], v)\n", ("np", "hist"))
