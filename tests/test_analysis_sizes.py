"""Issue 28's limit on the analysis: no function in ``core/analysis/`` over 120
lines (``driver.analyse`` had grown to 248, ``classify_body`` to 244: a long
function there hides which sink or refusal a change touches)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "gpucell" / "core" / "analysis"
LIMIT = 120


@pytest.mark.parametrize("path", sorted(ROOT.glob("*.py")), ids=lambda p: p.name)
def test_no_analysis_function_over_the_limit(path: Path) -> None:
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > LIMIT
    ]
    assert not long, f"{path.name}: split along its seams: {long}"


def test_the_analysis_modules_are_found() -> None:
    assert (ROOT / "classify.py").exists() and (ROOT / "driver.py").exists()
