"""``del D[k]`` of the iteration's own key (issue 28 §3, falsely stopped):
``for k in list(balances): if balances[k] < 0: del balances[k]``.  Each
iteration reads only its own key, before deleting it, and no other iteration
touches that key, so the engine records the deletion and the merge applies it
in iteration order.  Compared with the serial run on a real cluster; the
shapes that are not provably one key per iteration stay refused, and a key
the merge cannot delete fails the cell with nothing merged.
"""

from __future__ import annotations

import textwrap

import pandas as pd
import pytest
from test_parallel import assert_serial_equivalent

from gpucell.core.analysis import analyse

RUNS = {
    "negative balances removed": (
        "for k in list(balances):\n    if balances[k] < 0:\n        del balances[k]\n",
        lambda: {"balances": {"a": 10, "b": -3, "c": 0, "d": -1, "e": 4}},
    ),
    "every key removed, sorted": (
        "for k in sorted(d):\n    seen.append(d[k])\n    del d[k]\n",
        lambda: {"d": {3: "c", 1: "a", 2: "b"}, "seen": []},
    ),
    "a literal list of keys": (
        'for k in ["tmp", "scratch"]:\n    del cfg[k]\n',
        lambda: {"cfg": {"tmp": 1, "keep": 2, "scratch": 3}},
    ),
    "empty columns of a frame dropped": (
        "for c in df.columns:\n    if df[c].isna().all():\n        del df[c]\n",
        lambda: {
            "df": pd.DataFrame(
                {"a": [1.0, 2.0], "b": [None, None], "c": [3.0, None]}, dtype=float
            )
        },
    ),
}


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(RUNS))
def test_deleting_the_own_key_matches_the_serial_run(ip, cluster, case) -> None:
    cell, ns = RUNS[case]
    p = analyse(textwrap.dedent(cell), raise_errors=False)
    assert not p.diagnostics, [d.text for d in p.diagnostics]
    assert_serial_equivalent(ip, cell, ns())


@pytest.mark.parametrize(
    "src",
    [
        # the dict itself iterated: serially deleting raises
        "for k in d:\n    del d[k]\n",
        "for k, v in d.items():\n    del d[k]\n",
        # read after the delete
        "for k in list(d):\n    del d[k]\n    out.append(d.get(k))\n",
        # another key, read
        "for k in list(d):\n    if d[k + 1]:\n        del d[k + 1]\n",
        # read whole
        "for k in list(d):\n    if len(d) > 2:\n        del d[k]\n",
    ],
)
def test_deletes_that_are_not_one_own_key_stay_refused(src: str) -> None:
    assert analyse(src, raise_errors=False).diagnostics


# a `del D[k]` the body never reads around is an indexed write of the key's
# absence, applied in iteration order (keys may repeat, as for `D[k] = v`)
WRITES = {
    "other keys, in iteration order": (
        "for k in [1, 3]:\n    del d[k + 1]\n",
        lambda: {"d": {1: "a", 2: "b", 3: "c", 4: "d"}},
    ),
    "written, then deleted": (
        "for k in ks:\n    d[k] = 1\n    del d[k]\n    d[-k] = k\n",
        lambda: {"ks": [1, 2, 1], "d": {0: 0}},
    ),
}


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(WRITES))
def test_deletes_as_writes_match_the_serial_run(ip, cluster, case) -> None:
    cell, ns = WRITES[case]
    assert_serial_equivalent(ip, cell, ns())


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("ns", "cell", "error"),
    [
        # serially the second `del` raises KeyError
        ({"d": {1: 1}}, "for k in [1, 1]:\n    del d[k]\n", KeyError),
        # a list's positions shift: only dicts and frames delete keys
        ({"d": [1, 2, 3]}, "for i in range(3):\n    del d[i]\n", TypeError),
    ],
)
def test_a_delete_the_merge_cannot_apply_fails_unmerged(
    ip, cluster, ns, cell, error
) -> None:
    before = {k: type(v)(v) for k, v in ns.items()}
    ip.user_ns.update(ns)
    with pytest.raises(error):
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert ip.user_ns["d"] == before["d"]
