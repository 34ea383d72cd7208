"""The sink kinds that are classes (core/analysis/sinks.py, issue 28 §2): each
matches its own statements and no other kind's, and describes a name as the
plan shows it."""

from __future__ import annotations

import ast

import pytest

from gpucell.core.analysis.sinks import (
    GATHER,
    KINDS,
    REDUCTION,
    GatherSink,
    ReductionSink,
    match_candidates,
)


def _stmt(src: str) -> ast.stmt:
    return ast.parse(src).body[0]


def _builtin(name: str) -> bool:
    return True


GATHERS = ["L.append(x)", "L.extend(xs)", "L += [x]", "L += [y for y in x]"]
REDUCTIONS = [
    ("acc += x", "+", True),
    ("acc *= x", "*", True),
    ("acc = acc + x", "+", False),
    ("best = max(best, x)", "max", False),
    ("low = min(low, x)", "min", False),
]
NEITHER = [
    "L.append(*xs)",
    "L.append(x, y)",
    "L.append(x, key=1)",
    "d[k] += 1",
    "d[k].append(x)",
    "s.add(x)",
    "acc = x + acc",
    "acc = max(x, acc)",
    "d[k] = x",
]


@pytest.mark.parametrize("src", GATHERS)
def test_a_gather_is_matched_by_its_class_alone(src: str) -> None:
    stmt = _stmt(src)
    found = GatherSink.match(stmt, _builtin)
    assert found is not None and found.cls == GATHER and found.name == "L"
    assert ReductionSink.match(stmt, _builtin) is None
    assert [c.cls for c in match_candidates(stmt, _builtin)] == [GATHER]


@pytest.mark.parametrize(("src", "op", "aug"), REDUCTIONS)
def test_a_reduction_is_matched_with_its_operator(src: str, op: str, aug: bool) -> None:
    stmt = _stmt(src)
    found = ReductionSink.match(stmt, _builtin)
    assert found is not None and found.cls == REDUCTION
    assert (found.op, found.augmented) == (op, aug)
    assert GatherSink.match(stmt, _builtin) is None
    assert [c.cls for c in match_candidates(stmt, _builtin)] == [REDUCTION]


def test_a_shadowed_max_is_no_reduction() -> None:
    stmt = _stmt("best = max(best, x)")
    assert ReductionSink.match(stmt, lambda n: False) is None


@pytest.mark.parametrize("src", NEITHER)
def test_other_statements_are_left_to_the_other_kinds(src: str) -> None:
    stmt = _stmt(src)
    assert all(kind.match(stmt, _builtin) is None for kind in KINDS)


def test_the_kinds_describe_a_name_as_the_plan_shows_it() -> None:
    assert GatherSink.describe(fresh=True) == "new list, in iteration order"
    assert GatherSink.describe(fresh=False) == "extended in iteration order"
    assert ReductionSink.describe("acc", "+", True) == "acc += ..."
