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
    # (read nowhere else, `best = loss if loss < best else best` is made on
    # the kernel from the engines' values: replaystmts.py)
    src += "    seen.append(best)\n"
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


# -- the change that matters, named first ---------------------------------------

BEST = "    if best < c:\n        best = c\n"

REFIT_AND_BEST = """\
for c in Cs:
    s = score
    clf.set_params(C=c)
    clf.fit(X, y)
    s = clf.score(X, y)
    if s > best:
        best = s
"""


def test_a_refit_of_an_estimator_from_before_the_loop_is_named_first() -> None:
    diags = plan(REFIT_AND_BEST).diagnostics
    assert diags[0].kind == "input-refit" and diags[0].name == "clf"
    assert diags[0].line == 4  # the fit, not set_params, though that comes first
    assert {d.kind for d in diags[1:]} == {"loop-carried"}
    text = diags[0].text
    assert "`clf.fit(...)` changes `clf`, which exists before the loop" in text
    assert "`m = sklearn.base.clone(clf)`" in text
    assert "`for m in models: m.fit(X, y)`" in text
    # the raised message lists it first too
    with pytest.raises(NotParallelizable) as info:
        analyse(REFIT_AND_BEST)
    first = str(info.value).splitlines()[1]
    assert first.startswith("  - line 4: `clf.fit(...)` changes `clf`")


@pytest.mark.parametrize(
    "src",
    [
        # through set_params, which returns the estimator
        "for c in Cs:\n    pipe.set_params(svc__C=c).fit(X, y)\n" + BEST,
        "for c in Cs:\n    est.partial_fit(X, y)\n" + BEST,
        "for c in Cs:\n    est.set_params(alpha=c)\n" + BEST,
    ],
)
def test_refits_are_named_through_set_params_and_partial_fit(src: str) -> None:
    diags = plan(src).diagnostics
    assert diags[0].kind == "input-refit"


@pytest.mark.parametrize(
    "src",
    [
        # nothing else is refused: the engines' check stops it (or the own
        # item is written back), no refusal is added
        "for c in Cs:\n    clf.fit(X, y)\n    scores[c] = clf.score(X, y)\n",
        # the loop's own items, fitted each: written back (own items)
        "for m in models:\n    m.fit(X, y)\n    if m.score(X, y) > best:\n"
        "        best = m.score(X, y)\n",
        # an estimator made in the iteration
        "for c in Cs:\n    m = make(c)\n    m.fit(X, y)\n" + BEST,
    ],
)
def test_no_refit_note_where_it_does_not_apply(src: str) -> None:
    assert "input-refit" not in {d.kind for d in plan(src).diagnostics}


@pytest.mark.cluster
def test_the_refit_refusal_and_its_rewrite_on_a_cluster(ip, cluster) -> None:
    from sklearn.linear_model import LogisticRegression
    from test_parallel import run_both, same

    rng = __import__("numpy").random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = (X[:, 0] + 0.3 * X[:, 1] > 0).astype(int)
    clf = LogisticRegression(max_iter=200)
    ip.user_ns.update(X=X, y=y, clf=clf, Cs=[0.01, 0.1, 1.0, 10.0], best=0.0)
    with pytest.raises(NotParallelizable) as info:
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", REFIT_AND_BEST.replace("    s = score\n", "")
        )
    assert (
        str(info.value)
        .splitlines()[1]
        .startswith("  - line 4: `clf.fit(...)` changes `clf`")
    )
    assert ip.user_ns["clf"] is clf and not hasattr(clf, "coef_")
    # the rewrite the message names runs, and leaves the serial namespace
    cell = (
        "from sklearn.base import clone\n"
        "for c in Cs:\n"
        "    m = clone(clf)\n"
        "    m.set_params(C=c)\n"
        "    m.fit(X, y)\n"
        "    scores[c] = m.score(X, y)\n"
        "    models.append(m.coef_.copy())\n"
    )
    ns = dict(X=X, y=y, clf=clf, Cs=[0.01, 0.1, 1.0, 10.0], scores={}, models=[])
    serial, got = run_both(ip, cell, ns)
    for name in ("scores", "models", "c"):  # (estimators compare by identity)
        assert same(serial[name], got[name]), name
    assert not hasattr(got["clf"], "coef_")
    assert len(got["models"]) == 4


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
