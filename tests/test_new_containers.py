# ruff: noqa: E501  (the cells are notebook code)
"""A new container the iteration makes of objects from elsewhere
(``rec = {"v": item}``, ``entry = [prio, name]``, ``cfg = base.copy()``,
``rows = list(X)``, ``[p for p in ps]``): changing the container itself is
the iteration's own business (``entry[-1] = x``, ``rec["late"] = True``,
``acc += [x]``), changing what it holds (``rec["v"].append(x)``,
``cfg["opt"]["lr"] = lr``) changes the objects from elsewhere, and is
refused before anything runs, naming the line (``core/analysis/taint.py``).
Each safe cell is compared with its serial run.
"""

from __future__ import annotations

import copy

import pytest

from gpucell.errors import NotParallelizable

pytestmark = pytest.mark.cluster

SETUP = (
    "data = [[1], [2], [3], [4]]\nouter = [10]\nout = []\n"
    "base = {'opt': {'lr': 0.0}, 'epochs': 1}\n"
)

CHANGES_WHAT_IT_HOLDS = {
    "a dict display holding an input": (
        "for item in data:\n    rec = {'v': outer}\n    rec['v'].append(item[0])\n",
        4,
    ),
    "through a name for the held object": (
        "for item in data:\n    rec = {'v': outer}\n    inner = rec['v']\n"
        "    inner.append(item[0])\n",
        5,
    ),
    "a list display holding the loop's item": (
        "for item in data:\n    pair = [0, item]\n    pair[1].append(0)\n",
        4,
    ),
    "a shallow copy of a config, its nested dict changed": (
        "for lr in (0.1, 0.01):\n    cfg = base.copy()\n    cfg['opt']['lr'] = lr\n"
        "    out.append(cfg['opt']['lr'])\n",
        4,
    ),
    "dict(base), its nested dict changed": (
        "for lr in (0.1, 0.01):\n    cfg = dict(base)\n    cfg['opt'].update(lr=lr)\n",
        4,
    ),
    "an input put into an empty dict, then changed through it": (
        "for item in data:\n    rec = {}\n    rec['v'] = outer\n    rec['v'].append(1)\n",
        5,
    ),
    "an item appended to an empty list, then changed through it": (
        "for item in data:\n    rows = []\n    rows.append(item)\n    rows[0].append(1)\n",
        5,
    ),
    "a comprehension of the items, an item changed": (
        "for k in range(3):\n    firsts = [d for d in data]\n    firsts[k].append(k)\n",
        4,
    ),
}

ITS_OWN = {
    "a list display's own slot": (
        "for item in data:\n    pair = [0, item]\n    pair[0] = 5\n    out.append(pair)\n"
    ),
    "a dict display's own key, after it is stored": (
        "for item in data:\n    rec = {'v': item[0]}\n    out.append(rec)\n"
        "    rec['late'] = item[0] > 2\n"
    ),
    "+= on a list display": (
        "for item in data:\n    acc = [item]\n    acc += [0]\n    out.append(len(acc))\n"
    ),
    "an empty dict given an input, then a key of its own": (
        "for item in data:\n    rec = {}\n    rec['v'] = outer\n    rec['n'] = item[0]\n"
        "    out.append(rec['n'])\n"
    ),
    "a comprehension of copies, one changed": (
        "for k in range(3):\n    mine = [d.copy() for d in data]\n    mine[k].append(k)\n"
        "    out.append(mine)\n"
    ),
    "a copy's own key": (
        "for lr in (0.1, 0.01):\n    cfg = base.copy()\n    cfg['epochs'] = 3\n"
        "    out.append(cfg)\n"
    ),
}


@pytest.fixture
def shell(ip, cluster):
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    yield ip
    ip.run_line_magic("config", "GpuCell.inline_below = 0.005")


def _serial(cell: str) -> dict:
    ns: dict = {}
    exec(SETUP, ns)
    exec(cell, ns)
    return ns


@pytest.mark.parametrize("case", list(CHANGES_WHAT_IT_HOLDS))
def test_changing_what_a_new_container_holds_is_refused(shell, case):
    cell, line = CHANGES_WHAT_IT_HOLDS[case]
    shell.run_cell(SETUP).raise_error()
    before = copy.deepcopy({k: shell.user_ns[k] for k in ("data", "outer", "base")})
    # (line 1 is the magic's own)
    with pytest.raises(NotParallelizable, match=f"line {line}: ") as err:
        shell.run_cell_magic("gpu_parallel", "--quiet", cell)
    if "inner" not in cell:  # (the container itself named: no `.copy()` advice)
        assert "holds objects from" in str(err.value), err.value
        assert ".copy()" not in str(err.value)
    after = {k: shell.user_ns[k] for k in ("data", "outer", "base")}
    assert after == before and shell.user_ns["out"] == []
    # (and serially the objects from elsewhere do change)
    assert {k: _serial(cell)[k] for k in before} != before


@pytest.mark.parametrize("case", list(ITS_OWN))
def test_changing_a_new_container_itself_equals_the_serial_run(shell, case):
    cell = ITS_OWN[case]
    shell.run_cell(SETUP).raise_error()
    shell.run_cell_magic("gpu_parallel", "--quiet", cell)
    serial = _serial(cell)
    for k in ("data", "outer", "base", "out"):
        assert shell.user_ns[k] == serial[k], k


def test_writing_through_a_numpy_view_of_a_tensor_input_is_refused(shell):
    # (a write through numpy bumps no tensor version counter: the engines'
    # check of the tensor would not see it)
    torch = pytest.importorskip("torch")
    shell.user_ns.update(T=torch.zeros(4, 2))
    for cell in (
        "for k in range(4):\n    n = T[k].numpy()\n    n[0] = 3\n",
        "for k in range(4):\n    n = np.asarray(T)\n    n[k, 0] = 3\n",
    ):
        shell.run_cell("import numpy as np").raise_error()
        with pytest.raises(NotParallelizable, match="line 4: "):
            shell.run_cell_magic("gpu_parallel", "--quiet", cell)
        assert not shell.user_ns["T"].any()
    shell.user_ns.pop("T")
