"""The sink kinds as classes (core/analysis/sinks.py, issue 28 §2): each
matches its own statements and no other kind's, match_candidates is their
union in KINDS order, and each describes a name as the plan shows it."""

from __future__ import annotations

import ast

import pytest

from gpucell.core.analysis.sinks import (
    GATHER,
    KEYED,
    KEYED_GATHER,
    KINDS,
    REDUCTION,
    UNION,
    WRITE,
    GatherSink,
    KeyedGatherSink,
    KeyedSink,
    ReductionSink,
    UnionSink,
    WriteSink,
    match_candidates,
)


def _stmt(src: str) -> ast.stmt:
    return ast.parse(src).body[0]


def _builtin(name: str) -> bool:
    return True


CASES = [
    ("L.append(x)", GatherSink, GATHER, "L"),
    ("L.extend(xs)", GatherSink, GATHER, "L"),
    ("L += [x]", GatherSink, GATHER, "L"),
    ("L += [y for y in x]", GatherSink, GATHER, "L"),
    ("acc += x", ReductionSink, REDUCTION, "acc"),
    ("acc = acc * x", ReductionSink, REDUCTION, "acc"),
    ("best = max(best, x)", ReductionSink, REDUCTION, "best"),
    ("S.add(x)", UnionSink, UNION, "S"),
    ("S.update(xs, ys)", UnionSink, UNION, "S"),
    ("D[k].append(x)", KeyedGatherSink, KEYED_GATHER, "D"),
    ("D[k] += x", KeyedSink, KEYED, "D"),
    ("D[k] = x", WriteSink, WRITE, "D"),
    ("D.at[k, 'c'] = x", WriteSink, WRITE, "D"),
    ("del D[k]", WriteSink, WRITE, "D"),
]
NONE = [
    "L.append(*xs)",
    "L.append(x, y)",
    "L.append(x, key=1)",
    "S.add()",
    "S.update()",
    "acc = x + acc",
    "acc = max(x, acc)",
    "x = f(y)",
    "del x",
]


@pytest.mark.parametrize(("src", "cls", "kind", "name"), CASES)
def test_a_statement_is_matched_by_its_kind_alone(
    src: str, cls: type, kind: str, name: str
) -> None:
    stmt = _stmt(src)
    found = [(k, k.match(stmt, _builtin)) for k in KINDS]
    assert [k for k, cs in found if cs] == [cls]
    assert [(c.cls, c.name) for c in match_candidates(stmt, _builtin)] == [(kind, name)]


def test_an_assignment_may_reduce_and_write() -> None:
    stmt = _stmt("acc = acc + 1")
    assert [c.cls for c in match_candidates(stmt, _builtin)] == [REDUCTION]
    both = _stmt("a[i], b[j] = 1, 2")
    assert [(c.cls, c.name) for c in match_candidates(both, _builtin)] == [
        (WRITE, "a"),
        (WRITE, "b"),
    ]


def test_a_reduction_keeps_its_operator_and_spelling() -> None:
    (aug,) = ReductionSink.match(_stmt("acc *= x"), _builtin)
    assert (aug.op, aug.augmented) == ("*", True)
    (sel,) = ReductionSink.match(_stmt("low = min(low, x)"), _builtin)
    assert (sel.op, sel.augmented) == ("min", False)
    # a shadowed `max` is the user's function, no reduction
    assert ReductionSink.match(_stmt("best = max(best, x)"), lambda n: False) == []


@pytest.mark.parametrize("src", NONE)
def test_other_statements_are_no_sink(src: str) -> None:
    assert match_candidates(_stmt(src), _builtin) == []


def test_the_kinds_describe_a_name_as_the_plan_shows_it() -> None:
    assert GatherSink.describe(fresh=True) == "new list, in iteration order"
    assert GatherSink.describe(fresh=False) == "extended in iteration order"
    assert ReductionSink.describe("acc", "+", True) == "acc += ..."
    assert ReductionSink.describe("b", "max", False) == "b = max(b, ...)"
    assert UnionSink.describe() == "union of all additions"
    assert KeyedGatherSink.describe("D") == "D[k].append(...)"
    assert KeyedSink.describe("D", "+") == "D[k] += ..."
    assert WriteSink.describe() == "item writes in iteration order"


class _Names:
    """A walk's view for the kinds' rewrites: one name of one kind."""

    def __init__(self, kind: str, name: str) -> None:
        kinds = (GATHER, REDUCTION, UNION, KEYED_GATHER, KEYED, WRITE)
        self.names = {k: {name} if k == kind else set() for k in kinds}
        self.reduction_ops = {name: "+"}
        self.n = 0

    def temporary(self) -> str:
        self.n += 1
        return f"__tmp{self.n}__"


@pytest.mark.parametrize(("src", "cls", "kind", "name"), CASES)
def test_a_statement_is_rewritten_by_its_kind_alone(
    src: str, cls: type, kind: str, name: str
) -> None:
    """Each kind rewrites its own statements into recorder calls (or the
    engine's own fold) and leaves every other kind's, and other names', alone."""
    rewritten = [k for k in KINDS if k.rewrite(_stmt(src), _Names(kind, name))]
    assert rewritten == [cls]
    out = cls.rewrite(_stmt(src), _Names(kind, name))
    text = "\n".join(ast.unparse(s) for s in (out if isinstance(out, list) else [out]))
    assert "__gpucell_" in text, text  # the recorder, or a chunk's own partial
    assert cls.rewrite(_stmt(src), _Names(kind, "other")) is None


def test_tuple_targets_write_through_temporaries_in_store_order() -> None:
    out = WriteSink.rewrite(_stmt("a[i], b = f(x)"), _Names(WRITE, "a"))
    assert isinstance(out, list)
    assert [ast.unparse(s) for s in out] == [
        "__tmp1__, b = f(x)",
        "__gpucell_rec__.setitem(__tmp1__, 'a', i)",
    ]
