"""The refusals as message classes (core/analysis/refusals.py, issue 28 §2):
one class per kind that docs/refusals.md explains, named for it, and every
refusal the analysis makes an instance of its kind's class, carrying its line,
name, and the advice it gives; the words are unchanged (test_messages.py,
test_refusals_doc.py check them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_refusals_doc import examples, known_names, sections

from gpucell.core.analysis import analyse
from gpucell.core.analysis.diagnostics import Diagnostic
from gpucell.core.analysis.refusals import REFUSALS, Refusal, class_name
from gpucell.errors import NotParallelizable

ANALYSIS = Path(__file__).resolve().parent.parent / "gpucell" / "core" / "analysis"


def test_each_documented_kind_has_its_class_and_each_class_its_section() -> None:
    documented = set(sections())
    assert documented == set(REFUSALS), (
        f"without a class: {documented - set(REFUSALS)}; "
        f"without a section: {set(REFUSALS) - documented}"
    )
    for kind, cls in REFUSALS.items():
        assert cls.__name__ == class_name(kind) and cls.KIND == kind
        assert issubclass(cls, Refusal) and issubclass(cls, Diagnostic)


def _diagnostics(src: str) -> tuple[Diagnostic, ...]:
    try:
        plan = analyse(src, known_names=known_names(src))
    except NotParallelizable as e:
        return e.diagnostics  # type: ignore[attr-defined,no-any-return]
    return plan.warnings


@pytest.mark.parametrize("kind", sorted(sections()))
def test_the_documented_refusal_is_an_instance_of_its_class(kind: str) -> None:
    ex = examples(sections()[kind])
    found = _diagnostics(ex.get("refused") or ex["warned"])
    assert found
    for d in found:
        assert type(d) is REFUSALS[d.kind], (d.kind, type(d))
        assert isinstance(d, Refusal)
        # the record carries what the classes are for: where, what, the rewrite
        assert d.text == d.message + d.advice
        assert d.line >= 1 and d.advice.strip(), d
    assert kind in {d.kind for d in found}


def test_the_analysis_records_no_refusal_as_bare_words() -> None:
    """``DiagnosticSink.add(line, col, name, kind, text)`` is the kernel's
    (run-time checks); the analysis reports class instances."""
    words = []
    for path in sorted(ANALYSIS.glob("*.py")):
        if path.name == "diagnostics.py":
            continue
        for call in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "add"
                and len(call.args) == 5
            ) or (
                isinstance(call, ast.Call) and ast.unparse(call.func) == "Diagnostic"
            ):
                words.append(f"{path.name}:{call.lineno}")
    assert not words, words


def test_the_message_and_advice_are_the_templates_over_the_arguments() -> None:
    d = REFUSALS["global"](3, 4, "total")
    assert (d.line, d.col, d.name, d.kind) == (3, 4, "total", "global")
    assert d.message.startswith("`global total` would rebind `total`")
    assert d.advice.startswith("Assign `total` in the loop body")
    assert str(d) == f"line 3: {d.message}{d.advice}"
    # equal to (and sorted with) the plain record it makes
    plain = Diagnostic(3, 4, "total", "global", d.text)
    assert d == plain and hash(d) == hash(plain)
    assert sorted([d, Diagnostic(1, 0, "x", "other", "t")])[0].line == 1


@pytest.mark.parametrize(
    ("cell", "line"),
    [
        ("x = 3.0\nwhile abs(x * x - 2) > 1e-12:\n    x = (x + 2 / x) / 2\n", 2),
        ("x = 0\nwith torch.no_grad():\n    while x < 3:\n        x += 1\n", 3),
    ],
)
def test_a_while_loop_is_named_as_one_with_a_for_to_rewrite_it(
    cell: str, line: int
) -> None:
    """A top-level ``while`` is at the top level: the refusal says why a
    ``while`` cannot be split and to write a ``for`` over the items, not
    to move the loop to the top level."""
    (d,) = _diagnostics(cell)
    assert (type(d), d.kind, d.line) == (REFUSALS["while-loop"], "while-loop", line)
    assert "`while` loop" in d.message and "cannot be known in advance" in d.message
    assert "`for` over the items" in d.advice and "top level" not in d.text


@pytest.mark.parametrize(
    ("cell", "iterated", "copy"),
    [
        (
            "df['s'] = 0.0\nfor i in df.index[1:]:\n"
            "    df.loc[i, 's'] = df.loc[i - 1, 's'] + df.loc[i, 'u']\n",
            "df.index[1:]",
            "A copy (`list(df.index[1:])`) is not enough here",
        ),
        (
            "for r, job in enumerate(queue):\n    queue.append(job + r)\n",
            "queue",
            "`for x in list(queue):`",
        ),
        (
            "for k, row in df.iterrows():\n    df.at[k + 1, 'c'] = row['a']\n",
            "df.iterrows()",
            "`for x in list(df.iterrows()):`",
        ),
    ],
)
def test_a_changed_iterable_is_named_as_the_loop_iterates_it(
    cell: str, iterated: str, copy: str
) -> None:
    """The loop iterates over an expression made from a name the body
    changes: the refusal names that expression (and the copy to iterate),
    not the bare name (`list(df)` would be the frame's column names)."""
    d = next(d for d in _diagnostics(cell) if d.kind == "iterable-mutated")
    assert f"iterates over `{iterated}`" in d.message
    root = iterated.split(".")[0].split("[")[0]
    assert (f"made from `{root}`" in d.message) == (iterated != root)
    assert copy in d.advice
