"""A cell with several top-level loops says, in the summary line after the
run as in ``--dry-run``, which one ran in parallel and where the others ran
(issue 28 §3, misleading: the rule must be one a user can predict)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.cluster

CELL = """\
names = [x.upper() for x in xs]
for j, n in enumerate(names):
    out.append(len(n) * j)
total = sum(v for v in out)
"""


def test_the_summary_line_says_which_loop_ran(ip, cluster, capsys) -> None:
    ip.user_ns.update({"xs": ["a", "bb", "ccc", "dddd"], "out": []})
    ip.run_cell_magic("gpu_parallel", "", CELL)
    said = capsys.readouterr().out
    (line,) = [
        ln
        for ln in said.splitlines()
        if ln.startswith("gpucell: ") and " iterations " in ln
    ]
    assert "in parallel: the first top-level `for` loop (line 3)" in line
    assert "the comprehension on line 2 (before it)" in line
    assert ip.user_ns["out"] == [0, 2, 6, 12] and ip.user_ns["total"] == 20
    ip.run_cell_magic("gpu_parallel", "--dry-run", CELL)
    dry = capsys.readouterr().out
    assert "chosen: the first top-level `for` loop (line 3)" in dry


def test_a_single_loop_keeps_the_short_summary(ip, cluster, capsys) -> None:
    ip.user_ns.update({"xs": ["a", "bb"], "out": []})
    ip.run_cell_magic("gpu_parallel", "", "for x in xs:\n    out.append(x * 2)\n")
    said = capsys.readouterr().out
    assert "in parallel:" not in said
