"""Syntax trees are copied by their grammar, not by ``copy.deepcopy``.

IPython's traceback display marks every node of the source it shows with a
``parent``, including the ``Load``/``Store``/operator nodes the parser shares
between all trees; a deep copy of any later tree then followed those into the
old tree (and whatever hung on it). In the test suite that made every
analysis after one shown traceback 100-500 ms slower.
"""

from __future__ import annotations

import ast

import pytest
from sweep_loops_corpus import CASES

from gpucell.core.astcopy import copy_tree, copy_trees


def _extra_attributes(tree: ast.AST) -> list[tuple[str, str]]:
    return [
        (type(n).__name__, k)
        for n in ast.walk(tree)
        for k in vars(n)
        if k not in n._fields and k not in n._attributes
    ]


SOURCES = sorted({(c.setup + "\n" + c.cell).replace("@TMP@", "'/tmp'") for c in CASES})


def test_a_copy_has_the_same_code_and_positions() -> None:
    """Every loop of the held-in corpus, with its set-up."""
    for source in SOURCES:
        tree = ast.parse(source)
        copied = copy_tree(tree)
        assert ast.dump(copied, include_attributes=True) == ast.dump(
            tree, include_attributes=True
        ), source
        originals = {id(n) for n in ast.walk(tree) if n._fields}
        assert not any(id(n) in originals for n in ast.walk(copied) if n._fields)
        compile(copied, "<cell>", "exec")


def test_what_others_hang_on_nodes_is_not_copied() -> None:
    tree = ast.parse("for i in range(3):\n    y[i] = x * i\n")
    big = list(range(100_000))
    for node in ast.walk(tree):
        node.parent = big  # type: ignore[attr-defined]
    copied = copy_trees(tree.body)
    assert all(_extra_attributes(st) == [] for st in copied)
    assert ast.unparse(copied[0]) == ast.unparse(tree.body[0])


def test_after_a_traceback_in_ipython_the_chunk_program_reaches_no_old_tree(ip) -> None:
    ip.run_cell("def _fails():\n    return 1 / 0\n_fails()")
    if getattr(ast.parse("x").body[0].value.ctx, "parent", None) is None:  # type: ignore[attr-defined]
        pytest.skip("this IPython's traceback display marks no shared node")
    from gpucell.core.analysis.rewrite import unstamped

    tree = ast.parse(
        "for __gpucell_i__, x in __gpucell_items__:\n"
        "    __gpucell_begin__(__gpucell_i__)\n"
        "    y = x * 2\n"
    )
    program = unstamped(tree)
    assert program is not None
    assert _extra_attributes(program) == []
