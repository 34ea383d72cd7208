"""The running-best advice (issue 28 §3, misleading): a running minimum or
maximum kept with what goes with it (``if d < best_d: best_i, best_d = i,
d``) names the names it keeps, starts the candidates from the values before
the loop, and picks with the loop's own choice among equal scores (``<``: the
first, ``<=``: the last).  The advice, run as written, equals the loop.  (Each
loop reads what it keeps before the test, ``prev = best_i``: a running best
read nowhere else runs as written, tests/test_sink_categories.py.)"""

from __future__ import annotations

import re
import textwrap

import pytest

from gpucell.core.analysis import analyse

LOOPS = {
    "argmin, strict": (
        "best_i, best_d = -1, 9.0\nfor i, v in enumerate(vs):\n    prev = best_i\n"
        "    d = abs(v - 3)\n"
        "    if d < best_d:\n        best_i, best_d = i, d\n",
        "best_d",
        "min(pairs,",
    ),
    "argmax, not strict": (
        "bs, bd = -1.0, None\nfor depth in range(1, 9):\n    prev = bd\n"
        "    s = vs[depth % 6]\n"
        "    if s >= bs:\n        bs = s\n        bd = depth\n",
        "bs",
        "max(reversed(pairs),",
    ),
    "argmin, reversed test": (
        "lo, at = 99, None\nfor i, v in enumerate(vs):\n    prev = at\n"
        "    if lo > v:\n"
        "        lo = v\n        at = i\n",
        "lo",
        "min(pairs,",
    ),
}


def _advice(src: str, name: str) -> str:
    (d,) = [d for d in analyse(src, raise_errors=False).diagnostics if d.name == name]
    return d.text


@pytest.mark.parametrize("case", list(LOOPS))
def test_the_advice_names_what_is_kept_and_the_right_pick(case) -> None:
    src, name, pick = LOOPS[case]
    text = _advice(src, name)
    assert pick in text
    assert "keeps the " in text and "of equal scores" in text


@pytest.mark.parametrize(
    "vs", [[5, 1, 4, 1, 5, 9], [3, 3, 3, 3, 3, 3], [7, 2, 2, 6, 6, 0]]
)
@pytest.mark.parametrize("case", list(LOOPS))
def test_the_advice_run_as_written_equals_the_loop(case, vs) -> None:
    src, name, _ = LOOPS[case]
    text = _advice(src, name)
    start = re.search(r"`(pairs = \[.*?\])` before the loop", text).group(1)
    add = re.search(r"`(pairs\.append\(.*?\))` in it", text).group(1)
    pick = re.search(r"pick after the loop \(`(.*?)`", text).group(1)
    serial: dict = {"vs": vs}
    exec(src, serial)
    lines = src.splitlines()
    loop = next(k for k, ln in enumerate(lines) if ln.startswith("for "))
    body = [ln for ln in lines[loop + 1 :] if ln.startswith("    ")]
    # keep the body's lines before the test, then collect
    head = []
    for ln in body:
        if ln.strip().startswith("if "):
            break
        head.append(ln)
    rewritten = "\n".join(
        [*lines[:loop], start, lines[loop], *head, "    " + add, pick]
    )
    got: dict = {"vs": vs}
    exec(textwrap.dedent(rewritten), got)
    kept = re.search(r"`([\w, ]+) = (min|max)\(", text).group(1).split(", ")
    for k in kept:
        assert got[k] == serial[k], (k, rewritten)
