"""The reducer table (core/reducers.py) is the one place that knows the
reduction operators: the analysis matches by it, the merge and the plan ask
it, and the fold code shared with the engines has a row for each."""

from __future__ import annotations

import ast
from pathlib import Path

from gpucell.core.reducers import BY_AST, REDUCERS, SELECTING, selects, spelling
from gpucell.protocol.fold import BINARY

ROOT = Path(__file__).resolve().parent.parent


def test_every_operator_has_a_fold_and_every_fold_an_operator() -> None:
    assert set(REDUCERS) == set(BINARY)


def test_the_table_s_columns() -> None:
    assert SELECTING == {"max", "min"}
    assert BY_AST[ast.Add] == "+" and BY_AST[ast.MatMult] == "@"
    assert selects("max") and not selects("+") and not selects("?")
    assert spelling("acc", "+", True) == "acc += ..."
    assert spelling("acc", "*", False) == "acc = acc * ..."
    assert spelling("hi", "max", False) == "hi = max(hi, ...)"


def test_the_kernel_side_spells_no_reducer_list_of_its_own() -> None:
    """``("max", "min")`` as a reducer test appears nowhere in core/ but the
    table (builtin-name lists are not reducer tests)."""
    for path in (ROOT / "gpucell" / "core").rglob("*.py"):
        text = path.read_text()
        assert 'in ("max", "min")' not in text, path
        assert 'in ("min", "max")' not in text, path


def test_the_table_s_rows_are_the_fold_s() -> None:
    """One row per operator in protocol/fold.OPS; every other list of them
    (the analysis's AST classes, the merge's in-place forms, the engines'
    native folds) is a column of it."""
    from gpucell.core.analysis.reccalls import _BINOPS
    from gpucell.core.merge_inplace import _INPLACE
    from gpucell.engine.recorder import _Start
    from gpucell.protocol.fold import NATIVE, OPS, SELECTS
    from gpucell.protocol.program import NATIVE_REDUCTIONS

    assert set(OPS) == set(REDUCERS) and SELECTS == SELECTING
    assert NATIVE_REDUCTIONS == NATIVE == set(_BINOPS)
    assert set(_INPLACE) == set(OPS) - SELECTS
    for op in NATIVE:
        # an engine's first `p op= e` on the start value needs its method
        assert hasattr(_Start, OPS[op].inplace or ""), op
        assert BY_AST[_BINOPS[op]] == op
