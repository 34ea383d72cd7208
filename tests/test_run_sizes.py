"""Issue 27's limits on the run's modules: the run state, the schedule and the
dispatcher each stay under 600 lines, and none of their functions over 80 (the
dispatcher had grown to 1,389 lines, the schedule to 1,191, before the split).
The merge and the own items' write-back are held to the same limits (1,341
and 825 lines before their split)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "gpucell"
MODULES = [
    "core/merge.py",
    "core/merge_base.py",
    "core/merge_inplace.py",
    "core/merge_keyed.py",
    "core/merge_ordered.py",
    "core/merge_replays.py",
    "core/merge_writes.py",
    "core/run_events.py",
    "core/run_errors.py",
    "core/run_report.py",
    "core/run_state.py",
    "core/schedule.py",
    "core/schedule_cost.py",
    "core/schedule_fields.py",
    "core/schedule_pace.py",
    "core/schedule_sizing.py",
    "core/writeback.py",
    "core/writeback_apply.py",
    "core/writeback_fit.py",
    "core/writeback_reach.py",
    "core/writeback_target.py",
    "engine/checkout.py",
    "engine/checkout_kinds.py",
    "engine/checkout_state.py",
    "engine/checkout_updates.py",
    "kernel/dispatch.py",
    "kernel/executor.py",
    "kernel/feedback.py",
    "kernel/preflight.py",
    "kernel/preflight_functions.py",
    "kernel/preflight_problem.py",
    "kernel/preflight_process.py",
    "kernel/preflight_sinks.py",
    "kernel/sending.py",
    "kernel/stopping.py",
]


@pytest.mark.parametrize("name", MODULES)
def test_a_run_module_stays_small(name: str) -> None:
    text = (ROOT / name).read_text()
    assert len(text.splitlines()) <= 600, f"{name}: split it along its jobs"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 80
    ]
    assert not long, f"{name}: functions over 80 lines: {long}"
