"""Unit tests of the pure analysis: split, classes, refusals, rewrite, formatting."""

from __future__ import annotations

import ast
import textwrap

import pytest

from gpucell.core.analysis import (
    GATHER,
    INPUT,
    KEYED,
    LOCAL,
    REDUCTION,
    UNION,
    WRITE,
    LoopPlan,
    analyse,
    chunk_items,
    format_plan,
    make_chunker,
)
from gpucell.errors import NotParallelizable

KNOWN = {
    "xs", "ys", "n", "out", "d", "acc", "total", "s", "model", "opt", "data", "arr",
    "kd", "mx", "np", "torch", "f", "obj", "L", "D", "S", "t", "lst", "prev",
}  # fmt: skip


def plan(src: str, **kw: object) -> LoopPlan:
    return analyse(textwrap.dedent(src), known_names=KNOWN, **kw)  # type: ignore[arg-type]


def refusals(src: str) -> list[tuple[str, str, int]]:
    with pytest.raises(NotParallelizable) as info:
        plan(src)
    err = info.value
    diags = err.diagnostics  # type: ignore[attr-defined]
    for d in diags:  # the message names every variable and line
        assert f"line {d.line}" in str(err)
        assert d.name in str(err)
    return [(d.name, d.kind, d.line) for d in diags]


def classes(p: LoopPlan) -> dict[str, str]:
    return {i.name: i.cls for i in p.names}


# -- split -------------------------------------------------------------------------


def test_split_prelude_loop_epilogue() -> None:
    p = plan(
        """\
        a = 1
        b = a + 1
        for i in range(n):
            out.append(i * a)
        c = len(out)
        """
    )
    assert p.kind == "for"
    assert p.prelude_lines == (1, 2)
    assert p.loop_lines == (3, 4)
    assert p.epilogue_lines == (5, 5)
    assert p.prelude_source.splitlines() == ["a = 1", "b = a + 1"]
    assert p.epilogue_source == "c = len(out)"
    assert p.loop_header == "for i in range(n)"


def test_first_top_level_loop_only_and_nested_loops_belong_to_iteration() -> None:
    p = plan(
        """\
        for i in range(n):
            for j in range(3):
                out.append(i * j)
            t2 = [j for j in range(i)]
        for z in xs:
            pass
        """
    )
    assert p.loop_lines == (1, 4)
    assert p.epilogue_lines == (5, 6)
    assert classes(p)["out"] == GATHER
    assert "j" in p.locals and "t2" in p.locals


def test_for_else_is_epilogue() -> None:
    p = plan(
        """\
        for i in range(n):
            out.append(i)
        else:
            done = True
        """
    )
    assert p.epilogue_lines == (4, 4)
    assert "done = True" in p.epilogue_source
    ns: dict[str, object] = {}
    code = p.compile_epilogue()
    assert code is not None
    exec(code, ns)
    assert ns["done"] is True


def test_listcomp_form() -> None:
    p = plan("a = 2\nres = [x * a for x in xs if x > 1]\nprint(res)\n")
    assert p.kind == "listcomp"
    assert p.result_name == "res"
    assert p.loop_lines == (2, 2)
    assert p.hidden == ("x",)
    assert "x" not in p.locals
    assert p.inputs == ("a",)


def test_no_loop_refused() -> None:
    assert refusals("x = 1\ny = x + 1\n") == [("", "no-loop", 1)]


def test_no_loop_dry_run_not_raised() -> None:
    p = analyse("x = 1\n", raise_errors=False)
    assert p.kind is None and p.diagnostics
    assert "no parallel loop" in format_plan(p)


# -- syntax errors -------------------------------------------------------------------


def test_syntax_error_has_cell_line_and_filename() -> None:
    src = "a = 1\nfor i in range(3):\n    x = (1 +\n"
    with pytest.raises(SyntaxError) as info:
        analyse(src, filename="<cell-7>")
    assert info.value.filename == "<cell-7>"
    assert info.value.lineno == 3


def test_syntax_error_line_matches_python() -> None:
    src = "for i in range(3):\n    y = 1\n    z = = 2\n"
    with pytest.raises(SyntaxError) as info:
        analyse(src)
    with pytest.raises(SyntaxError) as ref:
        compile(src, "<gpucell-cell>", "exec")
    assert info.value.lineno == ref.value.lineno == 3


# -- the table, row by row -------------------------------------------------------------


def test_inputs_and_locals_and_target() -> None:
    p = plan(
        """\
        for i in range(n):
            y = model(xs[i]) + len(xs)
            z = y * 2
        """
    )
    c = classes(p)
    assert c["model"] == c["xs"] == INPUT
    assert c["i"] == c["y"] == c["z"] == LOCAL
    assert "len" not in c and "range" not in c  # builtins never ship
    assert p.inputs == ("model", "xs")


def test_shadowed_builtin_is_an_input() -> None:
    p = analyse("for i in range(3):\n    y = len(i)\n", known_names={"len"})
    assert p.inputs == ("len",)


@pytest.mark.parametrize(
    "stmt",
    ["out.append(i)", "out.extend([i, i])", "out += [i]", "out += [j for j in xs]"],
)
def test_ordered_gather(stmt: str) -> None:
    p = plan(f"for i in range(n):\n    {stmt}\n")
    assert classes(p)["out"] == GATHER
    assert p.gathers == ("out",)
    assert "out" not in p.inputs


@pytest.mark.parametrize("stmt", ["d[i] = i", "d[i, 0] = i * 2", "d[i % 3] = xs[i]"])
def test_indexed_write(stmt: str) -> None:
    p = plan(f"for i in range(n):\n    {stmt}\n")
    assert classes(p)["d"] == WRITE


