"""Own rows: an iteration that writes and reads back under its own index.

``C[i][j] += A[i][k] * B[k][j]``, ``x[i][0] = ...``, ``m[i, j] = m[i, j - 1] + 1``,
``out[i] = 0`` then ``out[i] += ...`` in a nested loop: each compared with the
serial cell on a real cluster, rows kept as the same objects, and the unsafe
shapes (shared rows, the iterable itself, a row handed to a method) refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_parallel import assert_serial_equivalent

from gpucell.errors import NotParallelizable

pytestmark = pytest.mark.cluster

ROWS = {
    "matrix product, nested loops, +=": (
        "for i in range(len(A)):\n    for j in range(len(B[0])):\n"
        "        for k in range(len(B)):\n            C[i][j] += A[i][k] * B[k][j]\n",
        {
            "A": [[i + j for j in range(4)] for i in range(9)],
            "B": [[i * j - 1 for j in range(3)] for i in range(4)],
            "C": [[0] * 3 for _ in range(9)],
        },
    ),
    "x[i][0] from the same row": (
        "for i in range(len(x)):\n    x[i][0] = x[i][1] * 2\n",
        {"x": [[i, i + 1, i + 2] for i in range(11)]},
    ),
    "a row that reads its own earlier writes": (
        "for i in range(len(m)):\n    for j in range(1, len(m[i])):\n"
        "        m[i][j] = m[i][j - 1] + m[i][j]\n",
        {"m": [[i, 1, 2, 3, 4] for i in range(10)]},
    ),
    "numpy rows with a 2-D key": (
        "for i in range(n.shape[0]):\n    for j in range(1, n.shape[1]):\n"
        "        n[i, j] = n[i, j - 1] * 0.5 + n[i, j]\n",
        {"n": np.arange(40.0).reshape(8, 5)},
    ),
    "torch rows, enumerate": (
        "for i, s in enumerate(scales):\n    t[i][0] = s\n    t[i][1] = t[i][0] * 3\n",
        {"t": torch.zeros(7, 2), "scales": [float(v) for v in range(7)]},
    ),
    "dict rows": (
        "for i in range(len(recs)):\n    recs[i]['sq'] = recs[i]['v'] ** 2\n"
        "    recs[i]['v'] += 1\n",
        {"recs": [{"v": v} for v in range(9)]},
    ),
    "an element set then accumulated (matrix-vector)": (
        "for i in range(len(y)):\n    y[i] = 0.0\n    for j in range(len(v)):\n"
        "        y[i] += M[i][j] * v[j]\n",
        {
            "y": [None] * 6,
            "M": [[float(i - j) for j in range(4)] for i in range(6)],
            "v": [1.0, 2.0, 3.0, 4.0],
        },
    ),
    "continue inside the row loop": (
        "for i in range(len(g)):\n    for j in range(len(g[i])):\n"
        "        if g[i][j] < 0:\n            continue\n        g[i][j] *= 10\n",
        {"g": [[(-1) ** (i + j) * j for j in range(4)] for i in range(8)]},
    ),
}


@pytest.mark.parametrize("row", list(ROWS))
def test_own_row_writes_give_the_serial_namespace(ip, cluster, row):
    cell, ns = ROWS[row]
    assert_serial_equivalent(ip, cell, dict(ns), "--quiet --schedule static")


def test_rows_are_changed_in_place_not_replaced(ip, cluster):
    ip.run_cell("rows = [[0, 0] for _ in range(6)]\nkeep = rows[3]")
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "for i in range(len(rows)):\n    rows[i][1] = i\n"
        "    rows[i][0] = rows[i][1] + 1\n",
    )
    assert ip.user_ns["rows"] == [[i + 1, i] for i in range(6)]
    assert ip.user_ns["keep"] is ip.user_ns["rows"][3]


def test_rows_that_are_one_object_are_refused(ip, cluster):
    ip.run_cell("grid = [[0] * 3] * 4")
    with pytest.raises(
        NotParallelizable, match=r"`grid\[0\]` and `grid\[1\]` are the same"
    ):
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "for i in range(4):\n    grid[i][0] = i\n"
        )
    assert ip.user_ns["grid"] == [[0] * 3] * 4


def test_an_input_that_is_a_row_is_refused(ip, cluster):
    ip.run_cell("grid = [[0, 0] for _ in range(4)]\nfirst = grid[0]")
    with pytest.raises(NotParallelizable, match=r"`first` is `grid\[0\]`"):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "for i in range(4):\n    grid[i][0] = first[0] + i\n",
        )


def test_another_iterations_row_is_refused(ip, cluster):
    ip.run_cell("grid = [[0, 0] for _ in range(4)]\nout = []")
    with pytest.raises(NotParallelizable):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "for i in range(1, 4):\n"
            "    grid[i][0] = grid[i - 1][0] + 1\n"
            "    out.append(grid[i][0])\n",
        )
    assert ip.user_ns["grid"] == [[0, 0] for _ in range(4)]


def test_a_statement_that_reads_another_iterations_row_is_made_in_order(ip, cluster):
    # the body uses `grid` in this statement only: the kernel makes it in
    # iteration order (core/analysis/replaystmts.py), as serially
    ip.run_cell("grid = [[0, 0] for _ in range(4)]")
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "for i in range(1, 4):\n    grid[i][0] = grid[i - 1][0] + 1\n",
    )
    assert ip.user_ns["grid"] == [[0, 0], [1, 0], [2, 0], [3, 0]]


_ROWS = (
    "grid = [[0, 0] for _ in range(4)]\nout = []\n"
    "deep = [[[0]] for _ in range(4)]\nalias = grid[2]\n"
)


@pytest.mark.parametrize(
    "cell",
    [
        # the iterable's items are the rows, changed through the container
        "for i, row in enumerate(grid):\n    grid[i][0] = 1\n    out.append(row[0])\n",
        # a method call on a row, then an element store
        "for i in range(4):\n    grid[i].append(i)\n    grid[i][0] = 1\n",
        # three levels deep
        "for i in range(4):\n    deep[i][0][0] = i\n",
    ],
)
def test_rows_changed_through_the_container_are_written_back(ip, cluster, cell):
    """Each iteration's own row, reached as ``grid[i]``, is its own item
    (core/analysis/ownsubscripts.py): written back into the kernel's lists,
    their identity kept (``alias`` sees it), as serially."""
    ip.run_cell(_ROWS + cell).raise_error()
    want = {k: ip.user_ns[k] for k in ("grid", "out", "deep")}
    ip.run_cell(_ROWS).raise_error()
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert {k: ip.user_ns[k] for k in ("grid", "out", "deep")} == want
    assert ip.user_ns["alias"] is ip.user_ns["grid"][2]


@pytest.mark.parametrize(
    "cell",
    [
        "for i in range(4):\n    grid[i].append(i)\n",
        "for i, row in enumerate(grid):\n    grid[i][0] = i\n    out.append(row[0])\n",
    ],
)
def test_rows_one_object_under_several_indices_are_refused(ip, cluster, cell):
    """``[r] * 4``: serially each iteration sees the others' changes to the one
    row; refused, nothing merged (sent to the engines: the same cell's last
    run above was short enough for the kernel to run it, exactly, itself)."""
    ip.run_cell(
        "r = [0, 0]\ngrid = [r] * 4\nout = []\nd0 = [0]\n"
        "deep = [[d0] for _ in range(4)]\n"
    ).raise_error()
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    try:
        with pytest.raises(NotParallelizable, match="same list|one object"):
            ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")
    assert ip.user_ns["grid"] == [[0, 0]] * 4 and ip.user_ns["d0"] == [0]
    assert ip.user_ns["out"] == []


def test_a_store_three_levels_deep_into_one_shared_object_is_replayed(ip, cluster):
    """``deep[i][0][0] = i`` with every ``deep[i][0]`` one list: the stores are
    replayed on the kernel in iteration order (replaystmts.py), so the shared
    list ends as serially, the last store winning."""
    ip.run_cell("d0 = [0]\ndeep = [[d0] for _ in range(4)]\n").raise_error()
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    try:
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "for i in range(4):\n    deep[i][0][0] = i\n"
        )
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")
    assert ip.user_ns["d0"] == [3] and all(
        r[0] is ip.user_ns["d0"] for r in ip.user_ns["deep"]
    )


def test_whole_elements_that_are_lists_are_refused(ip, cluster):
    ip.run_cell("acc = [[1], [2], [3]]")
    with pytest.raises(NotParallelizable, match="keeps its identity"):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "for i in range(3):\n    for j in range(2):\n        acc[i] += [j]\n",
        )
    assert ip.user_ns["acc"] == [[1], [2], [3]]


def test_a_bad_write_fails_before_anything_changes(ip, cluster):
    ip.run_cell("t = [[0, 0], (0, 0), [0, 0]]")
    with pytest.raises(TypeError, match="does not support item assignment"):
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "for i in range(3):\n    t[i][1] = t[i][0] + 1\n"
        )
    assert ip.user_ns["t"] == [[0, 0], (0, 0), [0, 0]]


SHORT_CIRCUIT_ROWS = {
    "any, decided early": ("found = any(x > 3 for x in xs)\n", {"xs": [1, 5, 2, 7]}),
    "any, never true": ("found = any(x > 30 for x in xs)\n", {"xs": [1, 5, 2, 7]}),
    "all with a condition": (
        "ok = all(x % 2 == 1 for x in xs if x > 1)\n",
        {"xs": [1, 3, 5, 7, 9]},
    ),
    # serially all() stops at the False of 10 // 20 > 0 and never divides by 0
    "all stops before an item that would raise": (
        "ok = all(10 // x > 0 for x in xs)\n",
        {"xs": [1, 2, 20, 0, 4]},
    ),
}


@pytest.mark.parametrize("row", list(SHORT_CIRCUIT_ROWS))
def test_any_and_all_of_a_generator_give_the_serial_result(ip, cluster, row):
    cell, ns = SHORT_CIRCUIT_ROWS[row]
    assert_serial_equivalent(ip, cell, dict(ns), "--quiet --schedule static")


def test_an_item_that_raises_before_the_decision_raises_as_serially(ip, cluster):
    ip.user_ns.update(xs=[1, 0, 2, 20], ok="before")
    with pytest.raises(ZeroDivisionError):
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "ok = all(10 // x > 0 for x in xs)\n"
        )
    assert ip.user_ns["ok"] == "before"


def test_whole_element_writes_read_back_from_an_array_are_refused(ip, cluster):
    """Serially `y[i] = 2.7` in an int array stores 2, and `y[i] += 1` makes 3;
    an engine's private element would make 3.7: refused, never different."""
    ip.user_ns["y"] = np.zeros(4, dtype=np.int64)
    with pytest.raises(NotParallelizable, match="cast each value to its dtype"):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "for i in range(4):\n    y[i] = 2.7\n    y[i] += 1\n",
        )
    assert (ip.user_ns["y"] == 0).all()


def test_a_tuple_key_made_of_loop_variables_is_one_dict_key(ip, cluster):
    """``results[a, b] = [a]`` for ``a, b`` from a grid: one tuple key (the
    own-row rewrite once split it into row ``a``, column ``b`` and failed
    on the engines)."""
    ip.user_ns["grid"] = [(a, b) for a in range(3) for b in range(2)]
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "results = {}\nfor a, b in grid:\n    results[a, b] = [a]\n",
    )
    assert ip.user_ns["results"] == {(a, b): [a] for a in range(3) for b in range(2)}
