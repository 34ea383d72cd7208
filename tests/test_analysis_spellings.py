"""Reductions and gathers spelled otherwise (core/analysis/spellings.py):
which statements are rewritten to a proved form, and which are left alone
(then refused or proved as before)."""

from __future__ import annotations

import ast

import pytest

from gpucell.core.analysis.scope import BUILTIN_NAMES
from gpucell.core.analysis.spellings import respell


def _respell(src: str) -> tuple[str, object]:
    body = ast.parse(src).body
    spelled = respell(body, lambda n: n in BUILTIN_NAMES)
    return ast.unparse(ast.Module(body=body, type_ignores=[])), spelled


@pytest.mark.parametrize(
    ("src", "want"),
    [
        ("c[w] = c.get(w, 0) + 1", "c[w] += 1"),
        ("c[w.k] = c.get(w.k, 0.0) - x * 2", "c[w.k] -= x * 2"),
        ("t[k] = t[k] + v", "t[k] += v"),
        ("ix.setdefault(f(w), []).append(i)", "ix[f(w)].append(i)"),
        ("ix.setdefault(k, []).extend(vs)", "ix[k].extend(vs)"),
        ("lo, hi = min(lo, x), max(hi, x)", "lo = min(lo, x)\nhi = max(hi, x)"),
        ("n, s = n + 1, s + abs(t)", "n = n + 1\ns = s + abs(t)"),
    ],
)
def test_rewritten(src: str, want: str) -> None:
    assert _respell(src)[0] == want


@pytest.mark.parametrize(
    "src",
    [
        "c[f(w)] = c.get(f(w), 0) + 1",  # a call in the key: evaluated twice
        "c[w] = c.get(w, []) + [1]",  # not a numeric default
        "c[w] = c.get(v, 0) + 1",  # another key
        "c[w] = c.get(w, 0) + c[v]",  # reads the sink
        "ix.setdefault(k, [0]).append(i)",  # not an empty list
        "ix.setdefault(k, []).append(ix)",
        "a, b = b, a + x",  # each part reads the other target
        "a, b = f(a), g(b)",  # calls a function (it could read a global)
        "a, a = min(a, x), max(a, x)",
    ],
)
def test_left_alone(src: str) -> None:
    assert _respell(src)[0] == ast.unparse(ast.parse(src))


def test_what_the_merge_is_told() -> None:
    _, s = _respell(
        "for w in ws:\n    c[w] = c.get(w, 0) + 1\n"
        "t[k] = t[k] + 1\nt[j] += 2\nix.setdefault(k, []).append(1)\n"
    )
    assert s.defaults == {"c": 0}
    assert s.rebinding == {"c", "t"}
    assert s.mixed == {"t"}
    assert s.new_lists == {"ix"}
    # a get form beside an augmented one: not rewritten (serially += needs
    # the key), nor when two get forms disagree on the default
    src = (
        "c[k] = c.get(k, 0) + 1\nc[k] += 1\n"
        "d[k] = d.get(k, 0) + 1\nd[j] = d.get(j, 1) + 1"
    )
    text, s = _respell(src)
    assert text == ast.unparse(ast.parse(src)) and not s.defaults


@pytest.mark.parametrize(
    ("src", "rewritten"),
    [
        ("s.append(f(x))\nlog(s[-1])\ns[-1].k = 1", True),
        ("s.append(x)\nif s[-1] > 0:\n    print(s[-1])", True),
        ("print(s[-1])\ns.append(x)", False),  # the previous iteration's
        ("s.append(x)\nfor y in ys:\n    s.append(y)\nprint(s[-1])", False),
        ("s.append(x)\ns[-1] = 3", False),
        ("s.append(x)\ns[-1] += 3", False),
        ("s.append(x)\ng = lambda: s[-1]", False),
        ("s.append(x)\nn = len(s) + s[-1]", False),
    ],
)
def test_the_element_just_appended_read_back(src: str, rewritten: bool) -> None:
    text, s = _respell(src)
    temp = "__gpucell_last_s__"
    assert (temp in text) == rewritten
    assert s.hidden == ({temp} if rewritten else set())
    if rewritten:
        assert "s[-1]" not in text and f"s.append({temp})" in text


def test_the_temporary_is_never_bound_in_the_notebook() -> None:
    from gpucell.core.analysis.driver import analyse

    p = analyse(
        "out = []\nfor x in xs:\n    out.append(f(x))\n    print(out[-1])\n",
        known_names={"xs", "f"},
    )
    assert p.ok and p.gathers == ("out",)
    assert "__gpucell_last_out__" in p.hidden
    assert "__gpucell_last_out__" not in {n.name for n in p.names}