@pytest.mark.parametrize(
    "stmt,op,aug",
    [
        ("acc += i", "+", True),
        ("acc -= i", "-", True),
        ("acc *= i", "*", True),
        ("acc |= i", "|", True),
        ("acc &= i", "&", True),
        ("acc = acc + i", "+", False),
        ("acc = acc @ i", "@", False),
        ("acc = max(acc, i)", "max", False),
        ("acc = min(acc, i * 2)", "min", False),
    ],
)
def test_reductions(stmt: str, op: str, aug: bool) -> None:
    p = plan(f"for i in range(n):\n    {stmt}\n")
    assert classes(p)["acc"] == REDUCTION
    (r,) = p.reductions
    assert (r.name, r.op, r.augmented, r.line) == ("acc", op, aug, 2)


def test_keyed_reduction() -> None:
    p = plan("for i in range(n):\n    kd[i % 3] += i\n")
    assert classes(p)["kd"] == KEYED
    assert p.keyed == (("kd", "+"),)


@pytest.mark.parametrize("stmt", ["s.add(i)", "s.update([i, i + 1])"])
def test_set_union(stmt: str) -> None:
    p = plan(f"for i in range(n):\n    {stmt}\n")
    assert classes(p)["s"] == UNION


def test_local_accumulator_is_local_not_reduction() -> None:
    p = plan(
        """\
        for x in xs:
            tot = 0
            for j in range(3):
                tot += j * x
            out.append(tot)
        """
    )
    assert classes(p)["tot"] == LOCAL
    assert classes(p)["out"] == GATHER


def test_local_list_methods_are_fine() -> None:
    p = plan(
        """\
        for x in xs:
            row = []
            row.append(x)
            row.sort()
            loss = model(x)
            loss.backward()
            out.append(row)
        """
    )
    assert classes(p)["row"] == LOCAL


def test_tuple_targets() -> None:
    p = plan(
        """\
        for i, (a, b) in enumerate(zip(xs, ys)):
            c, *rest = a, b, i
            out.append(c)
        """,
    )
    assert {"i", "a", "b", "c", "rest"} <= set(p.locals)


def test_tuple_target_with_write_uses_temporaries() -> None:
    p = plan("for i in range(n):\n    d[i], q = i, i * 2\n")
    assert classes(p)["d"] == WRITE
    assert "__gpucell_rec__.setitem(__gpucell_w0__, 'd', i)" in p.chunk_source


def test_if_else_definite_assignment() -> None:
    p = plan(
        """\
        for x in xs:
            if x > 1:
                y = 1
            else:
                y = 2
            out.append(y)
        """
    )
    assert classes(p)["y"] == LOCAL


def test_conditional_assignment_then_read_is_refused() -> None:
    r = refusals(
        """\
        for x in xs:
            if x > 1:
                y = 1
            out.append(y)
        """
    )
    assert r == [("y", "loop-carried", 4)]


def test_continue_branch_counts_as_not_falling_through() -> None:
    p = plan(
        """\
        for x in xs:
            if x > 1:
                y = 1
            else:
                continue
            out.append(y)
        """
    )
    assert classes(p)["y"] == LOCAL


def test_try_except_and_handler_name() -> None:
    p = plan(
        """\
        for x in xs:
            try:
                q = 10 // x
            except ZeroDivisionError as e:
                q = -1
            out.append(q)
        """
    )
    assert classes(p)["q"] == LOCAL
    assert "e" in p.locals
    assert "__gpucell_rec__.deleted(('e',))" in p.chunk_source


def test_try_finally() -> None:
    p = plan(
        """\
        for x in xs:
            try:
                q = x
            finally:
                r = 1
            out.append(q + r)
        """
    )
    assert {"q", "r"} <= set(p.locals)


def test_with_statement() -> None:
    p = plan(
        """\
        for x in xs:
            with torch.no_grad() as g:
                y = model(x)
            out.append(y)
        """
    )
    assert {"g", "y"} <= set(p.locals)
    assert "torch" in p.inputs


def test_nested_function_and_lambda() -> None:
    p = plan(
        """\
        for x in xs:
            scale = 2
            g = lambda v: v * scale + acc0
            def h(v, k=scale):
                w = v + k
                return w
            out.append(g(h(x)))
        """
    )
    assert {"g", "h", "scale"} <= set(p.locals)
    assert "acc0" in p.inputs
    assert "w" not in p.locals and "v" not in p.inputs


def test_nested_function_reading_later_local_is_refused() -> None:
    r = refusals(
        """\
        for x in xs:
            g = lambda: later
            later = x
            out.append(g())
        """
    )
    assert ("later", "loop-carried", 2) in r


def test_comprehension_scope() -> None:
    p = plan(
        """\
        for x in xs:
            sq = [j * x for j in range(3) if j != x]
            tot = sum(v for v in sq)
            out.append(tot)
        """
    )
    assert "j" not in p.locals and "v" not in p.locals
    assert "j" not in p.inputs and "v" not in p.inputs


def test_walrus() -> None:
    p = plan(
        """\
        for x in xs:
            if (y := x * 2) > 3:
                out.append(y)
            zs = [(m := j) for j in range(3)]
        """
    )
    assert {"y", "m", "zs"} <= set(p.locals)


def test_walrus_maybe_assigned_then_read_refused() -> None:
    r = refusals(
        """\
        for x in xs:
            ok = x > 1 and (y := x) > 2
            out.append(y)
        """
    )
    assert ("y", "loop-carried", 3) in r


def test_imports_in_body_bind_locals() -> None:
    p = plan(
        """\
        for x in xs:
            import math
            from os import path as osp
            out.append(math.sqrt(x))
        """
    )
    assert {"math", "osp"} <= set(p.locals)
    assert "math" not in p.inputs


