"""A write sink also read at keys no iteration writes (issue 28 §3, falsely
stopped): ``ts[f"lag_{k}"] = ts["y"].shift(k)`` (lag and rolling features),
``sales.loc[mask, "mean"] = sales.loc[mask, "price"].mean()`` with ``mask``
made from a column of ``sales`` (disjoint rows by a boolean mask), ``d["sq_"
+ str(k)] = d["base"] * k``.  Every written key is a constant, an f-string or
a ``"p" + x`` whose constant prefix (or suffix) the read key lacks, so no
iteration writes what another reads: each read sees the value from before the
loop, serially as on an engine.  Compared with the serial run on a real
cluster; the shapes whose keys may meet stay refused.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import pytest
from test_parallel import assert_serial_equivalent

from gpucell.core.analysis import analyse


def _frame() -> pd.DataFrame:
    r = np.random.default_rng(4)
    return pd.DataFrame(
        {
            "region": r.choice(["n", "s", "e"], size=24),
            "price": r.uniform(1, 9, size=24).round(2),
            "y": np.cumsum(r.normal(size=24)),
        }
    )


RUNS = {
    "lag features": (
        'for lag in range(1, 5):\n    ts[f"lag_{lag}"] = ts["y"].shift(lag)\n',
        lambda: {"ts": _frame()},
    ),
    "rolling means, the window in the name's end": (
        'for w in [2, 3, 5]:\n    ts[f"{w}_roll"] = ts["y"].rolling(w).mean()\n',
        lambda: {"ts": _frame()},
    ),
    "group means by a boolean mask": (
        'import numpy as np\nsales["rm"] = np.nan\n'
        'for reg in sorted(sales["region"].unique()):\n'
        '    mask = sales["region"] == reg\n'
        '    sales.loc[mask, "rm"] = sales.loc[mask, "price"].mean()\n',
        lambda: {"sales": _frame()},
    ),
    "masks that overlap: the last iteration's value stays": (
        "for t in [2.0, 4.0, 6.0]:\n"
        '    m = (sales["price"] > t) & ~(sales["region"] == "s")\n'
        '    sales.loc[m, "band"] = t\n',
        lambda: {"sales": _frame()},
    ),
    "new columns named after a literal list's columns": (
        'for c in ["price", "y"]:\n    ts[c + "_pct"] = ts[c].pct_change()\n'
        '    ts[f"{c}_filled"] = ts[c].fillna(0)\n',
        lambda: {"ts": _frame()},
    ),
    "dict keys made by +": (
        'for k in range(4):\n    d["sq_" + str(k)] = d["base"] * k\n',
        lambda: {"d": {"base": 3}},
    ),
}


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(RUNS))
def test_reads_at_keys_no_iteration_writes_match_the_serial_run(ip, cluster, case):
    cell, ns = RUNS[case]
    p = analyse(textwrap.dedent(cell), raise_errors=False)
    assert not p.diagnostics, [d.text for d in p.diagnostics]
    assert_serial_equivalent(ip, cell, ns())


@pytest.mark.parametrize(
    "src",
    [
        # the read key starts with the written prefix: `y{1}` is `y1`
        'for lag in range(1, 4):\n    ts[f"y{lag}"] = ts["y1"].shift(lag)\n',
        # a key from a list may be the read one
        'for c in cols:\n    ts[c] = ts["y"] * 2\n',
        # a row label may be new (a row added serially, read by later masks)
        'for reg in regs:\n    sales.loc[reg, "rm"] = sales.loc[reg, "price"]\n',
        # a mask not made from the frame's own column
        'for reg in regs:\n    m = other["r"] == reg\n'
        '    sales.loc[m, "rm"] = sales.loc[m, "price"].mean()\n',
        # the frame read whole: it sees the columns written before
        "for lag in range(1, 4):\n"
        '    ts[f"lag_{lag}"] = ts["y"].shift(lag) + len(ts.columns)\n',
        # a key read that is not a constant
        "for lag in range(1, 4):\n"
        '    ts[f"lag_{lag}"] = ts[f"lag_{lag - 1}"].shift(1)\n',
        # a literal item that ends as the written keys do
        'for c in ["qty", "qty_pct"]:\n    s[c + "_pct"] = s[c].pct_change()\n',
        # the loop's variable rebound
        'for c in ["qty", "price"]:\n    c += "_pct"\n    s[c + "_x"] = s[c]\n',
        # a slice written: every key
        'for k in range(3):\n    d[:] = d["a"]\n',
    ],
)
def test_reads_at_keys_an_iteration_may_write_stay_refused(src: str) -> None:
    p = analyse(textwrap.dedent(src), raise_errors=False)
    assert any(d.kind == "sink-read" for d in p.diagnostics), p.diagnostics
