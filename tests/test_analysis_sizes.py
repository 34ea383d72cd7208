"""Issue 28's limits on the analysis: no function in ``core/analysis/`` over 120
lines (``driver.analyse`` had grown to 248, ``classify_body`` to 244: a long
function there hides which sink or refusal a change touches), and no module
over 600 (``flow.py`` had 1,053, almost all one class)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "gpucell" / "core" / "analysis"
LIMIT = 120
MODULE_LIMIT = 600


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


@pytest.mark.parametrize("path", sorted(ROOT.glob("*.py")), ids=lambda p: p.name)
def test_no_analysis_module_over_the_limit(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MODULE_LIMIT, f"{path.name}: {lines} lines, split along its seams"


def test_the_kinds_are_imported_from_sinks_not_re_exported() -> None:
    """One home for the sink kinds: no other analysis module lists them."""
    kinds = {"INPUT", "LOCAL", "GATHER", "WRITE", "REDUCTION", "KEYED", "UNION"}
    for path in ROOT.glob("*.py"):
        if path.name in ("sinks.py", "__init__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                listed = set(ast.literal_eval(node.value)) & kinds
                assert not listed, f"{path.name} re-exports {listed}"
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and kinds & {a.name for a in node.names}
            ):
                assert node.module == "gpucell.core.analysis.sinks", (
                    path.name,
                    node.module,
                )


def test_the_analysis_modules_are_found() -> None:
    assert (ROOT / "classify.py").exists() and (ROOT / "driver.py").exists()