def test_augassign_to_local_subscript_and_attribute() -> None:
    p = plan(
        """\
        for x in xs:
            buf = [0, 0]
            buf[0] += x
            o = Box()
            o.v = x
            o.v += 1
            out.append(buf)
        """
    )
    assert {"buf", "o"} <= set(p.locals)


# -- refusals -----------------------------------------------------------------------


def test_loop_carried_dependency() -> None:
    r = refusals(
        """\
        for x in xs:
            out.append(prev)
            prev = x
        """
    )
    assert r == [("prev", "loop-carried", 2)]


def test_loop_carried_non_reduction_update() -> None:
    # made on the kernel from the engines' values (replaystmts.py) where the
    # body uses `acc` nowhere else; read elsewhere, it is loop-carried
    r = refusals("for x in xs:\n    acc = acc * 2 + x\n    out.append(acc)\n")
    assert ("acc", "loop-carried", 2) in r
    p = analyse("for x in xs:\n    acc = acc * 2 + x\n", known_names={"xs", "acc"})
    [rep] = p.spelled.replayed.values()
    assert rep.target == "acc" and rep.rebinds == {0}


@pytest.mark.parametrize(
    "stmt,name,kind",
    [
        ("break", "break", "break"),
        ("return x", "return", "return"),
        ("yield x", "yield", "yield"),
        ("await f(x)", "await", "await"),
        ("global gg", "gg", "global"),
        ("del xs", "xs", "del-outer"),
        ("model.w = x", "model", "outer-mutation"),
        ("opt.step()", "opt", "outer-mutation"),
        ("t.add_(x)", "t", "outer-mutation"),
        ("lst.sort()", "lst", "outer-mutation"),
        # (`d.setdefault(x, 1)` alone is replayed on the kernel)
        ("v = d.setdefault(x, 1)", "d", "outer-mutation"),
        ("v = d.pop(x)", "d", "outer-mutation"),
        ("model.fc.weight += x", "model", "outer-mutation"),
        # (`data[0][1] = x` and `data[0][1] = data[1][0] + x` are replayed:
        # tests/test_replayed_changes.py; a call on what `data` holds is not)
        ("data[0][1] = f(data[1][0]) + x", "data", "outer-mutation"),
        ("torch.nn.init.zeros_(t)", "t", "outer-mutation"),
        ("from m import *", "*", "star-import"),
    ],
)
def test_refused_statements(stmt: str, name: str, kind: str) -> None:
    r = refusals(f"out2 = []\nfor x in xs:\n    y = x\n    {stmt}\n")
    assert (name, kind, 4) in r


def test_nonlocal_in_nested_function_refused() -> None:
    r = refusals(
        """\
        for x in xs:
            def g():
                global counter
                counter = 1
        """
    )
    assert ("counter", "global", 3) in r


def test_mutation_of_outer_inside_nested_function_refused() -> None:
    r = refusals(
        """\
        for x in xs:
            def g():
                model.w = 1
            g()
        """
    )
    assert ("model", "outer-mutation", 3) in r


def test_break_in_nested_loop_is_fine() -> None:
    p = plan(
        """\
        for x in xs:
            hit = -1
            for j in range(10):
                if j == x:
                    hit = j
                    break
            out.append(hit)
        """
    )
    assert classes(p)["hit"] == LOCAL


@pytest.mark.parametrize(
    "stmt",
    # (`y = out[-1]` right after `out.append(x)` is `x` itself: spellings.py)
    ["out.append(len(out))", "y = out[0]", "acc += acc", "print(d)", "kd[x] += kd[0]"],
)
def test_sink_read_elsewhere_refused(stmt: str) -> None:
    src = (
        "for x in xs:\n    out.append(x)\n    acc += x\n    d[x] = 1\n"
        f"    kd[x] += 1\n    {stmt}\n"
    )
    r = refusals(src)
    assert any(kind == "sink-read" and line == 6 for _n, kind, line in r)


def test_mixed_sink_kinds_refused() -> None:
    r = refusals("for x in xs:\n    out.append(x)\n    out[0] = x\n")
    assert ("out", "mixed-use", 3) in r


def test_mixed_reduction_ops_refused() -> None:
    r = refusals("for x in xs:\n    acc += x\n    acc *= 2\n")
    assert ("acc", "mixed-reduction", 3) in r


def test_iterating_over_mutated_container_refused() -> None:
    r = refusals("for x in out:\n    out.append(x)\n")
    assert ("out", "iterable-mutated", 1) in r


def test_in_place_change_of_loop_item_written_back() -> None:
    """The loop variable's own item changed in place is accepted, the engines
    watching the items (their new state written back, or the run fails
    unmerged); the same change through any other name is refused."""
    for body, line in [
        ("row += 1", 2),
        ("row.append(0)", 2),
        ("row['t'] = row['a'] + 1", 2),
        ("row.x = 1", 2),
        ("del row['a']", 2),
        ("np.clip(row, 0, 1, out=row)", 2),
    ]:
        p = plan(f"for row in data:\n    {body}\n")
        assert p.ok and line in p.watch_items, body
    p = plan("for k, lst in groups.items():\n    lst.sort()\n")
    assert p.ok and p.watch_items == (2,)
    # the iteration's own element by index and a name for it, a nested
    # loop's variable over the item: the item's (ownsubscripts.py)
    p = plan("for i in range(n):\n    r = data[i]\n    r[0] = 1\n")
    assert p.ok and p.watch_items == (3,)
    p = plan("for row in data:\n    for cell in row:\n        cell.v = 1\n")
    assert p.ok and p.watch_items == (3,)
    # a rebound loop variable, a comprehension's variable, an element at
    # another index: not surely the iteration's own item
    r = refusals("for i in range(n):\n    r = data[i - 1]\n    r[0] = 1\n")
    assert ("r", "outer-mutation", 3) in r
    r = refusals("for row in data:\n    row = template\n    row[0] = 1\n")
    assert ("row", "outer-mutation", 3) in r
    r = refusals("for row in data:\n    [x.append(1) for x in row]\n")
    assert ("x", "outer-mutation", 2) in r
    r = refusals(
        "for row in data:\n    for cell in row:\n        cell = cell[0]\n"
        "        cell.v = 1\n"
    )
    assert ("cell", "outer-mutation", 4) in r


