"""An indexed reduction whose contribution's dtype differs from its target's
(``y[i] += 0.5`` on an int array, a float into a uint8 image, float64 into
float32, an int into a bool mask): serially each store casts the new value
back to the array's dtype, or raises where numpy or torch refuse the cast.
Where each key is stored once (the loop's own position, one statement), the
merge replays that statement per key and so stores, or raises, exactly as the
serial cell; it once failed such loops with "of another kind".  Compared with
the serial run on a real cluster, bit for bit; a raise leaves the target as it
was (nothing merged)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from test_parallel import run_both

EQUAL = {
    "int64 array, float contributions": (
        "for i in range(6):\n    y[i] += 0.5 * i\n",
        lambda: {"y": np.arange(6)},
    ),
    "uint8 pixels, float contributions": (
        "for i in range(6):\n    img[i] += 0.7 * i\n",
        lambda: {"img": np.arange(6, dtype=np.uint8) * 40},
    ),
    "int32 array, enumerate's count, subtracting floats": (
        "for j, v in enumerate(vals):\n    y[j] -= v\n",
        lambda: {"y": np.full(5, 10, np.int32), "vals": [0.5, 1.5, 2.25, 3.0, 9.9]},
    ),
    "float32 array, python floats (weak: float32 arithmetic)": (
        "for i in range(7):\n    y[i] += 0.1 * i\n",
        lambda: {"y": np.linspace(0, 1, 7, dtype=np.float32)},
    ),
    "float32 array, float64 scalars (float64 arithmetic, cast)": (
        "for i in range(7):\n    y[i] += w[i]\n",
        lambda: {"y": np.linspace(0, 1, 7, dtype=np.float32), "w": np.random.rand(7)},
    ),
    "float32 image rows, float64 offsets (in place on the view)": (
        "for b in range(4):\n    img[b] += offsets[b]\n",
        lambda: {
            "img": np.arange(24, dtype=np.float32).reshape(4, 6) / 7,
            "offsets": np.linspace(0.1, 0.4, 4),
        },
    ),
    "bool mask, int contributions": (
        "for i in range(4):\n    m[i] += vals[i]\n",
        lambda: {"m": np.zeros(4, dtype=bool), "vals": [0, 1, 2, 0]},
    ),
    "bool mask, or-ed with numpy bools": (
        "for i in range(5):\n    m[i] |= vals[i] > 2\n",
        lambda: {"m": np.array([1, 0, 0, 1, 0], dtype=bool), "vals": np.arange(5)},
    ),
    "int16 array, scaled by floats": (
        "for i in range(5):\n    y[i] *= 0.75\n",
        lambda: {"y": np.arange(5, dtype=np.int16) * 7},
    ),
    "float32 tensor rows, float64 tensors (in place on the view)": (
        "for b in range(3):\n    t[b] += w[b]\n",
        lambda: {
            "t": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 3,
            "w": torch.rand(3, 4, dtype=torch.float64),
        },
    ),
    "float32 tensor, python floats": (
        "for i in range(6):\n    t[i] += 0.1 * i\n",
        lambda: {"t": torch.linspace(0, 1, 6)},
    ),
    "float32 tensor, float64 tensors": (
        "for i in range(6):\n    t[i] += w[i]\n",
        lambda: {"t": torch.linspace(0, 1, 6), "w": torch.rand(6, dtype=torch.float64)},
    ),
}


def bitwise(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return True  # the loop's other names: test_parallel's comparison covers them


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(EQUAL))
def test_a_store_of_another_dtype_matches_the_serial_run(ip, cluster, case) -> None:
    cell, ns = EQUAL[case]
    serial, got = run_both(ip, cell, ns())
    for k, v in serial.items():
        assert bitwise(v, got[k]), f"{k}: serial {v!r} != parallel {got[k]!r}"


RAISES = {
    # the row is a view: `+=` runs in place and cannot cast float64 to int
    "int image rows, a float added in place": (
        "for b in range(3):\n    img[b] += 0.5\n",
        lambda: {"img": np.arange(12).reshape(3, 4)},
    ),
    # torch's in-place add on an int element refuses a float result
    "int tensor, float contributions": (
        "for i in range(3):\n    t[i] += 0.5\n",
        lambda: {"t": torch.tensor([1, 2, 3])},
    ),
    # numpy 2 refuses a Python int out of uint8's bounds
    "uint8 array, an int out of bounds": (
        "for i in range(3):\n    y[i] += 300\n",
        lambda: {"y": np.zeros(3, dtype=np.uint8)},
    ),
}


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(RAISES))
def test_a_store_serial_refuses_raises_the_same_and_merges_nothing(
    ip, cluster, case
) -> None:
    cell, ns = RAISES[case]
    serial = copy.deepcopy(ns())
    with pytest.raises(Exception) as e:
        exec(cell, serial)
    values = ns()
    before = {
        k: v.clone() if hasattr(v, "clone") else v.copy() for k, v in values.items()
    }
    ip.user_ns.update(values)
    r = ip.run_cell("%%gpu_parallel --quiet\n" + cell)
    assert isinstance(r.error_in_exec, type(e.value)), (r.error_in_exec, e.value)
    for k, v in values.items():
        assert ip.user_ns[k] is v and bitwise(before[k], v)
