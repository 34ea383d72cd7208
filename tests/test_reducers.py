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