def test_range_loop_target_can_be_rebound() -> None:
    p = plan("for i in range(n):\n    i += 1\n    out.append(i)\n")
    assert classes(p)["i"] == LOCAL


def test_all_problems_reported_at_once() -> None:
    r = refusals(
        """\
        for x in xs:
            out.append(prev)
            prev = x
            model.w = x
            break
        """
    )
    assert [(n, line) for n, _k, line in r] == [("prev", 2), ("model", 4), ("break", 5)]


def test_unknown_function_with_outer_argument_is_accepted() -> None:
    p = plan("for x in xs:\n    f(model)\n    y = model(x).sum()\n    v = d.get(x)\n")
    assert {"f", "model", "d"} <= set(p.inputs)


def test_undefined_input_warns() -> None:
    p = plan("for x in xs:\n    out.append(nope)\n")
    assert [w.name for w in p.warnings] == ["nope"]


def test_dry_run_shows_refusals() -> None:
    p = analyse("for x in xs:\n    break\n", raise_errors=False)
    text = format_plan(p)
    assert "REFUSED (1)" in text and "line 2" in text and p.chunk_ast is None


# -- iteration space -------------------------------------------------------------


@pytest.mark.parametrize(
    "it,kind,leaves",
    [
        ("range(n)", "range", ("range(n)",)),
        ("xs", "name", ("xs",)),
        ("enumerate(xs, 1)", "enumerate", ("xs", "1")),
        ("zip(xs, range(3))", "zip", ("xs", "range(3)")),
        ("d.items()", "expr", ("d.items()",)),
    ],
)
def test_iter_space_description(it: str, kind: str, leaves: tuple[str, ...]) -> None:
    p = plan(f"for v in {it}:\n    out.append(v)\n")
    assert p.iter_space is not None
    assert p.iter_space.kind == kind
    assert p.iter_space.leaves == leaves


def test_shadowed_range_is_a_plain_expression() -> None:
    p = analyse("for v in range(3):\n    pass\n", known_names={"range"})
    assert p.iter_space is not None and p.iter_space.kind == "expr"


def test_chunker_range_is_not_materialised() -> None:
    p = plan("for i in range(10**12):\n    out.append(i)\n")
    assert p.iter_space is not None
    ch = make_chunker(p.iter_space, [range(10**12)])
    assert ch.count == 10**12 and not ch.materialised
    obj = ch.chunk(5, 8)
    assert obj == ("range", range(5, 8))
    assert list(ch.items(obj)) == [5, 6, 7]


def test_chunker_enumerate_zip_and_views() -> None:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    p = plan("for i, (a, b) in enumerate(zip(arr, t), 10):\n    out.append(a)\n")
    assert p.iter_space is not None
    arr, t = np.arange(12.0).reshape(6, 2), torch.arange(6.0)
    ch = make_chunker(p.iter_space, [arr, t, 10])
    assert ch.count == 6
    obj = ch.chunk(2, 4)
    assert obj[0] == "enumerate" and obj[1] == 12
    a_view = obj[2][1][0][1]
    t_view = obj[2][1][1][1]
    assert np.shares_memory(a_view, arr)  # a view, not a copy
    assert t_view.data_ptr() == t[2:].data_ptr()
    items = list(chunk_items(obj))
    assert [i for i, _ in items] == [12, 13]
    assert float(items[0][1][1]) == 2.0


def test_a_zip_over_an_iterator_is_drawn_as_the_serial_loop_draws_it() -> None:
    import itertools

    p = plan("for a, b in zip(xs, ys):\n    out.append(a)\n")
    assert p.iter_space is not None
    it = iter([3, 8, 1, 9, 4])
    ch = make_chunker(p.iter_space, [it, it])  # the pairs idiom
    assert list(chunk_items(ch.chunk(0, ch.count))) == [(3, 8), (1, 9)]
    stream = iter(range(10))
    ch = make_chunker(p.iter_space, [stream, "abc"])
    assert ch.count == 3 and list(stream) == [4, 5, 6, 7, 8, 9]  # 3 drawn past
    ch = make_chunker(p.iter_space, ["ab", itertools.cycle([0, 1])])  # endless
    assert list(chunk_items(ch.chunk(1, 2))) == [("b", 1)]
    nested = plan("for (i, a), b in zip(enumerate(xs), ys):\n    out.append(a)\n")
    assert nested.iter_space is not None
    with pytest.raises(NotParallelizable, match="Nothing ran"):
        make_chunker(nested.iter_space, [iter("ab"), "cd"])


def test_an_nditer_opened_for_writing_is_refused_one_for_reading_runs() -> None:
    np = pytest.importorskip("numpy")
    p = plan("for x in xs:\n    out.append(x)\n")
    assert p.iter_space is not None
    a = np.arange(6).reshape(2, 3)
    with pytest.raises(NotParallelizable, match="np.ndindex"):
        make_chunker(p.iter_space, [np.nditer(a, op_flags=["readwrite"])])
    assert make_chunker(p.iter_space, [np.nditer(a)]).count == 6


