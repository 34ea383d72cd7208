"""Property: a parallel run (chunked, merged) leaves the namespace a serial run does.

Cells come from ``tests/cellgen.py``. Either the analysis refuses the cell (and
then the generator must have put a refused pattern in it), or the chunk program,
run chunk by chunk with random boundaries through ``gpucell.engine.chunk.run_chunk`` and
merged by ``gpucell.core.merge``, reproduces ``exec`` of the cell.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucell.core.analysis import analyse
from gpucell.engine import checkin
from gpucell.errors import NotParallelizable

sys.path.insert(0, str(Path(__file__).parent))
from cellgen import (  # noqa: E402
    GenCell,
    assert_same_namespace,
    cells,
    fresh_namespace,
    run_parallel_local,
    run_serial,
)

#: 500 new cells take a few seconds (they took 147 s of the full run while a
#: shown traceback made every AST copy drag an old tree: tests/test_astcopy.py);
#: GPUCELL_PROPERTY_EXAMPLES=2000 searches deeper, e.g. before a release
EXAMPLES = int(os.environ.get("GPUCELL_PROPERTY_EXAMPLES", "500"))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    cell=cells(),
    cuts=st.lists(st.floats(0, 1), max_size=5),
    reverse=st.booleans(),
)
def test_parallel_equals_serial(
    cell: GenCell, cuts: list[float], reverse: bool
) -> None:
    known = fresh_namespace().keys()
    if cell.refused:
        with pytest.raises(NotParallelizable) as info:
            analyse(cell.source, known_names=known)
        n_lines = len(cell.source.splitlines())
        diags = info.value.diagnostics  # type: ignore[attr-defined]
        assert diags
        for d in diags:
            assert 1 <= d.line <= n_lines
            assert f"line {d.line}" in str(info.value)
        return
    order = (lambda ix: ix[::-1]) if reverse else None
    serial = fresh_namespace()
    serial_before = dict(serial)
    try:
        run_serial(cell, serial)
    except Exception as exc:
        if cell.mutates:  # the check may stop the parallel run first
            with pytest.raises((type(exc), checkin.Changed)):
                run_parallel_local(cell, fresh_namespace(), cuts, order=order)
            return
        # documented exception: if an iteration raises, the parallel run raises
        # too (and merges nothing); it need not match the partial serial state
        with pytest.raises(type(exc)):
            run_parallel_local(cell, fresh_namespace(), cuts, order=order)
        return
    parallel = fresh_namespace()
    parallel_before = dict(parallel)
    if _changed_an_input(serial):
        # never silently different: a change a call made to an input fails the
        # run on the engines' check, and nothing is merged
        with pytest.raises(checkin.Changed):
            run_parallel_local(cell, parallel, cuts, order=order)
        return
    run_parallel_local(cell, parallel, cuts, order=order)
    assert_same_namespace(serial, parallel, serial_before, parallel_before)


def _changed_an_input(ns: dict) -> bool:
    fresh = fresh_namespace()
    return ns["tracker"] != fresh["tracker"] or ns["trackers"] != fresh["trackers"]
