"""A name from before the loop rebound by a concatenation of itself: ``x =
np.append(x, e)``, ``x = np.vstack([x, row])``, ``x = torch.cat([x, t])``,
``df = pd.concat([df, part])``.  Engines record each call; the kernel makes
them in iteration order from ``x``'s value before the loop
(``protocol/concat.py``).  Each cell is compared with its serial run, exactly
(dtype, shape, bits, a frame's index and dtypes); a call that fails serially
fails here with the same exception, nothing merged; a loop that reads ``x``
anywhere else is still refused, with advice that is not ``x += ...``.
"""

from __future__ import annotations

import copy
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch

from gpucell.core.analysis import analyse
from gpucell.errors import NotParallelizable
from gpucell.protocol.concat import ConcatCall, replay

pytestmark = pytest.mark.cluster


def identical(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return (
            type(a) is type(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, torch.Tensor):
        return (
            type(b) is torch.Tensor
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.requires_grad == b.requires_grad
            and torch.equal(a.detach(), b.detach())
        )
    if isinstance(a, (pd.DataFrame, pd.Series)):
        if type(a) is not type(b):
            return False
        try:
            check = (
                pd.testing.assert_frame_equal
                if isinstance(a, pd.DataFrame)
                else pd.testing.assert_series_equal
            )
            check(a, b, check_exact=True)
        except AssertionError:
            return False
        return True
    if isinstance(a, torch.nn.Module):
        sa, sb = a.state_dict(), b.state_dict()
        return sa.keys() == sb.keys() and all(identical(sa[k], sb[k]) for k in sa)
    if isinstance(a, list):
        return type(b) is list and len(a) == len(b) and all(map(identical, a, b))
    return type(a) is type(b) and a == b


@pytest.fixture
def run(ip, cluster):
    ip.run_line_magic("config", "GpuCell.inline_below = 0")

    def both(cell: str, ns: dict) -> dict:
        cell = textwrap.dedent(cell)
        serial = {"np": np, "pd": pd, "torch": torch, **copy.deepcopy(ns)}
        exec(compile(cell, "<serial>", "exec"), serial)
        for k in [k for k in ip.user_ns if not k.startswith("_")]:
            if k not in ("In", "Out", "exit", "quit", "get_ipython"):
                ip.user_ns.pop(k)
        ip.user_ns.update({"np": np, "pd": pd, "torch": torch, **copy.deepcopy(ns)})
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        for k, v in serial.items():
            if k.startswith("__") or k in ("np", "pd", "torch"):
                continue
            assert identical(v, ip.user_ns[k]), f"{k}: {v!r} != {ip.user_ns[k]!r}"
        return serial

    yield both
    ip.run_line_magic("config", "GpuCell.inline_below = 0.005")


CASES = {
    "np.append of floats onto an empty array": (
        "for i in range(23):\n    collected = np.append(collected, i * 0.5)\n",
        {"collected": np.array([])},
    ),
    "np.append of ints onto float64 (promoted on each call)": (
        "for i in range(17):\n    x = np.append(x, [i, -i])\n",
        {"x": np.array([])},
    ),
    "np.append along an axis": (
        "for i in range(9):\n    m = np.append(m, [[i, i + 1.0]], axis=0)\n",
        {"m": np.zeros((1, 2))},
    ),
    "np.vstack of list rows, the row made in the iteration": (
        "for s in series:\n"
        "    feats = np.vstack([feats, [s.mean(), s.std(), s.max()]])\n",
        {
            "feats": np.empty((0, 3)),
            "series": [np.arange(k, k + 5.0) ** 1.5 for k in range(14)],
        },
    ),
    "np.concatenate with axis keyword, and a prepend": (
        "for k in range(11):\n"
        "    a = np.concatenate([a, np.full(2, k)], axis=0)\n"
        "    b = np.concatenate((np.array([k]), b))\n",
        {"a": np.array([7]), "b": np.array([], dtype=np.int64)},
    ),
    "a dtype chain that one concatenation would not give": (
        "for v in vals:\n    x = np.append(x, v)\n",
        {
            "x": np.array([1, 2], dtype=np.int8),
            "vals": [
                np.array([200], dtype=np.uint8),
                np.array([0.1], dtype=np.float16),
                np.array([3], dtype=np.int8),
            ],
        },
    ),
    "only on some iterations": (
        "for i in range(30):\n"
        "    if i % 3 == 0:\n"
        "        picked = np.append(picked, i)\n",
        {"picked": np.array([], dtype=np.int64)},
    ),
    "a row reused after it was appended": (
        "for i in range(8):\n"
        "    row = np.zeros(2)\n"
        "    row[0] = i\n"
        "    rows = np.vstack([rows, row])\n"
        "    row[1] = 99.0\n",
        {"rows": np.zeros((0, 2))},
    ),
    "torch.cat under no_grad": (
        "with torch.no_grad():\n"
        "    for xb in batches:\n"
        "        emb = torch.cat([emb, enc(xb)], dim=0)\n",
        {
            "emb": torch.empty(0, 2),
            "enc": torch.nn.Linear(4, 2),
            "batches": [torch.arange(12.0).reshape(3, 4) * k for k in range(6)],
        },
    ),
    "torch.cat with autograd history (no no_grad)": (
        "for xb in batches:\n    out = torch.cat([out, enc(xb)], dim=0)\n",
        {
            "out": torch.empty(0, 2),
            "enc": torch.nn.Linear(4, 2),
            "batches": [torch.arange(8.0).reshape(2, 4) * k for k in range(4)],
        },
    ),
    "torch.cat onto a legacy empty 1-d tensor": (
        "for k in range(5):\n    t = torch.cat((t, torch.ones(2, 3) * k))\n",
        {"t": torch.tensor([])},
    ),
    "if x is None: x = e, else torch.cat: model outputs gathered": (
        "all_preds = None\n"
        "with torch.no_grad():\n"
        "    for xb in batches:\n"
        "        preds = enc(xb)\n"
        "        if all_preds is None:\n"
        "            all_preds = preds\n"
        "        else:\n"
        "            all_preds = torch.cat([all_preds, preds])\n",
        {
            "enc": torch.nn.Linear(4, 2),
            "batches": [torch.arange(12.0).reshape(3, 4) * k for k in range(6)],
        },
    ),
    "is not None, branches the other way round, the call evaluated once": (
        "for k in range(7):\n"
        "    if acc is not None:\n"
        "        acc = np.concatenate((acc, np.full(k, k)), 0)\n"
        "    else:\n"
        "        acc = np.full(k, k)\n",
        {"acc": None},
    ),
    "x = e if x is None else np.vstack([x, e]), one statement": (
        "X = None\n"
        "for s in series:\n"
        "    f = s[:3] * 2\n"
        "    X = f if X is None else np.vstack([X, f])\n",
        {"series": [np.arange(k, k + 5.0) for k in range(9)]},
    ),
    "the first iteration binds, the others stack (no value before the loop)": (
        "for i, s in enumerate(series):\n"
        "    f = s[:3] * 2\n"
        "    if i == 0:\n"
        "        X = f\n"
        "    else:\n"
        "        X = np.vstack([X, f])\n",
        {"series": [np.arange(k, k + 5.0) for k in range(9)]},
    ),
    "pd.concat onto an empty frame, ignore_index": (
        "for k in range(7):\n"
        "    part = pd.DataFrame({'k': [k, k], 'v': [k * 0.5, k * 1.5]})\n"
        "    all_parts = pd.concat([all_parts, part], ignore_index=True)\n",
        {"all_parts": pd.DataFrame()},
    ),
    "pd.concat keeping the parts' labels, a Series": (
        "for k in range(6):\n    s = pd.concat([s, pd.Series([k], index=[f'r{k}'])])\n",
        {"s": pd.Series([], dtype="float64")},
    ),
    "the loop goes over the array the body rebinds (the old one, serially)": (
        "for v in vals:\n    vals = np.append(vals, v / 10)\n",
        {"vals": np.arange(1.0, 6.0)},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_concatenation_rebinding_its_name_equals_the_serial_run(run, case):
    cell, ns = CASES[case]
    assert not analyse(cell, raise_errors=False).diagnostics
    run(cell, ns)


def test_a_call_that_fails_serially_fails_the_same_way_with_nothing_merged(
    ip, cluster
) -> None:
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    try:
        before = np.zeros((0, 3))
        ip.user_ns.update(np=np, feats=before, seen=[])
        cell = (
            "for i in range(6):\n"
            "    seen.append(i)\n"
            "    feats = np.vstack([feats, np.ones(3 if i != 4 else 2)])\n"
        )
        with pytest.raises(ValueError, match="dimensions") as err:
            ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        assert "concatenation number 5 of 6" in "\n".join(err.value.__notes__)
        assert ip.user_ns["feats"] is before and ip.user_ns["seen"] == []
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")


def test_a_function_that_is_not_a_concatenation_fails_unmerged(ip, cluster) -> None:
    class Mod:
        @staticmethod
        def append(a, b):
            return a + [b]

    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    try:
        ip.user_ns.update(np=Mod(), x=[0], out=[])
        cell = "for i in range(4):\n    out.append(i)\n    x = np.append(x, i)\n"
        with pytest.raises(NotParallelizable, match="cannot be made on the kernel"):
            ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        assert ip.user_ns["x"] == [0] and ip.user_ns["out"] == []
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")
        ip.user_ns["np"] = np


def test_reading_the_name_elsewhere_is_refused_without_elementwise_advice() -> None:
    cell = "for i in range(5):\n    x = np.append(x, i)\n    print(len(x))\n"
    plan = analyse(cell, known_names={"np", "x"}, raise_errors=False)
    texts = " ".join(d.text for d in plan.diagnostics if d.name == "x")
    assert texts, plan.diagnostics
    assert "x += " not in texts
    assert "after the loop" in texts


def test_an_if_none_whose_branches_have_different_effects_is_refused() -> None:
    # serially one of the two calls runs an iteration; both would run here
    cell = (
        "for k in range(5):\n"
        "    if x is None:\n"
        "        x = load(k)\n"
        "    else:\n"
        "        x = np.append(x, score(k))\n"
    )
    plan = analyse(cell, known_names={"np", "x", "load", "score"}, raise_errors=False)
    assert plan.diagnostics and not plan.spelled.concats


def test_one_concatenation_stands_for_the_chain_only_where_it_is_the_same() -> None:
    # same dtype: one call; the result equals the chain bit for bit
    x = np.arange(3.0)
    calls = [ConcatCall(np.append, (None, float(k)), {}, (0,)) for k in range(5)]
    chain = x
    for k in range(5):
        chain = np.append(chain, float(k))
    got = replay(x, calls)
    assert identical(chain, got)
    # int8 then uint8 then float16: each call promotes; the chain's dtype kept
    y = np.array([1], dtype=np.int8)
    pieces = [np.array([200], np.uint8), np.array([0.5], np.float16)]
    calls = [ConcatCall(np.append, (None, p), {}, (0,)) for p in pieces]
    assert replay(y, calls).dtype == np.append(np.append(y, pieces[0]), pieces[1]).dtype


def test_an_iterable_that_reads_the_name_as_it_goes_is_not_replayed() -> None:
    # the generator reads `vals` at each step: serially it sees the rebound
    # array, whose items the prepend has shifted
    cell = (
        "for v in (vals[i] for i in range(3)):\n"
        "    vals = np.concatenate([[v * 10], vals])\n"
    )
    plan = analyse(cell, known_names={"np", "vals"}, raise_errors=False)
    assert plan.diagnostics and not plan.spelled.concats