def test_chunker_materialises_generators() -> None:
    p = plan("for v in (y for y in xs):\n    out.append(v)\n")
    assert p.iter_space is not None
    ch = make_chunker(p.iter_space, [(y for y in [1, 2, 3])])
    assert ch.materialised and ch.count == 3
    assert list(chunk_items(ch.chunk(1, 3))) == [2, 3]


def test_chunker_zip_strict_mismatch() -> None:
    p = plan("for a, b in zip(xs, ys, strict=True):\n    pass\n")
    assert p.iter_space is not None
    with pytest.raises(ValueError, match="strict"):
        make_chunker(p.iter_space, [[1, 2], [1], True])


# -- rewrite -------------------------------------------------------------------------


def test_chunk_program_keeps_cell_line_numbers() -> None:
    p = plan(
        """\
        a = 1
        for i in range(n):
            y = i * 2
            z = 1 / (i - 3)
            out.append(z)
        """
    )
    assert p.chunk_ast is not None
    lines = {n.lineno for n in ast.walk(p.chunk_ast) if hasattr(n, "lineno")}
    assert lines <= {2, 3, 4, 5}
    from gpucell.engine.chunk import run_chunk

    with pytest.raises(ZeroDivisionError) as info:
        run_chunk(p.engine_program(), {}, ("range", range(0, 5)), 0)
    tb = info.value.__traceback__
    while tb.tb_next is not None:  # type: ignore[union-attr]
        tb = tb.tb_next  # type: ignore[union-attr]
    assert tb.tb_frame.f_code.co_filename == "<gpucell-cell>"  # type: ignore[union-attr]
    assert tb.tb_lineno == 4  # type: ignore[union-attr]
    assert info.value.gpucell_iteration == 3  # type: ignore[attr-defined]


def test_chunk_program_never_touches_shipped_inputs() -> None:
    p = plan("for i in range(n):\n    out.append(i)\n    d[i] = i\n")
    assert "out" not in p.inputs and "d" not in p.inputs
    assert "out.append" not in p.chunk_source


def test_cuda_rewrite_only_when_asked() -> None:
    src = textwrap.dedent(
        """\
        for x in xs:
            a = x.cuda()
            b = x.to("cuda:1")
            c = torch.zeros(3, device="cuda")
            dev = torch.device("cuda")
            e = x.cuda(non_blocking=True)
            out.append(a)
        """
    )
    p = analyse(src, known_names=KNOWN)
    assert not p.cuda_rewritten and ".cuda()" in p.chunk_source
    q = analyse(src, known_names=KNOWN, for_cpu=True)
    assert q.cuda_rewritten and q.cuda_lines == (2, 3, 4, 5, 6)
    text = q.chunk_source
    assert "cuda" not in text.replace("'device': True", "")
    assert "torch.device(__gpucell_device__)" in text
    assert "x.to(__gpucell_device__)" in text
    assert "device=__gpucell_device__" in text
    assert "x.to(__gpucell_device__, non_blocking=True)" in text
    assert "'device': True" in text


def test_cuda_rewrite_runs_on_cpu() -> None:
    torch = pytest.importorskip("torch")
    from gpucell.engine.chunk import run_chunk

    src = (
        "for x in xs:\n    y = x.cuda() * 2\n"
        "    out.append(torch.ones(1, device='cuda') + y)\n"
    )
    p = analyse(src, known_names=KNOWN, for_cpu=True)
    xs = torch.arange(3.0)
    r = run_chunk(p.engine_program(), {"torch": torch}, ("seq", xs), 0, device="cpu")
    assert [float(v) for v in r.gathers["out"]] == [1.0, 3.0, 5.0]


def test_devices_held_in_values_are_mapped_on_cpu_engines() -> None:
    torch = pytest.importorskip("torch")
    from gpucell.engine.chunk import run_chunk

    src = (
        "for x in xs:\n"
        "    y = x.to(dev) * 2\n"
        "    z = torch.ones(1, device=cfg['device']).to(torch.float64)\n"
        "    w = x.to(torch.device(name))\n"
        "    out.append((y + z + w, str(y.device), x.to(other).dtype, label))\n"
    )
    p = analyse(src, known_names=KNOWN | {"dev", "cfg", "name", "other", "label"})
    assert "__gpucell_as_device__" not in p.chunk_source  # GPU engines: untouched
    q = analyse(
        src, known_names=KNOWN | {"dev", "cfg", "name", "other", "label"}, for_cpu=True
    )
    assert not q.cuda_rewritten  # no literal: nothing to report, but wrapped
    assert "__gpucell_as_device__(dev)" in q.chunk_source
    assert "'device': True" in q.chunk_source
    inputs = {
        "torch": torch,
        "dev": "cuda",
        "cfg": {"device": torch.device("cuda", 1)},
        "name": "cuda:0",
        "other": torch.float16,  # not a device: passes through
        "label": "cuda",  # a plain string not used as a device stays as it is
    }
    xs = torch.arange(3.0)
    r = run_chunk(q.engine_program(), inputs, ("seq", xs), 0, device="cpu")
    got = r.gathers["out"]
    assert [float(v[0]) for v in got] == [1.0, 4.0, 7.0]
    assert {v[1] for v in got} == {"cpu"}
    assert {v[2] for v in got} == {torch.float16} and got[0][3] == "cuda"


def test_no_cuda_rewrite_reported_when_none() -> None:
    p = plan("for x in xs:\n    out.append(x)\n", for_cpu=True)
    assert not p.cuda_rewritten


# -- format_plan -------------------------------------------------------------------


