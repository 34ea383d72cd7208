"""Scalar float reductions leave the serial value bit for bit: floating-point
``+``, ``-`` and ``*`` are not associative, so an engine keeps a chunk's
scalar float contributions one by one (``protocol.fold.InOrder``) and the
kernel applies them to the variable in iteration order, as serial code does.
Integer reductions, and array or tensor ones, still fold a partial per chunk."""

from __future__ import annotations

import pickle

import pytest

from gpucell.protocol.fold import InOrder, combine, own_in_order, replay

CELLS = {
    # serially each 1.0 is lost against 1e16: 0.0 (in two partials: 4.0 or more)
    "cancellation": (
        "values = [1e16] + [1.0] * 8 + [-1e16]\ntotal = 0.0\n",
        "for v in values:\n    total += v\n",
        "total",
    ),
    "subtract": (
        "values = [1e16] + [1.0] * 8 + [-1e16]\nleft = 1.0\n",
        "for v in values:\n    left -= v\n",
        "left",
    ),
    "rebinding": (
        "values = [0.1 * k for k in range(40)]\ns = 0\n",
        "for v in values:\n    s = s + v\n",
        "s",
    ),
    "product": (
        "factors = [1.1, 3.3, 0.7, 1e-300, 1e300, 2.9, 1.3, 0.01]\np = 1.0\n",
        "for f in factors:\n    p *= f\n",
        "p",
    ),
    "float32": (
        "import numpy as np\n"
        "vals = np.float32([2.0**24] + [1.0] * 7)\nacc = np.float32(0)\n",
        "for v in vals:\n    acc += v\n",
        "acc",
    ),
    "item-of-a-loss": (
        "import numpy as np\nxs = np.linspace(0.1, 3.0, 30)\nrunning = 0.0\n",
        "for x in xs:\n    running += float(np.sin(x) ** 2)\n",
        "running",
    ),
}


def test_in_order_is_what_an_engine_keeps_and_the_kernel_replays() -> None:
    p = own_in_order("+", 1.0)
    assert isinstance(p, InOrder)
    p += 2.0
    assert p.values == [1.0, 2.0]
    back = pickle.loads(pickle.dumps(p))
    assert isinstance(back, InOrder) and back.values == [1.0, 2.0]
    assert replay("-", 10.0, [back, 3.0]) == ((10.0 - 1.0) - 2.0) - 3.0
    # an int contribution folds as before; a non-scalar target takes the
    # contributions combined
    assert own_in_order("+", 3) == 3
    assert combine("+", [InOrder([1.0, 2.0]), 4.0]) == 7.0


@pytest.mark.cluster
@pytest.mark.parametrize("name", sorted(CELLS))
def test_a_scalar_float_reduction_is_the_serial_value_bit_for_bit(ip, cluster, name):
    setup, loop, var = CELLS[name]
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    ns: dict = {}
    exec(setup + loop, ns)
    ip.run_cell(setup)
    ip.run_cell_magic("gpu_parallel", "--quiet --schedule dynamic --chunksize 1", loop)
    got, want = ip.user_ns[var], ns[var]
    assert type(got) is type(want)
    assert got == want, (got, want)
    assert len(__import__("gpucell").last_run.engines) == 2
