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

from gpucell.core.analysis import LoopPlan, analyse, format_plan
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


# -- which loop runs in parallel -------------------------------------------------

TWO_LOOPS = """\
sizes = [len(x) for x in xs]
for i in range(len(xs)):
    out.append(sizes[i] * 2)
total = sum(v for v in out)
for j in out:
    seen.append(j)
"""


def test_the_first_top_level_for_runs_not_a_comprehension_before_it() -> None:
    p = plan(TWO_LOOPS)
    assert p.kind == "for"
    assert p.loop_lines == (2, 3)
    assert p.prelude_lines == (1, 1)
    assert p.epilogue_lines == (4, 6)
    assert p.choice.startswith("the first top-level `for` loop (line 2)")
    assert "the comprehension on line 1 (before it)" in p.choice
    assert "the `sum(...)` on line 4 (after it)" in p.choice
    assert "the `for` loop on line 5 (after it)" in p.choice
    text = format_plan(p)
    assert "chosen: the first top-level `for` loop (line 2)" in text


def test_a_comprehension_runs_in_parallel_only_in_a_cell_without_a_for() -> None:
    p = plan("a = [x * 2 for x in xs]\nb = {x for x in a}\nprint(len(a))\n")
    assert p.kind == "listcomp"
    assert p.result_name == "a"
    assert p.choice.startswith(
        "the comprehension on line 1 (the cell has no top-level `for` loop)"
    )
    assert "the comprehension on line 2 (after it)" in p.choice


def test_the_rule_looks_inside_top_level_with_blocks() -> None:
    src = (
        "s = [x for x in xs]\n"
        "with ctx():\n"
        "    t = [x for x in s]\n"
        "    for i in t:\n"
        "        out.append(i)\n"
    )
    p = plan(src)
    assert p.kind == "for"
    assert p.loop_header == "for i in t"
    assert p.prelude_lines == (1, 1)
    (layer,) = p.layers
    assert [s.lineno for s in layer.before] == [3]


def test_a_single_loop_is_said_too() -> None:
    p = plan("for i in range(3):\n    out.append(i)\n")
    assert p.choice == "the first top-level `for` loop (line 1)"
    assert "chosen: the first top-level `for` loop (line 1)" in format_plan(p)


# -- on a real cluster -------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("cell", "ns"),
    [
        (TWO_LOOPS, {"xs": ["a", "bb", "ccc", "dddd", "e"], "out": [], "seen": []}),
        (
            "norm = {k: v / 10 for k, v in raw.items()}\n"
            "for k in sorted(norm):\n"
            "    res[k] = norm[k] ** 2\n"
            "best = max(res.values())\n",
            {"raw": {f"k{i}": float(i) for i in range(9)}, "res": {}},
        ),
    ],
)
def test_cells_with_several_loops_match_the_serial_run(ip, cluster, cell, ns) -> None:
    from test_parallel import assert_serial_equivalent

    assert_serial_equivalent(ip, cell, ns)


@pytest.mark.cluster
def test_dry_run_says_which_loop_was_chosen(ip, cluster, capsys) -> None:
    ip.user_ns.update({"xs": ["a", "bb"], "out": [], "seen": []})
    ip.run_cell_magic("gpu_parallel", "--dry-run", TWO_LOOPS)
    said = capsys.readouterr().out  # (lines count from the magic's line)
    assert "chosen: the first top-level `for` loop (line 3)" in said
    assert "the comprehension on line 2 (before it)" in said


def test_refusals_raise_with_the_running_minimum_advice() -> None:
    with pytest.raises(NotParallelizable, match="running minimum"):
        analyse("for x in xs:\n    if f(x) < best:\n        best = f(x)\n")