def test_format_plan_is_short_and_complete() -> None:
    p = plan(
        """\
        import math
        for i, x in enumerate(xs):
            y = model(x)
            out.append(y)
            acc += y
            print(i)
        total = acc
        """
    )
    text = format_plan(p)
    assert "lines 2-6" in text
    assert "enumerate" in text
    for needle in (
        "input",
        "model",
        "ordered gather",
        "out",
        "reduction",
        "acc",
        "local",
    ):
        assert needle in text
    assert "ships to engines: model" in text
    assert "refusals: none" in text
    assert len(text.splitlines()) < 20


def test_labels_are_the_own_index_only_of_the_frame_they_come_from() -> None:
    """Another object's labels may repeat (a Series with duplicate labels):
    writing `a[idx]` in `for idx in s.index` would let two iterations touch one
    element, so it is refused; the frame's own labels are checked unique at run
    time."""
    with pytest.raises(NotParallelizable):
        analyse(
            "for idx in s.index:\n    a[idx] = f(a[idx])\n", known_names={"s", "a", "f"}
        )
    with pytest.raises(NotParallelizable):
        analyse(
            "for k, v in s.items():\n    a[k] = g(a[k], v)\n", known_names={"s", "a"}
        )
    # `a[k] = a[k] op e` is a keyed reduction (spellings.py): a repeated
    # label folds, as serially
    for src in (
        "for idx in s.index:\n    a[idx] = a[idx] * 2\n",
        "for k, v in s.items():\n    a[k] = a[k] + v\n",
    ):
        p = analyse(src, known_names={"s", "a"})
        assert p.ok and classes(p)["a"] == "keyed reduction"
    assert analyse(
        "for idx in df.index:\n    df.loc[idx, 'c'] = df.loc[idx, 'a'] + 1\n",
        known_names={"df"},
    ).ok


# -- nested loops that surely run, and advice that fits the pattern ---------------

SWEEP = """\
results = {}
for lr in [0.1, 0.01, 0.001]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for epoch in range(30):
        opt.zero_grad()
        loss = ((model(X) - y) ** 2).mean()
        loss.backward()
        opt.step()
    results[lr] = loss.item()
"""


def texts(src: str) -> dict[tuple[str, str], str]:
    """(name, kind) -> message, for a refused cell."""
    p = analyse(textwrap.dedent(src), known_names=KNOWN, raise_errors=False)
    assert not p.ok
    return {(d.name, d.kind): d.text for d in p.diagnostics}


def test_hyper_parameter_sweep_is_accepted() -> None:
    p = analyse(SWEEP, known_names=["torch", "X", "y"])
    assert classes(p)["loss"] == LOCAL and classes(p)["results"] == WRITE


@pytest.mark.parametrize(
    "it",
    [
        "range(30)",
        "range(1, 4)",
        "range(5, 0, -1)",
        "range(-2, 0)",
        "[1, 2]",
        "(0,)",
        "{'a': 1}",
        "'ab'",
        "[*xs, 1]",
        "enumerate([1])",
        "zip([1], 'a')",
    ],
)
def test_inner_loop_over_a_non_empty_literal_assigns(it: str) -> None:
    p = plan(f"for x in xs:\n    for j in {it}:\n        z = x\n    out.append(z)\n")
    assert classes(p)["z"] == LOCAL


@pytest.mark.parametrize(
    "it",
    [
        "range(0)",
        "range(3, 1)",
        "range(1, 9, 0)",
        "[]",
        "[*ys]",
        "''",
    ],
)
def test_inner_loop_that_may_not_run_still_refuses(it: str) -> None:
    src = f"for x in xs:\n    for j in {it}:\n        z = x\n    out.append(z)\n"
    assert refusals(src) == [("z", "loop-carried", 4)]
    text = texts(src)[("z", "loop-carried")]
    assert "`z = None` before the loop on line 2" in text


@pytest.mark.parametrize("it", ["range(n)", "ys", "data.train", "range(len(ys) - 1)"])
def test_inner_loop_over_inputs_is_taken_to_run_and_checked_at_run_time(
    it: str,
) -> None:
    src = f"for x in xs:\n    for j in {it}:\n        z = x\n    out.append(z)\n"
    p = plan(src)
    assert classes(p)["z"] == LOCAL
    assert p.nonempty == ((2, it),)
    refused = {(d.name, d.kind, d.line): d.text for d in p.unless_nonempty}
    assert "`z = None` before the loop on line 2" in refused[("z", "loop-carried", 4)]


def test_shadowed_range_may_be_empty() -> None:
    src = (
        "range = f\nfor x in xs:\n    for j in range(3):\n        z = x\n"
        "    out.append(z)\n"
    )
    assert ("z", "loop-carried", 5) in refusals(src)


@pytest.mark.parametrize(
    "body",
    [
        # read before the inner loop assigns it: the previous iteration's value
        "    for j in range(3):\n        out.append(z)\n        z = x\n",
        # a break (or continue) before the assignment on the first pass
        "    for j in range(3):\n        if f(j):\n            break\n        z = x\n"
        "    out.append(z)\n",
        "    for j in range(3):\n        if f(j):\n            continue\n"
        "        z = x\n    out.append(z)\n",
        # assigned only under a condition inside the loop
        "    for j in range(3):\n        if f(j):\n            z = x\n"
        "    out.append(z)\n",
        # deleted again inside the loop
        "    for j in range(3):\n        z = x\n        del z\n    out.append(z)\n",
        # while with a test may not run; while True may break first
        "    while f(x):\n        z = x\n    out.append(z)\n",
        "    while True:\n        if f(x):\n            break\n        z = x\n"
        "    out.append(z)\n",
    ],
)
def test_carried_values_through_inner_loops_stay_refused(body: str) -> None:
    kinds = {(n, k) for n, k, _line in refusals("for x in xs:\n" + body)}
    assert ("z", "loop-carried") in kinds


