"""cluster/ stays split along its jobs (issue 27): no module over 600 lines, no
function over 80 (the cluster model, start, connect, profiles, engine
descriptions each in its own module)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CLUSTER = Path(__file__).resolve().parents[1] / "gpucell" / "cluster"
MODULES = sorted(CLUSTER.glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_cluster_modules_and_functions_are_short(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) < 600, f"{path.name} is over 600 lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.end_lineno or 0) - node.lineno + 1 > 80
    ]
    assert not long, f"{path.name}: functions over 80 lines: {long}"


def test_lifecycle_keeps_the_names_its_importers_use() -> None:
    from gpucell.cluster import lifecycle

    for name in (
        "EngineInfo",
        "GpuCluster",
        "connect",
        "current",
        "current_or_none",
        "format_status",
        "start_cluster",
        "status",
        "stop",
        "_remote_engine_args",
    ):
        assert hasattr(lifecycle, name), name
