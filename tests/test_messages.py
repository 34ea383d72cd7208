"""What a refusal or a plan tells the user (issue 28 §3, misleading messages):
the running-best advice says `min` for a running minimum, the change that
matters (a `fit` on an estimator from before the loop) is named first, and a
cell with several loops runs a predictable one, said in ``--dry-run``.

Pure analysis first; the cells whose loop choice changed are compared with
their serial run on a real cluster at the end.
"""

from __future__ import annotations

import textwrap

import pytest

from gpucell.core.analysis import LoopPlan, analyse
from gpucell.errors import NotParallelizable


def plan(src: str) -> LoopPlan:
    return analyse(textwrap.dedent(src), raise_errors=False)


def texts(src: str) -> dict[tuple[str, str], str]:
    return {(d.name, d.kind): d.text for d in plan(src).diagnostics}


# -- the running best: max or min ----------------------------------------------


@pytest.mark.parametrize(
    ("body", "op", "score"),
    [
        ("    if loss < best:\n        best = loss\n", "min", "loss"),
        ("    if loss <= best:\n        best = loss\n", "min", "loss"),
        ("    if best > loss:\n        best = loss\n", "min", "loss"),
        ("    if score > best:\n        best = score\n", "max", "score"),
        ("    if best <= acc:\n        best = acc\n", "max", "acc"),
        # the new value taken when the test fails
        ("    if loss >= best:\n        pass\n    else:\n        best = loss\n",
         "min", "loss"),
        ("    best = loss if loss < best else best\n", "min", "loss"),
        ("    best = best if best < score else score\n", "min", "score"),
        ("    best = best if best > loss else loss\n", "max", "loss"),
        # a condition around it does not change which way
        ("    if loss < best and x > 0:\n        best = loss\n", "min", "loss"),
    ],
)  # fmt: skip
def test_the_running_best_advice_says_max_or_min_as_the_test_does(
    body: str, op: str, score: str
) -> None:
    src = "for x in xs:\n    loss = f(x)\n    score = g(x)\n    acc = h(x)\n" + body
    text = texts(src)[("best", "loop-carried")]
    other = {"max": "min", "min": "max"}[op]
    word = {"max": "maximum", "min": "minimum"}[op]
    assert f"running {word}" in text
    assert f"`best = {op}(best, {score})`" in text
    assert f"`{op}(pairs, key=lambda t: t[0])`" in text
    assert f"({score}, params)" in text
    assert f"{other}(" not in text


def test_a_running_best_whose_direction_is_unclear_names_both() -> None:
    src = (
        "for x in xs:\n    loss = f(x)\n    if not loss < best or x:\n"
        "        best = loss\n"
    )
    text = texts(src)[("best", "loop-carried")]
    assert "running best" in text
    assert "`max(pairs, key=lambda t: t[0])` (or `min`, for a running minimum)" in text


def test_a_first_match_keeps_its_advice() -> None:
    src = "for x in xs:\n    if found is None:\n        found = x\n"
    assert "first match" in texts(src)[("found", "loop-carried")]


def test_refusals_raise_with_the_running_minimum_advice() -> None:
    with pytest.raises(NotParallelizable, match="running minimum"):
        analyse("for x in xs:\n    if f(x) < best:\n        best = f(x)\n")