@pytest.mark.parametrize(
    "body",
    [
        "    for j in range(3):\n        z = x\n        if f(z):\n            break\n",
        "    while True:\n        z = f(x)\n        if z:\n            break\n",
        "    while 1:\n        z = f(x)\n        break\n",
        "    for j in range(3):\n        pass\n    z = j\n",
    ],
)
def test_break_after_the_assignment_keeps_it(body: str) -> None:
    p = plan("for x in xs:\n" + body + "    out.append(z)\n")
    assert classes(p)["z"] == LOCAL


def test_setdefault_advice_names_the_defaultdict_form() -> None:
    # a new list per missing key is a keyed gather (spellings.py)
    p = plan("for k in xs:\n    d.setdefault(k, []).append(k)\n")
    assert classes(p)["d"] == "keyed gather" and p.spelled.new_lists == {"d"}
    # any other default: each call replayed on the kernel in iteration order
    for src in (
        "for k in xs:\n    d.setdefault(k, [0]).append(k)\n",
        "for k in xs:\n    d.setdefault(k, set()).add(k)\n",
    ):
        assert [r.target for r in plan(src).spelled.replayed.values()] == ["d"]
    assert classes(plan("for k in xs:\n    d[k].append(k)\n"))["d"] == "keyed gather"


def test_new_list_per_key_then_filled_is_an_own_row() -> None:
    p = plan(
        """\
        for lr in xs:
            D[lr] = []
            for w in range(3):
                D[lr].append(w * lr)
            if lr:
                continue
            D[lr].extend([0])
        """
    )
    ((row,),) = [p.own_rows]
    assert (row.name, row.index, row.mode) == ("D", "lr", "value")
    assert "D" in p.writes


def test_new_list_per_key_matches_serial_with_repeated_keys() -> None:
    from cellgen import assert_same_namespace, run_parallel_local, run_serial

    src = (
        "for lr in [0.1, 0.1, 0.2, 0.1]:\n    h[lr] = []\n"
        "    for w in range(3):\n        h[lr].append(w * lr)\n"
        "    if lr > 0.15:\n        continue\n    h[lr].append(-1)\n"
        "for i in range(len(o)):\n    o[i] = []\n    o[i].append(i)\n"
    )
    for cuts in [(0.5,), (0.2, 0.7)]:
        serial: dict[str, object] = {"h": {"old": [1]}, "o": [None] * 4}
        par: dict[str, object] = {"h": {"old": [1]}, "o": [None] * 4}
        s_before, p_before = dict(serial), dict(par)
        run_serial(src, serial)
        run_parallel_local(src, par, cuts)
        assert_same_namespace(serial, par, s_before, p_before)


@pytest.mark.parametrize(
    "body",
    [
        # the old list under the key is appended to first
        "    D[k].append(k)\n    D[k] = []\n",
        # on the other path the old (or an earlier iteration's) list is used
        "    if f(k):\n        D[k] = []\n    D[k].append(k)\n",
        # not a new object: serially `xs` itself grows
        "    D[k] = xs\n    D[k].append(k)\n",
        # another key than the loop variable
        "    D[k] = []\n    D[k + 1].append(k)\n",
        # the key is rebound
        "    D[k] = []\n    D[k].append(k)\n    k = 3\n",
        # the whole dict is read (it grows across iterations serially)
        "    D[k] = []\n    D[k].append(len(D))\n",
    ],
)
def test_fill_of_a_key_not_proven_new_is_refused(body: str) -> None:
    kinds = {k for n, k, _line in refusals("for k in xs:\n" + body) if n == "D"}
    assert kinds


def test_mixed_write_and_gather_advice_builds_a_local() -> None:
    text = texts("for k in xs:\n    D[k].append(k)\n    D[k] = []\n")
    assert "`h = []`" in text[("D", "mixed-use")]


def test_iterating_over_the_filled_dict_is_refused() -> None:
    kinds = {
        k for n, k, _l in refusals("for k in D:\n    D[k] = []\n    D[k].append(1)\n")
    }
    assert "iterable-mutated" in kinds


@pytest.mark.parametrize(
    "body",
    [
        "    out[i] = xs\n    out[i] += [1]\n",  # += would grow `xs` itself
        "    out[i] = 0\n    out[i] += len(out)\n",  # a dict grows serially
    ],
)
def test_whole_element_read_back_that_could_differ_is_refused(body: str) -> None:
    assert any(n == "out" for n, _k, _l in refusals("for i in range(n):\n" + body))


def test_whole_element_set_then_accumulated_still_accepted() -> None:
    p = plan("for i in range(n):\n    out[i] = 0\n    out[i] += i\n")
    assert [r.mode for r in p.own_rows] == ["value"]


def test_own_key_rewrite_advice_works() -> None:
    # over the written dict itself, its keys are each iteration's own (issue
    # 28 §3: refused before; the engine program checks `d` is a dict or a
    # DataFrame, whose keys cannot repeat)
    for header in ("for k in d:", "for k in list(d):", "for k in sorted(d):"):
        p = plan(header + "\n    d[k] = f(d[k])\n")
        assert "IndexError" in p.chunk_source
    # keys from elsewhere may repeat: refused, with the forms that are accepted
    text = texts("for k in ks:\n    d[k] = f(d[k])\n")
    advice = text[("d", "sink-read")]
    assert "d.items()" in advice and "new[k] = f(d[k])" in advice
    assert "dict.fromkeys(ks)" in advice
    assert "d" in plan("for k, v in d.items():\n    d[k] = f(v)\n").writes
    assert "new" in plan("new = {}\nfor k in d:\n    new[k] = f(d[k])\n").writes
    # a copy is still the advice when the body writes other keys
    plain = texts("for k in d:\n    d[k + 1] = 0\n")[("d", "iterable-mutated")]
    assert "list(d)" in plain
    iterated = texts("for k in d:\n    d[k + 1] = d[k]\n")[("d", "iterable-mutated")]
    assert "not enough" in iterated


