"""Numpy scalars (``np.float32(0)``, ``np.int64(3)``) as reduction targets: they are
immutable, so ``s += c`` binds a new scalar as for a Python number.  The merge once
took them for read-only arrays and failed a safe loop ("`y[0]` is a read-only
array").  Compared with the serial run; floats to rounding (reductions are
reassociated, docs/ARCHITECTURE.md), types exactly."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from test_parallel import run_both

CASES = {
    "dict of float32 scalars, keys repeating": (
        "for k in keys:\n    y[k] += 0.1\n",
        {"y": {0: np.float32(0), 1: np.float32(0)}, "keys": [0, 1] * 7},
    ),
    "dict of int64 scalars": (
        "for k, v in pairs:\n    y[k] += v\n",
        {"y": {"a": np.int64(1), "b": np.int64(2)}, "pairs": [("a", 3), ("b", 4)] * 5},
    ),
    "a float32 accumulator": (
        "for x in xs:\n    total += x\n",
        {"total": np.float32(0), "xs": [0.25 * i for i in range(40)]},
    ),
    "an int32 running max": (
        "for x in xs:\n    hi = max(hi, x)\n",
        {"hi": np.int32(-5), "xs": [np.int32(i % 7) for i in range(30)]},
    ),
}


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, np.generic):
        return type(a) is type(b) and bool(np.isclose(a, b, rtol=1e-6))
    return a == b


@pytest.mark.parametrize("cell, ns", CASES.values(), ids=list(CASES))
def test_numpy_scalar_targets_merge_as_serially(ip, cluster, cell, ns) -> None:
    serial, got = run_both(ip, cell, copy.deepcopy(ns))
    for k, v in serial.items():
        assert _close(v, got[k]), f"{k}: serial {v!r}, gpucell {got[k]!r}"


def test_an_out_of_bounds_contribution_to_a_uint_array_raises_and_changes_nothing(
    ip, cluster
) -> None:
    """Serially `y[i] += -3` on a uint8 array raises OverflowError at its first
    store (numpy 2 refuses a Python int out of the dtype's bounds); the merge
    raises it too and leaves `y` as it was (atomic), never a wrapped value."""
    y = np.array([5, 5], np.uint8)
    ip.user_ns.update(y=y, keys=[0, 0, 1, 1])
    r = ip.run_cell("%%gpu_parallel --quiet\nfor i in keys:\n    y[i] += -3\n")
    assert isinstance(r.error_in_exec, OverflowError), r.error_in_exec
    assert ip.user_ns["y"] is y and y.tolist() == [5, 5]
