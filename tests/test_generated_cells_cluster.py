"""Part 1's generated cells, pushed through %%gpu_parallel on the real cluster.

Every accepted cell must leave the namespace the serial run leaves; every refused
cell must be refused before anything runs (namespace untouched).
"""

from __future__ import annotations

import pytest
from cellgen import GenCell, assert_same_namespace, cells, fresh_namespace, run_serial
from hypothesis import HealthCheck, given, settings

from gpucell.errors import InputChanged, NotParallelizable

pytestmark = pytest.mark.cluster

_KEEP = {"In", "Out", "exit", "quit", "get_ipython"}


def _reset(ip, ns: dict) -> None:
    for k in [k for k in ip.user_ns if not k.startswith("_") and k not in _KEEP]:
        del ip.user_ns[k]
    ip.user_ns.update(ns)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)
@given(cell=cells())
def test_generated_cells_through_the_cluster(
    ip, private_cluster, cell: GenCell
) -> None:
    ns = fresh_namespace()
    _reset(ip, ns)
    before = dict(ip.user_ns)
    if cell.refused:
        with pytest.raises(NotParallelizable):
            ip.run_cell_magic("gpu_parallel", "--quiet", cell.source)
        assert {k: ip.user_ns[k] for k in ns} == {k: before[k] for k in ns}
        return
    serial = fresh_namespace()
    serial_before = dict(serial)
    try:
        run_serial(cell, serial)
    except Exception as exc:
        expected = (type(exc), InputChanged) if cell.mutates else type(exc)
        with pytest.raises(expected):
            ip.run_cell_magic("gpu_parallel", "--quiet", cell.source)
        return
    fresh = fresh_namespace()
    if cell.mutates and (
        serial["tracker"] != fresh["tracker"] or serial["trackers"] != fresh["trackers"]
    ):
        # a call changed an input: the engines' check fails the cell, nothing merged
        with pytest.raises(InputChanged):
            ip.run_cell_magic("gpu_parallel", "--quiet", cell.source)
        assert ip.user_ns["tracker"] == fresh["tracker"]
        assert ip.user_ns["trackers"] == fresh["trackers"]
        return
    ip.run_cell_magic(
        "gpu_parallel", "--quiet --schedule dynamic --chunksize 3", cell.source
    )
    got = {k: v for k, v in ip.user_ns.items() if k in serial or k in ns}
    serial.pop("__builtins__", None)
    assert_same_namespace(serial, got, serial_before, {k: before[k] for k in ns})