def test_same_message_is_not_repeated_on_one_line() -> None:
    r = refusals("for k in ks:\n    d[k] = d[k] + d[k] * d[k]\n")
    assert r.count(("d", "sink-read", 2)) == 1


def test_row_written_at_two_depths_advice() -> None:
    src = "for i in range(A.shape[0]):\n    A[i] *= 2\n    A[i, :2] += 1\n"
    text = texts(src.replace("A", "arr"))
    assert ("arr", "iterable-mutated") not in text  # it iterates over a range
    assert "`arr[i, :] *= 2`" in text[("arr", "mixed-reduction")]
    fixed = plan(src.replace("A[i] *=", "A[i, :] *=").replace("A", "arr"))
    assert [r.mode for r in fixed.own_rows] == ["row"]
    assert ("arr", "iterable-mutated", 1) in refusals("for x in arr:\n    arr[0] = x\n")


@pytest.mark.parametrize(
    ("src", "name", "want", "never"),
    [
        (
            # (`bp` read first: a running best read nowhere else runs)
            "best = -1\nfor p in xs:\n    prev = bp\n    s = f(p)\n    if s > best:\n"
            "        best = s\n        bp = p\n",
            "best",
            "max(pairs, key=lambda t: t[0])",
            "best +=",
        ),
        (
            # (read nowhere else, `best` is made on the kernel: replaystmts.py)
            "best = -1\nfor p in xs:\n    best = p if p > best else best\n"
            "    seen.append(best)\n",
            "best",
            "max(pairs",
            "best +=",
        ),
        (
            "found = None\nfor x in xs:\n    if found is None and x > 3:\n"
            "        found = x\n",
            "found",
            "hits[0] if hits else None",
            "found +=",
        ),
    ],
)
def test_selection_advice(src: str, name: str, want: str, never: str) -> None:
    text = texts(src)[(name, "loop-carried")]
    assert want in text and never not in text


@pytest.mark.parametrize(
    "op", ["+", "-", "*", "/", "//", "%", "**", "<<", ">>", "|", "&", "^", "@"]
)
def test_augmented_operator_is_quoted_as_written(op: str) -> None:
    text = texts(f"for x in xs:\n    obj.w {op}= x\n")[("obj", "outer-mutation")]
    assert f"`obj.w {op}= ...`" in text
    alias = texts(f"for x in xs:\n    a = x\n    a {op}= 1\n")
    assert all("?" not in t for t in alias.values())


def test_every_operator_has_its_text() -> None:
    from gpucell.core.analysis.messages import OP_TEXT

    assert set(OP_TEXT) == set(ast.operator.__subclasses__())


# -- in place through a function's argument (issue 35) --------------------------------

ARGUMENT_WRITES = {
    # (`counts` read too: into an array used nowhere else the calls are replayed)
    "ufunc at": "np.add.at(counts, [i], counts[0])",
    "copyto": "np.copyto(buf, x)",
    "put": "np.put(buf, [i], 1.0)",
    "putmask": "np.putmask(buf, buf > 0, 0)",
    "fill_diagonal": "np.fill_diagonal(m, i)",
    "np shuffle": "np.random.shuffle(buf)",
    "generator shuffle": "rng.shuffle(buf)",
    "random shuffle": "random.shuffle(xs)",
    # (`heapq.heappush(xs, i)` is replayed: tests/test_replayed_changes.py)
    "heappush reading the heap": "heapq.heappush(xs, len(xs))",
    "numpy out=": "np.multiply(buf, 2, out=buf)",
    "numpy out= tuple": "np.divmod(buf, 2, out=(buf, m))",
    "torch out=": "torch.add(t, 1, out=t)",
    "torch init": "torch.nn.init.zeros_(t)",
    "torch init on a model's weight": "torch.nn.init.normal_(model.fc.weight)",
}


@pytest.mark.parametrize("call", ARGUMENT_WRITES.values(), ids=ARGUMENT_WRITES.keys())
def test_an_input_changed_through_a_function_argument_is_refused(call: str) -> None:
    src = (
        "import numpy as np, torch, random, heapq\n"
        "rng = np.random.default_rng(0)\n"
        f"for i in range(4):\n    {call}\n"
    )
    plan = analyse(
        src,
        raise_errors=False,
        known_names=["counts", "buf", "x", "m", "xs", "t", "model"],
    )
    assert not plan.ok
    text = " ".join(map(str, plan.diagnostics))
    assert "line 4" in text and "changes an object in place" in text


@pytest.mark.parametrize(
    "body",
    [
        "c = np.zeros(3)\n    np.add.at(c, [i % 3], 1)\n    out.append(c)",
        "b = np.empty(3)\n    np.multiply(a, 2, out=b)\n    out.append(b)",
        "p = a.copy()\n    np.random.default_rng(i).shuffle(p)\n    out.append(p)",
        "h = []\n    heapq.heappush(h, i)\n    out.append(h)",
        "out.append(np.multiply(a, 2, out=None))",
    ],
)
def test_the_same_calls_on_the_iteration_s_own_objects_run(body: str) -> None:
    src = f"import numpy as np, heapq\nfor i in range(4):\n    {body}\n"
    plan = analyse(src, raise_errors=False, known_names=["a", "out"])
    assert plan.ok, plan.diagnostics
